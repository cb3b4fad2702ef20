//! `kafka-delay-bench recovery`: a broker process's start to ready (pending counts restored,
//! the wheel armed with what is due within the horizon, consuming) with N records pending in
//! RocksDB, and its resident memory then, against re-consuming the same N records from Kafka in
//! the same run: what a scheduler without a local store does at every start.
//!
//! For each count:
//! 1. N records (100-byte values, due evenly over `--spread`) are written into a fresh data
//!    directory through the store, as ingest writes them ([`super::fill`]).
//! 2. The broker runs as a process of its own (this binary's `run`) against a Kafka started
//!    before it: an embedded cluster in this process, or `--brokers`. It starts once untimed on
//!    an empty data directory, so that its topics exist as on a cluster it has run against
//!    before, then on the filled one, timed from the spawn to the first `/readyz` 200.
//! 3. `--settle` later its resident memory (and peak) is read from `/proc`, and its wheel and
//!    pending gauges from `/metrics`; its JSON log says how long restoring the counts and
//!    arming the wheel took.
//! 4. The same N records (the broker's input: key, value, the delay headers) are produced to a
//!    topic, and a consumer with ingest's settings, assigned every partition from its start (no
//!    group to join), is timed from its creation to the N-th record: the least re-consuming
//!    costs (nothing is parsed or kept).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::{Offset, TopicPartitionList};

use super::harness::{config, Kafka};
use super::{fill, BenchError, FillArgs};
use kafka_delay_core::time::parse_duration_ms;

/// Flags of `kafka-delay-bench recovery`.
#[derive(Debug, Args)]
pub struct RecoveryArgs {
    /// Records pending in RocksDB, one measurement per count, comma-separated.
    #[arg(long, default_value = "1000000,10000000")]
    pub counts: String,
    /// Due times are spread evenly over this window from now.
    #[arg(long, default_value = "30d")]
    pub spread: String,
    /// The broker's `--horizon`: only records due within it are loaded into the wheel.
    #[arg(long, default_value = "1h")]
    pub horizon: String,
    /// Kafka bootstrap servers; without it an embedded cluster is started in this process.
    #[arg(long)]
    pub brokers: Option<String>,
    /// Re-consume from Kafka only for counts up to this many records (the embedded cluster
    /// keeps every record in this process's memory).
    #[arg(long, default_value_t = 10_000_000)]
    pub reconsume_max: u64,
    /// How long after ready memory and gauges are read.
    #[arg(long, default_value = "5s")]
    pub settle: String,
    /// Where the data directories are made (100M records take 3 GB); a temporary directory by
    /// default.
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    /// Where to write the results as JSON.
    #[arg(long, default_value = "bench-recovery.json")]
    pub json: PathBuf,
}

/// One count's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Recovery {
    /// Records pending in RocksDB.
    pub pending: u64,
    /// Bytes of the filled data directory.
    pub rocksdb_bytes: u64,
    /// The broker's horizon, ms.
    pub horizon_ms: u64,
    /// Spawn of the broker process to its first `/readyz` 200, seconds.
    pub start_to_ready_s: f64,
    /// Of it, restoring the pending counts, seconds (from the broker's log).
    pub counts_restored_s: Option<f64>,
    /// Of it, loading the horizon into the wheel, seconds (from the broker's log).
    pub wheel_armed_s: Option<f64>,
    /// Records in the wheel after `--settle` (`kafka_delay_wheel_entries`).
    pub in_wheel: Option<u64>,
    /// Records the broker reported pending (`kafka_delay_pending_records`).
    pub pending_reported: Option<u64>,
    /// Resident memory after `--settle`, bytes.
    pub rss_bytes: u64,
    /// Peak resident memory, bytes.
    pub peak_rss_bytes: u64,
    /// A consumer with ingest's settings assigned every partition from its start, from its
    /// creation to the N-th record, seconds; `None` above `--reconsume-max`.
    pub reconsume_s: Option<f64>,
    /// Partitions of the re-consumed topic.
    pub reconsume_partitions: Option<i32>,
}

/// The embedded cluster keeps about 5 MB per partition; the re-consumed topic gets enough
/// partitions for this much each (a record of the broker's input is about 150 bytes there).
const BYTES_PER_PARTITION: u64 = 3_000_000;
const RECORD_BYTES_IN_KAFKA: u64 = 150;

