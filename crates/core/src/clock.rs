//! Wall-clock time in epoch milliseconds, behind a trait so tests can move time by hand.
//!
//! Due times are wall-clock epoch milliseconds because they must survive restarts. The rest of
//! the broker never calls `SystemTime::now()` directly; it asks a [`Clock`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of wall-clock time.
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;

    /// Microseconds since the Unix epoch, for waits that end on a millisecond boundary (the
    /// scheduler sleeps until the wall clock *reaches* a due millisecond, not for a whole number
    /// of milliseconds from somewhere inside the current one). Clocks without a finer reading
    /// give the start of the current millisecond.
    fn now_us(&self) -> u64 {
        self.now_ms() * 1_000
    }
}

/// The operating system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }

    fn now_us(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0)
    }
}

/// A clock that only moves when told to; clones share the same time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock reading `now_ms`.
    pub fn new(now_ms: u64) -> Self {
        Self {
            now: Arc::new(AtomicU64::new(now_ms)),
        }
    }

    /// Sets the time; it may move backwards, as a real wall clock can.
    pub fn set(&self, now_ms: u64) {
        self.now.store(now_ms, Ordering::SeqCst);
    }

    /// Moves the time forward by `ms`.
    pub fn advance(&self, ms: u64) {
        self.now.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
}

/// A clock that is the system clock plus a signed offset that can be changed at run time.
///
/// Used by integration tests to make the wall clock jump while the broker runs.
#[derive(Debug, Clone, Default)]
pub struct OffsetClock {
    offset_ms: Arc<std::sync::atomic::AtomicI64>,
}

impl OffsetClock {
    /// Sets the offset added to the system clock.
    pub fn set_offset_ms(&self, offset_ms: i64) {
        self.offset_ms.store(offset_ms, Ordering::SeqCst);
    }
}

impl Clock for OffsetClock {
    fn now_ms(&self) -> u64 {
        let now = SystemClock.now_ms() as i64 + self.offset_ms.load(Ordering::SeqCst);
        now.max(0) as u64
    }

    fn now_us(&self) -> u64 {
        let now = SystemClock.now_us() as i64 + self.offset_ms.load(Ordering::SeqCst) * 1_000;
        now.max(0) as u64
    }
}

/// How long the tightest sample of a [`LowerBound`] is kept before a looser, newer one may
/// replace it (the other clock may have been stepped back since).
pub const KEEP_SAMPLE_US: u64 = 60_000_000;

/// A lower bound on another clock's reading (the Kafka cluster's), learnt from that clock's
/// stamps of events this process saw happen: an event stamped `stamp_ms` there and seen here
/// at `seen_us` on a local monotonic clock happened before it was seen, so that clock read at
/// least `stamp_ms` at `seen_us` and at least `stamp_ms + (now_us - seen_us)` at `now_us`.
/// The tightest sample (the one seen soonest after it happened) of the last
/// [`KEEP_SAMPLE_US`] is kept.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct LowerBound {
    /// The other clock's reading minus the monotonic one, in microseconds, and when the
    /// sample was taken.
    best: Option<(i64, u64)>,
}

impl LowerBound {
    /// Learns from an event stamped `stamp_ms` by the other clock, seen at `seen_us`.
    pub fn sample(&mut self, stamp_ms: u64, seen_us: u64) {
        let offset = (stamp_ms as i64).saturating_mul(1_000) - seen_us as i64;
        let keep = self.best.is_some_and(|(best, taken)| {
            best >= offset && seen_us.saturating_sub(taken) < KEEP_SAMPLE_US
        });
        if !keep {
            self.best = Some((offset, seen_us));
        }
    }

    /// The least the other clock reads at `now_us` (epoch microseconds), once sampled.
    pub fn at(&self, now_us: u64) -> Option<u64> {
        self.best
            .map(|(offset, _)| (now_us as i64).saturating_add(offset).max(0) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told_and_is_shared() {
        let clock = ManualClock::new(1_000);
        let other = clock.clone();
        assert_eq!(clock.now_ms(), 1_000);
        other.advance(5);
        assert_eq!(clock.now_ms(), 1_005);
        other.set(10);
        assert_eq!(clock.now_ms(), 10);
    }

    #[test]
    fn the_microsecond_reading_lies_within_the_millisecond_reading() {
        let clock = OffsetClock::default();
        clock.set_offset_ms(-5_000);
        let (before, us, after) = (clock.now_ms(), clock.now_us(), clock.now_ms());
        assert!(
            before * 1_000 <= us && us < (after + 1) * 1_000,
            "{before} {us} {after}"
        );
        assert_eq!(ManualClock::new(7).now_us(), 7_000);
    }

    #[test]
    fn offset_clock_jumps() {
        let clock = OffsetClock::default();
        let before = clock.now_ms();
        clock.set_offset_ms(-3_600_000);
        assert!(clock.now_ms() + 3_500_000 < before + 1_000);
    }

    #[test]
    fn a_lower_bound_keeps_the_tightest_recent_sample_and_moves_with_the_monotonic_clock() {
        let mut b = LowerBound::default();
        assert_eq!(b.at(5), None);
        // Stamped 1_000 ms there, seen at 10 us here: at least 1_000_000 us there at 10 us.
        b.sample(1_000, 10);
        assert_eq!(b.at(10), Some(1_000_000));
        assert_eq!(b.at(2_010), Some(1_002_000));
        // A sample seen later after its event (a slower acknowledgement) is looser: kept out.
        b.sample(1_001, 5_000);
        assert_eq!(b.at(5_000), Some(1_004_990));
        // A tighter one replaces it.
        b.sample(1_010, 9_000);
        assert_eq!(b.at(9_000), Some(1_010_000));
        // After KEEP_SAMPLE_US a looser one replaces it too (the other clock went back).
        let later = 9_000 + KEEP_SAMPLE_US;
        b.sample(1_000, later);
        assert_eq!(b.at(later), Some(1_000_000));
    }
}
