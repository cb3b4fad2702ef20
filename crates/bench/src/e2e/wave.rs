//! `kafka-delay-bench wave`: N records due in the same millisecond, in the production modes,
//! against the passthrough moving the same number of records.
//!
//! Each mode in turn: the passthrough of section 3 moves N records (its rate is the baseline
//! of the pair); then N records, every one due at one instant T planned here, are produced to
//! a delay topic, a broker in the mode ingests them all before T (or the run stops and says to
//! raise `--lead`) and fires them at T. The target keeps Kafka's append times; once the broker
//! has fired every record the target is read back and each arrival is judged against T by the
//! verifier's tally (`kafka_delay::verify::Tally`), which trusts nothing the broker wrote:
//! early (before T), lost, duplicated, lateness percentiles, and the drain rate, N over the
//! time from T to the last arrival.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use prometheus::Registry;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::Message;

use super::modes::Mode;
use super::throughput::BrokerRun;
use crate::harness::Kafka;
use crate::machine::Stopwatch;
use crate::BenchError;
use kafka_delay::app;
use kafka_delay::kafka;
use kafka_delay::verify::{Arrival, Tally};
use kafka_delay_core::clock::{Clock, SystemClock};
use kafka_delay_core::time::parse_duration_ms;

/// Flags of `kafka-delay-bench wave`.
#[derive(Debug, Args)]
pub struct WaveArgs {
    /// Apache Kafka's bootstrap servers (the production modes keep a compacted changelog).
    #[arg(long)]
    pub brokers: String,
    /// Records in the wave.
    #[arg(long, default_value_t = 1_000_000)]
    pub records: u64,
    /// Bytes of each record's value.
    #[arg(long, default_value_t = 100)]
    pub value_bytes: usize,
    /// Partitions of every topic.
    #[arg(long, default_value_t = 32)]
    pub partitions: i32,
    /// How long after the wave's records start being produced they are all due: longer than
    /// producing and ingesting them takes.
    #[arg(long, default_value = "60s")]
    pub lead: String,
    /// The modes, each after a passthrough of its own, comma-separated: `changelog` (the
    /// default mode on Apache Kafka), `exactly-once`, `local` (`--no-changelog`).
    #[arg(long, default_value = "changelog,exactly-once")]
    pub modes: String,
    /// Where to write the results as JSON.
    #[arg(long, default_value = "bench-wave.json")]
    pub json: PathBuf,
}

/// One mode's wave, beside its passthrough.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Wave {
    /// The mode.
    pub mode: Mode,
    /// Records in the wave.
    pub records: u64,
    /// Value size, bytes.
    pub value_bytes: usize,
    /// The passthrough's records per second, measured just before.
    pub passthrough_per_s: f64,
    /// Seconds from the broker's start until every record was pending (before T).
    pub ingest_s: f64,
    /// Seconds from T to the last record's arrival on the target.
    pub drain_s: f64,
    /// Records per second over `drain_s`.
    pub drain_per_s: f64,
    /// `drain_per_s` over `passthrough_per_s`.
    pub of_passthrough: f64,
    /// This process's CPU time (the broker's: the bench waits meanwhile) from T until every
    /// record had fired, per record, microseconds.
    pub drain_cpu_us_per_record: f64,
    /// The verifier's verdict (arrival by Kafka's append time against T).
    pub verdict: kafka_delay::verify::Report,
}

/// Runs a passthrough and a wave for every mode, prints the table on stdout.
///
/// # Errors
/// A bad flag, Kafka, RocksDB, or records not all ingested before they are due.
pub async fn run_wave(args: &WaveArgs) -> Result<Vec<Wave>, BenchError> {
    let modes: Vec<Mode> = args
        .modes
        .split(',')
        .map(Mode::parse)
        .collect::<Result<_, _>>()?;
    let lead = Duration::from_millis(
        parse_duration_ms(&args.lead).map_err(|e| format!("--lead {}: {e}", args.lead))?,
    );
    let kafka = Kafka::connect(Some(&args.brokers), args.partitions, &[])?;
    let (n, size) = (args.records, args.value_bytes);
    // Unmeasured: the first run against a freshly started Kafka is the slowest.
    kafka.passthrough("wave.warm", n.min(100_000), size).await?;
    let mut waves = Vec::new();
    for m in modes {
        let (pt, _) = kafka
            .passthrough(&format!("wave.{}", m.name()), n, size)
            .await?;
        let passthrough_per_s = n as f64 / pt.wall.as_secs_f64();
        let wave = kafka.wave(m, n, size, lead, passthrough_per_s).await?;
        let v = &wave.verdict;
        eprintln!(
            "{}: passthrough {passthrough_per_s:.0}/s, wave drained at {:.0}/s ({:.2}); \
             {} early, {} lost, {} duplicates; lateness p50 {} ms, p99 {} ms",
            m.name(),
            wave.drain_per_s,
            wave.of_passthrough,
            v.early,
            v.lost,
            v.duplicates,
            v.lateness_ms[0],
            v.lateness_ms[1]
        );
        waves.push(wave);
    }
    print(&waves);
    Ok(waves)
}

