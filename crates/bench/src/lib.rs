//! `kafka-delay-bench`: the figures that need a whole broker (see BENCHMARKS.md). Every
//! benchmark prints a table on stdout and writes its figures as JSON (`--json`).
//!
//! - `bench e2e` (`e2e/`): records per second through the broker against a plain
//!   consume-and-produce passthrough and a stored passthrough with the same client settings on
//!   the same Kafka, then the highest rate it sustains while the records are being produced (a
//!   sweep), then lateness at 70% of that rate with pending records filled in first.
//! - `bench modes` (`e2e/modes.rs`): the same passthrough against the broker in every
//!   durability mode (local, changelog, exactly-once), in interleaved rounds.
//! - `bench wave` (`e2e/wave.rs`): N records due in the same millisecond through the
//!   production modes, drained against the passthrough, judged by the verifier's tally.
//! - `bench recovery` (`recovery.rs`): a broker process's start to ready with millions of
//!   records pending in RocksDB, and its memory, against re-consuming them from Kafka.
//! - `bench restore` (`restore.rs`): a partition's pending records restored from the changelog
//!   against re-consuming its source and against only reading the topics the restore reads,
//!   and ingest with the changelog on and off.
//! - `bench instances` (`instances.rs`): 1, 2 and 3 broker processes of one group.
//! - `bench takeover` (`takeover.rs`): a killed instance's partitions taken over, without and
//!   with a standby replica, the dead member removed or waited for.
//! - `bench txn` (`txn.rs`): the writes of firing in Kafka transactions against at-least-once.
//! - `bench store-cycle` (`cycle.rs`): the store alone per record on the broker's path.
//! - `bench head-seek` (`head_seek.rs`): the head of the due index after millions of deletes.
//! - `bench fill` (`fill.rs`): pending records written straight into a data directory.
//!
//! `harness.rs` holds the Kafka a benchmark runs against and the statistics they share;
//! `machine.rs` what a run cost the machine (CPU, page faults, steal).

mod cycle;
mod e2e;
mod exactly;
mod fill;
mod harness;
mod head_seek;
mod instances;
mod machine;
mod recovery;
mod restore;
mod takeover;
mod txn;

use std::path::Path;

use clap::{Args, Subcommand};

pub use cycle::{store_cycle, Cycle, CycleArgs, Phases};
pub use e2e::modes::{run_modes, ModesArgs, ModesRow};
pub use e2e::wave::{run_wave, Wave, WaveArgs};
pub use e2e::{run_e2e, E2eArgs, E2eReport};
pub use exactly::{run_exactly_once, EosRun, ExactlyOnceArgs};
pub use fill::{fill, FillArgs, FillError, Filled};
pub use head_seek::{head_seek, HeadSeek, HeadSeekArgs};
pub use instances::{run_instances, InstancesArgs, Run};
pub use recovery::{run_recovery, Recovery, RecoveryArgs};
pub use restore::{run_restore, Phase, RestoreArgs};
pub use takeover::{run_takeover, Takeover, TakeoverArgs};
pub use txn::{run_txn, TxnArgs, TxnRun};

/// Why a benchmark could not run.
pub type BenchError = Box<dyn std::error::Error + Send + Sync>;

/// Flags of `kafka-delay-bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Which benchmark.
    #[command(subcommand)]
    pub what: BenchCommand,
}

