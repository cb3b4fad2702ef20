#!/usr/bin/env bash
# Recovery time and resident memory of the broker with COUNT records pending in RocksDB
# (BENCHMARKS.md). The records are written straight into the data directory by
# `kafka-delay bench fill` (due times spread evenly over SPREAD from now), then the broker
# starts against an in-process Kafka that is already running (`kafka-delay sandbox`, as a
# real cluster would be) and is timed until /readyz answers 200. The sandbox is started first
# because librdkafka's mock cluster sometimes takes a second to create its first topics, which
# is the test Kafka's start, not the broker's recovery.
#
# usage: scripts/bench-pending.sh COUNT [SPREAD] [HORIZON]
#   KAFKA_DELAY_BIN       the binary (default target/release/kafka-delay; build with
#                         `cargo build --release`)
#   KAFKA_DELAY_BENCH_DIR data directory to fill (default a new temporary one, removed after)
set -euo pipefail
count=${1:?usage: $0 COUNT [SPREAD] [HORIZON]}
spread=${2:-30d}
horizon=${3:-1h}
bin=${KAFKA_DELAY_BIN:-${CARGO_TARGET_DIR:-target}/release/kafka-delay}
dir=${KAFKA_DELAY_BENCH_DIR:-}
kafka_log=$(mktemp -t kafka-delay-bench-kafka.XXXXXX.log)
kafka_pid=""
cleanup() {
  if [ -n "$kafka_pid" ]; then kill "$kafka_pid" 2>/dev/null || true; fi
  if [ -z "${KAFKA_DELAY_BENCH_DIR:-}" ]; then rm -rf "$dir"; fi
}
if [ -z "$dir" ]; then
  dir=$(mktemp -d -t kafka-delay-bench.XXXXXX)
fi
trap cleanup EXIT
"$bin" bench fill --data-dir "$dir" --count "$count" --spread "$spread"
size=$(du -sm "$dir" | cut -f1)
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
log=$(mktemp -t kafka-delay-bench.XXXXXX.log)
"$bin" sandbox --brokers 1 >"$kafka_log" 2>&1 &
kafka_pid=$!
for _ in $(seq 1 500); do
  brokers=$(sed -n 's/^bootstrap.servers=//p' "$kafka_log")
  [ -n "$brokers" ] && break
  sleep 0.02
done
if [ -z "$brokers" ]; then echo "the sandbox Kafka did not start:"; cat "$kafka_log"; exit 1; fi
# Starts the broker on data directory $1, logging to $2, and waits until it is ready.
start_broker() {
  "$bin" run --brokers "$brokers" --data-dir "$1" --http-addr "127.0.0.1:$port" --horizon "$horizon" >"$2" 2>&1 &
  pid=$!
  until curl -sf "http://127.0.0.1:$port/readyz" >/dev/null 2>&1; do
    if ! kill -0 "$pid" 2>/dev/null; then echo "the broker exited:"; cat "$2"; exit 1; fi
    sleep 0.02
  done
}
# An untimed first start on an empty data directory creates the broker's topics (the mock
# cluster has no CreateTopics; the broker falls back to auto-creation, which takes seconds), so
# the timed start finds them, as it would on a cluster it has run against before.
warm=$(mktemp -d -t kafka-delay-bench-warm.XXXXXX)
start_broker "$warm" "$log"
kill -TERM "$pid"
wait "$pid" || true
rm -rf "$warm"
started=$(date +%s%N)
start_broker "$dir" "$log"
ready=$(date +%s%N)
sleep 5
metrics=$(curl -sf "http://127.0.0.1:$port/metrics")
rss_kb=$(awk '/VmRSS/ {print $2}' "/proc/$pid/status")
hwm_kb=$(awk '/VmHWM/ {print $2}' "/proc/$pid/status")
kill -TERM "$pid"
wait "$pid" || true
wheel=$(echo "$metrics" | awk '$1 == "kafka_delay_wheel_entries" {print $2}')
pending=$(echo "$metrics" | awk '$1 == "kafka_delay_pending_records" {print $2}')
counts=$(grep -o 'pending counts restored.*' "$log" | grep -o 'seconds="[0-9.]*"' | tr -dc '0-9.')
scanned=$(grep -o 'pending counts restored.*' "$log" | grep -o 'scanned=[a-z]*' | cut -d= -f2)
armed=$(grep -o 'timing wheel armed.*' "$log" | grep -o 'seconds="[0-9.]*"' | tr -dc '0-9.')
echo "| pending | RocksDB MB | horizon | start to ready s | counts restored s (scanned?) | wheel load s | in wheel | RSS MB | peak RSS MB |"
echo "|---|---|---|---|---|---|---|---|---|"
echo "| $pending | $size | $horizon | $(awk -v a="$started" -v b="$ready" 'BEGIN { printf "%.2f", (b - a) / 1e9 }') | $counts ($scanned) | $armed | $wheel | $((rss_kb / 1024)) | $((hwm_kb / 1024)) |"
echo "(broker log: $log)"
