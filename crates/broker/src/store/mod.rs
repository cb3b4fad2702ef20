//! Durable state in RocksDB: pending records, the due-time index, ids, source offsets and pending
//! counts. `write.rs` holds the write paths, `read.rs` the reads.
//!
//! # Durability contract
//! Ingest: decode -> **one write batch** (records + due index + ids + the source offset) ->
//! then the Kafka offset is stored for commit -> then the record goes into the wheel. A crash
//! before the batch loses nothing (Kafka redelivers); a crash after it loses nothing and ingests
//! nothing twice (the stored offset is where consumption resumes, and the ingest loop skips
//! anything below it); the wheel is rebuilt from the due index at start.
//!
//! Fire: read the record -> produce -> delivery report -> **one delete batch** (record, id
//! mapping if it still points at this record, counts; its due-index entry is gathered, below). A
//! crash between the delivery report and the delete publishes the record again after restart:
//! delivery is at-least-once, and the duplicates after a crash are bounded by the records in
//! flight.
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
//! gathered over many deliveries, so that adjacent ones go as one range tombstone
//! ([`Store::remove_delivered`]). Every read of the index whose answer anyone sees deletes the
//! gathered ones first; after a crash the ones left behind are loaded, find no record, and are
//! skipped and gathered again.
//!
//! The delete after fire checks that each record is still there and at which due time (a cancel
//! or a replacement may have removed it while it was being delivered, an operator may have moved
//! it) only when one of those happened since the records were read: the store counts them
//! ([`Store::changes`]), and the publisher claims each record before reading it, so no other
//! delete after delivery can remove it meanwhile.

pub mod codec;
pub mod near;
mod read;
pub mod stats;
pub mod wal;
mod write;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::Instant;

use rocksdb::{ColumnFamilyDescriptor, Options, WriteBatch, WriteOptions, DB};

pub use codec::{due_key_after, Pid, RecordId, StoredRecord};
use codec::{partition_key, split_due_key, split_partition_key};
use stats::{PendingStats, Snapshot};

const CF_RECORDS: &str = "records";
const CF_DUE: &str = "due";
const CF_IDS: &str = "ids";
const CF_OFFSETS: &str = "offsets";
const CF_META: &str = "meta";
/// Pending counts by target and due minute (see [`stats`]), changed in every write batch.
const CF_COUNTS: &str = "counts";
/// In `meta`: present once `counts` has been written by a full recount and kept since.
const COUNTS_KEPT: &[u8] = b"counts-kept";
/// Every column family.
const ALL_CFS: [&str; 6] = [CF_RECORDS, CF_DUE, CF_IDS, CF_OFFSETS, CF_META, CF_COUNTS];

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
    /// fire ([`near`]); see [`Store::apply_at`].
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

/// One step of an ingest batch: what a consumed record does to the state.
#[derive(Debug, Clone)]
pub enum IngestOp {
    /// Store a record to publish later (replacing the pending one with the same id).
    Schedule {
        /// Source partition.
        pid: Pid,
        /// Source offset.
        offset: i64,
        /// What to publish and when.
        schedule: StoredRecord,
    },
    /// Remove the pending record with this id.
    Cancel {
        /// Source partition.
        pid: Pid,
        /// Source offset.
        offset: i64,
        /// The id.
        id: Vec<u8>,
    },
    /// Nothing to store (the record was dead-lettered); only the offset advances.
    Skip {
        /// Source partition.
        pid: Pid,
        /// Source offset.
        offset: i64,
    },
}

impl IngestOp {
    fn position(&self) -> (Pid, i64) {
        match self {
            IngestOp::Schedule { pid, offset, .. }
            | IngestOp::Cancel { pid, offset, .. }
            | IngestOp::Skip { pid, offset } => (*pid, *offset),
        }
    }
}

/// Where a listing of the due index starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Position {
    /// The first record due at or after this time.
    Due(u64),
    /// This record (a position returned by [`Store::list`]).
    At(u64, RecordId),
}

