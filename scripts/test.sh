#!/usr/bin/env bash
# `make test`: every suite once. First everything is built (one cargo build of every test
# target and the binary), then one Apache Kafka broker is started (scripts/kafka.sh) and the
# lanes run against it, each into a log of its own:
#
#   unit    what needs no Kafka: unit, property and store tests, the criterion bench once, the
#           fault tests only librdkafka's mock cluster can inject (mock_cluster_*), the
#           Python and Go helpers' unit tests, and the Helm chart's offline checks
#   groups  the suites that run groups of instances with a changelog: cluster, transactions
#   exactly the exactly-once suite (the longest: each of its runs is made twice, at least once
#           and exactly once, one at a time)
#   quiet   the suites that judge timing most tightly, run when the other tracks are done: the
#           fire limits' pacing (limits), and the secured cluster's (secure: three SASL_SSL
#           brokers with an authorizer, of its own, with brokers, the controller and the
#           network failing)
#   broker  every other suite that talks to Kafka, then the helpers' end-to-end tests (the Java
#           and Spring ones with their unit tests; the share-group retries of each helper on a
#           broker of their own that serves share groups, SHARE_VERSION)
#   compat  the compatibility suite on the oldest, a middle and the newest supported Kafka
#           (COMPAT_VERSIONS), each on a broker of its own: delayed delivery, retries and dead
#           letters, a changelog handoff, the transaction checks, exactly-once with a zombie's
#           transaction aborted by the broker (kafka/pom.xml's release runs everything in the
#           other lanes)
#
# All of it runs as three tracks side by side (TRACKS): exactly then quiet, unit then compat,
# and broker then groups. The exactly-once suite judges timing on two cores, so it shares them
# with two lanes at a time, never four; the quiet lane comes last, and waits until the other
# tracks are done (`wait_for_lanes`): a rate judged over 5 s windows, and the secured cluster, whose three brokers stall for
# seconds on a loaded machine, need the cores to themselves. The Kafka suites take unique topic names and the
# tests that stop or restart a Kafka broker start one of their own, so the lanes do not
# disturb each other. Each log is printed when its track ends; the summary comes last. A lane
# that runs past its time limit is stopped and fails, its log saying which test was still
# running.
#
#   bash scripts/test.sh                     all of it
#   bash scripts/test.sh LANE... [-- ARGS]   only these lanes, side by side; ARGS go to every
#                                            Rust test binary (for example -- --nocapture)
#
# With KAFKA_DELAY_TEST_BROKERS set the lanes use that Kafka instead of starting one
# (scripts/test-external.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

FEATURES=(--features kafka-delay/failpoints)
# The oldest supported release, the first 4.x and the newest (the README's version table); the
# newest also serves share groups, for the helpers' share-group retries.
COMPAT_VERSIONS=(3.9.1 4.0.2 4.4.0)
SHARE_VERSION=4.4.0
COMPAT_TESTS=(
  records_arrive_no_earlier_than_due_and_shortly_after
  reschedule_and_cancel_by_id_including_the_etf1_headers
  every_bad_input_class_lands_in_the_dead_letter_topic_and_nothing_stalls
  a_record_retried_n_times_comes_back_n_times_counted_never_early_then_dead_letters
  apache_kafka_a_killed_instances_partitions_move_to_the_others_with_their_records
  apache_kafka_a_transaction_commits_its_records_with_its_offsets_and_an_abort_shows_nothing
  apache_kafka_a_newer_producer_with_the_same_transactional_id_fences_the_older
  apache_kafka_a_member_whose_generation_is_over_cannot_commit_offsets_or_records
  apache_kafka_the_transaction_check_passes_on_kafka_and_says_why_elsewhere
  apache_kafka_a_restore_waits_for_a_transaction_open_in_the_changelog
  apache_kafka_exactly_once_fences_an_instance_paused_past_its_session_timeout
)
LANE_LIMIT="${KAFKA_DELAY_LANE_LIMIT:-30m}"

lane_unit() {
  unset KAFKA_DELAY_TEST_BROKERS # what uses Kafka here uses the mock cluster
  cargo test --workspace "${FEATURES[@]}" --lib --bins --examples -- "${ARGS[@]}"
  cargo test "${FEATURES[@]}" --test reliability -- mock_cluster_ "${ARGS[@]}"
  cargo test --workspace "${FEATURES[@]}" --bench timers
  (cd clients/python && python3 -m pytest -q tests)
  (cd clients/go && go test -count=1 ./...)
  echo "the Helm chart, offline: linted, rendered with each shipped values file, decoded strictly"
  (cd deploy/helm/check && go test -count=1 ./...)
}

