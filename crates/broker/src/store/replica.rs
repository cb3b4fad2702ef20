//! The store as a replica of the changelog: which source partitions this store owns (only
//! those fire), the checkpoint of the changelog it reflects, restoring changelog entries into
//! it, and dropping a partition's state when it leaves.
//!
//! With a changelog, the local store is a cache of it. Every change reaches RocksDB before the
//! changelog, so the changelog below the checkpoint is reflected here; restoring from the
//! checkpoint onwards (the tail) re-applies entries that may be here already, which is why
//! [`Store::restore`] is idempotent: a record put twice is stored once, a record deleted twice
//! is deleted once.

use std::borrow::Cow;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::atomic::Ordering;

use kafka_delay_core::hashing::BuildMul;

use super::codec::{DueKey, IdKey, IdValue, MetaKey, NextOffset, PidKey, RecordKey};
use super::column::{Batch, Due, Ids, Meta, Offsets, Records};
use super::stats::Changes;
use super::{io, Result, Store, StoreError};
use kafka_delay_core::changelog::{Checkpoint, Restored};
use kafka_delay_core::id::{Pid, RecordId};
use kafka_delay_core::record::StoredRecord;

/// Which source partitions fire from this store.
#[derive(Debug)]
pub(super) enum Owned {
    /// Every partition (no changelog: the local store is the only copy).
    All,
    /// Only these, restored and not revoked, each with the stamp it was handed here with: the
    /// number of partitions handed here until then (`handed`, counting every time).
    Only {
        since: HashMap<Pid, u64, BuildMul>,
        handed: u64,
    },
}

impl Owned {
    /// Whether records of `pid` fire here.
    pub(super) fn contains(&self, pid: Pid) -> bool {
        match self {
            Owned::All => true,
            Owned::Only { since, .. } => since.contains_key(&pid),
        }
    }
}

/// Records dropped per write batch when a partition leaves.
const DROP_CHUNK: usize = 4_096;

/// A pending record as a restore batch knows it: one of the batch's own entries, or read
/// from RocksDB.
type Known<'a> = Option<Cow<'a, StoredRecord>>;

/// A restore batch being built.
struct Restoring<'a, 'db> {
    batch: Batch<'db>,
    counted: Changes<'a>,
    /// Records this batch has written (the entry) or deleted (`None`) so far.
    records: HashMap<RecordId, Option<&'a StoredRecord>, BuildMul>,
    /// Id mappings this batch has written or deleted so far.
    ids: HashMap<IdKey, Option<RecordId>>,
    delta: i64,
    forget: Vec<RecordId>,
    /// The earliest due time written.
    min_due: u64,
    /// No record of the partition with an offset above this is in RocksDB (a restore onto
    /// an empty partition): those need no read.
    absent_above: Option<i64>,
}

impl Store {
    /// From now on only the partitions handed to [`Store::own`] fire (a changelog is on).
    pub fn track_ownership(&self) {
        self.lock_firing().owned = Owned::Only {
            since: HashMap::default(),
            handed: 0,
        };
        self.tracks_ownership.store(true, Ordering::Release);
    }

    /// Whether records of `pid` may fire from this store.
    pub fn owns(&self, pid: Pid) -> bool {
        !self.tracks_ownership.load(Ordering::Acquire) || self.lock_firing().owned.contains(pid)
    }

    /// The stamp `pid` was handed to this store with ([`Store::own`]): `None` when it is not
    /// owned here (0 for every partition without a changelog). A partition revoked and handed
    /// here again has a later stamp than [`Store::ownership_now`] said before that.
    pub fn owned_since(&self, pid: Pid) -> Option<u64> {
        if !self.tracks_ownership.load(Ordering::Acquire) {
            return Some(0);
        }
        match &self.lock_firing().owned {
            Owned::All => Some(0),
            Owned::Only { since, .. } => since.get(&pid).copied(),
        }
    }

    /// The latest stamp a partition was handed here with: every partition owned now has one
    /// at most this, and any handed here from now on a greater one.
    pub fn ownership_now(&self) -> u64 {
        match &self.lock_firing().owned {
            Owned::All => 0,
            Owned::Only { handed, .. } => *handed,
        }
    }

    /// How many source partitions fire from this store (without a changelog: every one it
    /// has seen).
    pub fn owned_partitions(&self) -> usize {
        match &self.lock_firing().owned {
            Owned::All => self.partition_count(),
            Owned::Only { since, .. } => since.len(),
        }
    }

    /// The source partitions that fire from this store (without a changelog: none is
    /// tracked, and none is listed).
    pub fn owned_pids(&self) -> Vec<Pid> {
        match &self.lock_firing().owned {
            Owned::All => Vec::new(),
            Owned::Only { since, .. } => since.keys().copied().collect(),
        }
    }

