//! The scheduler task: the only owner of the timing wheel.
//!
//! It waits on three things at once: new pending records (from ingest, from the admin API and
//! retries from publish), the wheel's next deadline, and shutdown. Due records go to the
//! publisher in batches through a bounded channel; when that channel is full the due entries
//! simply stay in the wheel and inserts keep being accepted, so firing never blocks ingest.
//!
//! Bounded memory: the wheel holds only records due before `loaded_until`, which is kept about
//! one horizon ahead of the clock. Records due later stay only in RocksDB's due index and are
//! loaded in order, a chunk per turn of the loop between firings, when the clock comes within
//! three quarters of a horizon of `loaded_until`. Memory then follows the arrival rate times the
//! horizon, not the number pending. `loaded_until` moves to the end of a range *before* the
//! range is read, so a record written while it is being read is either seen by the read (it was
//! written first) or arrives as an insert below `loaded_until` and is held: never neither (a
//! record seen both ways fires once; the publisher skips the second entry).
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
use tracing::warn;

use crate::clock::Clock;
use crate::metrics::Metrics;
use crate::store::{due_key_after, RecordId, Store, StoreError};
use crate::wheel::{Elapsed, Wheel};

/// Most records handed to the publisher in one batch.
const MAX_BATCH: usize = 512;
/// Longest sleep, so that a wall clock jumping forwards is noticed within this time.
const MAX_SLEEP_MS: u64 = 250;
/// Due-index entries read per turn of the loop while loading (about a millisecond of reading).
const LOAD_CHUNK: usize = 4_096;
/// Wait before reading the due index again after a read error.
const LOAD_RETRY_MS: u64 = 1_000;

/// A record whose time has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Due {
    /// The record.
    pub id: RecordId,
    /// The time it was scheduled for in the wheel (its due time, or a retry time).
    pub at_ms: u64,
}

/// What the scheduler is sent: `(due_ms, id)` entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wake {
    /// Records whose `(due, id)` is in RocksDB's due index (new, moved or recovered): those due
    /// at or after the horizon are left there for the loader.
    Indexed(Vec<(u64, RecordId)>),
    /// Timers that exist only in memory (delivery retries): always held.
    Retry(Vec<(u64, RecordId)>),
}

/// Sends new pending records to the scheduler.
pub type Inserts = mpsc::Sender<Wake>;

/// Where the scheduler reads pending records from as its horizon advances: RocksDB's due index
/// in the broker, a model in tests.
pub trait DueIndex: Send + Sync + std::fmt::Debug + 'static {
    /// Entries with `from <= (due, id)` and `due < until`, in `(due, id)` order, at most `limit`.
    ///
    /// # Errors
    /// A read failure; the scheduler tries the same range again a second later.
    fn due_range(
        &self,
        from: (u64, RecordId),
        until: u64,
        limit: usize,
    ) -> Result<Vec<(u64, RecordId)>, StoreError>;
}

impl DueIndex for Store {
    fn due_range(
        &self,
        from: (u64, RecordId),
        until: u64,
        limit: usize,
    ) -> Result<Vec<(u64, RecordId)>, StoreError> {
        Store::due_range(self, from, until, limit)
    }
}

/// A range of the due index being read into the wheel.
#[derive(Debug, Clone, Copy)]
struct Loading {
    /// The next entry to read.
    next: (u64, RecordId),
    /// End of the range (exclusive), already published as `loaded_until`.
    until: u64,
    /// Do not read before this time (after a read error).
    not_before: u64,
}

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
    index: Arc<dyn DueIndex>,
    /// How far ahead of the clock the wheel holds records.
    horizon_ms: u64,
    /// Every pending record due before this time is in the wheel (or being read into it).
    loaded_until: u64,
    loading: Option<Loading>,
    /// Turns true when the first load (recovery up to the horizon) is complete.
    armed: watch::Sender<bool>,
}

impl Scheduler {
    /// A scheduler whose wheel starts at the clock's current time, holding records due within
    /// `horizon_ms` of the clock and reading the rest from `index` as time goes on. Its first
    /// turn starts loading everything due before `now + horizon` (recovery).
    pub fn new(
        clock: Arc<dyn Clock>,
        metrics: Metrics,
        index: Arc<dyn DueIndex>,
        horizon_ms: u64,
    ) -> Self {
        Self {
            wheel: Wheel::new(clock.now_ms()),
            ready: VecDeque::new(),
            held: BinaryHeap::new(),
            clock,
            metrics,
            index,
            horizon_ms: horizon_ms.max(4),
            loaded_until: 0,
            loading: None,
            armed: watch::channel(false).0,
        }
    }

    /// Turns true once everything due within the horizon at start has been read into the wheel.
    pub fn armed(&self) -> watch::Receiver<bool> {
        self.armed.subscribe()
    }

