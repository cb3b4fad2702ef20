//! kafka-delay's broker: the `kafka-delay` binary's library.
//!
//! The flow reads left to right: [`ingest`] consumes `delay.*` topics and interprets each
//! record with the header contract, [`store`] keeps it durably in RocksDB, the [`scheduler`]
//! owns the in-memory timing wheel and hands due records to [`publish`], which produces them to
//! their target topic and deletes them once delivered. The [`durability`] mode, chosen once at
//! start, decides what else makes a record safe: nothing but RocksDB, the [`changelog`] (and
//! partitions moving between instances), or Kafka transactions ([`txn`]). [`app`] wires them
//! together; [`admin`] (with its web console) and [`metrics`] operate it over [`http`];
//! [`replay`] and [`verify`] are the tools; [`wire`] speaks the Kafka requests librdkafka has
//! no call for.
//!
//! The pure parts (the header contract, the wheel, retry policies, limits, clocks) live in
//! `kafka-delay-core` and are used from there by their one path.
// Safe code only, but for `slice`'s two system calls (no safe binding offers them).
#![deny(unsafe_code)]

pub mod admin;
pub mod app;
pub mod backoff;
pub mod brokers;
pub mod changelog;
pub mod config;
pub mod dead_letter;
pub mod durability;
pub mod failpoint;
pub mod http;
pub mod ingest;
pub mod kafka;
pub mod kafka_clock;
pub mod metrics;
pub mod publish;
pub mod replay;
pub mod scheduler;
pub mod slice;
pub mod store;
pub mod txn;
pub mod verify;
pub mod wire;

/// A boxed future, for the durability mode's parts that ingest, the publisher and the admin
/// API call through trait objects.
pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;
