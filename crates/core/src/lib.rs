//! kafka-delay's pure core: what a delayed record means and when it fires, with no I/O.
//!
//! - [`record`]: the header contract (target topic, due time, id, retries) read from a
//!   record's headers, and the stored form of a pending record.
//! - [`retry`]: retry policies (attempts, backoff, dead-letter topic) for consumers.
//! - [`wheel`]: the hierarchical timing wheel of pending ids (O(1) insert and cancel).
//! - [`limit`]: fire rate limits (GCRA buckets per target and global, spread windows).
//! - [`time`]: durations and times as the headers and flags write them.
//! - [`changelog`]: the changelog's entries and the checkpoint of the position a local store
//!   reflects, as bytes.
//! - [`id`], [`clock`], [`hashing`]: record identity, time as epoch milliseconds, and the
//!   hasher of the hot maps.
//!
//! Time is `u64` epoch milliseconds handed in by the caller: nothing here reads a clock except
//! [`clock::SystemClock`], and nothing here needs tokio, rdkafka or RocksDB.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod changelog;
pub mod clock;
pub mod hashing;
pub mod id;
pub mod limit;
pub mod record;
pub mod retry;
pub mod time;
pub mod wheel;
