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
#   scripts/kafka.sh run CMD...     start a broker in a temporary DIR, run CMD with
#                                   KAFKA_DELAY_TEST_BROKERS, KAFKA_DELAY_TEST_KAFKA_DIR and
#                                   KAFKA_DELAY_KAFKA_CLASSPATH set, stop the broker, exit as CMD
#
# The cache is $KAFKA_DELAY_CACHE (default ~/.cache/kafka-delay), outside the clone; a second
# fetch or start downloads nothing. Java 17 or newer must be on the PATH (or JAVA_HOME).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
pom="$here/kafka/pom.xml"
version=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$pom")
cache="${KAFKA_DELAY_CACHE:-$HOME/.cache/kafka-delay}/kafka-$version"
java="${JAVA_HOME:+$JAVA_HOME/bin/}java"

die() { echo "kafka.sh: $*" >&2; exit 1; }

fetch() {
  local stamp="$cache/.complete" sum
  sum=$(sha256sum "$pom" | cut -d' ' -f1)
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
  mvn -q -B -f "$pom" dependency:copy-dependencies -DincludeScope=runtime \
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
    local id
    id=$("$java" -cp "$(classpath)" kafka.tools.StorageTool random-uuid)
    "$java" -cp "$(classpath)" -Dlog4j2.configurationFile="$here/kafka/log4j2.properties" \
      kafka.tools.StorageTool format -t "$id" -c "$dir/server.properties" >"$dir/format.log" 2>&1 \
      || { cat "$dir/format.log" >&2; die "formatting $dir failed"; }
  fi
  local log="$dir/kafka.log"
  : >"$log"
  # setsid: the broker outlives this script and is stopped with `stop`; its own process group.
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
      rm -rf "$3"' _ "$owner" "$pid" "$dir" >/dev/null 2>&1 </dev/null &
  fi
  local bootstrap
  bootstrap=$(cat "$dir/bootstrap")
  for _ in $(seq 1 600); do
    if grep -q "Kafka Server started" "$log"; then
      echo "bootstrap.servers=$bootstrap"
      return
    fi
    running_pid "$dir" >/dev/null || { tail -50 "$log" >&2; die "the broker exited while starting (log: $log)"; }
    sleep 0.1
  done
  tail -50 "$log" >&2
  die "the broker did not start within 60 s (log: $log)"
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
  version) echo "$version" ;;
  *) die "usage: kafka.sh fetch | start DIR | stop DIR | kill DIR | run CMD... | version" ;;
esac