    /// Records of `pid` fire from this store from now on (its restore is complete).
    pub fn own(&self, pid: Pid) {
        let mut firing = self.lock_firing();
        if let Owned::Only { since, handed } = &mut firing.owned {
            if let Entry::Vacant(e) = since.entry(pid) {
                *handed += 1;
                e.insert(*handed);
            }
        }
        self.forget_copy(pid);
    }

    /// Records of `pid` no longer fire from this store; returns how many of its records are
    /// claimed (being published) now. Wait with [`Store::claimed_in`] until none are.
    pub fn disown(&self, pid: Pid) -> usize {
        let mut firing = self.lock_firing();
        if let Owned::Only { since, .. } = &mut firing.owned {
            since.remove(&pid);
        }
        firing.claimed_of(pid)
    }

    /// How many records of `pid` are claimed for firing now.
    pub fn claimed_in(&self, pid: Pid) -> usize {
        self.lock_firing().claimed_of(pid)
    }

    /// The checkpoint of `pid`'s state, if it has one.
    ///
    /// # Errors
    /// A read failure or a corrupt entry.
    pub fn checkpoint(&self, pid: Pid) -> Result<Option<Checkpoint>> {
        let Some(v) = self.get_pinned::<Meta>(&MetaKey::checkpoint(pid), "checkpoint read")? else {
            return Ok(None);
        };
        Checkpoint::decode(&v)
            .map(Some)
            .ok_or_else(|| StoreError::Corrupt {
                what: "meta",
                detail: "checkpoint is not 16 bytes".into(),
            })
    }

    /// Records that the changelog below `at.changelog_next` is reflected here, and where
    /// ingest resumes. Not synced: losing it only makes the next restore read further back.
    ///
    /// # Errors
    /// A write failure.
    pub fn set_checkpoint(&self, pid: Pid, at: Checkpoint) -> Result<()> {
        let mut batch = self.batch();
        batch.put::<Meta>(&MetaKey::checkpoint(pid), &at.encode());
        self.write(batch, false, "checkpoint write")
    }

    /// Forgets every partition's checkpoint: the store is about to change without the
    /// changelog (`--no-changelog`), so what it holds no longer reflects any changelog position,
    /// and a later start with the changelog must take it in again. Synced.
    ///
    /// # Errors
    /// A write failure.
    pub fn forget_checkpoints(&self) -> Result<usize> {
        let mut batch = self.batch();
        let mut forgotten = 0;
        for pid in self.partitions_with_state() {
            if self.checkpoint(pid)?.is_some() {
                batch.delete::<Meta>(&MetaKey::checkpoint(pid));
                forgotten += 1;
            }
        }
        if forgotten > 0 {
            self.write(batch, true, "checkpoint removal")?;
        }
        Ok(forgotten)
    }

    /// Applies changelog entries of `pid`, in changelog order, in one write batch with the
    /// checkpoint `at`. Idempotent: entries this store applied before change nothing.
    ///
    /// `absent_above`: `Some(v)` when no record of `pid` above offset `v` is in the store (a
    /// restore onto an empty partition starts at `Some(-1)`), which spares those records a
    /// read; it is moved past every record put. `None` reads for every entry.
    ///
    /// Returns how many records the partition gained (less when it lost some).
    ///
    /// # Errors
    /// A read or write failure, or an offset out of range; nothing is written then (and
    /// `absent_above` is left as it was).
    pub fn restore(
        &self,
        pid: Pid,
        entries: &[Restored],
        at: Checkpoint,
        absent_above: &mut Option<i64>,
    ) -> Result<i64> {
        let mut stats = self.lock_writes();
        let mut r = Restoring {
            batch: self.batch(),
            counted: Changes::default(),
            records: HashMap::with_capacity_and_hasher(entries.len(), BuildMul::default()),
            ids: HashMap::new(),
            delta: 0,
            forget: Vec::new(),
            min_due: u64::MAX,
            absent_above: *absent_above,
        };
        for entry in entries {
            match entry {
                Restored::Record { offset, record } => {
                    let rid = self.record_id(pid, *offset)?;
                    self.restore_put(&mut r, rid, record)?;
                }
                Restored::Pointer { offset, .. } => {
                    return Err(StoreError::Corrupt {
                        what: "changelog entry",
                        detail: format!("the pointer at source offset {offset} was not resolved"),
                    });
                }
                Restored::Gone { offset } => {
                    let rid = self.record_id(pid, *offset)?;
                    self.restore_delete(&mut r, rid)?;
                }
                Restored::SourceOffset(next) => {
                    r.batch
                        .put::<Offsets>(&PidKey::new(pid), &NextOffset::new(*next));
                }
            }
        }
        let Restoring {
            mut batch,
            counted,
            delta,
            forget,
            min_due,
            absent_above: above,
            ..
        } = r;
        batch.put::<Meta>(&MetaKey::checkpoint(pid), &at.encode());
        let counted = counted.sum();
        self.put_counts(&mut batch, &stats, &counted);
        self.forget_near(forget);
        self.write(batch, false, "restore write")?;
        self.pending.fetch_add(delta, Ordering::Relaxed);
        self.changes.fetch_add(1, Ordering::Release);
        self.low_water.fetch_min(min_due, Ordering::Relaxed);
        stats.apply(&counted);
        self.copy_changed(pid, &counted);
        *absent_above = above;
        Ok(delta)
    }

