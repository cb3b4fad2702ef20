//! kafka-delay's time: its own wall clock, held back to the Kafka cluster's where that one is
//! behind. Consumers judge "early" by when a record reached its target, which is the Kafka
//! cluster's clock (a target with `LogAppendTime` stamps it so); a wall clock stepped ahead
//! here would fire records early by it. The cluster's clock is learnt from the append times
//! of this instance's own writes to its changelog (created with `LogAppendTime`): each says
//! the cluster read at least that time when the acknowledgement arrived, which the monotonic
//! clock (never stepped) carries forward ([`LowerBound`]).

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use kafka_delay_core::clock::{Clock, LowerBound};
use rdkafka::Timestamp;
use tracing::warn;

/// The latest timestamp a producer reported for a write's records, kept without a lock (each
/// report notes one from the producer's polling thread; the writer reads it once the last is
/// in) for the clock to learn from.
#[derive(Debug, Default)]
pub struct LatestStamp {
    /// `0` (none yet), [`CREATE_TIME`] or [`APPEND_TIME`].
    kind: AtomicU8,
    ms: AtomicI64,
}

const CREATE_TIME: u8 = 1;
const APPEND_TIME: u8 = 2;

impl LatestStamp {
    /// A report's timestamp (one that has none changes nothing).
    pub fn note(&self, stamp: Timestamp) {
        let (kind, ms) = match stamp {
            Timestamp::NotAvailable => return,
            Timestamp::CreateTime(ms) => (CREATE_TIME, ms),
            Timestamp::LogAppendTime(ms) => (APPEND_TIME, ms),
        };
        self.ms.store(ms, Ordering::Relaxed);
        self.kind.store(kind, Ordering::Release);
    }

    /// The latest timestamp noted.
    pub fn get(&self) -> Option<Timestamp> {
        let ms = self.ms.load(Ordering::Relaxed);
        match self.kind.load(Ordering::Acquire) {
            CREATE_TIME => Some(Timestamp::CreateTime(ms)),
            APPEND_TIME => Some(Timestamp::LogAppendTime(ms)),
            _ => None,
        }
    }
}

/// The Kafka cluster's clock as far as this instance's acknowledged writes show it.
#[derive(Debug)]
pub struct KafkaClock {
    start: Instant,
    bound: Mutex<LowerBound>,
    /// The bound's reading at monotonic 0 (`i64::MIN`: nothing learnt), for readers: every
    /// clock reading asks it, so it takes no lock.
    at_zero_us: AtomicI64,
    said_create_time: AtomicBool,
}

impl Default for KafkaClock {
    fn default() -> Self {
        Self {
            start: Instant::now(),
            bound: Mutex::new(LowerBound::default()),
            at_zero_us: AtomicI64::new(i64::MIN),
            said_create_time: AtomicBool::new(false),
        }
    }
}

impl KafkaClock {
    /// Learns from the acknowledgement, just received, of a record of any topic: its time
    /// when the topic keeps Kafka's append times.
    pub fn appended(&self, stamp: Timestamp) {
        if let Timestamp::LogAppendTime(ms) = stamp {
            let seen = self.mono_us();
            let mut bound = self.bound.lock().unwrap_or_else(|e| e.into_inner());
            bound.sample(ms.max(0) as u64, seen);
            if let Some(at) = bound.at(seen) {
                (self.at_zero_us).store(at as i64 - seen as i64, Ordering::Relaxed);
            }
        }
    }

    /// [`Self::appended`] for a changelog topic, which should keep Kafka's append times: one
    /// that keeps the writers' is said once, with the fix.
    pub fn acknowledged(&self, topic: &str, stamp: Timestamp) {
        match stamp {
            Timestamp::LogAppendTime(_) => self.appended(stamp),
            Timestamp::CreateTime(_) if !self.said_create_time.swap(true, Ordering::Relaxed) => {
                warn!(%topic, "this topic keeps the writers' times, not Kafka's: records fire by this instance's clock alone, which must not run ahead of Kafka's; to hold them back to Kafka's clock: kafka-configs --alter --entity-type topics --entity-name {topic} --add-config message.timestamp.type=LogAppendTime");
            }
            _ => {}
        }
    }

    /// The least the cluster's clock reads now, in epoch microseconds, once learnt.
    pub fn lower_bound_us(&self) -> Option<u64> {
        let at_zero = self.at_zero_us.load(Ordering::Relaxed);
        (at_zero != i64::MIN).then(|| (at_zero + self.mono_us() as i64).max(0) as u64)
    }

    fn mono_us(&self) -> u64 {
        self.start.elapsed().as_micros() as u64
    }
}

/// `wall`, held back to the Kafka cluster's clock where that reads less.
#[derive(Debug)]
pub struct HeldBack {
    wall: Arc<dyn Clock>,
    kafka: Arc<KafkaClock>,
    /// False only where a test took the hold-back out ([`crate::failpoint::hold_back`]).
    hold: bool,
}

impl HeldBack {
    /// `wall` held back to `kafka`.
    pub fn new(wall: Arc<dyn Clock>, kafka: Arc<KafkaClock>) -> Self {
        let hold = crate::failpoint::hold_back();
        Self { wall, kafka, hold }
    }

    /// `wall` held back to a cluster clock that learns from acknowledgements from now on.
    pub fn learning(wall: Arc<dyn Clock>) -> Arc<Self> {
        Arc::new(Self::new(wall, Arc::new(KafkaClock::default())))
    }

    /// The cluster's clock it is held back to.
    pub fn kafka(&self) -> &Arc<KafkaClock> {
        &self.kafka
    }

    /// How far the wall clock runs ahead of the cluster's, in microseconds (0 when it does
    /// not, or nothing was learnt yet).
    pub fn ahead_us(&self) -> u64 {
        let wall = self.wall.now_us();
        self.kafka
            .lower_bound_us()
            .map_or(0, |k| wall.saturating_sub(k))
    }
}

impl Clock for HeldBack {
    fn now_ms(&self) -> u64 {
        self.now_us() / 1_000
    }

    fn now_us(&self) -> u64 {
        let wall = self.wall.now_us();
        match self.kafka.lower_bound_us() {
            Some(k) if self.hold => wall.min(k),
            _ => wall,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_delay_core::clock::ManualClock;

    #[test]
    fn a_wall_clock_ahead_of_kafka_is_held_back_and_one_behind_is_not() {
        let kafka = Arc::new(KafkaClock::default());
        let wall = ManualClock::new(1_000_000);
        let held = HeldBack::new(Arc::new(wall.clone()), kafka.clone());
        // Nothing learnt: the wall clock as it is.
        assert_eq!(held.now_ms(), 1_000_000);
        // Writers' times say nothing about Kafka's clock.
        kafka.acknowledged("t", Timestamp::CreateTime(5));
        assert_eq!(held.now_ms(), 1_000_000);
        // Kafka appended a record at 999_000: the wall clock runs at least 1 s ahead (less the
        // time since that acknowledgement), and is held back to Kafka's.
        kafka.acknowledged("t", Timestamp::LogAppendTime(999_000));
        let now = held.now_ms();
        assert!((999_000..999_100).contains(&now), "{now}");
        assert!(held.ahead_us() >= 900_000, "{}", held.ahead_us());
        // A wall clock behind Kafka's is used as it is: never ahead of either.
        wall.set(998_000);
        assert_eq!(held.now_ms(), 998_000);
        assert_eq!(held.ahead_us(), 0);
    }
}