/// The due time and id of the due-index entry under `iter`.
fn due_entry_key(iter: &rocksdb::DBRawIterator<'_>) -> Result<(u64, RecordId)> {
    let key = iter.key().unwrap_or_default();
    split_due_key(key).ok_or_else(|| StoreError::Corrupt {
        what: "due",
        detail: format!("key of {} bytes", key.len()),
    })
}

/// The target topic stored with the due-index entry under `iter`.
fn due_entry_target(iter: &rocksdb::DBRawIterator<'_>) -> String {
    String::from_utf8_lossy(iter.value().unwrap_or_default()).into_owned()
}

/// A page of a listing: (due, id, target) triples and where the next page starts.
pub type Page = (Vec<(u64, RecordId, String)>, Option<Position>);

/// What an ingest batch changed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Applied {
    /// New pending records to put in the wheel, as (due, id).
    pub inserted: Vec<(u64, RecordId)>,
    /// Pending records replaced by a newer one with the same id.
    pub replaced: usize,
    /// Pending records cancelled.
    pub cancelled: usize,
    /// Cancels whose id had nothing pending.
    pub cancel_missed: usize,
}

#[derive(Debug, Default)]
struct Partitions {
    by_name: HashMap<(String, i32), Pid>,
    by_pid: Vec<(String, i32)>,
}

/// The RocksDB store. Thread-safe; share it in an `Arc`.
#[derive(Debug)]
pub struct Store {
    db: DB,
    /// Which writes fsync the write-ahead log.
    wal: wal::WalSync,
    /// Serialises read-check-write sequences (see the module doc), and guards the counts.
    mutex: Mutex<PendingStats>,
    partitions: RwLock<Partitions>,
    /// Records in the `records` column (exact: every change is counted under the mutex).
    pending: AtomicI64,
    /// No due-index entry lies below this due time (changed under `mutex`): the head seek starts
    /// here, so it never walks over the tombstones of records already fired.
    low_water: AtomicU64,
    /// Pending records deleted or moved by anything but a delete after delivery (cancels,
    /// replacements, operators' cancels and moves), counted under `mutex` once written. Records
    /// read while it had some value, and claimed for publishing so that nothing else deletes
    /// them after delivery, are all still there while it has that value: see
    /// [`Store::remove_delivered`].
    changes: AtomicU64,
    /// Due-index keys of records the delete after delivery removed, not deleted yet: they are
    /// gathered (up to `GATHER_DUE_DELETES`) and deleted together, so that adjacent ones go as
    /// one range tombstone instead of a point tombstone each (delivery reports arrive per
    /// target partition, whose records are every n-th in due order). Locked after `mutex` where
    /// both are taken. Lost in a crash: those entries then stay in the index, are loaded at
    /// start, find no record and are gathered again ([`Store::forget_due`]).
    due_garbage: Mutex<Vec<[u8; 16]>>,
    /// Records due soon, in memory as well (see [`near`]). Locked after `mutex` where both are
    /// taken; the read before publishing takes only this one.
    near: Mutex<near::Near>,
    /// [`StoreOptions::keep_within_ms`].
    keep_within_ms: u64,
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
        let mut records = Options::default();
        records.set_compression_type(rocksdb::DBCompressionType::Lz4);
        let cfs = vec![
            ColumnFamilyDescriptor::new(CF_RECORDS, records),
            ColumnFamilyDescriptor::new(CF_DUE, Options::default()),
            ColumnFamilyDescriptor::new(CF_IDS, Options::default()),
            ColumnFamilyDescriptor::new(CF_OFFSETS, Options::default()),
            ColumnFamilyDescriptor::new(CF_META, Options::default()),
            ColumnFamilyDescriptor::new(CF_COUNTS, Options::default()),
        ];
        let db =
            DB::open_cf_descriptors(&db_opts, path, cfs).map_err(|source| StoreError::Open {
                path: path.to_owned(),
                source,
            })?;
        let store = Self {
            db,
            wal: wal::WalSync::new(options.sync, wal::DEFERRED_SYNC),
            mutex: Mutex::new(PendingStats::default()),
            partitions: RwLock::new(Partitions::default()),
            pending: AtomicI64::new(0),
            low_water: AtomicU64::new(0),
            changes: AtomicU64::new(0),
            due_garbage: Mutex::default(),
            near: Mutex::new(near::Near::new(options.keep_bytes)),
            keep_within_ms: options.keep_within_ms,
            path: path.to_owned(),
        };
        store.load_partitions()?;
        let started = std::time::Instant::now();
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

