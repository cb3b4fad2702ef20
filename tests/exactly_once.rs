//! Exactly-once firing on Apache Kafka, judged by `kafka-delay verify` reading the target
//! read_committed: no record is lost, duplicated or early through `kill -9` cycles under load,
//! rebalance churn with three instances, a Kafka broker restart, and an instance paused past
//! its session timeout and resumed (a zombie). Each scenario first runs at-least-once on the
//! same broker, and must show the duplicates that exactly-once removes: a scenario that causes
//! none would prove nothing. One more shows that a survivor fences the transaction a dead
//! instance left open.

mod common;

use std::path::Path;
use std::time::Duration;

use common::apache::{self, Private};
use common::group::{
    logs_tail, report, soak, spawn_flags, spawn_with, stop_gracefully, verify, Instance,
};
use common::procs::{free_port, spawn_instance, wait_ready};
use common::{Kafka, Topics};
use serde_json::Value;
use tempfile::TempDir;

/// The flags of each mode.
const AT_LEAST_ONCE: &[&str] = &[];
const EXACTLY_ONCE: &[&str] = &["--exactly-once"];

const NAMES: [&str; 4] = ["a", "b", "c", "d"];

/// The scenarios run one at a time: each loads both cores of a small machine.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Instances of one group, each with a data directory of its own, running in one mode.
struct Group {
    kafka: Kafka,
    t: Topics,
    logs: TempDir,
    dirs: Vec<TempDir>,
    live: Vec<Option<Instance>>,
    mode: &'static [&'static str],
}

impl Group {
    /// `n` instances sharing `partitions` partitions, ready.
    async fn start(kafka: Kafka, n: usize, partitions: i32, mode: &'static [&'static str]) -> Self {
        let t = Topics::new();
        kafka.create_topic(&t.delay, partitions).await;
        kafka.create_target_topic(&t.target, partitions).await;
        kafka.create_topic(&t.dlt, 1).await;
        let mut g = Group {
            kafka,
            t,
            logs: TempDir::new().unwrap(),
            dirs: (0..NAMES.len()).map(|_| TempDir::new().unwrap()).collect(),
            live: (0..NAMES.len()).map(|_| None).collect(),
            mode,
        };
        for k in 0..n {
            g.spawn(k);
        }
        for k in 0..n {
            g.ready(k).await;
        }
        g
    }

    fn spawn(&mut self, k: usize) {
        let (data, logs) = (self.dirs[k].path(), self.logs.path());
        let i = spawn_with(&self.kafka, &self.t, (data, logs), NAMES[k], self.mode);
        self.live[k] = Some(i);
    }

    async fn ready(&self, k: usize) {
        let port = self.live[k].as_ref().expect("running").port;
        wait_ready(port, Duration::from_secs(90)).await;
    }

    /// Kills instance `k` with SIGKILL (its data directory wiped when `wipe`) and starts it
    /// again at once.
    async fn kill_and_restart(&mut self, k: usize, wipe: bool) {
        drop(self.live[k].take());
        if wipe {
            std::fs::remove_dir_all(self.dirs[k].path()).unwrap();
            std::fs::create_dir(self.dirs[k].path()).unwrap();
        }
        self.spawn(k);
        self.ready(k).await;
    }

    fn instance(&self, k: usize) -> &Instance {
        self.live[k].as_ref().expect("running")
    }

    /// `kafka-delay verify`, `count` records due over `window` seconds from 8 s on.
    fn verify(&self, count: u64, window: u64) -> std::process::Child {
        let window = format!("{window}s");
        verify(&self.kafka, &self.t, count, ("8s", &window, "150s"))
    }

    /// The verdict, and the end of every instance's log for a failure message.
    async fn judged(self, verify: std::process::Child) -> (Value, String) {
        let report = report(verify).await;
        let counters = self.counters().await;
        eprint!("{counters}");
        let tail = format!("{counters}{}", logs_tail(self.logs.path()));
        // KAFKA_DELAY_TEST_KEEP_LOGS=DIR keeps every instance's whole log, for a diagnosis.
        if let Ok(keep) = std::env::var("KAFKA_DELAY_TEST_KEEP_LOGS") {
            let to = Path::new(&keep).join(format!("{}-{}", self.t.id, mode_name(self.mode)));
            std::fs::create_dir_all(&to).unwrap();
            for e in std::fs::read_dir(self.logs.path()).unwrap().flatten() {
                std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
            }
        }
        drop(self.live);
        (report, tail)
    }
}

