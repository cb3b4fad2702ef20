//! Operators' actions on one pending record: cancel it, or move it to another due time. Each
//! takes the record out of memory first (see [`near`](super::near)), counts as a change (see
//! `Store::changes`), and is written synced when `sync` is on.

use std::borrow::Cow;
use std::sync::atomic::Ordering;

use super::codec::{DueKey, IdKey, IdValue, RecordKey};
use super::column::{Batch, Due, Ids, Records};
use super::stats::Changes;
use super::{RecordId, Result, Store, StoredRecord};

impl Store {
    /// Cancels one pending record (an operator's action). Returns it, `None` when it is not
    /// pending (fired, cancelled or replaced already).
    ///
    /// # Errors
    /// A read or write failure; nothing changes then.
    pub fn cancel(&self, rid: RecordId) -> Result<Option<StoredRecord>> {
        let mut stats = self.lock_writes();
        self.forget_near([rid]);
        let Some(rec) = self.get(&[rid])?.pop().flatten() else {
            return Ok(None);
        };
        let mut batch = self.batch();
        batch.delete::<Records>(&RecordKey::new(rid));
        batch.delete::<Due>(&DueKey::new(rec.due_ms(), rid));
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
        let mut stats = self.lock_writes();
        self.forget_near([rid]);
        let Some(mut rec) = self.get(&[rid])?.pop().flatten() else {
            return Ok(None);
        };
        let old = rec.due_ms();
        rec.set_due_ms(due_ms);
        let mut batch = self.batch();
        batch.put::<Records>(&RecordKey::new(rid), &rec);
        batch.delete::<Due>(&DueKey::new(old, rid));
        batch.put::<Due>(&DueKey::new(due_ms, rid), rec.target());
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
