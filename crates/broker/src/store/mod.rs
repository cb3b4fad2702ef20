//! Durable state in RocksDB: pending records, the due-time index, ids, source offsets and pending
//! counts. [`column`] names the column families and their key and value types, [`codec`] their
//! byte layouts; `ingest.rs` writes what was consumed, `fire.rs` is the fire path, `gather.rs`
//! deletes the due-index entries of delivered records, `operator.rs` holds operators' cancels
//! and moves, `read.rs` the reads, `recovery.rs` what `open` restores.
//!
//! # Durability contract
//! Ingest: decode -> **one write batch** (records + due index + ids + the source offset) ->
//! then the Kafka offset is stored for commit -> then the record goes into the wheel. A crash
//! before the batch loses nothing (Kafka redelivers); a crash after it loses nothing and ingests
//! nothing twice (the stored offset is where consumption resumes, and the ingest loop skips
//! anything below it); the wheel is rebuilt from the due index at start.
//!
//! Fire ([`Store::claim`], [`Store::read_claimed`], [`Store::delivered`]): claim and read the
//! record -> produce -> delivery report -> **one delete batch** (record, id mapping if it still
//! points at this record, counts; its due-index entry is gathered, below). A crash between the
//! delivery report and the delete publishes the record again after restart: delivery is
//! at-least-once, and the duplicates after a crash are bounded by the records in flight.
//!
//! Cleanup: a record, its due-index entry and its id mapping are deleted when it fires (the
//! entry with the next gathered ones), is cancelled or is replaced, so no column grows without
//! bound; `offsets` and `meta` hold one entry per source partition; `counts` one per target and
//! per due minute that has pending records (a count that reaches zero is deleted in the same
//! batch).
//!
//! Counts: every write batch also carries the new pending counts it changes, so a restart reads
//! them back instead of scanning the due index (see [`stats`]).
//!
//! Every read-check-write (reschedule, cancel, delete after fire) runs under one mutex, so a
//! reschedule arriving while the old record fires can never lose the new id mapping.
//!
//! The due-index entries of delivered records are deleted a little later than the records:
//! gathered over many deliveries, so that adjacent ones go as one range tombstone. Every read
//! of the index whose answer anyone sees deletes the gathered ones first; after a crash the
//! ones left behind are loaded, find no record when they are claimed, and are gathered again.
//!
//! The delete after fire checks that each record is still there and at which due time (a cancel
//! or a replacement may have removed it while it was being delivered, an operator may have moved
//! it) only when one of those happened since the records were read: the store counts them
//! (`Store::changes`), and each record is claimed before it is read, so no other delete after
//! delivery can remove it meanwhile.

pub mod codec;
mod column;
mod copies;
mod fire;
mod gather;
mod ingest;
pub mod near;
mod operator;
mod partitions;
mod read;
mod recovery;
mod replica;
pub mod stats;
pub mod wal;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::Instant;

use rocksdb::{ColumnFamily, ColumnFamilyDescriptor, Options, WriteOptions, DB};

pub use codec::due_key_after;
use codec::DueKey;
use column::{Batch, Column};
pub use fire::{Claim, FireBatch, ReadFailed, ReadMark, ToFire};

pub use ingest::{Applied, IngestOp};
pub use read::{Page, Position};
use stats::{PendingStats, Snapshot};

/// Errors of the store; each names what failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database could not be opened.
    #[error("cannot open RocksDB at {path}: {source}")]
    Open {
        /// Data directory.
        path: PathBuf,
        /// RocksDB's error.
        source: rocksdb::Error,
    },
    /// A read or write failed.
    #[error("RocksDB {op} failed: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// RocksDB's error.
        source: rocksdb::Error,
    },
    /// Stored bytes could not be decoded.
    #[error("corrupt {what} in RocksDB: {detail}")]
    Corrupt {
        /// Which column.
        what: &'static str,
        /// What was wrong.
        detail: String,
    },
    /// More source partitions than a [`Pid`] can name.
    #[error("more than 65536 source partitions seen; {topic}/{partition} cannot be tracked")]
    TooManyPartitions {
        /// Topic of the partition that did not fit.
        topic: String,
        /// Its partition number.
        partition: i32,
    },
    /// An offset too large for a [`RecordId`].
    #[error("offset {offset} of {topic}/{partition} is above 2^48")]
    OffsetRange {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// The offset.
        offset: i64,
    },
}

type Result<T> = std::result::Result<T, StoreError>;

fn io(op: &'static str) -> impl FnOnce(rocksdb::Error) -> StoreError {
    move |source| StoreError::Io { op, source }
}

/// How the store writes.
#[derive(Debug, Clone, Copy, Default)]
pub struct StoreOptions {
    /// fsync the write-ahead log on every ingest batch (a group of records) and operator
    /// change; deletes after delivery are synced as [`wal`] says.
    pub sync: bool,
    /// Records due within this many ms of their arrival are also kept in memory until they
    /// fire ([`near`]); see [`Store::apply`].
    pub keep_within_ms: u64,
    /// At most this many bytes of them (0: none).
    pub keep_bytes: usize,
}