impl Group {
    /// Each live instance's counters at the verdict, for a failure message (shown before the
    /// logs): what it fired and still holds, and whether RocksDB held its writes back.
    async fn counters(&self) -> String {
        const SHOWN: [&str; 11] = [
            "kafka_delay_ingest_records_total",
            "kafka_delay_fire_records_total",
            "kafka_delay_fire_produce_errors_total",
            "kafka_delay_transactions_total",
            "kafka_delay_pending_records",
            "kafka_delay_pending_due_records",
            "kafka_delay_standby_records",
            "kafka_delay_partitions_owned",
            "kafka_delay_partitions_restoring",
            "kafka_delay_wheel_entries",
            "kafka_delay_store_write_stopped",
        ];
        let mut out = String::new();
        for (name, i) in NAMES.iter().zip(&self.live) {
            let Some(i) = i else { continue };
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], i.port));
            let line = match common::http_get_at(addr, "/metrics").await {
                Some((200, body)) => SHOWN
                    .iter()
                    .map(|m| format!("{}={}", &m["kafka_delay_".len()..], summed(&body, m)))
                    .collect::<Vec<_>>()
                    .join(" "),
                _ => "no answer on /metrics".to_owned(),
            };
            out.push_str(&format!("--- {name} at the verdict: {line}\n"));
        }
        out
    }
}

/// The sum of a metric's series (every label set).
fn summed(body: &str, name: &str) -> f64 {
    body.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with([' ', '{']))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn mode_name(mode: &[&str]) -> &'static str {
    if mode.is_empty() {
        "at-least-once"
    } else {
        "exactly-once"
    }
}

/// At-least-once loses nothing and is never early but shows duplicates; exactly-once shows
/// none of the three.
fn judge(scenario: &str, (alo, alo_logs): (Value, String), (eos, eos_logs): (Value, String)) {
    eprintln!("{scenario}\n  at-least-once: {alo}\n  exactly-once:  {eos}");
    assert!(
        nothing_lost_or_early(&alo),
        "{scenario}, at-least-once: {alo}\n{alo_logs}"
    );
    assert!(
        duplicates_shown(&alo),
        "{scenario}: at-least-once showed no duplicates, so the scenario does not exercise \
         what exactly-once removes: {alo}"
    );
    assert!(
        eos["lost"] == 0 && eos["duplicates"] == 0 && eos["early"] == 0,
        "{scenario}, exactly-once: {eos}\n{eos_logs}"
    );
}

fn nothing_lost_or_early(report: &Value) -> bool {
    report["lost"] == 0 && report["early"] == 0
}

fn duplicates_shown(report: &Value) -> bool {
    report["duplicates"].as_u64().is_some_and(|d| d > 0)
}

/// The at-least-once arm of a scenario whose duplicates depend on timing (a broker killed
/// duplicates only what it had written and not yet acknowledged at that instant): run at most
/// `runs` times, until one shows a duplicate. Every run must lose nothing and fire nothing
/// early; [`judge`] then asserts the duplicate on the last.
async fn duplicated<F, R>(scenario: &str, runs: usize, mut run: F) -> (Value, String)
where
    F: FnMut() -> R,
    R: std::future::Future<Output = (Value, String)>,
{
    let mut last = run().await;
    for again in 2..=runs {
        let (alo, logs) = &last;
        assert!(
            nothing_lost_or_early(alo),
            "{scenario}, at-least-once: {alo}\n{logs}"
        );
        if duplicates_shown(alo) {
            break;
        }
        eprintln!("{scenario}: at-least-once showed no duplicate ({alo}); run {again} of {runs}");
        last = run().await;
    }
    last
}

fn shared_kafka() -> Kafka {
    Kafka::External(apache::shared())
}

/// Two instances of six partitions; 20 times, one of them is killed with SIGKILL while
/// records come due, and started again at once.
async fn kill_cycles(mode: &'static [&'static str]) -> (Value, String) {
    const CYCLES: usize = 20;
    let mut g = Group::start(shared_kafka(), 2, 6, mode).await;
    let verify = g.verify(150_000, 75);
    tokio::time::sleep(Duration::from_secs(8)).await;
    for cycle in 0..CYCLES {
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        g.kill_and_restart(cycle % 2, false).await;
    }
    eprintln!("{}: {CYCLES} kill -9 cycles done", mode_name(mode));
    g.judged(verify).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_exactly_once_over_20_kill_9_cycles_loses_nothing_and_duplicates_nothing() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let alo = kill_cycles(AT_LEAST_ONCE).await;
    let eos = kill_cycles(EXACTLY_ONCE).await;
    judge("20 kill -9 cycles under load", alo, eos);
}

