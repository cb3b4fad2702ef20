#!/usr/bin/env bash
# The end-to-end suite against a separately running Kafka-protocol broker.
# With KAFKA_DELAY_TEST_BROKERS set (for example the Kafka of compose.yaml, 127.0.0.1:9092), it
# runs against that broker. Otherwise it starts tansu (installed by `make tansu`) with its
# in-memory storage on a free loopback port, runs the suite, and stops it.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${KAFKA_DELAY_TEST_BROKERS:-}" ]; then
  echo "end-to-end tests against $KAFKA_DELAY_TEST_BROKERS"
  exec cargo test --test e2e
fi
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
log=$(mktemp -t tansu.XXXXXX.log)
tansu broker --storage-engine memory://tansu/ \
  --listener-url "tcp://127.0.0.1:$port" --advertised-listener-url "tcp://127.0.0.1:$port" \
  >"$log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true' EXIT
for _ in $(seq 1 150); do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then break; fi
  if ! kill -0 "$pid" 2>/dev/null; then echo "tansu exited:"; cat "$log"; exit 1; fi
  sleep 0.2
done
echo "end-to-end tests against tansu at 127.0.0.1:$port (log: $log)"
# tansu 0.6.0 mishandles static group membership (a static member often never gets its
# assignment), so against it the broker joins as a dynamic member.
KAFKA_DELAY_TEST_FLAGS="--no-static-membership" KAFKA_DELAY_TEST_BROKERS="127.0.0.1:$port" \
  cargo test --test e2e --test retry
