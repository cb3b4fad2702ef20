//! `kafka-delay bench e2e`: throughput through the broker divided by a passthrough's, and
//! lateness under load.
//!
//! Throughput: for each value size, N records with the delay headers are produced to a topic
//! first; then a plain passthrough (the ingest consumer's settings, the broker's producer
//! settings, the same in-flight window) consumes and re-produces them with their key, value and
//! headers, a stored passthrough does the same and also keeps each record in a plain RocksDB
//! from before it is produced until it is acknowledged (the least any design that stores every
//! record does), and the broker (ingest, RocksDB write, wheel, publish, delete) moves the same
//! number from a delay topic to a target, with `--sync` off and on. Each rate is records over the time
//! from the first record consumed to the last one acknowledged (and, for the broker, deleted
//! from RocksDB).
//!
//! Sweep: records due `--delay` after they are produced arrive at rising rates (from a fifth of
//! the throughput rate, a quarter more per step) until the broker no longer fires them within
//! 100 ms (p99): the highest rate sustained while the same machine also produces them.
//!
//! Lateness: with `--pending` records filled into RocksDB first, records due `--delay` after
//! they are produced arrive at 70% of the sustained rate (or at `--rate`); the target is
//! consumed and `delay-fired-ms - delay-due-ms` and arrival minus due are reported, with the
//! broker's own histograms (the scheduler's lateness, due to acknowledgement). A timeline of
//! produced / in Kafka / ingested / fired goes to stderr each second.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, Parser};
use prometheus::core::Metric as _;
use prometheus::Registry;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::{BorrowedMessage, Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{
    BaseRecord, DeliveryResult, FutureProducer, FutureRecord, Producer, ProducerContext,
    ThreadedProducer,
};
use rdkafka::{ClientConfig, ClientContext};

use crate::app;
use crate::clock::{Clock, SystemClock};
use crate::config::{Cli, Command, Config};
use crate::kafka::{self, Embedded};

/// Flags of `kafka-delay bench e2e`.
#[derive(Debug, Args)]
pub struct E2eArgs {
    /// Kafka bootstrap servers; without it an embedded cluster (librdkafka's mock) is started.
    #[arg(long)]
    pub brokers: Option<String>,
    /// Records per throughput run.
    #[arg(long, default_value_t = 200_000)]
    pub records: u64,
    /// Value sizes to measure, bytes, comma-separated.
    #[arg(long, default_value = "100,1024")]
    pub value_bytes: String,
    /// Partitions of every topic (at least; a throughput run with large values gets more, so
    /// that every partition of the embedded cluster stays under about 2 MB).
    #[arg(long, default_value_t = 32)]
    pub partitions: i32,
    /// Records pending in RocksDB (due in 30 days) during the lateness run.
    #[arg(long, default_value_t = 1_000_000)]
    pub pending: u64,
    /// How long records arrive in the lateness run.
    #[arg(long, default_value = "20s")]
    pub lateness_for: String,
    /// Rounds of the throughput runs (medians are reported).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Fraction of the highest sustained rate (found by the sweep) the lateness run produces at.
    #[arg(long, default_value_t = 0.7)]
    pub load: f64,
    /// How long each step of the sweep for the highest sustained rate produces (as long as the
    /// lateness run: the embedded cluster's produce path slows as its partitions fill). The
    /// sweep starts at a fifth of the broker's throughput rate and goes up by a quarter per
    /// step while every record fires within 100 ms (p99) of its due time (down by a fifth per
    /// step if the first one does not). `0s` skips the sweep and the lateness run.
    #[arg(long, default_value = "20s")]
    pub sweep_for: String,
    /// How long after it is produced each record of the lateness run is due: longer than
    /// the records take to reach Kafka and be ingested, or the lateness measured is theirs.
    #[arg(long, default_value = "5s")]
    pub delay: String,
    /// Records per second for the lateness run instead of `--load` of the sustained rate; the
    /// throughput runs and the sweep are skipped.
    #[arg(long)]
    pub rate: Option<f64>,
    /// A `kafka-delay run` flag for every broker the benchmark starts (repeatable), e.g.
    /// `--broker-flag=--short-scheduler-slice`.
    #[arg(long = "broker-flag", allow_hyphen_values = true)]
    pub broker_flags: Vec<String>,
    /// With `--rate`: instead of the broker, a plain producer with the broker's producer
    /// settings carries that rate for `--lateness-for` (records like the ones the broker
    /// publishes: 100 bytes, seven headers, 32 partitions), and each record's send to
    /// acknowledgement is reported: Kafka's produce round trip under that load, without
    /// kafka-delay.
    #[arg(long, requires = "rate")]
    pub plain_producer: bool,
    /// With `--plain-producer`: Kafka also carries the rest of a lateness run's traffic at the
    /// same rate meanwhile (a generator producing to a topic of its own with a 50 ms linger, a
    /// consumer reading that topic as ingest would, and one reading the plain producer's
    /// topic as the benchmark's reader does): everything but kafka-delay.
    #[arg(long, requires = "plain_producer")]
    pub plain_traffic: bool,
    /// Where to write the results as JSON.
    #[arg(long, default_value = "bench-e2e.json")]
    pub json: PathBuf,
}

/// One throughput row.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Throughput {
    /// Value size, bytes.
    pub value_bytes: usize,
    /// Records moved per run.
    pub records: u64,
    /// Rounds (each a passthrough, a stored passthrough, a broker and a `--sync` broker run);
    /// rates are medians.
    pub rounds: usize,
    /// Passthrough records per second.
    pub passthrough_per_s: f64,
    /// Records per second of the passthrough that also keeps each record in a plain RocksDB
    /// until it is acknowledged (written before it is produced, deleted after): the most any
    /// design that stores every record could move here (`Kafka::stored_passthrough`).
    pub stored_passthrough_per_s: f64,
    /// CPU time of the whole process per record in the stored passthrough, microseconds.
    pub stored_passthrough_cpu_us_per_record: f64,
    /// Broker records per second, sync off.
    pub broker_per_s: f64,
    /// Broker records per second, sync on (group commit).
    pub broker_sync_per_s: f64,
    /// Records per second a consumer with the ingest settings reads, doing nothing else (what
    /// re-consuming pending records from Kafka would cost instead of recovering from RocksDB).
    pub consume_only_per_s: f64,
    /// CPU time of the whole process (every thread, the embedded cluster's included) per
    /// record moved, microseconds: passthrough, broker with sync off. Steadier than the rates
    /// on a shared machine, because a neighbour's load takes wall time, not our CPU time.
    pub cpu_us_per_record: [f64; 2],
    /// Page faults of the whole process per record moved (minor ones: memory the kernel maps
    /// in, zeroed, on first touch), passthrough and broker with sync off.
    pub page_faults_per_record: [f64; 2],
    /// The machine's CPU time taken by the hypervisor for other guests (steal), percent of all
    /// CPU time during the run, passthrough and broker with sync off ([`MachineTicks`]).
    pub steal_percent: [f64; 2],
    /// The share of the machine's CPU time (less steal) spent busy by anything during the run,
    /// percent: passthrough, stored passthrough, broker with sync off. Near 100, the machine's
    /// CPU bounds the rate, and the rates follow the CPU per record of the client and Kafka.
    pub machine_busy_percent: [f64; 3],
}

