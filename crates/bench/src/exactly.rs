//! `kafka-delay-bench exactly-once`: what `--exactly-once` costs the broker itself, against
//! at-least-once (`--changelog` alone) on the same Kafka in the same run.
//!
//! Each run is one broker process of its own group with `--changelog` (and `--exactly-once`
//! with one transaction setting), on twelve partitions, in two phases:
//! - **throughput**: `--records` records produced at once, all due 20 s later; the rate is the
//!   records over the time from the first due time to the last record a read_committed
//!   consumer of the target read;
//! - **lateness**: records produced at `--rate` a second for `--lateness-for`, each due 5 s
//!   after it is produced; the read_committed consumer's arrival time minus the due time.
//!
//! At-least-once runs before the first setting and after each one, so each exactly-once run
//! has a baseline on either side; its ratio is against their mean.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::FutureRecord;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde::Serialize;

use super::harness::{paced, percentiles, Kafka};
use super::recovery::Broker;
use super::BenchError;
use kafka_delay_core::clock::Clock as _;
use kafka_delay_core::time::parse_duration_ms;

/// Flags of `kafka-delay-bench exactly-once`.
#[derive(Debug, clap::Args)]
pub struct ExactlyOnceArgs {
    /// Apache Kafka's bootstrap servers.
    #[arg(long)]
    pub brokers: String,
    /// Records of each throughput phase, all due 20 s after they are produced.
    #[arg(long, default_value_t = 300_000)]
    pub records: u64,
    /// Records per second of each lateness phase.
    #[arg(long, default_value_t = 5_000)]
    pub rate: u64,
    /// How long each lateness phase produces.
    #[arg(long, default_value = "20s")]
    pub lateness_for: String,
    /// Exactly-once settings, RECORDS:INTERVAL (`--transaction-records`,
    /// `--transaction-interval`), comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "10000:100ms,1000:100ms,10000:10ms,100000:100ms,100000:1s"
    )]
    pub settings: Vec<String>,
    /// Where to write the results as JSON.
    #[arg(long, default_value = "bench-exactly-once.json")]
    pub json: PathBuf,
}

/// One run's figures.
#[derive(Debug, Clone, Serialize)]
pub struct EosRun {
    /// `at-least-once`, or the exactly-once setting `RECORDS:INTERVAL`.
    pub mode: String,
    /// Throughput phase: records per second from the first due time to the last arrival.
    pub records_per_s: f64,
    /// Lateness phase: p50, p99, p99.9 and the maximum of arrival minus due time, ms.
    pub lateness_ms: [u64; 4],
}

const PARTITIONS: i32 = 12;
const LEAD: Duration = Duration::from_secs(20);
const LATENESS_LEAD: Duration = Duration::from_secs(5);

/// Runs at-least-once and each setting in turn and prints the table.
///
/// # Errors
/// Kafka, or a broker that does not start or does not deliver everything.
pub async fn run_exactly_once(args: &ExactlyOnceArgs) -> Result<Vec<EosRun>, BenchError> {
    let kafka = Kafka::connect(Some(&args.brokers), PARTITIONS, &[])?;
    let work = tempfile::TempDir::new()?;
    let mut modes = vec![None];
    for s in &args.settings {
        let (records, interval) = s
            .split_once(':')
            .ok_or_else(|| format!("setting {s}: want RECORDS:INTERVAL"))?;
        modes.push(Some((records.to_owned(), interval.to_owned())));
        modes.push(None);
    }
    let mut runs = Vec::new();
    for (i, mode) in modes.iter().enumerate() {
        let run = one_run(args, &kafka, &work, i, mode.as_ref()).await?;
        eprintln!("{run:?}");
        runs.push(run);
    }
    print(&runs);
    Ok(runs)
}

async fn one_run(
    args: &ExactlyOnceArgs,
    kafka: &Kafka,
    work: &tempfile::TempDir,
    i: usize,
    mode: Option<&(String, String)>,
) -> Result<EosRun, BenchError> {
    let (name, source, target) = super::instances::topics(kafka, work.path(), "eos", i).await?;
    let id = format!("eos-{name}");
    let mut flags = vec![
        "--changelog",
        "--changelog-replication",
        "1",
        "--instance-id",
        &id,
    ];
    if let Some((records, interval)) = mode {
        flags.extend([
            "--exactly-once",
            "--transaction-records",
            records,
            "--transaction-interval",
            interval,
        ]);
    }
    let dir = work.path().join(&name);
    let group = format!("bench-eos-{name}");
    let pattern = format!("^{}$", source.replace('.', "\\."));
    let broker = Broker::spawn(&args.brokers, &dir, work.path(), (&group, &pattern), &flags)?;
    broker.ready(Duration::from_secs(120)).await?;
    owned(&broker).await?;

    let arrivals = Arrivals::start(&args.brokers, &target)?;
    let first_due = Instant::now() + LEAD;
    let after = format!("{}s", LEAD.as_secs());
    kafka
        .fill_topic_due(&source, args.records, 100, Some(&target), &after)
        .await?;
    if Instant::now() > first_due {
        return Err("producing took longer than the lead; give fewer --records".into());
    }
    arrivals.wait_for(args.records).await?;
    let records_per_s = args.records as f64 / first_due.elapsed().as_secs_f64();

    let lateness_for = Duration::from_millis(parse_duration_ms(&args.lateness_for)?);
    let steady = (args.rate as f64 * lateness_for.as_secs_f64()) as u64;
    produce_steady(kafka, &source, &target, args.rate, steady).await?;
    arrivals.wait_for(args.records + steady).await?;
    let late = arrivals.stop();
    let lateness_ms = percentiles(
        late.iter()
            .filter(|(k, _)| k.starts_with('s'))
            .map(|(_, l)| *l)
            .collect(),
    );
    drop(broker);
    Ok(EosRun {
        mode: mode.map_or("at-least-once".into(), |(r, i)| format!("{r}:{i}")),
        records_per_s,
        lateness_ms,
    })
}

