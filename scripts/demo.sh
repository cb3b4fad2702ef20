#!/usr/bin/env bash
# Starts kafka-delay on an embedded Kafka (librdkafka's mock cluster, in-process), produces three
# delayed records with kcat and shows them arriving at their target when due. The broker then
# keeps running for you to try (Ctrl-C stops it); DEMO_EXIT=1 stops it after the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${CARGO_TARGET_DIR:-target}/debug/kafka-delay"
data=$(mktemp -d -t kafka-delay-demo.XXXXXX)
http="${KAFKA_DELAY_HTTP_ADDR:-127.0.0.1:9464}"
"$bin" run --embedded-kafka --data-dir "$data/db" --http-addr "$http" >"$data/stdout" 2>"$data/broker.log" &
broker=$!
trap 'kill "$broker" 2>/dev/null || true; wait "$broker" 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
  grep -q '^bootstrap.servers=' "$data/stdout" 2>/dev/null && break
  kill -0 "$broker" 2>/dev/null || { cat "$data/broker.log"; exit 1; }
  sleep 0.1
done
bs=$(sed -n 's/^bootstrap.servers=//p' "$data/stdout" | head -1)
echo "kafka-delay is running on an embedded Kafka: bootstrap.servers=$bs"
echo "  metrics: http://$http/metrics   log: $data/broker.log"
# The embedded cluster creates a topic when a client asks for its metadata (4 partitions).
kcat -b "$bs" -L -t orders >/dev/null
kcat -b "$bs" -L -t delay.demo >/dev/null
# A new delay topic is picked up at the next topic refresh (--topic-refresh, 5s) and rebalance.
echo "waiting for the broker to pick up delay.demo ..."
for _ in $(seq 1 300); do
  grep -q 'source partitions assigned.*topics=[^ ]*delay\.demo' "$data/broker.log" && break
  sleep 0.1
done
echo
echo "$(date +%T.%3N) producing 3 records to delay.demo for topic 'orders', due in 1s, 3s and 5s:"
for d in 1s 3s 5s; do
  echo "order-$d:delivered after $d" | kcat -b "$bs" -P -t delay.demo -K: \
    -H delay-target=orders -H "delay-after=$d" -H app=demo
done
echo "$(date +%T.%3N) waiting for them on 'orders':"
timeout 30 kcat -b "$bs" -C -t orders -o beginning -c 3 -u \
  -f '  received key=%k value="%s"\n    headers: %h\n' 2>/dev/null |
  while IFS= read -r line; do echo "$(date +%T.%3N) $line"; done
echo
echo "Try it yourself while it runs:"
echo "  echo 'hello' | kcat -b $bs -P -t delay.30s -H delay-target=orders"
echo "  kcat -b $bs -C -t orders -f '%k %s %h\n'"
if [ "${DEMO_EXIT:-0}" = 1 ]; then exit 0; fi
echo "Ctrl-C stops the broker."
wait "$broker"