/// The lateness run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Lateness {
    /// Records pending in RocksDB meanwhile.
    pub pending: u64,
    /// Records per second produced.
    pub rate_per_s: f64,
    /// Records produced and received.
    pub records: u64,
    /// Received.
    pub received: u64,
    /// Fired before their due time.
    pub early: u64,
    /// Fire minus due, ms: p50, p99, p99.9, max.
    pub fire_ms: [u64; 4],
    /// Arrival at the test consumer minus due, ms: p50, p99, p99.9, max.
    pub arrival_ms: [u64; 4],
    /// The broker's delivery-acknowledgement minus due, ms, as the upper bounds of the
    /// histogram buckets holding p50, p99, p99.9.
    pub delivery_ms_at_most: [f64; 3],
    /// The scheduler's own lateness (the clock when it hands a record to the publisher minus
    /// due), ms, as histogram bucket upper bounds for p50, p99, p99.9.
    pub wheel_ms_at_most: [f64; 3],
    /// The baseline for the delivery figures: send to acknowledgement, ms (p50, p99, p99.9,
    /// max), of a plain producer with the broker's producer settings sending one record every
    /// 10 ms to the same Kafka during the run. What Kafka's produce round trip costs at this
    /// load, with nothing of kafka-delay in it.
    pub probe_ack_ms: [u64; 4],
    /// The broker's own produce round trip (handed to its producer to acknowledged), ms, as
    /// histogram bucket upper bounds for p50, p99, p99.9: the same span as `probe_ack_ms`, for
    /// the producer that carries the load.
    pub produce_ms_at_most: [f64; 3],
    /// Due this long after being produced.
    pub delay_ms: u64,
    /// The producer's `linger.ms`.
    pub linger_ms: u64,
    /// The machine's CPU time stolen by the hypervisor while records were produced and
    /// received, percent ([`MachineTicks`]).
    pub steal_percent: f64,
}

/// A plain producer with the broker's settings carrying a rate on its own (`--plain-producer`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct PlainLoad {
    /// Records per second produced.
    pub rate_per_s: f64,
    /// Records acknowledged.
    pub acknowledged: u64,
    /// Whether the rest of a lateness run's traffic ran beside it (`--plain-traffic`).
    pub with_traffic: bool,
    /// Send to acknowledgement, ms: p50, p99, p99.9, max.
    pub ack_ms: [u64; 4],
    /// The producer's `linger.ms`.
    pub linger_ms: u64,
}

/// One step of the sweep for the highest rate the broker sustains while records are produced.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SweepStep {
    /// Records per second produced.
    pub rate_per_s: f64,
    /// Records produced and received.
    pub records: u64,
    /// Received.
    pub received: u64,
    /// Fired before their due time.
    pub early: u64,
    /// Fire minus due, p99, ms.
    pub fire_p99_ms: u64,
    /// Every record received and fire p99 within 100 ms.
    pub kept_up: bool,
    /// CPU time stolen by the hypervisor during the step, percent.
    pub steal_percent: f64,
}

/// Everything `bench e2e` measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct E2eReport {
    /// Throughput rows.
    pub throughput: Vec<Throughput>,
    /// The sweep for the highest sustained rate.
    pub sweep: Vec<SweepStep>,
    /// The highest rate of the sweep that kept up.
    pub sustained_per_s: Option<f64>,
    /// The lateness run.
    pub lateness: Option<Lateness>,
    /// The plain producer carrying `--rate` on its own (`--plain-producer`).
    pub plain_load: Option<PlainLoad>,
}

/// Why the benchmark could not run.
pub type BenchError = Box<dyn std::error::Error + Send + Sync>;

