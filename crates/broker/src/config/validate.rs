//! [`RunArgs::validate`]: the rules between flags, checked once at start, turning the flags into
//! a [`Config`] whose parts are ready to use (regexes compiled, topics checked).

use std::time::Duration;

use regex::Regex;

use super::args::{LogFormat, RunArgs};
use super::parse::{human, millis};
use super::{
    default_instance_id, Changelog, ClusterConfig, Config, ConfigError, FireConfig, HttpConfig,
    KafkaConfig, Secret, StoreConfig, TopicsConfig, ValueCopy, WheelConfig, DEFAULT_RETRY_TOPIC,
};
use kafka_delay_core::limit::Limits;
use kafka_delay_core::record::{Contract, Reason};
use kafka_delay_core::retry::{Policy, Retries};

/// How long an ingested group lingers before it is written to the changelog, unless told.
const DEFAULT_LINGER: Duration = Duration::from_secs(1);

/// librdkafka properties the broker sets itself, and the flag to use instead.
const OWNED_PROPERTIES: [(&str, &str); 9] = [
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
    (
        "transactional.id",
        "--exactly-once (the id is <group-id>-<instance-id>)",
    ),
];

fn at_least(flag: &'static str, min: &'static str, got: impl ToString) -> ConfigError {
    ConfigError::AtLeast {
        flag,
        min,
        got: got.to_string(),
    }
}

impl RunArgs {
    /// Checks every rule and returns the parsed configuration.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the flag (and its variable) and what to change.
    pub fn validate(&self) -> Result<Config, ConfigError> {
        let contract = self.contract()?;
        // The wheel before the store: a horizon too short is the first thing to fix.
        let wheel = self.wheel()?;
        Ok(Config {
            kafka: self.kafka()?,
            topics: self.topics(&contract)?,
            contract,
            store: self.store()?,
            cluster: self.cluster()?,
            wheel,
            fire: self.fire()?,
            http: self.http()?,
            log_json: self.http.log_format == LogFormat::Json,
        })
    }

    fn kafka(&self) -> Result<KafkaConfig, ConfigError> {
        let k = &self.kafka;
        let brokers = match (&k.brokers, k.embedded_kafka) {
            (Some(_), true) => return Err(ConfigError::Exclusive("--brokers", "--embedded-kafka")),
            (None, false) => return Err(ConfigError::NoKafka),
            (Some(b), false) if b.trim().is_empty() => {
                return Err(ConfigError::Empty {
                    flag: "--brokers",
                    want: "HOST:PORT[,HOST:PORT...]",
                })
            }
            (Some(b), false) => b.clone(),
            (None, true) => String::new(),
        };
        if millis(k.topic_refresh) < 100 {
            return Err(at_least("--topic-refresh", "100ms", human(k.topic_refresh)));
        }
        if k.dead_letter_partitions < 1 {
            return Err(at_least(
                "--dead-letter-partitions",
                "1",
                k.dead_letter_partitions,
            ));
        }
        for prop in &k.kafka_config {
            if let Some((_, instead)) = OWNED_PROPERTIES.iter().find(|(p, _)| *p == prop.key) {
                return Err(ConfigError::OwnedProperty {
                    key: prop.key.clone(),
                    instead,
                });
            }
        }
        let instance_id = match &k.instance_id {
            Some(id) if id.is_empty() => {
                return Err(ConfigError::Empty {
                    flag: "--instance-id",
                    want: "a name that stays the same across restarts, or leave it out",
                })
            }
            Some(id) => Some(id.clone()),
            None if k.no_static_membership => None,
            None => Some(default_instance_id()),
        };
        Ok(KafkaConfig {
            brokers,
            embedded: k.embedded_kafka,
            group_id: k.group_id.clone(),
            instance_id,
            properties: k.kafka_config.clone(),
            topic_refresh: k.topic_refresh,
        })
    }

    fn contract(&self) -> Result<Contract, ConfigError> {
        let r = &self.records;
        let pattern = &self.kafka.source_pattern;
        let source_pattern =
            Regex::new(pattern).map_err(|e| ConfigError::regex("--source-pattern", pattern, e))?;
        let target_allow = match &r.target_allow {
            None => None,
            Some(p) => Some(Regex::new(p).map_err(|e| ConfigError::regex("--target-allow", p, e))?),
        };
        let max_delay_ms = millis(r.max_delay);
        if max_delay_ms == 0 {
            return Err(at_least("--max-delay", "1ms", "0"));
        }
        if r.max_record_bytes < 1 {
            return Err(at_least("--max-record-bytes", "1", r.max_record_bytes));
        }
        Ok(Contract {
            source_pattern,
            target_allow,
            routes: r.route.clone(),
            allow_internal_targets: r.allow_internal_targets,
            max_delay_ms,
            max_record_bytes: r.max_record_bytes,
            retry: self.retries()?,
        })
    }

