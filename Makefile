# kafka-delay: the two commands of the README.
#   make demo   build, start the broker on an embedded Kafka, deliver a few delayed records
#   make test   the whole test suite, each suite once: unit, property and store tests, the
#               fault tests only the embedded mock cluster can inject, and every suite that
#               talks to a Kafka broker against Apache Kafka (scripts/kafka.sh: the version in
#               kafka/pom.xml, from Maven Central, cached outside the clone)
# Both install what they need first (Debian packages; Kafka's jars through Maven).

export CARGO_TARGET_DIR ?= $(HOME)/.cache/kafka-delay/target
DEBIAN_PACKAGES := build-essential pkg-config iptables iproute2 libclang-dev clang libssl-dev openssl zlib1g-dev kcat curl python3 prometheus \
	openjdk-17-jdk-headless maven chromium

.PHONY: demo test deps kafka python console build lint soak

# lint and test name the host as the build target. Without it cargo builds a dependency that
# build scripts and the program share (libc, shlex) once for both in a test build but twice in
# clippy's check, so the two end up with different build-script hashes and each compiles
# RocksDB's C++ from scratch (about 25 minutes on two cores). With an explicit target, build
# scripts are always built apart and lint and test share one RocksDB build. The program goes to
# $(CARGO_TARGET_DIR)/<host triple>/; the build scripts themselves stay in
# $(CARGO_TARGET_DIR)/debug/build/, so deleting debug/ makes the next build compile RocksDB again.
HOST_TARGET := $(shell rustc -vV 2>/dev/null | sed -n 's/^host: //p')
ifneq ($(HOST_TARGET),)
lint test soak: export CARGO_BUILD_TARGET := $(HOST_TARGET)
endif

deps:
	@missing=""; for p in $(DEBIAN_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

# Apache Kafka's broker and client jars, from Maven Central into ~/.cache/kafka-delay (once).
kafka: deps
	@bash scripts/kafka.sh fetch >/dev/null

# The Python helper's test dependencies (pytest, setuptools and wheel, confluent-kafka), from PyPI
# when missing.
python: deps
	@python3 -c 'import pytest, confluent_kafka, setuptools, wheel' 2>/dev/null || \
	  python3 -m pip install --quiet --root-user-action=ignore -r clients/python/requirements-test.txt

# The console's browser tests: playwright-core from the npm registry (it downloads no browser;
# the tests drive Debian's Chromium).
console: deps
	@test -d tests/console/node_modules/playwright-core || \
	  (cd tests/console && npm ci --no-audit --no-fund --loglevel=error)

build: deps
	cargo build -p kafka-delay --bin kafka-delay

demo: build
	bash scripts/demo.sh

# rustfmt and clippy are rustup components; where one is missing it is skipped, saying so.
lint: deps
	@if cargo fmt --version >/dev/null 2>&1; then cargo fmt --check; \
	else echo "lint: cargo fmt is not installed here; the format check is SKIPPED"; fi
	@if cargo clippy --version >/dev/null 2>&1; then cargo clippy --workspace --all-targets --all-features -- -D warnings; \
	else echo "lint: cargo clippy is not installed here; clippy is SKIPPED"; fi
	python3 scripts/imports.py
	python3 scripts/sizes.py
	python3 scripts/mode.py
	bash scripts/layering.sh

# Every suite once (scripts/test.sh): everything is built first, then six lanes run on one
# Apache Kafka, three at a time: the exactly-once suite, then the fire limits' and the secured
# cluster's, alone; the tests that need no Kafka (with the mock cluster's fault tests, mock_cluster_*) then the
# compatibility suite on three releases; the other Kafka suites with the client helpers'
# tests, then the suites of groups of instances. Each lane's log is printed when its track ends.
test: deps kafka python console
	bash scripts/test.sh

# The long fault runs of RELIABILITY.md: 100 kill -9 cycles, a 120 s Kafka outage, 1M records
# of bad input, on the mock cluster and then on Apache Kafka (the mock takes 100,000 records of
# bad input: it keeps about 5 MB per partition); then the exactly-once broker-kill scenario 12
# times (KAFKA_DELAY_KAFKA_VERSION=V picks the release: the README's version table). CI runs the
# bounded versions inside `make test`.
soak: deps kafka
	KAFKA_DELAY_SOAK=1 KAFKA_DELAY_BAD_INPUT_RECORDS=100000 cargo test --features kafka-delay/failpoints --test reliability -- --nocapture --test-threads=1 --skip apache_kafka_
	KAFKA_DELAY_SOAK=1 bash scripts/kafka.sh run cargo test --features kafka-delay/failpoints --test reliability -- --nocapture --test-threads=1 --skip mock_cluster_
	KAFKA_DELAY_SOAK=1 bash scripts/kafka.sh run cargo test --features kafka-delay/failpoints --test exactly_once -- --nocapture through_a_kafka_broker_restart
