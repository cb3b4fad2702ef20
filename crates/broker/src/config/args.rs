//! The flags of `kafka-delay run`, grouped by concern. Every flag has a `KAFKA_DELAY_*`
//! variable; durations and rates are parsed into their types here, by clap.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use super::parse::{duration, kafka_prop, SchedulerSlice};
use super::KafkaProp;
use kafka_delay_core::limit::{Limits, Rate, Rule};
use kafka_delay_core::record::Route;
use kafka_delay_core::retry;

/// Flags of `kafka-delay run`.
#[derive(Debug, Args, Clone)]
pub struct RunArgs {
    /// Where Kafka is and how to join it.
    #[command(flatten)]
    pub kafka: KafkaArgs,
    /// Which records are accepted, and where rejected ones go.
    #[command(flatten)]
    pub records: RecordArgs,
    /// The RocksDB store.
    #[command(flatten)]
    pub store: StoreArgs,
    /// Several instances: the changelog and handoffs.
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// The in-memory timing wheel.
    #[command(flatten)]
    pub wheel: WheelArgs,
    /// Delivery to the target topics.
    #[command(flatten)]
    pub fire: FireArgs,
    /// Consumers' retries.
    #[command(flatten)]
    pub retry: RetryArgs,
    /// The HTTP server and the logs.
    #[command(flatten)]
    pub http: HttpArgs,
}

/// Where Kafka is and how to join it.
#[derive(Debug, Args, Clone)]
#[command(next_help_heading = "Kafka")]
pub struct KafkaArgs {
    /// Kafka bootstrap servers, HOST:PORT[,HOST:PORT...].
    #[arg(long, env = "KAFKA_DELAY_BROKERS")]
    pub brokers: Option<String>,
    /// Start an in-process Kafka-protocol cluster and run against it (prints bootstrap.servers=).
    #[arg(long, env = "KAFKA_DELAY_EMBEDDED_KAFKA")]
    pub embedded_kafka: bool,
    /// Consumer group of the broker.
    #[arg(long, env = "KAFKA_DELAY_GROUP_ID", default_value = "kafka-delay")]
    pub group_id: String,
    /// Static group membership id; stable across restarts of this instance. Default: from the
    /// host name.
    #[arg(long, env = "KAFKA_DELAY_INSTANCE_ID")]
    pub instance_id: Option<String>,
    /// Join the group as a dynamic member (no group.instance.id), for Kafka-compatible brokers
    /// that mishandle static membership.
    #[arg(
        long,
        env = "KAFKA_DELAY_NO_STATIC_MEMBERSHIP",
        conflicts_with = "instance_id"
    )]
    pub no_static_membership: bool,
    /// Regex of the source topics (regex subscription: new topics are picked up while running).
    #[arg(
        long,
        env = "KAFKA_DELAY_SOURCE_PATTERN",
        default_value = r"^delay\..+"
    )]
    pub source_pattern: String,
    /// How often to look for new source topics (at least 100ms).
    #[arg(long, env = "KAFKA_DELAY_TOPIC_REFRESH", default_value = "5s", value_parser = duration)]
    pub topic_refresh: Duration,
    /// Partitions of the topics the broker creates when they are missing: the dead-letter
    /// topic, the retry topic and the targets' retry dead-letter topics.
    #[arg(long, env = "KAFKA_DELAY_DEAD_LETTER_PARTITIONS", default_value_t = 1)]
    pub dead_letter_partitions: i32,
    /// librdkafka property for all clients, KEY=VALUE (repeatable): SASL, TLS, tuning.
    #[arg(long = "kafka-config", env = "KAFKA_DELAY_KAFKA_CONFIG", value_delimiter = ';',
          value_parser = kafka_prop)]
    pub kafka_config: Vec<KafkaProp>,
}

