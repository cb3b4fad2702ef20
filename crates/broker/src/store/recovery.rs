//! What `open` restores: the pending counts (read back, or counted once from the due index),
//! the pending total and the low-water mark; and how every write batch keeps the counts.

use std::sync::atomic::Ordering;

use super::codec::{Count, CountKey, DueKey, MetaKey};
use super::column::{Batch, Counts, Due, Meta};
use super::stats::{PendingStats, Summed};
use super::{io, Result, Store, StoreError};
use kafka_delay_core::id::RecordId;

impl Store {
    /// Adds to `batch` the new value of every persisted count that `changes` (target, due,
    /// added) touch, computed from `stats` (the counts before the batch; they are updated once
    /// the batch is written).
    pub(super) fn put_counts(
        &self,
        batch: &mut Batch<'_>,
        stats: &PendingStats,
        changes: &Summed<'_>,
    ) {
        for (key, n) in stats.persisted_after(changes) {
            let key = CountKey::from_stats(key);
            if n == 0 {
                batch.delete::<Counts>(&key);
            } else {
                batch.put::<Counts>(&key, &Count::new(n));
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
            .get_pinned::<Meta>(&MetaKey::counts_kept(), "meta read")?
            .is_some();
        if !kept {
            let count = self.scan_due(|_, _| {})?;
            let stats = self.lock_writes();
            let mut batch = self.batch();
            batch.clear_counts();
            for (key, n) in stats.persisted() {
                batch.put::<Counts>(&CountKey::from_stats(key), &Count::new(n));
            }
            batch.put::<Meta>(&MetaKey::counts_kept(), b"1");
            self.write_required(batch, "counts write")?;
            return Ok((count, true));
        }
        let mut stats = self.lock_writes();
        let entries = self
            .db
            .iterator_cf(self.cf::<Counts>(), rocksdb::IteratorMode::Start)
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
        let mut stats = self.lock_writes();
        self.delete_gathered_or_warn();
        stats.clear();
        let mut iter = self.db.raw_iterator_cf(self.cf::<Due>());
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
}

/// The due time and id of the due-index entry under `iter`.
pub(super) fn due_entry_key(iter: &rocksdb::DBRawIterator<'_>) -> Result<(u64, RecordId)> {
    let key = iter.key().unwrap_or_default();
    DueKey::split(key).ok_or_else(|| StoreError::Corrupt {
        what: "due",
        detail: format!("key of {} bytes", key.len()),
    })
}

/// The target topic stored with the due-index entry under `iter`.
pub(super) fn due_entry_target(iter: &rocksdb::DBRawIterator<'_>) -> String {
    String::from_utf8_lossy(iter.value().unwrap_or_default()).into_owned()
}
