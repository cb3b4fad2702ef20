//! The store's reads: records by id, and the due index in order (pages for the admin API,
//! bounded ranges for the scheduler, the head from the low-water mark). The full scan is in
//! `recovery.rs`, the read before firing in `fire.rs`.

use std::sync::atomic::Ordering;

use rocksdb::ReadOptions;

use super::codec::{DueKey, IdKey, IdValue, RecordKey};
use super::column::{Due, Ids, Records};
use super::recovery::{due_entry_key, due_entry_target};
use super::{io, Result, Store, StoreError};
use kafka_delay_core::id::{Pid, RecordId};
use kafka_delay_core::record::StoredRecord;

/// A read of at least this many records whose ids are at most [`DENSE_GAP`] offsets apart on
/// average walks an iterator over them ([`Store::read_missing`]).
const DENSE_MIN: usize = 32;
/// See [`DENSE_MIN`].
const DENSE_GAP: u64 = 2;
/// Steps an iterator walking a read takes towards the next record before it seeks instead.
const WALK_STEPS: usize = 8;

/// Whether sorted ids are dense enough in their partitions for one iterator to walk them:
/// stepping over a record in between costs a fraction of a point read, which must look in
/// every table file's filter and index.
pub(super) fn dense(sorted: &[(RecordId, usize)]) -> bool {
    if sorted.len() < DENSE_MIN {
        return false;
    }
    let span: u64 = sorted
        .windows(2)
        .map(|w| {
            let (a, b) = (w[0].0, w[1].0);
            if a.pid() == b.pid() {
                b.0 - a.0
            } else {
                1
            }
        })
        .sum();
    span <= DENSE_GAP * sorted.len() as u64
}

fn decode_record(bytes: &[u8]) -> Result<StoredRecord> {
    StoredRecord::from_bytes(bytes.to_vec()).map_err(|detail| StoreError::Corrupt {
        what: "records",
        detail,
    })
}

/// Where a listing of the due index starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Position {
    /// The first record due at or after this time.
    Due(u64),
    /// This record (a position returned by [`Store::list`]).
    At(u64, RecordId),
}

/// A page of a listing: (due, id, target) triples and where the next page starts.
pub type Page = (Vec<(u64, RecordId, String)>, Option<Position>);

impl Store {
    /// Reads pending records from RocksDB; `None` for one that was cancelled, replaced or
    /// already fired. A copy kept in memory stays there.
    ///
    /// # Errors
    /// A read failure or an undecodable record.
    pub fn get(&self, ids: &[RecordId]) -> Result<Vec<Option<StoredRecord>>> {
        let mut found = Vec::with_capacity(ids.len());
        found.resize_with(ids.len(), || None);
        self.read_missing(|i| ids[i], &mut found)?;
        Ok(found)
    }

    /// Reads from RocksDB the records of `found`'s `None`s (the id of the i-th is `id(i)`);
    /// one that is not pending stays `None`. Ids dense in their partitions ([`dense`]: a wave
    /// due at once, fired in id order) are read by walking one iterator over them; others in
    /// one batched point read.
    pub(super) fn read_missing(
        &self,
        id: impl Fn(usize) -> RecordId,
        found: &mut [Option<StoredRecord>],
    ) -> Result<()> {
        let mut missing: Vec<(RecordId, usize)> = (0..found.len())
            .filter(|&i| found[i].is_none())
            .map(|i| (id(i), i))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        missing.sort_unstable();
        if dense(&missing) {
            return self.walk_missing(&missing, found);
        }
        let keys: Vec<RecordKey> = missing
            .iter()
            .map(|&(rid, _)| RecordKey::new(rid))
            .collect();
        let read = self
            .db
            .batched_multi_get_cf(self.cf::<Records>(), keys.iter(), true);
        for (&(_, i), r) in missing.iter().zip(read) {
            if let Some(bytes) = r.map_err(io("record read"))? {
                found[i] = Some(decode_record(&bytes)?);
            }
        }
        Ok(())
    }

    /// [`Store::read_missing`] for sorted ids: one iterator, bounded by the first and last,
    /// stepped from each record to the next and made to seek only past a gap.
    fn walk_missing(
        &self,
        sorted: &[(RecordId, usize)],
        found: &mut [Option<StoredRecord>],
    ) -> Result<()> {
        let (Some(first), Some(last)) = (sorted.first(), sorted.last()) else {
            return Ok(());
        };
        let mut opts = ReadOptions::default();
        opts.set_iterate_lower_bound(first.0.to_bytes().to_vec());
        if let Some(after) = last.0 .0.checked_add(1) {
            opts.set_iterate_upper_bound(RecordId(after).to_bytes().to_vec());
        }
        let mut iter = self.db.raw_iterator_cf_opt(self.cf::<Records>(), opts);
        iter.seek_to_first();
        for &(rid, i) in sorted {
            let want = rid.to_bytes();
            let mut steps = 0;
            while iter.key().is_some_and(|k| k < &want[..]) {
                if steps == WALK_STEPS {
                    iter.seek(want);
                } else {
                    iter.next();
                    steps += 1;
                }
            }
            if iter.key() == Some(&want[..]) {
                if let Some(bytes) = iter.value() {
                    found[i] = Some(decode_record(bytes)?);
                }
            }
        }
        iter.status().map_err(io("record read"))
    }

    /// Records kept in memory now ([`Store::apply`]), the bytes they count for, and how
    /// many were taken from memory instead of read, since the store was opened.
    pub fn kept_in_memory(&self) -> (usize, usize, u64) {
        self.lock_firing().near.stats()
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
        let mut iter = self.db.raw_iterator_cf(self.cf::<Due>());
        match from {
            Position::Due(d) => iter.seek(DueKey::first_at(d)),
            Position::At(due, rid) => iter.seek(DueKey::new(due, rid)),
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
        let mut out = Vec::new();
        for pid in 0..self.partition_count() {
            let key = IdKey::new(pid as Pid, id);
            if let Some(v) = self.get_pinned::<Ids>(&key, "id read")? {
                if let Some((rid, due)) = IdValue::split(&v) {
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
        let _writes = self.lock_writes();
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
        opts.set_iterate_lower_bound(DueKey::first_at(from).to_vec());
        let mut iter = self.db.raw_iterator_cf_opt(self.cf::<Due>(), opts);
        iter.seek_to_first();
        if !iter.valid() {
            iter.status().map_err(io("due seek"))?;
            return Ok(None);
        }
        Ok(iter.key().and_then(DueKey::split).map(|(due, _)| due))
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
        opts.set_iterate_lower_bound(DueKey::new(from.0, from.1).as_ref().to_vec());
        opts.set_iterate_upper_bound(DueKey::first_at(until_ms).to_vec());
        let mut iter = self.db.raw_iterator_cf_opt(self.cf::<Due>(), opts);
        iter.seek_to_first();
        while iter.valid() && out.len() < limit {
            out.push(due_entry_key(&iter)?);
            iter.next();
        }
        iter.status().map_err(io("due range"))?;
        Ok(out)
    }
}
