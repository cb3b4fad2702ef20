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
//!
//! Right after each restore, the topics it read are read again by bare librdkafka consumers
//! that only count the messages ([`read_alone`]): the changelog, and for pointers the source
//! beside it, at once. Each restore's rate is shown against that reading, measured a moment
//! apart on the same machine: how close the restore comes to the reading it cannot do without.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus::Registry;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
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
    /// Changelog entries per second when the topics the restore read are only read
    /// ([`read_alone`]), right after it; none for a phase that restored nothing.
    pub read_alone_entries_per_s: Option<f64>,
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
    let changelog = |group: &str| kafka_delay::changelog::topic_name(group, &source);
    let pointers = [changelog(&group_a), source.clone()];
    let copies = [changelog(&group_c)];
    let none: &[String] = &[];
    let mut phases = Vec::new();
    for (name, group, mode, read) in [
        ("ingest, changelog on", &group_a, on, none),
        ("restore from the changelog", &group_a, on, &pointers[..]),
        ("ingest, values copied", &group_c, copied, none),
        ("restore, values copied", &group_c, copied, &copies[..]),
        ("re-consume the source, changelog off", &group_b, off, none),
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
        let mut p = phase(name, &args.brokers, data.path(), &flags, args.records).await?;
        if !read.is_empty() {
            let (brokers, topics) = (args.brokers.clone(), read.to_vec());
            let alone = tokio::task::spawn_blocking(move || read_alone(&brokers, &topics))
                .await
                .map_err(|e| format!("reading alone: {e}"))??;
            p.read_alone_entries_per_s = Some(alone);
        }
        phases.push(p);
    }
    print(&phases);
    Ok(phases)
}

fn print(phases: &[Phase]) {
    println!(
        "{:<40} {:>10} {:>14} {:>12} {:>12} {:>18} {:>16} {:>9}",
        "phase",
        "firing s",
        "all pending s",
        "records/s",
        "CPU us/rec",
        "restore entries/s",
        "read alone /s",
        "of read"
    );
    let shown = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |r| format!("{r:.0}"));
    for p in phases {
        let of_read = match (p.restore_entries_per_s, p.read_alone_entries_per_s) {
            (Some(r), Some(a)) if a > 0.0 => format!("{:.2}", r / a),
            _ => "-".to_owned(),
        };
        println!(
            "{:<40} {:>10.2} {:>14.2} {:>12.0} {:>12.2} {:>18} {:>16} {:>9}",
            p.name,
            p.firing_s,
            p.all_pending_s,
            p.records_per_s,
            p.cpu_us_per_record,
            shown(p.restore_entries_per_s),
            shown(p.read_alone_entries_per_s),
            of_read
        );
    }
}

/// Reads partition 0 of every one of `topics` from its beginning to its end, all at once, each
/// on a thread with a consumer of its own set as the restore's are (read committed, the
/// prefetch not pausing when its queue fills), and only counts the messages. Returns the first
/// topic's messages (the changelog's entries) per second over the time the slowest read took,
/// from its consumer's creation to its end.
fn read_alone(brokers: &str, topics: &[String]) -> Result<f64, BenchError> {
    let reads: Vec<Result<(u64, Duration), KafkaError>> = std::thread::scope(|scope| {
        let threads: Vec<_> = topics
            .iter()
            .map(|topic| scope.spawn(move || read_to_end(brokers, topic)))
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().unwrap_or(Err(KafkaError::Canceled)))
            .collect()
    });
    let mut entries = None;
    let mut slowest = Duration::ZERO;
    for (topic, read) in topics.iter().zip(reads) {
        let (messages, took) = read.map_err(|e| format!("reading {topic} alone: {e}"))?;
        entries.get_or_insert(messages);
        slowest = slowest.max(took);
    }
    Ok(entries.unwrap_or(0) as f64 / slowest.as_secs_f64().max(f64::EPSILON))
}

/// Messages in partition 0 of `topic`, read from its beginning to its end, and the time that
/// took.
fn read_to_end(brokers: &str, topic: &str) -> Result<(u64, Duration), KafkaError> {
    let started = Instant::now();
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", kafka_delay_testkit::unique("read-alone"))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", "read_committed")
        .set("fetch.queue.backoff.ms", "10")
        .create()?;
    // From the offset its low watermark names, as the restore does: assigned at the
    // beginning, librdkafka first asks for the offset and fetches half a second later.
    let (low, _) = consumer.fetch_watermarks(topic, 0, Duration::from_secs(10))?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Offset(low))?;
    consumer.assign(&tpl)?;
    // The clock is read only when nothing came: a look per message would slow the reading
    // this baseline stands for.
    let deadline = started + Duration::from_secs(600);
    let mut messages = 0;
    loop {
        match consumer
            .poll(Duration::ZERO)
            .or_else(|| consumer.poll(Duration::from_millis(100)))
        {
            None if Instant::now() >= deadline => {
                return Err(KafkaError::MessageConsumption(
                    rdkafka::types::RDKafkaErrorCode::OperationTimedOut,
                ))
            }
            None => {}
            Some(Err(KafkaError::PartitionEOF(_))) => return Ok((messages, started.elapsed())),
            Some(Err(e)) => return Err(e),
            Some(Ok(_)) => messages += 1,
        }
    }
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
        read_alone_entries_per_s: None,
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