/// Runs the throughput runs and the lateness run, printing tables on stdout and writing JSON.
///
/// # Errors
/// A bad flag, Kafka or RocksDB.
pub async fn run_e2e(args: &E2eArgs) -> Result<E2eReport, BenchError> {
    let sizes: Vec<usize> = args
        .value_bytes
        .split(',')
        .map(|s| s.trim().parse::<usize>())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("--value-bytes {}: {e}", args.value_bytes))?;
    let lateness_for = crate::record::time::parse_duration_ms(&args.lateness_for)
        .map_err(|e| format!("--lateness-for {}: {e}", args.lateness_for))?;
    let delay_ms = crate::record::time::parse_duration_ms(&args.delay)
        .map_err(|e| format!("--delay {}: {e}", args.delay))?;
    let embedded = match &args.brokers {
        Some(_) => None,
        None => Some(Embedded::start(3)?),
    };
    let brokers = args
        .brokers
        .clone()
        .unwrap_or_else(|| embedded.as_ref().map(Embedded::bootstrap_servers).unwrap());
    let kafka = Kafka {
        brokers,
        embedded,
        partitions: AtomicI32::new(args.partitions),
        broker_flags: args.broker_flags.clone(),
    };
    let sweep_for = crate::record::time::parse_duration_ms(&args.sweep_for)
        .map_err(|e| format!("--sweep-for {}: {e}", args.sweep_for))?;
    let mut report = E2eReport {
        throughput: Vec::new(),
        sweep: Vec::new(),
        sustained_per_s: None,
        lateness: None,
        plain_load: None,
    };
    if let (true, Some(rate)) = (args.plain_producer, args.rate) {
        let p = kafka
            .plain_load(
                rate,
                Duration::from_millis(lateness_for),
                args.plain_traffic,
            )
            .await?;
        println!("| plain producer, broker's settings: rate rec/s | rest of the traffic | acknowledged | ack p50 / p99 / p99.9 / max ms | linger ms |");
        println!("|---|---|---|---|---|");
        println!(
            "| {:.0} | {} | {} | {} / {} / {} / {} | {} |",
            p.rate_per_s,
            if p.with_traffic { "yes" } else { "no" },
            p.acknowledged,
            p.ack_ms[0],
            p.ack_ms[1],
            p.ack_ms[2],
            p.ack_ms[3],
            p.linger_ms
        );
        report.plain_load = Some(p);
        return write_report(args, report);
    }
    println!("| value | records x rounds | passthrough rec/s | stored passthrough rec/s (ratio) | kafka-delay rec/s | ratio | of the stored | kafka-delay --sync rec/s | sync / no sync | consume only rec/s | CPU us per record: passthrough / stored / kafka-delay | CPU steal %: passthrough / kafka-delay | machine busy %: passthrough / stored / kafka-delay |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (i, &size) in sizes.iter().enumerate() {
        if args.rate.is_some() {
            break;
        }
        // The embedded cluster keeps about 5 MB per partition: enough partitions for 2 MB each.
        let needed = (args.records * size.max(1) as u64).div_ceil(2_000_000);
        let partitions = args
            .partitions
            .max(1)
            .max(i32::try_from(needed).unwrap_or(i32::MAX));
        kafka.partitions.store(partitions, Ordering::Relaxed);
        let n = args.records;
        // Rounds of the three runs, interleaved, so that a disturbance of the shared machine
        // hits one round rather than one side; the medians are reported.
        let mut rates: [Vec<f64>; 5] = Default::default();
        let mut stored_cpu = Vec::new();
        let mut cpu: [Vec<f64>; 2] = Default::default();
        let mut faults: [Vec<f64>; 2] = Default::default();
        let mut steal: [Vec<f64>; 2] = Default::default();
        let mut busy: [Vec<f64>; 3] = Default::default();
        if i == 0 {
            // Unmeasured: the first run against a freshly started Kafka in its own process was
            // about 12% slower than the same run after it, and the passthrough runs first.
            let (warm, _) = kafka.passthrough("warm", n.min(100_000), size).await?;
            eprintln!(
                "warm-up passthrough: {:.0}/s (not counted)",
                n.min(100_000) as f64 / warm.wall.as_secs_f64()
            );
        }
        for r in 0..args.rounds.max(1) {
            let (pt, consume) = kafka.passthrough(&format!("{i}.{r}"), n, size).await?;
            let stored = kafka
                .stored_passthrough(&format!("{i}.{r}"), n, size)
                .await?;
            let off = kafka
                .through_broker(&format!("{i}.{r}a"), n, size, false)
                .await?;
            let on = kafka
                .through_broker(&format!("{i}.{r}b"), n, size, true)
                .await?;
            let round = [pt.wall, off.wall, on.wall, consume, stored.wall]
                .map(|d| n as f64 / d.as_secs_f64());
            let stored_us = stored.cpu.as_secs_f64() * 1e6 / n as f64;
            let us = [pt.cpu, off.cpu].map(|d| d.as_secs_f64() * 1e6 / n as f64);
            let per = [pt.faults, off.faults].map(|f| f as f64 / n as f64);
            let stolen = [pt.steal_percent, off.steal_percent];
            let busied = [pt.busy_percent, stored.busy_percent, off.busy_percent];
            eprintln!(
                "round {r}: passthrough {:.0}/s, stored passthrough {:.0}/s ({:.2}), \
                 kafka-delay {:.0}/s ({:.2}; {:.2} of the stored), --sync {:.0}/s; \
                 CPU per record {:.2} us / {:.2} us / {:.2} us; \
                 page faults per record {:.3} / {:.3}; CPU steal {:.1}% / {:.1}%; \
                 machine busy {:.0}% / {:.0}% / {:.0}%",
                round[0],
                round[4],
                round[4] / round[0],
                round[1],
                round[1] / round[0],
                round[1] / round[4],
                round[2],
                us[0],
                stored_us,
                us[1],
                per[0],
                per[1],
                stolen[0],
                stolen[1],
                busied[0],
                busied[1],
                busied[2]
            );
            for (all, rate) in rates.iter_mut().zip(round) {
                all.push(rate);
            }
            for (all, us) in cpu.iter_mut().zip(us) {
                all.push(us);
            }
            stored_cpu.push(stored_us);
            for (all, f) in faults.iter_mut().zip(per) {
                all.push(f);
            }
            for (all, f) in steal.iter_mut().zip(stolen) {
                all.push(f);
            }
            for (all, b) in busy.iter_mut().zip(busied) {
                all.push(b);
            }
        }
        let [pt, off, on, consume, stored] = rates.map(median);
        let cpu_us_per_record = cpu.map(median);
        let row = Throughput {
            value_bytes: size,
            records: n,
            rounds: args.rounds.max(1),
            passthrough_per_s: pt,
            stored_passthrough_per_s: stored,
            stored_passthrough_cpu_us_per_record: median(stored_cpu),
            broker_per_s: off,
            broker_sync_per_s: on,
            consume_only_per_s: consume,
            cpu_us_per_record,
            page_faults_per_record: faults.map(median),
            steal_percent: steal.map(median),
            machine_busy_percent: busy.map(median),
        };
        println!(
            "| {size} B | {n} x {} | {:.0} | {:.0} ({:.2}) | {:.0} | {:.2} | {:.2} | {:.0} | {:.2} | {:.0} | {:.2} / {:.2} / {:.2} | {:.1} / {:.1} | {:.0} / {:.0} / {:.0} |",
            row.rounds,
            row.passthrough_per_s,
            row.stored_passthrough_per_s,
            row.stored_passthrough_per_s / row.passthrough_per_s,
            row.broker_per_s,
            row.broker_per_s / row.passthrough_per_s,
            row.broker_per_s / row.stored_passthrough_per_s,
            row.broker_sync_per_s,
            row.broker_sync_per_s / row.broker_per_s,
            row.consume_only_per_s,
            cpu_us_per_record[0],
            row.stored_passthrough_cpu_us_per_record,
            cpu_us_per_record[1],
            row.steal_percent[0],
            row.steal_percent[1],
            row.machine_busy_percent[0],
            row.machine_busy_percent[1],
            row.machine_busy_percent[2]
        );
        report.throughput.push(row);
    }
    kafka.partitions.store(args.partitions, Ordering::Relaxed);
    // The throughput runs read records produced beforehand; while records are being produced
    // the same machine also runs the producer and the cluster's produce path, so the rate the
    // broker sustains then is found by a sweep, and the lateness run goes at `--load` of it.
    let ceiling = report.throughput.first().map(|t| t.broker_per_s);
    if let (None, Some(ceiling), true) = (args.rate, ceiling, sweep_for > 0) {
        println!();
        println!("| sweep rate rec/s | records | received | early | fire p99 ms | kept up | CPU steal % |");
        println!("|---|---|---|---|---|---|---|");
        // Up by a quarter while it keeps up; if the first step does not, down by a fifth until
        // one does.
        let mut rate = ceiling / 5.0;
        let mut rising = None;
        for step in 0..8 {
            if rate > ceiling {
                break;
            }
            let l = kafka
                .lateness(
                    &format!(".s{step}"),
                    0,
                    rate,
                    Duration::from_millis(sweep_for),
                    delay_ms,
                )
                .await?;
            let s = SweepStep {
                rate_per_s: rate,
                records: l.records,
                received: l.received,
                early: l.early,
                fire_p99_ms: l.fire_ms[1],
                kept_up: l.received == l.records && l.fire_ms[1] <= 100,
                steal_percent: l.steal_percent,
            };
            println!(
                "| {:.0} | {} | {} | {} | {} | {} | {:.1} |",
                s.rate_per_s,
                s.records,
                s.received,
                s.early,
                s.fire_p99_ms,
                if s.kept_up { "yes" } else { "no" },
                s.steal_percent
            );
            let kept_up = s.kept_up;
            report.sweep.push(s);
            let rising = *rising.get_or_insert(kept_up);
            if kept_up {
                report.sustained_per_s = Some(rate);
            }
            match (rising, kept_up) {
                (true, true) => rate *= 1.25,
                (false, false) => rate *= 0.8,
                _ => break,
            }
        }
    }
    let rate = args
        .rate
        .or_else(|| report.sustained_per_s.map(|r| r * args.load));
    if let Some(rate) = rate {
        let l = kafka
            .lateness(
                "",
                args.pending,
                rate,
                Duration::from_millis(lateness_for),
                delay_ms,
            )
            .await?;
        println!();
        println!("| pending | rate rec/s | delay ms | records | received | early | wheel p50 / p99 / p99.9 ms (at most) | fire p50 / p99 / p99.9 / max ms | arrival p50 / p99 / p99.9 / max ms | delivery ack p50 / p99 / p99.9 ms (at most) | kafka-delay's produce ack p50 / p99 / p99.9 ms (at most) | plain producer ack p50 / p99 / p99.9 / max ms | linger ms | CPU steal % |");
        println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
        println!(
            "| {} | {:.0} | {} | {} | {} | {} | {} / {} / {} | {} / {} / {} / {} | {} / {} / {} / {} | {} / {} / {} | {} / {} / {} | {} / {} / {} / {} | {} | {:.1} |",
            l.pending,
            l.rate_per_s,
            l.delay_ms,
            l.records,
            l.received,
            l.early,
            l.wheel_ms_at_most[0],
            l.wheel_ms_at_most[1],
            l.wheel_ms_at_most[2],
            l.fire_ms[0],
            l.fire_ms[1],
            l.fire_ms[2],
            l.fire_ms[3],
            l.arrival_ms[0],
            l.arrival_ms[1],
            l.arrival_ms[2],
            l.arrival_ms[3],
            l.delivery_ms_at_most[0],
            l.delivery_ms_at_most[1],
            l.delivery_ms_at_most[2],
            l.produce_ms_at_most[0],
            l.produce_ms_at_most[1],
            l.produce_ms_at_most[2],
            l.probe_ack_ms[0],
            l.probe_ack_ms[1],
            l.probe_ack_ms[2],
            l.probe_ack_ms[3],
            l.linger_ms,
            l.steal_percent
        );
        report.lateness = Some(l);
    }
    write_report(args, report)
}

