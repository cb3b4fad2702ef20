//! The broker's configuration: every flag of `kafka-delay run` has a `KAFKA_DELAY_*` variable.
//!
//! [`RunArgs`] is what clap parses (`args.rs`, flags grouped by concern, durations and rates
//! already typed by the value parsers of `parse.rs`); [`RunArgs::validate`] (`validate.rs`)
//! checks the rules between flags and turns them into a [`Config`] grouped the same way, so a
//! bad flag fails at start with a [`ConfigError`] saying what to fix.

pub mod acls;
mod args;
mod error;
pub mod parse;
mod validate;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub use args::{
    FireArgs, HttpArgs, KafkaArgs, LogFormat, RecordArgs, RetryArgs, RunArgs, StoreArgs, WheelArgs,
};
pub use error::ConfigError;
pub use parse::{kafka_prop as parse_kafka_prop, millis};

impl RunArgs {
    /// Parses the flags of `kafka-delay run` (and their variables) alone, as the binary does:
    /// for tools and tests that run a broker in their own process.
    ///
    /// # Errors
    /// clap's error for a flag that does not parse.
    pub fn try_parse_flags<I, T>(flags: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        #[derive(Debug, clap::Parser)]
        #[command(name = "kafka-delay run")]
        struct Run {
            #[command(flatten)]
            run: RunArgs,
        }
        let argv =
            std::iter::once("kafka-delay run".into()).chain(flags.into_iter().map(Into::into));
        <Run as clap::Parser>::try_parse_from(argv).map(|r| r.run)
    }
}

use kafka_delay_core::limit::Limits;
use kafka_delay_core::record::Contract;

/// Validated configuration of the broker, grouped as the flags are.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where Kafka is and how to join it.
    pub kafka: KafkaConfig,
    /// The header contract: what is accepted, retry policies.
    pub contract: Contract,
    /// The topics the broker writes to besides the targets.
    pub topics: TopicsConfig,
    /// The RocksDB store.
    pub store: StoreConfig,
    /// The changelog and handoffs between instances.
    pub cluster: ClusterConfig,
    /// The in-memory timing wheel and its thread.
    pub wheel: WheelConfig,
    /// Delivery to the targets.
    pub fire: FireConfig,
    /// The HTTP server.
    pub http: HttpConfig,
    /// JSON logs.
    pub log_json: bool,
}

/// The changelog and handoffs between instances.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// Whether pending state is kept in changelog topics too, or how that is decided.
    pub changelog: Changelog,
    /// Replication factor of created changelog topics (-1: the cluster's default).
    pub changelog_replication: i32,
    /// Which values the changelog copies rather than points at in the source topic.
    pub changelog_copy: ValueCopy,
    /// How long an ingested group's records are in the wheel before the group is written to
    /// the changelog (zero: it is written first).
    pub changelog_linger: Duration,
    /// Longest wait for a revoked partition's deliveries in flight.
    pub handoff_wait: Duration,
    /// Warm copies of each partition kept by other instances.
    pub standby_replicas: usize,
    /// Whether a member whose HTTP server refuses connections is removed from the group.
    pub fast_takeover: bool,
    /// With exactly-once firing: the producer's `transactional.id`.
    pub transactional_id: Option<String>,
    /// Records after which a transaction is committed at once.
    pub transaction_records: usize,
    /// Longest a transaction keeps taking work that is still arriving.
    pub transaction_interval: Duration,
}

/// Whether the pending records are kept in changelog topics as well as in RocksDB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Changelog {
    /// `--changelog`: on, and a cluster that cannot keep it stops the start.
    On,
    /// `--no-changelog`: RocksDB on this disk is the only copy.
    Off,
    /// The embedded cluster (librdkafka's mock) keeps no compacted topics: off.
    Embedded,
    /// Neither flag: on where the cluster can keep compacted topics, which the start asks it.
    Default,
}

/// Which records' values the changelog copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueCopy {
    /// `--changelog-copy-values`: every record's.
    All,
    /// Those the source topic may not keep until this long after the record is due; the
    /// others' entries point at the source record.
    Unless(Duration),
}