/// Which records are accepted, and where rejected ones go.
#[derive(Debug, Args, Clone)]
#[command(next_help_heading = "Records")]
pub struct RecordArgs {
    /// Topic that receives records that cannot be scheduled or delivered.
    #[arg(
        long,
        env = "KAFKA_DELAY_DEAD_LETTER_TOPIC",
        default_value = "delay-dead-letter"
    )]
    pub dead_letter_topic: String,
    /// When set, target topics must match this regex.
    #[arg(long, env = "KAFKA_DELAY_TARGET_ALLOW")]
    pub target_allow: Option<String>,
    /// Which targets the records of which source topics may name, SOURCES=TARGETS, two regexes
    /// (repeatable; the first route whose SOURCES matches a record's topic decides). A record
    /// naming another target is dead-lettered as target-not-allowed, naming the route; with
    /// routes, a source topic no route names may name no target.
    #[arg(
        long = "route",
        env = "KAFKA_DELAY_ROUTE",
        value_delimiter = ';',
        value_parser = Route::parse
    )]
    pub route: Vec<Route>,
    /// Allow internal topics (`__*`) as targets.
    #[arg(long, env = "KAFKA_DELAY_ALLOW_INTERNAL_TARGETS")]
    pub allow_internal_targets: bool,
    /// Longest accepted delay (30s, 5m, 2h, 365d...).
    #[arg(long, env = "KAFKA_DELAY_MAX_DELAY", default_value = "365d", value_parser = duration)]
    pub max_delay: Duration,
    /// Largest record (key + value + headers) accepted, in bytes. Default: librdkafka's
    /// message.max.bytes (1,000,000) less room for the provenance headers.
    #[arg(long, env = "KAFKA_DELAY_MAX_RECORD_BYTES", default_value_t = 999_000)]
    pub max_record_bytes: usize,
}

/// The RocksDB store.
#[derive(Debug, Args, Clone)]
#[command(next_help_heading = "Store")]
pub struct StoreArgs {
    /// Directory of the RocksDB store.
    #[arg(long, env = "KAFKA_DELAY_DATA_DIR", default_value = "kafka-delay-data")]
    pub data_dir: PathBuf,
    /// fsync RocksDB's write-ahead log on every ingest batch (group commit).
    #[arg(long, env = "KAFKA_DELAY_SYNC")]
    pub sync: bool,
    /// Records due within this long of their arrival are also kept in memory until they fire
    /// (still written to RocksDB first), so firing them reads nothing; at most --horizon.
    #[arg(long, env = "KAFKA_DELAY_KEEP_IN_MEMORY_WITHIN", default_value = "5s",
          value_parser = duration)]
    pub keep_in_memory_within: Duration,
    /// Memory for those records, MiB (their bytes plus about 100 bytes each); a record that
    /// does not fit is read from RocksDB when it fires. 0 keeps none.
    #[arg(long, env = "KAFKA_DELAY_KEEP_IN_MEMORY_MB", default_value_t = 64)]
    pub keep_in_memory_mb: usize,
}