    fn retries(&self) -> Result<Retries, ConfigError> {
        let r = &self.retry;
        let topics = Regex::new(&r.retry_topics)
            .map_err(|e| ConfigError::regex("--retry-topics", &r.retry_topics, e))?;
        let default = Policy::parse(&r.retry_default, &Policy::default())
            .map_err(|e| ConfigError::invalid("--retry-default", &r.retry_default, e))?;
        let mut by_target = Vec::new();
        for item in &r.retry_policy {
            // Topic names have no '=', so neither do the patterns that match them.
            let Some((pattern, spec)) = item.split_once('=') else {
                return Err(ConfigError::invalid(
                    "--retry-policy",
                    item,
                    "use REGEX=KEY=VALUE,... (e.g. '^orders\\.=max-attempts=10')",
                ));
            };
            let re = Regex::new(pattern)
                .map_err(|e| ConfigError::regex("--retry-policy", pattern, e))?;
            let policy = Policy::parse(spec, &default)
                .map_err(|e| ConfigError::invalid(format!("--retry-policy {pattern}"), spec, e))?;
            by_target.push((re, policy));
        }
        Ok(Retries {
            topics,
            default,
            by_target,
        })
    }

    /// The topics the broker writes to: the dead-letter topic and the retry topic to create.
    fn topics(&self, contract: &Contract) -> Result<TopicsConfig, ConfigError> {
        let dead_letter = &self.records.dead_letter_topic;
        // The dead-letter topic must be a legal topic that is not itself consumed.
        if let Err(rej) = contract.check_target(dead_letter) {
            if rej.reason != Reason::TargetNotAllowed {
                return Err(ConfigError::invalid(
                    "--dead-letter-topic",
                    dead_letter,
                    rej.detail,
                ));
            }
        }
        let matches =
            |t: &str| contract.source_pattern.is_match(t) && contract.retry.topics.is_match(t);
        let retry = match self.retry.retry_topic.as_deref() {
            None => Some(DEFAULT_RETRY_TOPIC)
                .filter(|t| matches(t))
                .map(str::to_owned),
            Some("") => None,
            Some(t) if matches(t) => Some(t.to_owned()),
            Some(t) => {
                return Err(ConfigError::RetryTopicUnmatched {
                    topic: t.to_owned(),
                    source_pattern: contract.source_pattern.to_string(),
                    retry_topics: contract.retry.topics.to_string(),
                })
            }
        };
        let policies = std::iter::once((None, &contract.retry.default))
            .chain(contract.retry.by_target.iter().map(|(r, p)| (Some(r), p)));
        for (pattern, policy) in policies {
            let sample = policy.dead_letter_topic("orders");
            if let Err(rej) = contract.check_dead_letter_topic(&sample) {
                return Err(ConfigError::DeadLetterTemplate {
                    flag: pattern.map_or("--retry-default".to_owned(), |r| {
                        format!("--retry-policy {r}")
                    }),
                    template: policy.dead_letter.clone(),
                    detail: rej.detail,
                });
            }
        }
        Ok(TopicsConfig {
            dead_letter: dead_letter.clone(),
            retry,
            partitions: self.kafka.dead_letter_partitions,
        })
    }

    fn store(&self) -> Result<StoreConfig, ConfigError> {
        let s = &self.store;
        if s.keep_in_memory_within > self.wheel.horizon {
            return Err(ConfigError::KeepBeyondHorizon {
                keep: human(s.keep_in_memory_within),
                horizon: human(self.wheel.horizon),
            });
        }
        let Some(keep_bytes) = s.keep_in_memory_mb.checked_mul(1 << 20) else {
            return Err(ConfigError::invalid(
                "--keep-in-memory-mb",
                s.keep_in_memory_mb.to_string(),
                "more memory than this machine can address",
            ));
        };
        Ok(StoreConfig {
            data_dir: s.data_dir.clone(),
            sync: s.sync,
            keep_within: s.keep_in_memory_within,
            keep_bytes,
        })
    }

    fn cluster(&self) -> Result<ClusterConfig, ConfigError> {
        let c = &self.cluster;
        if c.changelog_replication == 0 || c.changelog_replication < -1 {
            return Err(ConfigError::invalid(
                "--changelog-replication",
                c.changelog_replication.to_string(),
                "a replication factor is at least 1, or -1 for the cluster's default",
            ));
        }
        if c.changelog && self.kafka.embedded_kafka {
            // librdkafka's mock cluster has no compacted topics and no DescribeConfigs.
            return Err(ConfigError::Exclusive("--changelog", "--embedded-kafka"));
        }
        let changelog = match (c.changelog, c.no_changelog, self.kafka.embedded_kafka) {
            (true, _, _) => Changelog::On,
            (_, true, _) => Changelog::Off,
            (_, _, true) => Changelog::Embedded,
            _ => Changelog::Default,
        };
        if c.standby_replicas > 0 && matches!(changelog, Changelog::Off | Changelog::Embedded) {
            return Err(ConfigError::invalid(
                "--standby-replicas",
                c.standby_replicas.to_string(),
                "standby replicas tail the changelog: leave out --no-changelog, or leave it at 0",
            ));
        }
        let changelog_linger = self.changelog_linger(changelog)?;
        Ok(ClusterConfig {
            changelog,
            changelog_replication: c.changelog_replication,
            changelog_copy: if c.changelog_copy_values {
                ValueCopy::All
            } else {
                ValueCopy::Unless(c.changelog_copy_margin)
            },
            changelog_linger,
            handoff_wait: c.handoff_wait,
            standby_replicas: c.standby_replicas,
            fast_takeover: !c.no_fast_takeover,
            transactional_id: self.transactional_id(changelog)?,
            transaction_records: c.transaction_records,
            transaction_interval: c.transaction_interval,
        })
    }

