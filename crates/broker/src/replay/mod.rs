//! `kafka-delay replay`: moves dead-lettered records back to a topic, rate-limited, resetting
//! their retry count.
//!
//! It reads the dead-letter topic from its first to its last offset as they were when the
//! replay started (records arriving meanwhile wait for the next replay), keeps the records that
//! match every `--filter`, and produces them to `--to` with their key, value and headers, minus
//! what the dead-lettering added (`delay-error`, `delay-error-detail`, origin and fire-time
//! provenance) and minus the retry count (`retry-attempt`, `retry-first-failed-at`,
//! `retry-after`), plus `delay-replayed-from: <topic>/<partition>/<offset>`. Control headers
//! such as `delay-target` and `delay-until` stay, so records rejected at ingest can be replayed
//! into a delay topic once the cause is fixed. No consumer group is used and no offset is
//! committed: running it twice moves the records twice.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use clap::Args;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use crate::config::{parse_kafka_prop, ConfigError, KafkaProp};
use crate::kafka::{client_config, headers_from, headers_to};
use kafka_delay_core::record::{names, Header};
use kafka_delay_core::retry::names as retry;

/// Flags of `kafka-delay replay`.
#[derive(Debug, Args, Clone)]
pub struct ReplayArgs {
    /// Kafka bootstrap servers, HOST:PORT[,HOST:PORT...].
    #[arg(long, env = "KAFKA_DELAY_BROKERS")]
    pub brokers: String,
    /// Dead-letter topic to read.
    #[arg(long)]
    pub from: String,
    /// Topic to move the records to (a target topic, or a delay topic such as delay.retry).
    #[arg(long)]
    pub to: String,
    /// Most records per second (N, N/s or N/m). Default: as fast as the cluster takes them.
    #[arg(long)]
    pub rate: Option<String>,
    /// Move only matching records (repeatable, all must match): reason=CODE, target=TOPIC,
    /// key=TEXT, header:NAME=VALUE.
    #[arg(long)]
    pub filter: Vec<String>,
    /// Count what would be moved; produce nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// librdkafka property for both clients, KEY=VALUE (repeatable): SASL, TLS.
    #[arg(long = "kafka-config", env = "KAFKA_DELAY_KAFKA_CONFIG", value_delimiter = ';',
          value_parser = parse_kafka_prop)]
    pub kafka_config: Vec<KafkaProp>,
}

/// Which records to move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Filter {
    /// `delay-error` equals the code.
    Reason(String),
    /// `delay-target` equals the topic.
    Target(String),
    /// The key equals the text.
    Key(String),
    /// A header with this name has this value.
    Header(String, String),
}

impl Filter {
    /// Parses `reason=CODE`, `target=TOPIC`, `key=TEXT` or `header:NAME=VALUE`.
    ///
    /// # Errors
    /// A sentence giving the accepted forms.
    pub fn parse(text: &str) -> Result<Filter, String> {
        let bad = || "use reason=CODE, target=TOPIC, key=TEXT or header:NAME=VALUE".to_owned();
        let (what, value) = text.split_once('=').ok_or_else(bad)?;
        Ok(match what {
            "reason" => Filter::Reason(value.to_owned()),
            "target" => Filter::Target(value.to_owned()),
            "key" => Filter::Key(value.to_owned()),
            _ => match what.strip_prefix("header:") {
                Some(name) if !name.is_empty() => Filter::Header(name.to_owned(), value.to_owned()),
                _ => return Err(bad()),
            },
        })
    }

    pub(crate) fn matches(&self, key: Option<&[u8]>, headers: &[Header]) -> bool {
        let has = |name: &str, value: &str| {
            headers
                .iter()
                .any(|h| h.key == name && h.value.as_deref() == Some(value.as_bytes()))
        };
        match self {
            Filter::Reason(code) => has(names::ERROR, code),
            Filter::Target(topic) => has(names::TARGET, topic),
            Filter::Key(k) => key == Some(k.as_bytes()),
            Filter::Header(name, value) => has(name, value),
        }
    }
}

