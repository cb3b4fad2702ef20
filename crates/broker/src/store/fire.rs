//! The fire path, whole: [`Store::claim`] and [`Store::read_claimed`] (claim each record, take
//! it from memory or read it), [`Store::delivered`] (the delete after delivery), and
//! [`Store::sync_if_owed`] (the fsync a delete went without).
//!
//! A claim makes the record this caller's until it is deleted or released: a second timer for
//! it (an operator moved it) finds it claimed and skips it, and no other delete after delivery
//! can remove it meanwhile. The change count read with the claim ([`ReadMark`]) lets the delete
//! skip its re-check: while the count has not moved, nothing but this caller has deleted or
//! moved any pending record, so each claimed record is still there, at the due time read.

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::Duration;

use kafka_delay_core::hashing::BuildMul;

use super::codec::{DueKey, IdKey, IdValue, RecordKey};
use super::column::{Ids, Records};
use super::near::Near;
use super::replica::Owned;
use super::stats::{Changes, PendingStats};
use super::{io, Result, Store, StoreError};
use kafka_delay_core::id::{Pid, RecordId};
use kafka_delay_core::record::StoredRecord;

/// What the `firing` lock guards: records kept in memory and the records claimed.
#[derive(Debug)]
pub(super) struct Firing {
    /// Records due soon, in memory as well (see [`near`](super::near)).
    pub(super) near: Near,
    /// Records claimed for firing and not yet deleted or released.
    claimed: HashSet<RecordId, BuildMul>,
    /// The source partitions whose records fire here.
    pub(super) owned: Owned,
}

impl Firing {
    pub(super) fn new(keep_bytes: usize) -> Self {
        Self {
            near: Near::new(keep_bytes),
            claimed: HashSet::default(),
            owned: Owned::All,
        }
    }

    /// How many records of `pid` are claimed.
    pub(super) fn claimed_of(&self, pid: Pid) -> usize {
        self.claimed.iter().filter(|id| id.pid() == pid).count()
    }

    /// Whether `rid` is claimed (being fired).
    pub(super) fn is_claimed(&self, rid: RecordId) -> bool {
        self.claimed.contains(&rid)
    }
}

/// The store's change count when records were claimed: give it back to [`Store::delivered`].
/// The lowest of several is the one that covers them all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ReadMark(pub(super) u64);

/// Records claimed for firing, those kept in memory already taken ([`Store::claim`]); the
/// others are read by [`Store::read_claimed`].
#[derive(Debug)]
pub struct Claim {
    /// The claimed timers, as `(at_ms, id)`.
    timers: Vec<(u64, RecordId)>,
    /// Their records taken from memory; `None` where one is still to be read.
    found: Vec<Option<StoredRecord>>,
    read_at: ReadMark,
    already_claimed: usize,
    not_owned: usize,
}

impl Claim {
    /// The claimed timers, as `(at_ms, id)`.
    pub fn timers(&self) -> &[(u64, RecordId)] {
        &self.timers
    }

    /// Whether [`Store::read_claimed`] must read RocksDB (and so block on I/O) for this claim.
    pub fn needs_read(&self) -> bool {
        self.found.iter().any(Option::is_none)
    }
}

/// A claimed record to publish.
#[derive(Debug)]
pub struct ToFire {
    /// The time its timer was set for (its due time, or a retry time).
    pub at_ms: u64,
    /// The record's id.
    pub id: RecordId,
    /// The record as it is now.
    pub record: StoredRecord,
}

/// Claimed records, read for firing ([`Store::read_claimed`]).
#[derive(Debug)]
pub struct FireBatch {
    /// The records to publish, claimed; each is deleted by [`Store::delivered`] or given back
    /// by [`Store::release`].
    pub records: Vec<ToFire>,
    /// Timers whose record is not pending any more (cancelled, replaced, or delivered before a
    /// crash that lost the deletion of its due-index entry): not claimed, and their due-index
    /// entries gathered for deletion.
    pub gone: Vec<RecordId>,
    /// Timers whose record an operator moved later: not claimed; the timer at the new time
    /// fires it.
    pub moved: Vec<RecordId>,
    /// Timers whose record was claimed already (being published through another timer).
    pub already_claimed: usize,
    /// Timers of partitions that do not fire here (being restored, or gone to another
    /// instance): dropped; a partition that starts firing here hands its timers over again.
    pub not_owned: usize,
    /// The change count the records were read at.
    pub read_at: ReadMark,
}

