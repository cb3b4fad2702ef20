//! The verifier: produces a known set of delayed records, consumes the target, and reports what
//! was lost, duplicated, early or late. `kafka-delay verify` runs it against a live broker; the
//! reliability tests use [`Tally`] directly.
//!
//! It trusts nothing kafka-delay writes about itself. Each record carries its identity in the
//! value, `<run>:<n>`, and the verifier keeps its planned due time; a record is early when it
//! reached the target before that time, judged by the broker's append time on a target with
//! `message.timestamp.type=LogAppendTime` and otherwise by when the verifier received it (later
//! than it reached the target, so that clock can miss an early record but never invents one).
//! Its producer is idempotent, so a retry of its own cannot make a duplicate; it reads
//! read_committed, and keeps reading `--settle` after the last first copy for late duplicates.

use std::time::{Duration, Instant};

use clap::Args;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header as KHeader, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use crate::config::parse::duration;
use crate::config::{millis, parse_kafka_prop, KafkaProp};
use kafka_delay_core::record::names;

/// What arrived for one planned record.
#[derive(Debug, Clone, Copy, Default)]
struct Seen {
    count: u32,
}

/// When a record reached the target, and by which clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// The broker's append time (a target with `message.timestamp.type=LogAppendTime`).
    Appended(u64),
    /// When the reader received it (a target that keeps the producer's timestamps).
    Received(u64),
}

impl Arrival {
    /// The arrival of `m`: its append time where the broker set it, else now.
    pub fn of(m: &impl Message) -> Self {
        match m.timestamp() {
            rdkafka::Timestamp::LogAppendTime(ms) if ms >= 0 => Arrival::Appended(ms as u64),
            _ => Arrival::Received(now_ms()),
        }
    }

    fn ms(self) -> u64 {
        match self {
            Arrival::Appended(ms) | Arrival::Received(ms) => ms,
        }
    }
}

/// Counts published records against a plan of `n` records due at `due_of(i)`.
#[derive(Debug, Clone)]
pub struct Tally {
    run: String,
    due: Vec<u64>,
    seen: Vec<Seen>,
    early: Vec<(u64, u64)>,
    lateness_ms: Vec<u64>,
    foreign: u64,
    mangled: u64,
    received_clock: bool,
}

/// The verdict.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Report {
    /// Records planned.
    pub planned: u64,
    /// Distinct records received.
    pub received: u64,
    /// Planned records never received.
    pub lost: u64,
    /// Extra copies received (at-least-once after a crash).
    pub duplicates: u64,
    /// Records that reached the target before their planned due time.
    pub early: u64,
    /// Arrival minus planned due, over first copies: p50, p99, p99.9, max (ms).
    pub lateness_ms: [u64; 4],
    /// The first few lost record numbers.
    pub lost_sample: Vec<u64>,
    /// The clock arrivals were judged by: `log-append-time` (the broker's, every record) or
    /// `receipt` (the reader's, for at least one record).
    pub arrival: &'static str,
    /// Records of this run whose value names no planned record (a corrupted copy).
    pub mangled: u64,
    /// Records on the target that are not this run's (another producer's), not judged.
    pub foreign: u64,
}

impl Tally {
    /// A tally for run `run` of `dues.len()` records due at `dues[i]`.
    pub fn new(run: &str, dues: Vec<u64>) -> Self {
        let n = dues.len();
        Self {
            run: run.to_owned(),
            due: dues,
            seen: vec![Seen::default(); n],
            early: Vec::new(),
            lateness_ms: Vec::with_capacity(n),
            foreign: 0,
            mangled: 0,
            received_clock: false,
        }
    }

    /// The value of record `i` of this run.
    pub fn value(&self, i: usize) -> String {
        format!("{}:{i}", self.run)
    }

