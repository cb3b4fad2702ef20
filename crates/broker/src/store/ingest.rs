//! Ingest batches: what a group of consumed records does to the state, written in one batch
//! with the next offset of each source partition and the pending counts it changes.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;

use kafka_delay_core::hashing::BuildMul;

use super::codec::{DueKey, IdKey, IdValue, NextOffset, PidKey, RecordKey};
use super::column::{Batch, Due, Ids, Offsets, Records};
use super::stats::Changes;
use super::{Result, Store, StoreError};
use kafka_delay_core::id::{Pid, RecordId};
use kafka_delay_core::record::StoredRecord;

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
    /// A record that fires in the same Kafka transaction that consumes it (due when ingested,
    /// in the exactly-once mode): nothing is stored, the pending record with its id is
    /// replaced (removed), and the offset advances.
    Fire {
        /// Source partition.
        pid: Pid,
        /// Source offset.
        offset: i64,
        /// What is published.
        record: StoredRecord,
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
            | IngestOp::Fire { pid, offset, .. }
            | IngestOp::Skip { pid, offset } => (*pid, *offset),
        }
    }
}

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
    /// The records this batch deleted (replaced or cancelled).
    pub removed: Vec<RecordId>,
}

/// An ingest batch being built, under the store's `writes` lock.
struct Building<'a, 'db> {
    batch: Batch<'db>,
    applied: Applied,
    /// Counts change only once the batch is written.
    counted: Changes<'a>,
    /// Records this batch deletes leave memory before RocksDB (see `near`).
    forget: Vec<RecordId>,
    /// Targets of the records this batch writes that have an id (only those can be replaced
    /// or cancelled by a later op of the same batch).
    new_targets: HashMap<RecordId, &'a str, BuildMul>,
    /// The ids column as this batch leaves it so far.
    overlay: HashMap<IdKey, Option<(RecordId, u64)>>,
    next: HashMap<Pid, i64, BuildMul>,
    delta: i64,
}

impl Store {
    /// Applies the effects of a group of consumed records that arrived at `now_ms` in one write
    /// batch, together with the next offset of every source partition in it (group commit: one
    /// fsync when `sync` is on). Records due by `now_ms` plus
    /// [`StoreOptions::keep_within_ms`](super::StoreOptions) are also kept in memory until they
    /// fire, as far as their bytes fit ([`near`](super::near)), so firing them reads nothing.
    ///
    /// # Errors
    /// A read or write failure; nothing is written then.
    pub fn apply(&self, ops: &[IngestOp], now_ms: u64) -> Result<Applied> {
        let mut stats = self.lock_writes();
        let mut b = Building {
            batch: self.batch(),
            applied: Applied::default(),
            counted: Changes::default(),
            forget: Vec::new(),
            new_targets: HashMap::default(),
            overlay: HashMap::new(),
            next: HashMap::default(),
            delta: 0,
        };
        for op in ops {
            let (pid, offset) = op.position();
            let entry = b.next.entry(pid).or_insert(offset + 1);
            *entry = (*entry).max(offset + 1);
            match op {
                IngestOp::Skip { .. } => {}
                IngestOp::Schedule { schedule, .. } => {
                    self.schedule(&mut b, pid, offset, schedule)?
                }
                IngestOp::Cancel { id, .. } => self.cancel_id(&mut b, IdKey::new(pid, id))?,
                IngestOp::Fire { record, .. } => {
                    if let Some(id) = record.id() {
                        self.replace_id(&mut b, IdKey::new(pid, id))?;
                    }
                }
            }
        }
        let Building {
            mut batch,
            mut applied,
            counted,
            forget,
            next,
            delta,
            ..
        } = b;
        for (pid, offset) in next {
            batch.put::<Offsets>(&PidKey::new(pid), &NextOffset::new(offset));
        }
        let counted = counted.sum();
        self.put_counts(&mut batch, &stats, &counted);
        applied.removed.clone_from(&forget);
        self.forget_near(forget);
        // Kept before the write, under `writes`: whatever finds a record in RocksDB (the
        // scheduler's reads of the due index, or the timer ingest hands over afterwards) then
        // finds its copy too; a copy left after a failed write has no timer and is replaced
        // when ingest writes the batch again (see `near`).
        self.keep_near(ops, now_ms);
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

    /// Adds a scheduled record to `b`, replacing the pending one with its id.
    fn schedule<'a>(
        &self,
        b: &mut Building<'a, '_>,
        pid: Pid,
        offset: i64,
        schedule: &'a StoredRecord,
    ) -> Result<()> {
        let rid = self.record_id(pid, offset)?;
        let due = schedule.due_ms();
        if let Some(id) = schedule.id() {
            let key = IdKey::new(pid, id);
            if let Some((old, old_due)) = self.lookup_id(&b.overlay, &key)? {
                self.remove_pending(b, old, old_due)?;
                b.applied.replaced += 1;
            }
            b.batch.put::<Ids>(&key, &IdValue::new(rid, due));
            b.overlay.insert(key, Some((rid, due)));
        }
        // Encoded once, when it was consumed.
        b.batch.put::<Records>(&RecordKey::new(rid), schedule);
        let target = schedule.target();
        b.batch.put::<Due>(&DueKey::new(due, rid), target);
        b.counted.push(Cow::Borrowed(target), due, true);
        if schedule.id().is_some() {
            b.new_targets.insert(rid, target);
        }
        b.applied.inserted.push((due, rid));
        b.delta += 1;
        Ok(())
    }