/// Runs the measurements, printing a table on stdout and writing JSON.
///
/// # Errors
/// A bad flag, Kafka, RocksDB, or a broker process that exits or is not ready within 10 minutes.
pub async fn run_recovery(args: &RecoveryArgs) -> Result<Vec<Recovery>, BenchError> {
    let counts: Vec<u64> = args
        .counts
        .split(',')
        .map(|s| s.trim().replace('_', "").parse::<u64>())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("--counts {}: {e}", args.counts))?;
    let horizon_ms =
        parse_duration_ms(&args.horizon).map_err(|e| format!("--horizon {}: {e}", args.horizon))?;
    let settle = parse_duration_ms(&args.settle)
        .map(Duration::from_millis)
        .map_err(|e| format!("--settle {}: {e}", args.settle))?;
    let work = match &args.work_dir {
        Some(dir) => tempfile::TempDir::new_in(dir)?,
        None => tempfile::TempDir::new()?,
    };
    let kafka = Kafka::connect(args.brokers.as_deref(), 32, &[])?;
    // The broker's own topics, created by a first start, as on a cluster it ran against before.
    let warm = work.path().join("warm");
    let broker = Broker::start(
        &kafka.brokers,
        &warm,
        &args.horizon,
        work.path(),
        &kafka.run,
    )?;
    broker.ready(Duration::from_secs(120)).await?;
    drop(broker);
    println!("| pending | RocksDB MB | horizon | start to ready s | counts restored s | wheel armed s | in wheel | RSS MB | peak RSS MB | re-consume s (partitions) | ready / re-consume | ready s per million |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut rows = Vec::new();
    for (i, &count) in counts.iter().enumerate() {
        let dir = work.path().join(format!("data-{i}"));
        let fill_args = FillArgs {
            data_dir: dir.clone(),
            count,
            spread: args.spread.clone(),
            value_bytes: 100,
            target: "bench.recovery.out".into(),
            source: "delay.bench.recovery".into(),
        };
        let filled = tokio::task::spawn_blocking(move || fill(&fill_args)).await??;
        eprintln!("filled {count} records in {:.1} s", filled.seconds);
        let rocksdb_bytes = dir_bytes(&dir);
        let started = Instant::now();
        let broker = Broker::start(&kafka.brokers, &dir, &args.horizon, work.path(), &kafka.run)?;
        broker.ready(Duration::from_secs(600)).await?;
        let start_to_ready_s = started.elapsed().as_secs_f64();
        tokio::time::sleep(settle).await;
        let (rss_bytes, peak_rss_bytes) = broker.memory()?;
        let metrics = http_get(broker.http, "/metrics")
            .map(|(_, body)| body)
            .unwrap_or_default();
        let log = broker.stop()?;
        let (reconsume_s, reconsume_partitions) = if count <= args.reconsume_max {
            let (took, partitions) = reconsume(&kafka, i, count).await?;
            (Some(took.as_secs_f64()), Some(partitions))
        } else {
            (None, None)
        };
        let row = Recovery {
            pending: count,
            rocksdb_bytes,
            horizon_ms,
            start_to_ready_s,
            counts_restored_s: logged_seconds(&log, "pending counts restored"),
            wheel_armed_s: logged_seconds(&log, "timing wheel armed"),
            in_wheel: gauge(&metrics, "kafka_delay_wheel_entries"),
            pending_reported: gauge(&metrics, "kafka_delay_pending_records"),
            rss_bytes,
            peak_rss_bytes,
            reconsume_s,
            reconsume_partitions,
        };
        print_row(&row, &args.horizon);
        rows.push(row);
        std::fs::remove_dir_all(&dir)?;
    }
    super::write_json(&args.json, &rows)?;
    Ok(rows)
}

