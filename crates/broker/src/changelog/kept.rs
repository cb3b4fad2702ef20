//! Revoked partitions kept for a while (without standby copies): a partition that comes back
//! soon (its new owner was a member removed as gone that rejoined, or a rebalance moved it and
//! moved it back) restores only the changelog's tail from its local checkpoint, not the whole
//! changelog. Its state is dropped once the group has gone on without it for
//! [`KEEP_REVOKED`]: that time counts from the first assignment this instance gets after the
//! revoke, so a partition lost while no rebalance can complete (Kafka down longer than the
//! session: every member loses everything) waits for the group to come back, where it is
//! usually handed back. [`KEEP_AT_MOST`] bounds it whatever happens.
//!
//! A kept partition neither fires nor ingests here (it is not owned); the restore that brings
//! it back replays every change its changelog received meanwhile, as it does for an instance
//! restarted on its data directory.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use kafka_delay_core::id::Pid;

/// How long the local state of a revoked partition stays once the group has settled without
/// it.
pub const KEEP_REVOKED: Duration = Duration::from_secs(60);

/// The longest a revoked partition's state stays, settled or not: far inside the changelog's
/// `delete.retention.ms` (a day by default), so the tail a restore reads from the checkpoint
/// still holds every tombstone written since.
pub const KEEP_AT_MOST: Duration = Duration::from_secs(600);

/// One kept partition.
#[derive(Debug, Clone, Copy)]
struct Entry {
    revoked: Instant,
    /// The first assignment after the revoke (a rebalance that completed without it).
    settled: Option<Instant>,
    records: u64,
}

impl Entry {
    fn expiry(&self) -> Instant {
        let longest = self.revoked + KEEP_AT_MOST;
        self.settled
            .map_or(longest, |s| (s + KEEP_REVOKED).min(longest))
    }
}

/// The revoked partitions kept here: when each goes, and its records (for the gauges).
#[derive(Debug, Default)]
pub struct Kept {
    kept: HashMap<Pid, Entry>,
}

impl Kept {
    /// `pid`, with `records`, was revoked at `now`.
    pub fn revoked(&mut self, pid: Pid, records: u64, now: Instant) {
        let entry = Entry {
            revoked: now,
            settled: None,
            records,
        };
        self.kept.insert(pid, entry);
    }

    /// A rebalance completed at `now` (an assignment, empty or not): the partitions kept
    /// since before it have [`KEEP_REVOKED`] from now.
    pub fn settled(&mut self, now: Instant) {
        for e in self.kept.values_mut() {
            e.settled.get_or_insert(now);
        }
    }

    /// `pid` is assigned here again: no longer a kept copy.
    pub fn assigned(&mut self, pid: Pid) {
        self.kept.remove(&pid);
    }

    /// When the next kept partition is due to go.
    pub fn next_expiry(&self) -> Option<Instant> {
        self.kept.values().map(Entry::expiry).min()
    }

    /// The partitions whose time is up at `now`, forgotten here (their state is to be dropped).
    pub fn expired(&mut self, now: Instant) -> Vec<Pid> {
        let gone: Vec<Pid> = (self.kept.iter())
            .filter(|(_, e)| e.expiry() <= now)
            .map(|(pid, _)| *pid)
            .collect();
        for pid in &gone {
            self.kept.remove(pid);
        }
        gone
    }

    /// How many partitions are kept, and their records.
    pub fn totals(&self) -> (usize, u64) {
        (self.kept.len(), self.kept.values().map(|e| e.records).sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_revoked_partition_goes_a_minute_after_the_group_settled_unless_it_comes_back() {
        let t0 = Instant::now();
        let mut kept = Kept::default();
        kept.revoked(1, 10, t0);
        kept.settled(t0);
        kept.revoked(2, 5, t0 + Duration::from_secs(5));
        kept.settled(t0 + Duration::from_secs(5));
        assert_eq!(kept.totals(), (2, 15));
        assert_eq!(kept.next_expiry(), Some(t0 + KEEP_REVOKED));
        assert!(kept.expired(t0 + KEEP_REVOKED - MS).is_empty());
        assert_eq!(kept.expired(t0 + KEEP_REVOKED), vec![1]);
        assert_eq!(kept.totals(), (1, 5));
        kept.assigned(2);
        assert_eq!(kept.totals(), (0, 0));
        assert_eq!(kept.next_expiry(), None);
        assert!(kept.expired(t0 + 10 * KEEP_REVOKED).is_empty());
    }

    #[test]
    fn a_partition_revoked_again_is_kept_from_its_latest_revoke() {
        let t0 = Instant::now();
        let mut kept = Kept::default();
        kept.revoked(1, 10, t0);
        kept.settled(t0);
        kept.assigned(1);
        let later = t0 + Duration::from_secs(30);
        kept.revoked(1, 12, later);
        kept.settled(later);
        assert!(kept.expired(t0 + KEEP_REVOKED).is_empty());
        assert_eq!(kept.expired(later + KEEP_REVOKED), vec![1]);
    }

    /// Kafka down past the session: every partition is lost and no rebalance completes until
    /// it is back, however long that takes; the minute starts then.
    #[test]
    fn the_minute_starts_when_a_rebalance_completes_after_the_revoke() {
        let t0 = Instant::now();
        let mut kept = Kept::default();
        kept.revoked(1, 10, t0);
        let back = t0 + Duration::from_secs(90);
        assert!(
            kept.expired(back).is_empty(),
            "no rebalance yet: still kept"
        );
        kept.settled(back);
        kept.settled(back + Duration::from_secs(20)); // a later one does not restart it
        assert_eq!(kept.next_expiry(), Some(back + KEEP_REVOKED));
        assert!(kept.expired(back + KEEP_REVOKED - MS).is_empty());
        assert_eq!(kept.expired(back + KEEP_REVOKED), vec![1]);
    }

    #[test]
    fn a_partition_is_never_kept_past_the_longest_wait() {
        let t0 = Instant::now();
        let mut kept = Kept::default();
        kept.revoked(1, 10, t0);
        assert_eq!(kept.next_expiry(), Some(t0 + KEEP_AT_MOST));
        kept.revoked(2, 3, t0);
        kept.settled(t0 + KEEP_AT_MOST - Duration::from_secs(1));
        assert!(kept.expired(t0 + KEEP_AT_MOST - MS).is_empty());
        let mut gone = kept.expired(t0 + KEEP_AT_MOST);
        gone.sort_unstable();
        assert_eq!(gone, vec![1, 2]);
    }
}