/// The read before firing failed: the claims are given back.
#[derive(Debug, thiserror::Error)]
#[error("cannot read {} claimed records for firing: {error}", .timers.len())]
pub struct ReadFailed {
    /// What failed.
    #[source]
    pub error: StoreError,
    /// The timers claimed, as `(at_ms, id)`, to try again.
    pub timers: Vec<(u64, RecordId)>,
}

impl Store {
    /// Claims the records of `timers` (`(at_ms, id)` as the scheduler hands them out) that are
    /// not claimed already, and takes those kept in memory. Never blocks on I/O; the rest is
    /// read by [`Store::read_claimed`].
    pub fn claim(&self, timers: impl IntoIterator<Item = (u64, RecordId)>) -> Claim {
        let timers = timers.into_iter();
        let mut claimed = Vec::with_capacity(timers.size_hint().0);
        let (mut already_claimed, mut not_owned) = (0, 0);
        let mut firing = self.lock_firing();
        let Firing {
            near,
            claimed: set,
            owned,
        } = &mut *firing;
        for (at_ms, id) in timers {
            if !owned.contains(id.pid()) {
                not_owned += 1;
            } else if set.insert(id) {
                claimed.push((at_ms, id));
            } else {
                already_claimed += 1;
            }
        }
        let read_at = ReadMark(self.changes.load(Ordering::Acquire));
        let mut found: Vec<Option<StoredRecord>> = Vec::with_capacity(claimed.len());
        if near.enabled() {
            found.extend(claimed.iter().map(|&(_, id)| near.take(id)));
        } else {
            found.resize_with(claimed.len(), || None);
        }
        Claim {
            timers: claimed,
            found,
            read_at,
            already_claimed,
            not_owned,
        }
    }

    /// Reads the claimed records not taken from memory (one batched read, only if
    /// [`Claim::needs_read`]) and sorts them: to publish, gone, moved. Gone and moved ones are
    /// released, and the due-index entries of gone ones gathered for deletion.
    ///
    /// # Errors
    /// A read failure or an undecodable record: every claim is released then.
    pub fn read_claimed(&self, claim: Claim) -> std::result::Result<FireBatch, ReadFailed> {
        let Claim {
            timers,
            mut found,
            read_at,
            already_claimed,
            not_owned,
        } = claim;
        if let Err(error) = self.read_missing(|i| timers[i].1, &mut found) {
            self.release(timers.iter().map(|t| t.1));
            return Err(ReadFailed { error, timers });
        }
        let mut records = Vec::with_capacity(timers.len());
        let (mut gone, mut moved) = (Vec::new(), Vec::new());
        for ((at_ms, id), record) in timers.into_iter().zip(found) {
            match record {
                None => gone.push((at_ms, id)),
                Some(record) if record.due_ms() > at_ms => moved.push(id),
                Some(record) => records.push(ToFire { at_ms, id, record }),
            }
        }
        if !gone.is_empty() {
            // An entry whose record is gone serves nothing; one still in use cannot be among
            // them, since an entry names its record's id.
            self.lock_garbage()
                .extend(gone.iter().map(|&(at_ms, id)| DueKey::new(at_ms, id)));
        }
        let gone: Vec<RecordId> = gone.into_iter().map(|(_, id)| id).collect();
        if !gone.is_empty() || !moved.is_empty() {
            self.release(gone.iter().chain(&moved).copied());
        }
        Ok(FireBatch {
            records,
            gone,
            moved,
            already_claimed,
            not_owned,
            read_at,
        })
    }

