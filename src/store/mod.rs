//! Durable state in RocksDB: pending records, the due-time index, ids, and source offsets.
//!
//! # Durability contract
//! Ingest: decode -> **one write batch** (records + due index + ids + the source offset) ->
//! then the Kafka offset is stored for commit -> then the record goes into the wheel. A crash
//! before the batch loses nothing (Kafka redelivers); a crash after it loses nothing and ingests
//! nothing twice (the stored offset is where consumption resumes, and the ingest loop skips
//! anything below it); the wheel is rebuilt from the due index at start.
//!
//! Fire: read the record -> produce -> delivery report -> **one delete batch** (record, due-index
//! entry, id mapping if it still points at this record). A crash between the delivery report and
//! the delete publishes the record again after restart: delivery is at-least-once, and the
//! duplicates after a crash are bounded by the records in flight.
//!
//! Cleanup: a record, its due-index entry and its id mapping are deleted together when it fires,
//! is cancelled or is replaced, so no column grows without bound; `offsets` and `meta` hold one
//! entry per source partition.
//!
//! Every read-check-write (reschedule, cancel, delete after fire) runs under one mutex, so a
//! reschedule arriving while the old record fires can never lose the new id mapping.

pub mod codec;
pub mod stats;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};

use rocksdb::{ColumnFamilyDescriptor, Options, ReadOptions, WriteBatch, WriteOptions, DB};

