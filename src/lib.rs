//! kafka-delay: a delay broker for Apache Kafka.
//!
//! The flow reads left to right: [`ingest`] consumes `delay.*` topics and interprets each
//! record with [`record`], [`store`] keeps it durably in RocksDB, the [`scheduler`] owns the
//! in-memory [`wheel`] and hands due records to [`publish`], which produces them to their target
//! topic and deletes them once delivered. [`app`] wires them together.
// Safe code only, but for `slice`'s two system calls (no safe binding offers them).
#![deny(unsafe_code)]

pub mod admin;
pub mod app;
pub mod bench;
pub mod client;
pub mod clock;
pub mod config;
pub mod console;
pub mod failpoint;
pub mod hashing;
pub mod http;
pub mod ingest;
pub mod kafka;
pub mod limit;
pub mod metrics;
pub mod publish;
pub mod record;
pub mod replay;
pub mod retry;
pub mod scheduler;
pub mod slice;
pub mod store;
pub mod verify;
pub mod wheel;
