#!/usr/bin/env bash
# Every suite that talks to a Kafka broker, against the one named by KAFKA_DELAY_TEST_BROKERS:
# the `exactly`, `groups` and `broker` lanes of scripts/test.sh (the Rust suites, then the client helpers'
# tests with their languages' Kafka clients and the kafka-delay binary). Any cluster works (the
# Kafka of compose.yaml: KAFKA_DELAY_TEST_BROKERS=127.0.0.1:29092); the tests make topics of
# their own with unique names and delete none but their own. Arguments go to every Rust test
# binary (for example --nocapture).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${KAFKA_DELAY_TEST_BROKERS:?set KAFKA_DELAY_TEST_BROKERS, or run: bash scripts/kafka.sh run bash $0}"
echo "the broker suites against $KAFKA_DELAY_TEST_BROKERS"
exec bash scripts/test.sh exactly groups broker -- "$@"
