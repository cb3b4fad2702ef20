//! The store's write paths: ingest batches, deletes after fire, and operators' cancels and
//! moves. Each runs its read-check-write under the store's mutex and writes one batch that
//! carries the new value of every pending count it changes, so the persisted counts never
//! disagree with the records.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;

use rocksdb::{ReadOptions, WriteBatch, WriteOptions};

use crate::hashing::BuildMul;

use super::codec::{due_key, id_key, id_value, split_id_value};
use super::stats::{Changes, PendingStats, Summed};
use super::{
    io, Applied, IngestOp, Pid, RecordId, Result, Store, StoreError, StoredRecord, CF_COUNTS,
    CF_DUE, CF_IDS, CF_META, CF_OFFSETS, CF_RECORDS, COUNTS_KEPT,
};

impl Store {
    /// Applies the effects of a group of consumed records in one write batch, together with the
    /// next offset of every source partition in it (group commit: one fsync when `sync` is on).
    ///
    /// # Errors
    /// A read or write failure; nothing is written then.
    pub fn apply(&self, ops: &[IngestOp]) -> Result<Applied> {
        self.apply_keeping(ops, None)
    }

    /// [`Store::apply`] for records that arrived at `now_ms`: those due by `now_ms` plus
    /// [`StoreOptions::keep_within_ms`](super::StoreOptions) are also kept in memory until
    /// they fire, as far as their bytes fit ([`near`](super::near)), so firing them reads
    /// nothing.
    ///
    /// # Errors
    /// A read or write failure; nothing is written then.
    pub fn apply_at(&self, ops: &[IngestOp], now_ms: u64) -> Result<Applied> {
        self.apply_keeping(ops, Some(now_ms))
    }