lane_groups() {
  cargo test "${FEATURES[@]}" --no-fail-fast --test cluster --test transactions -- --skip mock_cluster_ "${ARGS[@]}"
}

lane_quiet() {
  local rc=0
  cargo test "${FEATURES[@]}" --no-fail-fast --test limits -- --skip mock_cluster_ "${ARGS[@]}" || rc=$?
  # The secured cluster's suite starts a cluster of its own, in a network namespace of its own:
  # its network partition drops packets there with iptables, never on this machine's loopback.
  in_own_netns cargo test --offline "${FEATURES[@]}" --no-fail-fast --test secure -- "${ARGS[@]}" || rc=$?
  return "$rc"
}

# Runs CMD in a new network namespace with only its loopback, up (as root, or as root of a new
# user namespace otherwise).
in_own_netns() {
  local as=()
  [ "$(id -u)" = 0 ] || as=(--map-root-user)
  PATH="$PATH:/usr/sbin:/sbin" KAFKA_DELAY_TEST_NETNS=1 \
    unshare --net "${as[@]}" -- sh -c 'ip link set lo up && exec "$@"' netns "$@"
}

lane_exactly() {
  cargo test "${FEATURES[@]}" --no-fail-fast --test exactly_once -- --skip mock_cluster_ "${ARGS[@]}"
}

lane_broker() {
  cargo test "${FEATURES[@]}" --no-fail-fast \
    --test e2e --test retry --test admin --test process --test reliability --test observability \
    --test apache_kafka --test console --test commands \
    -- --skip mock_cluster_ "${ARGS[@]}"
  echo "the Python helper end to end with confluent-kafka ($KAFKA_DELAY_BIN)"
  (cd clients/python && python3 -m pytest -q e2e --ignore=e2e/test_share.py)
  echo "the Go helper end to end with franz-go"
  (cd clients/go && go test -count=1 -tags e2e -run E2E ./...)
  # Each Maven run takes the unit and the end-to-end tests (test.excluded=none); the Spring
  # module builds on the helper the first one installs.
  echo "the Java helper with kafka-clients, unit and end to end"
  (cd clients/java && mvn -B -ntp install -Dtest.excluded=none '-Dtest=!ShareGroupTest')
  echo "the Spring Kafka recoverer: unit, and a listener with kafka-delay in between"
  (cd clients/java-spring && mvn -B -ntp test -Dtest.excluded=none)
  echo "the helpers' share-group retries, on Apache Kafka $SHARE_VERSION (share groups)"
  KAFKA_DELAY_KAFKA_VERSION=$SHARE_VERSION bash scripts/kafka.sh run bash "$0" --share
}

# The helpers' share-group retries, against the Kafka of KAFKA_DELAY_TEST_BROKERS.
share_tests() {
  (cd clients/python && python3 -m pytest -q e2e/test_share.py)
  (cd clients/go/sharegroup && go test -count=1 -tags e2e ./...)
  (cd clients/java && mvn -B -ntp test -Dtest.excluded=none -Dtest=ShareGroupTest)
}

lane_compat() {
  local v
  for v in "${COMPAT_VERSIONS[@]}"; do
    echo "the compatibility suite on Apache Kafka $v"
    KAFKA_DELAY_KAFKA_VERSION=$v bash scripts/kafka.sh run \
      cargo test "${FEATURES[@]}" --no-fail-fast --test e2e --test retry --test cluster --test transactions --test exactly_once \
      -- --exact "${COMPAT_TESTS[@]}" "${ARGS[@]}"
  done
}

# A track: lanes one after another in one slot, separated by `+`.
TRACKS=(exactly+quiet unit+compat broker+groups)

# Waits until every lane of LANES outside TRACK has its result in LOGS: the quiet lane's
# timing needs the cores to itself.
wait_for_lanes() {
  local logs=$1 track=$2 lane
  shift 2
  for lane in "$@"; do
    case "+$track+" in *"+$lane+"*) continue ;; esac
    while [ ! -f "$logs/$lane.result" ]; do sleep 5; done
  done
}

