//! `kafka-delay-bench fill`: pending records written straight into a data directory through
//! the same [`Store::apply`] ingest uses, so that recovery and memory can be measured with
//! millions of records pending without a Kafka that holds them first.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;

use kafka_delay::store::{IngestOp, Store, StoreError, StoreOptions};
use kafka_delay_core::clock::{Clock, SystemClock};
use kafka_delay_core::record::StoredRecord;
use kafka_delay_core::time::parse_duration_ms;

/// Flags of `kafka-delay-bench fill`.
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
pub(super) const FILL_BATCH: u64 = 10_000;

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
        store.apply(&ops, now)?;
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