    /// Counts one record read from the target, which reached it at `arrived`. Records of
    /// other runs are counted as foreign; this run's with a value that names no planned
    /// record as mangled.
    pub fn observe(&mut self, value: Option<&[u8]>, arrived: Arrival) {
        let Some(rest) = value
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|v| v.strip_prefix(&self.run))
            .and_then(|v| v.strip_prefix(':'))
        else {
            self.foreign += 1;
            return;
        };
        match rest.parse::<usize>().ok().filter(|n| *n < self.due.len()) {
            Some(n) => {
                self.received_clock |= matches!(arrived, Arrival::Received(_));
                self.record(n, arrived.ms());
            }
            None => self.mangled += 1,
        }
    }

    /// Counts record `n` arrived at `arrived_ms`.
    pub fn record(&mut self, n: usize, arrived_ms: u64) {
        let due = self.due[n];
        let s = &mut self.seen[n];
        s.count += 1;
        if s.count == 1 {
            self.lateness_ms.push(arrived_ms.saturating_sub(due));
        }
        if arrived_ms < due {
            self.early.push((n as u64, due - arrived_ms));
        }
    }

    /// Whether every planned record arrived at least once.
    pub fn complete(&self) -> bool {
        // One lateness is kept per record on its first arrival: as many as planned, all came.
        self.lateness_ms.len() == self.seen.len()
    }

    /// The verdict so far.
    pub fn report(&self) -> Report {
        let lost: Vec<u64> = (0..self.seen.len() as u64)
            .filter(|i| self.seen[*i as usize].count == 0)
            .collect();
        let mut late = self.lateness_ms.clone();
        late.sort_unstable();
        let pct = |p: f64| -> u64 {
            if late.is_empty() {
                return 0;
            }
            late[((late.len() as f64 * p).ceil() as usize).clamp(1, late.len()) - 1]
        };
        Report {
            planned: self.seen.len() as u64,
            received: self.seen.iter().filter(|s| s.count > 0).count() as u64,
            lost: lost.len() as u64,
            duplicates: self
                .seen
                .iter()
                .map(|s| u64::from(s.count.saturating_sub(1)))
                .sum(),
            early: self.early.len() as u64,
            lateness_ms: [
                pct(0.5),
                pct(0.99),
                pct(0.999),
                late.last().copied().unwrap_or(0),
            ],
            lost_sample: lost.into_iter().take(10).collect(),
            arrival: if self.received_clock {
                "receipt"
            } else {
                "log-append-time"
            },
            mangled: self.mangled,
            foreign: self.foreign,
        }
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "| planned | received | lost | duplicates | early | late p50 | p99 | p99.9 | max |"
        )?;
        writeln!(f, "|---|---|---|---|---|---|---|---|---|")?;
        let [p50, p99, p999, max] = self.lateness_ms;
        write!(
            f,
            "| {} | {} | {} | {} | {} | {p50} ms | {p99} ms | {p999} ms | {max} ms |",
            self.planned, self.received, self.lost, self.duplicates, self.early
        )
    }
}

/// Why the verifier could not run.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// `--count 0`.
    #[error("--count must be at least 1")]
    NoRecords,
    /// The target topic is missing.
    #[error("target topic '{0}' does not exist: create it, or name another with --target")]
    NoTarget(String),
    /// A Kafka client failed.
    #[error("{what}: {source}")]
    Kafka {
        /// What was being done.
        what: &'static str,
        /// librdkafka's error.
        source: KafkaError,
    },
}

