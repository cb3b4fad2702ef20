//! `kafka-delay-bench store-cycle`: what the store costs per record on the broker's path, with
//! no Kafka in the way: ingest ([`Store::apply`]), the claim and read before publishing
//! ([`Store::claim_and_read`]) and the delete after the acknowledgement ([`Store::delivered`]),
//! the calls the publisher makes, in batches, the deletes
//! lagging the writes by the records in flight. The baseline, in the same run, is the least a
//! durable store of records does: one write batch putting each record's bytes under its offset
//! into a fresh RocksDB with default options, one batched read, and one delete batch, with the
//! same batches and the same lag. The store runs twice: with records due a minute after they
//! arrive (read from RocksDB before publishing), and due a second after (kept in memory as well,
//! and taken from there: `--keep-in-memory-within`).
//!
//! One thread writes and reads back, another deletes, at most `--in-flight` records behind (the
//! broker's ingest loop and its completion task); RocksDB's background flushes and compactions
//! run beside them, in both runs. The figure is wall time per record.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use clap::Args;
use rocksdb::{WriteBatch, DB};

use super::fill::FillError;
use super::harness::median;
use kafka_delay::store::{IngestOp, Store, StoreOptions};
use kafka_delay_core::id::{Pid, RecordId};
use kafka_delay_core::record::StoredRecord;

/// Flags of `kafka-delay-bench store-cycle`.
#[derive(Debug, Args)]
pub struct CycleArgs {
    /// Records through each store.
    #[arg(long, default_value_t = 400_000)]
    pub records: u64,
    /// Records per batch (the ingest loop's and the delete's batch).
    #[arg(long, default_value_t = 500)]
    pub batch: usize,
    /// Records written but not yet deleted (in flight to Kafka), in batches of `--batch`.
    #[arg(long, default_value_t = 10_000)]
    pub in_flight: u64,
    /// Bytes of each record's value.
    #[arg(long, default_value_t = 100)]
    pub value_bytes: usize,
    /// Rounds; each runs the baseline, then the store, and the medians are reported.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Where to write the results as JSON.
    #[arg(long, default_value = "bench-store-cycle.json")]
    pub json: std::path::PathBuf,
}

/// Nanoseconds per record of one round.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Cycle {
    /// Plain RocksDB: put, read, delete of each record's bytes under one key.
    pub baseline_ns: f64,
    /// kafka-delay's store, records read from RocksDB before publishing (due later than
    /// `--keep-in-memory-within` after they arrived).
    pub store: Phases,
    /// kafka-delay's store, records due soon: kept in memory as well, taken from there.
    pub kept: Phases,
}

/// One run of kafka-delay's store, ns per record.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Phases {
    /// Wall time: [`Store::apply`], [`Store::claim_and_read`], [`Store::delivered`].
    pub wall_ns: f64,
    /// Time spent in [`Store::apply`] per record.
    pub apply_ns: f64,
    /// ... in [`Store::claim_and_read`] (the claim and read before publishing).
    pub get_ns: f64,
    /// ... in [`Store::delivered`] (on the other thread).
    pub remove_ns: f64,
}

/// Runs `args.rounds` rounds and returns each.
///
/// # Errors
/// Bad flags, or RocksDB.
pub fn store_cycle(args: &CycleArgs) -> Result<Vec<Cycle>, FillError> {
    if args.batch == 0 || args.records == 0 || args.rounds == 0 {
        return Err(FillError::Flag(
            "--batch, --records and --rounds must be above 0".into(),
        ));
    }
    let lag = (args.in_flight / args.batch as u64) as usize;
    (0..args.rounds)
        .map(|_| {
            Ok(Cycle {
                baseline_ns: baseline(args, lag)?,
                store: store(args, lag, false)?,
                kept: store(args, lag, true)?,
            })
        })
        .collect()
}

/// Source and target partitions, as in `bench e2e`.
const PARTITIONS: i32 = 32;

/// The source partition and first offset of the batch starting at record `from`: batch n comes
/// from source partition n % 32, as the consumer hands out runs of one partition.
fn source_position(from: u64, batch: usize) -> (u64, u64) {
    let n = from / batch as u64;
    (n % PARTITIONS as u64, n / PARTITIONS as u64 * batch as u64)
}

/// The target partition of a key (any hash spreads them like the producer's).
fn target_partition(key: Option<&[u8]>) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    BuildHasherDefault::<DefaultHasher>::default().hash_one(key) % PARTITIONS as u64
}

fn temp_dir() -> Result<tempfile::TempDir, FillError> {
    tempfile::TempDir::new().map_err(|e| FillError::Flag(format!("temporary directory: {e}")))
}