    /// How many records of `pid` the store holds (reads every key of the partition).
    ///
    /// # Errors
    /// A read failure.
    pub fn count_partition(&self, pid: Pid) -> Result<u64> {
        let mut read = rocksdb::ReadOptions::default();
        read.set_iterate_lower_bound(RecordKey::new(RecordId(u64::from(pid) << 48)).as_ref());
        read.set_iterate_upper_bound(RecordKey::new(RecordId((u64::from(pid) + 1) << 48)).as_ref());
        let mut it = self.db.raw_iterator_cf_opt(self.cf::<Records>(), read);
        it.seek_to_first();
        let mut n = 0;
        while it.valid() {
            n += 1;
            it.next();
        }
        it.status().map_err(io("partition count"))?;
        Ok(n)
    }

    /// What a restore batch knows of `rid`: from the batch, else from RocksDB.
    fn known<'a>(&self, r: &Restoring<'a, '_>, rid: RecordId) -> Result<Known<'a>> {
        if let Some(k) = r.records.get(&rid) {
            return Ok(k.map(Cow::Borrowed));
        }
        if r.absent_above.is_some_and(|v| rid.offset() > v) {
            return Ok(None);
        }
        let Some(v) = self.get_pinned::<Records>(&RecordKey::new(rid), "record read")? else {
            return Ok(None);
        };
        let rec = StoredRecord::from_bytes(v.to_vec()).map_err(|detail| StoreError::Corrupt {
            what: "records",
            detail,
        })?;
        Ok(Some(Cow::Owned(rec)))
    }

