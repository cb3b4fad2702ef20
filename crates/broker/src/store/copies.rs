//! The counts of the partitions this instance only keeps a copy of (standby replicas), so
//! that what it reports as its own pending, by target and by due time, leaves them out:
//! summed over a group, each record counts once.
//!
//! A copy is counted once it is warm ([`Store::count_copy`], a read of its records); from
//! then on every write to it (a catch-up, a drop) changes its counts too. The counts are
//! forgotten when the partition is owned here ([`Store::own`]) or dropped.

use std::collections::HashMap;

use kafka_delay_core::id::{Pid, RecordId};
use kafka_delay_core::record::StoredRecord;

use super::codec::RecordKey;
use super::column::Records;
use super::stats::{PendingStats, Snapshot, Summed};
use super::{io, Result, Store, StoreError};

/// Counts by copied partition.
pub(super) type Copies = HashMap<Pid, PendingStats>;

impl Store {
    pub(super) fn lock_copies(&self) -> std::sync::MutexGuard<'_, Copies> {
        self.copies.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts the records of `pid`, a copy of a partition owned elsewhere, and from now on
    /// keeps its counts apart (unless it is owned here by then). Returns how many records it
    /// holds. Reads every record of the partition.
    ///
    /// # Errors
    /// A read failure or a corrupt record.
    pub fn count_copy(&self, pid: Pid) -> Result<u64> {
        let mut read = rocksdb::ReadOptions::default();
        read.set_iterate_lower_bound(RecordKey::new(RecordId(u64::from(pid) << 48)).as_ref());
        read.set_iterate_upper_bound(RecordKey::new(RecordId((u64::from(pid) + 1) << 48)).as_ref());
        // Under the write lock: no write to the partition between the read and the start of
        // the counting of its writes.
        let writes = self.lock_writes();
        let mut it = self.db.raw_iterator_cf_opt(self.cf::<Records>(), read);
        it.seek_to_first();
        let (mut n, mut counts) = (0, PendingStats::default());
        while let Some(v) = it.value() {
            let rec =
                StoredRecord::from_bytes(v.to_vec()).map_err(|detail| StoreError::Corrupt {
                    what: "records",
                    detail,
                })?;
            counts.add(rec.target(), rec.due_ms());
            n += 1;
            it.next();
        }
        it.status().map_err(io("copy count"))?;
        self.lock_copies().insert(pid, counts);
        drop(writes);
        // A partition owned here meanwhile is not a copy (`own` forgets it too, under the
        // same lock).
        let firing = self.lock_firing();
        if firing.owned.contains(pid) {
            self.lock_copies().remove(&pid);
        }
        Ok(n)
    }

    /// Counts a write to `pid` in its copy's counts, when it is a counted copy (called under
    /// the write lock).
    pub(super) fn copy_changed(&self, pid: Pid, counted: &Summed<'_>) {
        if let Some(c) = self.lock_copies().get_mut(&pid) {
            c.apply(counted);
        }
    }

    /// Forgets the counts of `pid` as a copy (it is owned here now, or gone).
    pub(super) fn forget_copy(&self, pid: Pid) {
        self.lock_copies().remove(&pid);
    }

    /// Pending counts by target and due bucket of the partitions this instance owns (its
    /// standby copies left out), as of `now_ms`.
    pub fn owned_stats(&self, now_ms: u64) -> Snapshot {
        let all = self.lock_writes().clone();
        let mut copies = PendingStats::default();
        for c in self.lock_copies().values() {
            copies.absorb(c);
        }
        all.minus(&copies).snapshot(now_ms)
    }
}
