//! The scheduler task: the only owner of the timing wheel.
//!
//! It waits on three things at once: new pending records (from ingest, from recovery and retries
//! from publish), the wheel's next deadline, and shutdown. Due records go to the publisher in
//! batches through a bounded channel; when that channel is full the due entries simply stay in
//! the wheel and inserts keep being accepted, so firing never blocks ingest.
//!
//! Never early: an entry leaves only when the wall clock reads at least its due time. If the
//! clock went backwards after the wheel advanced, entries the wheel already found due are held
//! in a small heap until the clock catches up again. A clock that jumps forwards makes
//! everything that became due fire at once, bounded by the publisher's in-flight window.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use crate::clock::Clock;
use crate::metrics::Metrics;
use crate::store::RecordId;
use crate::wheel::{Elapsed, Wheel};

/// Most records handed to the publisher in one batch.
const MAX_BATCH: usize = 512;
/// Longest sleep, so that a wall clock jumping forwards is noticed within this time.
const MAX_SLEEP_MS: u64 = 250;

/// A record whose time has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Due {
    /// The record.
    pub id: RecordId,
    /// The time it was scheduled for in the wheel (its due time, or a retry time).
    pub at_ms: u64,
}

/// Sends new pending records to the scheduler: `(due_ms, id)`.
pub type Inserts = mpsc::Sender<Vec<(u64, RecordId)>>;

/// The scheduler task's state.
#[derive(Debug)]
pub struct Scheduler {
    wheel: Wheel<u64>,
    /// Already due when inserted, in arrival order.
    ready: VecDeque<(u64, RecordId)>,
    /// Found due by the wheel but after the current (backwards-jumped) clock.
    held: BinaryHeap<Reverse<(u64, RecordId)>>,
    clock: Arc<dyn Clock>,
    metrics: Metrics,
}

impl Scheduler {
    /// A scheduler whose wheel starts at the clock's current time.
    pub fn new(clock: Arc<dyn Clock>, metrics: Metrics) -> Self {
        Self {
            wheel: Wheel::new(clock.now_ms()),
            ready: VecDeque::new(),
            held: BinaryHeap::new(),
            clock,
            metrics,
        }
    }

    fn insert(&mut self, entries: Vec<(u64, RecordId)>) {
        let now = self.clock.now_ms();
        for (due, id) in entries {
            match self.wheel.insert(due, id.0) {
                Ok(_) => {}
                Err(Elapsed { due, .. }) if due <= now => self.ready.push_back((due, id)),
                Err(Elapsed { due, .. }) => self.held.push(Reverse((due, id))),
            }
        }
    }

    /// Moves due entries into `batch`, at most up to [`MAX_BATCH`]: held entries the clock has
    /// reached, then records that were already due on insert, then the wheel.
    fn collect(&mut self, now: u64, batch: &mut Vec<Due>) {
        while batch.len() < MAX_BATCH {
            let (due, id) = match self.held.peek() {
                Some(&Reverse((due, id))) if due <= now => {
                    self.held.pop();
                    (due, id)
                }
                _ => match self.ready.pop_front() {
                    Some(entry) => entry,
                    None => match self.wheel.poll(now) {
                        Some((due, raw)) => (due, RecordId(raw)),
                        None => break,
                    },
                },
            };
            if due > now {
                // The clock went backwards after this entry was found due: wait for it.
                self.held.push(Reverse((due, id)));
                continue;
            }
            self.metrics
                .fire_lateness
                .observe(now.saturating_sub(due) as f64 / 1000.0);
            batch.push(Due { id, at_ms: due });
        }
    }

    fn next_wake(&self) -> Option<u64> {
        let held = self.held.peek().map(|r| r.0 .0);
        let ready = self.ready.front().map(|e| e.0);
        [self.wheel.next_deadline(), held, ready]
            .into_iter()
            .flatten()
            .min()
    }

    /// Number of entries waiting to fire.
    pub fn len(&self) -> usize {
        self.wheel.len() + self.ready.len() + self.held.len()
    }