    /// How long ingested groups linger before the changelog has them: less than a revoke's
    /// wait, and only where there is a changelog that ingest writes outside a transaction.
    fn changelog_linger(&self, changelog: Changelog) -> Result<Duration, ConfigError> {
        let c = &self.cluster;
        let Some(linger) = c.changelog_linger else {
            return Ok(DEFAULT_LINGER.min(c.handoff_wait / 2));
        };
        let why = if matches!(changelog, Changelog::Off | Changelog::Embedded) {
            "groups linger before they are written to the changelog: leave out --no-changelog, \
             or leave out --changelog-linger"
                .to_owned()
        } else if c.exactly_once {
            "with --exactly-once a group's changelog entries commit with its offsets in one \
             transaction, without a linger: leave out --changelog-linger"
                .to_owned()
        } else if linger >= c.handoff_wait {
            format!(
                "a revoke waits for the lingering groups at most --handoff-wait ({}): make the \
                 linger shorter than that",
                human(c.handoff_wait)
            )
        } else {
            return Ok(linger);
        };
        Err(ConfigError::invalid(
            "--changelog-linger",
            human(linger),
            why,
        ))
    }

    /// With --exactly-once: the transactional id, `<group-id>-<instance-id>`, the same across
    /// restarts so that a restarted instance fences what it left behind.
    fn transactional_id(&self, changelog: Changelog) -> Result<Option<String>, ConfigError> {
        let c = &self.cluster;
        if !c.exactly_once {
            return Ok(None);
        }
        let why = if self.kafka.embedded_kafka {
            Some("the embedded cluster cannot run transactions: give --brokers of an Apache Kafka cluster")
        } else if changelog == Changelog::Off {
            Some("exactly-once commits the changelog with what fires: leave out --no-changelog")
        } else if self.kafka.no_static_membership && self.kafka.instance_id.is_none() {
            Some("exactly-once needs an id that stays the same across restarts: give --instance-id")
        } else {
            None
        };
        if let Some(why) = why {
            return Err(ConfigError::invalid("--exactly-once", "on", why));
        }
        if c.transaction_records == 0 {
            return Err(at_least("--transaction-records", "1", 0));
        }
        if c.transaction_interval.is_zero() || c.transaction_interval > Duration::from_secs(10) {
            return Err(ConfigError::invalid(
                "--transaction-interval",
                human(c.transaction_interval),
                "between 1ms and 10s (records wait for their transaction's commit)",
            ));
        }
        let instance = self
            .kafka
            .instance_id
            .clone()
            .unwrap_or_else(default_instance_id);
        Ok(Some(format!("{}-{instance}", self.kafka.group_id)))
    }

    fn wheel(&self) -> Result<WheelConfig, ConfigError> {
        let w = &self.wheel;
        if millis(w.horizon) < 1_000 {
            return Err(at_least("--horizon", "1s", human(w.horizon)));
        }
        Ok(WheelConfig {
            horizon: w.horizon,
            scheduler_slice: w.scheduler_slice.own(),
        })
    }

    fn fire(&self) -> Result<FireConfig, ConfigError> {
        let f = &self.fire;
        if f.fire_max_attempts < 1 {
            return Err(at_least("--fire-max-attempts", "1", f.fire_max_attempts));
        }
        if f.in_flight < 1 {
            return Err(at_least("--in-flight", "1", f.in_flight));
        }
        Ok(FireConfig {
            max_attempts: f.fire_max_attempts,
            backoff_max: f.fire_backoff_max,
            in_flight: f.in_flight,
            limits: Limits {
                rules: f.fire_rate.clone(),
                global: f.fire_rate_global,
            },
            at_ingest: !f.no_fire_at_ingest,
        })
    }

    fn http(&self) -> Result<HttpConfig, ConfigError> {
        let admin_token = match &self.http.admin_token {
            Some(t) if t.len() < 16 => {
                return Err(at_least(
                    "--admin-token",
                    "16 characters",
                    format!("{} characters", t.len()),
                ))
            }
            t => t.clone().map(Secret),
        };
        Ok(HttpConfig {
            addr: self.http.http_addr,
            admin_token,
            advertised: self.http.advertised_http_addr.clone(),
        })
    }
}