fn print_row(r: &Recovery, horizon: &str) {
    let opt = |v: Option<f64>, digits: usize| v.map_or("-".into(), |v| format!("{v:.digits$}"));
    let reconsume = match (r.reconsume_s, r.reconsume_partitions) {
        (Some(s), Some(p)) => format!("{s:.2} ({p})"),
        _ => "-".into(),
    };
    println!(
        "| {} | {} | {horizon} | {:.3} | {} | {} | {} | {} | {} | {reconsume} | {} | {:.3} |",
        r.pending,
        r.rocksdb_bytes / 1_000_000,
        r.start_to_ready_s,
        opt(r.counts_restored_s, 3),
        opt(r.wheel_armed_s, 3),
        r.in_wheel.map_or("-".into(), |v| v.to_string()),
        r.rss_bytes / 1_000_000,
        r.peak_rss_bytes / 1_000_000,
        opt(r.reconsume_s.map(|s| r.start_to_ready_s / s), 2),
        r.start_to_ready_s * 1e6 / r.pending.max(1) as f64,
    );
}

/// Produces `count` of the broker's input records to a topic of their own and times a consumer
/// with ingest's settings from its creation to the last of them.
async fn reconsume(kafka: &Kafka, i: usize, count: u64) -> Result<(Duration, i32), BenchError> {
    let partitions = i32::try_from(
        (count * RECORD_BYTES_IN_KAFKA)
            .div_ceil(BYTES_PER_PARTITION)
            .max(32),
    )?;
    kafka.reset_partitions(partitions);
    let dir = tempfile::TempDir::new()?;
    // Not a `delay.*` name: the next count's broker would ingest it.
    let topic = format!("bench.recovery.reconsume.{i}.{}", kafka.run);
    let group = format!("bench-recovery-{i}-{}", std::process::id());
    let config = config(&kafka.brokers, dir.path(), &["--group-id", &group])?;
    let producer = kafka_delay::kafka::producer(&config)?;
    kafka.create(&topic, &producer, &config).await;
    let produced = Instant::now();
    kafka
        .fill_topic(&topic, count, 100, Some("bench.recovery.out"))
        .await?;
    eprintln!(
        "produced {count} records to {partitions} partitions in {:.1} s",
        produced.elapsed().as_secs_f64()
    );
    // Assigned, not subscribed: rebuilding state would read every partition from its start
    // and needs no group, whose join (3 s on the embedded cluster) would flatter recovery.
    let started = Instant::now();
    let consumer: StreamConsumer = kafka_delay::ingest::consumer_config(&config).create()?;
    let mut all = TopicPartitionList::new();
    for p in 0..partitions {
        all.add_partition_offset(&topic, p, Offset::Beginning)?;
    }
    consumer.assign(&all)?;
    for _ in 0..count {
        tokio::time::timeout(Duration::from_secs(60), consumer.recv())
            .await
            .map_err(|_| format!("no record from {topic} within 60 s"))??;
    }
    Ok((started.elapsed(), partitions))
}

/// A broker running as a process of its own; killed when dropped.
pub(super) struct Broker {
    child: Child,
    http: SocketAddr,
    log: PathBuf,
}

impl Broker {
    /// Spawns `kafka-delay run` on `data_dir`, logging JSON to a file in `logs`. Its group and
    /// source pattern are this run's own, so that on a cluster other runs have used it consumes
    /// nothing but what the filled store says (no other `delay.*` topic's backlog).
    fn start(
        brokers: &str,
        data_dir: &Path,
        horizon: &str,
        logs: &Path,
        run: &str,
    ) -> Result<Self, BenchError> {
        let group = format!("bench-recovery-{run}");
        let pattern = format!("^delay\\.bench\\.recovery\\.{}$", run.replace('-', "_"));
        let flags = ["--horizon", horizon, "--no-static-membership"];
        Self::spawn(brokers, data_dir, logs, (&group, &pattern), &flags)
    }

    /// Spawns `kafka-delay run` of `group` consuming `pattern` on `data_dir` with `flags`,
    /// logging JSON to a file in `logs`.
    pub(super) fn spawn(
        brokers: &str,
        data_dir: &Path,
        logs: &Path,
        (group, pattern): (&str, &str),
        flags: &[&str],
    ) -> Result<Self, BenchError> {
        let http = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let log = logs.join(format!("broker-{}.log", http.port()));
        let out = std::fs::File::create(&log)?;
        let child = Command::new(broker_binary()?)
            .args(["run", "--brokers", brokers, "--data-dir"])
            .arg(data_dir)
            .args(["--http-addr", &http.to_string(), "--log-format", "json"])
            .args(["--group-id", group, "--source-pattern", pattern])
            .args(flags)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()?;
        Ok(Self { child, http, log })
    }

