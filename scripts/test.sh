#!/usr/bin/env bash
# `make test`: every suite once. First everything is built (one cargo build of every test
# target and the binary), then one Apache Kafka broker is started (scripts/kafka.sh) and four
# lanes run side by side against it, each into a log of its own:
#
#   unit    what needs no Kafka: unit, property and store tests, the criterion bench once, the
#           fault tests only librdkafka's mock cluster can inject (mock_cluster_*), and the
#           Python and Go helpers' unit tests
#   groups  the suites that run groups of instances with a changelog: cluster, transactions
#   exactly the exactly-once suite (the longest: each of its runs is made twice, at least once
#           and exactly once, one at a time)
#   broker  every other suite that talks to Kafka, then the helpers' end-to-end tests (the Java
#           and Spring ones with their unit tests)
#
# The Kafka suites take unique topic names and the tests that stop or restart a Kafka broker
# start one of their own, so the lanes do not disturb each other. Each log is printed when
# its lane ends; the summary comes last. A lane that runs past its time limit is stopped
# and fails, its log saying which test was still running.
#
#   bash scripts/test.sh                     all of it
#   bash scripts/test.sh LANE... [-- ARGS]   only these lanes; ARGS go to every Rust test binary
#                                            (for example -- --nocapture)
#
# With KAFKA_DELAY_TEST_BROKERS set the lanes use that Kafka instead of starting one
# (scripts/test-external.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

FEATURES=(--features kafka-delay/failpoints)
LANE_LIMIT="${KAFKA_DELAY_LANE_LIMIT:-30m}"

lane_unit() {
  unset KAFKA_DELAY_TEST_BROKERS # what uses Kafka here uses the mock cluster
  cargo test --workspace "${FEATURES[@]}" --lib --bins --examples -- "${ARGS[@]}"
  cargo test "${FEATURES[@]}" --test reliability -- mock_cluster_ "${ARGS[@]}"
  cargo test --workspace "${FEATURES[@]}" --bench timers
  (cd clients/python && python3 -m pytest -q tests)
  (cd clients/go && go test -count=1 ./...)
}

lane_groups() {
  cargo test "${FEATURES[@]}" --test cluster --test transactions -- --skip mock_cluster_ "${ARGS[@]}"
}

lane_exactly() {
  cargo test "${FEATURES[@]}" --test exactly_once -- --skip mock_cluster_ "${ARGS[@]}"
}

lane_broker() {
  cargo test "${FEATURES[@]}" \
    --test e2e --test retry --test admin --test process --test reliability --test observability \
    --test apache_kafka --test limits --test console --test commands \
    -- --skip mock_cluster_ "${ARGS[@]}"
  echo "the Python helper end to end with confluent-kafka ($KAFKA_DELAY_BIN)"
  (cd clients/python && python3 -m pytest -q e2e)
  echo "the Go helper end to end with franz-go"
  (cd clients/go && go test -count=1 -tags e2e -run E2E ./...)
  # Each Maven run takes the unit and the end-to-end tests (test.excluded=none); the Spring
  # module builds on the helper the first one installs.
  echo "the Java helper with kafka-clients, unit and end to end"
  (cd clients/java && mvn -B -ntp install -Dtest.excluded=none)
  echo "the Spring Kafka recoverer: unit, and a listener with kafka-delay in between"
  (cd clients/java-spring && mvn -B -ntp test -Dtest.excluded=none)
}

# Runs the named lanes in parallel (inside `scripts/kafka.sh run`); fails if any failed.
run_lanes() {
  local logs="${CARGO_TARGET_DIR:-target}/test-logs" lane pid status=0
  mkdir -p "$logs"
  declare -A pids started
  for lane in "$@"; do
    started[$lane]=$(date +%s)
    timeout --kill-after=30s "$LANE_LIMIT" bash "$0" --lane "$lane" >"$logs/$lane.log" 2>&1 &
    pids[$lane]=$!
  done
  local summary=()
  while [ "${#pids[@]}" -gt 0 ]; do
    wait -n "${pids[@]}" || true
    for lane in "${!pids[@]}"; do
      pid=${pids[$lane]}
      if ! kill -0 "$pid" 2>/dev/null; then
        local rc=0
        wait "$pid" || rc=$?
        local took=$(($(date +%s) - started[$lane]))
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
        unset "pids[$lane]"
      fi
    done
  done
  printf '%s\n' "${summary[@]}"
  return "$status"
}

# The lanes' extra test arguments come to the lanes through the environment.
read -r -a ARGS <<<"${KAFKA_DELAY_TEST_ARGS:-}"
case "${1:-}" in
--lane)
  "lane_$2"
  exit
  ;;
--run)
  shift
  run_lanes "$@"
  exit
  ;;
esac

lanes=()
while [ "$#" -gt 0 ] && [ "$1" != -- ]; do lanes+=("$1"); shift; done
[ "${1:-}" != -- ] || shift
export KAFKA_DELAY_TEST_ARGS="$*"
[ "${#lanes[@]}" -gt 0 ] || lanes=(exactly groups broker unit)
for lane in "${lanes[@]}"; do
  declare -F "lane_$lane" >/dev/null || { echo "test.sh: no lane '$lane' (unit, groups, exactly, broker)" >&2; exit 2; }
done

echo "building every test target and the binary"
cargo test --workspace "${FEATURES[@]}" --lib --bins --tests --examples --bench timers --no-run
KAFKA_DELAY_BIN=$(cargo build "${FEATURES[@]}" -p kafka-delay --bin kafka-delay --message-format=json |
  python3 -c 'import json, sys
print([m["executable"] for m in map(json.loads, sys.stdin)
       if m.get("reason") == "compiler-artifact" and m.get("executable")][-1])')
export KAFKA_DELAY_BIN

if [ "${lanes[*]}" = unit ] || [ -n "${KAFKA_DELAY_TEST_BROKERS:-}" ]; then
  bash "$0" --run "${lanes[@]}"
else
  bash scripts/kafka.sh run bash "$0" --run "${lanes[@]}"
fi