/// Writes the report as JSON to `--json` and says where.
fn write_report(args: &E2eArgs, report: E2eReport) -> Result<E2eReport, BenchError> {
    std::fs::write(&args.json, serde_json::to_string_pretty(&report)?)?;
    println!("\nwritten to {}", args.json.display());
    Ok(report)
}

struct Kafka {
    brokers: String,
    embedded: Option<Embedded>,
    /// Partitions of the topics created next (set per throughput size).
    partitions: AtomicI32,
    /// Extra `run` flags for the brokers (not the passthrough).
    broker_flags: Vec<String>,
}

/// Parses broker flags as `kafka-delay run` would.
fn config(brokers: &str, data_dir: &std::path::Path, extra: &[&str]) -> Result<Config, BenchError> {
    let dir = data_dir.display().to_string();
    let mut argv = vec![
        "kafka-delay",
        "run",
        "--brokers",
        brokers,
        "--data-dir",
        &dir,
        "--http-addr",
        "127.0.0.1:0",
        "--dead-letter-topic",
        "bench.dlt",
        // Every run is one member of a group of its own, so static membership (which only
        // spares a restarted member a rebalance) has nothing to do here, and some
        // Kafka-protocol brokers (tansu 0.6) mishandle it.
        "--no-static-membership",
    ];
    argv.extend_from_slice(extra);
    let cli = Cli::try_parse_from(argv)?;
    match cli.command {
        Command::Run(run) => Ok(run.validate()?),
        _ => Err("not a run command".into()),
    }
}

/// Wall and process CPU time of one run.
#[derive(Debug, Clone, Copy)]
struct Span {
    wall: Duration,
    cpu: Duration,
    faults: u64,
    /// The machine's CPU time stolen meanwhile, percent.
    steal_percent: f64,
    /// The share of the CPU time the machine had meanwhile that it spent busy (this process,
    /// Kafka and anything else), percent: near 100, the machine's CPU bounds the rate.
    busy_percent: f64,
}

/// Started when a run's first record is consumed.
#[derive(Debug, Clone, Copy)]
struct Stopwatch {
    wall: Instant,
    cpu: Duration,
    faults: u64,
    machine: MachineTicks,
}

impl Stopwatch {
    fn start() -> Self {
        let (cpu, faults) = process_usage();
        Self {
            wall: Instant::now(),
            cpu,
            faults,
            machine: MachineTicks::now(),
        }
    }

    fn stop(self) -> Span {
        let (cpu, faults) = process_usage();
        let machine = MachineTicks::now();
        Span {
            wall: self.wall.elapsed(),
            cpu: cpu.saturating_sub(self.cpu),
            faults: faults.saturating_sub(self.faults),
            steal_percent: self.machine.steal_percent_until(machine),
            busy_percent: self.machine.busy_percent_until(machine),
        }
    }
}

/// User plus system CPU time of this process, all threads (10 ms ticks), and its minor page
/// faults so far, from `/proc/self/stat`; zero where that cannot be read.
fn process_usage() -> (Duration, u64) {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return (Duration::ZERO, 0);
    };
    // Fields after the command name, which is in parentheses and may hold spaces: state is
    // field 3, minflt 10, utime 14, stime 15.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let field = |n: usize| {
        fields
            .get(n - 3)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (
        Duration::from_millis((field(14) + field(15)) * 10),
        field(10),
    )
}

/// The machine's CPU time so far, from the first line of `/proc/stat` (all CPUs, in clock
/// ticks): the time the hypervisor gave to other guests while this one wanted to run (steal),
/// and all of it. On a shared virtual machine a run's rates and lateness move with steal, so
/// every run reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct MachineTicks {
    steal: u64,
    /// Idle and waiting for I/O.
    idle: u64,
    total: u64,
}

impl MachineTicks {
    /// Now; zero where `/proc/stat` cannot be read.
    fn now() -> Self {
        std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| s.lines().next().and_then(Self::parse))
            .unwrap_or_default()
    }

    /// From the `cpu` line: user, nice, system, idle, iowait, irq, softirq, steal (guest time
    /// is already inside user and nice). `None` for any other line.
    fn parse(line: &str) -> Option<Self> {
        let mut fields = line.split_whitespace();
        if fields.next()? != "cpu" {
            return None;
        }
        let ticks: Vec<u64> = fields
            .take(8)
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        (ticks.len() == 8).then(|| Self {
            steal: ticks[7],
            idle: ticks[3] + ticks[4],
            total: ticks.iter().sum(),
        })
    }

    /// Steal between `self` and `later`, percent of all CPU time then (0 when none passed).
    fn steal_percent_until(self, later: Self) -> f64 {
        let total = later.total.saturating_sub(self.total);
        if total == 0 {
            return 0.0;
        }
        100.0 * later.steal.saturating_sub(self.steal) as f64 / total as f64
    }

    /// Busy time between `self` and `later`, percent of the CPU time the machine had then (all
    /// of it but steal; 0 when none passed).
    fn busy_percent_until(self, later: Self) -> f64 {
        let idle = later.idle.saturating_sub(self.idle);
        let had = later
            .total
            .saturating_sub(self.total)
            .saturating_sub(later.steal.saturating_sub(self.steal));
        if had == 0 {
            return 0.0;
        }
        100.0 * had.saturating_sub(idle) as f64 / had as f64
    }
}

/// What a passthrough run copies with (`Kafka::copying`); the data directory lives as long as
/// the run.
struct Copying {
    dir: tempfile::TempDir,
    src: String,
    dst: String,
    config: Config,
    producer: FutureProducer,
    consumer: StreamConsumer,
}

/// `m` as a record for `dst`: its key, value and headers.
fn copy_to<'a>(dst: &'a str, m: &'a BorrowedMessage<'_>) -> FutureRecord<'a, [u8], [u8]> {
    let mut rec = FutureRecord::to(dst).payload(m.payload().unwrap_or_default());
    if let Some(k) = m.key() {
        rec = rec.key(k);
    }
    if let Some(h) = m.headers() {
        rec = rec.headers(h.detach());
    }
    rec
}

/// The stored passthrough's key of a record: its partition and offset, as the store's record
/// ids (one source topic per run).
fn floor_key_of(partition: i32, offset: i64) -> [u8; 8] {
    (((partition as u64) << 48) | (offset as u64 & ((1 << 48) - 1))).to_be_bytes()
}

fn floor_key<M: Message>(m: &M) -> [u8; 8] {
    floor_key_of(m.partition(), m.offset())
}

