//! `kafka-delay bench`: the figures that need a whole broker (see BENCHMARKS.md).
//!
//! `bench fill` writes pending records straight into a data directory, through the same
//! [`Store::apply`] ingest uses, so that recovery and memory can be measured with millions of
//! records pending without a Kafka that holds them first.
//!
//! `bench store-cycle` (in `cycle.rs`) times the store alone on the broker's path per record.
//!
//! `bench e2e` (in `e2e.rs`) measures records per second through the broker against a plain
//! consume-and-produce passthrough with the same client settings on the same Kafka, then the
//! highest rate it sustains while the records are being produced (a sweep), then lateness at
//! 70% of that rate with pending records filled in first.

mod cycle;
mod e2e;

pub use cycle::{store_cycle, Cycle, CycleArgs, Phases};
pub use e2e::{run_e2e, E2eArgs};

use std::path::PathBuf;
use std::time::Instant;

use clap::{Args, Subcommand};

use crate::clock::{Clock, SystemClock};
use crate::record::time::parse_duration_ms;
use crate::record::StoredRecord;
use crate::store::{IngestOp, Store, StoreError, StoreOptions};

/// Flags of `kafka-delay bench`.
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
    /// The head of the due index after millions of fired records were deleted.
    HeadSeek(HeadSeekArgs),
    /// The store's cost per record on the broker's path (write, read, delete after delivery)
    /// against plain RocksDB doing the least a durable store does.
    StoreCycle(CycleArgs),
}

/// Flags of `kafka-delay bench head-seek`.
#[derive(Debug, Args)]
pub struct HeadSeekArgs {
    /// Records written, then fired (deleted) in due order.
    #[arg(long, default_value_t = 10_000_000)]
    pub count: u64,
    /// Records left pending at the end (the ones due last).
    #[arg(long, default_value_t = 1_000)]
    pub keep: u64,
}

/// Nanoseconds per head seek: with the low-water mark, without it (walking the tombstones of
/// the fired records), and on a fresh store holding only the records left (the baseline).
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct HeadSeek {
    /// Records deleted.
    pub deleted: u64,
    /// Median ns of [`Store::earliest_due`] (bounded below by the low-water mark).
    pub low_water_ns: f64,
    /// Median ns of an unbounded seek to the first entry.
    pub unbounded_ns: f64,
    /// Median ns of the same seek on a store that never held the deleted records.
    pub baseline_ns: f64,
}