    /// Writes `batch`, durable when it returns if `sync` is on: for writes whose loss would
    /// lose a record, an offset or an operator's change.
    fn write_required(&self, batch: WriteBatch, op: &'static str) -> Result<()> {
        self.write(batch, self.wal.required(), op)
    }

    /// Writes `batch` whose loss in a power failure only repeats deliveries (see [`wal`]).
    fn write_deferred(&self, batch: WriteBatch, op: &'static str) -> Result<()> {
        self.write(batch, self.wal.due(Instant::now()), op)
    }

    fn write(&self, batch: WriteBatch, sync: bool, op: &'static str) -> Result<()> {
        let mut opts = WriteOptions::default();
        opts.set_sync(sync);
        if sync {
            self.wal.syncing();
        }
        if let Err(e) = self.db.write_opt(batch, &opts) {
            if sync {
                self.wal.failed();
            }
            return Err(io(op)(e));
        }
        self.wal.written(sync, Instant::now());
        Ok(())
    }

    /// Whether a delete after delivery is still waiting for an fsync (only with `sync` on).
    pub fn sync_owed(&self) -> bool {
        self.wal.owed()
    }

    /// Syncs the write-ahead log if a delete after delivery went without it: the publisher
    /// calls it when its deliveries pause, so that a power failure after a burst does not
    /// deliver the burst's last records again.
    ///
    /// # Errors
    /// The fsync failed; the debt stays.
    pub fn sync_deferred(&self) -> Result<()> {
        if self.wal.owed() {
            self.wal.syncing();
            if let Err(e) = self.db.flush_wal(true) {
                self.wal.failed();
                return Err(io("write-ahead log sync")(e));
            }
            self.wal.written(true, Instant::now());
        }
        Ok(())
    }

    fn cf(&self, name: &str) -> &rocksdb::ColumnFamily {
        // Every column family is created in `open`; a missing one is a programming error.
        self.db
            .cf_handle(name)
            .unwrap_or_else(|| panic!("column family {name} was opened"))
    }

    fn load_partitions(&self) -> Result<()> {
        let mut parts = self.partitions.write().unwrap_or_else(|e| e.into_inner());
        let mut found: Vec<(Pid, String, i32)> = Vec::new();
        for item in self.db.prefix_iterator_cf(self.cf(CF_META), b"p") {
            let (k, v) = item.map_err(io("meta scan"))?;
            if !k.starts_with(b"p") {
                break;
            }
            let corrupt = |detail: &str| StoreError::Corrupt {
                what: "meta",
                detail: detail.to_owned(),
            };
            let (topic, partition) =
                split_partition_key(&k).ok_or_else(|| corrupt("bad partition key"))?;
            let pid = Pid::from_be_bytes(
                v.as_ref()
                    .try_into()
                    .map_err(|_| corrupt("bad partition id"))?,
            );
            found.push((pid, topic, partition));
        }
        found.sort();
        for (i, (pid, topic, partition)) in found.into_iter().enumerate() {
            if usize::from(pid) != i {
                return Err(StoreError::Corrupt {
                    what: "meta",
                    detail: format!("partition ids are not dense at {pid}"),
                });
            }
            parts.by_name.insert((topic.clone(), partition), pid);
            parts.by_pid.push((topic, partition));
        }
        Ok(())
    }