/// Several instances: the changelog and handoffs.
#[derive(Debug, Args, Clone)]
#[command(next_help_heading = "Cluster")]
pub struct ClusterArgs {
    /// Keep every source partition's pending records in a compacted changelog topic
    /// (`<group-id>-<source topic>-changelog`) as well as in RocksDB, so that partitions can move
    /// between instances sharing --group-id and a lost --data-dir loses nothing. The default
    /// on a cluster that can compact topics; with this flag a cluster that cannot stops the
    /// start.
    #[arg(long, env = "KAFKA_DELAY_CHANGELOG", conflicts_with = "no_changelog")]
    pub changelog: bool,
    /// RocksDB is the only copy of the pending records: one instance per group, on a durable
    /// disk (a second member of the group stops the start). The embedded Kafka runs this way.
    #[arg(long, env = "KAFKA_DELAY_NO_CHANGELOG")]
    pub no_changelog: bool,
    /// Replication factor of the changelog topics kafka-delay creates; -1 takes the cluster's
    /// default.replication.factor.
    #[arg(long, env = "KAFKA_DELAY_CHANGELOG_REPLICATION", default_value_t = -1,
          allow_negative_numbers = true)]
    pub changelog_replication: i32,
    /// Copy every record's value into the changelog. Without it a record's changelog entry
    /// points at its value in the source topic wherever the topic keeps it (cleanup.policy
    /// delete, no retention.bytes) until --changelog-copy-margin after the record is due.
    #[arg(long, env = "KAFKA_DELAY_CHANGELOG_COPY_VALUES")]
    pub changelog_copy_values: bool,
    /// How long after its due time a record's value must still be in its source topic for the
    /// changelog to point at it rather than copy it: a partition restored this long after a
    /// record came due still finds its value.
    #[arg(long, env = "KAFKA_DELAY_CHANGELOG_COPY_MARGIN", default_value = "1d",
          value_parser = duration)]
    pub changelog_copy_margin: Duration,
    /// How long a group of ingested records waits before it is written to the changelog, while
    /// its records are already in the timing wheel: a record that fires within it needs no
    /// changelog entry and no tombstone. The group's source offsets are committed only once it
    /// is written, so after a crash the group is read again from its source topic (records
    /// that fired within the linger may fire again; none is lost). A revoke waits for the
    /// lingering groups. 0 writes every record to the changelog before it can fire. Less than
    /// --handoff-wait; not with --no-changelog or --exactly-once. [default: 1s, or half of
    /// --handoff-wait if that is less]
    #[arg(long, env = "KAFKA_DELAY_CHANGELOG_LINGER", value_parser = duration)]
    pub changelog_linger: Option<Duration>,
    /// When a partition is revoked, how long its deliveries in flight may take to finish
    /// before it is let go anyway (those records may then fire again on the new owner).
    #[arg(long, env = "KAFKA_DELAY_HANDOFF_WAIT", default_value = "10s", value_parser = duration)]
    pub handoff_wait: Duration,
    /// How many other instances keep a warm copy of each partition (tailing its changelog), so
    /// that a takeover after a crash reads only the last second of changes. Needs --changelog;
    /// with instances - 1 every instance is warm for every partition.
    #[arg(long, env = "KAFKA_DELAY_STANDBY_REPLICAS", default_value_t = 0)]
    pub standby_replicas: usize,
    /// Wait for a killed instance's session to run out (`session.timeout.ms`) before its
    /// partitions move. By default each instance removes from the group a member whose HTTP
    /// server refuses connections on the host it connects to Kafka from (nothing listens there
    /// any more), so the group rebalances at once (over PLAINTEXT, SSL, SASL PLAIN or SCRAM).
    #[arg(long, env = "KAFKA_DELAY_NO_FAST_TAKEOVER")]
    pub no_fast_takeover: bool,
    /// Fire each record exactly once for read_committed consumers of its target: what a due
    /// record writes (the target record, its changelog tombstone) and what ingest writes (the
    /// changelog entries, dead letters, the source offsets) commit in Kafka transactions, with
    /// the consumer group's offsets, so a crashed or cut-off instance's work is aborted, never
    /// repeated. Needs --changelog and a static --instance-id (the transactional.id is
    /// <group-id>-<instance-id>) and a cluster that runs transactions.
    #[arg(long, env = "KAFKA_DELAY_EXACTLY_ONCE")]
    pub exactly_once: bool,
    /// With --exactly-once: records after which a transaction is committed at once, and the
    /// most records ingest takes in one group (each group commits in a transaction of its own).
    #[arg(
        long,
        env = "KAFKA_DELAY_TRANSACTION_RECORDS",
        default_value_t = 10_000
    )]
    pub transaction_records: usize,
    /// With --exactly-once: longest a transaction keeps taking work that is still arriving.
    #[arg(long, env = "KAFKA_DELAY_TRANSACTION_INTERVAL", default_value = "100ms",
          value_parser = duration)]
    pub transaction_interval: Duration,
}

/// The in-memory timing wheel.
#[derive(Debug, Args, Clone)]
#[command(next_help_heading = "Wheel")]
pub struct WheelArgs {
    /// How far ahead the in-memory timing wheel holds pending records; records due later stay
    /// only in RocksDB and are loaded as time advances. Memory follows the arrival rate times
    /// this, not the number pending. At least 1s.
    #[arg(long, env = "KAFKA_DELAY_HORIZON", default_value = "1h", value_parser = duration)]
    pub horizon: Duration,
    /// The CPU time slice the scheduler's thread asks Linux for (6.12+, no privilege needed):
    /// 100us to 100ms, or 0 for the kernel's own. A thread with a slice of its own gets a core
    /// sooner after its timer fires on a busy machine; a shorter slice costs more CPU.
    #[arg(long, env = "KAFKA_DELAY_SCHEDULER_SLICE", default_value = "1ms",
          value_parser = SchedulerSlice::parse)]
    pub scheduler_slice: SchedulerSlice,
}

