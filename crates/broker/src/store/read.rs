//! The store's reads: records by id, and the due index in order (a full scan, pages for the
//! admin API, bounded ranges for the scheduler, the head from the low-water mark).

use std::sync::atomic::Ordering;

use rocksdb::ReadOptions;

use super::codec::{due_key, id_key, split_due_key, split_id_value, Pid};
use super::{
    due_entry_key, due_entry_target, io, Page, Position, RecordId, Result, Store, StoreError,
    StoredRecord, CF_DUE, CF_IDS, CF_RECORDS,
};

impl Store {
    /// How many pending records were deleted or moved by anything but a delete after delivery
    /// so far. Read it before [`Store::get_for_firing`] and give it to [`Store::remove_delivered`].
    pub fn changes(&self) -> u64 {
        self.changes.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Reads pending records from RocksDB; `None` for one that was cancelled, replaced or
    /// already fired.
    ///
    /// # Errors
    /// A read failure or an undecodable record.
    pub fn get(&self, ids: &[RecordId]) -> Result<Vec<Option<StoredRecord>>> {
        let mut found = Vec::with_capacity(ids.len());
        found.resize_with(ids.len(), || None);
        self.read_missing(ids, found)
    }

    /// [`Store::get`] for records about to be published: those kept in memory
    /// ([`Store::apply_at`]) are taken from there (and leave it), the others are read.
    ///
    /// # Errors
    /// A read failure or an undecodable record.
    pub fn get_for_firing(&self, ids: &[RecordId]) -> Result<Vec<Option<StoredRecord>>> {
        self.read_missing(ids, self.take_kept(ids))
    }

    /// The first half of [`Store::get_for_firing`], which never blocks on I/O: takes the
    /// records of `ids` kept in memory, `None` for the others.
    pub fn take_kept(&self, ids: &[RecordId]) -> Vec<Option<StoredRecord>> {
        let mut found: Vec<Option<StoredRecord>> = Vec::with_capacity(ids.len());
        let mut near = self.near.lock().unwrap_or_else(|e| e.into_inner());
        if near.enabled() {
            found.extend(ids.iter().map(|&id| near.take(id)));
        } else {
            found.resize_with(ids.len(), || None);
        }
        found
    }

    /// The second half: reads from RocksDB, in one batched read, the records of `ids` not in
    /// `found` (their `None`s); `None` for one that is not pending.
    ///
    /// # Errors
    /// A read failure or an undecodable record.
    pub fn read_missing(
        &self,
        ids: &[RecordId],
        mut found: Vec<Option<StoredRecord>>,
    ) -> Result<Vec<Option<StoredRecord>>> {
        let missing: Vec<usize> = (0..ids.len()).filter(|&i| found[i].is_none()).collect();
        if missing.is_empty() {
            return Ok(found);
        }
        let keys: Vec<[u8; 8]> = missing.iter().map(|&i| ids[i].to_bytes()).collect();
        let read = self
            .db
            .batched_multi_get_cf(self.cf(CF_RECORDS), keys.iter(), false);
        for (i, r) in missing.into_iter().zip(read) {
            if let Some(bytes) = r.map_err(io("record read"))? {
                let record = StoredRecord::from_bytes(bytes.to_vec()).map_err(|detail| {
                    StoreError::Corrupt {
                        what: "records",
                        detail,
                    }
                })?;
                found[i] = Some(record);
            }
        }
        Ok(found)
    }

    /// Records kept in memory now ([`Store::apply_at`]), the bytes they count for, and how
    /// many were taken from memory instead of read, since the store was opened.
    pub fn kept_in_memory(&self) -> (usize, usize, u64) {
        self.near.lock().unwrap_or_else(|e| e.into_inner()).stats()
    }

    /// Calls `f(due, id)` for every pending record in due-time order (one ordered scan of the
    /// due index) and returns how many there were. Also sets the pending count, the counts by
    /// target and due time, and the low-water mark.
    ///
    /// # Errors
    /// A read failure or a corrupt index key.
    pub fn scan_due(&self, mut f: impl FnMut(u64, RecordId)) -> Result<u64> {
        let mut stats = self.mutex.lock().unwrap_or_else(|e| e.into_inner());
        self.delete_gathered_or_warn();
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
    /// `limit` of those for which `keep(due, id, target)` holds, examining at most `budget` index
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
        mut keep: impl FnMut(u64, RecordId, &str) -> bool,
    ) -> Result<Page> {
        self.delete_gathered_locked();
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
            if keep(due, rid, &target) {
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

    /// The earliest due time pending: one seek at the head of the due index, bounded below by
    /// the low-water mark so that it does not walk over the tombstones of fired records.
    ///
    /// # Errors
    /// A read failure.
    pub fn earliest_due(&self) -> Result<Option<u64>> {
        let _writes = self.mutex.lock().unwrap_or_else(|e| e.into_inner());
        self.delete_gathered_or_warn();
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
}