    /// Entries the scheduler is told about: indexed ones beyond `loaded_until` are left to the
    /// loader (they are in RocksDB), everything else is held.
    fn wake(&mut self, wake: Wake) {
        match wake {
            Wake::Indexed(entries) => {
                let until = self.loaded_until;
                self.hold(entries.into_iter().filter(|&(due, _)| due < until));
            }
            Wake::Retry(entries) => self.hold(entries.into_iter()),
        }
    }

    fn hold(&mut self, entries: impl Iterator<Item = (u64, RecordId)>) {
        let now = self.clock.now_ms();
        for (due, id) in entries {
            match self.wheel.insert(due, id.0) {
                Ok(_) => {}
                Err(Elapsed { due, .. }) if due <= now => self.ready.push_back((due, id)),
                Err(Elapsed { due, .. }) => self.held.push(Reverse((due, id))),
            }
        }
    }

    /// Whether the clock has come within three quarters of a horizon of `loaded_until` (and no
    /// range is being read).
    fn load_needed(&self, now: u64) -> bool {
        self.loading.is_none()
            && self.loaded_until.saturating_add(self.horizon_ms / 4)
                <= now.saturating_add(self.horizon_ms)
    }

    /// Starts reading `[loaded_until, now + horizon)`, publishing the new `loaded_until` first.
    fn start_load(&mut self, now: u64) {
        let target = now.saturating_add(self.horizon_ms);
        self.loading = Some(Loading {
            next: (self.loaded_until, RecordId(0)),
            until: target,
            not_before: 0,
        });
        self.loaded_until = target;
        self.metrics
            .wheel
            .loaded_until
            .set((target / 1_000).min(i64::MAX as u64) as i64);
    }

    /// Reads one chunk of the range being loaded into the wheel.
    fn load_chunk(&mut self, now: u64) {
        let Some(mut l) = self.loading else { return };
        if now < l.not_before {
            return;
        }
        match self.index.due_range(l.next, l.until, LOAD_CHUNK) {
            Ok(entries) => {
                let done = entries.len() < LOAD_CHUNK;
                if let Some(&(due, id)) = entries.last() {
                    l.next = due_key_after(due, id);
                }
                self.metrics.wheel.loaded.inc_by(entries.len() as u64);
                self.hold(entries.into_iter());
                if done {
                    self.loading = None;
                    self.armed.send_replace(true);
                } else {
                    self.loading = Some(l);
                }
            }
            Err(e) => {
                warn!(error = %e, from = l.next.0, until = l.until,
                      "cannot read pending records from RocksDB; trying again");
                l.not_before = now + LOAD_RETRY_MS;
                self.loading = Some(l);
            }
        }
    }

    /// Whether a load is waiting to read its next chunk now.
    fn loading_now(&self, now: u64) -> bool {
        self.loading.is_some_and(|l| now >= l.not_before)
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
                .fire
                .lateness
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
        mut inserts: mpsc::Receiver<Wake>,
        out: mpsc::Sender<Vec<Due>>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut batch: Vec<Due> = Vec::new();
        loop {
            let now = self.clock.now_ms();
            if self.load_needed(now) {
                // Inserts sent before the range is read are taken under the old bound (the
                // read finds the ones beyond it), so that a record is not held twice.
                while let Ok(wake) = inserts.try_recv() {
                    self.wake(wake);
                }
                self.start_load(now);
            }
            if batch.len() < MAX_BATCH {
                self.collect(now, &mut batch);
            }
            self.metrics.wheel.entries.set(self.len() as i64);
            if !batch.is_empty() {
                match out.try_send(std::mem::take(&mut batch)) {
                    Ok(()) => continue,
                    Err(mpsc::error::TrySendError::Full(b)) => batch = b,
                    Err(mpsc::error::TrySendError::Closed(_)) => return,
                }
            }
            // One chunk of loading per turn, after firing what is due.
            self.load_chunk(now);
            let sleep = if self.loading_now(now) {
                Duration::ZERO
            } else {
                wait_for(self.next_wake(), self.clock.now_us())
            };
            tokio::select! {
                biased;
                _ = shutdown.changed() => return,
                msg = inserts.recv() => match msg {
                    Some(wake) => self.wake(wake),
                    None => return,
                },
                permit = out.reserve(), if !batch.is_empty() => match permit {
                    Ok(permit) => permit.send(std::mem::take(&mut batch)),
                    Err(_) => return,
                },
                _ = tokio::time::sleep(sleep), if batch.is_empty() => {}
            }
        }
    }
}