    /// Adds to `b` the cancel of the pending record with id `key`, if any.
    fn cancel_id(&self, b: &mut Building<'_, '_>, key: IdKey) -> Result<()> {
        if self.remove_id(b, key)? {
            b.applied.cancelled += 1;
        } else {
            b.applied.cancel_missed += 1;
        }
        Ok(())
    }

    /// Adds to `b` the removal of the pending record with id `key`, replaced by a record that
    /// fires at once and is never stored.
    fn replace_id(&self, b: &mut Building<'_, '_>, key: IdKey) -> Result<()> {
        if self.remove_id(b, key)? {
            b.applied.replaced += 1;
        }
        Ok(())
    }

    /// Adds to `b` the removal of the pending record with id `key` and of the id's mapping;
    /// whether there was one.
    fn remove_id(&self, b: &mut Building<'_, '_>, key: IdKey) -> Result<bool> {
        let removed = match self.lookup_id(&b.overlay, &key)? {
            Some((old, old_due)) => {
                self.remove_pending(b, old, old_due)?;
                b.batch.delete::<Ids>(&key);
                true
            }
            None => false,
        };
        b.overlay.insert(key, None);
        Ok(removed)
    }

    /// Adds to `b` the deletion of a pending record (replaced or cancelled) and its index entry.
    fn remove_pending(&self, b: &mut Building<'_, '_>, old: RecordId, old_due: u64) -> Result<()> {
        b.forget.push(old);
        let target = self.target_of(&b.new_targets, old, old_due)?;
        b.counted.push(target, old_due, false);
        b.batch.delete::<Records>(&RecordKey::new(old));
        b.batch.delete::<Due>(&DueKey::new(old_due, old));
        b.delta -= 1;
        Ok(())
    }

    /// Keeps the records of a batch due by `now_ms` plus the window in memory. A
    /// record a later op of the same batch replaced or cancelled is not pending: only the last
    /// op on an id is kept, and nothing after a cancel of it.
    fn keep_near(&self, ops: &[IngestOp], now_ms: u64) {
        let until = now_ms.saturating_add(self.keep_within_ms);
        let mut firing = self.lock_firing();
        let near = &mut firing.near;
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
                IngestOp::Fire { pid, record, .. } => {
                    if let Some(id) = record.id() {
                        ids_seen.insert((*pid, id));
                    }
                }
                IngestOp::Skip { .. } => {}
            }
        }
    }

    /// Takes records out of memory before RocksDB deletes or moves them.
    pub(super) fn forget_near(&self, ids: impl IntoIterator<Item = RecordId>) {
        let mut ids = ids.into_iter().peekable();
        if ids.peek().is_none() {
            return;
        }
        let mut firing = self.lock_firing();
        for id in ids {
            firing.near.forget(id);
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
        let v = self.get_pinned::<Due>(&DueKey::new(due, rid), "due read")?;
        Ok(Cow::Owned(
            v.map(|v| String::from_utf8_lossy(&v).into_owned())
                .unwrap_or_default(),
        ))
    }

    pub(super) fn record_id(&self, pid: Pid, offset: i64) -> Result<RecordId> {
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
        overlay: &HashMap<IdKey, Option<(RecordId, u64)>>,
        key: &IdKey,
    ) -> Result<Option<(RecordId, u64)>> {
        if let Some(v) = overlay.get(key) {
            return Ok(*v);
        }
        self.mapped_id(key)
    }

    /// Where the id mapping `key` points: the pending record and its due time.
    pub(super) fn mapped_id(&self, key: &IdKey) -> Result<Option<(RecordId, u64)>> {
        let Some(v) = self.get_pinned::<Ids>(key, "id read")? else {
            return Ok(None);
        };
        IdValue::split(&v).map(Some).ok_or(StoreError::Corrupt {
            what: "ids",
            detail: "value is not 16 bytes".into(),
        })
    }
}