    /// [`Store::claim`] then [`Store::read_claimed`], on one thread.
    ///
    /// # Errors
    /// As [`Store::read_claimed`].
    pub fn claim_and_read(
        &self,
        timers: impl IntoIterator<Item = (u64, RecordId)>,
    ) -> std::result::Result<FireBatch, ReadFailed> {
        self.read_claimed(self.claim(timers))
    }

    /// Whether `rid` is being fired (claimed, not yet deleted or released).
    pub fn is_claimed(&self, rid: RecordId) -> bool {
        self.lock_firing().is_claimed(rid)
    }

    /// Whether operators must leave `rid` alone now: it is being fired, and records being
    /// fired are protected ([`Store::protect_claimed`]).
    pub fn is_protected(&self, rid: RecordId) -> bool {
        self.protect_claimed.load(Ordering::Relaxed) && self.is_claimed(rid)
    }

    /// From now on operators' cancels and moves leave records being fired alone (exactly-once:
    /// a record moved while its transaction commits would fire twice).
    pub fn protect_claimed(&self) {
        self.protect_claimed.store(true, Ordering::Relaxed);
    }

    /// Gives back the claims of records that will not be deleted after delivery now (held by a
    /// fire limit, to be retried, or whose delete was given up).
    pub fn release(&self, ids: impl IntoIterator<Item = RecordId>) {
        let mut firing = self.lock_firing();
        for id in ids {
            firing.claimed.remove(&id);
        }
    }

    /// Deletes records that were delivered (or dead-lettered), claimed and read at `read_at`,
    /// in one batch, and releases their claims. A record already gone (cancelled or replaced
    /// meanwhile) is skipped, one an operator moved goes from its new time; an id mapping is
    /// deleted only while it still points at the deleted record. While the store's change
    /// count is still `read_at`, nothing else has deleted or moved a pending record since, so
    /// the read that would check them is skipped.
    ///
    /// The records, their id mappings and the counts go at once; their due-index entries are
    /// gathered and deleted with the next few thousand (see the module doc). The write does
    /// not wait for an fsync of its own (see [`wal`](super::wal)): [`Store::sync_if_owed`].
    ///
    /// # Errors
    /// A read or write failure; nothing is deleted then, and the claims stay: call it again,
    /// or [`Store::release`] to give up.
    pub fn delivered(
        &self,
        done: &[(RecordId, &StoredRecord)],
        read_at: ReadMark,
    ) -> Result<usize> {
        let removed = {
            let mut stats = self.lock_writes();
            let mut garbage = self.lock_garbage();
            let current = self.due_now(done, read_at)?;
            let unmap = self.still_mapped(done, &current)?;
            self.delete_delivered(&mut stats, &mut garbage, done, &current, unmap)?
        };
        self.release(done.iter().map(|(id, _)| *id));
        Ok(removed)
    }

    /// Which of `done` are still there and their due time now (an operator may have moved one
    /// while it was delivered): one batched read under the lock, only when something could
    /// have deleted or moved one of them since they were read.
    fn due_now(
        &self,
        done: &[(RecordId, &StoredRecord)],
        read_at: ReadMark,
    ) -> Result<Vec<Option<u64>>> {
        if read_at == ReadMark(self.changes.load(Ordering::Acquire)) {
            return Ok(done.iter().map(|(_, rec)| Some(rec.due_ms())).collect());
        }
        let keys: Vec<RecordKey> = done.iter().map(|(rid, _)| RecordKey::new(*rid)).collect();
        self.db
            .batched_multi_get_cf(self.cf::<Records>(), keys.iter(), false)
            .into_iter()
            .map(|r| {
                let v = r.map_err(io("record read"))?;
                v.map(|v| stored_due(&v)).transpose()
            })
            .collect()
    }

