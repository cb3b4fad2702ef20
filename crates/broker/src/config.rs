//! Command line and environment: every flag has a `KAFKA_DELAY_*` variable.
//!
//! [`RunArgs`] is what clap parses; [`RunArgs::validate`] checks the cross-field rules and turns
//! it into a [`Config`] whose fields are already parsed (regexes compiled, durations in ms), so
//! a bad flag fails at start with a message saying what to fix.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use regex::Regex;

use crate::limit::{Limits, Rate, Rule};
use crate::record::{time::parse_duration_ms, Contract};
use crate::retry::{self, Policy, Retries};

/// kafka-delay: delayed delivery and retries for Apache Kafka.
#[derive(Debug, Parser)]
#[command(name = "kafka-delay", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the delay broker.
    Run(Box<RunArgs>),
    /// Run only an embedded Kafka-protocol cluster (librdkafka's mock cluster) until stopped.
    Sandbox(SandboxArgs),
    /// Move dead-lettered records back to a topic, rate-limited, resetting their retry count.
    Replay(crate::replay::ReplayArgs),
    /// Produce a known set of delayed records and report lost, duplicated, early and late ones.
    Verify(crate::verify::VerifyArgs),
}

/// Flags of `kafka-delay sandbox`.
#[derive(Debug, Args)]
pub struct SandboxArgs {
    /// Number of brokers in the embedded cluster.
    #[arg(long, env = "KAFKA_DELAY_SANDBOX_BROKERS", default_value_t = 1)]
    pub brokers: i32,
}

