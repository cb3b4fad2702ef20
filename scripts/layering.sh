#!/usr/bin/env bash
# What each crate may pull in: the core no tokio, rdkafka, RocksDB or axum; the client no
# RocksDB, axum or jemalloc (what an application links). Fails naming the crate it found.
set -euo pipefail
cd "$(dirname "$0")/.."
check() {
  local crate=$1 banned=$2 found
  found=$(cargo tree -p "$crate" -e normal --prefix none --offline 2>/dev/null ||
          cargo tree -p "$crate" -e normal --prefix none)
  found=$(grep -E "^($banned) v" <<<"$found" | sort -u || true)
  if [ -n "$found" ]; then
    echo "layering: $crate depends on: $found" >&2
    exit 1
  fi
  echo "layering: $crate pulls in none of $banned"
}
check kafka-delay-core 'tokio|rdkafka|rdkafka-sys|rocksdb|librocksdb-sys|axum'
check kafka-delay-client 'rocksdb|librocksdb-sys|axum|tikv-jemallocator|tikv-jemalloc-sys'