    /// The id of a source partition, allocated (durably) on first sight.
    ///
    /// # Errors
    /// [`StoreError::TooManyPartitions`] past 65,536 partitions, or a write failure.
    pub fn partition_id(&self, topic: &str, partition: i32) -> Result<Pid> {
        let name = (topic.to_owned(), partition);
        if let Some(pid) = self
            .partitions
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .by_name
            .get(&name)
        {
            return Ok(*pid);
        }
        let mut parts = self.partitions.write().unwrap_or_else(|e| e.into_inner());
        if let Some(pid) = parts.by_name.get(&name) {
            return Ok(*pid);
        }
        let pid = Pid::try_from(parts.by_pid.len()).map_err(|_| StoreError::TooManyPartitions {
            topic: topic.to_owned(),
            partition,
        })?;
        let mut opts = WriteOptions::default();
        opts.set_sync(true);
        self.db
            .put_cf_opt(
                self.cf(CF_META),
                partition_key(topic, partition),
                pid.to_be_bytes(),
                &opts,
            )
            .map_err(io("meta write"))?;
        parts.by_name.insert(name.clone(), pid);
        parts.by_pid.push(name);
        Ok(pid)
    }

    /// The (topic, partition) of a partition id.
    pub fn partition_of(&self, pid: Pid) -> Option<(String, i32)> {
        self.with_partition(pid, |topic, partition| (topic.to_owned(), partition))
    }

    /// `f(topic, partition)` of a partition id, with the topic read in place (no copy).
    pub fn with_partition<R>(&self, pid: Pid, f: impl FnOnce(&str, i32) -> R) -> Option<R> {
        let parts = self.partitions.read().unwrap_or_else(|e| e.into_inner());
        let (topic, partition) = parts.by_pid.get(usize::from(pid))?;
        Some(f(topic, *partition))
    }

    /// The id of a source partition already seen, without allocating one.
    pub fn lookup_partition(&self, topic: &str, partition: i32) -> Option<Pid> {
        self.partitions
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .by_name
            .get(&(topic.to_owned(), partition))
            .copied()
    }

    /// The next offset to ingest of one source partition, if one is stored.
    ///
    /// # Errors
    /// A read failure or a corrupt entry.
    pub fn next_offset(&self, pid: Pid) -> Result<Option<i64>> {
        let Some(v) = self
            .db
            .get_pinned_cf(self.cf(CF_OFFSETS), pid.to_be_bytes())
            .map_err(io("offset read"))?
        else {
            return Ok(None);
        };
        let bytes = <[u8; 8]>::try_from(v.as_ref()).map_err(|_| StoreError::Corrupt {
            what: "offsets",
            detail: "value is not 8 bytes".into(),
        })?;
        Ok(Some(i64::from_be_bytes(bytes)))
    }

    /// The next offset to ingest for each source partition that has one stored.
    ///
    /// # Errors
    /// A read failure or a corrupt entry.
    pub fn next_offsets(&self) -> Result<HashMap<Pid, i64>> {
        let mut out = HashMap::new();
        for item in self
            .db
            .iterator_cf(self.cf(CF_OFFSETS), rocksdb::IteratorMode::Start)
        {
            let (k, v) = item.map_err(io("offsets scan"))?;
            let (Ok(pid), Ok(off)) = (
                <[u8; 2]>::try_from(k.as_ref()),
                <[u8; 8]>::try_from(v.as_ref()),
            ) else {
                return Err(StoreError::Corrupt {
                    what: "offsets",
                    detail: "bad key or value length".into(),
                });
            };
            out.insert(Pid::from_be_bytes(pid), i64::from_be_bytes(off));
        }
        Ok(out)
    }

    /// Pending counts by target and due bucket, as of `now_ms`.
    pub fn pending_stats(&self, now_ms: u64) -> Snapshot {
        self.mutex
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .snapshot(now_ms)
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
        let cfs: Vec<_> = ALL_CFS.iter().map(|name| self.cf(name)).collect();
        self.db
            .flush_cfs_opt(&cfs, &rocksdb::FlushOptions::default())
            .map_err(io("flush"))
    }

    /// Bytes on disk (SST files) plus in memtables, over every column family.
    pub fn size_bytes(&self) -> u64 {
        ALL_CFS
            .iter()
            .flat_map(|cf| {
                [
                    "rocksdb.total-sst-files-size",
                    "rocksdb.cur-size-all-mem-tables",
                ]
                .map(|p| self.db.property_int_value_cf(self.cf(cf), p).ok().flatten())
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