fn median_ns(runs: usize, mut f: impl FnMut()) -> f64 {
    let mut v: Vec<f64> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_nanos() as f64
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Writes `count` records, deletes all but the last `keep` the way the publisher does after
/// delivery, and times the head seek three ways.
///
/// # Errors
/// RocksDB.
pub fn head_seek(args: &HeadSeekArgs) -> Result<HeadSeek, FillError> {
    let dir = tempfile::TempDir::new().map_err(|e| FillError::Flag(e.to_string()))?;
    let fill_args = FillArgs {
        data_dir: dir.path().to_owned(),
        count: args.count,
        spread: "1h".into(),
        value_bytes: 10,
        target: "bench.out".into(),
        source: "delay.bench".into(),
    };
    fill(&fill_args)?;
    let store = Store::open(dir.path(), StoreOptions::durable_only(false))?;
    let to_delete = args.count.saturating_sub(args.keep);
    let started = Instant::now();
    let mut deleted = 0u64;
    // The publisher deletes what the wheel handed out; the wheel never reads the index again
    // below where it has loaded, so neither does this loop.
    let mut from = (0, crate::store::RecordId(0));
    while deleted < to_delete {
        let n = FILL_BATCH.min(to_delete - deleted) as usize;
        let page = store.due_range(from, u64::MAX, n)?;
        if let Some(&(due, id)) = page.last() {
            from = crate::store::due_key_after(due, id);
        }
        let ids: Vec<_> = page.iter().map(|&(_, id)| id).collect();
        let records = store.get(&ids)?;
        let fired: Vec<_> = ids
            .iter()
            .zip(records.iter())
            .filter_map(|(id, r)| r.as_ref().map(|r| (*id, r)))
            .collect();
        store.remove_fired(&fired)?;
        deleted += n as u64;
        if deleted % 1_000_000 == 0 {
            eprintln!(
                "deleted {deleted} of {to_delete} ({:.0}/s)",
                deleted as f64 / started.elapsed().as_secs_f64()
            );
        }
    }
    let _ = store.earliest_due()?;
    let low_water_ns = median_ns(1_001, || {
        std::hint::black_box(store.earliest_due().ok());
    });
    let unbounded_ns = median_ns(21, || {
        std::hint::black_box(store.first_due_from(0).ok());
    });
    let base_dir = tempfile::TempDir::new().map_err(|e| FillError::Flag(e.to_string()))?;
    fill(&FillArgs {
        data_dir: base_dir.path().to_owned(),
        count: args.keep,
        ..fill_args
    })?;
    let base = Store::open(base_dir.path(), StoreOptions::durable_only(false))?;
    let baseline_ns = median_ns(1_001, || {
        std::hint::black_box(base.first_due_from(0).ok());
    });
    Ok(HeadSeek {
        deleted,
        low_water_ns,
        unbounded_ns,
        baseline_ns,
    })
}

/// Flags of `kafka-delay bench fill`.
#[derive(Debug, Args)]
pub struct FillArgs {
    /// The broker's data directory (created if missing; the broker must not be running).
    #[arg(long)]
    pub data_dir: PathBuf,
    /// Records to write.
    #[arg(long, default_value_t = 1_000_000)]
    pub count: u64,
    /// Due times are spread evenly over this window, starting now.
    #[arg(long, default_value = "30d")]
    pub spread: String,
    /// Bytes of each record's value.
    #[arg(long, default_value_t = 100)]
    pub value_bytes: usize,
    /// Target topic of the records.
    #[arg(long, default_value = "bench.out")]
    pub target: String,
    /// Source topic the records are filed under (offsets continue after what is there).
    #[arg(long, default_value = "delay.bench")]
    pub source: String,
}

/// What `bench fill` did.
#[derive(Debug, Clone, Copy)]
pub struct Filled {
    /// Records written.
    pub count: u64,
    /// Seconds it took.
    pub seconds: f64,
}

/// Records per write batch.
const FILL_BATCH: u64 = 10_000;

/// Writes `args.count` pending records into `args.data_dir`, due times spread evenly over
/// `args.spread` from now, in batches; prints progress every 10 s on stderr.
///
/// # Errors
/// A bad `--spread`, or RocksDB.
pub fn fill(args: &FillArgs) -> Result<Filled, FillError> {
    let spread = parse_duration_ms(&args.spread)
        .map_err(|e| FillError::Flag(format!("--spread {}: {e}", args.spread)))?;
    let store = Store::open(&args.data_dir, StoreOptions::durable_only(false))?;
    let pid = store.partition_id(&args.source, 0)?;
    let first = store.next_offset(pid)?.unwrap_or(0);
    let now = SystemClock.now_ms();
    let value = vec![b'v'; args.value_bytes];
    let started = Instant::now();
    let mut last_report = Instant::now();
    let mut written = 0u64;
    while written < args.count {
        let n = FILL_BATCH.min(args.count - written);
        let ops: Vec<IngestOp> = (written..written + n)
            .map(|i| IngestOp::Schedule {
                pid,
                offset: first + i as i64,
                schedule: StoredRecord::new(
                    now + 1 + (i as u128 * spread as u128 / args.count as u128) as u64,
                    &args.target,
                    None,
                    Some(format!("k{i}").as_bytes()),
                    Some(&value),
                    [],
                ),
            })
            .collect();
        store.apply(&ops)?;
        written += n;
        if last_report.elapsed().as_secs() >= 10 {
            let secs = started.elapsed().as_secs_f64();
            eprintln!(
                "filled {written} of {} ({:.0}/s)",
                args.count,
                written as f64 / secs
            );
            last_report = Instant::now();
        }
    }
    store.flush()?;
    Ok(Filled {
        count: written,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Why `bench fill` failed.
#[derive(Debug, thiserror::Error)]
pub enum FillError {
    /// A flag.
    #[error("{0}")]
    Flag(String),
    /// RocksDB.
    #[error(transparent)]
    Store(#[from] StoreError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_writes_pending_records_spread_over_the_window_after_what_is_there() {
        let dir = tempfile::TempDir::new().unwrap();
        let args = FillArgs {
            data_dir: dir.path().to_owned(),
            count: 25_000,
            spread: "1h".into(),
            value_bytes: 10,
            target: "out".into(),
            source: "delay.bench".into(),
        };
        assert_eq!(fill(&args).unwrap().count, 25_000);
        assert_eq!(fill(&args).unwrap().count, 25_000);
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        let mut dues = Vec::new();
        assert_eq!(store.scan_due(|d, _| dues.push(d)).unwrap(), 50_000);
        let span = dues[dues.len() - 1] - dues[0];
        assert!(span < 3_600_000 + 60_000, "spread over the hour: {span}");
        let pid = store.lookup_partition("delay.bench", 0).unwrap();
        assert_eq!(store.next_offset(pid).unwrap(), Some(50_000));
        let bad = FillArgs {
            spread: "soon".into(),
            ..args
        };
        assert!(fill(&bad).unwrap_err().to_string().contains("--spread"));
    }
}
