//! kafka-delay's broker: the `kafka-delay` binary's library.
//!
//! The flow reads left to right: [`ingest`] consumes `delay.*` topics and interprets each
//! record with [`record`], [`store`] keeps it durably in RocksDB, the [`scheduler`] owns the
//! in-memory [`wheel`] and hands due records to [`publish`], which produces them to their target
//! topic and deletes them once delivered. With a [`changelog`], every change is also written to
//! Kafka, and partitions move between instances. [`app`] wires them together; [`admin`] (with its web console)
//! and [`metrics`] operate it over [`http`]; [`replay`] and [`verify`] are the tools.
//!
//! The pure parts (contract, wheel, retry policies, limits) live in `kafka-delay-core` and are
//! re-exported here under the names the broker has always used.
// Safe code only, but for `slice`'s two system calls (no safe binding offers them).
#![deny(unsafe_code)]

pub use kafka_delay_core::{clock, hashing, limit, record, retry, time, wheel};

pub mod admin;
pub mod app;
pub mod changelog;
pub mod config;
pub mod dead_letter;
pub mod failpoint;
pub mod http;
pub mod ingest;
pub mod kafka;
pub mod metrics;
pub mod publish;
pub mod replay;
pub mod scheduler;
pub mod slice;
pub mod store;
pub mod txn;
pub mod verify;
