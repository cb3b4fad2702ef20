//! Operators' actions on pending records, one or many in one write batch: cancel them, or move
//! them to another due time. Each takes the records out of memory first (see
//! [`near`](super::near)), counts as a change (see `Store::changes`), and is written synced
//! when `sync` is on.

use std::borrow::Cow;
use std::sync::atomic::Ordering;

use super::codec::{DueKey, IdKey, IdValue, RecordKey};
use super::column::{Batch, Due, Ids, Records};
use super::stats::Changes;
use super::{Result, Store};
use kafka_delay_core::id::RecordId;
use kafka_delay_core::record::StoredRecord;

impl Store {
    /// Cancels one pending record (an operator's action). Returns it, `None` when it is not
    /// pending (fired, cancelled or replaced already).
    ///
    /// # Errors
    /// A read or write failure; nothing changes then.
    pub fn cancel(&self, rid: RecordId) -> Result<Option<StoredRecord>> {
        Ok(self.cancel_many(&[rid])?.pop().map(|(_, rec)| rec))
    }

    /// Cancels the pending records among `rids` in one write batch (an operator's bulk
    /// action). Returns those that were pending; the others are left out.
    ///
    /// # Errors
    /// A read or write failure; nothing changes then.
    pub fn cancel_many(&self, rids: &[RecordId]) -> Result<Vec<(RecordId, StoredRecord)>> {
        let mut stats = self.lock_writes();
        let found = self.pending_among(rids)?;
        if found.is_empty() {
            return Ok(found);
        }
        let mut batch = self.batch();
        let mut counted = Changes::default();
        for (rid, rec) in &found {
            batch.delete::<Records>(&RecordKey::new(*rid));
            batch.delete::<Due>(&DueKey::new(rec.due_ms(), *rid));
            self.unmap_id(&mut batch, *rid, rec, None)?;
            counted.push(Cow::Borrowed(rec.target()), rec.due_ms(), false);
        }
        let counted = counted.sum();
        self.put_counts(&mut batch, &stats, &counted);
        self.write_required(batch, "cancel write")?;
        self.pending
            .fetch_sub(found.len() as i64, Ordering::Relaxed);
        self.changes.fetch_add(1, Ordering::Release);
        stats.apply(&counted);
        drop(counted);
        Ok(found)
    }

    /// Moves one pending record to a new due time (an operator's action; "fire now" is a move
    /// to now). The wheel entry at the old time becomes stale and is skipped when it comes up;
    /// put `(due_ms, rid)` in the wheel. Returns the old due time, `None` when not pending.
    ///
    /// # Errors
    /// A read or write failure; nothing changes then.
    pub fn reschedule(&self, rid: RecordId, due_ms: u64) -> Result<Option<u64>> {
        Ok(self
            .reschedule_many(&[rid], due_ms)?
            .pop()
            .map(|(_, old)| old))
    }

    /// Moves the pending records among `rids` to `due_ms` in one write batch (an operator's
    /// bulk action). Returns those that were pending with their old due times; put each at
    /// `due_ms` in the wheel.
    ///
    /// # Errors
    /// A read or write failure; nothing changes then.
    pub fn reschedule_many(&self, rids: &[RecordId], due_ms: u64) -> Result<Vec<(RecordId, u64)>> {
        let mut stats = self.lock_writes();
        let mut found = self.pending_among(rids)?;
        if found.is_empty() {
            return Ok(Vec::new());
        }
        let mut batch = self.batch();
        let mut counted = Changes::default();
        let mut moved = Vec::with_capacity(found.len());
        for (rid, rec) in &mut found {
            let old = rec.due_ms();
            rec.set_due_ms(due_ms);
            batch.put::<Records>(&RecordKey::new(*rid), rec);
            batch.delete::<Due>(&DueKey::new(old, *rid));
            batch.put::<Due>(&DueKey::new(due_ms, *rid), rec.target());
            self.unmap_id(&mut batch, *rid, rec, Some(due_ms))?;
            moved.push((*rid, old));
        }
        for ((_, rec), (_, old)) in found.iter().zip(&moved) {
            counted.push(Cow::Borrowed(rec.target()), *old, false);
            counted.push(Cow::Borrowed(rec.target()), due_ms, true);
        }
        let counted = counted.sum();
        self.put_counts(&mut batch, &stats, &counted);
        self.write_required(batch, "reschedule write")?;
        self.changes.fetch_add(1, Ordering::Release);
        stats.apply(&counted);
        self.low_water.fetch_min(due_ms, Ordering::Relaxed);
        Ok(moved)
    }

    /// The records among `rids` that are pending, each once (a record counted twice in one
    /// batch would be subtracted twice from the pending counts), taken out of memory first.
    /// Call with the write lock held.
    fn pending_among(&self, rids: &[RecordId]) -> Result<Vec<(RecordId, StoredRecord)>> {
        let mut seen = std::collections::HashSet::with_capacity(rids.len());
        let protect = self.protect_claimed.load(Ordering::Relaxed);
        let rids: Vec<RecordId> = {
            let firing = protect.then(|| self.lock_firing());
            rids.iter()
                .copied()
                .filter(|r| seen.insert(*r) && !firing.as_ref().is_some_and(|f| f.is_claimed(*r)))
                .collect()
        };
        self.forget_near(rids.iter().copied());
        Ok(rids
            .iter()
            .zip(self.get(&rids)?)
            .filter_map(|(rid, rec)| Some((*rid, rec?)))
            .collect())
    }

    /// Deletes the id mapping of `rid` (or points it at `new_due`) while it still maps to `rid`.
    fn unmap_id(
        &self,
        batch: &mut Batch<'_>,
        rid: RecordId,
        rec: &StoredRecord,
        new_due: Option<u64>,
    ) -> Result<()> {
        let Some(id) = rec.id() else { return Ok(()) };
        let key = IdKey::new(rid.pid(), id);
        let mapped = self
            .get_pinned::<Ids>(&key, "id read")?
            .and_then(|v| IdValue::split(&v))
            .is_some_and(|(m, _)| m == rid);
        if mapped {
            match new_due {
                Some(due) => batch.put::<Ids>(&key, &IdValue::new(rid, due)),
                None => batch.delete::<Ids>(&key),
            }
        }
        Ok(())
    }
}
