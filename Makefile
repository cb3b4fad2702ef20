# kafka-delay: the two commands of the README.
#   make demo   build, start the broker on an embedded Kafka, deliver a few delayed records
#   make test   the whole test suite (unit, property, store, integration on the embedded mock
#               cluster, then the end-to-end tests again against a separately running tansu)
# Both install what the build needs first (Debian packages, tansu from crates.io).

export CARGO_TARGET_DIR ?= $(HOME)/.cache/kafka-delay/target
TANSU_VERSION := 0.6.0
DEBIAN_PACKAGES := build-essential pkg-config libclang-dev clang libssl-dev zlib1g-dev kcat curl python3 prometheus

.PHONY: demo test deps tansu build lint soak

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

tansu:
	@if ! tansu --version 2>/dev/null | grep -q "$(TANSU_VERSION)"; then \
	  echo "installing tansu $(TANSU_VERSION) from crates.io (once; takes a while)"; \
	  cargo install tansu --version $(TANSU_VERSION) --features dynostore --locked; \
	fi

build: deps
	cargo build --bin kafka-delay

demo: build
	bash scripts/demo.sh

lint: deps
	cargo fmt --check
	cargo clippy --all-targets --all-features -- -D warnings

test: deps tansu
	cargo test --all-targets --features failpoints
	bash scripts/test-external.sh

# The long fault runs of RELIABILITY.md: 100 kill -9 cycles, a 120 s Kafka outage, 1M records
# of bad input. CI runs the bounded versions inside `make test`.
soak: deps
	KAFKA_DELAY_SOAK=1 cargo test --features failpoints --test reliability -- --nocapture --test-threads=1