impl StoreOptions {
    /// Options that keep nothing in memory (tests and tools that only read or load).
    pub fn durable_only(sync: bool) -> Self {
        Self {
            sync,
            keep_within_ms: 0,
            keep_bytes: 0,
        }
    }
}

/// The RocksDB store. Thread-safe; share it in an `Arc`.
///
/// # Locks
/// | lock          | guards                                                    |
/// |---------------|-----------------------------------------------------------|
/// | `writes`      | every read-check-write, the index's writes, the counts    |
/// | `due_garbage` | the gathered due-index keys                               |
/// | `firing`      | the records kept in memory and the claims of records firing |
/// | `partitions`  | the source partitions' names and ids                      |
///
/// Order: `writes` first; under it `due_garbage` or `firing`, never both at once; `partitions`
/// last (nothing is locked while it is held). The fire path before publishing takes only
/// `firing` (and `due_garbage` after it, alone, for timers whose record is gone); the delete
/// after delivery `writes` then `due_garbage`, and `firing` once both are released.
///
/// The atomics are read without a lock and changed under `writes`.
#[derive(Debug)]
pub struct Store {
    db: DB,
    /// Which writes fsync the write-ahead log.
    wal: wal::WalSync,
    /// Serialises read-check-write sequences (see the module doc), and guards the counts.
    writes: Mutex<PendingStats>,
    /// Due-index keys of records the delete after delivery removed, not deleted yet: they are
    /// gathered (up to `gather::GATHER_DUE_DELETES`) and deleted together, so that adjacent
    /// ones go as one range tombstone instead of a point tombstone each (delivery reports
    /// arrive per target partition, whose records are every n-th in due order). Lost in a
    /// crash: those entries then stay in the index, are loaded at start, find no record when
    /// claimed and are gathered again.
    due_garbage: Mutex<Vec<DueKey>>,
    /// Records due soon, in memory as well (see [`near`]), and the records claimed for firing.
    firing: Mutex<fire::Firing>,
    /// Source partitions by name and by id.
    partitions: RwLock<partitions::Partitions>,
    /// Records in the `records` column (exact: every change is counted under `writes`).
    pending: AtomicI64,
    /// No due-index entry lies below this due time: the head seek starts here, so it never
    /// walks over the tombstones of records already fired.
    low_water: AtomicU64,
    /// Pending records deleted or moved by anything but a delete after delivery (cancels,
    /// replacements, operators' cancels and moves), counted once written. Records read while
    /// it had some value, and claimed, are all still there while it has that value: see
    /// [`Store::delivered`].
    changes: AtomicU64,
    /// [`StoreOptions::keep_within_ms`].
    keep_within_ms: u64,
    /// Operators' actions skip claimed records ([`Store::protect_claimed`]).
    protect_claimed: std::sync::atomic::AtomicBool,
    /// Whether only owned partitions fire ([`Store::track_ownership`]); read without the
    /// firing lock, so that a store that owns everything answers `owns` for free.
    tracks_ownership: std::sync::atomic::AtomicBool,
    /// The counts of standby copies ([`copies`]). Locked after `writes` and `firing`.
    copies: Mutex<copies::Copies>,
    path: PathBuf,
}

impl Store {
    /// Opens (or creates) the store in `path`.
    ///
    /// # Errors
    /// [`StoreError::Open`] when RocksDB cannot open the directory (locked by another process,
    /// permissions, corruption), [`StoreError::Corrupt`] when its metadata or counts cannot be
    /// read, [`StoreError::Io`] when the counts of an older data directory cannot be written.
    pub fn open(path: &Path, options: StoreOptions) -> Result<Self> {
        let mut db_opts = Options::default();
        db_opts.create_if_missing(true);
        db_opts.create_missing_column_families(true);
        db_opts.set_max_background_jobs(2);
        db_opts.set_keep_log_file_num(4);
        let cfs = column::ALL.map(|name| {
            let mut opts = Options::default();
            if name == column::Records::NAME {
                opts.set_compression_type(rocksdb::DBCompressionType::Lz4);
                // Records are read by key when they fire. Keys of every partition arrive
                // interleaved, so each table file not yet compacted spans all of them: a
                // filter lets a read skip the files without its key. None on the last level,
                // which holds most records and is where a read ends anyway.
                let mut table = rocksdb::BlockBasedOptions::default();
                table.set_bloom_filter(10.0, false);
                opts.set_block_based_table_factory(&table);
                opts.set_optimize_filters_for_hits(true);
            }
            ColumnFamilyDescriptor::new(name, opts)
        });
        let db =
            DB::open_cf_descriptors(&db_opts, path, cfs).map_err(|source| StoreError::Open {
                path: path.to_owned(),
                source,
            })?;
        let store = Self {
            db,
            wal: wal::WalSync::new(options.sync, wal::DEFERRED_SYNC),
            writes: Mutex::new(PendingStats::default()),
            due_garbage: Mutex::default(),
            firing: Mutex::new(fire::Firing::new(options.keep_bytes)),
            partitions: RwLock::default(),
            pending: AtomicI64::new(0),
            low_water: AtomicU64::new(0),
            changes: AtomicU64::new(0),
            keep_within_ms: options.keep_within_ms,
            protect_claimed: std::sync::atomic::AtomicBool::new(false),
            tracks_ownership: std::sync::atomic::AtomicBool::new(false),
            copies: Mutex::default(),
            path: path.to_owned(),
        };
        store.load_partitions()?;
        let started = Instant::now();
        let (pending, scanned) = store.restore_counts()?;
        tracing::info!(
            pending,
            scanned,
            seconds = format!("{:.3}", started.elapsed().as_secs_f64()),
            "pending counts restored"
        );
        Ok(store)
    }

