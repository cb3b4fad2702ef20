//! `kafka-delay-bench txn`: what Kafka transactions cost the writes of firing, before they
//! are wired into the broker. Each fired record is two writes (the record to its target and a
//! tombstone to the changelog); pieces of `--piece` records (a fire batch) are handed in by
//! `--writers` tasks at once.
//!
//! - **at-least-once**: the same writes with the broker's idempotent producer, each piece
//!   awaiting its acknowledgements;
//! - **transactions**: the pieces handed to `kafka_delay::txn` (one transactional producer;
//!   each transaction also commits a consumer group's offset with its metadata), for each
//!   commit interval and transaction size given.
//!
//! Reported per run: fired records per second, and per piece the time from handing it in to
//! its acknowledgement or commit (p50, p99): what a transaction adds to delivery lateness.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde::Serialize;

use super::harness::{config, percentiles, Kafka};
use super::BenchError;
use kafka_delay::txn::{Cut, GroupMetadata, Out, Setup, Transactions};

/// Flags of `kafka-delay-bench txn`.
#[derive(Debug, clap::Args)]
pub struct TxnArgs {
    /// Apache Kafka's bootstrap servers (the embedded cluster has no transactions).
    #[arg(long)]
    pub brokers: String,
    /// Records fired per run (each two writes).
    #[arg(long, default_value_t = 200_000)]
    pub records: u64,
    /// Records per piece handed in (a fire batch).
    #[arg(long, default_value_t = 64)]
    pub piece: usize,
    /// Tasks handing pieces in at once.
    #[arg(long, default_value_t = 8)]
    pub writers: usize,
    /// Commit intervals to run, in ms.
    #[arg(long, value_delimiter = ',', default_value = "10,50,100")]
    pub intervals_ms: Vec<u64>,
    /// Transaction sizes to run (records after which a transaction is cut).
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    pub max_records: Vec<usize>,
    /// Where to write the results as JSON.
    #[arg(long, default_value = "bench-txn.json")]
    pub json: PathBuf,
}

/// One run's figures.
#[derive(Debug, Serialize)]
pub struct TxnRun {
    /// What ran.
    pub name: String,
    /// Fired records (two writes each) per second.
    pub records_per_s: f64,
    /// Against the at-least-once run before it.
    pub against_at_least_once: f64,
    /// Piece handed in to acknowledged or committed, p50 and p99, ms.
    pub piece_ms: [u64; 2],
}

/// Runs at-least-once, then each transaction setting, each followed by at-least-once again
/// (the ratio is against the mean of the two around it), and prints the table.
///
/// # Errors
/// Kafka failing, or a cluster without transactions.
pub async fn run_txn(args: &TxnArgs) -> Result<Vec<TxnRun>, BenchError> {
    let kafka = Kafka::connect(Some(&args.brokers), 1, &[])?;
    let work = tempfile::TempDir::new()?;
    let probe = config(&args.brokers, work.path(), &[])?;
    let producer = kafka_delay::kafka::producer(&probe)?;
    let name = kafka.run.replace('-', "_");
    let (source, target, changelog) = (
        format!("bench.txn.src.{name}"),
        format!("bench.txn.out.{name}"),
        format!("bench.txn.changelog.{name}"),
    );
    for t in [&source, &target, &changelog] {
        kafka.create(t, &producer, &probe).await;
    }
    let member = Member::join(&args.brokers, &format!("bench-txn-{name}"), &source)?;
    let topics = (target.as_str(), changelog.as_str());
    let mut runs = Vec::new();
    let mut before = at_least_once(args, &producer, topics).await?;
    for &interval in &args.intervals_ms {
        for &max_records in &args.max_records {
            let cut = Cut {
                interval: Duration::from_millis(interval),
                max_records,
                timeout: Duration::from_secs(30),
                commit_wait: Duration::from_secs(30),
                stuck: Cut::stuck_after(Duration::from_secs(60)),
            };
            let t = transactions(args, &args.brokers, &member, &source, topics, cut).await?;
            let after = at_least_once(args, &producer, topics).await?;
            let base = (before.0 + after.0) / 2.0;
            runs.push(TxnRun {
                name: format!("transactions, {interval} ms or {max_records} records"),
                records_per_s: t.0,
                against_at_least_once: t.0 / base,
                piece_ms: t.1,
            });
            runs.push(TxnRun {
                name: "at-least-once (idempotent)".into(),
                records_per_s: after.0,
                against_at_least_once: after.0 / base,
                piece_ms: after.1,
            });
            before = after;
        }
    }
    println!("| run | records/s | against at-least-once | piece p50 ms | p99 ms |");
    println!("|---|---|---|---|---|");
    for r in &runs {
        println!(
            "| {} | {:.0} | {:.2} | {} | {} |",
            r.name, r.records_per_s, r.against_at_least_once, r.piece_ms[0], r.piece_ms[1]
        );
    }
    Ok(runs)
}