/// A validated replay.
#[derive(Debug, Clone)]
pub struct Replay {
    /// Bootstrap servers.
    pub brokers: String,
    /// Dead-letter topic.
    pub from: String,
    /// Destination topic.
    pub to: String,
    /// Records per second, if limited.
    pub rate: Option<f64>,
    /// All must match.
    pub filters: Vec<Filter>,
    /// Produce nothing.
    pub dry_run: bool,
    /// Extra librdkafka properties.
    pub kafka_config: Vec<KafkaProp>,
}

impl ReplayArgs {
    /// Checks the flags.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the flag and what to change.
    pub fn validate(&self) -> Result<Replay, ConfigError> {
        if self.brokers.trim().is_empty() {
            return Err(ConfigError::Empty {
                flag: "--brokers",
                want: "HOST:PORT[,HOST:PORT...]",
            });
        }
        if self.from.is_empty() || self.to.is_empty() {
            return Err(ConfigError::Empty {
                flag: if self.from.is_empty() {
                    "--from"
                } else {
                    "--to"
                },
                want: "a topic",
            });
        }
        if self.from == self.to {
            return Err(ConfigError::invalid(
                "--to",
                &self.to,
                "the same topic as --from: replay moves records to another topic",
            ));
        }
        let rate = match &self.rate {
            None => None,
            Some(r) => Some(parse_rate(r).map_err(|e| ConfigError::invalid("--rate", r, e))?),
        };
        let filters = self
            .filter
            .iter()
            .map(|f| Filter::parse(f).map_err(|e| ConfigError::invalid("--filter", f, e)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Replay {
            brokers: self.brokers.clone(),
            from: self.from.clone(),
            to: self.to.clone(),
            rate,
            filters,
            dry_run: self.dry_run,
            kafka_config: self.kafka_config.clone(),
        })
    }
}

/// Parses `N`, `N/s` or `N/m` into records per second.
///
/// # Errors
/// A sentence giving the accepted forms.
pub fn parse_rate(text: &str) -> Result<f64, String> {
    let (n, per) = match text.split_once('/') {
        None => (text, 1.0),
        Some((n, "s")) => (n, 1.0),
        Some((n, "m")) => (n, 60.0),
        Some(_) => return Err("use N, N/s or N/m".to_owned()),
    };
    match n.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v / per),
        _ => Err("a positive number of records, N, N/s or N/m".to_owned()),
    }
}

/// Counts, updated while the replay runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// Records in the dead-letter topic when the replay started.
    pub total: u64,
    /// Records read so far.
    pub read: u64,
    /// Records moved (acknowledged by the cluster), or that would be in a dry run.
    pub moved: u64,
    /// Records that did not match the filters.
    pub skipped: u64,
    /// Records the cluster refused.
    pub failed: u64,
}

/// Why a replay could not run.
/// Why a replay stopped.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// A client could not be created.
    #[error("cannot create the {client}: {source} (check --kafka-config)")]
    Client {
        /// Which client.
        client: &'static str,
        /// librdkafka's error.
        source: KafkaError,
    },
    /// A topic named by a flag does not exist.
    #[error("topic '{topic}' ({flag}) does not exist; create it first, or name another")]
    NoTopic {
        /// The topic.
        topic: String,
        /// `--from` or `--to`.
        flag: &'static str,
    },
    /// Kafka failed a request.
    #[error("{what}: {source}")]
    Kafka {
        /// What was being done.
        what: String,
        /// librdkafka's error.
        source: KafkaError,
    },
    /// No record arrived for a long time while some were still expected.
    #[error("no record from '{topic}' for {}s with {left} still to read", STALL.as_secs())]
    Stalled {
        /// The topic read.
        topic: String,
        /// Records still expected.
        left: u64,
    },
    /// The replay's own runtime could not start.
    #[error("cannot start the replay: {0}")]
    Runtime(std::io::Error),
}