/// Flags of `kafka-delay verify`.
#[derive(Debug, Args, Clone)]
pub struct VerifyArgs {
    /// Kafka bootstrap servers.
    #[arg(long, env = "KAFKA_DELAY_BROKERS")]
    pub brokers: String,
    /// Delay topic to produce to (kafka-delay must consume it).
    #[arg(long, default_value = "delay.verify")]
    pub delay_topic: String,
    /// Target topic (must exist).
    #[arg(long, default_value = "verify")]
    pub target: String,
    /// Records to produce.
    #[arg(long, default_value_t = 10_000)]
    pub count: usize,
    /// Due times are spread evenly over this window, starting `--lead` from now.
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub window: Duration,
    /// How far ahead the first record is due.
    #[arg(long, default_value = "5s", value_parser = duration)]
    pub lead: Duration,
    /// How long after the last due time to wait for stragglers.
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub grace: Duration,
    /// How long to keep reading once every record arrived (or the grace ended), for
    /// duplicates that come late.
    #[arg(long, default_value = "10s", value_parser = duration)]
    pub settle: Duration,
    /// librdkafka property for both clients, KEY=VALUE (repeatable).
    #[arg(long = "kafka-config", value_parser = parse_kafka_prop)]
    pub kafka_config: Vec<KafkaProp>,
    /// Duplicates allowed before the verdict fails (e.g. `--in-flight` times the instances
    /// killed); without it duplicates are reported but do not fail it.
    #[arg(long)]
    pub max_duplicates: Option<u64>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

impl Report {
    /// Whether the run passed: nothing lost, early or mangled, at most `max_duplicates`.
    pub fn passed(&self, max_duplicates: Option<u64>) -> bool {
        self.lost == 0
            && self.early == 0
            && self.mangled == 0
            && max_duplicates.is_none_or(|m| self.duplicates <= m)
    }
}

/// Runs the verifier: produce, consume until complete or the grace ends, report.
///
/// # Errors
/// A bad flag, or a client that cannot be created or cannot produce.
pub async fn run(args: &VerifyArgs) -> Result<Report, VerifyError> {
    let (window, lead, grace) = (millis(args.window), millis(args.lead), millis(args.grace));
    if args.count == 0 {
        return Err(VerifyError::NoRecords);
    }
    let base = crate::kafka::client_config(&args.brokers, "kafka-delay-verify", &args.kafka_config);
    let consumer = target_reader(&base, &args.target)?;
    // Idempotent: a retry of its own never writes a record twice, so every duplicate the
    // report counts was made downstream.
    let producer: FutureProducer = base
        .clone()
        .set("linger.ms", "5")
        .set("enable.idempotence", "true")
        .create()
        .map_err(fail("producer"))?;
    let start = now_ms() + lead;
    let n = args.count as u64;
    let dues: Vec<u64> = (0..n).map(|i| start + i * window / n.max(1)).collect();
    let run_id = format!("v{}", now_ms());
    let mut tally = Tally::new(&run_id, dues.clone());
    produce(&producer, args, &tally, &dues).await?;
    let deadline = Instant::now()
        + Duration::from_millis(start + window + grace - now_ms().min(start + window + grace));
    let mut errors = ConsumerErrors::default();
    while !tally.complete() {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, consumer.recv()).await {
            Ok(Ok(m)) => tally.observe(m.payload(), Arrival::of(&m)),
            // Kafka restarting, say: the consumer reconnects by itself.
            Ok(Err(e)) => errors.note(&e).await,
            Err(_) => break,
        }
    }
    // Longer, to see duplicates that follow the last first copy (a consumer error, such as
    // Kafka restarting, does not end it).
    let settle = Instant::now() + args.settle;
    while let Ok(m) = tokio::time::timeout(
        settle.saturating_duration_since(Instant::now()),
        consumer.recv(),
    )
    .await
    {
        match m {
            Ok(m) => tally.observe(m.payload(), Arrival::of(&m)),
            Err(e) => errors.note(&e).await,
        }
    }
    Ok(tally.report())
}

/// The consumer's errors while Kafka is away, each taken off its queue at once: the records
/// that follow them in the queue wait for nothing. (A pause per error made the errors of a
/// long outage a backlog that the records arriving after it waited behind, past the deadline,
/// and they counted as lost.) Logged at most once a second, with how many came since.
#[derive(Default)]
struct ConsumerErrors {
    logged: Option<Instant>,
    since: u64,
}