    fn apply_keeping(&self, ops: &[IngestOp], now_ms: Option<u64>) -> Result<Applied> {
        let mut stats = self.mutex.lock().unwrap_or_else(|e| e.into_inner());
        // Records this batch deletes leave memory before RocksDB (see `near`).
        let mut forget = Vec::new();
        // Counts change only once the batch is written.
        let mut counted = Changes::default();
        let mut new_targets: HashMap<RecordId, &str, BuildMul> = HashMap::default();
        let mut batch = WriteBatch::default();
        let mut applied = Applied::default();
        let mut overlay: HashMap<Vec<u8>, Option<(RecordId, u64)>> = HashMap::new();
        let mut next: HashMap<Pid, i64, BuildMul> = HashMap::default();
        let mut delta: i64 = 0;
        // Looked up by name once per batch, not for every put.
        let (records, due_index, ids) = (self.cf(CF_RECORDS), self.cf(CF_DUE), self.cf(CF_IDS));
        for op in ops {
            let (pid, offset) = op.position();
            let entry = next.entry(pid).or_insert(offset + 1);
            *entry = (*entry).max(offset + 1);
            match op {
                IngestOp::Skip { .. } => {}
                IngestOp::Schedule { schedule, .. } => {
                    let rid = self.record_id(pid, offset)?;
                    let due = schedule.due_ms();
                    if let Some(id) = schedule.id() {
                        let key = id_key(pid, id);
                        if let Some((old, old_due)) = self.lookup_id(&overlay, &key)? {
                            forget.push(old);
                            let target = self.target_of(&new_targets, old, old_due)?;
                            counted.push(target, old_due, false);
                            batch.delete_cf(records, old.to_bytes());
                            batch.delete_cf(due_index, due_key(old_due, old));
                            applied.replaced += 1;
                            delta -= 1;
                        }
                        batch.put_cf(ids, &key, id_value(rid, due));
                        overlay.insert(key, Some((rid, due)));
                    }
                    // Encoded once, when it was consumed.
                    batch.put_cf(records, rid.to_bytes(), schedule.encoded());
                    let target = schedule.target();
                    batch.put_cf(due_index, due_key(due, rid), target.as_bytes());
                    counted.push(Cow::Borrowed(target), due, true);
                    if schedule.id().is_some() {
                        // Only a record with an id can be replaced or cancelled by a later
                        // one of this batch.
                        new_targets.insert(rid, target);
                    }
                    applied.inserted.push((due, rid));
                    delta += 1;
                }
                IngestOp::Cancel { id, .. } => {
                    let key = id_key(pid, id);
                    match self.lookup_id(&overlay, &key)? {
                        Some((old, old_due)) => {
                            forget.push(old);
                            let target = self.target_of(&new_targets, old, old_due)?;
                            counted.push(target, old_due, false);
                            batch.delete_cf(records, old.to_bytes());
                            batch.delete_cf(due_index, due_key(old_due, old));
                            batch.delete_cf(ids, &key);
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
        let counted = counted.sum();
        self.put_counts(&mut batch, &stats, &counted);
        self.forget_near(forget);
        // Kept before the write, under the mutex: whatever finds a record in RocksDB (the
        // scheduler's reads of the due index, or the timer ingest hands over afterwards) then
        // finds its copy too; a copy left after a failed write has no timer and is replaced
        // when ingest writes the batch again (see `near`).
        if let Some(now_ms) = now_ms {
            self.keep_near(ops, now_ms);
        }
        self.write_required(batch, "ingest write")?;
        self.pending.fetch_add(delta, Ordering::Relaxed);
        if applied.replaced + applied.cancelled > 0 {
            self.changes.fetch_add(1, Ordering::Release);
        }
        if let Some(&(first, _)) = applied.inserted.iter().min() {
            self.low_water.fetch_min(first, Ordering::Relaxed);
        }
        stats.apply(&counted);
        Ok(applied)
    }

    /// Keeps the records of a batch due by `now_ms` plus the window in memory. A
    /// record a later op of the same batch replaced or cancelled is not pending: only the last
    /// op on an id is kept, and nothing after a cancel of it.
    fn keep_near(&self, ops: &[IngestOp], now_ms: u64) {
        let until = now_ms.saturating_add(self.keep_within_ms);
        let mut near = self.near.lock().unwrap_or_else(|e| e.into_inner());
        if !near.enabled() {
            return;
        }
        let mut ids_seen: HashSet<(Pid, &[u8])> = HashSet::new();
        // Backwards: the last op on an id decides.
        for op in ops.iter().rev() {
            match op {
                IngestOp::Schedule { schedule, .. } => {
                    let (pid, offset) = op.position();
                    if let Some(id) = schedule.id() {
                        if !ids_seen.insert((pid, id)) {
                            continue;
                        }
                    }
                    if schedule.due_ms() <= until {
                        if let Some(rid) = RecordId::new(pid, offset) {
                            near.insert(rid, schedule, now_ms);
                        }
                    }
                }
                IngestOp::Cancel { pid, id, .. } => {
                    ids_seen.insert((*pid, id));
                }
                IngestOp::Skip { .. } => {}
            }
        }
    }

    /// Takes records out of memory before RocksDB deletes or moves them.
    fn forget_near(&self, ids: impl IntoIterator<Item = RecordId>) {
        let mut ids = ids.into_iter().peekable();
        if ids.peek().is_none() {
            return;
        }
        let mut near = self.near.lock().unwrap_or_else(|e| e.into_inner());
        for id in ids {
            near.forget(id);
        }
    }

    /// The target of a pending record: from this batch, or from its due-index entry.
    fn target_of<'a>(
        &self,
        in_batch: &HashMap<RecordId, &'a str, BuildMul>,
        rid: RecordId,
        due: u64,
    ) -> Result<Cow<'a, str>> {
        if let Some(t) = in_batch.get(&rid) {
            return Ok(Cow::Borrowed(t));
        }
        let v = self
            .db
            .get_pinned_cf(self.cf(CF_DUE), due_key(due, rid))
            .map_err(io("due read"))?;
        Ok(Cow::Owned(
            v.map(|v| String::from_utf8_lossy(&v).into_owned())
                .unwrap_or_default(),
        ))
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

    /// Deletes records that were delivered (or dead-lettered), in one batch. A record already
    /// gone (replaced or cancelled meanwhile) is skipped; an id mapping is deleted only while it
    /// still points at the deleted record.
    ///
    /// # Errors
    /// A read or write failure; nothing is deleted then.
    pub fn remove_fired(&self, fired: &[(RecordId, &StoredRecord)]) -> Result<usize> {
        self.remove(fired, None)
    }

    /// [`Store::remove_fired`] for records read by [`Store::get_for_firing`] after [`Store::changes`]
    /// returned `read_at`, each claimed before it was read so that no other delete after
    /// delivery can remove it (the publisher's in-flight set). While the count is still
    /// `read_at`, nothing else has deleted or moved a pending record since, so every one of
    /// them is still there and the read that would check it is skipped; otherwise this is
    /// [`Store::remove_fired`].
    ///
    /// The records, their id mappings and the counts go at once; their due-index entries are
    /// gathered and deleted with the next few thousand (see the module doc), where
    /// [`Store::remove_fired`] deletes them, and any gathered, at once.
    ///
    /// # Errors
    /// A read or write failure; nothing is deleted then.
    pub fn remove_delivered(
        &self,
        fired: &[(RecordId, &StoredRecord)],
        read_at: u64,
    ) -> Result<usize> {
        self.remove(fired, Some(read_at))
    }

    fn remove(&self, fired: &[(RecordId, &StoredRecord)], read_at: Option<u64>) -> Result<usize> {
        let mut stats = self.mutex.lock().unwrap_or_else(|e| e.into_inner());
        let mut garbage = self.due_garbage.lock().unwrap_or_else(|e| e.into_inner());
        let keys: Vec<[u8; 8]> = fired.iter().map(|(rid, _)| rid.to_bytes()).collect();
        // Which records are still there and their due time now (an operator may have moved
        // one while it was delivered), and where their id mappings point: two batched reads
        // under the lock, not two point reads per record; the first only when something could
        // have deleted or moved one of them since they were read.
        let current: Vec<Option<u64>> = if read_at == Some(self.changes.load(Ordering::Acquire)) {
            fired.iter().map(|(_, rec)| Some(rec.due_ms())).collect()
        } else {
            self.db
                .batched_multi_get_cf(self.cf(CF_RECORDS), keys.iter(), false)
                .into_iter()
                .map(|r| {
                    let v = r.map_err(io("record read"))?;
                    v.map(|v| stored_due(&v)).transpose()
                })
                .collect::<Result<Vec<Option<u64>>>>()?
        };
        let id_keys: Vec<(usize, Vec<u8>)> = fired
            .iter()
            .enumerate()
            .filter(|&(i, _)| current[i].is_some())
            .filter_map(|(i, (rid, rec))| rec.id().map(|id| (i, id_key(rid.pid(), id))))
            .collect();
        // The id key to delete with each record: only where the mapping still points at it.
        let mut unmap: Vec<Option<Vec<u8>>> = vec![None; fired.len()];
        let mapped =
            self.db
                .batched_multi_get_cf(self.cf(CF_IDS), id_keys.iter().map(|(_, k)| k), false);
        for ((i, key), v) in id_keys.into_iter().zip(mapped) {
            let v = v.map_err(io("id read"))?;
            if v.as_deref()
                .and_then(split_id_value)
                .is_some_and(|(m, _)| m == fired[i].0)
            {
                unmap[i] = Some(key);
            }
        }
        let mut counted = Changes::default();
        let mut batch = WriteBatch::default();
        let mut removed = 0usize;
        let mut seen: HashSet<RecordId, BuildMul> =
            HashSet::with_capacity_and_hasher(fired.len(), BuildMul::default());
        let mut due_keys = Vec::with_capacity(fired.len());
        let mut record_keys = Vec::with_capacity(fired.len());
        for (i, (rid, rec)) in fired.iter().enumerate() {
            let Some(due) = current[i] else { continue };
            if !seen.insert(*rid) {
                continue;
            }
            record_keys.push(keys[i]);
            due_keys.push(due_key(due, *rid));
            if let Some(key) = unmap[i].take() {
                batch.delete_cf(self.cf(CF_IDS), key);
            }
            counted.push(Cow::Borrowed(rec.target()), due, false);
            removed += 1;
        }
        // In key order: each tombstone's memtable insert then starts its search next to the
        // previous one's.
        record_keys.sort_unstable();
        let records = self.cf(CF_RECORDS);
        for key in &record_keys {
            batch.delete_cf(records, key);
        }
        // The delete after delivery gathers the due-index entries (see `due_garbage`); the
        // others delete theirs now, with whatever was gathered.
        let gather = read_at.is_some() && garbage.len() + due_keys.len() < GATHER_DUE_DELETES;
        let nothing = garbage.is_empty() && due_keys.is_empty();
        let flush = !gather && !nothing;
        if flush {
            let mut all = garbage.iter().chain(&due_keys).copied().collect();
            self.delete_due_entries(&mut batch, &mut all)?;
        }
        if removed > 0 || flush {
            let counted = counted.sum();
            self.put_counts(&mut batch, &stats, &counted);
            self.write_deferred(batch, "delete write")?;
            self.pending.fetch_sub(removed as i64, Ordering::Relaxed);
            stats.apply(&counted);
        }
        // Only once written: an entry gathered for a record still there would lose it.
        if flush {
            garbage.clear();
        } else {
            garbage.extend(due_keys);
        }
        Ok(removed)
    }

    /// Deletes the gathered due-index entries of records already deleted. The caller holds the
    /// store's mutex (so that no index write comes between the read of what lies between them
    /// and the delete). Every read of the index whose answer someone sees calls it first: the
    /// head seek, the scan, the admin listing, the flush at shutdown.
    ///
    /// # Errors
    /// A read or write failure; the entries stay gathered then.
    pub(super) fn delete_gathered(&self) -> Result<()> {
        let mut garbage = self.due_garbage.lock().unwrap_or_else(|e| e.into_inner());
        if garbage.is_empty() {
            return Ok(());
        }
        let mut batch = WriteBatch::default();
        // Sorted and deduplicated in place: the list stays as valid if the write fails.
        self.delete_due_entries(&mut batch, &mut garbage)?;
        // Never synced: losing it leaves entries whose records are gone, which are skipped and
        // gathered again after a restart.
        self.db
            .write_opt(batch, &WriteOptions::default())
            .map_err(io("due index delete"))?;
        garbage.clear();
        Ok(())
    }

    /// [`Store::delete_gathered`] before a read of the index or the flush at shutdown: a
    /// failure (a full disk) is logged and the caller goes on (a read then shows the gathered
    /// entries; after a shutdown they are left as after a crash) rather than failing too.
    pub(super) fn delete_gathered_or_warn(&self) {
        if let Err(e) = self.delete_gathered() {
            tracing::warn!(error = %e, "cannot delete the due-index entries of delivered records yet");
        }
    }

    /// [`Store::delete_gathered_or_warn`] for a caller that does not hold the store's mutex.
    pub(super) fn delete_gathered_locked(&self) {
        let _writes = self.mutex.lock().unwrap_or_else(|e| e.into_inner());
        self.delete_gathered_or_warn();
    }

    /// Gathers the due-index entries of timers whose record is gone (the publisher found
    /// nothing to publish for them): left behind by a crash between a delete after delivery
    /// and the deletion of its gathered entries, and loaded again at start. An entry whose
    /// record is gone serves nothing; one still in use cannot be among them, since an entry
    /// names its record's id.
    pub fn forget_due(&self, entries: impl IntoIterator<Item = (u64, RecordId)>) {
        // The list's own lock is enough: whoever deletes it holds that lock throughout.
        let mut garbage = self.due_garbage.lock().unwrap_or_else(|e| e.into_inner());
        garbage.extend(entries.into_iter().map(|(due, rid)| due_key(due, rid)));
    }

    /// Adds to `batch` the deletion of these due-index entries. Records are delivered about in
    /// due order, so the entries gathered over many deliveries mostly lie next to each other in
    /// the index (one delete batch alone does not: its delivery reports come per target
    /// partition, and a partition's records are every n-th in due order): each run of at least
    /// [`RANGE_DELETE_MIN`] of them with no other entry in between goes as one range tombstone,
    /// the rest one by one. A point tombstone is a memtable insert (a skip-list search) per
    /// entry, which made the due index's deletes more than half of the delete after delivery's
    /// cost (`bench store-cycle`). Which entries lie in between is read with an iterator bounded
    /// to the batch's first and last entry, under the store's mutex (every write to the index
    /// takes it), so no entry can appear there before the batch is written; one written later
    /// has a later sequence number, which a range tombstone does not cover.
    fn delete_due_entries(&self, batch: &mut WriteBatch, keys: &mut Vec<[u8; 16]>) -> Result<()> {
        keys.sort_unstable();
        keys.dedup();
        let keys: &[[u8; 16]] = keys;
        let (Some(first), Some(last)) = (keys.first(), keys.last()) else {
            return Ok(());
        };
        if keys.len() < RANGE_DELETE_MIN {
            self.delete_run(batch, keys);
            return Ok(());
        }
        let cf = self.cf(CF_DUE);
        let mut opts = ReadOptions::default();
        // Entries deleted by earlier range tombstones are seen as if still there: that can only
        // end a run early, never delete an entry in use. Reading the tombstones would rebuild
        // the memtable's list of them after every new one (measured: a tenth of all CPU time
        // end to end). RocksDB deprecated the option as without effect when `DeleteRange` is
        // not used; it is used here.
        #[allow(deprecated)]
        opts.set_ignore_range_deletions(true);
        opts.set_iterate_lower_bound(first.to_vec());
        opts.set_iterate_upper_bound(key_after(last));
        let mut iter = self.db.raw_iterator_cf_opt(cf, opts);
        iter.seek_to_first();
        // The iterator is at the first entry after the previous key of the run; an entry
        // before this key that is not one of the batch's ends the run.
        let mut start = 0;
        for i in 0..keys.len() {
            if iter.valid() && iter.key().is_some_and(|k| k < keys[i].as_slice()) {
                self.delete_run(batch, &keys[start..i]);
                start = i;
                iter.seek(keys[i]);
            }
            if iter.valid() && iter.key() == Some(keys[i].as_slice()) {
                iter.next();
            }
        }
        iter.status().map_err(io("due read"))?;
        self.delete_run(batch, &keys[start..]);
        Ok(())
    }

    /// Deletes due-index entries with no other entry between them: one range tombstone for a
    /// run of at least [`RANGE_DELETE_MIN`], point tombstones for a shorter one.
    fn delete_run(&self, batch: &mut WriteBatch, run: &[[u8; 16]]) {
        let cf = self.cf(CF_DUE);
        match (run.first(), run.last()) {
            (Some(first), Some(last)) if run.len() >= RANGE_DELETE_MIN => {
                batch.delete_range_cf(cf, first.to_vec(), key_after(last));
            }
            _ => {
                for key in run {
                    batch.delete_cf(cf, key);
                }
            }
        }
    }

    /// Adds to `batch` the new value of every persisted count that `changes` (target, due,
    /// added) touch, computed from `stats` (the counts before the batch; they are updated once
    /// the batch is written).
    fn put_counts(&self, batch: &mut WriteBatch, stats: &PendingStats, changes: &Summed<'_>) {
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
    pub(super) fn restore_counts(&self) -> Result<(u64, bool)> {
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
            self.write_required(batch, "counts write")?;
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

    /// Cancels one pending record (an operator's action). Returns it, `None` when it is not
    /// pending (fired, cancelled or replaced already).
    ///
    /// # Errors
    /// A read or write failure; nothing changes then.
    pub fn cancel(&self, rid: RecordId) -> Result<Option<StoredRecord>> {
        let mut stats = self.mutex.lock().unwrap_or_else(|e| e.into_inner());
        self.forget_near([rid]);
        let Some(rec) = self.get(&[rid])?.pop().flatten() else {
            return Ok(None);
        };
        let mut batch = WriteBatch::default();
        batch.delete_cf(self.cf(CF_RECORDS), rid.to_bytes());
        batch.delete_cf(self.cf(CF_DUE), due_key(rec.due_ms(), rid));
        self.unmap_id(&mut batch, rid, &rec, None)?;
        let mut counted = Changes::default();
        counted.push(Cow::Borrowed(rec.target()), rec.due_ms(), false);
        let counted = counted.sum();
        self.put_counts(&mut batch, &stats, &counted);
        self.write_required(batch, "cancel write")?;
        self.pending.fetch_sub(1, Ordering::Relaxed);
        self.changes.fetch_add(1, Ordering::Release);
        stats.apply(&counted);
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
        self.forget_near([rid]);
        let Some(mut rec) = self.get(&[rid])?.pop().flatten() else {
            return Ok(None);
        };
        let old = rec.due_ms();
        rec.set_due_ms(due_ms);
        let mut batch = WriteBatch::default();
        batch.put_cf(self.cf(CF_RECORDS), rid.to_bytes(), rec.encoded());
        batch.delete_cf(self.cf(CF_DUE), due_key(old, rid));
        batch.put_cf(
            self.cf(CF_DUE),
            due_key(due_ms, rid),
            rec.target().as_bytes(),
        );
        self.unmap_id(&mut batch, rid, &rec, Some(due_ms))?;
        let mut counted = Changes::default();
        counted.push(Cow::Borrowed(rec.target()), old, false);
        counted.push(Cow::Borrowed(rec.target()), due_ms, true);
        let counted = counted.sum();
        self.put_counts(&mut batch, &stats, &counted);
        self.write_required(batch, "reschedule write")?;
        self.changes.fetch_add(1, Ordering::Release);
        stats.apply(&counted);
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
        let Some(id) = rec.id() else { return Ok(()) };
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
}

/// Due-index entries of delivered records gathered before they are deleted together (see
/// `Store::due_garbage`): 1 MB of keys, about half a second of deliveries at 130K records/s.
/// Far more than the publisher's in-flight window (10,000 records by default), because the
/// entries of records still in flight lie among the gathered ones and end their runs, and each
/// end costs an iterator seek through every memtable and table file of the index. With 4,096
/// almost every entry was a run of its own once the index had table files: 1.2-1.6 us per
/// record end to end in runs of 1.5M records, against 0.24 us with this many (BENCHMARKS.md,
/// "What was tried").
const GATHER_DUE_DELETES: usize = if cfg!(test) { 16 } else { 65_536 };

/// Shortest run of adjacent due-index entries deleted with one range tombstone. A range
/// tombstone costs more than a point one to insert and every read of the index consults it, so
/// pairs and triples are deleted one by one.
const RANGE_DELETE_MIN: usize = 4;

/// The smallest key after `key` (bytewise order): the exclusive end of a range that ends at it.
fn key_after(key: &[u8]) -> Vec<u8> {
    let mut after = Vec::with_capacity(key.len() + 1);
    after.extend_from_slice(key);
    after.push(0);
    after
}

/// The due time of an encoded record, without decoding the rest.
fn stored_due(bytes: &[u8]) -> Result<u64> {
    StoredRecord::due_of(bytes).ok_or_else(|| StoreError::Corrupt {
        what: "records",
        detail: format!("record of {} bytes without a due time", bytes.len()),
    })
}