use crate::record::Schedule;
use codec::{
    due_key, id_key, id_value, partition_key, split_due_key, split_id_value, split_partition_key,
};
pub use codec::{due_key_after, Pid, RecordId, StoredRecord};
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
    /// fsync the write-ahead log on every write batch (each batch is a group of records).
    pub sync: bool,
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
        schedule: Schedule,
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
    /// fsync the WAL on every write batch.
    sync: bool,
    /// Serialises read-check-write sequences (see the module doc), and guards the counts.
    mutex: Mutex<PendingStats>,
    partitions: RwLock<Partitions>,
    /// Records in the `records` column (exact: every change is counted under the mutex).
    pending: AtomicI64,
    /// No due-index entry lies below this due time (changed under `mutex`): the head seek starts
    /// here, so it never walks over the tombstones of records already fired.
    low_water: AtomicU64,
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
            sync: options.sync,
            mutex: Mutex::new(PendingStats::default()),
            partitions: RwLock::new(Partitions::default()),
            pending: AtomicI64::new(0),
            low_water: AtomicU64::new(0),
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

    fn write_opts(&self) -> WriteOptions {
        let mut opts = WriteOptions::default();
        opts.set_sync(self.sync);
        opts
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
        self.partitions
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .by_pid
            .get(usize::from(pid))
            .cloned()
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

    /// Applies the effects of a group of consumed records in one write batch, together with the
    /// next offset of every source partition in it (group commit: one fsync when `sync` is on).
    ///
    /// # Errors
    /// A read or write failure; nothing is written then.
    pub fn apply(&self, ops: Vec<IngestOp>) -> Result<Applied> {
        let mut stats = self.mutex.lock().unwrap_or_else(|e| e.into_inner());
        // Counts change only once the batch is written: (target, due, added).
        let mut counted: Vec<(String, u64, bool)> = Vec::new();
        let mut new_targets: HashMap<RecordId, String> = HashMap::new();
        let mut batch = WriteBatch::default();
        let mut applied = Applied::default();
        let mut overlay: HashMap<Vec<u8>, Option<(RecordId, u64)>> = HashMap::new();
        let mut next: HashMap<Pid, i64> = HashMap::new();
        let mut delta: i64 = 0;
        for op in ops {
            let (pid, offset) = op.position();
            let entry = next.entry(pid).or_insert(offset + 1);
            *entry = (*entry).max(offset + 1);
            match op {
                IngestOp::Skip { .. } => {}
                IngestOp::Schedule { schedule, .. } => {
                    let rid = self.record_id(pid, offset)?;
                    let due = schedule.due_ms;
                    if let Some(id) = &schedule.id {
                        let key = id_key(pid, id);
                        if let Some((old, old_due)) = self.lookup_id(&overlay, &key)? {
                            let target = self.target_of(&new_targets, old, old_due)?;
                            counted.push((target, old_due, false));
                            batch.delete_cf(self.cf(CF_RECORDS), old.to_bytes());
                            batch.delete_cf(self.cf(CF_DUE), due_key(old_due, old));
                            applied.replaced += 1;
                            delta -= 1;
                        }
                        batch.put_cf(self.cf(CF_IDS), &key, id_value(rid, due));
                        overlay.insert(key, Some((rid, due)));
                    }
                    let stored = StoredRecord {
                        due_ms: due,
                        target: schedule.target,
                        id: schedule.id,
                        key: schedule.key,
                        value: schedule.value,
                        headers: schedule.headers,
                    };
                    batch.put_cf(self.cf(CF_RECORDS), rid.to_bytes(), stored.encode());
                    batch.put_cf(self.cf(CF_DUE), due_key(due, rid), stored.target.as_bytes());
                    counted.push((stored.target.clone(), due, true));
                    new_targets.insert(rid, stored.target);
                    applied.inserted.push((due, rid));
                    delta += 1;
                }
                IngestOp::Cancel { id, .. } => {
                    let key = id_key(pid, &id);
                    match self.lookup_id(&overlay, &key)? {
                        Some((old, old_due)) => {
                            let target = self.target_of(&new_targets, old, old_due)?;
                            counted.push((target, old_due, false));
                            batch.delete_cf(self.cf(CF_RECORDS), old.to_bytes());
                            batch.delete_cf(self.cf(CF_DUE), due_key(old_due, old));
                            batch.delete_cf(self.cf(CF_IDS), &key);
                            applied.cancelled += 1;
                            delta -= 1;
                        }
                        None => applied.cancel_missed += 1,
                    }
                    overlay.insert(key, None);
                }
            }
        }
        for (pid, offset) in next {
            batch.put_cf(self.cf(CF_OFFSETS), pid.to_be_bytes(), offset.to_be_bytes());
        }
        self.put_counts(
            &mut batch,
            &stats,
            counted
                .iter()
                .map(|(t, due, added)| (t.as_str(), *due, *added)),
        );
        self.db
            .write_opt(batch, &self.write_opts())
            .map_err(io("ingest write"))?;
        self.pending.fetch_add(delta, Ordering::Relaxed);
        if let Some(&(first, _)) = applied.inserted.iter().min() {
            self.low_water.fetch_min(first, Ordering::Relaxed);
        }
        for (target, due, added) in counted {
            if added {
                stats.add(&target, due);
            } else {
                stats.remove(&target, due);
            }
        }
        Ok(applied)
    }

    /// The target of a pending record: from this batch, or from its due-index entry.
    fn target_of(
        &self,
        in_batch: &HashMap<RecordId, String>,
        rid: RecordId,
        due: u64,
    ) -> Result<String> {
        if let Some(t) = in_batch.get(&rid) {
            return Ok(t.clone());
        }
        let v = self
            .db
            .get_pinned_cf(self.cf(CF_DUE), due_key(due, rid))
            .map_err(io("due read"))?;
        Ok(v.map(|v| String::from_utf8_lossy(&v).into_owned())
            .unwrap_or_default())
    }

    fn record_id(&self, pid: Pid, offset: i64) -> Result<RecordId> {
        RecordId::new(pid, offset).ok_or_else(|| {
            let (topic, partition) = self.partition_of(pid).unwrap_or_default();
            StoreError::OffsetRange {
                topic,
                partition,
                offset,
            }
        })
    }

    fn lookup_id(
        &self,
        overlay: &HashMap<Vec<u8>, Option<(RecordId, u64)>>,
        key: &[u8],
    ) -> Result<Option<(RecordId, u64)>> {
        if let Some(v) = overlay.get(key) {
            return Ok(*v);
        }
        let Some(v) = self
            .db
            .get_pinned_cf(self.cf(CF_IDS), key)
            .map_err(io("id read"))?
        else {
            return Ok(None);
        };
        split_id_value(&v).map(Some).ok_or(StoreError::Corrupt {
            what: "ids",
            detail: "value is not 16 bytes".into(),
        })
    }

    /// Reads pending records; `None` for one that was cancelled, replaced or already fired.
    ///
    /// # Errors
    /// A read failure or an undecodable record.
    pub fn get(&self, ids: &[RecordId]) -> Result<Vec<Option<StoredRecord>>> {
        let keys: Vec<[u8; 8]> = ids.iter().map(|id| id.to_bytes()).collect();
        self.db
            .batched_multi_get_cf(self.cf(CF_RECORDS), keys.iter(), false)
            .into_iter()
            .map(|r| match r.map_err(io("record read"))? {
                None => Ok(None),
                Some(bytes) => {
                    StoredRecord::decode(&bytes)
                        .map(Some)
                        .map_err(|detail| StoreError::Corrupt {
                            what: "records",
                            detail,
                        })
                }
            })
            .collect()
    }

    /// Deletes records that were delivered (or dead-lettered), in one batch. A record already
    /// gone (replaced or cancelled meanwhile) is skipped; an id mapping is deleted only while it
    /// still points at the deleted record.
    ///
    /// # Errors
    /// A read or write failure; nothing is deleted then.
    pub fn remove_fired(&self, fired: &[(RecordId, &StoredRecord)]) -> Result<usize> {
        let mut stats = self.mutex.lock().unwrap_or_else(|e| e.into_inner());
        // Which records are still there, and where their id mappings point: two batched reads
        // under the lock, not two point reads per record.
        let keys: Vec<[u8; 8]> = fired.iter().map(|(rid, _)| rid.to_bytes()).collect();
        let exists = self
            .db
            .batched_multi_get_cf(self.cf(CF_RECORDS), keys.iter(), false)
            .into_iter()
            .map(|r| r.map(|v| v.is_some()).map_err(io("record read")))
            .collect::<Result<Vec<bool>>>()?;
        let id_keys: Vec<(usize, Vec<u8>)> = fired
            .iter()
            .enumerate()
            .filter(|&(i, _)| exists[i])
            .filter_map(|(i, (rid, rec))| rec.id.as_ref().map(|id| (i, id_key(rid.pid(), id))))
            .collect();
        let mapped: HashMap<usize, bool> = id_keys
            .iter()
            .zip(self.db.batched_multi_get_cf(
                self.cf(CF_IDS),
                id_keys.iter().map(|(_, k)| k),
                false,
            ))
            .map(|((i, _), v)| {
                let v = v.map_err(io("id read"))?;
                let rid = fired[*i].0;
                let to_this = v
                    .as_deref()
                    .and_then(split_id_value)
                    .is_some_and(|(m, _)| m == rid);
                Ok((*i, to_this))
            })
            .collect::<Result<_>>()?;
        let mut counted: Vec<(&str, u64)> = Vec::new();
        let mut batch = WriteBatch::default();
        let mut removed = 0usize;
        let mut seen = std::collections::HashSet::with_capacity(fired.len());
        for (i, (rid, rec)) in fired.iter().enumerate() {
            if !exists[i] || !seen.insert(*rid) {
                continue;
            }
            batch.delete_cf(self.cf(CF_RECORDS), keys[i]);
            batch.delete_cf(self.cf(CF_DUE), due_key(rec.due_ms, *rid));
            if mapped.get(&i).copied().unwrap_or(false) {
                if let Some(id) = &rec.id {
                    batch.delete_cf(self.cf(CF_IDS), id_key(rid.pid(), id));
                }
            }
            counted.push((&rec.target, rec.due_ms));
            removed += 1;
        }
        if removed > 0 {
            self.put_counts(
                &mut batch,
                &stats,
                counted.iter().map(|&(t, due)| (t, due, false)),
            );
            self.db
                .write_opt(batch, &self.write_opts())
                .map_err(io("delete write"))?;
            self.pending.fetch_sub(removed as i64, Ordering::Relaxed);
            for (target, due) in counted {
                stats.remove(target, due);
            }
        }
        Ok(removed)
    }

    /// Adds to `batch` the new value of every persisted count that `changes` (target, due,
    /// added) touch, computed from `stats` (the counts before the batch; they are updated once
    /// the batch is written).
    fn put_counts<'a>(
        &self,
        batch: &mut WriteBatch,
        stats: &PendingStats,
        changes: impl IntoIterator<Item = (&'a str, u64, bool)>,
    ) {
        for (key, n) in stats.persisted_after(changes) {
            if n == 0 {
                batch.delete_cf(self.cf(CF_COUNTS), key);
            } else {
                batch.put_cf(self.cf(CF_COUNTS), key, n.to_be_bytes());
            }
        }
    }

    /// Restores the pending counts (at open) and returns how many records are pending, with
    /// whether that took a scan. The counts are read back from the `counts` column when they
    /// have been kept there; otherwise (a data directory written before counts were kept)
    /// every pending record is counted with [`Store::scan_due`] and the counts are written,
    /// so the next start reads them.
    ///
    /// # Errors
    /// A read or write failure, or corrupt counts.
    fn restore_counts(&self) -> Result<(u64, bool)> {
        let kept = self
            .db
            .get_pinned_cf(self.cf(CF_META), COUNTS_KEPT)
            .map_err(io("meta read"))?
            .is_some();
        if !kept {
            let count = self.scan_due(|_, _| {})?;
            let stats = self.mutex.lock().unwrap_or_else(|e| e.into_inner());
            let mut batch = WriteBatch::default();
            batch.delete_range_cf(self.cf(CF_COUNTS), [0u8].as_slice(), [0xffu8; 9].as_slice());
            for (key, n) in stats.persisted() {
                batch.put_cf(self.cf(CF_COUNTS), key, n.to_be_bytes());
            }
            batch.put_cf(self.cf(CF_META), COUNTS_KEPT, b"1");
            self.db
                .write_opt(batch, &self.write_opts())
                .map_err(io("counts write"))?;
            return Ok((count, true));
        }
        let mut stats = self.mutex.lock().unwrap_or_else(|e| e.into_inner());
        let entries = self
            .db
            .iterator_cf(self.cf(CF_COUNTS), rocksdb::IteratorMode::Start)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(io("counts read"))?;
        *stats = PendingStats::load(entries).map_err(|detail| StoreError::Corrupt {
            what: "counts",
            detail,
        })?;
        let count = stats.total();
        self.pending.store(count as i64, Ordering::Relaxed);
        // Exact to the minute, and never above the earliest pending record: a valid low-water
        // mark.
        self.low_water.store(
            stats.first_minute_ms().unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        Ok((count, false))
    }

    /// Calls `f(due, id)` for every pending record in due-time order (one ordered scan of the
    /// due index) and returns how many there were. Also sets the pending count, the counts by
    /// target and due time, and the low-water mark.
    ///
    /// # Errors
    /// A read failure or a corrupt index key.
    pub fn scan_due(&self, mut f: impl FnMut(u64, RecordId)) -> Result<u64> {
        let mut stats = self.mutex.lock().unwrap_or_else(|e| e.into_inner());
        stats.clear();
        let mut iter = self.db.raw_iterator_cf(self.cf(CF_DUE));
        iter.seek_to_first();
        let mut count = 0u64;
        let mut first = None;
        while iter.valid() {
            let (due, rid) = due_entry_key(&iter)?;
            first.get_or_insert(due);
            stats.add(&due_entry_target(&iter), due);
            f(due, rid);
            count += 1;
            iter.next();
        }
        iter.status().map_err(io("due scan"))?;
        self.pending.store(count as i64, Ordering::Relaxed);
        self.low_water
            .store(first.unwrap_or(u64::MAX), Ordering::Relaxed);
        Ok(count)
    }

    /// Pending records in due order, starting at `from`, up to due time `until_ms`: at most
    /// `limit` of those for which `keep(due, target)` holds, examining at most `budget` index
    /// entries. Returns (due, id, target) triples and where to go on from (`None`: no more).
    ///
    /// # Errors
    /// A read failure or a corrupt index key.
    pub fn list(
        &self,
        from: Position,
        until_ms: u64,
        limit: usize,
        budget: usize,
        mut keep: impl FnMut(u64, &str) -> bool,
    ) -> Result<Page> {
        let mut iter = self.db.raw_iterator_cf(self.cf(CF_DUE));
        match from {
            Position::Due(d) => iter.seek(d.to_be_bytes()),
            Position::At(due, rid) => iter.seek(due_key(due, rid)),
        }
        let mut out = Vec::new();
        let mut examined = 0usize;
        while iter.valid() {
            let (due, rid) = due_entry_key(&iter)?;
            if due > until_ms {
                return Ok((out, None));
            }
            if out.len() == limit || examined == budget {
                return Ok((out, Some(Position::At(due, rid))));
            }
            examined += 1;
            let target = due_entry_target(&iter);
            if keep(due, &target) {
                out.push((due, rid, target));
            }
            iter.next();
        }
        iter.status().map_err(io("due scan"))?;
        Ok((out, None))
    }

    /// The pending records with `delay-id` `id`, one per source partition at most.
    ///
    /// # Errors
    /// A read failure.
    pub fn find_id(&self, id: &[u8]) -> Result<Vec<(u64, RecordId)>> {
        let pids = self
            .partitions
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .by_pid
            .len();
        let mut out = Vec::new();
        for pid in 0..pids {
            let key = id_key(pid as Pid, id);
            if let Some(v) = self
                .db
                .get_pinned_cf(self.cf(CF_IDS), &key)
                .map_err(io("id read"))?
            {
                if let Some((rid, due)) = split_id_value(&v) {
                    out.push((due, rid));
                }
            }
        }
        Ok(out)
    }

    /// Cancels one pending record (an operator's action). Returns it, `None` when it is not
    /// pending (fired, cancelled or replaced already).
    ///
    /// # Errors
    /// A read or write failure; nothing changes then.
    pub fn cancel(&self, rid: RecordId) -> Result<Option<StoredRecord>> {
        let mut stats = self.mutex.lock().unwrap_or_else(|e| e.into_inner());
        let Some(rec) = self.get(&[rid])?.pop().flatten() else {
            return Ok(None);
        };
        let mut batch = WriteBatch::default();
        batch.delete_cf(self.cf(CF_RECORDS), rid.to_bytes());
        batch.delete_cf(self.cf(CF_DUE), due_key(rec.due_ms, rid));
        self.unmap_id(&mut batch, rid, &rec, None)?;
        self.put_counts(
            &mut batch,
            &stats,
            [(rec.target.as_str(), rec.due_ms, false)],
        );
        self.db
            .write_opt(batch, &self.write_opts())
            .map_err(io("cancel write"))?;
        self.pending.fetch_sub(1, Ordering::Relaxed);
        stats.remove(&rec.target, rec.due_ms);
        Ok(Some(rec))
    }

    /// Moves one pending record to a new due time (an operator's action; "fire now" is a move
    /// to now). The wheel entry at the old time becomes stale and is skipped when it comes up;
    /// put `(due_ms, rid)` in the wheel. Returns the old due time, `None` when not pending.
    ///
    /// # Errors
    /// A read or write failure; nothing changes then.
    pub fn reschedule(&self, rid: RecordId, due_ms: u64) -> Result<Option<u64>> {
        let mut stats = self.mutex.lock().unwrap_or_else(|e| e.into_inner());
        let Some(mut rec) = self.get(&[rid])?.pop().flatten() else {
            return Ok(None);
        };
        let old = rec.due_ms;
        rec.due_ms = due_ms;
        let mut batch = WriteBatch::default();
        batch.put_cf(self.cf(CF_RECORDS), rid.to_bytes(), rec.encode());
        batch.delete_cf(self.cf(CF_DUE), due_key(old, rid));
        batch.put_cf(self.cf(CF_DUE), due_key(due_ms, rid), rec.target.as_bytes());
        self.unmap_id(&mut batch, rid, &rec, Some(due_ms))?;
        let target = rec.target.as_str();
        self.put_counts(
            &mut batch,
            &stats,
            [(target, old, false), (target, due_ms, true)],
        );
        self.db
            .write_opt(batch, &self.write_opts())
            .map_err(io("reschedule write"))?;
        stats.remove(&rec.target, old);
        stats.add(&rec.target, due_ms);
        self.low_water.fetch_min(due_ms, Ordering::Relaxed);
        Ok(Some(old))
    }

    /// Deletes the id mapping of `rid` (or points it at `new_due`) while it still maps to `rid`.
    fn unmap_id(
        &self,
        batch: &mut WriteBatch,
        rid: RecordId,
        rec: &StoredRecord,
        new_due: Option<u64>,
    ) -> Result<()> {
        let Some(id) = &rec.id else { return Ok(()) };
        let key = id_key(rid.pid(), id);
        let mapped = self
            .db
            .get_pinned_cf(self.cf(CF_IDS), &key)
            .map_err(io("id read"))?
            .and_then(|v| split_id_value(&v))
            .is_some_and(|(m, _)| m == rid);
        if mapped {
            match new_due {
                Some(due) => batch.put_cf(self.cf(CF_IDS), &key, id_value(rid, due)),
                None => batch.delete_cf(self.cf(CF_IDS), &key),
            }
        }
        Ok(())
    }

    /// Pending counts by target and due bucket, as of `now_ms`.
    pub fn pending_stats(&self, now_ms: u64) -> Snapshot {
        self.mutex
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .snapshot(now_ms)
    }

    /// The earliest due time pending: one seek at the head of the due index, bounded below by
    /// the low-water mark so that it does not walk over the tombstones of fired records.
    ///
    /// # Errors
    /// A read failure.
    pub fn earliest_due(&self) -> Result<Option<u64>> {
        let _writes = self.mutex.lock().unwrap_or_else(|e| e.into_inner());
        let low = self.low_water.load(Ordering::Relaxed);
        let first = self.first_due_from(low)?;
        if let Some(due) = first {
            self.low_water.store(due, Ordering::Relaxed);
        }
        Ok(first)
    }

    /// The first due time at or after `from` (a seek bounded below by `from`).
    ///
    /// # Errors
    /// A read failure.
    pub fn first_due_from(&self, from: u64) -> Result<Option<u64>> {
        let mut opts = ReadOptions::default();
        opts.set_iterate_lower_bound(from.to_be_bytes().to_vec());
        let mut iter = self.db.raw_iterator_cf_opt(self.cf(CF_DUE), opts);
        iter.seek_to_first();
        if !iter.valid() {
            iter.status().map_err(io("due seek"))?;
            return Ok(None);
        }
        Ok(iter.key().and_then(split_due_key).map(|(due, _)| due))
    }

    /// Due-index entries from `from` (inclusive) up to due time `until_ms` (exclusive), in
    /// order, at most `limit`: what the scheduler loads as its horizon advances. The iterator
    /// is bounded on both sides, so deleted entries outside the range are never visited.
    ///
    /// # Errors
    /// A read failure or a corrupt index key.
    pub fn due_range(
        &self,
        from: (u64, RecordId),
        until_ms: u64,
        limit: usize,
    ) -> Result<Vec<(u64, RecordId)>> {
        let mut out = Vec::new();
        if from.0 >= until_ms {
            return Ok(out);
        }
        let mut opts = ReadOptions::default();
        opts.set_iterate_lower_bound(due_key(from.0, from.1).to_vec());
        opts.set_iterate_upper_bound(until_ms.to_be_bytes().to_vec());
        let mut iter = self.db.raw_iterator_cf_opt(self.cf(CF_DUE), opts);
        iter.seek_to_first();
        while iter.valid() && out.len() < limit {
            out.push(due_entry_key(&iter)?);
            iter.next();
        }
        iter.status().map_err(io("due range"))?;
        Ok(out)
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