/// What the stored passthrough keeps of a record: everything needed to publish it again after
/// a restart (target, key, value, headers), each length-prefixed.
fn encode_floor_record<M: Message>(out: &mut Vec<u8>, target: &str, m: &M) {
    fn field(out: &mut Vec<u8>, bytes: &[u8]) {
        out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(bytes);
    }
    out.clear();
    field(out, target.as_bytes());
    field(out, m.key().unwrap_or_default());
    field(out, m.payload().unwrap_or_default());
    if let Some(headers) = m.headers() {
        for h in headers.iter() {
            field(out, h.key.as_bytes());
            field(out, h.value.unwrap_or_default());
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn percentiles(mut v: Vec<u64>) -> [u64; 4] {
    if v.is_empty() {
        return [0; 4];
    }
    v.sort_unstable();
    let at = |q: f64| v[((v.len() as f64 * q) as usize).min(v.len() - 1)];
    [at(0.5), at(0.99), at(0.999), v[v.len() - 1]]
}

impl Kafka {
    async fn create(&self, topic: &str, producer: &FutureProducer, config: &Config) {
        match &self.embedded {
            Some(e) => {
                let _ = e.create_topic(topic, self.partitions.load(Ordering::Relaxed));
            }
            None => {
                let partitions = self.partitions.load(Ordering::Relaxed);
                let _ = kafka::ensure_topic(config, producer, topic, partitions).await;
            }
        }
    }

    /// The benchmark's own producer, batching for up to `linger_ms`.
    fn producer(&self, linger_ms: u32) -> Result<FutureProducer, BenchError> {
        Ok(ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .set("linger.ms", linger_ms.to_string())
            .set("queue.buffering.max.messages", "500000")
            .create()?)
    }

    /// Produces `n` records of `size`-byte values to `topic`, with the delay headers when
    /// `target` is given (due at once).
    async fn fill_topic(
        &self,
        topic: &str,
        n: u64,
        size: usize,
        target: Option<&str>,
    ) -> Result<(), BenchError> {
        let p = self.producer(5)?;
        let value = vec![b'v'; size];
        let mut acks = Vec::new();
        for i in 0..n {
            let key = format!("k{i}");
            let mut rec = FutureRecord::to(topic).key(&key).payload(&value);
            if let Some(t) = target {
                rec = rec.headers(
                    OwnedHeaders::new()
                        .insert(Header {
                            key: "delay-target",
                            value: Some(t),
                        })
                        .insert(Header {
                            key: "delay-after",
                            value: Some("0"),
                        }),
                );
            }
            loop {
                match p.send_result(rec) {
                    Ok(f) => {
                        acks.push(f);
                        break;
                    }
                    Err((_, back)) => {
                        rec = back;
                        for f in acks.drain(..) {
                            f.await?.map_err(|(e, _)| e)?;
                        }
                    }
                }
            }
        }
        for f in acks {
            f.await?.map_err(|(e, _)| e)?;
        }
        p.flush(Duration::from_secs(30))?;
        Ok(())
    }

    /// A source topic filled with `n` of the broker's input records (headers and all, carried
    /// through as they are), an empty target, and a consumer (ingest's settings, subscribed)
    /// and a producer (the broker's settings) to copy one to the other.
    async fn copying(&self, tag: &str, n: u64, size: usize) -> Result<Copying, BenchError> {
        let dir = tempfile::TempDir::new()?;
        let (src, dst) = (format!("bench.{tag}"), format!("bench.{tag}.out"));
        let config = config(&self.brokers, dir.path(), &["--group-id", tag])?;
        let producer = kafka::producer(&config)?;
        self.create(&src, &producer, &config).await;
        self.create(&dst, &producer, &config).await;
        self.fill_topic(&src, n, size, Some(&dst)).await?;
        let consumer: StreamConsumer = crate::ingest::consumer_config(&config).create()?;
        consumer.subscribe(&[&src])?;
        Ok(Copying {
            dir,
            src,
            dst,
            config,
            producer,
            consumer,
        })
    }

    /// Consume-and-produce of `n` records with the broker's client settings, each re-produced
    /// with its key, value and headers: the time from the first record consumed to the last one
    /// acknowledged.
    async fn passthrough(
        &self,
        tag: &str,
        n: u64,
        size: usize,
    ) -> Result<(Span, Duration), BenchError> {
        let Copying {
            dir: _dir,
            src,
            dst,
            config,
            producer,
            consumer,
        } = self.copying(&format!("pt.{tag}"), n, size).await?;
        let window = config.in_flight;
        let mut acks = std::collections::VecDeque::new();
        let mut started = None;
        for _ in 0..n {
            let m = consumer.recv().await?;
            started.get_or_insert_with(Stopwatch::start);
            let ack = producer
                .send_result(copy_to(&dst, &m))
                .map_err(|(e, _)| e)?;
            acks.push_back((ack, m.topic().to_owned(), m.partition(), m.offset()));
            if acks.len() >= window {
                let (ack, t, p, o) = acks.pop_front().expect("not empty");
                ack.await?.map_err(|(e, _)| e)?;
                consumer.store_offset(&t, p, o)?;
            }
        }
        for (ack, t, p, o) in acks {
            ack.await?.map_err(|(e, _)| e)?;
            consumer.store_offset(&t, p, o)?;
        }
        let took = started.unwrap_or_else(Stopwatch::start).stop();
        // Re-consuming the same records, nothing else: what rebuilding state from Kafka costs.
        let mut again_config = crate::ingest::consumer_config(&config);
        again_config.set("group.id", format!("pt-{tag}-again"));
        let again: StreamConsumer = again_config.create()?;
        again.subscribe(&[&src])?;
        let mut started = None;
        for _ in 0..n {
            again.recv().await?;
            started.get_or_insert_with(Instant::now);
        }
        let consume = started.map(|s| s.elapsed()).unwrap_or_default();
        Ok((took, consume))
    }

    /// The passthrough with the least a design that keeps every record durably until it is
    /// delivered must add: each group of records the consumer holds (as ingest takes them) is
    /// written to a plain RocksDB (the store's options for its records, the write-ahead log on,
    /// no fsync) before it is produced, and each record is deleted once acknowledged. The
    /// writes run on a blocking thread, one batch at a time, while the loop produces the group
    /// written before: a batch holds one group's records and the deletes of all those
    /// acknowledged since the batch before, so a delete never precedes its record. No read (the
    /// records are produced from the consumed copies), no index, no timer: the CPU any such
    /// design adds per record, and the rate it could reach where the machine's CPU is the bound.
    async fn stored_passthrough(&self, tag: &str, n: u64, size: usize) -> Result<Span, BenchError> {
        let Copying {
            dir,
            src: _,
            dst,
            config,
            producer,
            consumer,
        } = self.copying(&format!("spt.{tag}"), n, size).await?;
        let mut opts = rocksdb::Options::default();
        opts.create_if_missing(true);
        opts.set_max_background_jobs(2);
        opts.set_compression_type(rocksdb::DBCompressionType::Lz4);
        let db = Arc::new(rocksdb::DB::open(&opts, dir.path().join("floor"))?);
        let group_size = crate::ingest::max_group(false);
        let window = config.in_flight;
        let mut acks = std::collections::VecDeque::new();
        let mut acked = rocksdb::WriteBatch::default();
        let mut started = None;
        let mut moved = 0u64;
        let mut value = Vec::new();
        let write = |db: &Arc<rocksdb::DB>, batch: rocksdb::WriteBatch| {
            let db = Arc::clone(db);
            tokio::task::spawn_blocking(move || db.write(batch))
        };
        // The group whose write is in flight: produced once it is stored (as the broker stores
        // a record before it fires it), while the next group's write runs.
        let mut writing = write(&db, rocksdb::WriteBatch::default());
        let mut stored_next = Vec::new();
        while moved < n || !stored_next.is_empty() {
            let mut group = Vec::new();
            if moved < n {
                group.push(consumer.recv().await?);
                started.get_or_insert_with(Stopwatch::start);
                while group.len() < group_size && moved + (group.len() as u64) < n {
                    match crate::ingest::ready_now(consumer.recv()) {
                        Some(m) => group.push(m?),
                        None => break,
                    }
                }
                moved += group.len() as u64;
            }
            writing.await??;
            let mut batch = std::mem::take(&mut acked);
            for m in &group {
                encode_floor_record(&mut value, &dst, m);
                batch.put(floor_key(m), &value);
            }
            writing = write(&db, batch);
            for m in std::mem::replace(&mut stored_next, group) {
                let ack = producer
                    .send_result(copy_to(&dst, &m))
                    .map_err(|(e, _)| e)?;
                acks.push_back((ack, m.topic().to_owned(), m.partition(), m.offset()));
                while acks.len() >= window {
                    let (ack, t, p, o) = acks.pop_front().expect("not empty");
                    ack.await?.map_err(|(e, _)| e)?;
                    consumer.store_offset(&t, p, o)?;
                    acked.delete(floor_key_of(p, o));
                }
            }
        }
        for (ack, t, p, o) in acks {
            ack.await?.map_err(|(e, _)| e)?;
            consumer.store_offset(&t, p, o)?;
            acked.delete(floor_key_of(p, o));
        }
        writing.await??;
        db.write(acked)?;
        let took = started.unwrap_or_else(Stopwatch::start).stop();
        let left = db.iterator(rocksdb::IteratorMode::Start).count();
        if left != 0 {
            return Err(format!("the stored passthrough left {left} records in RocksDB").into());
        }
        Ok(took)
    }

    /// The same through the broker: from the first record ingested to the last one delivered
    /// and deleted from RocksDB.
    async fn through_broker(
        &self,
        tag: &str,
        n: u64,
        size: usize,
        sync: bool,
    ) -> Result<Span, BenchError> {
        let dir = tempfile::TempDir::new()?;
        let (src, dst) = (format!("delay.bench.{tag}"), format!("bench.out.{tag}"));
        let pattern = format!("^delay\\.bench\\.{tag}$");
        let group = format!("kd-{tag}");
        let mut flags = vec![
            "--source-pattern",
            pattern.as_str(),
            "--group-id",
            group.as_str(),
        ];
        if sync {
            flags.push("--sync");
        }
        flags.extend(self.broker_flags.iter().map(String::as_str));
        let config = config(&self.brokers, dir.path(), &flags)?;
        let producer = kafka::producer(&config)?;
        self.create(&src, &producer, &config).await;
        self.create(&dst, &producer, &config).await;
        self.create("bench.dlt", &producer, &config).await;
        self.fill_topic(&src, n, size, Some(&dst)).await?;
        let running = app::start(config, Arc::new(SystemClock), Registry::new()).await?;
        let ingested = running
            .metrics()
            .ingested
            .with_label_values(&[src.as_str()]);
        let fired = running.metrics().fired.with_label_values(&[dst.as_str()]);
        let deadline = Instant::now() + Duration::from_secs(600);
        let mut started = None;
        loop {
            if started.is_none() && ingested.get() > 0 {
                started = Some(Stopwatch::start());
            }
            if fired.get() >= n && running.store().pending() == 0 {
                break;
            }

            if Instant::now() > deadline {
                return Err(format!("only {} of {n} delivered in 10 minutes", fired.get()).into());
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let took = started.unwrap_or_else(Stopwatch::start).stop();
        running.shutdown().await;
        Ok(took)
    }

    /// Records due `delay_ms` after they are produced, at `rate` per second for `span`, with
    /// `pending` records waiting in RocksDB.
    async fn lateness(
        &self,
        tag: &str,
        pending: u64,
        rate: f64,
        span: Duration,
        delay_ms: u64,
    ) -> Result<Lateness, BenchError> {
        let dir = tempfile::TempDir::new()?;
        super::fill(&super::FillArgs {
            data_dir: dir.path().to_owned(),
            count: pending,
            spread: "30d".into(),
            value_bytes: 100,
            target: "bench.lat.idle".into(),
            source: "delay.bench.filled".into(),
        })?;
        let (src, dst) = (
            format!("delay.bench.lat{tag}"),
            format!("bench.lat{tag}.out"),
        );
        let (src, dst) = (src.as_str(), dst.as_str());
        let pattern = format!("^delay\\.bench\\.lat{tag}$");
        let group = format!("kd-lat{tag}");
        let mut flags = vec!["--source-pattern", &pattern, "--group-id", &group];
        flags.extend(self.broker_flags.iter().map(String::as_str));
        let config = config(&self.brokers, dir.path(), &flags)?;
        let linger_ms = 5;
        let producer = kafka::producer(&config)?;
        self.create(src, &producer, &config).await;
        self.create(dst, &producer, &config).await;
        // The pending records' target, for the few that come due during the run.
        self.create("bench.lat.idle", &producer, &config).await;
        let probe_topic = format!("bench.lat{tag}.probe");
        self.create(&probe_topic, &producer, &config).await;
        let running = app::start(config, Arc::new(SystemClock), Registry::new()).await?;
        let fired = running.metrics().fired.with_label_values(&[dst]);
        // Warm up until the broker consumes: one record, due at once.
        self.fill_topic(src, 1, 100, Some(dst)).await?;
        let warm = Instant::now() + Duration::from_secs(60);
        while fired.get() < 1 && Instant::now() < warm {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let reader: StreamConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .set("group.id", format!("bench-lat-reader{tag}"))
            .set("auto.offset.reset", "earliest")
            .set("fetch.wait.max.ms", "10")
            .create()?;
        reader.subscribe(&[dst])?;
        let total = (rate * span.as_secs_f64()) as u64;
        let clock = SystemClock;
        let collector = tokio::spawn(async move {
            let (mut fire, mut arrival, mut early) = (Vec::new(), Vec::new(), 0u64);
            let deadline = Instant::now() + span + Duration::from_secs(60);
            while (fire.len() as u64) < total && Instant::now() < deadline {
                let Ok(Ok(m)) = tokio::time::timeout(Duration::from_secs(1), reader.recv()).await
                else {
                    continue;
                };
                let now = clock.now_ms();
                if !m.key().is_some_and(|k| k.starts_with(b"l")) {
                    continue; // the warm-up record
                }
                let header = |name: &str| -> Option<u64> {
                    m.headers()?
                        .iter()
                        .find(|h| h.key == name)
                        .and_then(|h| std::str::from_utf8(h.value?).ok()?.parse().ok())
                };
                if let (Some(due), Some(at)) = (header("delay-due-ms"), header("delay-fired-ms")) {
                    if at < due {
                        early += 1;
                    }
                    fire.push(at.saturating_sub(due));
                    arrival.push(now.saturating_sub(due));
                }
            }
            (fire, arrival, early)
        });
        // The load generator batches for up to 50 ms: the embedded cluster searches a
        // partition's message sets linearly on every fetch, so many small batches from the
        // generator would slow Kafka itself down (records are due 5 s after they are produced).
        let p = self.producer(50)?;
        let value = vec![b'v'; 100];
        let delay = delay_ms.to_string();
        let started = Instant::now();
        let machine = MachineTicks::now();
        let produced = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let timeline = tokio::spawn(timeline(
            self.brokers.clone(),
            self.partitions.load(Ordering::Relaxed),
            running.metrics().clone(),
            src.to_owned(),
            dst.to_owned(),
            produced.clone(),
            total,
        ));
        let probing = Arc::new(AtomicBool::new(true));
        let probe = tokio::spawn(probe_acks(producer, probe_topic, probing.clone()));
        let mut acks = Vec::new();
        // Paced a millisecond at a time: a timer per record would cost the producer more CPU
        // than the broker spends on the record.
        let mut i = 0;
        while i < total {
            let by_now = paced(started, rate, total);
            while i < by_now {
                let key = format!("l{i}");
                let rec = FutureRecord::to(src).key(&key).payload(&value).headers(
                    OwnedHeaders::new()
                        .insert(Header {
                            key: "delay-target",
                            value: Some(dst),
                        })
                        .insert(Header {
                            key: "delay-after",
                            value: Some(&delay),
                        }),
                );
                acks.push(p.send_result(rec).map_err(|(e, _)| e)?);
                i += 1;
            }
            produced.store(i, std::sync::atomic::Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        for f in acks {
            f.await?.map_err(|(e, _)| e)?;
        }
        let (fire, arrival, early) = collector.await?;
        let steal_percent = machine.steal_percent_until(MachineTicks::now());
        timeline.abort();
        probing.store(false, Ordering::Relaxed);
        let probe_ack_ms = percentiles(probe.await?);
        let delivery = bucket_bounds(&running.metrics().delivery_lateness);
        let wheel = bucket_bounds(&running.metrics().fire_lateness);
        let produce = bucket_bounds(&running.metrics().produce_round_trip);
        let received = fire.len() as u64;
        running.shutdown().await;
        Ok(Lateness {
            pending,
            rate_per_s: rate,
            records: total,
            received,
            early,
            fire_ms: percentiles(fire),
            arrival_ms: percentiles(arrival),
            delivery_ms_at_most: delivery,
            wheel_ms_at_most: wheel,
            probe_ack_ms,
            produce_ms_at_most: produce,
            delay_ms,
            linger_ms,
            steal_percent,
        })
    }
}

/// Delivery reports of a plain producer: each record's send-to-acknowledgement time, taken in
/// the delivery callback as the broker's publisher takes its own.
#[derive(Debug, Default)]
struct AckTimes(std::sync::Mutex<Vec<u64>>);

impl ClientContext for AckTimes {}

impl ProducerContext for AckTimes {
    type DeliveryOpaque = Box<Instant>;

    fn delivery(&self, result: &DeliveryResult<'_>, sent: Box<Instant>) {
        if result.is_ok() {
            let ms = sent.elapsed().as_millis() as u64;
            self.0.lock().unwrap_or_else(|e| e.into_inner()).push(ms);
        }
    }
}

impl Kafka {
    /// A plain producer with the broker's producer settings sends `rate` records a second for
    /// `span` to a topic of its own (100-byte values, keys and seven headers like the records
    /// the broker publishes), paced a millisecond at a time.
    async fn plain_load(
        &self,
        rate: f64,
        span: Duration,
        traffic: bool,
    ) -> Result<PlainLoad, BenchError> {
        let dir = tempfile::TempDir::new()?;
        let config = config(&self.brokers, dir.path(), &[])?;
        let topic = format!("bench.plain.{}", std::process::id());
        let source = format!("bench.plain.{}.source", std::process::id());
        let admin = kafka::producer(&config)?;
        self.create(&topic, &admin, &config).await;
        self.create(&source, &admin, &config).await;
        let stop = Arc::new(AtomicBool::new(false));
        let mut rest = Vec::new();
        if traffic {
            rest.push(tokio::spawn(generate(
                self.producer(50)?,
                source.clone(),
                rate,
                span,
            )));
            for (t, group) in [(&source, "ingest"), (&topic, "reader")] {
                let consumer: StreamConsumer = crate::ingest::consumer_config(&config)
                    .set(
                        "group.id",
                        format!("bench-plain-{group}-{}", std::process::id()),
                    )
                    .create()?;
                consumer.subscribe(&[t.as_str()])?;
                rest.push(tokio::spawn(drain(consumer, stop.clone())));
            }
        }
        let settings = kafka::producer_config(&config);
        let linger_ms = settings
            .get("linger.ms")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let producer: ThreadedProducer<AckTimes> =
            settings.create_with_context(AckTimes::default())?;
        let value = vec![b'v'; 100];
        // Warm up: the topic's metadata and one round trip to every partition's leader, so that
        // the figures are not the first records waiting for metadata.
        for partition in 0..self.partitions.load(Ordering::Relaxed) {
            let record = BaseRecord::<(), _, _>::with_opaque_to(&topic, Box::new(Instant::now()))
                .partition(partition)
                .payload(&value);
            producer.send(record).map_err(|(e, _)| e)?;
        }
        let producer = tokio::task::spawn_blocking(move || {
            producer.flush(Duration::from_secs(30)).map(|()| producer)
        })
        .await??;
        producer
            .context()
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        let total = (rate * span.as_secs_f64()) as u64;
        let started = Instant::now();
        let mut i = 0;
        while i < total {
            let by_now = paced(started, rate, total);
            while i < by_now {
                let key = format!("l{i}");
                let now = SystemClock.now_ms().to_string();
                let offset = i.to_string();
                let mut headers = OwnedHeaders::new_with_capacity(7);
                for (k, v) in [
                    ("delay-target", topic.as_str()),
                    ("delay-after", "5000"),
                    ("delay-origin-topic", "delay.bench.plain"),
                    ("delay-origin-partition", "0"),
                    ("delay-origin-offset", &offset),
                    ("delay-due-ms", &now),
                    ("delay-fired-ms", &now),
                ] {
                    headers = headers.insert(Header {
                        key: k,
                        value: Some(v),
                    });
                }
                let record = BaseRecord::with_opaque_to(&topic, Box::new(Instant::now()))
                    .key(&key)
                    .payload(&value)
                    .headers(headers);
                match producer.send(record) {
                    Ok(()) => i += 1,
                    Err((e, _)) if e.rdkafka_error_code() == Some(RDKafkaErrorCode::QueueFull) => {
                        break
                    }
                    Err((e, _)) => return Err(e.into()),
                }
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        stop.store(true, Ordering::Relaxed);
        for task in rest {
            task.await?;
        }
        tokio::task::spawn_blocking(move || {
            let _ = producer.flush(Duration::from_secs(30));
            let acks = std::mem::take(
                &mut *producer
                    .context()
                    .0
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()),
            );
            Ok(PlainLoad {
                rate_per_s: rate,
                acknowledged: acks.len() as u64,
                with_traffic: traffic,
                ack_ms: percentiles(acks),
                linger_ms,
            })
        })
        .await?
    }
}

/// How many of `total` records paced at `rate` a second should have been sent by now (one more
/// than the elapsed time allows, so the first goes at once).
fn paced(started: Instant, rate: f64, total: u64) -> u64 {
    ((started.elapsed().as_secs_f64() * rate) as u64 + 1).min(total)
}

/// Produces `rate` 100-byte records a second to `topic` for `span`, paced a millisecond at a
/// time, as the lateness run's generator does.
async fn generate(producer: FutureProducer, topic: String, rate: f64, span: Duration) {
    let value = vec![b'v'; 100];
    let total = (rate * span.as_secs_f64()) as u64;
    let started = Instant::now();
    let mut acks = Vec::new();
    let mut i = 0;
    while i < total {
        let by_now = paced(started, rate, total);
        while i < by_now {
            let key = format!("g{i}");
            match producer.send_result(FutureRecord::to(&topic).key(&key).payload(&value)) {
                Ok(ack) => acks.push(ack),
                Err(_) => break, // the local queue is full: again in a millisecond
            }
            i += 1;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    for ack in acks {
        let _ = ack.await;
    }
}

/// Reads with `consumer` until `stop`, doing nothing with the records.
async fn drain(consumer: StreamConsumer, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        let _ = tokio::time::timeout(Duration::from_millis(100), consumer.recv()).await;
    }
}

/// Sends one 100-byte record to `topic` every 10 ms, each after the last one's acknowledgement,
/// while `probing`; returns each send-to-acknowledgement time in ms.
async fn probe_acks(producer: FutureProducer, topic: String, probing: Arc<AtomicBool>) -> Vec<u64> {
    let value = [b'p'; 100];
    let mut acks = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while probing.load(Ordering::Relaxed) {
        tick.tick().await;
        let sent = Instant::now();
        let record = FutureRecord::<(), _>::to(&topic).payload(&value[..]);
        if producer.send(record, Duration::ZERO).await.is_ok() {
            acks.push(sent.elapsed().as_millis() as u64);
        }
    }
    acks
}

/// The upper bounds, in ms, of the buckets holding p50, p99 and p99.9 of a histogram in seconds.
fn bucket_bounds(histogram: &prometheus::Histogram) -> [f64; 3] {
    let m = histogram.metric();
    let h = m.get_histogram();
    let count = h.get_sample_count() as f64;
    [0.5, 0.99, 0.999].map(|q| {
        h.get_bucket()
            .iter()
            .find(|b| b.cumulative_count() as f64 >= q * count)
            .map_or(f64::INFINITY, |b| b.upper_bound() * 1_000.0)
    })
}

/// Prints, once a second on stderr, how far each stage of the lateness run has got: produced
/// (handed to the test producer), in Kafka (the source topic's high watermarks), ingested, fired,
/// and the broker's pending and wheel gauges.
async fn timeline(
    brokers: String,
    partitions: i32,
    metrics: crate::metrics::Metrics,
    src: String,
    dst: String,
    produced: Arc<std::sync::atomic::AtomicU64>,
    total: u64,
) {
    let started = Instant::now();
    let Ok(watcher) = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create::<rdkafka::consumer::BaseConsumer>()
    else {
        return;
    };
    let watcher = Arc::new(watcher);
    eprintln!("   s  produced  in Kafka  ingested     fired   pending     wheel");
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let w = watcher.clone();
        let topic = src.clone();
        let in_kafka = tokio::task::spawn_blocking(move || {
            (0..partitions)
                .filter_map(|p| w.fetch_watermarks(&topic, p, Duration::from_secs(1)).ok())
                .map(|(_, high)| high)
                .sum::<i64>()
        })
        .await
        .unwrap_or(-1);
        let fired = metrics.fired.with_label_values(&[&dst]).get();
        eprintln!(
            "{:4.0} {:9} {:9} {:9} {:9} {:9} {:9}",
            started.elapsed().as_secs_f64(),
            produced.load(std::sync::atomic::Ordering::Relaxed),
            in_kafka,
            metrics.ingested.with_label_values(&[&src]).get(),
            fired,
            metrics.pending.get(),
            metrics.wheel_entries.get(),
        );
        if fired > total {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use rdkafka::message::{Header, OwnedHeaders, OwnedMessage, Timestamp};

    use super::{encode_floor_record, floor_key, floor_key_of, MachineTicks};
    use crate::config::Cli;

    #[test]
    fn the_stored_passthrough_keeps_what_a_restart_needs_under_one_key_per_record() {
        let headers = OwnedHeaders::new().insert(Header {
            key: "delay-target",
            value: Some("out"),
        });
        let m = OwnedMessage::new(
            Some(b"value".to_vec()),
            Some(b"k".to_vec()),
            "src".into(),
            Timestamp::NotAvailable,
            3,
            42,
            Some(headers),
        );
        let mut out = vec![9; 4];
        encode_floor_record(&mut out, "dst", &m);
        let mut want = Vec::new();
        for field in [&b"dst"[..], b"k", b"value", b"delay-target", b"out"] {
            want.extend_from_slice(&(field.len() as u32).to_le_bytes());
            want.extend_from_slice(field);
        }
        assert_eq!(out, want);
        // Keys are distinct per partition and offset, and sort by them.
        assert_eq!(floor_key(&m), floor_key_of(3, 42));
        assert!(floor_key_of(3, 42) < floor_key_of(3, 43));
        assert!(floor_key_of(3, (1 << 48) - 1) < floor_key_of(4, 0));
        assert_ne!(floor_key_of(0, 42), floor_key_of(3, 42));
    }

    #[test]
    fn steal_is_read_from_the_cpu_line_as_a_share_of_all_cpu_time() {
        // /proc/stat's first line: user nice system idle iowait irq softirq steal guest
        // guest_nice.
        let before = MachineTicks::parse("cpu  100 10 50 800 5 0 5 30 7 0").unwrap();
        assert_eq!(
            before,
            MachineTicks {
                steal: 30,
                idle: 805,
                total: 1_000
            }
        );
        let after = MachineTicks::parse("cpu  200 10 100 950 5 0 5 130 9 0").unwrap();
        // 400 ticks passed, 100 of them stolen; of the 300 the machine had, 150 idle.
        assert_eq!(before.steal_percent_until(after), 25.0);
        assert_eq!(before.busy_percent_until(after), 50.0);
        assert_eq!(after.steal_percent_until(after), 0.0);
        assert_eq!(after.busy_percent_until(after), 0.0);
        // Per-CPU lines and short or garbled lines are not the machine's line.
        assert_eq!(MachineTicks::parse("cpu0 1 2 3 4 5 6 7 8 9 10"), None);
        assert_eq!(MachineTicks::parse("cpu  1 2 3"), None);
        assert_eq!(MachineTicks::parse("cpu  1 2 3 4 5 6 7 x"), None);
        // This machine's own line parses.
        assert!(MachineTicks::now().total > 0);
    }

    #[test]
    fn the_plain_producer_baseline_needs_a_rate_and_its_traffic_needs_the_baseline() {
        let parse = |args: &[&str]| {
            let mut argv = vec!["kafka-delay", "bench", "e2e"];
            argv.extend_from_slice(args);
            Cli::try_parse_from(argv)
                .map(drop)
                .map_err(|e| e.to_string())
        };
        assert!(parse(&["--plain-producer"]).unwrap_err().contains("--rate"));
        let traffic = parse(&["--rate", "10", "--plain-traffic"]).unwrap_err();
        assert!(traffic.contains("--plain-producer"), "{traffic}");
        assert!(parse(&["--rate", "10", "--plain-producer", "--plain-traffic"]).is_ok());
    }
}