/// Flags of `kafka-delay run`.
#[derive(Debug, Args, Clone)]
pub struct RunArgs {
    /// Kafka bootstrap servers, HOST:PORT[,HOST:PORT...].
    #[arg(long, env = "KAFKA_DELAY_BROKERS")]
    pub brokers: Option<String>,
    /// Start an in-process Kafka-protocol cluster and run against it (prints bootstrap.servers=).
    #[arg(long, env = "KAFKA_DELAY_EMBEDDED_KAFKA")]
    pub embedded_kafka: bool,
    /// Directory of the RocksDB store.
    #[arg(long, env = "KAFKA_DELAY_DATA_DIR", default_value = "kafka-delay-data")]
    pub data_dir: PathBuf,
    /// Address of the HTTP server (/healthz, /readyz, /metrics).
    #[arg(long, env = "KAFKA_DELAY_HTTP_ADDR", default_value = "127.0.0.1:9464")]
    pub http_addr: SocketAddr,
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
    /// Topic that receives records that cannot be scheduled or delivered.
    #[arg(
        long,
        env = "KAFKA_DELAY_DEAD_LETTER_TOPIC",
        default_value = "delay-dead-letter"
    )]
    pub dead_letter_topic: String,
    /// Partitions of the topics the broker creates when they are missing: the dead-letter
    /// topic, the retry topic and the targets' retry dead-letter topics.
    #[arg(long, env = "KAFKA_DELAY_DEAD_LETTER_PARTITIONS", default_value_t = 1)]
    pub dead_letter_partitions: i32,
    /// When set, target topics must match this regex.
    #[arg(long, env = "KAFKA_DELAY_TARGET_ALLOW")]
    pub target_allow: Option<String>,
    /// Allow internal topics (`__*`) as targets.
    #[arg(long, env = "KAFKA_DELAY_ALLOW_INTERNAL_TARGETS")]
    pub allow_internal_targets: bool,
    /// Longest accepted delay (30s, 5m, 2h, 365d...).
    #[arg(long, env = "KAFKA_DELAY_MAX_DELAY", default_value = "365d")]
    pub max_delay: String,
    /// Largest record (key + value + headers) accepted, in bytes. Default: librdkafka's
    /// message.max.bytes (1,000,000) less room for the provenance headers.
    #[arg(long, env = "KAFKA_DELAY_MAX_RECORD_BYTES", default_value_t = 999_000)]
    pub max_record_bytes: usize,
    /// fsync RocksDB's write-ahead log on every ingest batch (group commit).
    #[arg(long, env = "KAFKA_DELAY_SYNC")]
    pub sync: bool,
    /// The CPU time slice the scheduler's thread asks Linux for (6.12+, no privilege needed;
    /// 100us to 100ms, or 0 for the kernel's own). A thread with a slice of its own gets a core
    /// sooner after its timer fires on a busy machine: with 1ms the wheel's p99 was at most
    /// 2 ms in 9 of 12 runs at 70% of the sustained rate, against 1 of 15 with the kernel's,
    /// at the same CPU per record at full throughput (BENCHMARKS.md, section 4).
    #[arg(long, env = "KAFKA_DELAY_SCHEDULER_SLICE", default_value = "1ms")]
    pub scheduler_slice: String,
    /// Shorthand for `--scheduler-slice 100us`, the shortest the kernel grants: the wheel's p99
    /// at most 2 ms in 11 of 11 runs, for about 4% more CPU per record at full throughput.
    #[arg(
        long,
        env = "KAFKA_DELAY_SHORT_SCHEDULER_SLICE",
        conflicts_with = "scheduler_slice"
    )]
    pub short_scheduler_slice: bool,
    /// Attempts for a delivery that fails permanently (unknown target, denied, too large) before
    /// the record goes to the dead-letter topic. Transient failures are retried without limit.
    #[arg(long, env = "KAFKA_DELAY_FIRE_MAX_ATTEMPTS", default_value_t = 5)]
    pub fire_max_attempts: u32,
    /// Longest wait between delivery retries (the backoff doubles from 100ms up to this).
    #[arg(long, env = "KAFKA_DELAY_FIRE_BACKOFF_MAX", default_value = "30s")]
    pub fire_backoff_max: String,
    /// How far ahead the in-memory timing wheel holds pending records; records due later stay
    /// only in RocksDB and are loaded as time advances. Memory follows the arrival rate times
    /// this, not the number pending. At least 1s.
    #[arg(long, env = "KAFKA_DELAY_HORIZON", default_value = "1h")]
    pub horizon: String,
    /// Records due within this long of their arrival are also kept in memory until they fire
    /// (still written to RocksDB first), so firing them reads nothing; at most --horizon.
    #[arg(long, env = "KAFKA_DELAY_KEEP_IN_MEMORY_WITHIN", default_value = "5s")]
    pub keep_in_memory_within: String,
    /// Memory for those records, MiB (their bytes plus about 100 bytes each); a record that
    /// does not fit is read from RocksDB when it fires. 0 keeps none.
    #[arg(long, env = "KAFKA_DELAY_KEEP_IN_MEMORY_MB", default_value_t = 64)]
    pub keep_in_memory_mb: usize,
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
    /// How often to look for new source topics.
    #[arg(long, env = "KAFKA_DELAY_TOPIC_REFRESH", default_value = "5s")]
    pub topic_refresh: String,
    /// librdkafka property for all clients, KEY=VALUE (repeatable): SASL, TLS, tuning.
    #[arg(long = "kafka-config", env = "KAFKA_DELAY_KAFKA_CONFIG", value_delimiter = ';',
          value_parser = parse_kafka_prop)]
    pub kafka_config: Vec<KafkaProp>,
    /// Bearer token for the admin API (/api/...). Without it the API answers only when
    /// --http-addr is a loopback address.
    #[arg(long, env = "KAFKA_DELAY_ADMIN_TOKEN")]
    pub admin_token: Option<String>,
    /// Log format: plain or json.
    #[arg(long, env = "KAFKA_DELAY_LOG_FORMAT", default_value = "plain")]
    pub log_format: String,
}

