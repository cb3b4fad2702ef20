//! The due-index entries of delivered records, gathered and deleted together: adjacent ones go
//! as one range tombstone instead of a point tombstone each (see `Store::due_garbage`).

use rocksdb::{ReadOptions, WriteOptions};

use super::codec::DueKey;
use super::column::{key_after, Batch, Due};
use super::{io, Result, Store};

/// Due-index entries of delivered records gathered before they are deleted together (see
/// `Store::due_garbage`): 1 MB of keys, about half a second of deliveries at 130K records/s.
/// Far more than the publisher's in-flight window (10,000 records by default), because the
/// entries of records still in flight lie among the gathered ones and end their runs, and each
/// end costs an iterator seek through every memtable and table file of the index: with a few
/// thousand almost every entry is a run of its own once the index has table files, several
/// times the cost per record of this many (docs/decisions.md).
pub(super) const GATHER_DUE_DELETES: usize = if cfg!(test) { 16 } else { 65_536 };

/// Shortest run of adjacent due-index entries deleted with one range tombstone. A range
/// tombstone costs more than a point one to insert and every read of the index consults it, so
/// pairs and triples are deleted one by one.
const RANGE_DELETE_MIN: usize = 4;

impl Store {
    /// Deletes the gathered due-index entries of records already deleted. The caller holds
    /// `writes` (so that no index write comes between the read of what lies between them and
    /// the delete). Every read of the index whose answer someone sees calls it first: the head
    /// seek, the scan, the admin listing, the flush at shutdown.
    ///
    /// # Errors
    /// A read or write failure; the entries stay gathered then.
    fn delete_gathered(&self) -> Result<()> {
        let mut garbage = self.lock_garbage();
        if garbage.is_empty() {
            return Ok(());
        }
        let mut batch = self.batch();
        // Sorted and deduplicated in place: the list stays as valid if the write fails.
        self.delete_due_entries(&mut batch, &mut garbage)?;
        // Never synced: losing it leaves entries whose records are gone, which are skipped and
        // gathered again after a restart.
        self.db
            .write_opt(batch.into_inner(), &WriteOptions::default())
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

    /// [`Store::delete_gathered_or_warn`] for a caller that does not hold `writes`.
    pub(super) fn delete_gathered_locked(&self) {
        let _writes = self.lock_writes();
        self.delete_gathered_or_warn();
    }

    /// Adds to `batch` the deletion of these due-index entries. Records are delivered about in
    /// due order, so the entries gathered over many deliveries mostly lie next to each other in
    /// the index (one delete batch alone does not: its delivery reports come per target
    /// partition, and a partition's records are every n-th in due order): each run of at least
    /// [`RANGE_DELETE_MIN`] of them with no other entry in between goes as one range tombstone,
    /// the rest one by one. A point tombstone is a memtable insert (a skip-list search) per
    /// entry, which made the due index's deletes more than half of the delete after delivery's
    /// cost (`bench store-cycle`). Which entries lie in between is read with an iterator bounded
    /// to the batch's first and last entry, under `writes` (every write to the index takes it),
    /// so no entry can appear there before the batch is written; one written later has a later
    /// sequence number, which a range tombstone does not cover.
    pub(super) fn delete_due_entries(
        &self,
        batch: &mut Batch<'_>,
        keys: &mut Vec<DueKey>,
    ) -> Result<()> {
        keys.sort_unstable();
        keys.dedup();
        let keys: &[DueKey] = keys;
        let (Some(first), Some(last)) = (keys.first(), keys.last()) else {
            return Ok(());
        };
        if keys.len() < RANGE_DELETE_MIN {
            delete_run(batch, keys);
            return Ok(());
        }
        let mut opts = ReadOptions::default();
        // Entries deleted by earlier range tombstones are seen as if still there: that can only
        // end a run early, never delete an entry in use. Reading the tombstones would rebuild
        // the memtable's list of them after every new one (measured: a tenth of all CPU time
        // end to end). RocksDB deprecated the option as without effect when `DeleteRange` is
        // not used; it is used here.
        #[allow(deprecated)]
        opts.set_ignore_range_deletions(true);
        opts.set_iterate_lower_bound(first.as_ref().to_vec());
        opts.set_iterate_upper_bound(key_after(last.as_ref()));
        let mut iter = self.db.raw_iterator_cf_opt(self.cf::<Due>(), opts);
        iter.seek_to_first();
        // The iterator is at the first entry after the previous key of the run; an entry
        // before this key that is not one of the batch's ends the run.
        let mut start = 0;
        for (i, key) in keys.iter().enumerate() {
            if iter.valid() && iter.key().is_some_and(|k| k < key.as_ref()) {
                delete_run(batch, &keys[start..i]);
                start = i;
                iter.seek(key);
            }
            if iter.valid() && iter.key() == Some(key.as_ref()) {
                iter.next();
            }
        }
        iter.status().map_err(io("due read"))?;
        delete_run(batch, &keys[start..]);
        Ok(())
    }
}

/// Deletes due-index entries with no other entry between them: one range tombstone for a run
/// of at least [`RANGE_DELETE_MIN`], point tombstones for a shorter one.
fn delete_run(batch: &mut Batch<'_>, run: &[DueKey]) {
    match (run.first(), run.last()) {
        (Some(first), Some(last)) if run.len() >= RANGE_DELETE_MIN => {
            batch.delete_range::<Due>(first, last);
        }
        _ => {
            for key in run {
                batch.delete::<Due>(key);
            }
        }
    }
}