# Runs the named tracks in parallel (inside `scripts/kafka.sh run`), the lanes of a track one
# after another; fails if any lane failed.
run_tracks() {
  local logs="${CARGO_TARGET_DIR:-target}/test-logs" track pid status=0 all=()
  mkdir -p "$logs"
  read -r -a all <<<"${*//+/ }"
  for lane in "${all[@]}"; do rm -f "$logs/$lane.result"; done
  declare -A pids
  for track in "$@"; do
    (
      IFS=+ read -r -a lanes <<<"$track"
      for lane in "${lanes[@]}"; do
        [ "$lane" != quiet ] || wait_for_lanes "$logs" "$track" "${all[@]}"
        local started rc=0
        started=$(date +%s)
        timeout --kill-after=30s "$LANE_LIMIT" bash "$0" --lane "$lane" >"$logs/$lane.log" 2>&1 || rc=$?
        echo "$rc $(($(date +%s) - started))" >"$logs/$lane.result"
      done
    ) &
    pids[$track]=$!
  done
  local summary=()
  while [ "${#pids[@]}" -gt 0 ]; do
    wait -n "${pids[@]}" || true
    for track in "${!pids[@]}"; do
      pid=${pids[$track]}
      kill -0 "$pid" 2>/dev/null && continue
      wait "$pid" || true
      unset "pids[$track]"
      IFS=+ read -r -a lanes <<<"$track"
      for lane in "${lanes[@]}"; do
        local rc=missing took=0
        [ -f "$logs/$lane.result" ] && read -r rc took <"$logs/$lane.result"
        echo "======== lane $lane: exit $rc after ${took}s ========"
        cat "$logs/$lane.log"
        if [ "$rc" = 0 ]; then
          summary+=("lane $lane: ok (${took}s)")
        elif [ "$rc" = 124 ]; then
          summary+=("lane $lane: FAILED, stopped at the $LANE_LIMIT limit (${took}s)")
          status=1
        else
          summary+=("lane $lane: FAILED, exit $rc (${took}s)")
          status=1
        fi
      done
    done
  done
  printf '%s\n' "${summary[@]}"
  return "$status"
}

# The lanes' extra test arguments come to the lanes through the environment.
read -r -a ARGS <<<"${KAFKA_DELAY_TEST_ARGS:-}"
case "${1:-}" in
--share)
  share_tests
  exit
  ;;
--lane)
  "lane_$2"
  exit
  ;;
--run)
  shift
  run_tracks "$@"
  exit
  ;;
esac

lanes=()
while [ "$#" -gt 0 ] && [ "$1" != -- ]; do lanes+=("$1"); shift; done
[ "${1:-}" != -- ] || shift
export KAFKA_DELAY_TEST_ARGS="$*"
tracks=("${lanes[@]}")
if [ "${#lanes[@]}" -eq 0 ]; then
  tracks=("${TRACKS[@]}")
  read -r -a lanes <<<"${TRACKS[*]//+/ }"
fi
for lane in "${lanes[@]}"; do
  declare -F "lane_$lane" >/dev/null || { echo "test.sh: no lane '$lane' (unit, groups, exactly, quiet, broker, compat)" >&2; exit 2; }
done

echo "building every test target and the binary"
cargo test --workspace "${FEATURES[@]}" --lib --bins --tests --examples --bench timers --no-run
KAFKA_DELAY_BIN=$(cargo build "${FEATURES[@]}" -p kafka-delay --bin kafka-delay --message-format=json |
  python3 -c 'import json, sys
print([m["executable"] for m in map(json.loads, sys.stdin)
       if m.get("reason") == "compiler-artifact" and m.get("executable")][-1])')
export KAFKA_DELAY_BIN
# The Go checks compile before the lanes start (the Helm SDK takes minutes of both cores):
# compiled inside a lane, they would starve the timing of the Kafka suites running beside it.
echo "building the Go modules' tests"
(cd clients/go && go test -count=1 -tags e2e -run '^$' ./... >/dev/null)
(cd clients/go/sharegroup && go test -count=1 -tags e2e -run '^$' ./... >/dev/null)
(cd deploy/helm/check && go test -count=1 -run '^$' ./... >/dev/null)

# The shared broker is for the lanes other than unit (none) and compat (brokers of its own).
shared=no
for lane in "${lanes[@]}"; do [ "$lane" = unit ] || [ "$lane" = compat ] || shared=yes; done
if [ "$shared" = no ] || [ -n "${KAFKA_DELAY_TEST_BROKERS:-}" ]; then
  bash "$0" --run "${tracks[@]}"
else
  bash scripts/kafka.sh run bash "$0" --run "${tracks[@]}"
fi