/// Delivery to the target topics.
#[derive(Debug, Args, Clone)]
#[command(next_help_heading = "Fire")]
pub struct FireArgs {
    /// Attempts for a delivery that fails permanently (unknown target, denied, too large) before
    /// the record goes to the dead-letter topic. Transient failures are retried without limit.
    #[arg(long, env = "KAFKA_DELAY_FIRE_MAX_ATTEMPTS", default_value_t = 5)]
    pub fire_max_attempts: u32,
    /// Longest wait between delivery retries (the backoff doubles from 100ms up to this).
    #[arg(long, env = "KAFKA_DELAY_FIRE_BACKOFF_MAX", default_value = "30s",
          value_parser = duration)]
    pub fire_backoff_max: Duration,
    /// Most deliveries in flight at once.
    #[arg(long, env = "KAFKA_DELAY_IN_FLIGHT", default_value_t = 10_000)]
    pub in_flight: usize,
    /// Fire limit of the targets matching a regex, REGEX=RATE[,burst=N][,spread=DURATION]
    /// (repeatable; the first match wins; each target gets a pace of its own). RATE is like
    /// 500/s, 30000/min or 1000/h; burst (default 1) records may go at once after a quiet
    /// spell; spread sends records due at the same time at a time of their own within that
    /// window after their due time, never before it. A held record waits for its turn without
    /// holding up other targets. Applies per instance.
    #[arg(
        long = "fire-rate",
        env = "KAFKA_DELAY_FIRE_RATE",
        value_delimiter = ';',
        value_parser = Limits::parse_rule
    )]
    pub fire_rate: Vec<Rule>,
    /// Fire limit over all targets together, RATE[,burst=N], on top of --fire-rate.
    #[arg(long, env = "KAFKA_DELAY_FIRE_RATE_GLOBAL", value_parser = Limits::parse_global)]
    pub fire_rate_global: Option<Rate>,
    /// Store every record and fire it from the timing wheel, a record already due when it is
    /// ingested too. By default, with the changelog, such a record is published at once and
    /// never stored (with --exactly-once, in the transaction that consumes it); fire limits
    /// switch that off as well. Without the changelog every record is stored.
    #[arg(long, env = "KAFKA_DELAY_NO_FIRE_AT_INGEST")]
    pub no_fire_at_ingest: bool,
}

/// Consumers' retries.
#[derive(Debug, Args, Clone)]
#[command(next_help_heading = "Retry")]
pub struct RetryArgs {
    /// Regex of the retry topics: a record there is a consumer's retry (attempts counted,
    /// backoff applied). They must also match --source-pattern; created at start when missing.
    #[arg(
        long,
        env = "KAFKA_DELAY_RETRY_TOPICS",
        default_value = r"^delay\.retry$"
    )]
    pub retry_topics: String,
    /// Retry topic created at start when it does not exist; must match --source-pattern and
    /// --retry-topics. Default: delay.retry when it matches both; "" creates none.
    #[arg(long, env = "KAFKA_DELAY_RETRY_TOPIC")]
    pub retry_topic: Option<String>,
    /// Default retry policy, KEY=VALUE,...: backoff (fixed|exponential), delay, factor,
    /// max-delay, jitter, max-attempts, dead-letter ({target} is replaced by the target).
    #[arg(long, env = "KAFKA_DELAY_RETRY_DEFAULT", default_value = retry::DEFAULT_SPEC)]
    pub retry_default: String,
    /// Retry policy of the targets matching a regex, REGEX=KEY=VALUE,... (repeatable; the
    /// first match wins; keys not given come from --retry-default).
    #[arg(
        long = "retry-policy",
        env = "KAFKA_DELAY_RETRY_POLICY",
        value_delimiter = ';'
    )]
    pub retry_policy: Vec<String>,
}

/// The HTTP server and the logs.
#[derive(Debug, Args, Clone)]
#[command(next_help_heading = "HTTP and logs")]
pub struct HttpArgs {
    /// Address of the HTTP server (/healthz, /readyz, /metrics, the admin API, the console).
    #[arg(long, env = "KAFKA_DELAY_HTTP_ADDR", default_value = "127.0.0.1:9464")]
    pub http_addr: SocketAddr,
    /// Bearer token for the admin API (/api/...), at least 16 characters. Without it the API
    /// answers only when --http-addr is a loopback address.
    #[arg(long, env = "KAFKA_DELAY_ADMIN_TOKEN")]
    pub admin_token: Option<String>,
    /// The address other instances and operators reach this one's HTTP server at (HOST:PORT),
    /// shown by /api/v1/owners of every instance of the group. Default: --http-addr as bound
    /// (its port, and this host's name when it listens on every interface).
    #[arg(long, env = "KAFKA_DELAY_ADVERTISED_HTTP_ADDR")]
    pub advertised_http_addr: Option<String>,
    /// Log format.
    #[arg(long, env = "KAFKA_DELAY_LOG_FORMAT", value_enum, default_value_t = LogFormat::Plain)]
    pub log_format: LogFormat,
}

/// How log lines are written (to stderr).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    Plain,
    /// One JSON object per line.
    Json,
}