impl ConsumerErrors {
    async fn note(&mut self, e: &KafkaError) {
        self.since += 1;
        if self
            .logged
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(1))
        {
            tracing::warn!(error = %e, errors = self.since, "consumer error; still reading");
            (self.logged, self.since) = (Some(Instant::now()), 0);
        }
        // A yield, not a wait; it still bounds the loop if errors came without end.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

fn fail(what: &'static str) -> impl FnOnce(KafkaError) -> VerifyError {
    move |source| VerifyError::Kafka { what, source }
}

/// A consumer of every partition of `target` from its end, so that it sees only what this
/// run makes arrive.
fn target_reader(base: &ClientConfig, target: &str) -> Result<StreamConsumer, VerifyError> {
    let consumer: StreamConsumer = base
        .clone()
        .set("group.id", "kafka-delay-verify")
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "50")
        .create()
        .map_err(fail("consumer"))?;
    let partitions =
        crate::kafka::partitions_of(consumer.client(), target).map_err(fail("metadata"))?;
    if partitions.is_empty() {
        return Err(VerifyError::NoTarget(target.to_owned()));
    }
    let mut tpl = TopicPartitionList::new();
    for p in partitions {
        let (_, high) = consumer
            .fetch_watermarks(target, p, Duration::from_secs(10))
            .map_err(fail("watermarks"))?;
        tpl.add_partition_offset(target, p, Offset::Offset(high))
            .map_err(fail("assign"))?;
    }
    consumer.assign(&tpl).map_err(fail("assign"))?;
    Ok(consumer)
}

/// Produces one delayed record per due time to the delay topic, waiting for every delivery.
async fn produce(
    producer: &FutureProducer,
    args: &VerifyArgs,
    tally: &Tally,
    dues: &[u64],
) -> Result<(), VerifyError> {
    let mut pending = Vec::new();
    for (i, due) in dues.iter().enumerate() {
        let headers = OwnedHeaders::new()
            .insert(KHeader {
                key: names::TARGET,
                value: Some(args.target.as_bytes()),
            })
            .insert(KHeader {
                key: names::UNTIL,
                value: Some(due.to_string().as_bytes()),
            });
        let value = tally.value(i);
        let key = format!("k{i}");
        let mut rec = FutureRecord::to(&args.delay_topic)
            .key(&key)
            .payload(&value)
            .headers(headers);
        let delivery = loop {
            match producer.send_result(rec) {
                Ok(d) => break d,
                Err((e, back))
                    if e.rdkafka_error_code()
                        == Some(rdkafka::types::RDKafkaErrorCode::QueueFull) =>
                {
                    rec = back;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err((e, _)) => return Err(fail("produce")(e)),
            }
        };
        pending.push(delivery);
        if pending.len() >= 1_000 {
            for f in pending.drain(..) {
                delivered(f).await.map_err(fail("produce"))?;
            }
        }
    }
    for f in pending {
        delivered(f).await.map_err(fail("produce"))?;
    }
    Ok(())
}

async fn delivered(f: rdkafka::producer::DeliveryFuture) -> Result<(), rdkafka::error::KafkaError> {
    match f.await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err((e, _))) => Err(e),
        Err(_) => Err(rdkafka::error::KafkaError::Canceled),
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_counts_lost_duplicates_early_and_lateness() {
        let mut t = Tally::new("r", vec![100, 200, 300, 400]);
        t.record(0, 100);
        t.record(1, 205);
        t.record(1, 260); // a duplicate
        t.record(2, 290); // early
        let r = t.report();
        assert!(!t.complete());
        assert_eq!(
            (r.planned, r.received, r.lost, r.duplicates, r.early),
            (4, 3, 1, 1, 1)
        );
        assert_eq!(r.lost_sample, vec![3]);
        assert_eq!(r.lateness_ms, [0, 5, 5, 5]);
        assert!(r.to_string().contains("| 4 | 3 | 1 | 1 | 1 |"));
        assert_eq!(t.value(3), "r:3");
        assert_eq!(r.arrival, "log-append-time");
        t.observe(Some(b"other:1"), Arrival::Appended(500));
        t.observe(Some(b"r:9"), Arrival::Appended(500));
        t.observe(Some(b"r:x"), Arrival::Appended(500));
        let r = t.report();
        assert_eq!((r.foreign, r.mangled), (1, 2));
        assert!(!r.passed(None), "a mangled record of the run fails it");
        // Judged by the arrival the reader saw, whatever the record says of itself.
        t.observe(Some(b"r:3"), Arrival::Received(350));
        let r = t.report();
        assert!(t.complete());
        assert_eq!((r.early, r.arrival), (2, "receipt"));
    }
}
