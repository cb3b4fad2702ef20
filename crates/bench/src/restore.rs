//! `kafka-delay-bench restore`: what the changelog costs and what it buys, on one partition
//! of a real Kafka, in one run.
//!
//! 1. **ingest, changelog on**: a broker with `--changelog` ingests N pending records from
//!    the source topic (writing each to the changelog) on an empty data directory;
//! 2. **restore**: a second broker of the same group, on another empty data directory,
//!    restores them from the changelog (the time from its start until the partition fires
//!    there, and until all N are pending there);
//! 3. **the same two with every value copied** (`--changelog-copy-values`), in a group of its
//!    own: the changelog's pointers against copies;
//! 4. **re-consume, changelog off**: a broker of a new group with `--no-changelog` ingests the
//!    same N from the source (what a restore would cost without a changelog).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus::Registry;
use serde::Serialize;

use super::harness::{config, Kafka};
use super::machine::Stopwatch;
use super::BenchError;
use kafka_delay::app;
use kafka_delay_core::clock::SystemClock;

/// Flags of `kafka-delay-bench restore`.
#[derive(Debug, clap::Args)]
pub struct RestoreArgs {
    /// Apache Kafka's bootstrap servers (the embedded cluster cannot create compacted topics).
    #[arg(long)]
    pub brokers: String,
    /// Pending records in the partition.
    #[arg(long, default_value_t = 1_000_000)]
    pub records: u64,
    /// Bytes of each record's value.
    #[arg(long, default_value_t = 100)]
    pub value_bytes: usize,
    /// Where to write the results as JSON.
    #[arg(long, default_value = "bench-restore.json")]
    pub json: PathBuf,
}

/// One phase's figures.
#[derive(Debug, Serialize)]
pub struct Phase {
    /// What ran.
    pub name: &'static str,
    /// Seconds from the broker's start until the partition fired there.
    pub firing_s: f64,
    /// Seconds from the broker's start until all records were pending there.
    pub all_pending_s: f64,
    /// Records per second over `all_pending_s`.
    pub records_per_s: f64,
    /// This process's CPU time per record, microseconds.
    pub cpu_us_per_record: f64,
    /// Changelog entries per second in the restore proper (reading the changelog and the
    /// values pointers name, writing RocksDB), from the broker's
    /// `kafka_delay_restore_seconds_total`; none when the phase restored nothing.
    pub restore_entries_per_s: Option<f64>,
}

/// Runs the three phases and prints them.
///
/// # Errors
/// Kafka or the broker failing.
pub async fn run_restore(args: &RestoreArgs) -> Result<Vec<Phase>, BenchError> {
    let kafka = Kafka::connect(Some(&args.brokers), 1, &[])?;
    let source = format!("delay.bench-restore-{}", kafka.run);
    let target = format!("bench-restore-out-{}", kafka.run);
    let dir = tempfile::TempDir::new()?;
    let probe = config(&args.brokers, dir.path(), &[])?;
    let producer = kafka_delay::kafka::producer(&probe)?;
    kafka.create(&source, &producer, &probe).await;
    kafka.create(&target, &producer, &probe).await;
    kafka.create("bench.dlt", &producer, &probe).await;
    kafka
        .fill_topic_due(&source, args.records, args.value_bytes, Some(&target), "1h")
        .await?;
    let pattern = format!("^{}$", source.replace('.', "\\."));
    let (group_a, group_b, group_c) = (
        format!("g-{}-a", kafka.run),
        format!("g-{}-b", kafka.run),
        format!("g-{}-c", kafka.run),
    );
    let on: &[&str] = &["--changelog"];
    let copied: &[&str] = &["--changelog", "--changelog-copy-values"];
    let off: &[&str] = &["--no-changelog"];
    let mut phases = Vec::new();
    for (name, group, mode) in [
        ("ingest, changelog on", &group_a, on),
        ("restore from the changelog", &group_a, on),
        ("ingest, values copied", &group_c, copied),
        ("restore, values copied", &group_c, copied),
        ("re-consume the source, changelog off", &group_b, off),
    ] {
        let data = tempfile::TempDir::new()?;
        let mut flags = vec![
            "--source-pattern",
            &pattern,
            "--group-id",
            group,
            "--changelog-replication",
            "1",
        ];
        flags.extend(mode);
        phases.push(phase(name, &args.brokers, data.path(), &flags, args.records).await?);
    }
    println!(
        "{:<40} {:>10} {:>14} {:>12} {:>12} {:>18}",
        "phase", "firing s", "all pending s", "records/s", "CPU us/rec", "restore entries/s"
    );
    for p in &phases {
        let restore = p
            .restore_entries_per_s
            .map_or_else(|| "-".to_owned(), |r| format!("{r:.0}"));
        println!(
            "{:<40} {:>10.2} {:>14.2} {:>12.0} {:>12.2} {:>18}",
            p.name, p.firing_s, p.all_pending_s, p.records_per_s, p.cpu_us_per_record, restore
        );
    }
    Ok(phases)
}

async fn phase(
    name: &'static str,
    brokers: &str,
    data: &std::path::Path,
    flags: &[&str],
    records: u64,
) -> Result<Phase, BenchError> {
    let cfg = config(brokers, data, flags)?;
    let watch = Stopwatch::start();
    let started = Instant::now();
    let registry = Registry::new();
    let running = app::start(cfg, Arc::new(SystemClock), registry.clone()).await?;
    let mut firing = None;
    let deadline = Instant::now() + Duration::from_secs(1_800);
    while running.store().pending() < records && Instant::now() < deadline {
        if firing.is_none() && running.store().owned_partitions() > 0 {
            firing = Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let span = watch.stop();
    let all = started.elapsed();
    running.shutdown().await;
    let (entries, seconds) = (
        value(&registry, "kafka_delay_restored_entries_total"),
        value(&registry, "kafka_delay_restore_seconds_total"),
    );
    Ok(Phase {
        name,
        firing_s: firing.unwrap_or(all).as_secs_f64(),
        all_pending_s: all.as_secs_f64(),
        records_per_s: records as f64 / all.as_secs_f64(),
        cpu_us_per_record: span.cpu.as_secs_f64() * 1e6 / records as f64,
        restore_entries_per_s: (entries > 0.0 && seconds > 0.0).then(|| entries / seconds),
    })
}

/// The value of the counter `name` in `registry` (0 when it has none).
fn value(registry: &Registry, name: &str) -> f64 {
    registry
        .gather()
        .iter()
        .filter(|f| f.name() == name)
        .flat_map(|f| f.get_metric())
        .map(|m| m.get_counter().get_value())
        .sum()
}
