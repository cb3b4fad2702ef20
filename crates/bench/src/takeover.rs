//! `kafka-delay-bench takeover`: two broker processes of one group (`--changelog`) share a
//! source topic holding N pending records; one is killed with SIGKILL and the other takes its
//! partitions over. Run once without standby replicas (the survivor restores the dead one's
//! partitions from their changelog) and once with `--standby-replicas 1` (it already holds a
//! warm copy and reads only the tail), each on topics of its own.
//!
//! Reported per run: seconds from the kill until the survivor owns every partition and holds
//! all N (the consumer session timeout, 6 s here, is most of it), the longest time from
//! assignment to firing of a partition taken over (from the survivor's log), and the changelog
//! entries the takeover read.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::harness::{config, Kafka};
use super::recovery::Broker;
use super::BenchError;

/// Flags of `kafka-delay-bench takeover`.
#[derive(Debug, clap::Args)]
pub struct TakeoverArgs {
    /// Apache Kafka's bootstrap servers.
    #[arg(long)]
    pub brokers: String,
    /// Pending records in the source topic, due an hour later.
    #[arg(long, default_value_t = 1_000_000)]
    pub records: u64,
    /// Where to write the results as JSON.
    #[arg(long, default_value = "bench-takeover.json")]
    pub json: PathBuf,
}

/// One run's figures.
#[derive(Debug, Serialize)]
pub struct Takeover {
    /// `--standby-replicas` of both instances.
    pub standby_replicas: u32,
    /// Records the killed instance held.
    pub killed_held: u64,
    /// Seconds from the kill until the survivor owned every partition and held all records.
    pub takeover_s: f64,
    /// Longest milliseconds from assignment to firing of a partition taken over.
    pub restore_ms: u64,
    /// Changelog entries the takeover read.
    pub entries_read: u64,
}

const PARTITIONS: i32 = 2;

/// Runs without and with a standby replica and prints the table.
///
/// # Errors
/// Kafka, or a broker that does not start or take over in time.
pub async fn run_takeover(args: &TakeoverArgs) -> Result<Vec<Takeover>, BenchError> {
    let kafka = Kafka::connect(Some(&args.brokers), PARTITIONS, &[])?;
    let work = tempfile::TempDir::new()?;
    let mut runs = Vec::new();
    for replicas in [0u32, 1] {
        runs.push(one(args, &kafka, work.path(), replicas).await?);
    }
    println!("| standby replicas | records taken over | takeover s | assignment to firing ms | entries read |");
    println!("|---|---|---|---|---|");
    for r in &runs {
        println!(
            "| {} | {} | {:.2} | {} | {} |",
            r.standby_replicas, r.killed_held, r.takeover_s, r.restore_ms, r.entries_read
        );
    }
    Ok(runs)
}

async fn one(
    args: &TakeoverArgs,
    kafka: &Kafka,
    work: &std::path::Path,
    replicas: u32,
) -> Result<Takeover, BenchError> {
    let name = format!("{}_{replicas}", kafka.run.replace('-', "_"));
    let (source, target) = (
        format!("delay.bench.takeover.{name}"),
        format!("bench.takeover.out.{name}"),
    );
    let probe = config(&args.brokers, work, &[])?;
    let producer = kafka_delay::kafka::producer(&probe)?;
    for t in [&source, &target, &"bench.dlt".to_owned()] {
        kafka.create(t, &producer, &probe).await;
    }
    let group = format!("bench-takeover-{name}");
    let pattern = format!("^{}$", source.replace('.', "\\."));
    let standby = replicas.to_string();
    let mut brokers = Vec::new();
    for k in 0..2 {
        let id = format!("{name}-{k}");
        let flags = [
            "--changelog",
            "--changelog-replication",
            "1",
            "--standby-replicas",
            &standby,
            "--instance-id",
            &id,
            "--kafka-config",
            "session.timeout.ms=6000;heartbeat.interval.ms=1000",
        ];
        let dir = work.join(&id);
        let b = Broker::spawn(&args.brokers, &dir, work, (&group, &pattern), &flags)?;
        b.ready(Duration::from_secs(120)).await?;
        brokers.push(b);
    }
    wait(&brokers, "each instance owning a partition", |b| {
        b.iter()
            .all(|b| b.gauge("kafka_delay_partitions_owned") == 1)
    })
    .await?;
    kafka
        .fill_topic_due(&source, args.records, 100, Some(&target), "1h")
        .await?;
    let n = args.records;
    let owned = |b: &Broker| {
        b.gauge("kafka_delay_pending_records")
            .saturating_sub(b.gauge("kafka_delay_standby_records"))
    };
    wait(&brokers, "all records pending", |b| {
        b.iter().map(owned).sum::<u64>() == n
    })
    .await?;
    if replicas > 0 {
        wait(&brokers, "warm copies of all records", |b| {
            b.iter()
                .map(|b| b.gauge("kafka_delay_standby_records"))
                .sum::<u64>()
                == n
        })
        .await?;
    }
    let survivor = brokers.pop().ok_or("no survivor")?;
    let dead = brokers.pop().ok_or("no instance to kill")?;
    let killed_held = owned(&dead);
    let read_before = survivor.gauge("kafka_delay_restored_entries_total");
    let log_before = survivor.log_text()?.len();
    drop(dead); // SIGKILL
    let killed = Instant::now();
    let survivors = [survivor];
    wait(&survivors, "the survivor owning everything", |b| {
        b[0].gauge("kafka_delay_partitions_owned") == PARTITIONS as u64 && owned(&b[0]) == n
    })
    .await?;
    let takeover_s = killed.elapsed().as_secs_f64();
    let [survivor] = survivors;
    let entries_read = survivor.gauge("kafka_delay_restored_entries_total") - read_before;
    // The partition counts as owned just before its line is logged.
    let mut restore_ms = None;
    for _ in 0..200 {
        let log = survivor.log_text()?;
        restore_ms = log[log_before.min(log.len())..]
            .lines()
            .filter(|l| l.contains("partition restored and firing here"))
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| v["fields"]["ms"].as_u64())
            .max();
        if restore_ms.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let restore_ms = restore_ms.ok_or("the survivor logged no takeover")?;
    Ok(Takeover {
        standby_replicas: replicas,
        killed_held,
        takeover_s,
        restore_ms,
        entries_read,
    })
}

/// Polls `done` every 50 ms for at most 300 s.
async fn wait(
    brokers: &[Broker],
    what: &str,
    done: impl Fn(&[Broker]) -> bool,
) -> Result<(), BenchError> {
    let deadline = Instant::now() + Duration::from_secs(300);
    while !done(brokers) {
        if Instant::now() > deadline {
            return Err(format!("not {what} after 300 s").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}