    /// The id key to delete with each of `done`: only where the record is still there and its
    /// mapping still points at it (one batched read).
    fn still_mapped(
        &self,
        done: &[(RecordId, &StoredRecord)],
        current: &[Option<u64>],
    ) -> Result<Vec<Option<IdKey>>> {
        let id_keys: Vec<(usize, IdKey)> = done
            .iter()
            .enumerate()
            .filter(|&(i, _)| current[i].is_some())
            .filter_map(|(i, (rid, rec))| rec.id().map(|id| (i, IdKey::new(rid.pid(), id))))
            .collect();
        let mut unmap: Vec<Option<IdKey>> = vec![None; done.len()];
        let mapped =
            self.db
                .batched_multi_get_cf(self.cf::<Ids>(), id_keys.iter().map(|(_, k)| k), false);
        for ((i, key), v) in id_keys.into_iter().zip(mapped) {
            let v = v.map_err(io("id read"))?;
            if v.as_deref()
                .and_then(IdValue::split)
                .is_some_and(|(m, _)| m == done[i].0)
            {
                unmap[i] = Some(key);
            }
        }
        Ok(unmap)
    }

    /// Writes the delete after delivery of the records of `done` still there (`current`), and
    /// gathers their due-index entries, or deletes them with those gathered once enough are.
    fn delete_delivered(
        &self,
        stats: &mut PendingStats,
        garbage: &mut Vec<DueKey>,
        done: &[(RecordId, &StoredRecord)],
        current: &[Option<u64>],
        mut unmap: Vec<Option<IdKey>>,
    ) -> Result<usize> {
        let mut counted = Changes::default();
        let mut batch = self.batch();
        let mut seen: HashSet<RecordId, BuildMul> =
            HashSet::with_capacity_and_hasher(done.len(), BuildMul::default());
        let mut due_keys = Vec::with_capacity(done.len());
        let mut record_keys = Vec::with_capacity(done.len());
        for (i, (rid, rec)) in done.iter().enumerate() {
            let Some(due) = current[i] else { continue };
            if !seen.insert(*rid) {
                continue;
            }
            record_keys.push(RecordKey::new(*rid));
            due_keys.push(DueKey::new(due, *rid));
            if let Some(key) = unmap[i].take() {
                batch.delete::<Ids>(&key);
            }
            counted.push(Cow::Borrowed(rec.target()), due, false);
        }
        let removed = record_keys.len();
        // In key order: each tombstone's memtable insert then starts its search next to the
        // previous one's.
        record_keys.sort_unstable();
        for key in &record_keys {
            batch.delete::<Records>(key);
        }
        let flush = garbage.len() + due_keys.len() >= super::gather::GATHER_DUE_DELETES;
        if flush {
            let mut all = garbage.iter().chain(&due_keys).copied().collect();
            self.delete_due_entries(&mut batch, &mut all)?;
        }
        if removed > 0 || flush {
            let counted = counted.sum();
            self.put_counts(&mut batch, stats, &counted);
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

    /// While a delete after delivery is waiting for an fsync (only with `sync` on): how long
    /// deliveries may pause before [`Store::sync_if_owed`] should pay it.
    pub fn sync_owed(&self) -> Option<Duration> {
        self.wal.owed().then(|| self.wal.interval())
    }

    /// Syncs the write-ahead log if a delete after delivery went without it: called when
    /// deliveries pause, so that a power failure after a burst does not deliver the burst's
    /// last records again.
    ///
    /// # Errors
    /// The fsync failed; the debt stays.
    pub fn sync_if_owed(&self) -> Result<()> {
        if self.wal.owed() {
            self.wal.syncing();
            if let Err(e) = self.db.flush_wal(true) {
                self.wal.failed();
                return Err(io("write-ahead log sync")(e));
            }
            self.wal.written(true, std::time::Instant::now());
        }
        Ok(())
    }
}

/// The due time of an encoded record, without decoding the rest.
fn stored_due(bytes: &[u8]) -> Result<u64> {
    StoredRecord::due_of(bytes).ok_or_else(|| StoreError::Corrupt {
        what: "records",
        detail: format!("record of {} bytes without a due time", bytes.len()),
    })
}