/// Waits until the broker owns all twelve partitions.
async fn owned(broker: &Broker) -> Result<(), BenchError> {
    let deadline = Instant::now() + Duration::from_secs(120);
    while broker.gauge("kafka_delay_partitions_owned") < PARTITIONS as u64 {
        if Instant::now() > deadline {
            return Err("the partitions were not owned within 120 s".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// `n` records at `rate` a second, keyed `s<i>`, each due 5 s after it is produced.
async fn produce_steady(
    kafka: &Kafka,
    source: &str,
    target: &str,
    rate: u64,
    n: u64,
) -> Result<(), BenchError> {
    let p = kafka.producer(1)?;
    let after = format!("{}s", LATENESS_LEAD.as_secs());
    let value = vec![b'v'; 100];
    let started = Instant::now();
    let mut acks = Vec::new();
    let mut sent = 0;
    while sent < n {
        let due_now = paced(started, rate as f64, n);
        while sent < due_now {
            let key = format!("s{sent}");
            let headers = OwnedHeaders::new()
                .insert(Header {
                    key: "delay-target",
                    value: Some(target),
                })
                .insert(Header {
                    key: "delay-after",
                    value: Some(&after),
                });
            let rec = FutureRecord::to(source)
                .key(&key)
                .payload(&value)
                .headers(headers);
            match p.send_result(rec) {
                Ok(f) => acks.push(f),
                Err((e, _)) => return Err(e.into()),
            }
            sent += 1;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    for f in acks {
        f.await?.map_err(|(e, _)| e)?;
    }
    Ok(())
}

/// A read_committed consumer of the target on a thread: each record's key and arrival minus
/// due time.
struct Arrivals {
    stop: Arc<AtomicBool>,
    seen: Arc<std::sync::Mutex<HashMap<String, u64>>>,
    thread: std::thread::JoinHandle<()>,
}

impl Arrivals {
    fn start(brokers: &str, target: &str) -> Result<Self, BenchError> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("group.id", "bench-eos-reader")
            .set("isolation.level", "read_committed")
            .set("enable.auto.commit", "false")
            .create()?;
        let mut tpl = TopicPartitionList::new();
        for p in 0..PARTITIONS {
            tpl.add_partition_offset(target, p, Offset::Beginning)?;
        }
        consumer.assign(&tpl)?;
        let stop = Arc::new(AtomicBool::new(false));
        let seen: Arc<std::sync::Mutex<HashMap<String, u64>>> = Arc::default();
        let (s, m) = (stop.clone(), seen.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let Some(Ok(msg)) = consumer.poll(Duration::from_millis(50)) else {
                    continue;
                };
                let now = kafka_delay_core::clock::SystemClock.now_ms();
                let due = msg.headers().and_then(|h| {
                    h.iter()
                        .find(|h| h.key == "delay-due-ms")
                        .and_then(|h| std::str::from_utf8(h.value?).ok()?.parse::<u64>().ok())
                });
                let key = String::from_utf8_lossy(msg.key().unwrap_or_default()).into_owned();
                if let Some(due) = due {
                    m.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(key, now.saturating_sub(due));
                }
            }
        });
        Ok(Self { stop, seen, thread })
    }

    /// Waits (at most 600 s) until `n` distinct records arrived.
    async fn wait_for(&self, n: u64) -> Result<(), BenchError> {
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            let got = self.seen.lock().unwrap_or_else(|e| e.into_inner()).len() as u64;
            if got >= n {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("{got} of {n} records arrived within 600 s").into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn stop(self) -> Vec<(String, u64)> {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
        let seen = std::mem::take(&mut *self.seen.lock().unwrap_or_else(|e| e.into_inner()));
        seen.into_iter().collect()
    }
}

/// The table: each exactly-once run against the mean of the at-least-once runs beside it.
fn print(runs: &[EosRun]) {
    println!("| mode | records/s | of at-least-once | lateness p50 / p99 / p99.9 / max ms |");
    println!("|---|---|---|---|");
    for (i, r) in runs.iter().enumerate() {
        let base: Vec<f64> = [i.checked_sub(1), Some(i + 1)]
            .into_iter()
            .flatten()
            .filter_map(|j| runs.get(j))
            .filter(|b| b.mode == "at-least-once")
            .map(|b| b.records_per_s)
            .collect();
        let ratio = if r.mode == "at-least-once" || base.is_empty() {
            "-".to_owned()
        } else {
            format!(
                "{:.2}",
                r.records_per_s / (base.iter().sum::<f64>() / base.len() as f64)
            )
        };
        let [p50, p99, p999, max] = r.lateness_ms;
        println!(
            "| {} | {:.0} | {ratio} | {p50} / {p99} / {p999} / {max} |",
            r.mode, r.records_per_s
        );
    }
}