/// Where Kafka is and how to join it.
#[derive(Debug, Clone)]
pub struct KafkaConfig {
    /// Bootstrap servers (filled in from the embedded cluster when that is used).
    pub brokers: String,
    /// Whether to start an embedded cluster.
    pub embedded: bool,
    /// Consumer group.
    pub group_id: String,
    /// Static membership id; `None` joins as a dynamic member.
    pub instance_id: Option<String>,
    /// Extra librdkafka properties (their `Debug` redacts secrets).
    pub properties: Vec<KafkaProp>,
    /// New-topic discovery interval.
    pub topic_refresh: Duration,
}

impl KafkaConfig {
    /// The consumer group the changelog is read with (restores and standby copies): those
    /// consumers assign their partitions and commit nothing, but librdkafka still finds the
    /// group's coordinator, which an authorizer checks.
    pub fn restore_group(&self) -> String {
        format!("{}-restore", self.group_id)
    }
}

/// The consumer group the console reads dead letters with (it commits nothing).
pub const CONSOLE_GROUP: &str = "kafka-delay-console";

/// The topics the broker writes to besides the targets, created at start when missing.
#[derive(Debug, Clone)]
pub struct TopicsConfig {
    /// The dead-letter topic.
    pub dead_letter: String,
    /// The retry topic to create, if any.
    pub retry: Option<String>,
    /// Partitions of the topics the broker creates.
    pub partitions: i32,
}

/// The RocksDB store.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Its directory.
    pub data_dir: PathBuf,
    /// fsync the write-ahead log per ingest batch.
    pub sync: bool,
    /// Records due within this long of arrival are kept in memory as well.
    pub keep_within: Duration,
    /// At most this many bytes of them.
    pub keep_bytes: usize,
}

/// The in-memory timing wheel and its thread.
#[derive(Debug, Clone)]
pub struct WheelConfig {
    /// How far ahead the wheel holds pending records.
    pub horizon: Duration,
    /// The time slice the scheduler's thread asks for; `None` keeps the kernel's own.
    pub scheduler_slice: Option<Duration>,
}

/// Delivery to the targets.
#[derive(Debug, Clone)]
pub struct FireConfig {
    /// Attempts before a permanently failing delivery is dead-lettered.
    pub max_attempts: u32,
    /// Longest wait between delivery retries.
    pub backoff_max: Duration,
    /// Deliveries in flight at most.
    pub in_flight: usize,
    /// Fire rate limits and spreading.
    pub limits: Limits,
    /// Whether a record due when it is ingested may fire at once, never stored (not with
    /// `--no-fire-at-ingest`, nor with fire limits).
    pub at_ingest: bool,
}

/// The HTTP server.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// Listen address.
    pub addr: SocketAddr,
    /// Admin API bearer token (its `Debug` is redacted).
    pub admin_token: Option<Secret>,
    /// `--advertised-http-addr`, when given.
    pub advertised: Option<String>,
}

/// A secret string whose `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

/// The retry topic created at start when --retry-topic is not given (and the patterns match it).
pub const DEFAULT_RETRY_TOPIC: &str = "delay.retry";

fn default_instance_id() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    format!("kafka-delay-{host}")
}

/// Whether a librdkafka property holds a secret that must never be printed.
pub fn is_secret(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    [
        "password",
        "secret",
        "key.pem",
        "ssl.key",
        "token",
        "jaas",
        "credential",
    ]
    .iter()
    .any(|s| k.contains(s))
        || k == "sasl.oauthbearer.config"
}

/// One librdkafka property given with `--kafka-config KEY=VALUE`. Its `Debug` never shows a
/// secret value.
#[derive(Clone, PartialEq, Eq)]
pub struct KafkaProp {
    /// Property name.
    pub key: String,
    /// Property value.
    pub value: String,
}

impl std::fmt::Debug for KafkaProp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if is_secret(&self.key) {
            write!(f, "{}=[redacted]", self.key)
        } else {
            write!(f, "{}={}", self.key, self.value)
        }
    }
}

#[cfg(test)]
mod tests;