impl Kafka {
    /// One wave of `n` records due at one instant `lead` from now through a broker in `mode`.
    async fn wave(
        &self,
        mode: Mode,
        n: u64,
        size: usize,
        lead: Duration,
        passthrough_per_s: f64,
    ) -> Result<Wave, BenchError> {
        let BrokerRun {
            dir: _dir,
            src,
            dst,
            config,
        } = self.broker_run(&format!("wave.{}", mode.name()), mode.flags())?;
        let producer = kafka::producer(&config)?;
        self.create(&src, &producer, &config).await;
        self.create_target(&dst).await;
        self.create("bench.dlt", &producer, &config).await;
        let due = SystemClock.now_ms() + lead.as_millis() as u64;
        let until = due.to_string();
        self.fill_topic_with(&src, n, size, Some(&dst), ("delay-until", &until))
            .await?;
        let started = Instant::now();
        let running = app::start(config, Arc::new(SystemClock), Registry::new()).await?;
        // Every record pending before T, or the wave measured would be ingest's.
        while running.store().pending() < n {
            if SystemClock.now_ms() >= due {
                return Err(format!(
                    "{} of {n} records pending when they came due: raise --lead ({} ms)",
                    running.store().pending(),
                    lead.as_millis()
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let ingest_s = started.elapsed().as_secs_f64();
        // The drain's CPU is counted from T: before it the broker only waits.
        tokio::time::sleep(Duration::from_millis(
            due.saturating_sub(SystemClock.now_ms()),
        ))
        .await;
        let draining = Stopwatch::start();
        let fired = (running.metrics().fire.records).with_label_values(&[dst.as_str()]);
        let deadline = Instant::now() + lead + Duration::from_secs(600);
        while fired.get() < n || running.store().pending() > 0 {
            if Instant::now() > deadline {
                return Err(format!("only {} of {n} fired in 10 minutes", fired.get()).into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let drain_cpu = draining.stop().cpu;
        running.shutdown().await;
        let tally = self.read_wave(&dst, n, due).await?;
        let verdict = tally.report();
        let last = verdict.lateness_ms[3] as f64 / 1e3;
        let drain_per_s = n as f64 / last.max(1e-3);
        Ok(Wave {
            mode,
            records: n,
            value_bytes: size,
            passthrough_per_s,
            ingest_s,
            drain_s: last,
            drain_per_s,
            of_passthrough: drain_per_s / passthrough_per_s,
            drain_cpu_us_per_record: drain_cpu.as_secs_f64() * 1e6 / n as f64,
            verdict,
        })
    }

    /// Reads `dst` from the start (read_committed) until every one of the `n` records, keyed
    /// `k<i>` by the fill, arrived, and `SETTLE` after for late duplicates: each judged
    /// against `due` by its append time.
    async fn read_wave(&self, dst: &str, n: u64, due: u64) -> Result<Tally, BenchError> {
        const SETTLE: Duration = Duration::from_secs(2);
        let reader: StreamConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .set("group.id", format!("wave-reader-{dst}"))
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .create()?;
        reader.subscribe(&[dst])?;
        let mut tally = Tally::new("k", vec![due; n as usize]);
        let deadline = Instant::now() + Duration::from_secs(300);
        let mut settle = None;
        while settle.is_none_or(|s: Instant| s.elapsed() < SETTLE) {
            if Instant::now() > deadline {
                return Err(format!("the wave's target: {}", tally.report()).into());
            }
            let Ok(m) = tokio::time::timeout(SETTLE, reader.recv()).await else {
                continue;
            };
            let m = m?;
            let Arrival::Appended(at) = Arrival::of(&m) else {
                return Err(format!("{dst} keeps the writer's times, not Kafka's").into());
            };
            match key_index(m.key(), n) {
                Some(i) => tally.record(i, at),
                None => return Err(format!("{dst}: a record the wave did not write").into()),
            }
            if settle.is_none() && tally.complete() {
                settle = Some(Instant::now());
            }
        }
        Ok(tally)
    }
}

/// The record number of a fill's key `k<i>`, when below `n`.
fn key_index(key: Option<&[u8]>, n: u64) -> Option<usize> {
    let i: u64 = std::str::from_utf8(key?.strip_prefix(b"k")?)
        .ok()?
        .parse()
        .ok()?;
    (i < n).then_some(i as usize)
}

/// The table: one line per mode.
fn print(waves: &[Wave]) {
    println!("| mode | records | passthrough rec/s | ingest s | drain s | drained rec/s | of the passthrough | drain CPU us/rec | early | lost | duplicates | lateness p50 / p99 / max ms |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for w in waves {
        let v = &w.verdict;
        println!(
            "| {} | {} | {:.0} | {:.1} | {:.2} | {:.0} | **{:.2}** | {:.2} | {} | {} | {} | {} / {} / {} |",
            w.mode.name(),
            w.records,
            w.passthrough_per_s,
            w.ingest_s,
            w.drain_s,
            w.drain_per_s,
            w.of_passthrough,
            w.drain_cpu_us_per_record,
            v.early,
            v.lost,
            v.duplicates,
            v.lateness_ms[0],
            v.lateness_ms[1],
            v.lateness_ms[3]
        );
    }
}

#[cfg(test)]
mod tests {
    use super::key_index;

    #[test]
    fn a_fill_key_names_its_record_and_nothing_else_does() {
        assert_eq!(key_index(Some(b"k41"), 42), Some(41));
        assert_eq!(key_index(Some(b"k42"), 42), None);
        assert_eq!(key_index(Some(b"x1"), 42), None);
        assert_eq!(key_index(None, 42), None);
    }
}