/// A member of a consumer group, kept in it by a thread that polls; its group metadata is
/// what transactions send their offsets with.
struct Member {
    consumer: Arc<BaseConsumer>,
    _polling: std::thread::JoinHandle<()>,
}

impl Member {
    fn join(brokers: &str, group: &str, topic: &str) -> Result<Self, BenchError> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .create()?;
        consumer.subscribe(&[topic])?;
        let consumer = Arc::new(consumer);
        let deadline = Instant::now() + Duration::from_secs(60);
        while consumer.assignment().map_or(0, |a| a.count()) == 0 {
            if Instant::now() > deadline {
                return Err("the benchmark's consumer got no assignment in 60 s".into());
            }
            let _ = consumer.poll(Duration::from_millis(100));
        }
        let c = Arc::downgrade(&consumer);
        let polling = std::thread::spawn(move || {
            while let Some(c) = c.upgrade() {
                let _ = c.poll(Duration::from_millis(100));
            }
        });
        Ok(Self {
            consumer,
            _polling: polling,
        })
    }

    fn metadata(&self) -> GroupMetadata {
        let c = self.consumer.clone();
        Arc::new(move || c.group_metadata())
    }
}

/// The writes of `piece` fired records: each to the target and a tombstone to the changelog.
fn writes(target: &str, changelog: &str, first: u64, piece: usize) -> Vec<Out> {
    let mut out = Vec::with_capacity(piece * 2);
    for i in first..first + piece as u64 {
        out.push(Out {
            topic: target.to_owned(),
            partition: Some(0),
            key: Some(format!("k{i}").into_bytes()),
            value: Some(vec![b'v'; 100]),
            headers: None,
        });
        out.push(Out {
            topic: changelog.to_owned(),
            partition: Some(0),
            key: Some(i.to_be_bytes().to_vec()),
            value: None,
            headers: None,
        });
    }
    out
}

/// Hands `args.records` in as pieces from `args.writers` tasks through `hand_in`; the rate and
/// the piece latencies.
async fn drive<F, Fut>(args: &TxnArgs, hand_in: F) -> Result<(f64, [u64; 2]), BenchError>
where
    F: Fn(u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<(), String>> + Send,
{
    let pieces = args.records / args.piece as u64;
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..args.writers {
        let (next, hand_in, piece) = (next.clone(), hand_in.clone(), args.piece as u64);
        tasks.push(tokio::spawn(async move {
            let mut took = Vec::new();
            loop {
                let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if k >= pieces {
                    return Ok::<_, String>(took);
                }
                let at = Instant::now();
                hand_in(k * piece).await?;
                took.push(at.elapsed().as_millis() as u64);
            }
        }));
    }
    let mut took = Vec::new();
    for t in tasks {
        took.extend(t.await.map_err(|e| e.to_string())??);
    }
    let rate = (pieces * args.piece as u64) as f64 / started.elapsed().as_secs_f64();
    let p = percentiles(took);
    Ok((rate, [p[0], p[1]]))
}

async fn at_least_once(
    args: &TxnArgs,
    producer: &FutureProducer,
    (target, changelog): (&str, &str),
) -> Result<(f64, [u64; 2]), BenchError> {
    let (p, t, c, piece) = (
        producer.clone(),
        target.to_owned(),
        changelog.to_owned(),
        args.piece,
    );
    drive(args, move |first| {
        let (p, outs) = (p.clone(), writes(&t, &c, first, piece));
        async move {
            let mut acks = Vec::with_capacity(outs.len());
            for o in &outs {
                let mut rec: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&o.topic).partition(0);
                if let Some(k) = &o.key {
                    rec = rec.key(k.as_slice());
                }
                if let Some(v) = &o.value {
                    rec = rec.payload(v.as_slice());
                }
                acks.push(p.send_result(rec).map_err(|(e, _)| e.to_string())?);
            }
            for a in acks {
                a.await
                    .map_err(|e| e.to_string())?
                    .map_err(|(e, _)| e.to_string())?;
            }
            Ok(())
        }
    })
    .await
}

async fn transactions(
    args: &TxnArgs,
    brokers: &str,
    member: &Member,
    source: &str,
    (target, changelog): (&str, &str),
    cut: Cut,
) -> Result<(f64, [u64; 2]), BenchError> {
    let producer = kafka_delay::txn::producer(
        ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set(
                "transactional.id",
                format!(
                    "bench-txn-{}-{}-{}",
                    std::process::id(),
                    cut.interval.as_millis(),
                    cut.max_records
                ),
            )
            .set("linger.ms", "5"),
    )?;
    let (txn, _task) = Transactions::start(producer, Setup::new(member.metadata(), cut))?;
    let (t, c, s, piece) = (
        target.to_owned(),
        changelog.to_owned(),
        source.to_owned(),
        args.piece,
    );
    drive(args, move |first| {
        let (txn, outs) = (txn.clone(), writes(&t, &c, first, piece));
        let offsets = vec![(s.clone(), 0, (first / piece as u64) as i64 + 1)];
        async move { txn.submit(outs, offsets).await.map_err(|e| e.to_string()) }
    })
    .await
}
