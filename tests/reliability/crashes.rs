//! The broker's own process, clock and disk failing.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_at_random_moments_many_times_loses_nothing() {
    let cycles = env_u64("KAFKA_DELAY_CRASH_CYCLES", 20, 100);
    let (_sandbox, brokers) = process_kafka();
    let kafka = Kafka::External(brokers.clone());
    let t = Topics::new();
    kafka.create_topic(&t.delay, 1).await;
    let parts = kafka.create_topic(&t.target, 1).await;
    kafka.create_topic(&t.dlt, 1).await;
    let data = TempDir::new().unwrap();
    let port = free_port();
    let mut broker = spawn_broker(&brokers, &t, &data, port);
    wait_ready(port, Duration::from_secs(60)).await;

    // Records keep arriving during the first part of the run and come due throughout it.
    let n = (cycles * 100) as usize;
    let run_ms = cycles * 2_500;
    let (tally, dues) = tally(n, now_ms() + 3_000, run_ms / n as u64);
    collector(&kafka, &t.target, parts, tally.clone());
    let producer = kafka.producer();
    let feeder = {
        let (p, delay, target, tally, dues) = (
            producer.clone(),
            t.delay.clone(),
            t.target.clone(),
            tally.clone(),
            dues.clone(),
        );
        tokio::spawn(async move {
            for chunk in 0..(n / 100) {
                produce_plan(
                    &p,
                    &delay,
                    &target,
                    &tally,
                    &dues,
                    chunk * 100..(chunk + 1) * 100,
                )
                .await;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    let mut ready_after = Vec::new();
    for cycle in 0..cycles {
        // Mostly short lives; every fifth long enough for the consumer to rejoin its group.
        let life = if cycle % 5 == 4 {
            7_000
        } else {
            jitter(cycle, 200, 1_500)
        };
        tokio::time::sleep(Duration::from_millis(life)).await;
        broker.0.kill().expect("SIGKILL");
        broker.0.wait().unwrap();
        // Every other life runs with --sync (the WAL fsynced per ingest group): a kill loses
        // nothing either way.
        let sync: &[(&str, &str)] = if cycle % 2 == 0 {
            &[("KAFKA_DELAY_SYNC", "true")]
        } else {
            &[]
        };
        broker = spawn_broker_with(&brokers, &t, &data, port, sync);
        ready_after.push(wait_ready(port, Duration::from_secs(30)).await);
    }
    feeder.await.unwrap();
    let report = wait_complete(&tally, Duration::from_secs(120)).await;
    ready_after.sort();
    eprintln!(
        "kill -9 x{cycles}: {report:?}\nready after restart: median {:?}, max {:?}",
        ready_after[ready_after.len() / 2],
        ready_after.last().unwrap()
    );
    println!("{report}");
    assert_eq!(
        report.lost, 0,
        "lost after kill -9: {:?}",
        report.lost_sample
    );
    assert_eq!(report.early, 0, "fired early");
    assert!(
        report.duplicates <= cycles * 64,
        "duplicates {} over the in-flight window (64) per crash",
        report.duplicates
    );
}

/// The mode these steps are of: without the changelog (a crash between the RocksDB write and
/// the changelog's acknowledgement can fire that batch twice after a restart with it).
const LOCAL: (&str, &str) = ("KAFKA_DELAY_NO_CHANGELOG", "true");

/// Crash at each step of the durability order, then restart: nothing lost, and only the
/// records of the batch in flight at the crash published twice.
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_at_each_step_of_the_durability_order_loses_nothing() {
    let (_sandbox, brokers) = process_kafka();
    let kafka = Kafka::External(brokers.clone());
    for point in ["after-consume", "after-store-write", "after-delivery"] {
        let t = Topics::new();
        kafka.create_topic(&t.delay, 1).await;
        let parts = kafka.create_topic(&t.target, 1).await;
        kafka.create_topic(&t.dlt, 1).await;
        let data = TempDir::new().unwrap();
        let port = free_port();
        let mut broker = spawn_broker_with(
            &brokers,
            &t,
            &data,
            port,
            &[("KAFKA_DELAY_FAILPOINT", point), LOCAL],
        );
        wait_ready(port, Duration::from_secs(60)).await;
        let (tally, dues) = tally(50, now_ms() + 2_000, 10);
        collector(&kafka, &t.target, parts, tally.clone());
        produce_plan(&kafka.producer(), &t.delay, &t.target, &tally, &dues, 0..50).await;
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(s) = broker.0.try_wait().unwrap() {
                break s;
            }
            assert!(
                Instant::now() < deadline,
                "{point}: the failpoint was not reached"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(!status.success(), "{point}: aborted");
        drop(broker);
        let _broker = spawn_broker_with(&brokers, &t, &data, port, &[LOCAL]);
        wait_ready(port, Duration::from_secs(30)).await;
        let report = wait_complete(&tally, Duration::from_secs(60)).await;
        eprintln!("failpoint {point}: {report:?}");
        println!("{point}\n{report}");
        assert_eq!(report.lost, 0, "{point}: lost {:?}", report.lost_sample);
        assert_eq!(report.early, 0, "{point}: early");
        assert!(
            report.duplicates <= 64,
            "{point}: {} duplicates",
            report.duplicates
        );
        if point != "after-delivery" {
            assert_eq!(
                report.duplicates, 0,
                "{point}: nothing was published before the crash"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_jumping_back_never_fires_early_and_one_jumping_forward_is_held_back_to_kafkas() {
    let kafka = Kafka::start();
    let t = Topics::new();
    kafka.create_topic(&t.delay, 1).await;
    kafka.create_topic(&t.target, 1).await;
    kafka.create_topic(&t.dlt, 1).await;
    let data = TempDir::new().unwrap();
    let clock = Arc::new(OffsetClock::default());
    let broker = start_with_clock(config(&kafka, &t, &data, &[]), clock.clone()).await;
    let probe = format!("probe-{}", t.id);
    kafka.create_topic(&probe, 1).await;
    wait_consuming(&kafka, &t, &probe).await;

    // 200 records: 20 due within 3 s, the rest from 12 s to 30 s.
    let now = now_ms();
    let dues: Vec<u64> = (0..200u64)
        .map(|i| {
            if i < 20 {
                now + 2_000 + i * 50
            } else {
                now + 12_000 + i * 100
            }
        })
        .collect();
    let tally = Arc::new(Mutex::new(Tally::new(&unique("clock"), dues.clone())));
    collector(&kafka, &t.target, 1, tally.clone());
    produce_plan(
        &kafka.producer(),
        &t.delay,
        &t.target,
        &tally,
        &dues,
        0..200,
    )
    .await;
    // The clock goes back an hour before any is due: nothing may fire.
    tokio::time::sleep(Duration::from_millis(500)).await;
    clock.set_offset_ms(-3_600_000);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let back = tally.lock().unwrap().report();
    assert_eq!(
        back.received, 0,
        "fired while the clock read an hour earlier: {back:?}"
    );
    // Forward by two hours (an hour past the real time). The changelog's append times show
    // the Kafka cluster's clock an hour behind this one: the records fire by Kafka's clock,
    // the 20 overdue ones at once and the rest at their due time, none early by when they
    // reached the target (the checker's own clock).
    clock.set_offset_ms(3_600_000);
    let report = wait_complete(&tally, Duration::from_secs(60)).await;
    eprintln!("clock back 1h then forward 1h: {report:?}");
    println!("clock back 1h then forward 1h\n{report}");
    assert_eq!(
        (report.lost, report.early, report.duplicates),
        (0, 0, 0),
        "{report:?}"
    );
    broker.shutdown().await;
}

/// The clock's hold-back and its control, as processes: two instances, each of its own group,
/// step their wall clock an hour ahead once their records are stored. The one held back to
/// Kafka's clock (learnt from its changelog's append times) fires none early by when they
/// reached the target; the one whose hold-back is taken out (`KAFKA_DELAY_TEST_NO_HOLD_BACK`,
/// a seam of the `failpoints` build) fires them at the step, early.
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_stepped_ahead_fires_nothing_early_and_without_the_hold_back_fires_early() {
    let (_sandbox, brokers) = process_kafka();
    let (held, control) = tokio::join!(
        clock_stepped_ahead(&brokers, true),
        clock_stepped_ahead(&brokers, false)
    );
    eprintln!("clock an hour ahead, held back: {held:?}\nwithout the hold-back: {control:?}");
    assert_eq!(
        (held.lost, held.early, held.duplicates),
        (0, 0, 0),
        "held back: {held:?}"
    );
    assert_eq!(
        (control.lost, control.early),
        (0, 100),
        "without the hold-back every record fires at the step: {control:?}"
    );
}

/// 100 records due 15 to 20 s on, the instance's clock stepped an hour ahead once all are
/// pending; its report.
async fn clock_stepped_ahead(brokers: &str, hold_back: bool) -> Report {
    let kafka = Kafka::External(brokers.to_owned());
    let t = Topics::new();
    kafka.create_topic(&t.delay, 1).await;
    let parts = kafka.create_topic(&t.target, 1).await;
    kafka.create_topic(&t.dlt, 1).await;
    let (data, port) = (TempDir::new().unwrap(), free_port());
    let clock_file = data.path().join("clock");
    std::fs::write(&clock_file, "0").unwrap();
    let mut env = vec![("KAFKA_DELAY_TEST_CLOCK_FILE", clock_file.to_str().unwrap())];
    if !hold_back {
        env.push(("KAFKA_DELAY_TEST_NO_HOLD_BACK", "1"));
    }
    let store = TempDir::new().unwrap();
    let _broker = spawn_broker_with(brokers, &t, &store, port, &env);
    wait_ready(port, Duration::from_secs(60)).await;
    let (tally, dues) = tally(100, now_ms() + 15_000, 50);
    collector(&kafka, &t.target, parts, tally.clone());
    produce_plan(
        &kafka.producer(),
        &t.delay,
        &t.target,
        &tally,
        &dues,
        0..100,
    )
    .await;
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    wait_pending(addr, 100, Duration::from_secs(10)).await;
    std::fs::write(&clock_file, "3600000").unwrap();
    wait_complete(&tally, Duration::from_secs(40)).await
}

/// A tmpfs of `mb` megabytes, unmounted when dropped (needs root, as CI runs).
struct SmallDisk {
    dir: TempDir,
}

impl SmallDisk {
    fn mount(mb: u32) -> Self {
        let dir = TempDir::new().unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mb}m"), "tmpfs"])
            .arg(dir.path())
            .output()
            .expect("mount");
        assert!(
            out.status.success(),
            "mounting a tmpfs for the disk-full test needs root: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        SmallDisk { dir }
    }

    /// Fills the filesystem with `filler` until it is full.
    fn fill(&self, filler: &Path) {
        use std::io::Write;
        let mut f = std::fs::File::create(filler).unwrap();
        let chunk = vec![0u8; 64 * 1024];
        while f.write_all(&chunk).is_ok() {}
        let _ = f.flush();
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_pauses_consumption_reports_it_and_a_restart_after_space_returns_loses_nothing()
{
    let disk = SmallDisk::mount(64);
    let kafka = Kafka::start();
    let t = Topics::new();
    kafka.create_topic(&t.delay, 1).await;
    kafka.create_topic(&t.target, 1).await;
    kafka.create_topic(&t.dlt, 1).await;
    let data = TempDir::new_in(disk.dir.path()).unwrap();
    let broker = start(config(&kafka, &t, &data, &["--sync"])).await;
    let addr = broker.http_addr();
    let probe = format!("probe-{}", t.id);
    kafka.create_topic(&probe, 1).await;
    wait_consuming(&kafka, &t, &probe).await;

    let filler = disk.dir.path().join("filler");
    disk.fill(&filler);
    // 400 records: the filesystem is full, so the first write already fails.
    let n = 400;
    let (tally, dues) = tally(n, now_ms() + 5_000, 5);
    collector(&kafka, &t.target, 1, tally.clone());
    // The mock cluster keeps about 5 MB per partition and deletes older record batches (its
    // log start offset moves up): 400 records with 16 KB headers lost their first 84 to that
    // retention before anyone read them. 2 KB keeps the topic far below it.
    let producer = kafka.producer();
    let big = "x".repeat(2 * 1024);
    for (i, due) in dues.iter().enumerate() {
        let value = format!("{}{}", tally.lock().unwrap().value(i), "");
        let due = due.to_string();
        // The identity first, padding after it in a header, so the tally can read the value.
        produce(
            &producer,
            &t.delay,
            Some(&format!("k{i}")),
            Some(&value),
            &[
                ("delay-target", &t.target),
                ("delay-until", &due),
                ("pad", &big),
            ],
        )
        .await;
    }
    // The broker notices: not ready, store unhealthy in the metrics.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = http_get(addr, "/readyz").await;
        if status == 503 {
            assert!(body.contains("store not writable"), "{body}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the full disk was not reported on /readyz"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, metrics) = http_get(addr, "/metrics").await;
    assert_eq!(metric(&metrics, "kafka_delay_store_healthy"), Some(0.0));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stuck = tally.lock().unwrap().report();
    eprintln!("disk full: {stuck:?}");

    // Space returns. RocksDB stays read-only after a failed write-ahead-log write (its Resume()
    // is not exposed by the Rust bindings), so the operator, or the supervisor on the failed
    // readiness check, restarts the broker: it stops cleanly, and the new one loses nothing.
    let freed = Instant::now();
    std::fs::remove_file(&filler).unwrap();
    tokio::time::timeout(Duration::from_secs(30), broker.shutdown())
        .await
        .expect("a broker with a full disk still stops when asked");
    // No offset was committed past what RocksDB holds, and consumption stopped at the first
    // failed write: RocksDB holds the probe and at most the few records whose write fitted in
    // the last page the write-ahead log already had.
    let stored = {
        use kafka_delay::store::{Store, StoreOptions};
        let store = Store::open(data.path(), StoreOptions::durable_only(true)).unwrap();
        let pid = store.partition_id(&t.delay, 0).unwrap();
        store
            .next_offsets()
            .unwrap()
            .get(&pid)
            .copied()
            .unwrap_or(0)
    };
    eprintln!("disk full: RocksDB's next offset {stored}");
    assert!(
        (1..=10).contains(&stored),
        "RocksDB holds records up to offset {stored}: consumption did not stop at the full disk"
    );
    {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let group = config(&kafka, &t, &data, &[]).kafka.group_id;
        let c: BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", kafka.brokers())
            .set("group.id", &group)
            .create()
            .unwrap();
        let mut tpl = rdkafka::TopicPartitionList::new();
        tpl.add_partition(&t.delay, 0);
        let committed = c.committed_offsets(tpl, Duration::from_secs(10)).unwrap();
        let offset = committed.elements()[0].offset();
        assert_eq!(
            offset,
            rdkafka::Offset::Offset(stored),
            "committed offset vs the next offset RocksDB holds"
        );
    }
    let broker = start(config(&kafka, &t, &data, &["--sync"])).await;
    let addr = broker.http_addr();
    let report = wait_complete(&tally, Duration::from_secs(90)).await;
    eprintln!(
        "disk full then freed: {report:?}; complete {:?} after space returned",
        freed.elapsed()
    );
    println!("disk full\n{report}");
    assert_eq!(
        report.lost, 0,
        "lost on a full disk: {:?}",
        report.lost_sample
    );
    assert_eq!(report.early, 0);
    assert_eq!(http_get(addr, "/readyz").await.0, 200, "ready again");
    broker.shutdown().await;
}