/// What the store costs per record, with records due soon kept in memory (`keep`) or not.
fn store(args: &CycleArgs, lag: usize, keep: bool) -> Result<Phases, FillError> {
    let dir = temp_dir()?;
    let options = StoreOptions {
        sync: false,
        keep_within_ms: 5_000,
        keep_bytes: 64 << 20,
    };
    let store = Store::open(dir.path(), options)?;
    let pids = (0..PARTITIONS)
        .map(|p| store.partition_id("delay.bench", p))
        .collect::<Result<Vec<_>, _>>()?;
    let value = vec![b'v'; args.value_bytes];
    let (mut apply_ns, mut get_ns, remove_ns) = (0u128, 0u128, AtomicU64::new(0));
    let started = Instant::now();
    pipeline(
        args,
        lag,
        |from, to| {
            let ops = batch_ops(args, &pids, from, to, &value);
            let t = Instant::now();
            // Records arrive a second before they are due when kept (within the store's 5 s
            // below), a minute before otherwise.
            let early_ms = if keep { 1_000 } else { 60_000 };
            let now = (1_000_000 + from / 64).saturating_sub(early_ms);
            let applied = store.apply(&ops, now)?;
            apply_ns += t.elapsed().as_nanos();
            let t = Instant::now();
            let firing = store
                .claim_and_read(applied.inserted.iter().copied())
                .map_err(|e| e.error)?;
            get_ns += t.elapsed().as_nanos();
            let read_at = firing.read_at;
            let mut fired: Vec<(RecordId, StoredRecord)> = firing
                .records
                .into_iter()
                .map(|f| (f.id, f.record))
                .collect();
            // Delivery reports come back grouped by the target's partition (the key's hash).
            fired.sort_by_key(|(id, r)| (target_partition(r.key()), *id));
            Ok((read_at, fired))
        },
        |(read_at, done)| {
            let refs: Vec<_> = done.iter().map(|(id, r)| (*id, r)).collect();
            let t = Instant::now();
            store.delivered(&refs, read_at)?;
            remove_ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
            Ok(())
        },
    )?;
    let per = |ns: u128| ns as f64 / args.records as f64;
    let wall = per(started.elapsed().as_nanos());
    if store.pending() != 0 {
        return Err(FillError::Flag(format!(
            "{} records left pending after the cycle",
            store.pending()
        )));
    }
    let (_, _, taken) = store.kept_in_memory();
    if taken != if keep { args.records } else { 0 } {
        return Err(FillError::Flag(format!(
            "{taken} of {} records taken from memory (keep: {keep})",
            args.records
        )));
    }
    Ok(Phases {
        wall_ns: wall,
        apply_ns: per(apply_ns),
        get_ns: per(get_ns),
        remove_ns: per(u128::from(remove_ns.into_inner())),
    })
}

/// The ingest ops of records `from..to`: batch n from source partition n % 32, one due time
/// per 64 records.
fn batch_ops(args: &CycleArgs, pids: &[Pid], from: u64, to: u64, value: &[u8]) -> Vec<IngestOp> {
    let (partition, first) = source_position(from, args.batch);
    let pid = pids[partition as usize];
    (from..to)
        .map(|i| IngestOp::Schedule {
            pid,
            offset: (first + i - from) as i64,
            schedule: StoredRecord::new(
                1_000_000 + i / 64,
                "bench.out",
                None,
                Some(format!("k{i}").as_bytes()),
                Some(value),
                [],
            ),
        })
        .collect()
}

/// Writes (and reads back) batches on this thread and deletes them on another, at most `lag`
/// batches behind, as the broker's ingest and its completion task do.
fn pipeline<T: Send>(
    args: &CycleArgs,
    lag: usize,
    mut write: impl FnMut(u64, u64) -> Result<T, FillError>,
    delete: impl Fn(T) -> Result<(), FillError> + Send,
) -> Result<(), FillError> {
    let (tx, rx) = std::sync::mpsc::sync_channel::<T>(lag.max(1));
    std::thread::scope(|scope| {
        let deleter = scope.spawn(move || {
            for done in rx {
                delete(done)?;
            }
            Ok::<_, FillError>(())
        });
        let mut offset = 0u64;
        let wrote = (|| {
            while offset < args.records {
                let to = (offset + args.batch as u64).min(args.records);
                let batch = write(offset, to)?;
                offset = to;
                if tx.send(batch).is_err() {
                    break;
                }
            }
            Ok::<_, FillError>(())
        })();
        drop(tx);
        let deleted = deleter
            .join()
            .unwrap_or_else(|_| Err(FillError::Flag("the delete thread panicked".into())));
        wrote.and(deleted)
    })
}