/// Validated configuration of the broker.
#[derive(Debug, Clone)]
pub struct Config {
    /// Bootstrap servers (filled in from the embedded cluster when that is used).
    pub brokers: String,
    /// Whether to start an embedded cluster.
    pub embedded_kafka: bool,
    /// RocksDB directory.
    pub data_dir: PathBuf,
    /// HTTP listen address.
    pub http_addr: SocketAddr,
    /// Consumer group.
    pub group_id: String,
    /// Static membership id; `None` joins as a dynamic member.
    pub instance_id: Option<String>,
    /// Dead-letter topic.
    pub dead_letter_topic: String,
    /// Retry topic to create at start, if any.
    pub retry_topic: Option<String>,
    /// Its partitions when created.
    pub dead_letter_partitions: i32,
    /// Header contract rules.
    pub contract: Contract,
    /// fsync per batch.
    pub sync: bool,
    /// The time slice the scheduler's thread asks for; `None` keeps the kernel's own.
    pub scheduler_slice: Option<Duration>,
    /// Attempts before a permanently failing delivery is dead-lettered.
    pub fire_max_attempts: u32,
    /// Backoff cap, ms.
    pub fire_backoff_max_ms: u64,
    /// Horizon of the in-memory wheel, ms.
    pub horizon_ms: u64,
    /// Records due within this many ms of arrival are kept in memory as well.
    pub keep_within_ms: u64,
    /// At most this many bytes of them.
    pub keep_bytes: usize,
    /// In-flight deliveries.
    pub in_flight: usize,
    /// Fire rate limits and spreading.
    pub limits: Limits,
    /// New-topic discovery interval, ms.
    pub topic_refresh_ms: u64,
    /// Extra librdkafka properties (their `Debug` redacts secrets).
    pub kafka_config: Vec<KafkaProp>,
    /// JSON logs.
    pub log_json: bool,
    /// Admin API bearer token (its `Debug` is redacted).
    pub admin_token: Option<Secret>,
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

/// A flag or variable that cannot be used; the message says what to fix.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// librdkafka properties the broker sets itself, and the flag to use instead.
const OWNED_PROPERTIES: [(&str, &str); 8] = [
    ("bootstrap.servers", "--brokers"),
    ("metadata.broker.list", "--brokers"),
    ("group.id", "--group-id"),
    ("group.instance.id", "--instance-id"),
    ("enable.auto.offset.store", "(managed by kafka-delay)"),
    ("enable.idempotence", "(always on)"),
    (
        "allow.auto.create.topics",
        "(targets are never auto-created)",
    ),
    ("topic.metadata.refresh.interval.ms", "--topic-refresh"),
];

impl RunArgs {
    /// Checks every rule and returns the parsed configuration.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the flag (and its variable) and what to change.
    pub fn validate(&self) -> Result<Config, ConfigError> {
        let fail = |msg: String| Err(ConfigError(msg));
        let brokers = match (&self.brokers, self.embedded_kafka) {
            (Some(_), true) => {
                return fail("--brokers and --embedded-kafka exclude each other: give one".into())
            }
            (None, false) => {
                return fail(
                    "no Kafka: give --brokers HOST:PORT (KAFKA_DELAY_BROKERS) or --embedded-kafka"
                        .into(),
                )
            }
            (Some(b), false) if b.trim().is_empty() => {
                return fail("--brokers is empty: give HOST:PORT[,HOST:PORT...]".into())
            }
            (Some(b), false) => b.clone(),
            (None, true) => String::new(),
        };
        let source_pattern = Regex::new(&self.source_pattern).map_err(|e| {
            ConfigError(format!(
                "--source-pattern '{}' is not a valid regex: {e}",
                self.source_pattern
            ))
        })?;
        let target_allow = match &self.target_allow {
            None => None,
            Some(p) => Some(Regex::new(p).map_err(|e| {
                ConfigError(format!("--target-allow '{p}' is not a valid regex: {e}"))
            })?),
        };
        let max_delay_ms = duration("--max-delay", &self.max_delay)?;
        if max_delay_ms == 0 {
            return fail("--max-delay must be more than 0".into());
        }
        let contract = Contract {
            source_pattern,
            target_allow,
            allow_internal_targets: self.allow_internal_targets,
            max_delay_ms,
            max_record_bytes: self.max_record_bytes,
            retry: self.retries()?,
        };
        // The dead-letter topic must be a legal topic that is not itself consumed.
        if let Err(rej) = contract.check_target(&self.dead_letter_topic) {
            if rej.reason != crate::record::Reason::TargetNotAllowed {
                return fail(format!("--dead-letter-topic: {}", rej.detail));
            }
        }
        if self.dead_letter_partitions < 1 {
            return fail("--dead-letter-partitions must be at least 1".into());
        }
        if self.fire_max_attempts < 1 {
            return fail("--fire-max-attempts must be at least 1".into());
        }
        if self.in_flight < 1 {
            return fail("--in-flight must be at least 1".into());
        }
        if self.max_record_bytes < 1 {
            return fail("--max-record-bytes must be at least 1".into());
        }
        let matches =
            |t: &str| contract.source_pattern.is_match(t) && contract.retry.topics.is_match(t);
        let retry_topic = match self.retry_topic.as_deref() {
            None => Some(DEFAULT_RETRY_TOPIC)
                .filter(|t| matches(t))
                .map(str::to_owned),
            Some("") => None,
            Some(t) if matches(t) => Some(t.to_owned()),
            Some(t) => {
                return fail(format!(
                "--retry-topic '{t}' must match both --source-pattern '{}' and --retry-topics '{}'",
                contract.source_pattern, contract.retry.topics
            ))
            }
        };
        for (pattern, policy) in std::iter::once((None, &contract.retry.default))
            .chain(contract.retry.by_target.iter().map(|(r, p)| (Some(r), p)))
        {
            let sample = policy.dead_letter_topic("orders");
            if let Err(rej) = contract.check_dead_letter_topic(&sample) {
                let flag = pattern.map_or("--retry-default".to_owned(), |r| {
                    format!("--retry-policy {r}")
                });
                return fail(format!(
                    "{flag}: dead-letter '{}' does not give a usable topic (for target 'orders': {})",
                    policy.dead_letter, rej.detail
                ));
            }
        }
        let fire_backoff_max_ms = duration("--fire-backoff-max", &self.fire_backoff_max)?;
        let horizon_ms = duration("--horizon", &self.horizon)?;
        if horizon_ms < 1_000 {
            return fail(format!(
                "--horizon must be at least 1s (got {}); 1h suits most loads",
                self.horizon
            ));
        }
        let keep_within_ms = duration("--keep-in-memory-within", &self.keep_in_memory_within)?;
        if keep_within_ms > horizon_ms {
            return fail(format!(
                "--keep-in-memory-within {} is longer than --horizon {}; records due after the \
                 horizon are not in the wheel, so keeping them in memory only costs memory",
                self.keep_in_memory_within, self.horizon
            ));
        }
        let Some(keep_bytes) = self.keep_in_memory_mb.checked_mul(1 << 20) else {
            return fail(format!(
                "--keep-in-memory-mb {} is more memory than this machine can address",
                self.keep_in_memory_mb
            ));
        };
        let topic_refresh_ms = duration("--topic-refresh", &self.topic_refresh)?;
        if topic_refresh_ms < 100 {
            return fail("--topic-refresh must be at least 100ms".into());
        }
        for prop in &self.kafka_config {
            if let Some((_, instead)) = OWNED_PROPERTIES.iter().find(|(p, _)| *p == prop.key) {
                return fail(format!(
                    "--kafka-config {} is set by kafka-delay; use {instead}",
                    prop.key
                ));
            }
        }
        let admin_token = match &self.admin_token {
            Some(t) if t.len() < 16 => {
                return fail("--admin-token must be at least 16 characters".into())
            }
            t => t.clone().map(Secret),
        };
        let log_json = match self.log_format.as_str() {
            "plain" => false,
            "json" => true,
            other => return fail(format!("--log-format '{other}': use plain or json")),
        };
        let instance_id = match &self.instance_id {
            Some(id) if id.is_empty() => return fail("--instance-id is empty".into()),
            Some(id) => Some(id.clone()),
            None if self.no_static_membership => None,
            None => Some(default_instance_id()),
        };
        let scheduler_slice = if self.short_scheduler_slice {
            Some(crate::slice::SHORTEST)
        } else {
            scheduler_slice(&self.scheduler_slice)?
        };
        Ok(Config {
            brokers,
            embedded_kafka: self.embedded_kafka,
            data_dir: self.data_dir.clone(),
            http_addr: self.http_addr,
            group_id: self.group_id.clone(),
            instance_id,
            dead_letter_topic: self.dead_letter_topic.clone(),
            retry_topic,
            dead_letter_partitions: self.dead_letter_partitions,
            contract,
            sync: self.sync,
            scheduler_slice,
            fire_max_attempts: self.fire_max_attempts,
            fire_backoff_max_ms,
            horizon_ms,
            keep_within_ms,
            keep_bytes,
            in_flight: self.in_flight,
            limits: Limits {
                rules: self.fire_rate.clone(),
                global: self.fire_rate_global,
            },
            topic_refresh_ms,
            kafka_config: self.kafka_config.clone(),
            log_json,
            admin_token,
        })
    }
}

impl RunArgs {
    fn retries(&self) -> Result<Retries, ConfigError> {
        let topics = Regex::new(&self.retry_topics).map_err(|e| {
            ConfigError(format!(
                "--retry-topics '{}' is not a valid regex: {e}",
                self.retry_topics
            ))
        })?;
        let default = Policy::parse(&self.retry_default, &Policy::default())
            .map_err(|e| ConfigError(format!("--retry-default: {e}")))?;
        let mut by_target = Vec::new();
        for item in &self.retry_policy {
            // Topic names have no '=', so neither do the patterns that match them.
            let Some((pattern, spec)) = item.split_once('=') else {
                return Err(ConfigError(format!(
                    "--retry-policy '{item}': use REGEX=KEY=VALUE,... (e.g. '^orders\\.=max-attempts=10')"
                )));
            };
            let re = Regex::new(pattern).map_err(|e| {
                ConfigError(format!(
                    "--retry-policy '{pattern}' is not a valid regex: {e}"
                ))
            })?;
            let policy = Policy::parse(spec, &default)
                .map_err(|e| ConfigError(format!("--retry-policy {pattern}: {e}")))?;
            by_target.push((re, policy));
        }
        Ok(Retries {
            topics,
            default,
            by_target,
        })
    }
}

/// `--scheduler-slice`: `0` (the kernel's own), `<n>us`, or a duration in milliseconds and up,
/// within what the kernel grants a normal thread.
fn scheduler_slice(text: &str) -> Result<Option<Duration>, ConfigError> {
    if text == "0" {
        return Ok(None);
    }
    let slice = match text.strip_suffix("us") {
        Some(n) => n.parse().ok().map(Duration::from_micros),
        None => parse_duration_ms(text).ok().map(Duration::from_millis),
    };
    match slice {
        Some(s) if (crate::slice::SHORTEST..=crate::slice::LONGEST).contains(&s) => Ok(Some(s)),
        Some(_) => Err(ConfigError(format!(
            "--scheduler-slice {text}: Linux grants 100us to 100ms, or give 0 to keep the kernel's own"
        ))),
        None => Err(ConfigError(format!(
            "--scheduler-slice '{text}' is not a slice: give it like 1ms or 500us, or 0 to keep the kernel's own"
        ))),
    }
}

fn duration(flag: &str, text: &str) -> Result<u64, ConfigError> {
    parse_duration_ms(text).map_err(|e| ConfigError(format!("{flag}: {e}")))
}

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

pub(crate) fn parse_kafka_prop(item: &str) -> Result<KafkaProp, String> {
    let Some((k, v)) = item.split_once('=') else {
        return Err("expected KEY=VALUE (a librdkafka property)".into());
    };
    let key = k.trim();
    if key.is_empty() {
        return Err("empty KEY in KEY=VALUE".into());
    }
    Ok(KafkaProp {
        key: key.to_owned(),
        value: v.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Config, String> {
        let mut full = vec!["kafka-delay", "run"];
        full.extend_from_slice(args);
        let cli = Cli::try_parse_from(full).map_err(|e| e.to_string())?;
        match cli.command {
            Command::Run(a) => a.validate().map_err(|e| e.0),
            Command::Sandbox(_) | Command::Replay(_) | Command::Verify(_) => {
                unreachable!("run was parsed")
            }
        }
    }

    #[test]
    fn retry_policies_layer_on_the_default() {
        let c = parse(&[
            "--brokers",
            "a:1",
            "--retry-default",
            "max-attempts=3,delay=2s",
            "--retry-policy",
            r"^orders\.=backoff=fixed,delay=10s",
            "--retry-policy",
            "^payments=dead-letter=dlt.{target}",
        ])
        .unwrap();
        let r = &c.contract.retry;
        assert_eq!(r.policy_for("billing").max_attempts, 3);
        assert_eq!(r.policy_for("billing").delay_ms, 2_000);
        let orders = r.policy_for("orders.eu");
        assert_eq!(orders.backoff, retry::Backoff::Fixed);
        assert_eq!((orders.delay_ms, orders.max_attempts), (10_000, 3));
        assert_eq!(
            r.policy_for("payments").dead_letter_topic("payments"),
            "dlt.payments"
        );
        assert_eq!(
            r.policy_for("billing").dead_letter_topic("billing"),
            "billing.dlt"
        );
        assert_eq!(c.retry_topic.as_deref(), Some("delay.retry"));
        assert!(r.topics.is_match("delay.retry"));
    }

    #[test]
    fn defaults_are_sane() {
        let c = parse(&["--brokers", "127.0.0.1:9092"]).unwrap();
        assert_eq!(c.dead_letter_topic, "delay-dead-letter");
        assert_eq!(c.contract.max_delay_ms, 365 * 86_400_000);
        assert!(c.contract.source_pattern.is_match("delay.30s"));
        assert!(!c.contract.source_pattern.is_match(&c.dead_letter_topic));
        assert!(c.instance_id.unwrap().starts_with("kafka-delay-"));
        let c = parse(&["--brokers", "a:1", "--no-static-membership"]).unwrap();
        assert_eq!(c.instance_id, None);
        assert!(!c.sync);
        // A slice of its own for the scheduler's thread: closer to due, no more CPU per record.
        assert_eq!(c.scheduler_slice, Some(Duration::from_millis(1)));
        // Records due within 5 s of arrival fire from memory, up to 64 MiB of them.
        assert_eq!((c.keep_within_ms, c.keep_bytes), (5_000, 64 << 20));
        let c = parse(&["--brokers", "a:1", "--keep-in-memory-mb", "0"]).unwrap();
        assert_eq!(c.keep_bytes, 0);
        // A custom source pattern the default retry topic does not match: no retry topic.
        let c = parse(&["--brokers", "a:1", "--source-pattern", r"^later\..+"]).unwrap();
        assert_eq!(c.retry_topic, None);
        let c = parse(&["--brokers", "a:1", "--retry-topic", ""]).unwrap();
        assert_eq!(c.retry_topic, None);
    }

    #[test]
    fn bad_flags_say_what_to_fix() {
        let cases: [(&[&str], &str); 23] = [
            (
                &["--brokers", "a:1", "--retry-default", "backoff=linear"],
                "--retry-default: backoff 'linear': use fixed or exponential",
            ),
            (
                &["--brokers", "a:1", "--retry-default", "jitter=1.5"],
                "jitter '1.5'",
            ),
            (
                &["--brokers", "a:1", "--retry-policy", "^orders"],
                "REGEX=KEY=VALUE",
            ),
            (
                &["--brokers", "a:1", "--retry-policy", "^orders=tries=3"],
                "unknown key 'tries'",
            ),
            (
                &[
                    "--brokers",
                    "a:1",
                    "--retry-default",
                    "dead-letter=delay.{target}",
                ],
                "does not give a usable topic",
            ),
            (
                &["--brokers", "a:1", "--retry-topic", "retries"],
                "--retry-topic 'retries' must match",
            ),
            (&[], "--brokers"),
            (
                &["--brokers", "a:1", "--embedded-kafka"],
                "exclude each other",
            ),
            (
                &["--brokers", "a:1", "--source-pattern", "(["],
                "--source-pattern",
            ),
            (
                &["--brokers", "a:1", "--max-delay", "10 days"],
                "--max-delay",
            ),
            (
                &["--brokers", "a:1", "--dead-letter-topic", "delay.dead"],
                "would loop",
            ),
            (
                &["--brokers", "a:1", "--dead-letter-topic", "__dlt"],
                "internal",
            ),
            (
                &["--brokers", "a:1", "--kafka-config", "nokey"],
                "KEY=VALUE",
            ),
            (
                &["--brokers", "a:1", "--kafka-config", "group.id=x"],
                "--group-id",
            ),
            (
                &["--brokers", "a:1", "--log-format", "xml"],
                "plain or json",
            ),
            (
                &["--brokers", "a:1", "--target-allow", "("],
                "--target-allow",
            ),
            (
                &["--brokers", "a:1", "--fire-max-attempts", "0"],
                "at least 1",
            ),
            (
                &[
                    "--brokers",
                    "a:1",
                    "--horizon",
                    "10s",
                    "--keep-in-memory-within",
                    "1m",
                ],
                "--keep-in-memory-within 1m is longer than --horizon 10s",
            ),
            (
                &["--brokers", "a:1", "--keep-in-memory-within", "soon"],
                "--keep-in-memory-within",
            ),
            (
                &["--brokers", "a:1", "--scheduler-slice", "50us"],
                "--scheduler-slice 50us: Linux grants 100us to 100ms",
            ),
            (
                &["--brokers", "a:1", "--scheduler-slice", "1s"],
                "--scheduler-slice 1s: Linux grants 100us to 100ms",
            ),
            (
                &["--brokers", "a:1", "--scheduler-slice", "short"],
                "give it like 1ms or 500us",
            ),
            (
                &[
                    "--brokers",
                    "a:1",
                    "--scheduler-slice",
                    "2ms",
                    "--short-scheduler-slice",
                ],
                "cannot be used with",
            ),
        ];
        for (args, want) in cases {
            let err = parse(args).unwrap_err();
            assert!(err.contains(want), "{args:?}: {err}");
        }
        let err = parse(&["--brokers", "a:1", "--http-addr", "nowhere"]).unwrap_err();
        assert!(err.contains("--http-addr"), "{err}");
    }

    #[test]
    fn fire_limits_come_from_repeated_flags() {
        let c = parse(&[
            "--brokers",
            "a:1",
            "--fire-rate",
            "^orders$=500/s,burst=50",
            "--fire-rate",
            "^reminders=spread=1m",
            "--fire-rate-global",
            "2000/s",
        ])
        .unwrap();
        assert_eq!(c.limits.rules.len(), 2);
        assert_eq!(c.limits.rules[0].rate.unwrap().burst, 50);
        assert_eq!(c.limits.rules[1].spread_ms, 60_000);
        assert_eq!(c.limits.global.unwrap().per_second, 2_000.0);
        assert!(parse(&["--brokers", "a:1"]).unwrap().limits.is_empty());
        for (args, says) in [
            (
                ["--fire-rate", "^orders$"],
                "invalid value '^orders$' for '--fire-rate",
            ),
            (["--fire-rate", "^orders$=500/s,burst=-1"], "burst '-1'"),
            (["--fire-rate-global", "lots"], "rate 'lots'"),
        ] {
            let err = parse(&[&["--brokers", "a:1"][..], &args[..]].concat()).unwrap_err();
            assert!(err.contains(says), "{args:?}: {err}");
        }
    }

    #[test]
    fn the_scheduler_slice_is_given_in_microseconds_or_milliseconds_or_left_to_the_kernel() {
        let slice = |args: &[&str]| {
            let mut full = vec!["--brokers", "a:1"];
            full.extend_from_slice(args);
            parse(&full).unwrap().scheduler_slice
        };
        assert_eq!(slice(&[]), Some(Duration::from_millis(1)));
        assert_eq!(
            slice(&["--scheduler-slice", "500us"]),
            Some(Duration::from_micros(500))
        );
        assert_eq!(
            slice(&["--scheduler-slice", "3ms"]),
            Some(Duration::from_millis(3))
        );
        assert_eq!(slice(&["--scheduler-slice", "0"]), None);
        assert_eq!(
            slice(&["--short-scheduler-slice"]),
            Some(Duration::from_micros(100))
        );
    }

    #[test]
    fn kafka_config_passes_through_and_secrets_are_redacted() {
        let c = parse(&[
            "--brokers",
            "a:1",
            "--kafka-config",
            "sasl.password=hunter2",
            "--kafka-config",
            "linger.ms=5",
        ])
        .unwrap();
        assert_eq!(c.kafka_config[0].value, "hunter2");
        let shown = format!("{c:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("linger.ms"));
    }
}