    /// Whether nothing waits to fire.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs until `shutdown` turns true or a channel closes.
    pub async fn run(
        mut self,
        mut inserts: mpsc::Receiver<Vec<(u64, RecordId)>>,
        out: mpsc::Sender<Vec<Due>>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut batch: Vec<Due> = Vec::new();
        loop {
            let now = self.clock.now_ms();
            if batch.len() < MAX_BATCH {
                self.collect(now, &mut batch);
            }
            self.metrics.wheel_entries.set(self.len() as i64);
            if !batch.is_empty() {
                match out.try_send(std::mem::take(&mut batch)) {
                    Ok(()) => continue,
                    Err(mpsc::error::TrySendError::Full(b)) => batch = b,
                    Err(mpsc::error::TrySendError::Closed(_)) => return,
                }
            }
            let sleep_ms = self.next_wake().map_or(MAX_SLEEP_MS, |w| {
                w.saturating_sub(now).clamp(1, MAX_SLEEP_MS)
            });
            tokio::select! {
                biased;
                _ = shutdown.changed() => return,
                msg = inserts.recv() => match msg {
                    Some(entries) => self.insert(entries),
                    None => return,
                },
                permit = out.reserve(), if !batch.is_empty() => match permit {
                    Ok(permit) => permit.send(std::mem::take(&mut batch)),
                    Err(_) => return,
                },
                _ = tokio::time::sleep(Duration::from_millis(sleep_ms)), if batch.is_empty() => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use prometheus::Registry;

    const T0: u64 = 1_763_700_000_000;

    struct Harness {
        clock: ManualClock,
        inserts: Inserts,
        out: mpsc::Receiver<Vec<Due>>,
        _shutdown: watch::Sender<bool>,
    }

    fn start(out_capacity: usize) -> Harness {
        let clock = ManualClock::new(T0);
        let metrics = Metrics::new(&Registry::new()).unwrap();
        let scheduler = Scheduler::new(Arc::new(clock.clone()), metrics);
        let (tx, rx) = mpsc::channel(16);
        let (out_tx, out_rx) = mpsc::channel(out_capacity);
        let (stop_tx, stop_rx) = watch::channel(false);
        tokio::spawn(scheduler.run(rx, out_tx, stop_rx));
        Harness {
            clock,
            inserts: tx,
            out: out_rx,
            _shutdown: stop_tx,
        }
    }

    fn rid(n: u64) -> RecordId {
        RecordId(n)
    }

    async fn settle() {
        // Let the scheduler run through a few of its (virtual-time) wake-ups.
        tokio::time::sleep(Duration::from_millis(MAX_SLEEP_MS * 3)).await;
    }

    fn drain(h: &mut Harness) -> Vec<Due> {
        let mut all = Vec::new();
        while let Ok(b) = h.out.try_recv() {
            all.extend(b);
        }
        all
    }

    #[tokio::test(start_paused = true)]
    async fn fires_when_the_clock_reaches_the_due_time_and_not_before() {
        let mut h = start(8);
        h.inserts
            .send(vec![(T0 + 5_000, rid(1)), (T0 + 1_000, rid(2))])
            .await
            .unwrap();
        settle().await;
        assert!(drain(&mut h).is_empty());
        h.clock.set(T0 + 999);
        settle().await;
        assert!(drain(&mut h).is_empty(), "one millisecond early");
        h.clock.set(T0 + 1_000);
        settle().await;
        assert_eq!(
            drain(&mut h),
            vec![Due {
                id: rid(2),
                at_ms: T0 + 1_000
            }]
        );
        h.clock.set(T0 + 10_000);
        settle().await;
        assert_eq!(
            drain(&mut h),
            vec![Due {
                id: rid(1),
                at_ms: T0 + 5_000
            }]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn overdue_records_fire_at_once_in_order() {
        let mut h = start(8);
        h.inserts
            .send((0..10).map(|i| (T0 - 1_000 + i, rid(i))).collect())
            .await
            .unwrap();
        settle().await;
        let fired: Vec<u64> = drain(&mut h).iter().map(|d| d.id.0).collect();
        assert_eq!(fired, (0..10).collect::<Vec<_>>());
    }

    #[tokio::test(start_paused = true)]
    async fn a_clock_jumping_back_an_hour_never_fires_early() {
        let mut h = start(8);
        h.inserts.send(vec![(T0 + 2_000, rid(1))]).await.unwrap();
        h.clock.set(T0 + 1_500);
        settle().await;
        h.clock.set(T0 + 1_500 - 3_600_000);
        // An insert that the wheel considers elapsed but that is ahead of the clock now.
        h.inserts.send(vec![(T0 + 1_000, rid(2))]).await.unwrap();
        settle().await;
        assert!(drain(&mut h).is_empty());
        h.clock.set(T0 + 1_000);
        settle().await;
        assert_eq!(
            drain(&mut h),
            vec![Due {
                id: rid(2),
                at_ms: T0 + 1_000
            }]
        );
        h.clock.set(T0 + 2_000);
        settle().await;
        assert_eq!(
            drain(&mut h),
            vec![Due {
                id: rid(1),
                at_ms: T0 + 2_000
            }]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_clock_jumping_forward_fires_what_became_due_and_keeps_the_rest() {
        let mut h = start(64);
        h.inserts
            .send((0..2_000).map(|i| (T0 + 1 + i * 1_000, rid(i))).collect())
            .await
            .unwrap();
        settle().await;
        h.clock.set(T0 + 1_000_000);
        settle().await;
        let fired = drain(&mut h);
        assert_eq!(fired.len(), 1_000);
        assert!(fired.iter().all(|d| d.at_ms <= T0 + 1_000_000));
        assert!(fired.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_publisher_does_not_block_inserts_or_lose_entries() {
        let mut h = start(1);
        // 3,000 due records: more than one batch, with room for only one batch in the channel.
        h.inserts
            .send((0..3_000).map(|i| (T0 - 1, rid(i))).collect())
            .await
            .unwrap();
        settle().await;
        // Inserts are still accepted while the publisher is not reading.
        for i in 0..32 {
            tokio::time::timeout(
                Duration::from_secs(1),
                h.inserts.send(vec![(T0 + 50, rid(10_000 + i))]),
            )
            .await
            .expect("insert accepted")
            .unwrap();
        }
        h.clock.set(T0 + 100);
        let mut all = Vec::new();
        while all.len() < 3_032 {
            let batch = tokio::time::timeout(Duration::from_secs(5), h.out.recv())
                .await
                .expect("batches keep coming")
                .unwrap();
            assert!(batch.len() <= MAX_BATCH);
            all.extend(batch);
        }
        let mut ids: Vec<u64> = all.iter().map(|d| d.id.0).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), 3_032);
    }
}