/// The benchmarks.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Write pending records straight into a data directory (as ingest would store them).
    Fill(FillArgs),
    /// End-to-end throughput against a plain passthrough, the highest sustained rate, then
    /// lateness under load.
    E2e(E2eArgs),
    /// Every durability mode (local, changelog, exactly-once) against the same plain
    /// passthrough, in interleaved rounds (Apache Kafka).
    Modes(ModesArgs),
    /// N records due in the same millisecond through the production modes, each after a
    /// passthrough of the same number: drain rate, lateness, nothing early (Apache Kafka).
    Wave(WaveArgs),
    /// A broker process's start to ready with N records pending, and its memory, against
    /// re-consuming the same records from Kafka.
    Recovery(RecoveryArgs),
    /// The head of the due index after millions of fired records were deleted.
    HeadSeek(HeadSeekArgs),
    /// A partition's records restored from its changelog against re-consuming its source and
    /// against only reading the topics the restore reads, and ingest with the changelog on and
    /// off (Apache Kafka).
    Restore(RestoreArgs),
    /// 1, 2 and 3 broker processes of one group (`--changelog`) on the same Kafka: records due
    /// at once through the group.
    Instances(InstancesArgs),
    /// One of two broker processes killed with N pending: the takeover without and with a
    /// standby replica, the dead member removed or its session running out (Apache Kafka).
    Takeover(TakeoverArgs),
    /// The writes of firing (target record and changelog tombstone) in Kafka transactions, by
    /// commit interval and size, against the idempotent producer (Apache Kafka).
    Txn(TxnArgs),
    /// The broker with `--exactly-once` at several transaction settings against
    /// at-least-once: throughput and delivery lateness (Apache Kafka).
    ExactlyOnce(ExactlyOnceArgs),
    /// The store's cost per record on the broker's path (write, read, delete after delivery)
    /// against plain RocksDB doing the least a durable store does.
    StoreCycle(CycleArgs),
}

/// Runs one benchmark: its table on stdout, its figures as JSON where it has `--json`.
///
/// # Errors
/// What stopped the benchmark.
pub fn run(what: &BenchCommand) -> Result<(), BenchError> {
    match what {
        BenchCommand::Fill(args) => {
            let f = fill(args)?;
            println!(
                "filled {} records in {:.1} s ({:.0}/s) into {}",
                f.count,
                f.seconds,
                f.count as f64 / f.seconds,
                args.data_dir.display()
            );
        }
        BenchCommand::E2e(args) => {
            runtime()?.block_on(run_e2e(args))?;
        }
        BenchCommand::Modes(args) => {
            let rows = runtime()?.block_on(run_modes(args))?;
            write_json(&args.json, &rows)?;
        }
        BenchCommand::Wave(args) => {
            let waves = runtime()?.block_on(run_wave(args))?;
            write_json(&args.json, &waves)?;
        }
        BenchCommand::Recovery(args) => {
            runtime()?.block_on(run_recovery(args))?;
        }
        BenchCommand::Instances(args) => {
            let runs = runtime()?.block_on(run_instances(args))?;
            write_json(&args.json, &runs)?;
        }
        BenchCommand::Txn(args) => {
            let runs = runtime()?.block_on(run_txn(args))?;
            write_json(&args.json, &runs)?;
        }
        BenchCommand::ExactlyOnce(args) => {
            let runs = runtime()?.block_on(run_exactly_once(args))?;
            write_json(&args.json, &runs)?;
        }
        BenchCommand::Takeover(args) => {
            let runs = runtime()?.block_on(run_takeover(args))?;
            write_json(&args.json, &runs)?;
        }
        BenchCommand::Restore(args) => {
            let phases = runtime()?.block_on(run_restore(args))?;
            write_json(&args.json, &phases)?;
        }
        BenchCommand::HeadSeek(args) => {
            let h = head_seek(args)?;
            head_seek::print(&h);
            write_json(&args.json, &h)?;
        }
        BenchCommand::StoreCycle(args) => {
            let rounds = store_cycle(args)?;
            cycle::print(&rounds);
            write_json(&args.json, &rounds)?;
        }
    }
    Ok(())
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
}

/// Writes `figures` as JSON to `path` and says where.
fn write_json(path: &Path, figures: &impl serde::Serialize) -> Result<(), BenchError> {
    std::fs::write(path, serde_json::to_string_pretty(figures)?)?;
    println!("\nwritten to {}", path.display());
    Ok(())
}
