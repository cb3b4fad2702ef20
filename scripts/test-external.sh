#!/usr/bin/env bash
# Every suite that talks to a Kafka broker, against the one named by KAFKA_DELAY_TEST_BROKERS:
# under `make test` that is Apache Kafka started by `scripts/kafka.sh run`. Any other cluster
# works as well (the Kafka of compose.yaml: KAFKA_DELAY_TEST_BROKERS=127.0.0.1:29092); the
# tests make topics of their own with unique names and delete none but their own.
# Tests named mock_cluster_* inject faults through the in-process mock cluster and ran in the
# first pass of `make test`; they are skipped here. Then the client helpers' end-to-end tests,
# each with its language's Kafka client and the kafka-delay binary.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${KAFKA_DELAY_TEST_BROKERS:?set KAFKA_DELAY_TEST_BROKERS, or run: bash scripts/kafka.sh run bash $0}"
echo "the broker suites against $KAFKA_DELAY_TEST_BROKERS"
cargo test --features kafka-delay/failpoints \
  --test e2e --test retry --test admin --test process --test reliability --test observability \
  --test apache_kafka --test cluster --test transactions --test exactly_once --test limits --test console --test commands \
  -- --skip mock_cluster_ "$@"
KAFKA_DELAY_BIN=$(cargo build --features kafka-delay/failpoints -p kafka-delay --bin kafka-delay --message-format=json |
  python3 -c 'import json, sys
print([m["executable"] for m in map(json.loads, sys.stdin)
       if m.get("reason") == "compiler-artifact" and m.get("executable")][-1])')
export KAFKA_DELAY_BIN
echo "the Python helper end to end with confluent-kafka ($KAFKA_DELAY_BIN)"
(cd clients/python && python3 -m pytest -q e2e)
echo "the Java helper end to end with kafka-clients"
(cd clients/java && mvn -B -ntp test -Dgroups=e2e -Dtest.excluded=none)
echo "the Spring Kafka recoverer: a listener with kafka-delay in between"
(cd clients/java-spring && mvn -B -ntp test -Dgroups=e2e -Dtest.excluded=none)
echo "the Go helper end to end with franz-go"
(cd clients/go && go test -count=1 -tags e2e -run E2E ./...)