/// How long to sleep for the wall clock to reach `next_ms` (at most [`MAX_SLEEP_MS`]), from
/// `now_us`: to the due millisecond's start, not a whole number of milliseconds from somewhere
/// inside the current one, which would add up to a millisecond to every firing.
fn wait_for(next_ms: Option<u64>, now_us: u64) -> Duration {
    let max = MAX_SLEEP_MS * 1_000;
    let us = next_ms.map_or(max, |next| {
        next.saturating_mul(1_000)
            .saturating_sub(now_us)
            .clamp(1, max)
    });
    Duration::from_micros(us)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    use prometheus::Registry;

    const T0: u64 = 1_763_700_000_000;

    #[test]
    fn sleeps_end_at_the_due_millisecond_not_a_whole_millisecond_later() {
        // 0.9 ms into millisecond 100, due at 101: wake 0.1 ms from now.
        assert_eq!(wait_for(Some(101), 100_900), Duration::from_micros(100));
        assert_eq!(wait_for(Some(105), 100_000), Duration::from_millis(5));
        // Never a busy loop, never longer than the longest sleep.
        assert_eq!(wait_for(Some(100), 100_500), Duration::from_micros(1));
        assert_eq!(wait_for(None, 100_000), Duration::from_millis(MAX_SLEEP_MS));
        assert_eq!(
            wait_for(Some(u64::MAX), 100_000),
            Duration::from_millis(MAX_SLEEP_MS)
        );
    }

    struct Harness {
        clock: ManualClock,
        inserts: Inserts,
        out: mpsc::Receiver<Vec<Due>>,
        index: Arc<Model>,
        _shutdown: watch::Sender<bool>,
    }

    /// What ingest does: writes the records to the due index, then tells the scheduler.
    async fn send(
        h: &Harness,
        entries: Vec<(u64, RecordId)>,
    ) -> Result<(), mpsc::error::SendError<Wake>> {
        h.index
            .0
            .lock()
            .unwrap()
            .extend(entries.iter().map(|&(d, id)| (d, id.0)));
        h.inserts.send(Wake::Indexed(entries)).await
    }

    /// RocksDB's due index, as a model.
    #[derive(Debug, Default)]
    struct Model(std::sync::Mutex<std::collections::BTreeSet<(u64, u64)>>);

    impl DueIndex for Model {
        fn due_range(
            &self,
            from: (u64, RecordId),
            until: u64,
            limit: usize,
        ) -> Result<Vec<(u64, RecordId)>, StoreError> {
            Ok(self
                .0
                .lock()
                .unwrap()
                .range((from.0, from.1 .0)..(until, 0))
                .take(limit)
                .map(|&(d, id)| (d, RecordId(id)))
                .collect())
        }
    }

    fn start(out_capacity: usize) -> Harness {
        start_with(out_capacity, Arc::new(Model::default()), 86_400_000)
    }

    fn start_with(out_capacity: usize, index: Arc<Model>, horizon_ms: u64) -> Harness {
        let clock = ManualClock::new(T0);
        let metrics = Metrics::new(&Registry::new(), &Default::default()).unwrap();
        let scheduler = Scheduler::new(Arc::new(clock.clone()), metrics, index.clone(), horizon_ms);
        let (tx, rx) = mpsc::channel(16);
        let (out_tx, out_rx) = mpsc::channel(out_capacity);
        let (stop_tx, stop_rx) = watch::channel(false);
        tokio::spawn(scheduler.run(rx, out_tx, stop_rx));
        Harness {
            clock,
            inserts: tx,
            out: out_rx,
            index,
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
        send(&h, vec![(T0 + 5_000, rid(1)), (T0 + 1_000, rid(2))])
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
        send(&h, (0..10).map(|i| (T0 - 1_000 + i, rid(i))).collect())
            .await
            .unwrap();
        settle().await;
        let fired: Vec<u64> = drain(&mut h).iter().map(|d| d.id.0).collect();
        assert_eq!(fired, (0..10).collect::<Vec<_>>());
    }

    #[tokio::test(start_paused = true)]
    async fn a_clock_jumping_back_an_hour_never_fires_early() {
        let mut h = start(8);
        send(&h, vec![(T0 + 2_000, rid(1))]).await.unwrap();
        h.clock.set(T0 + 1_500);
        settle().await;
        h.clock.set(T0 + 1_500 - 3_600_000);
        // An insert that the wheel considers elapsed but that is ahead of the clock now.
        send(&h, vec![(T0 + 1_000, rid(2))]).await.unwrap();
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
        send(
            &h,
            (0..2_000).map(|i| (T0 + 1 + i * 1_000, rid(i))).collect(),
        )
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
        send(&h, (0..3_000).map(|i| (T0 - 1, rid(i))).collect())
            .await
            .unwrap();
        settle().await;
        // Inserts are still accepted while the publisher is not reading.
        for i in 0..32 {
            tokio::time::timeout(
                Duration::from_secs(1),
                send(&h, vec![(T0 + 50, rid(10_000 + i))]),
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

    #[tokio::test(start_paused = true)]
    async fn records_beyond_the_horizon_wait_in_the_index_and_fire_on_time() {
        let index = Arc::new(Model::default());
        let horizon = 10_000;
        // Recovery: one record inside the horizon, one far beyond it.
        index
            .0
            .lock()
            .unwrap()
            .extend([(T0 + 5_000, 1), (T0 + 60_000, 2)]);
        let mut h = start_with(8, index.clone(), horizon);
        // A new record beyond the horizon.
        send(&h, vec![(T0 + 30_000, rid(3))]).await.unwrap();
        settle().await;
        let mut fired = Vec::new();
        let mut t = T0;
        while t <= T0 + 70_000 {
            h.clock.set(t);
            settle().await;
            for d in drain(&mut h) {
                assert!(d.at_ms <= t, "fired {} ms early", d.at_ms - t);
                assert!(t - d.at_ms < 100, "fired {} ms late", t - d.at_ms);
                index.0.lock().unwrap().remove(&(d.at_ms, d.id.0));
                fired.push(d.id.0);
            }
            t += 100;
        }
        assert_eq!(fired, vec![1, 3, 2]);
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// A new record due this many ms after the current time (may be in the past).
        Add(i64),
        /// The clock moves forward this many ms.
        Advance(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (-500i64..20_000).prop_map(Op::Add),
            2 => (0u64..3_000).prop_map(Op::Advance),
        ]
    }

    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// Against a model of the due index, with a horizon much shorter than the delays: every
        /// record fires exactly once, never before its due time, and in the first turn after
        /// it (never late at the horizon boundary); the wheel never holds a record due beyond
        /// the horizon.
        #[test]
        fn the_horizon_never_makes_a_record_early_late_or_lost(
            recovered in proptest::collection::vec(0u64..20_000, 0..50),
            ops in proptest::collection::vec(op(), 1..80),
            horizon in 1_000u64..6_000,
        ) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap();
            rt.block_on(async move {
                let index = Arc::new(Model::default());
                let mut next_id = 0u64;
                let mut due_of = std::collections::HashMap::new();
                for d in &recovered {
                    index.0.lock().unwrap().insert((T0 + d, next_id));
                    due_of.insert(next_id, T0 + d);
                    next_id += 1;
                }
                let registry = Registry::new();
                let metrics = Metrics::new(&registry, &Default::default()).unwrap();
                let clock = ManualClock::new(T0);
                let scheduler = Scheduler::new(
                    Arc::new(clock.clone()), metrics.clone(), index.clone(), horizon);
                let (tx, rx) = mpsc::channel(16);
                let (out_tx, mut out) = mpsc::channel(1_024);
                let (_stop, stop_rx) = watch::channel(false);
                tokio::spawn(scheduler.run(rx, out_tx, stop_rx));
                let mut now = T0;
                let mut fired = std::collections::HashSet::new();
                let ops = ops.into_iter().chain(std::iter::once(Op::Advance(25_000)));
                for op in ops {
                    match op {
                        Op::Add(delta) => {
                            let due = now.saturating_add_signed(delta);
                            index.0.lock().unwrap().insert((due, next_id));
                            due_of.insert(next_id, due);
                            tx.send(Wake::Indexed(vec![(due, RecordId(next_id))])).await.unwrap();
                            next_id += 1;
                        }
                        Op::Advance(ms) => {
                            // In steps, so that lateness is measured per turn.
                            let end = now + ms;
                            while now < end {
                                now = (now + 200).min(end);
                                clock.set(now);
                                tokio::time::sleep(Duration::from_millis(MAX_SLEEP_MS * 3)).await;
                                while let Ok(batch) = out.try_recv() {
                                    for d in batch {
                                        let due = due_of[&d.id.0];
                                        assert_eq!(d.at_ms, due);
                                        assert!(due <= now, "fired {} ms early", due - now);
                                        assert!(fired.insert(d.id.0), "{} fired twice", d.id.0);
                                        // The publisher deletes what it delivered.
                                        index.0.lock().unwrap().remove(&(due, d.id.0));
                                    }
                                }
                                let late: Vec<_> = index.0.lock().unwrap().iter()
                                    .filter(|(d, _)| *d <= now).copied().collect();
                                assert!(late.is_empty(), "due but not fired at {now}: {late:?}");
                                let within = index.0.lock().unwrap().iter()
                                    .filter(|(d, _)| *d < now + horizon).count();
                                let in_wheel = metrics.wheel.entries.get() as usize;
                                assert!(in_wheel <= within,
                                    "{in_wheel} in the wheel, only {within} due within the horizon");
                            }
                        }
                    }
                }
                assert_eq!(fired.len() as u64, next_id, "every record fired");
            });
        }
    }
}
