//! `kafka-delay-bench head-seek`: the head of the due index after millions of fired records
//! were deleted the way the publisher deletes them, against a store that never held them.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;

use super::fill::{fill, FillArgs, FillError, FILL_BATCH};
use super::harness::median;
use kafka_delay::store::{Store, StoreOptions};

/// Flags of `kafka-delay-bench head-seek`.
#[derive(Debug, Args)]
pub struct HeadSeekArgs {
    /// Records written, then fired (deleted) in due order.
    #[arg(long, default_value_t = 10_000_000)]
    pub count: u64,
    /// Records left pending at the end (the ones due last).
    #[arg(long, default_value_t = 1_000)]
    pub keep: u64,
    /// Where to write the results as JSON.
    #[arg(long, default_value = "bench-head-seek.json")]
    pub json: PathBuf,
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
    median(
        (0..runs)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_nanos() as f64
            })
            .collect(),
    )
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
    let mut from = (0, kafka_delay_core::id::RecordId(0));
    while deleted < to_delete {
        let n = FILL_BATCH.min(to_delete - deleted) as usize;
        let page = store.due_range(from, u64::MAX, n)?;
        if let Some(&(due, id)) = page.last() {
            from = kafka_delay::store::due_key_after(due, id);
        }
        // As the publisher fires them: claimed and read, then deleted after delivery.
        let firing = store
            .claim_and_read(page.iter().copied())
            .map_err(|e| e.error)?;
        let fired: Vec<_> = firing.records.iter().map(|f| (f.id, &f.record)).collect();
        store.delivered(&fired, firing.read_at)?;
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

/// Prints the figures as a table.
pub(super) fn print(h: &HeadSeek) {
    println!("| deleted | head seek, low-water mark | unbounded seek | baseline (store without them) | low-water / baseline | unbounded / baseline |");
    println!("|---|---|---|---|---|---|");
    println!(
        "| {} | {:.0} ns | {:.0} ns | {:.0} ns | {:.2}x | {:.0}x |",
        h.deleted,
        h.low_water_ns,
        h.unbounded_ns,
        h.baseline_ns,
        h.low_water_ns / h.baseline_ns,
        h.unbounded_ns / h.baseline_ns
    );
}
