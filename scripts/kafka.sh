#!/usr/bin/env bash
# A real Apache Kafka broker for the tests and benchmarks: one combined KRaft broker+controller
# on free 127.0.0.1 ports, from the artifacts pinned in kafka/pom.xml (Maven Central).
#
#   scripts/kafka.sh fetch          download the broker once into the cache; print its classpath
#   scripts/kafka.sh start DIR      format DIR (the first time) and start a broker whose state
#                                   lives there; print bootstrap.servers=127.0.0.1:PORT when ready.
#                                   A stopped DIR starts again on the same ports with its data.
#   scripts/kafka.sh start DIR PID  the same, and when process PID exits while the broker still
#                                   runs, stop the broker and delete DIR (for a test process
#                                   that may die, or never drop its broker, before stopping it)
#   scripts/kafka.sh stop DIR       stop it (SIGTERM, a clean shutdown; SIGKILL after 60 s)
#   scripts/kafka.sh kill DIR       stop it with SIGKILL
#   scripts/kafka.sh cluster DIR [PID]
#                                   a production-shaped cluster instead: three KRaft nodes
#                                   (each a broker and a voter) in DIR/node1..3, replication
#                                   factor 3 and min.insync.replicas=2 by default, one SASL_SSL
#                                   listener per node for clients (SCRAM-SHA-512, certificates
#                                   made at start under DIR, their CA DIR/ca.pem), and the
#                                   StandardAuthorizer with no ACL meaning no access. Users, each
#                                   with the password NAME-secret: admin (a super user),
#                                   kafka-delay, tenant-a, tenant-b. Prints bootstrap.servers=...
#                                   when all three serve; DIR/admin.properties is the admin's
#                                   client configuration for Kafka's own tools. A node stops and
#                                   starts again with `stop`/`kill`/`start DIR/nodeN`. Each node
#                                   also serves kafka-delay's instances on a listener of their
#                                   own (DIR/instances.bootstrap; DIR/instance-ports: node and
#                                   port), which a test cuts off from one broker.
#   scripts/kafka.sh tool CLASS ARGS...
#                                   run one of Kafka's tools (for example
#                                   org.apache.kafka.tools.AclCommand) from the cache
#   scripts/kafka.sh run CMD...     start a broker in a temporary DIR, run CMD with
#                                   KAFKA_DELAY_TEST_BROKERS, KAFKA_DELAY_TEST_KAFKA_DIR and
#                                   KAFKA_DELAY_KAFKA_CLASSPATH set, stop the broker, exit as CMD
#
# KAFKA_DELAY_KAFKA_VERSION picks another release than the pom's (the compatibility lane of
# scripts/test.sh runs the oldest and a middle supported release this way); each version is
# fetched once into a cache directory of its own.
#
# The cache is $KAFKA_DELAY_CACHE (default ~/.cache/kafka-delay), outside the clone; a second
# fetch or start downloads nothing. Java 17 or newer must be on the PATH (or JAVA_HOME).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
pom="$here/kafka/pom.xml"
version=${KAFKA_DELAY_KAFKA_VERSION:-$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$pom")}
cache="${KAFKA_DELAY_CACHE:-$HOME/.cache/kafka-delay}/kafka-$version"
java="${JAVA_HOME:+$JAVA_HOME/bin/}java"

die() { echo "kafka.sh: $*" >&2; exit 1; }

fetch() {
  local stamp="$cache/.complete" sum
  sum=$( (cat "$pom"; echo "$version") | sha256sum | cut -d' ' -f1)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$sum" ]; then return; fi
  # One fetch at a time: tests may start brokers in parallel on an empty cache.
  mkdir -p "$(dirname "$cache")"
  exec 9>"$cache.lock"
  flock 9
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$sum" ]; then exec 9>&-; return; fi
  command -v mvn >/dev/null || die "Maven (mvn) is needed once, to fetch Kafka $version from Maven Central"
  echo "kafka.sh: fetching Apache Kafka $version from Maven Central into $cache (once)" >&2
  rm -rf "$cache/libs"
  mkdir -p "$cache"
  mvn -q -B -f "$pom" dependency:copy-dependencies -DincludeScope=runtime -Dkafka.version="$version" \
    -DoutputDirectory="$cache/libs" >&2 || die "mvn could not fetch Kafka $version"
  echo "$sum" >"$stamp"
  exec 9>&-
}

classpath() { echo "$cache/libs/*"; }

# A free port below Linux's ephemeral range (32768 and up), so that no client connection takes
# it while a stopped broker waits to start again on it.
free_port() {
  python3 - <<'PY'
import random, socket
for _ in range(1000):
    port = random.randrange(20000, 32000)
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        continue
    finally:
        s.close()
    print(port)
    break
else:
    raise SystemExit("no free port in 20000-32000")
PY
}

write_config() {
  local dir=$1 port cport
  port=$(free_port)
  cport=$(free_port)
  while [ "$cport" = "$port" ]; do cport=$(free_port); done
  cat >"$dir/server.properties" <<EOF
# A single-node KRaft cluster for tests: broker and controller in one JVM, loopback only.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$dir/data
# One broker: every internal topic has one replica; consumer groups rebalance at once.
offsets.topic.replication.factor=1
offsets.topic.num.partitions=10
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=10
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
# Tests may delete the topics they made (DeleteTopics is on by default; said for the reader).
delete.topic.enable=true
EOF
  echo "127.0.0.1:$port" >"$dir/bootstrap"
}

# The certificates of a secured cluster: a CA, and one key and certificate for every node
# (127.0.0.1 and localhost, which clients check against the address they connect to).
make_certs() {
  local dir=$1
  command -v openssl >/dev/null || die "openssl is needed to make the cluster's certificates"
  (
    cd "$dir"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 7 \
      -subj "/CN=kafka-delay test CA" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout node.key -out node.csr -subj "/CN=localhost" 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >node.ext
    openssl x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out node.crt \
      -days 7 -extfile node.ext 2>/dev/null
    # Kafka's PEM key store: the private key (PKCS#8) and then the certificate chain.
    openssl pkcs8 -topk8 -nocrypt -in node.key -out node.p8
    cat node.p8 node.crt ca.pem >node.pem
    rm -f node.csr node.ext ca.srl
  ) || die "openssl could not make the certificates in $dir"
}

CLUSTER_USERS=(admin kafka-delay tenant-a tenant-b)

write_cluster_config() {
  local dir=$1 n kind voters="" bootstrap="" through="" ports="" used=" " p
  local -a client instances internal controller
  for n in 1 2 3; do
    for kind in client instances internal controller; do
      p=$(free_port)
      while [[ "$used" == *" $p "* ]]; do p=$(free_port); done
      used+="$p "
      eval "$kind[$n]=$p"
    done
    voters+="${voters:+,}$n@127.0.0.1:${controller[$n]}"
    bootstrap+="${bootstrap:+,}127.0.0.1:${client[$n]}"
    through+="${through:+,}127.0.0.1:${instances[$n]}"
    ports+="$n ${instances[$n]}"$'\n'
  done
  local plain='org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="admin-secret" user_admin="admin-secret";'
  for n in 1 2 3; do
    mkdir -p "$dir/node$n"
    cat >"$dir/node$n/server.properties" <<CONFIG
# Node $n of a three-node KRaft cluster for tests, secured as production clusters are.
process.roles=broker,controller
node.id=$n
controller.quorum.voters=$voters
# INSTANCES is CLIENT again, on a port of its own for kafka-delay's instances
# (DIR/instance-ports): a test drops the packets of that port to cut them off from one broker
# while the brokers and the test's own clients still reach it.
listeners=CLIENT://127.0.0.1:${client[$n]},INSTANCES://127.0.0.1:${instances[$n]},INTERNAL://127.0.0.1:${internal[$n]},CONTROLLER://127.0.0.1:${controller[$n]}
advertised.listeners=CLIENT://127.0.0.1:${client[$n]},INSTANCES://127.0.0.1:${instances[$n]},INTERNAL://127.0.0.1:${internal[$n]}
controller.listener.names=CONTROLLER
inter.broker.listener.name=INTERNAL
listener.security.protocol.map=CLIENT:SASL_SSL,INSTANCES:SASL_SSL,INTERNAL:SASL_SSL,CONTROLLER:SASL_SSL
# Clients: SCRAM, its credentials in the cluster's metadata. Brokers and controllers among
# themselves: PLAIN as the admin (KRaft cannot use SCRAM before its metadata is read).
listener.name.client.sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.client.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.instances.sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.instances.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.internal.sasl.enabled.mechanisms=PLAIN
listener.name.internal.plain.sasl.jaas.config=$plain
sasl.mechanism.inter.broker.protocol=PLAIN
listener.name.controller.sasl.enabled.mechanisms=PLAIN
listener.name.controller.plain.sasl.jaas.config=$plain
sasl.mechanism.controller.protocol=PLAIN
ssl.keystore.type=PEM
ssl.keystore.location=$dir/node.pem
ssl.truststore.type=PEM
ssl.truststore.location=$dir/ca.pem
# No ACL means no access; the admin is the only super user.
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:admin
allow.everyone.if.no.acl.found=false
# Every topic replicated three times, a write acknowledged by two.
default.replication.factor=3
min.insync.replicas=2
offsets.topic.replication.factor=3
offsets.topic.num.partitions=10
transaction.state.log.replication.factor=3
transaction.state.log.min.isr=2
transaction.state.log.num.partitions=10
share.coordinator.state.topic.replication.factor=3
share.coordinator.state.topic.min.isr=2
unclean.leader.election.enable=false
group.initial.rebalance.delay.ms=0
delete.topic.enable=true
log.dirs=$dir/node$n/data
CONFIG
    echo "$bootstrap" >"$dir/node$n/bootstrap"
  done
  echo "$bootstrap" >"$dir/bootstrap"
  echo "$through" >"$dir/instances.bootstrap"
  printf '%s' "$ports" >"$dir/instance-ports"
  cat >"$dir/admin.properties" <<CONFIG
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="admin-secret";
ssl.truststore.type=PEM
ssl.truststore.location=$dir/ca.pem
CONFIG
}

format_node() {
  local dir=$1 id=$2
  shift 2
  "$java" -cp "$(classpath)" -Dlog4j2.configurationFile="$here/kafka/log4j2.properties" \
    kafka.tools.StorageTool format -t "$id" -c "$dir/server.properties" "$@" >"$dir/format.log" 2>&1 \
    || { cat "$dir/format.log" >&2; die "formatting $dir failed"; }
}

# Starts the JVM of the node whose configuration is in DIR, in a process group of its own (it
# outlives this script and is stopped with `stop`); with OWNER, a watcher stops it and deletes
# WIPE (default DIR) when process OWNER exits first.
launch() {
  local dir=$1 owner=${2:-} wipe=${3:-$1}
  local log="$dir/kafka.log"
  : >"$log"
  setsid "$java" -Xms256m -Xmx1g -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$here/kafka/log4j2.properties" \
    -cp "$(classpath)" kafka.Kafka "$dir/server.properties" >>"$log" 2>&1 </dev/null &
  local pid=$!
  echo "$pid" >"$dir/pid"
  if [ -n "$owner" ]; then
    setsid bash -c 'while kill -0 "$1" 2>/dev/null && kill -0 "$2" 2>/dev/null; do sleep 1; done
      kill -0 "$1" 2>/dev/null && exit 0
      if kill -0 "$2" 2>/dev/null; then
        kill -TERM "$2"
        for _ in $(seq 1 200); do kill -0 "$2" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$2" 2>/dev/null
      fi
      rm -rf "$3"' _ "$owner" "$pid" "$wipe" >/dev/null 2>&1 </dev/null &
  fi
}

# Waits until the node in DIR says it started: two minutes (a JVM's start and a killed
# broker's log recovery, on two loaded cores).
await_started() {
  local dir=$1 log="$1/kafka.log" deadline=$((SECONDS + 120))
  while [ "$SECONDS" -lt "$deadline" ]; do
    grep -q "Kafka Server started" "$log" && return
    running_pid "$dir" >/dev/null || { tail -50 "$log" >&2; die "the broker exited while starting (log: $log)"; }
    sleep 0.1
  done
  tail -50 "$log" >&2
  die "the broker did not start within 120 s (log: $log)"
}

cluster() {
  local dir=$1 owner=${2:-} n id user
  fetch
  command -v "$java" >/dev/null || die "java not found: Kafka $version needs Java 17 or newer"
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  for n in 1 2 3; do
    if pid=$(running_pid "$dir/node$n"); then die "a broker (pid $pid) already runs in $dir/node$n"; fi
  done
  if [ ! -f "$dir/bootstrap" ]; then
    make_certs "$dir"
    write_cluster_config "$dir"
    id=$("$java" -cp "$(classpath)" kafka.tools.StorageTool random-uuid)
    local -a scram=()
    for user in "${CLUSTER_USERS[@]}"; do
      scram+=(--add-scram "SCRAM-SHA-512=[name=$user,password=$user-secret]")
    done
    for n in 1 2 3; do format_node "$dir/node$n" "$id" "${scram[@]}" & done
    wait
    for n in 1 2 3; do [ -f "$dir/node$n/data/meta.properties" ] || die "formatting $dir/node$n failed"; done
  fi
  # The first node's watcher deletes the whole cluster's directory; the others stop their node.
  for n in 1 2 3; do
    if [ "$n" = 1 ]; then launch "$dir/node$n" "$owner" "$dir"; else launch "$dir/node$n" "$owner"; fi
  done
  for n in 1 2 3; do await_started "$dir/node$n"; done
  echo "bootstrap.servers=$(cat "$dir/bootstrap")"
}

tool() {
  [ $# -gt 0 ] || die "tool needs a class name"
  fetch
  exec "$java" -cp "$(classpath)" -Dlog4j2.configurationFile="$here/kafka/log4j2.properties" "$@"
}

running_pid() {
  local dir=$1 pid
  [ -f "$dir/pid" ] || return 1
  pid=$(cat "$dir/pid")
  kill -0 "$pid" 2>/dev/null || return 1
  echo "$pid"
}

start() {
  local dir=$1 owner=${2:-}
  fetch
  command -v "$java" >/dev/null || die "java not found: Kafka $version needs Java 17 or newer"
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  if pid=$(running_pid "$dir"); then die "a broker (pid $pid) already runs in $dir"; fi
  if [ ! -f "$dir/server.properties" ]; then
    write_config "$dir"
    format_node "$dir" "$("$java" -cp "$(classpath)" kafka.tools.StorageTool random-uuid)"
  fi
  launch "$dir" "$owner"
  await_started "$dir"
  echo "bootstrap.servers=$(cat "$dir/bootstrap")"
}

stop() {
  local dir=$1 signal=${2:-TERM} pid
  pid=$(running_pid "$dir") || return 0
  kill "-$signal" "$pid" 2>/dev/null || true
  for _ in $(seq 1 600); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$dir/pid"; return 0; }
    sleep 0.1
  done
  echo "kafka.sh: broker $pid did not stop within 60 s of SIG$signal; killing it" >&2
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$dir/pid"
}

run_dir=""
run() {
  [ $# -gt 0 ] || die "run needs a command"
  local line rc=0
  run_dir=$(mktemp -d -t kafka-delay-kafka.XXXXXX)
  trap 'stop "$run_dir"; rm -rf "$run_dir"' EXIT
  line=$(start "$run_dir" $$)
  echo "Apache Kafka $version at ${line#bootstrap.servers=} (log: $run_dir/kafka.log)" >&2
  KAFKA_DELAY_TEST_BROKERS="${line#bootstrap.servers=}" KAFKA_DELAY_TEST_KAFKA_DIR="$run_dir" \
    KAFKA_DELAY_KAFKA_CLASSPATH="$(classpath)" "$@" || rc=$?
  return $rc
}

case "${1:-}" in
  fetch) fetch; classpath ;;
  start) [ $# -eq 2 ] || [ $# -eq 3 ] || die "usage: start DIR [OWNER_PID]"; start "$2" "${3:-}" ;;
  stop) [ $# -eq 2 ] || die "usage: stop DIR"; stop "$2" TERM ;;
  kill) [ $# -eq 2 ] || die "usage: kill DIR"; stop "$2" KILL ;;
  run) shift; run "$@" ;;
  cluster) [ $# -eq 2 ] || [ $# -eq 3 ] || die "usage: cluster DIR [OWNER_PID]"; cluster "$2" "${3:-}" ;;
  tool) shift; tool "$@" ;;
  version) echo "$version" ;;
  *) die "usage: kafka.sh fetch | start DIR | cluster DIR | stop DIR | kill DIR | tool CLASS... | run CMD... | version" ;;
esac