    /// A gauge of the broker's `/metrics` (0 when it does not answer).
    pub(super) fn gauge(&self, name: &str) -> u64 {
        http_get(self.http, "/metrics")
            .ok()
            .and_then(|(_, body)| gauge(&body, name))
            .unwrap_or(0)
    }

    /// Waits for `/readyz` 200, polling every 5 ms.
    pub(super) async fn ready(&self, within: Duration) -> Result<(), BenchError> {
        let deadline = Instant::now() + within;
        loop {
            if let Ok((200, _)) = http_get(self.http, "/readyz") {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("the broker was not ready within {within:?}").into());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// What the broker has logged so far.
    pub(super) fn log_text(&self) -> Result<String, BenchError> {
        Ok(std::fs::read_to_string(&self.log)?)
    }

    /// Resident and peak resident memory, bytes.
    fn memory(&self) -> Result<(u64, u64), BenchError> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        let kb = |field: &str| -> u64 {
            status
                .lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
                .unwrap_or(0)
        };
        Ok((kb("VmRSS:") * 1024, kb("VmHWM:") * 1024))
    }

    /// Kills the process (its figures are taken) and returns its log.
    fn stop(mut self) -> Result<String, BenchError> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        Ok(std::fs::read_to_string(&self.log)?)
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// A plain HTTP/1.1 GET; the status and the body.
fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    s.read_to_string(&mut response)?;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// The `seconds` field of the JSON log line whose message is `message`.
fn logged_seconds(log: &str, message: &str) -> Option<f64> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["fields"]["message"] == message)
        .and_then(|v| v["fields"]["seconds"].as_str()?.parse().ok())
}

/// The value of an unlabelled gauge in a Prometheus text exposition.
fn gauge(exposition: &str, name: &str) -> Option<u64> {
    exposition.lines().find_map(|l| {
        let (n, v) = l.split_once(' ')?;
        (n == name).then(|| v.trim().parse::<f64>().ok().map(|v| v as u64))?
    })
}

/// Bytes of the files under `dir`.
fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// The `kafka-delay` binary built beside this one (cargo puts every binary of a workspace
/// build in the same directory), or the one `KAFKA_DELAY_BIN` names.
fn broker_binary() -> Result<std::path::PathBuf, BenchError> {
    if let Some(bin) = std::env::var_os("KAFKA_DELAY_BIN") {
        return Ok(bin.into());
    }
    let exe = std::env::current_exe()?;
    let beside = exe.with_file_name("kafka-delay");
    if beside.exists() {
        return Ok(beside);
    }
    Err(format!(
        "no kafka-delay binary beside {}: build it with the same profile \
         (cargo build -p kafka-delay [--release]) or name it in KAFKA_DELAY_BIN",
        exe.display()
    )
    .into())
}

#[cfg(test)]
mod tests {
    use super::{gauge, logged_seconds};

    #[test]
    fn the_brokers_log_and_metrics_are_read_for_the_figures() {
        let log = concat!(
            r#"{"timestamp":"t","level":"INFO","fields":{"message":"kafka-delay starting"}}"#,
            "\n",
            r#"{"timestamp":"t","level":"INFO","fields":{"message":"pending counts restored","pending":10,"scanned":false,"seconds":"0.027"}}"#,
            "\n",
            "not json\n",
            r#"{"timestamp":"t","level":"INFO","fields":{"message":"timing wheel armed","in_wheel":3,"seconds":"0.100"}}"#,
        );
        assert_eq!(logged_seconds(log, "pending counts restored"), Some(0.027));
        assert_eq!(logged_seconds(log, "timing wheel armed"), Some(0.1));
        assert_eq!(logged_seconds(log, "ready"), None);
        let metrics =
            "# HELP kafka_delay_wheel_entries x\n# TYPE kafka_delay_wheel_entries gauge\n\
                       kafka_delay_wheel_entries 1387\nkafka_delay_wheel_entries_total 5\n\
                       kafka_delay_pending_records 1e6\n";
        assert_eq!(gauge(metrics, "kafka_delay_wheel_entries"), Some(1387));
        assert_eq!(
            gauge(metrics, "kafka_delay_pending_records"),
            Some(1_000_000)
        );
        assert_eq!(gauge(metrics, "kafka_delay_missing"), None);
    }
}
