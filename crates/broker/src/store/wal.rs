//! Which writes fsync the write-ahead log when `sync` is on.
//!
//! A write whose loss in a power failure would lose something must be synced before anyone
//! relies on it: an ingest batch (its source offsets are committed to Kafka afterwards) and an
//! operator's cancel or move. The delete after delivery is different: losing it delivers its
//! records once more after the restart, which at-least-once delivery allows, so it does not
//! wait for an fsync of its own. RocksDB's log is one file written in order, so the next synced
//! write makes every earlier delete durable too; while deliveries go on without any synced
//! write, one delete is synced every `interval`, and the publisher syncs what is still owed
//! once its deliveries pause ([`crate::store::Store::sync_if_owed`]). A power failure can then
//! deliver again the records delivered within about `interval` before it, besides those in
//! flight.
//!
//! Before this, every delete after delivery and every gathered due-index delete was synced
//! too: with `--sync` they were about half of all fsyncs (docs/decisions.md).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long deletes after delivery may go without an fsync while they go on.
pub const DEFERRED_SYNC: Duration = Duration::from_millis(100);

/// The sync rule, and when the log was last synced.
#[derive(Debug)]
pub(super) struct WalSync {
    on: bool,
    interval: Duration,
    base: Instant,
    /// When a synced write last finished, in microseconds since `base` (0: never).
    last_us: AtomicU64,
    /// A deferred write went without its fsync and nothing has synced the log since.
    owed: AtomicBool,
}

impl WalSync {
    pub(super) fn new(on: bool, interval: Duration) -> Self {
        Self {
            on,
            interval,
            base: Instant::now(),
            last_us: AtomicU64::new(0),
            owed: AtomicBool::new(false),
        }
    }

    /// How long deferred writes may go without an fsync while they go on.
    pub(super) fn interval(&self) -> Duration {
        self.interval
    }

    /// Whether a write that must be durable when it returns syncs the log: whenever `sync` is on.
    pub(super) fn required(&self) -> bool {
        self.on
    }

    /// Whether a write whose loss only repeats work (a delete after delivery) syncs the log
    /// at `now`: when the log has gone unsynced for `interval`.
    pub(super) fn due(&self, now: Instant) -> bool {
        if !self.on {
            return false;
        }
        let last = self.last_us.load(Ordering::Relaxed);
        last == 0 || self.since_base(now).saturating_sub(last) >= self.interval.as_micros() as u64
    }

    /// A write that syncs the log is about to start. The debt is cleared before it, not after:
    /// a deferred write finished before this point lies before the fsync in the log and is
    /// covered by it, one finished after it sets the debt again. A failed write puts it back
    /// ([`WalSync::failed`]).
    pub(super) fn syncing(&self) {
        if self.on {
            self.owed.store(false, Ordering::Release);
        }
    }

    /// A write has finished: `synced` says whether it synced the log.
    pub(super) fn written(&self, synced: bool, now: Instant) {
        if !self.on {
            return;
        }
        if synced {
            self.last_us
                .fetch_max(self.since_base(now).max(1), Ordering::Relaxed);
        } else {
            self.owed.store(true, Ordering::Release);
        }
    }

    /// A write that was to sync the log failed: whatever was owed may still be.
    pub(super) fn failed(&self) {
        if self.on {
            self.owed.store(true, Ordering::Release);
        }
    }

    /// Whether a deferred write is still waiting for an fsync.
    pub(super) fn owed(&self) -> bool {
        self.owed.load(Ordering::Acquire)
    }

    fn since_base(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.base).as_micros() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deferred_write_syncs_only_when_the_log_went_unsynced_for_the_interval() {
        let wal = WalSync::new(true, Duration::from_millis(100));
        let t0 = wal.base + Duration::from_secs(1);
        // Never synced yet: the first deferred write syncs.
        assert!(wal.due(t0));
        wal.syncing();
        wal.written(true, t0);
        assert!(!wal.owed());
        assert!(!wal.due(t0 + Duration::from_millis(99)));
        wal.written(false, t0 + Duration::from_millis(99));
        assert!(wal.owed(), "a skipped fsync is owed");
        assert!(wal.due(t0 + Duration::from_millis(100)));
        // An ingest batch's synced write pays what was owed and restarts the interval.
        wal.syncing();
        assert!(!wal.owed());
        // A deferred write finished while it syncs may lie after its fsync: owed again.
        wal.written(false, t0 + Duration::from_millis(140));
        wal.written(true, t0 + Duration::from_millis(150));
        assert!(wal.owed());
        wal.syncing();
        wal.failed();
        assert!(wal.owed(), "a failed sync pays nothing");
        wal.syncing();
        wal.written(true, t0 + Duration::from_millis(150));
        assert!(!wal.owed());
        assert!(!wal.due(t0 + Duration::from_millis(200)));
        assert!(wal.due(t0 + Duration::from_millis(250)));
    }

    #[test]
    fn without_sync_nothing_is_synced_or_owed() {
        let wal = WalSync::new(false, Duration::from_millis(100));
        let t0 = wal.base + Duration::from_secs(1);
        assert!(!wal.due(t0));
        wal.written(false, t0);
        assert!(!wal.owed());
        assert!(!wal.due(t0 + Duration::from_secs(10)));
    }
}