/// Three instances of twelve partitions: each killed in turn twice (every other time with
/// its data directory wiped) and restarted, then a fourth joins and one leaves cleanly.
async fn churn(mode: &'static [&'static str]) -> (Value, String) {
    let mut g = Group::start(shared_kafka(), 3, 12, mode).await;
    let verify = g.verify(120_000, 60);
    tokio::time::sleep(Duration::from_secs(8)).await;
    for round in 0..6 {
        tokio::time::sleep(Duration::from_secs(5)).await;
        g.kill_and_restart(round % 3, round % 2 == 0).await;
    }
    g.spawn(3);
    g.ready(3).await;
    stop_gracefully(g.live[2].take().expect("running"));
    g.judged(verify).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_exactly_once_through_rebalance_churn_of_three_instances() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let alo = churn(AT_LEAST_ONCE).await;
    let eos = churn(EXACTLY_ONCE).await;
    judge("rebalance churn with 3 instances", alo, eos);
}

/// Two instances on a Kafka broker of their own, which is killed (SIGKILL) while records come
/// due (2,000 a second) and restarted 35 s later (past the producers' 30 s message timeout and the 10 s
/// transaction timeout).
/// With KAFKA_DELAY_TEST_KEEP_LOGS=DIR, the broker's directory of a run that lost, duplicated
/// or fired early is kept there too, to be read with Kafka's tools.
async fn kafka_restart(mode: &'static [&'static str]) -> (Value, String) {
    let broker = Private::start();
    let g = Group::start(Kafka::External(broker.brokers().to_owned()), 2, 4, mode).await;
    let id = g.t.id.clone();
    let verify = g.verify(120_000, 60);
    tokio::time::sleep(Duration::from_secs(20)).await;
    broker.kill();
    tokio::time::sleep(kafka_down()).await;
    broker.restart();
    eprintln!("{}: Kafka restarted", mode_name(mode));
    let (report, tail) = g.judged(verify).await;
    let clean = report["lost"] == 0 && report["early"] == 0;
    let clean = clean && (mode.is_empty() || report["duplicates"] == 0);
    if let (false, Ok(keep)) = (clean, std::env::var("KAFKA_DELAY_TEST_KEEP_LOGS")) {
        let to = Path::new(&keep).join(format!("{id}-{}-broker", mode_name(mode)));
        broker.keep(&to);
        eprintln!("the broker's directory is kept in {}", to.display());
    }
    (report, tail)
}

/// How long the broker stays down: 35 s, or `KAFKA_DELAY_TEST_KAFKA_DOWN` seconds (75 is about
/// what a slow machine's restart adds up to: past the kept partitions' minute, and long enough
/// that the coordinator forgets both members).
fn kafka_down() -> Duration {
    let secs = std::env::var("KAFKA_DELAY_TEST_KAFKA_DOWN").ok();
    Duration::from_secs(secs.and_then(|s| s.parse().ok()).unwrap_or(35))
}

/// Runs of the exactly-once half under `KAFKA_DELAY_SOAK=1`, each on a broker of its own: the
/// loop that tells which Kafka releases pass (README, the version table).
const SOAK_RUNS: usize = 12;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_exactly_once_through_a_kafka_broker_restart() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let scenario = "a Kafka broker killed and restarted 35 s later";
    let alo = duplicated(scenario, 3, || kafka_restart(AT_LEAST_ONCE)).await;
    let eos = kafka_restart(EXACTLY_ONCE).await;
    judge(scenario, alo, eos);
    if !soak() {
        return;
    }
    for run in 2..=SOAK_RUNS {
        let (eos, logs) = kafka_restart(EXACTLY_ONCE).await;
        eprintln!("exactly-once run {run} of {SOAK_RUNS}: {eos}");
        assert!(
            eos["lost"] == 0 && eos["duplicates"] == 0 && eos["early"] == 0,
            "a Kafka broker killed and restarted, exactly-once run {run}: {eos}\n{logs}"
        );
    }
}

