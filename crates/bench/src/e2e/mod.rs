//! `kafka-delay-bench e2e`: throughput through the broker divided by a passthrough's, and
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
//!
//! Layout: `throughput.rs`, `lateness.rs` (sweep and lateness run), `plain.rs` (the
//! plain-producer baseline); the Kafka under test and the statistics are `bench::harness`, what
//! a run cost the machine `bench::machine`.

mod lateness;
pub(crate) mod modes;
mod plain;
mod throughput;
pub(crate) mod wave;

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::harness::Kafka;
use super::BenchError;
use kafka_delay_core::time::parse_duration_ms;

/// Flags of `kafka-delay-bench e2e`.
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
    /// `--broker-flag=--scheduler-slice=100us`.
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
    /// CPU time during the run, passthrough and broker with sync off ([`crate::machine::MachineTicks`]).
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
    /// received, percent ([`crate::machine::MachineTicks`]).
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

/// Runs the throughput runs and the lateness run, printing tables on stdout and writing JSON.
///
/// Runs the throughput runs and the lateness run, printing tables on stdout and writing JSON.
///
/// # Errors
/// A bad flag, Kafka or RocksDB.
pub async fn run_e2e(args: &E2eArgs) -> Result<E2eReport, BenchError> {
    let sizes = value_sizes(&args.value_bytes)?;
    let duration = |flag: &str, value: &str| {
        parse_duration_ms(value)
            .map(Duration::from_millis)
            .map_err(|e| format!("{flag} {value}: {e}"))
    };
    let lateness_for = duration("--lateness-for", &args.lateness_for)?;
    let delay = duration("--delay", &args.delay)?;
    let sweep_for = duration("--sweep-for", &args.sweep_for)?;
    let kafka = Kafka::connect(args.brokers.as_deref(), args.partitions, &args.broker_flags)?;
    let mut report = E2eReport {
        throughput: Vec::new(),
        sweep: Vec::new(),
        sustained_per_s: None,
        lateness: None,
        plain_load: None,
    };
    if let (true, Some(rate)) = (args.plain_producer, args.rate) {
        let p = kafka
            .plain_load(rate, lateness_for, args.plain_traffic)
            .await?;
        plain::print(&p);
        report.plain_load = Some(p);
        return write_report(args, report);
    }
    if args.rate.is_none() {
        throughput::print_header();
        for (i, &size) in sizes.iter().enumerate() {
            let row = kafka
                .throughput(size, args.records, args.rounds, args.partitions, i == 0)
                .await?;
            report.throughput.push(row);
        }
    }
    kafka.reset_partitions(args.partitions);
    // The throughput runs read records produced beforehand; while records are being produced
    // the same machine also runs the producer and the cluster's produce path, so the rate the
    // broker sustains then is found by a sweep, and the lateness run goes at `--load` of it.
    let ceiling = report.throughput.first().map(|t| t.broker_per_s);
    if let (None, Some(ceiling), false) = (args.rate, ceiling, sweep_for.is_zero()) {
        report.sweep = kafka
            .sweep(ceiling, sweep_for, delay.as_millis() as u64)
            .await?;
        report.sustained_per_s = report
            .sweep
            .iter()
            .filter(|s| s.kept_up)
            .map(|s| s.rate_per_s)
            .reduce(f64::max);
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
                lateness_for,
                delay.as_millis() as u64,
            )
            .await?;
        lateness::print(&l);
        report.lateness = Some(l);
    }
    write_report(args, report)
}

/// The value sizes of `--value-bytes`, comma-separated bytes.
fn value_sizes(flag: &str) -> Result<Vec<usize>, BenchError> {
    flag.split(',')
        .map(|s| s.trim().parse::<usize>())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("--value-bytes {flag}: {e}").into())
}

/// Writes the report as JSON to `--json` and says where.
fn write_report(args: &E2eArgs, report: E2eReport) -> Result<E2eReport, BenchError> {
    super::write_json(&args.json, &report)?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use crate::BenchCommand;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(subcommand)]
        _what: BenchCommand,
    }

    #[test]
    fn the_plain_producer_baseline_needs_a_rate_and_its_traffic_needs_the_baseline() {
        let parse = |args: &[&str]| {
            let mut argv = vec!["kafka-delay-bench", "e2e"];
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
