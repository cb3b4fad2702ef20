use super::*;
use kafka_delay_core::clock::ManualClock;

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