fn kafka(what: impl Into<String>) -> impl FnOnce(KafkaError) -> ReplayError {
    let what = what.into();
    move |source| ReplayError::Kafka { what, source }
}

/// How long without a record, while some are still expected, before giving up.
const STALL: Duration = Duration::from_secs(30);
/// Most records produced and not yet acknowledged.
const WINDOW: usize = 1_000;

/// Runs the replay, calling `progress` about once a second, and returns the final counts.
///
/// # Errors
/// A [`ReplayError`] when a topic is missing or the cluster stops answering.
pub async fn run(
    opts: &Replay,
    mut progress: impl FnMut(&Summary),
) -> Result<Summary, ReplayError> {
    let (consumer, producer) = clients(opts)?;
    let mut summary = Summary::default();
    let end = assign(&consumer, opts, &mut summary)?;
    if !end.is_empty() {
        copy(&consumer, &producer, opts, end, &mut summary, &mut progress).await?;
    }
    progress(&summary);
    Ok(summary)
}

/// The consumer of `--from` and the producer to `--to`.
fn clients(opts: &Replay) -> Result<(StreamConsumer, FutureProducer), ReplayError> {
    let base = client_config(&opts.brokers, "kafka-delay-replay", &opts.kafka_config);
    let consumer: StreamConsumer = base
        .clone()
        .set("group.id", "kafka-delay-replay")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("allow.auto.create.topics", "false")
        .create()
        .map_err(|source| ReplayError::Client {
            client: "consumer",
            source,
        })?;
    let producer: FutureProducer = base
        .clone()
        .set("enable.idempotence", "true")
        .set("partitioner", "murmur2_random")
        .set("allow.auto.create.topics", "false")
        .set("linger.ms", "5")
        .create()
        .map_err(|source| ReplayError::Client {
            client: "producer",
            source,
        })?;
    Ok((consumer, producer))
}

/// Assigns every partition of `--from` that has records from its start, counts them into
/// `summary.total`, and returns the end offset of each (the replay reads up to there).
fn assign(
    consumer: &StreamConsumer,
    opts: &Replay,
    summary: &mut Summary,
) -> Result<HashMap<i32, i64>, ReplayError> {
    let partitions = partitions_of(consumer, &opts.from)?;
    if partitions.is_empty() {
        return Err(ReplayError::NoTopic {
            topic: opts.from.clone(),
            flag: "--from",
        });
    }
    if partitions_of(consumer, &opts.to)?.is_empty() {
        return Err(ReplayError::NoTopic {
            topic: opts.to.clone(),
            flag: "--to",
        });
    }
    let mut end: HashMap<i32, i64> = HashMap::new();
    let mut tpl = TopicPartitionList::new();
    for p in partitions {
        let (low, high) = consumer
            .fetch_watermarks(&opts.from, p, Duration::from_secs(10))
            .map_err(kafka(format!("cannot read the offsets of '{}'", opts.from)))?;
        if high > low {
            summary.total += (high - low) as u64;
            end.insert(p, high);
            tpl.add_partition_offset(&opts.from, p, Offset::Offset(low))
                .map_err(kafka("cannot assign"))?;
        }
    }
    if !end.is_empty() {
        consumer
            .assign(&tpl)
            .map_err(kafka(format!("cannot read '{}'", opts.from)))?;
    }
    Ok(end)
}