    /// The data directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The handle of column `C`.
    fn cf<C: Column>(&self) -> &ColumnFamily {
        self.cf_named(C::NAME)
    }

    fn cf_named(&self, name: &str) -> &ColumnFamily {
        // Every column family is created in `open`; a missing one is a programming error.
        self.db
            .cf_handle(name)
            .unwrap_or_else(|| panic!("column family {name} was opened"))
    }

    /// An empty write batch.
    fn batch(&self) -> Batch<'_> {
        Batch::new(column::ALL.map(|name| self.cf_named(name)))
    }

    /// The value of `key` in column `C`.
    fn get_pinned<C: Column>(
        &self,
        key: &C::Key,
        op: &'static str,
    ) -> Result<Option<rocksdb::DBPinnableSlice<'_>>> {
        self.db.get_pinned_cf(self.cf::<C>(), key).map_err(io(op))
    }

    fn lock_writes(&self) -> std::sync::MutexGuard<'_, PendingStats> {
        self.writes.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_firing(&self) -> std::sync::MutexGuard<'_, fire::Firing> {
        self.firing.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_garbage(&self) -> std::sync::MutexGuard<'_, Vec<DueKey>> {
        self.due_garbage.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes `batch`, durable when it returns if `sync` is on: for writes whose loss would
    /// lose a record, an offset or an operator's change.
    fn write_required(&self, batch: Batch<'_>, op: &'static str) -> Result<()> {
        self.write(batch, self.wal.required(), op)
    }

    /// Writes `batch` whose loss in a power failure only repeats deliveries (see [`wal`]).
    fn write_deferred(&self, batch: Batch<'_>, op: &'static str) -> Result<()> {
        self.write(batch, self.wal.due(Instant::now()), op)
    }

    fn write(&self, batch: Batch<'_>, sync: bool, op: &'static str) -> Result<()> {
        let mut opts = WriteOptions::default();
        opts.set_sync(sync);
        if sync {
            self.wal.syncing();
        }
        if let Err(e) = self.db.write_opt(batch.into_inner(), &opts) {
            if sync {
                self.wal.failed();
            }
            return Err(io(op)(e));
        }
        self.wal.written(sync, Instant::now());
        Ok(())
    }

    /// Pending counts by target and due bucket, as of `now_ms`.
    pub fn pending_stats(&self, now_ms: u64) -> Snapshot {
        self.lock_writes().snapshot(now_ms)
    }

    /// Records pending: restored at open, then counted with every write.
    pub fn pending(&self) -> u64 {
        self.pending.load(Ordering::Relaxed).max(0) as u64
    }

    /// Flushes the WAL and every column family's memtable (called on clean shutdown), so the
    /// next open has no log to replay.
    ///
    /// # Errors
    /// A flush failure.
    pub fn flush(&self) -> Result<()> {
        self.delete_gathered_locked();
        self.db.flush_wal(true).map_err(io("WAL flush"))?;
        let cfs = column::ALL.map(|name| self.cf_named(name));
        self.db
            .flush_cfs_opt(&cfs, &rocksdb::FlushOptions::default())
            .map_err(io("flush"))
    }

    /// Bytes on disk (SST files) plus in memtables, over every column family.
    pub fn size_bytes(&self) -> u64 {
        column::ALL
            .iter()
            .flat_map(|cf| {
                [
                    "rocksdb.total-sst-files-size",
                    "rocksdb.cur-size-all-mem-tables",
                ]
                .map(|p| {
                    self.db
                        .property_int_value_cf(self.cf_named(cf), p)
                        .ok()
                        .flatten()
                })
            })
            .map(Option::unwrap_or_default)
            .sum()
    }

    /// Whether RocksDB currently stops writes (a write stall), and its delayed write rate in
    /// bytes/s while it slows them (0 when not).
    pub fn write_stall(&self) -> (bool, u64) {
        let stopped = self.int_property("rocksdb.is-write-stopped").unwrap_or(0) > 0;
        let rate = self
            .int_property("rocksdb.actual-delayed-write-rate")
            .unwrap_or(0);
        (stopped, rate)
    }

    /// A RocksDB property of the default column family, as an integer, for metrics.
    pub fn int_property(&self, name: &str) -> Option<u64> {
        self.db.property_int_value(name).ok().flatten()
    }
}

#[cfg(test)]
mod tests;
