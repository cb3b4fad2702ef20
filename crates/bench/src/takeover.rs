//! `kafka-delay-bench takeover`: two broker processes of one group (`--changelog`) share a
//! source topic holding N pending records; one is killed with SIGKILL and the other takes its
//! partitions over. Four runs, each on topics of its own: without standby replicas (the
//! survivor restores the dead one's partitions from their changelog) and with
//! `--standby-replicas 1` (it already holds a warm copy and reads only the tail), each with the
//! survivor removing the dead member from the group (the default) and with
//! `--no-fast-takeover` (the group waits for the dead member's session, 6 s here).
//!
//! Reported per run: seconds from the kill until the survivor owns every partition and holds
//! all N (its partitions restored and firing), the longest time from assignment to firing of
//! a partition taken over (from the survivor's log), and the changelog entries the takeover
//! read.

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
    /// Whether the survivor removed the dead member (no `--no-fast-takeover`).
    pub fast_takeover: bool,
    /// Records the killed instance held.
    pub killed_held: u64,
    /// Seconds from the kill until the survivor owned every partition and held all records.
    pub takeover_s: f64,
    /// Seconds from the kill until the last partition taken over fired on the survivor (its
    /// log line's time; the survivor runs on this machine's clock).
    pub firing_s: f64,
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
    for fast in [true, false] {
        for replicas in [0u32, 1] {
            runs.push(one(args, &kafka, work.path(), (replicas, fast)).await?);
        }
    }
    println!("| standby replicas | dead member | records taken over | owned and pending s | firing s | assignment to firing ms | entries read |");
    println!("|---|---|---|---|---|---|---|");
    for r in &runs {
        let how = if r.fast_takeover {
            "removed"
        } else {
            "session ran out"
        };
        println!(
            "| {} | {how} | {} | {:.2} | {:.2} | {} | {} |",
            r.standby_replicas,
            r.killed_held,
            r.takeover_s,
            r.firing_s,
            r.restore_ms,
            r.entries_read
        );
    }
    Ok(runs)
}

async fn one(
    args: &TakeoverArgs,
    kafka: &Kafka,
    work: &std::path::Path,
    (replicas, fast): (u32, bool),
) -> Result<Takeover, BenchError> {
    let name = format!("{}_{replicas}_{fast}", kafka.run.replace('-', "_"));
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
        let mut flags = vec![
            "--changelog",
            "--changelog-replication",
            "1",
            "--standby-replicas",
            &standby,
            "--instance-id",
            &id,
            "--kafka-config",
            "session.timeout.ms=6000",
        ];
        if !fast {
            flags.push("--no-fast-takeover");
        }
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
    // Timed from the signal: the kernel takes a while to tear down a process holding 1M
    // records, and the drop waits for that too.
    let killed = Instant::now();
    let killed_at = std::time::SystemTime::now();
    drop(dead); // SIGKILL, then waits for the exit
    let survivors = [survivor];
    wait(&survivors, "the survivor owning everything", |b| {
        b[0].gauge("kafka_delay_partitions_owned") == PARTITIONS as u64 && owned(&b[0]) == n
    })
    .await?;
    let takeover_s = killed.elapsed().as_secs_f64();
    let [survivor] = survivors;
    let entries_read = survivor.gauge("kafka_delay_restored_entries_total") - read_before;
    // The partition counts as owned just before its timers are armed and its line is logged:
    // the line's time is when it fires.
    let mut fired = None;
    for _ in 0..200 {
        let log = survivor.log_text()?;
        fired = log[log_before.min(log.len())..]
            .lines()
            .filter(|l| l.contains("partition restored and firing here"))
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| {
                let ms = v["fields"]["ms"].as_u64()?;
                Some((ms, seconds_of_day(v["timestamp"].as_str()?)?))
            })
            .max_by(|a, b| a.1.total_cmp(&b.1));
        if fired.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (restore_ms, fired_at) = fired.ok_or("the survivor logged no takeover")?;
    let since_midnight = killed_at
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|e| e.to_string())?
        .as_secs_f64()
        % 86_400.0;
    let firing_s = (fired_at - since_midnight).rem_euclid(86_400.0);
    Ok(Takeover {
        standby_replicas: replicas,
        fast_takeover: fast,
        killed_held,
        takeover_s,
        firing_s,
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

/// Seconds since midnight of an RFC 3339 UTC timestamp (`2026-11-28T09:49:22.714002Z`).
fn seconds_of_day(ts: &str) -> Option<f64> {
    let time = ts.split_once('T')?.1.trim_end_matches('Z');
    let mut parts = time.split(':');
    let h: f64 = parts.next()?.parse().ok()?;
    let m: f64 = parts.next()?.parse().ok()?;
    let s: f64 = parts.next()?.parse().ok()?;
    Some(h * 3_600.0 + m * 60.0 + s)
}