/// Reads `--from` up to `end`, sending the records that pass the filters to `--to` at the
/// rate asked for, with at most [`WINDOW`] unacknowledged.
async fn copy(
    consumer: &StreamConsumer,
    producer: &FutureProducer,
    opts: &Replay,
    mut end: HashMap<i32, i64>,
    summary: &mut Summary,
    progress: &mut impl FnMut(&Summary),
) -> Result<(), ReplayError> {
    let started = Instant::now();
    let mut last_report = Instant::now();
    let mut sent: u64 = 0;
    let mut in_flight: VecDeque<DeliveryFuture> = VecDeque::new();
    while !end.is_empty() {
        let msg = match tokio::time::timeout(STALL, consumer.recv()).await {
            Ok(Ok(m)) => m.detach(),
            Ok(Err(e)) => return Err(kafka(format!("reading '{}'", opts.from))(e)),
            Err(_) => {
                return Err(ReplayError::Stalled {
                    topic: opts.from.clone(),
                    left: summary.total - summary.read,
                })
            }
        };
        let (p, offset) = (msg.partition(), msg.offset());
        let Some(&high) = end.get(&p) else { continue };
        if offset >= high {
            end.remove(&p);
            continue;
        }
        if offset + 1 >= high {
            end.remove(&p);
        }
        summary.read += 1;
        let headers = headers_from(msg.headers());
        if !opts.filters.iter().all(|f| f.matches(msg.key(), &headers)) {
            summary.skipped += 1;
        } else if opts.dry_run {
            summary.moved += 1;
        } else {
            if let Some(rate) = opts.rate {
                let at = started + Duration::from_secs_f64(sent as f64 / rate);
                tokio::time::sleep_until(at.into()).await;
            }
            in_flight.push_back(send(producer, opts, &msg, headers)?);
            sent += 1;
            while in_flight.len() >= WINDOW {
                settle(in_flight.pop_front(), summary).await;
            }
            while in_flight.front().is_some_and(|_| opts.rate.is_some()) {
                // Rate-limited replays are slow anyway: count each as it is acknowledged.
                settle(in_flight.pop_front(), summary).await;
            }
        }
        if last_report.elapsed() >= Duration::from_secs(1) {
            progress(summary);
            last_report = Instant::now();
        }
    }
    while let Some(f) = in_flight.pop_front() {
        settle(Some(f), summary).await;
    }
    Ok(())
}

fn partitions_of(consumer: &StreamConsumer, topic: &str) -> Result<Vec<i32>, ReplayError> {
    crate::kafka::partitions_of(consumer.client(), topic)
        .map_err(kafka("Kafka did not answer a metadata request"))
}

/// The headers a replayed record carries.
fn replayed_headers(msg: &OwnedMessage, mut headers: Vec<Header>) -> Vec<Header> {
    const DROPPED: [&str; 10] = [
        names::ERROR,
        names::ERROR_DETAIL,
        names::ORIGIN_TOPIC,
        names::ORIGIN_PARTITION,
        names::ORIGIN_OFFSET,
        names::DUE_MS,
        names::FIRED_MS,
        retry::ATTEMPT,
        retry::FIRST_FAILED_AT,
        retry::AFTER,
    ];
    headers.retain(|h| !DROPPED.contains(&h.key.as_str()) && h.key != REPLAYED_FROM);
    headers.push(Header::new(
        REPLAYED_FROM,
        format!("{}/{}/{}", msg.topic(), msg.partition(), msg.offset()),
    ));
    headers
}

/// Header naming where a replayed record was read from.
pub const REPLAYED_FROM: &str = "delay-replayed-from";

fn send(
    producer: &FutureProducer,
    opts: &Replay,
    msg: &OwnedMessage,
    headers: Vec<Header>,
) -> Result<DeliveryFuture, ReplayError> {
    let headers = headers_to(&replayed_headers(msg, headers));
    let mut rec = FutureRecord::<[u8], [u8]>::to(&opts.to).headers(headers);
    if let Some(k) = msg.key() {
        rec = rec.key(k);
    }
    if let Some(v) = msg.payload() {
        rec = rec.payload(v);
    }
    producer
        .send_result(rec)
        .map_err(|(e, _)| kafka(format!("cannot queue a record for '{}'", opts.to))(e))
}

async fn settle(delivery: Option<DeliveryFuture>, summary: &mut Summary) {
    let Some(delivery) = delivery else { return };
    match delivery.await {
        Ok(Ok(_)) => summary.moved += 1,
        _ => summary.failed += 1,
    }
}

#[cfg(test)]
mod tests;