    fn restore_put<'a>(
        &self,
        r: &mut Restoring<'a, '_>,
        rid: RecordId,
        rec: &'a StoredRecord,
    ) -> Result<()> {
        // The same record again (a tail re-applied) or moved by an operator: replace in place.
        self.restore_delete(r, rid)?;
        if let Some(id) = rec.id() {
            let key = IdKey::new(rid.pid(), id);
            let mapped = match r.ids.get(&key) {
                Some(m) => *m,
                None => self.mapped_id(&key)?.map(|(m, _)| m),
            };
            // A newer record with the same id replaces the pending one (as at ingest).
            if let Some(old) = mapped.filter(|m| *m != rid) {
                self.restore_delete(r, old)?;
            }
            r.batch.put::<Ids>(&key, &IdValue::new(rid, rec.due_ms()));
            r.ids.insert(key, Some(rid));
        }
        r.batch.put::<Records>(&RecordKey::new(rid), rec);
        r.batch
            .put::<Due>(&DueKey::new(rec.due_ms(), rid), rec.target());
        r.counted
            .push(Cow::Borrowed(rec.target()), rec.due_ms(), true);
        r.records.insert(rid, Some(rec));
        r.delta += 1;
        r.min_due = r.min_due.min(rec.due_ms());
        if let Some(v) = &mut r.absent_above {
            *v = (*v).max(rid.offset());
        }
        Ok(())
    }

    fn restore_delete<'a>(&self, r: &mut Restoring<'a, '_>, rid: RecordId) -> Result<()> {
        let Some(known) = self.known(r, rid)? else {
            return Ok(());
        };
        let due = known.due_ms();
        if let Some(id) = known.id() {
            let key = IdKey::new(rid.pid(), id);
            let mapped = match r.ids.get(&key) {
                Some(m) => *m,
                None => self.mapped_id(&key)?.map(|(m, _)| m),
            };
            if mapped == Some(rid) {
                r.batch.delete::<Ids>(&key);
                r.ids.insert(key, None);
            }
        }
        r.batch.delete::<Records>(&RecordKey::new(rid));
        r.batch.delete::<Due>(&DueKey::new(due, rid));
        let target = match known {
            Cow::Borrowed(rec) => Cow::Borrowed(rec.target()),
            Cow::Owned(rec) => Cow::Owned(rec.target().to_owned()),
        };
        r.counted.push(target, due, false);
        r.records.insert(rid, None);
        r.forget.push(rid);
        r.delta -= 1;
        Ok(())
    }

    /// Deletes every record of `pid` with its index entries, id mappings, counts, offset and
    /// checkpoint (the partition left this instance, or its state here cannot be trusted).
    /// Returns how many records went.
    ///
    /// # Errors
    /// A read or write failure; what was deleted before it stays deleted.
    pub fn drop_partition(&self, pid: Pid) -> Result<u64> {
        self.drop_records(pid, 0, true)
    }

    /// Deletes the records of `pid` at source offsets from `from` on, with their index
    /// entries, id mappings and counts: with exactly-once, what ingest stored here but whose
    /// transaction did not commit (the changelog's source offset is below them, so they are
    /// consumed again). Returns how many went.
    ///
    /// # Errors
    /// A read or write failure; what was deleted before it stays deleted.
    pub fn drop_uncommitted(&self, pid: Pid, from: i64) -> Result<u64> {
        self.drop_records(pid, from, false)
    }

    fn drop_records(&self, pid: Pid, from: i64, whole: bool) -> Result<u64> {
        let from = u64::try_from(from).unwrap_or(0).min((1 << 48) - 1);
        let first = RecordKey::new(RecordId((u64::from(pid) << 48) | from));
        let end = RecordKey::new(RecordId((u64::from(pid) + 1) << 48));
        let mut dropped = 0u64;
        loop {
            let mut stats = self.lock_writes();
            let mut read = rocksdb::ReadOptions::default();
            read.set_iterate_upper_bound(end.as_ref().to_vec());
            let mut it = self.db.raw_iterator_cf_opt(self.cf::<Records>(), read);
            it.seek(first);
            let mut batch = self.batch();
            let mut counted = Changes::default();
            let mut gone = Vec::new();
            while it.valid() && gone.len() < DROP_CHUNK {
                let (Some(k), Some(v)) = (it.key(), it.value()) else {
                    break;
                };
                let rid = RecordId(u64::from_be_bytes(k.try_into().map_err(|_| {
                    StoreError::Corrupt {
                        what: "records",
                        detail: "key is not 8 bytes".into(),
                    }
                })?));
                let rec =
                    StoredRecord::from_bytes(v.to_vec()).map_err(|detail| StoreError::Corrupt {
                        what: "records",
                        detail,
                    })?;
                batch.delete::<Records>(&RecordKey::new(rid));
                batch.delete::<Due>(&DueKey::new(rec.due_ms(), rid));
                if let Some(id) = rec.id() {
                    batch.delete::<Ids>(&IdKey::new(pid, id));
                }
                counted.push(Cow::Owned(rec.target().to_owned()), rec.due_ms(), false);
                gone.push(rid);
                it.next();
            }
            it.status().map_err(io("records scan"))?;
            let last = gone.len() < DROP_CHUNK;
            if last && whole {
                batch.delete::<Offsets>(&PidKey::new(pid));
                batch.delete::<Meta>(&MetaKey::checkpoint(pid));
            }
            let counted = counted.sum();
            self.put_counts(&mut batch, &stats, &counted);
            self.forget_near(gone.iter().copied());
            self.write(batch, false, "partition drop")?;
            self.pending.fetch_sub(gone.len() as i64, Ordering::Relaxed);
            self.changes.fetch_add(1, Ordering::Release);
            stats.apply(&counted);
            self.copy_changed(pid, &counted);
            dropped += gone.len() as u64;
            if last {
                if whole {
                    self.forget_copy(pid);
                }
                return Ok(dropped);
            }
        }
    }

    /// The source partitions that have records or a checkpoint here.
    pub fn partitions_with_state(&self) -> Vec<Pid> {
        (0..self.partition_count())
            .filter_map(|i| Pid::try_from(i).ok())
            .filter(|&pid| {
                let first = RecordKey::new(RecordId(u64::from(pid) << 48));
                let mut it = self.db.raw_iterator_cf(self.cf::<Records>());
                it.seek(first);
                let has_records = it
                    .key()
                    .and_then(|k| <[u8; 8]>::try_from(k).ok())
                    .is_some_and(|k| RecordId(u64::from_be_bytes(k)).pid() == pid);
                has_records || matches!(self.checkpoint(pid), Ok(Some(_)))
            })
            .collect()
    }

    /// `(due, id)` of every pending record of `pid` due before `until`, in due order: the
    /// timers to hand the scheduler when the partition starts firing here.
    ///
    /// # Errors
    /// A read failure.
    pub fn due_of_partition(&self, pid: Pid, until: u64) -> Result<Vec<(u64, RecordId)>> {
        let mut out = Vec::new();
        let mut from = (0u64, RecordId(0));
        loop {
            let page = self.due_range(from, until, 4_096)?;
            let Some(&(due, id)) = page.last() else {
                return Ok(out);
            };
            out.extend(page.iter().copied().filter(|(_, id)| id.pid() == pid));
            from = super::due_key_after(due, id);
        }
    }
}