/// Two instances; one is paused (SIGSTOP) while records come due, for 25 s (past its 6 s
/// session timeout and the 10 s transaction timeout, so the other takes its partitions), then
/// resumed: whatever it had under way, and whatever it fires before it hears of the
/// rebalance, must not reach read_committed consumers.
async fn zombie(mode: &'static [&'static str]) -> (Value, String) {
    let g = Group::start(shared_kafka(), 2, 4, mode).await;
    let verify = g.verify(30_000, 60);
    tokio::time::sleep(Duration::from_secs(20)).await;
    g.instance(0).signal("STOP");
    tokio::time::sleep(Duration::from_secs(25)).await;
    g.instance(0).signal("CONT");
    eprintln!("{}: the paused instance resumed", mode_name(mode));
    g.judged(verify).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_exactly_once_fences_an_instance_paused_past_its_session_timeout() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let alo = zombie(AT_LEAST_ONCE).await;
    let eos = zombie(EXACTLY_ONCE).await;
    judge("an instance paused 25 s (SIGSTOP) and resumed", alo, eos);
}

/// Pending records in the partitions `port`'s instance owns, and how many it owns.
async fn held(port: u16) -> (u64, u64) {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let (_, body) = common::http_get(addr, "/metrics").await;
    let get = |name| common::metric(&body, name).unwrap_or(0.0) as u64;
    let copies = get("kafka_delay_standby_records");
    (
        get("kafka_delay_pending_records").saturating_sub(copies),
        get("kafka_delay_partitions_owned"),
    )
}

/// Source partitions the instance on `port` fires (0 while it does not answer).
async fn owned_by(port: u16) -> u64 {
    common::metric_at(port, "kafka_delay_partitions_owned")
        .await
        .unwrap_or(0.0) as u64
}

/// Two instances with transactions that time out only after 60 s; one dies with a transaction
/// open on its changelog partitions (the `before-commit` failpoint aborts it there). The other
/// removes it from the group and takes its partitions, whose restore reads up to the last
/// stable offset that transaction holds back: it restores them well within the minute
/// because it fences the dead instance's transactional id, which aborts that transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_exactly_once_a_survivor_fences_the_open_transaction_of_an_instance_it_removes(
) {
    let _turn = ONE_AT_A_TIME.lock().await;
    const PARTS: i32 = 4;
    const N: u64 = 400;
    let kafka = shared_kafka();
    let t = Topics::new();
    kafka.create_topic(&t.delay, PARTS).await;
    kafka.create_target_topic(&t.target, PARTS).await;
    kafka.create_topic(&t.dlt, 1).await;
    let (logs, dirs) = (
        TempDir::new().unwrap(),
        [TempDir::new().unwrap(), TempDir::new().unwrap()],
    );
    let mut flags = vec![
        "--changelog",
        "--changelog-replication",
        "1",
        "--exactly-once",
    ];
    flags.extend(["--kafka-config", "transaction.timeout.ms=60000"]);
    let b = spawn_flags(&kafka, &t, (dirs[1].path(), logs.path()), "b", &flags);
    wait_ready(b.port, Duration::from_secs(90)).await;
    let a_port = free_port();
    let a_log = std::fs::File::create(logs.path().join("a.log")).unwrap();
    let failpoint = [("KAFKA_DELAY_FAILPOINT", "before-commit")];
    let (a_dir, a_logged) = ((dirs[0].path(), a_port), std::process::Stdio::from(a_log));
    let mut a = spawn_instance(
        &kafka.brokers(),
        &t,
        a_dir,
        Some("a"),
        &failpoint,
        &flags,
        a_logged,
    );
    // a is handed partitions (or dies at the probe of its first restore) before the records
    // come: b alone could otherwise ingest them all, and leave a no transaction to die in.
    let joined = std::time::Instant::now() + Duration::from_secs(90);
    while a.0.try_wait().unwrap().is_none() && owned_by(a_port).await == 0 {
        assert!(
            std::time::Instant::now() < joined,
            "a was handed no partition in 90 s\n{}",
            logs_tail(logs.path())
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // a's first transaction (its first ingest, or the probe of its first restore) aborts it.
    let due = common::now_ms() + 600_000;
    common::produce_numbered(
        &kafka.producer(),
        &t.delay,
        &t.target,
        (0..N).map(|i| (i, due)),
    )
    .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while a.0.try_wait().unwrap().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "a never reached its failpoint\n{}",
            logs_tail(logs.path())
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let died = std::time::Instant::now();
    loop {
        let (pending, owned) = held(b.port).await;
        if owned == PARTS as u64 && pending == N {
            break;
        }
        assert!(
            died.elapsed() < Duration::from_secs(30),
            "30 s after a died with a transaction open, b owns {owned} of {PARTS} partitions \
             and holds {pending} of {N} records: the takeover waits for the transaction's \
             60 s timeout\n{}",
            logs_tail(logs.path())
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "b owned every partition and held all {N} records {:.1?} after a died",
        died.elapsed()
    );
    drop(b);
}
