#!/usr/bin/env bash
# Recovery time and resident memory of the broker with COUNT records pending in RocksDB
# (BENCHMARKS.md). The records are written straight into the data directory by
# `kafka-delay bench fill` (due times spread evenly over SPREAD from now), then the broker
# starts on its embedded Kafka and is timed until /readyz answers 200.
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
if [ -z "$dir" ]; then
  dir=$(mktemp -d -t kafka-delay-bench.XXXXXX)
  trap 'rm -rf "$dir"' EXIT
fi
"$bin" bench fill --data-dir "$dir" --count "$count" --spread "$spread"
size=$(du -sm "$dir" | cut -f1)
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
log=$(mktemp -t kafka-delay-bench.XXXXXX.log)
started=$(date +%s%N)
"$bin" run --embedded-kafka --data-dir "$dir" --http-addr "127.0.0.1:$port" --horizon "$horizon" >"$log" 2>&1 &
pid=$!
until curl -sf "http://127.0.0.1:$port/readyz" >/dev/null 2>&1; do
  if ! kill -0 "$pid" 2>/dev/null; then echo "the broker exited:"; cat "$log"; exit 1; fi
  sleep 0.02
done
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
echo "| $pending | $size | $horizon | $(echo "scale=2; ($ready - $started) / 1000000000" | bc) | $counts ($scanned) | $armed | $wheel | $((rss_kb / 1024)) | $((hwm_kb / 1024)) |"
echo "(broker log: $log)"