fn baseline(args: &CycleArgs, lag: usize) -> Result<f64, FillError> {
    let dir = temp_dir()?;
    let io = |e: rocksdb::Error| FillError::Flag(format!("baseline RocksDB: {e}"));
    let mut opts = rocksdb::Options::default();
    opts.create_if_missing(true);
    opts.create_missing_column_families(true);
    let db = DB::open_cf(&opts, dir.path(), ["records"]).map_err(io)?;
    let cf = db
        .cf_handle("records")
        .ok_or_else(|| FillError::Flag("baseline RocksDB lost its column family".into()))?;
    let value = vec![b'v'; args.value_bytes];
    let started = Instant::now();
    pipeline(
        args,
        lag,
        |from, to| {
            // The same keys as the store's record ids: (source partition, offset).
            let (partition, first) = source_position(from, args.batch);
            let mut keys: Vec<([u8; 8], Vec<u8>)> = (from..to)
                .map(|i| {
                    let offset = (first + i - from) as i64;
                    let id = RecordId::new(partition as Pid, offset).ok_or_else(|| {
                        FillError::Flag(format!("offset {offset} out of a record id's range"))
                    })?;
                    Ok((id.to_bytes(), format!("k{i}").into_bytes()))
                })
                .collect::<Result<_, FillError>>()?;
            let mut batch = WriteBatch::default();
            for (k, record_key) in &keys {
                let mut record = record_key.clone();
                record.extend_from_slice(&value);
                batch.put_cf(cf, k, record);
            }
            db.write(batch).map_err(io)?;
            for v in db.batched_multi_get_cf(cf, keys.iter().map(|k| &k.0), false) {
                if v.map_err(io)?.is_none() {
                    return Err(FillError::Flag("baseline lost a record".into()));
                }
            }
            keys.sort_by_key(|(k, record_key)| (target_partition(Some(record_key)), *k));
            Ok(keys.into_iter().map(|k| k.0).collect::<Vec<_>>())
        },
        |done| {
            let mut batch = WriteBatch::default();
            for k in &done {
                batch.delete_cf(cf, k);
            }
            db.write(batch).map_err(io)
        },
    )?;
    Ok(started.elapsed().as_nanos() as f64 / args.records as f64)
}

/// Prints the rounds as a table and the medians of their ratios.
pub(super) fn print(rounds: &[Cycle]) {
    println!("| round | plain RocksDB ns/record | kafka-delay store, read before publishing ns/record | store / plain | in apply / claim_and_read / delivered ns | due soon, kept in memory ns/record | kept / plain | in apply / claim_and_read / delivered ns |");
    println!("|---|---|---|---|---|---|---|---|");
    let phases = |p: &Phases| format!("{:.0} / {:.0} / {:.0}", p.apply_ns, p.get_ns, p.remove_ns);
    for (i, c) in rounds.iter().enumerate() {
        println!(
            "| {} | {:.0} | {:.0} | {:.2} | {} | {:.0} | {:.2} | {} |",
            i + 1,
            c.baseline_ns,
            c.store.wall_ns,
            c.store.wall_ns / c.baseline_ns,
            phases(&c.store),
            c.kept.wall_ns,
            c.kept.wall_ns / c.baseline_ns,
            phases(&c.kept),
        );
    }
    let median_of = |f: &dyn Fn(&Cycle) -> f64| median(rounds.iter().map(f).collect());
    println!(
        "median store / plain: {:.2}; kept in memory / plain: {:.2}; kept / store: {:.2}",
        median_of(&|c| c.store.wall_ns / c.baseline_ns),
        median_of(&|c| c.kept.wall_ns / c.baseline_ns),
        median_of(&|c| c.kept.wall_ns / c.store.wall_ns),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cycle_puts_every_record_through_each_store_and_leaves_none_pending() {
        let args = CycleArgs {
            records: 2_345,
            batch: 100,
            in_flight: 500,
            value_bytes: 10,
            rounds: 2,
            json: "unused.json".into(),
        };
        let rounds = store_cycle(&args).unwrap();
        assert_eq!(rounds.len(), 2);
        // (Each store run also checks that every record came from memory when kept, and none
        // otherwise.)
        for c in &rounds {
            assert!(c.baseline_ns > 0.0);
            for p in [c.store, c.kept] {
                assert!(p.apply_ns > 0.0 && p.get_ns > 0.0 && p.remove_ns > 0.0);
                // The writer's share runs on the thread whose wall time is measured.
                assert!(p.apply_ns + p.get_ns <= p.wall_ns);
            }
        }
        let zero = CycleArgs { batch: 0, ..args };
        assert!(store_cycle(&zero)
            .unwrap_err()
            .to_string()
            .contains("--batch"));
    }
}
