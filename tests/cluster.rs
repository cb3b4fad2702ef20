//! Several instances with a changelog, on Apache Kafka (the mock cluster honours neither static
//! membership nor cooperative rebalancing): a lost data directory loses nothing, and a killed
//! instance's partitions move to the others with their pending records.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use common::browser::{browse, screenshots};
use common::group::{
    logs_tail, report, soak, spawn, spawn_env, spawn_flags, spawn_with, stop_gracefully, verify,
    Instance,
};
use common::procs::wait_ready;
use common::{collect, http_get, http_json, now_ms, reader, wait_consuming, Got, Kafka, Topics};
use rdkafka::producer::FutureRecord;
use tempfile::TempDir;

async fn gauge(i: &Instance, name: &str) -> u64 {
    common::metric_at(i.port, name).await.unwrap_or(0.0) as u64
}

/// Records pending in the partitions `i` owns (its standby copies left out).
async fn pending(i: &Instance) -> u64 {
    let all = gauge(i, "kafka_delay_pending_records").await;
    all.saturating_sub(gauge(i, "kafka_delay_standby_records").await)
}

/// Calls `probe` every 200 ms until it says done (`None`); fails after 60 s with what it said
/// last (`Some`) and the logs.
async fn wait_for(what: &str, logs: &Path, mut probe: impl AsyncFnMut() -> Option<String>) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let Some(seen) = probe().await else {
            return;
        };
        assert!(
            std::time::Instant::now() < deadline,
            "{seen} after 60 s: not {what}\n{}",
            logs_tail(logs)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Polls `gauge` of every instance until `done` holds for their values (see [`wait_for`]).
async fn wait_gauges(
    instances: &[&Instance],
    name: &str,
    done: impl Fn(&[u64]) -> bool,
    what: &str,
    logs: &Path,
) {
    wait_for(what, logs, async || {
        let mut values = Vec::new();
        for i in instances {
            values.push(gauge(i, name).await);
        }
        (!done(&values)).then(|| format!("{name} {values:?}"))
    })
    .await;
}

/// Waits until each instance fires some of the partitions and together all `n`.
async fn wait_shared(instances: &[&Instance], n: u64, logs: &Path) {
    let shared = |o: &[u64]| o.iter().all(|o| *o > 0) && o.iter().sum::<u64>() == n;
    let what = format!("{n} shared");
    wait_gauges(
        instances,
        "kafka_delay_partitions_owned",
        shared,
        &what,
        logs,
    )
    .await;
}

/// Waits until the instances hold `n` pending records between them in the partitions they
/// own, each in the changelog too (none of them lingering: `--changelog-linger`).
async fn wait_pending_all(instances: &[&Instance], n: u64, logs: &Path) {
    wait_held(instances, n, logs, true).await;
}

/// Waits until the instances hold `n` pending records between them in the partitions they
/// own, and, when `logged`, none of them waits for the changelog (`--changelog-linger`).
async fn wait_held(instances: &[&Instance], n: u64, logs: &Path, logged: bool) {
    wait_for(&format!("{n} in all"), logs, async || {
        let (mut held, mut lingering) = (Vec::new(), Vec::new());
        for i in instances {
            held.push(pending(i).await);
            lingering.push(lingering_records(i).await);
        }
        (held.iter().sum::<u64>() != n || logged && lingering.iter().any(|l| *l > 0))
            .then(|| format!("pending {held:?}, not yet in the changelog {lingering:?}"))
    })
    .await;
}

/// Records in `i`'s wheel whose group is not in the changelog yet.
async fn lingering_records(i: &Instance) -> u64 {
    gauge(i, "kafka_delay_changelog_lingering_records").await
}

/// Produces `r{i}` for i in 0..n, due at `due(i)`, to partition `i % partitions`, waiting for
/// all acknowledgements at the end; returns the due times, by `i`, for [`tally`].
async fn produce_due(
    kafka: &Kafka,
    t: &Topics,
    n: u64,
    partitions: u64,
    due: impl Fn(u64) -> u64,
) -> Vec<u64> {
    let p = kafka.producer();
    let mut acks = Vec::new();
    for i in 0..n {
        let (key, value, at) = (format!("k{i}"), format!("r{i}"), due(i).to_string());
        let headers = rdkafka::message::OwnedHeaders::new()
            .insert(rdkafka::message::Header {
                key: "delay-target",
                value: Some(t.target.as_str()),
            })
            .insert(rdkafka::message::Header {
                key: "delay-until",
                value: Some(at.as_str()),
            });
        let rec = FutureRecord::to(&t.delay)
            .partition((i % partitions) as i32)
            .key(&key)
            .payload(&value)
            .headers(headers);
        acks.push(p.send_result(rec).map_err(|(e, _)| e).expect("enqueued"));
    }
    for a in acks {
        a.await.expect("delivery").expect("acknowledged");
    }
    (0..n).map(due).collect()
}

/// What arrived: lost, duplicated and early records among `r0..r{n}`.
#[derive(Default)]
struct Tally {
    lost: Vec<u64>,
    duplicates: u64,
    early: u64,
}

impl Tally {
    /// Every record arrived once, none before its due time.
    fn all_once_never_early(&self) -> bool {
        self.lost.is_empty() && self.duplicates == 0 && self.early == 0
    }
}

impl std::fmt::Debug for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = &self.lost[..self.lost.len().min(10)];
        write!(
            f,
            "lost {} (first: {shown:?}), duplicates {}, early {}",
            self.lost.len(),
            self.duplicates,
            self.early
        )
    }
}

/// The records `r{i}` arrived of `r0..r{n}`, and how many times each.
fn arrived(got: &[Got], n: u64) -> HashMap<u64, u64> {
    let mut seen: HashMap<u64, u64> = HashMap::new();
    for g in got {
        let i = g.value().as_deref().and_then(index);
        if let Some(i) = i.filter(|i| *i < n) {
            *seen.entry(i).or_default() += 1;
        }
    }
    seen
}

/// The `i` of a record `r{i}` (its value may go on after a `:`).
fn index(value: &str) -> Option<u64> {
    value.strip_prefix('r')?.split(':').next()?.parse().ok()
}

/// Lost, duplicated and early records of the plan `dues` (record `r{i}` due at `dues[i]`):
/// early by when a record reached the target (the target's append time: `topics` creates it
/// with LogAppendTime), never by what kafka-delay's headers say.
fn tally(got: &[Got], dues: &[u64]) -> Tally {
    let n = dues.len() as u64;
    let seen = arrived(got, n);
    let early = got
        .iter()
        .filter_map(|g| {
            let i = index(&g.value()?)? as usize;
            let appended = match rdkafka::Message::timestamp(&g.msg) {
                rdkafka::Timestamp::LogAppendTime(ms) => ms as u64,
                _ => panic!("the target does not keep its append times"),
            };
            Some(appended < *dues.get(i)?)
        })
        .filter(|early| *early)
        .count() as u64;
    Tally {
        lost: (0..n).filter(|i| !seen.contains_key(i)).collect(),
        duplicates: seen.values().map(|c| c - 1).sum(),
        early,
    }
}

/// Reads the target until `n` distinct records arrived, then 3 s longer for duplicates.
async fn read_all(
    kafka: &Kafka,
    t: &Topics,
    partitions: i32,
    n: u64,
    within: Duration,
) -> Vec<Got> {
    read_all_but(kafka, t, (partitions, n), &[], within).await
}

/// [`read_all`] of `n` records less the `cancelled` ones.
async fn read_all_but(
    kafka: &Kafka,
    t: &Topics,
    (partitions, n): (i32, u64),
    cancelled: &[u64],
    within: Duration,
) -> Vec<Got> {
    let r = reader(kafka, &t.target, partitions);
    let deadline = std::time::Instant::now() + within;
    let mut got = Vec::new();
    let missing = |got: &[Got]| {
        let seen = arrived(got, n);
        (0..n).any(|i| !seen.contains_key(&i) && !cancelled.contains(&i))
    };
    while missing(&got) && std::time::Instant::now() < deadline {
        got.extend(
            collect(
                &r,
                1,
                deadline.saturating_duration_since(std::time::Instant::now()),
            )
            .await,
        );
    }
    got.extend(collect(&r, usize::MAX, Duration::from_secs(3)).await);
    got
}

async fn topics(kafka: &Kafka, partitions: i32) -> Topics {
    let t = Topics::new();
    kafka.create_topic(&t.delay, partitions).await;
    kafka.create_target_topic(&t.target, partitions).await;
    kafka.create_topic(&t.dlt, 1).await;
    t
}

/// The mode an instance says it runs: in its metrics (`kafka_delay_mode{mode}`), and as the
/// group sees it (`GET /api/v1/owners`, its own entry; "-" where it does not answer that).
/// Ready comes before the instance has joined its group: its entry is waited for through
/// "not yet" answers (503) and lists without it (30 s at most, then "absent").
async fn mode_of(i: &Instance) -> (String, String) {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], i.port));
    let (_, body) = http_get(addr, "/metrics").await;
    let metric = body
        .lines()
        .find_map(|l| {
            l.strip_prefix("kafka_delay_mode{mode=\"")?
                .strip_suffix("\"} 1")
        })
        .unwrap_or("none")
        .to_owned();
    let this = format!("127.0.0.1:{}", i.port);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let seen = loop {
        let (status, owners) = http_json(addr, "GET", "/api/v1/owners", None, None).await;
        if status == 409 {
            break "-".to_owned();
        }
        let own = owners["owners"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|o| o["http"] == this.as_str())
            .map(|o| o["mode"].as_str().unwrap_or("null").to_owned())
            .filter(|_| status == 200);
        match own {
            Some(mode) => break mode,
            None if std::time::Instant::now() > deadline => break "absent".to_owned(),
            None => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    (metric, seen)
}

/// Waits at most 30 s for `i` to exit and returns its exit code.
fn exit_code(mut i: Instance, log: &std::path::Path) -> Option<i32> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        if let Ok(Some(status)) = i._proc.0.try_wait() {
            return status.code();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!(
        "the instance did not exit within 30 s; its log:\n{}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_a_data_dir_wiped_after_kill_9_is_restored_from_the_changelog() {
    let (result, lingering) = wiped_after_kill_9(&[]).await;
    assert_eq!(
        lingering, 0,
        "every record was in the changelog at the kill"
    );
    assert!(result.all_once_never_early(), "{result:?}");
}

/// The control of the test above: the same loss without the changelog loses every record
/// (the test above would see it, and the changelog is what keeps them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_without_the_changelog_a_data_dir_wiped_after_kill_9_loses_its_records() {
    let (result, _) = wiped_after_kill_9(&["--no-changelog"]).await;
    assert_eq!(
        (result.lost.len(), result.duplicates, result.early),
        (300, 0, 0),
        "{result:?}"
    );
}

/// Killed and wiped while its groups linger (their records in the wheel, none of them in the
/// changelog yet): the source offsets were not committed, so the records are read again from
/// the source topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_a_data_dir_wiped_within_the_changelog_linger_loses_nothing() {
    let (result, lingering) = wiped_after_kill_9(&["--changelog-linger", "8s"]).await;
    assert_eq!(lingering, 300, "every record lingered at the kill");
    assert!(result.all_once_never_early(), "{result:?}");
}

/// Records that fire within the changelog's linger, before their group is written, cost the
/// changelog nothing: no entry, no tombstone; once the group is written its source offsets
/// are, so a wiped disk fires none of them again. The control, `--changelog-linger 0s`, writes
/// every record's entry and then its tombstone. The records are due half a second after they
/// are sent: not yet due when ingested (those are never stored, linger or not), due well
/// within the linger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_records_that_fire_within_the_changelog_linger_write_nothing_to_the_changelog()
{
    let kafka = Kafka::start();
    const N: u64 = 200;
    for (flags, written) in [
        (&[][..], (0, 0)),
        (&["--changelog-linger", "0s"][..], (N, N)),
    ] {
        let t = topics(&kafka, 2).await;
        let (data, logs) = (TempDir::new().unwrap(), TempDir::new().unwrap());
        let a = spawn_flags(&kafka, &t, (data.path(), logs.path()), "a", flags);
        wait_ready(a.port, Duration::from_secs(60)).await;
        // Consuming already, so that the records are ingested before they are due.
        let probe = format!("probe-{}", t.id);
        kafka.create_target_topic(&probe, 1).await;
        wait_consuming(&kafka, &t, &probe).await;
        let at = now_ms() + 500;
        let dues = produce_due(&kafka, &t, N, 2, |_| at).await;
        let got = read_all(&kafka, &t, 2, N, Duration::from_secs(60)).await;
        let result = tally(&got, &dues);
        assert!(result.all_once_never_early(), "{flags:?}: {result:?}");
        // Past the default linger (1 s): every group is written.
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            changelog_writes(&kafka, &t).await,
            written,
            "{flags:?}: (entries, tombstones) of records\n{}",
            logs_tail(logs.path())
        );
        if !flags.is_empty() {
            continue;
        }
        // The disk is lost: the instance resumes where the written groups say, past the 200.
        drop(a);
        std::fs::remove_dir_all(data.path()).unwrap();
        std::fs::create_dir(data.path()).unwrap();
        let a = spawn_flags(&kafka, &t, (data.path(), logs.path()), "a", flags);
        wait_ready(a.port, Duration::from_secs(60)).await;
        wait_consuming(&kafka, &t, &probe).await;
        let got = read_all(&kafka, &t, 2, N, Duration::from_secs(10)).await;
        let result = tally(&got, &dues);
        assert!(
            result.all_once_never_early(),
            "after the restart: {result:?}\n{}",
            logs_tail(logs.path())
        );
        drop(a);
    }
}

/// How many entries and tombstones of records the changelog of `t`'s delay topic holds, every
/// one written (compaction aside: none runs this soon). Left out: the tombstone of an offset
/// no partition reaches, which an instance writes to learn the cluster's clock.
async fn changelog_writes(kafka: &Kafka, t: &Topics) -> (u64, u64) {
    const PROBED: i64 = (1 << 48) - 1;
    let topic = format!("g-{}-{}-changelog", t.id, t.delay);
    let r = reader(kafka, &topic, 2);
    let (mut entries, mut tombstones) = (0, 0);
    for g in collect(&r, usize::MAX, Duration::from_secs(3)).await {
        let m = &g.msg;
        let record = rdkafka::Message::key(m).is_some_and(|k| {
            k.len() == 9 && k[0] == b'r' && i64::from_be_bytes(k[1..].try_into().unwrap()) != PROBED
        });
        if record {
            match rdkafka::Message::payload(m) {
                Some(_) => entries += 1,
                None => tombstones += 1,
            }
        }
    }
    (entries, tombstones)
}

/// 300 records pending on one instance run with `flags`, which is then SIGKILLed and its data
/// directory deleted before it starts again: what reached the target within 20 s after the
/// last was due, and how many records lingered (not yet in the changelog) at the kill. The
/// kill comes once the changelog has every record, unless `flags` set a linger.
async fn wiped_after_kill_9(flags: &[&str]) -> (Tally, u64) {
    let kafka = Kafka::start();
    let t = topics(&kafka, 2).await;
    let (data, logs) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let a = spawn_flags(&kafka, &t, (data.path(), logs.path()), "a", flags);
    wait_ready(a.port, Duration::from_secs(60)).await;
    if flags.is_empty() {
        // No flag: the default mode on a Kafka cluster is the changelog, and the member says so.
        assert_eq!(
            mode_of(&a).await,
            ("changelog".to_owned(), "changelog".to_owned())
        );
    }
    const N: u64 = 300;
    let base = now_ms() + 12_000;
    let dues = produce_due(&kafka, &t, N, 2, |i| base + i * 10).await;
    let lingers = flags.contains(&"--changelog-linger");
    wait_held(&[&a], N, logs.path(), !lingers).await;
    // Past the consumer's auto-commit interval: Kafka's committed offsets are past the 300, so
    // consuming the source again cannot bring them back.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let lingering = lingering_records(&a).await;

    // The disk is lost with the process: nothing of the 300 is left on this machine.
    drop(a);
    std::fs::remove_dir_all(data.path()).unwrap();
    std::fs::create_dir(data.path()).unwrap();
    let a = spawn_flags(&kafka, &t, (data.path(), logs.path()), "a", flags);
    wait_ready(a.port, Duration::from_secs(60)).await;

    let last_due = base + (N - 1) * 10;
    let wait = Duration::from_millis(last_due.saturating_sub(now_ms()) + 20_000);
    let got = read_all(&kafka, &t, 2, N, wait).await;
    let result = tally(&got, &dues);
    eprintln!("wiped data dir {flags:?}: {result:?}");
    if !result.lost.is_empty() && flags.is_empty() {
        eprintln!("{}", logs_tail(logs.path()));
    }
    drop(a);
    (result, lingering)
}

/// A consumer of the group `t`'s instances join, as member `instance`, holding on until
/// the coordinator gave it partitions: the member that had the instance id is fenced, as
/// librdkafka fences itself when it rejoins with a new member id after a session timed out
/// (while the coordinator was down past `session.timeout.ms`, for example).
async fn impostor(kafka: &Kafka, t: &Topics, instance: &str) {
    use rdkafka::consumer::{Consumer, StreamConsumer};
    let c: StreamConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", kafka.brokers())
        .set("group.id", format!("g-{}", t.id))
        .set("group.instance.id", instance)
        .set("partition.assignment.strategy", "cooperative-sticky")
        .set("session.timeout.ms", "6000")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    c.subscribe(&[t.pattern.as_str()]).expect("subscribe");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while c.assignment().map(|a| a.count()).unwrap_or(0) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the impostor got no partitions in 30 s"
        );
        let _ = tokio::time::timeout(Duration::from_millis(200), c.recv()).await;
    }
    // Closed without leaving: a static member's id stays with it until its session ends.
}

/// A member whose Kafka consumer is fenced, a fatal error after which librdkafka never uses
/// it again, stops and starts again in place: it fires what it held and consumes what comes
/// after, rather than staying up with nothing consuming (what it did before). Its first two
/// starts in place fail, as one that meets a broker cut off does: it tries again rather than
/// exiting with no supervisor to start it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_a_fenced_member_starts_again_in_place_and_loses_nothing() {
    let kafka = Kafka::start();
    let t = topics(&kafka, 2).await;
    let (data, logs) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let failing = [("KAFKA_DELAY_TEST_FAILED_RESTARTS", "2")];
    let a = spawn_env(&kafka, &t, (data.path(), logs.path()), "a", &[], &failing);
    wait_ready(a.port, Duration::from_secs(60)).await;
    wait_shared(&[&a], 2, logs.path()).await;
    const N: u64 = 200;
    let base = now_ms() + 25_000;
    let mut dues = produce_due(&kafka, &t, N / 2, 2, |i| base + i * 20).await;
    wait_pending_all(&[&a], N / 2, logs.path()).await;

    impostor(&kafka, &t, "a").await;
    let log = logs.path().join("a.log");
    wait_for("started again", logs.path(), async || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        (!text.contains("starting this instance again")).then(|| "no restart".to_owned())
    })
    .await;
    wait_ready(a.port, Duration::from_secs(60)).await;
    let failed = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        failed.matches("did not start again in place").count(),
        2,
        "{}",
        logs_tail(logs.path())
    );
    // The second half, written after the restart, goes through the new consumer.
    let p = kafka.producer();
    for i in N / 2..N {
        dues.push(now_ms() + 3_000);
        let due = dues[i as usize].to_string();
        common::produce_to(
            &p,
            &t.delay,
            Some((i % 2) as i32),
            Some(format!("k{i}").as_bytes()),
            Some(format!("r{i}").as_bytes()),
            &[
                ("delay-target", t.target.as_str()),
                ("delay-until", due.as_str()),
            ],
        )
        .await;
    }

    let got = read_all(&kafka, &t, 2, N, Duration::from_secs(60)).await;
    let result = tally(&got, &dues);
    eprintln!("fenced and started again in place: {result:?}");
    assert!(
        result.all_once_never_early(),
        "{result:?}\n{}",
        logs_tail(logs.path())
    );
    drop(a);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_a_killed_instances_partitions_move_to_the_others_with_their_records() {
    let kafka = Kafka::start();
    const PARTS: i32 = 4;
    let t = topics(&kafka, PARTS).await;
    let logs = TempDir::new().unwrap();
    let dirs: Vec<TempDir> = (0..3).map(|_| TempDir::new().unwrap()).collect();
    let a = spawn(&kafka, &t, dirs[0].path(), logs.path(), "a");
    let b = spawn(&kafka, &t, dirs[1].path(), logs.path(), "b");
    wait_ready(a.port, Duration::from_secs(60)).await;
    wait_ready(b.port, Duration::from_secs(60)).await;
    wait_shared(&[&a, &b], PARTS as u64, logs.path()).await;
    const N: u64 = 400;
    let base = now_ms() + 25_000;
    let dues = produce_due(&kafka, &t, N, PARTS as u64, |i| base + i * 10).await;
    wait_pending_all(&[&a, &b], N, logs.path()).await;
    let (held_a, held_b) = (pending(&a).await, pending(&b).await);
    // Any instance names every partition's owner and where its HTTP server is.
    let addr = |i: &Instance| format!("127.0.0.1:{}", i.port);
    let b_http = std::net::SocketAddr::from(([127, 0, 0, 1], b.port));
    let (status, owners) = http_json(b_http, "GET", "/api/v1/owners", None, None).await;
    assert_eq!(status, 200, "{owners}");
    assert_eq!(owners["this"], addr(&b));
    let mut seen: Vec<(String, usize)> = owners["owners"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            let http = o["http"].as_str().unwrap_or_default().to_owned();
            (http, o["partitions"].as_array().map_or(0, Vec::len))
        })
        .collect();
    seen.sort();
    let mut want = vec![addr(&a), addr(&b)];
    want.sort();
    let names: Vec<String> = seen.iter().map(|(h, _)| h.clone()).collect();
    assert_eq!(names, want, "{owners}");
    assert!(seen.iter().all(|(_, n)| *n > 0), "{owners}");
    assert_eq!(
        seen.iter().map(|(_, n)| n).sum::<usize>(),
        PARTS as usize,
        "{owners}"
    );
    assert!(
        held_a > 0 && held_b > 0,
        "both instances hold partitions: a {held_a}, b {held_b}\n{}",
        logs_tail(logs.path())
    );

    // a dies with its disk; b takes its partitions once a's session times out, and c joins.
    drop(a);
    let killed = std::time::Instant::now();
    std::fs::remove_dir_all(dirs[0].path()).unwrap();
    let c = spawn(&kafka, &t, dirs[2].path(), logs.path(), "c");
    wait_ready(c.port, Duration::from_secs(60)).await;
    wait_shared(&[&b, &c], PARTS as u64, logs.path()).await;
    wait_pending_all(&[&b, &c], N, logs.path()).await;
    let takeover = killed.elapsed();

    let got = read_all(&kafka, &t, PARTS, N, Duration::from_secs(90)).await;
    let result = tally(&got, &dues);
    eprintln!(
        "a killed holding {held_a} of {N}, b held {held_b}; every partition owned and all {N} \
         pending again {takeover:.1?} after the kill; after the handoff: {result:?}"
    );
    assert!(
        result.all_once_never_early(),
        "{result:?}\n{}",
        logs_tail(logs.path())
    );
    drop((b, c));
}

/// Changelog entries `i` has read in restores so far, once they stop growing (at most 60 s).
async fn restored_settled(i: &Instance) -> u64 {
    let mut last = gauge(i, "kafka_delay_restored_entries_total").await;
    for _ in 0..120 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = gauge(i, "kafka_delay_restored_entries_total").await;
        if now == last && gauge(i, "kafka_delay_partitions_restoring").await == 0 {
            break;
        }
        last = now;
    }
    last
}

/// Kills `a` (SIGKILL) and waits until `b` owns all `parts` and holds all `n`.
async fn kill_until_b_holds(a: Instance, b: &Instance, (parts, n): (u64, u64), logs: &Path) {
    drop(a);
    wait_gauges(
        &[b],
        "kafka_delay_partitions_owned",
        |o| o == [parts],
        "all owned by b",
        logs,
    )
    .await;
    wait_pending_all(&[b], n, logs).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_a_partition_that_comes_back_within_a_minute_reads_only_its_changelogs_tail() {
    let kafka = Kafka::start();
    const PARTS: u64 = 4;
    let t = topics(&kafka, PARTS as i32).await;
    let logs = TempDir::new().unwrap();
    let dirs: Vec<TempDir> = (0..2).map(|_| TempDir::new().unwrap()).collect();
    let a = spawn(&kafka, &t, dirs[0].path(), logs.path(), "a");
    let b = spawn(&kafka, &t, dirs[1].path(), logs.path(), "b");
    wait_ready(a.port, Duration::from_secs(60)).await;
    wait_ready(b.port, Duration::from_secs(60)).await;
    wait_shared(&[&a, &b], PARTS, logs.path()).await;
    const N: u64 = 4_000;
    let base = now_ms() + 600_000;
    produce_due(&kafka, &t, N, PARTS, |i| base + i).await;
    wait_pending_all(&[&a, &b], N, logs.path()).await;

    // a is killed: b restores its partitions, reading at least every record produced to them
    // since b last held them (if it ever did).
    let before = restored_settled(&b).await;
    kill_until_b_holds(a, &b, (PARTS, N), logs.path()).await;
    let first = restored_settled(&b).await - before;
    // a comes back and the group hands it partitions; b keeps the state of those it lets go.
    let a = spawn(&kafka, &t, dirs[0].path(), logs.path(), "a");
    wait_ready(a.port, Duration::from_secs(60)).await;
    wait_shared(&[&a, &b], PARTS, logs.path()).await;
    wait_pending_all(&[&a, &b], N, logs.path()).await;
    let kept = gauge(&b, "kafka_delay_standby_records").await;
    // a is killed again within the minute: b takes back what it kept, reading only the tail.
    let before = restored_settled(&b).await;
    kill_until_b_holds(a, &b, (PARTS, N), logs.path()).await;
    let second = restored_settled(&b).await - before;
    eprintln!("b restored {first} entries at the first takeover, {second} at the second (kept {kept} records)");
    assert!(
        first >= N / 4 && kept > 0,
        "the first takeover restores a's partitions in full ({first} entries), and b keeps \
         the state of what it hands back ({kept} records)\n{}",
        logs_tail(logs.path())
    );
    assert!(
        second * 10 < first,
        "a partition back within a minute reads its changelog's tail, not all of it: {second} \
         entries against {first}\n{}",
        logs_tail(logs.path())
    );
    drop(b);
}

/// `GET` of `path` on `i`, as JSON.
async fn get_json(i: &Instance, path: &str) -> (u16, serde_json::Value) {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], i.port));
    http_json(addr, "GET", path, None, None).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_a_standby_takes_over_from_its_warm_copy_and_any_instance_answers_for_a_record(
) {
    let kafka = Kafka::start();
    const PARTS: i32 = 4;
    let t = topics(&kafka, PARTS).await;
    let logs = TempDir::new().unwrap();
    let dirs: Vec<TempDir> = (0..2).map(|_| TempDir::new().unwrap()).collect();
    // Sessions of 45 s (Kafka's default): the takeover below cannot wait for a's to run out.
    let standby = [
        "--standby-replicas",
        "1",
        "--kafka-config",
        "session.timeout.ms=45000",
    ];
    let a = spawn_with(&kafka, &t, (dirs[0].path(), logs.path()), "a", &standby);
    let b = spawn_with(&kafka, &t, (dirs[1].path(), logs.path()), "b", &standby);
    wait_ready(a.port, Duration::from_secs(60)).await;
    wait_ready(b.port, Duration::from_secs(60)).await;
    wait_shared(&[&a, &b], PARTS as u64, logs.path()).await;
    const N: u64 = 2_000;
    let base = now_ms() + 40_000;
    let dues = produce_due(&kafka, &t, N, PARTS as u64, |i| base + i * 5).await;
    wait_pending_all(&[&a, &b], N, logs.path()).await;
    // Each keeps a warm copy of the other's partitions.
    let warm = |c: &[u64]| c.iter().sum::<u64>() == N;
    let what = format!("{N} records in standby copies");
    wait_gauges(
        &[&a, &b],
        "kafka_delay_standby_records",
        warm,
        &what,
        logs.path(),
    )
    .await;

    // The group's overview counts each record once: a copy is not pending where it is kept.
    let (status, g) = get_json(&a, "/api/v1/group/overview").await;
    assert_eq!((status, g["pending"].as_u64()), (200, Some(N)), "{g}");
    let copies: u64 = g["members"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["overview"]["moving"]["standby_records"].as_u64())
        .sum();
    assert_eq!(copies, N, "{g}");
    // And so do its counts by target and by due time.
    let sum = |list: &str| -> u64 {
        g[list]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["pending"].as_u64().unwrap())
            .sum()
    };
    assert_eq!((sum("by_target"), sum("by_due")), (N, N), "{g}");
    // Each member says it owns the partitions the coordinator gave it, not its copies.
    for m in g["members"].as_array().unwrap() {
        let said = m["overview"]["instance"]["owned_partitions"]
            .as_array()
            .unwrap()
            .len();
        assert_eq!(said, m["partitions"].as_array().unwrap().len(), "{m}");
    }

    // A record of a's, asked of b by its ref: b sends the request on to a.
    let (status, page) = get_json(&a, "/api/v1/pending?limit=1").await;
    assert_eq!(status, 200, "{page}");
    let mine = &page["records"][0];
    let (id, reference) = (mine["id"].as_str().unwrap(), mine["ref"].as_str().unwrap());
    let (status, shown) = get_json(&b, &format!("/api/v1/pending/{reference}")).await;
    assert_eq!(status, 200, "{shown}");
    assert_eq!(shown["id"], mine["id"], "{shown}");
    assert_eq!(
        shown["served_by"],
        format!("127.0.0.1:{}", a.port),
        "{shown}"
    );
    let value = shown["value"].as_str().unwrap().to_owned();
    // Its id is a's: b holds a copy but never answers from it (the id may name another
    // record of b's own, ids being per instance).
    let (status, other) = get_json(&b, &format!("/api/v1/pending/{id}")).await;
    assert!(status == 404 || other["ref"] != reference, "{other}");
    let (status, missing) = get_json(&b, "/api/v1/pending/00ff000000000000").await;
    assert_eq!(status, 404, "{missing}");
    let said = missing["error"].as_str().unwrap_or_default();
    assert!(said.contains("ref") && said.contains("owners"), "{missing}");
    // b's listing shows only its own records and names a for the rest.
    let (_, listed) = get_json(&b, "/api/v1/pending?limit=1000").await;
    let listed_refs: Vec<&str> = listed["records"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["ref"].as_str())
        .collect();
    assert!(!listed_refs.contains(&reference), "{listed}");
    assert_eq!(
        listed["elsewhere"][0]["http"],
        format!("127.0.0.1:{}", a.port),
        "{listed}"
    );
    // Cancelled through b.
    let b_http = std::net::SocketAddr::from(([127, 0, 0, 1], b.port));
    let path = format!("/api/v1/pending/{reference}");
    let (status, cancelled) = http_json(b_http, "DELETE", &path, None, None).await;
    assert_eq!(status, 200, "{cancelled}");
    assert_eq!(cancelled["served_by"], format!("127.0.0.1:{}", a.port));
    let cancelled_i: u64 = value.trim_start_matches('r').parse().unwrap();

    // a dies; b finds its HTTP address refusing connections, removes it from the group and
    // takes its partitions from its warm copies, reading only their tails.
    let held_a = pending(&a).await;
    let before = gauge(&b, "kafka_delay_restored_entries_total").await;
    drop(a);
    let killed = std::time::Instant::now();
    let all = |o: &[u64]| o[0] == PARTS as u64;
    let what = format!("all {PARTS} owned by b");
    wait_gauges(
        &[&b],
        "kafka_delay_partitions_owned",
        all,
        &what,
        logs.path(),
    )
    .await;
    // b moved a's partitions by removing a, not a's session running out.
    let owned = killed.elapsed();
    let removed = gauge(&b, "kafka_delay_group_members_removed_total").await;
    assert!(
        removed == 1 && owned < Duration::from_secs(45),
        "b removed {removed} members; owned everything {owned:?} after the kill\n{}",
        logs_tail(logs.path())
    );
    wait_pending_all(&[&b], N - 1, logs.path()).await;
    let takeover = killed.elapsed();
    let read = gauge(&b, "kafka_delay_restored_entries_total").await - before;
    eprintln!(
        "a killed holding {held_a}; b removed it and owned everything {owned:.1?} later, all \
         pending {takeover:.1?} later, reading {read} changelog entries"
    );
    // Without the copy, b would read every entry of a's partitions: at least one per record.
    assert!(
        read < held_a / 10,
        "b read {read} entries to take over {held_a} records\n{}",
        logs_tail(logs.path())
    );

    let within = Duration::from_secs(90);
    let got = read_all_but(&kafka, &t, (PARTS, N), &[cancelled_i], within).await;
    let result = tally(&got, &dues);
    eprintln!("after the takeover: {result:?}");
    assert_eq!(result.lost, vec![cancelled_i], "{result:?}");
    assert!(
        result.duplicates == 0 && result.early == 0,
        "{result:?}\n{}",
        logs_tail(logs.path())
    );
    drop(b);
}

/// Three instances share twelve partitions while records come due; one at a time is killed
/// with SIGKILL and restarted (its data directory wiped every other time), a fourth joins and
/// one leaves with SIGTERM. Bounded here (`KAFKA_DELAY_SOAK=1`: 100,000 records, more rounds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_churn_with_kill_9_wiped_disks_a_join_and_a_leave_loses_nothing_and_is_never_early(
) {
    churn(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_churn_with_standby_replicas_loses_nothing_and_is_never_early() {
    churn(&["--standby-replicas", "2"]).await;
}

/// 3 instances of 12 partitions run with `more` flags while records come due: each killed in
/// turn (every other one with its data dir wiped) and restarted, then a fourth joins and one
/// leaves cleanly.
async fn churn(more: &[&str]) {
    let kafka = Kafka::start();
    const PARTS: i32 = 12;
    let t = topics(&kafka, PARTS).await;
    let logs = TempDir::new().unwrap();
    let (n, rounds, spread_ms): (u64, usize, u64) = if soak() {
        (100_000, 12, 240_000)
    } else {
        (6_000, 4, 50_000)
    };
    let dirs: Vec<TempDir> = (0..4).map(|_| TempDir::new().unwrap()).collect();
    let names = ["a", "b", "c", "d"];
    let mut live: Vec<Option<Instance>> = (0..3)
        .map(|k| {
            Some(spawn_with(
                &kafka,
                &t,
                (dirs[k].path(), logs.path()),
                names[k],
                more,
            ))
        })
        .collect();
    for i in live.iter().flatten() {
        wait_ready(i.port, Duration::from_secs(60)).await;
    }
    // `kafka-delay verify` produces the records, due over the spread from 8 s on, and reads
    // the target until all arrived (or 120 s after the last due time).
    let bound = 64 * rounds as u64;
    let window = format!("{}s", spread_ms / 1000);
    let verify = verify(&kafka, &t, n, ("8s", &window, "120s"));

    // Kill the instances in turn while records come due, restarting each at once.
    let mut unclean = 0u64;
    for round in 0..rounds {
        tokio::time::sleep(Duration::from_millis(spread_ms / (rounds as u64 + 2))).await;
        let k = round % 3;
        drop(live[k].take());
        unclean += 1;
        if round % 2 == 0 {
            std::fs::remove_dir_all(dirs[k].path()).unwrap();
            std::fs::create_dir(dirs[k].path()).unwrap();
        }
        let i = spawn_with(&kafka, &t, (dirs[k].path(), logs.path()), names[k], more);
        wait_ready(i.port, Duration::from_secs(60)).await;
        live[k] = Some(i);
    }
    // A fourth joins; the third leaves cleanly.
    let d = spawn_with(&kafka, &t, (dirs[3].path(), logs.path()), names[3], more);
    wait_ready(d.port, Duration::from_secs(60)).await;
    stop_gracefully(live[2].take().unwrap());

    let report = report(verify).await;
    eprintln!(
        "churn {more:?}: {n} records over {} s, {unclean} kill -9 (half with the data dir \
         wiped), one join, one leave; kafka-delay verify: {report} (duplicates allowed {bound})",
        spread_ms / 1000,
    );
    assert!(
        report["lost"] == 0 && report["early"] == 0,
        "verify said {report}\n{}",
        logs_tail(logs.path())
    );
    assert!(
        report["duplicates"].as_u64().is_some_and(|d| d <= bound),
        "{report}"
    );
    drop((live, d));
}

/// The group's overview from any instance: each member asked for its own, the sums equal to
/// what the members' metrics say, and a member that does not answer named, not left out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_any_instance_shows_the_whole_group_and_names_a_member_that_does_not_answer() {
    let kafka = Kafka::start();
    const PARTS: i32 = 6;
    let t = topics(&kafka, PARTS).await;
    let logs = TempDir::new().unwrap();
    let dirs: Vec<TempDir> = (0..3).map(|_| TempDir::new().unwrap()).collect();
    // Kafka's default session timeout (45 s): a member that hangs stays in the group for a
    // while, which is when an operator needs to see it named.
    let flags = ["--kafka-config", "session.timeout.ms=45000"];
    let live: Vec<Instance> = ["a", "b", "c"]
        .iter()
        .zip(&dirs)
        .map(|(name, d)| spawn_flags(&kafka, &t, (d.path(), logs.path()), name, &flags))
        .collect();
    for i in &live {
        wait_ready(i.port, Duration::from_secs(60)).await;
    }
    let all: Vec<&Instance> = live.iter().collect();
    wait_shared(&all, PARTS as u64, logs.path()).await;
    const N: u64 = 600;
    let due = now_ms() + 3_600_000;
    // 31 due times a second apart, each shared by 19 or 20 records spread over every
    // partition (31 and the 6 partitions have no common factor).
    produce_due(&kafka, &t, N, PARTS as u64, |i| due + (i % 31) * 1_000).await;
    wait_pending_all(&all, N, logs.path()).await;

    let group = |i: &Instance| {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], i.port));
        async move { http_json(addr, "GET", "/api/v1/group/overview", None, None).await }
    };
    let mut metrics = Vec::new();
    for i in &live {
        metrics.push(pending(i).await);
    }
    for asked in &live {
        let (status, g) = group(asked).await;
        assert_eq!(status, 200, "{g}");
        let members = g["members"].as_array().unwrap();
        assert_eq!(members.len(), 3, "{g}");
        assert!(members.iter().all(|m| m["answered"] == true), "{g}");
        assert_eq!(g["partial"], false);
        // Each member's own count is its metric, and the total their sum.
        for (i, m) in live.iter().zip(&metrics) {
            let http = format!("127.0.0.1:{}", i.port);
            let entry = members.iter().find(|e| e["http"] == http.as_str()).unwrap();
            assert_eq!(entry["overview"]["pending"], *m, "{http}: {entry}");
            assert_eq!(entry["mode"], "changelog");
        }
        assert_eq!(g["pending"], metrics.iter().sum::<u64>());
        assert_eq!(g["pending"], N);
        assert_eq!(g["by_target"][0]["target"], t.target.as_str());
        assert_eq!(g["by_target"][0]["pending"], N);
        let later = g["by_due"].as_array().unwrap().iter();
        assert_eq!(
            later.map(|d| d["pending"].as_u64().unwrap()).sum::<u64>(),
            N
        );
    }

    let cancelled = group_listing_and_bulk(&live, &t, due, N).await;
    let left = N - cancelled;

    // The console's overview is the group's.
    let url = format!("http://127.0.0.1:{}", live[0].port);
    let (shots, _tmp) = screenshots();
    // The browser searches the records due in the 2nd and 3rd second (40), pages through all,
    // and cancels those due in the 4th (20) from the first instance.
    let asked = format!("127.0.0.1:{}", live[0].port);
    let cancel_due = due + 3_000;
    let ids = serde_json::json!({
        "members": 3, "pending": left.to_string(), "asked": asked,
        "search_from": (due + 1_000).to_string(), "search_to": (due + 2_000).to_string(),
        "search_count": 40, "cancel_due": cancel_due.to_string(), "cancel_count": 20,
    });
    let seen = tokio::task::spawn_blocking({
        let (url, shots) = (url.clone(), shots.clone());
        move || browse("group", &url, &ids, None, &shots)
    });
    seen.await.unwrap();
    let (after, _) = list_group(&live[1], "", 1_000).await;
    assert_eq!(after.len() as u64, left - 20, "the browser's bulk cancel");
    assert!(after.iter().all(|r| r["due_ms"] != cancel_due));

    // c stops answering (SIGSTOP: still a member until its session ends).
    live[2].signal("STOP");
    let started = std::time::Instant::now();
    let (status, g) = group(&live[0]).await;
    let took = started.elapsed();
    let c_http = format!("127.0.0.1:{}", live[2].port);
    let rest = pending(&live[0]).await + pending(&live[1]).await;
    let ids = serde_json::json!({"members": 3, "pending": rest.to_string(), "missing": c_http});
    let seen =
        tokio::task::spawn_blocking(move || browse("group-partial", &url, &ids, None, &shots));
    let seen = seen.await;
    let (listed, pages) = list_group(&live[0], "", 1_000).await;
    live[2].signal("CONT");
    seen.unwrap();
    // The listing says which member's records it could not show.
    let page = &pages[0];
    assert_eq!(page["partial"], true, "{page}");
    let silent = page["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["http"] == c_http.as_str())
        .unwrap();
    assert_eq!(silent["answered"], false, "{silent}");
    assert!(listed.iter().all(|r| r["served_by"] != c_http.as_str()));
    assert_eq!(listed.len() as u64, rest);
    assert_eq!(status, 200, "{g}");
    assert_eq!(g["partial"], true, "{g}");
    let c = g["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["http"] == c_http.as_str())
        .unwrap_or_else(|| panic!("c is not listed: {g}"));
    assert_eq!(c["answered"], false, "{c}");
    assert!(
        c["error"].as_str().unwrap().contains(&c_http) && c["overview"].is_null(),
        "{c}"
    );
    // The sums cover the members that answered, and say so.
    let answered: u64 = g["members"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["overview"]["pending"].as_u64())
        .sum();
    assert_eq!(g["pending"], answered, "{g}");
    assert!(answered < N && answered == rest, "{g}; a and b hold {rest}");
    assert!(took < Duration::from_secs(15), "the answer took {took:?}");
    drop(live);
}

/// Pages through `/api/v1/group/pending` from `from`, `limit` at a time: every record with
/// the member that served it, and the pages' answers.
async fn list_group(
    from: &Instance,
    query: &str,
    limit: u64,
) -> (Vec<serde_json::Value>, Vec<serde_json::Value>) {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], from.port));
    let (mut records, mut pages) = (Vec::new(), Vec::new());
    let mut cursor: Option<String> = None;
    for _ in 0..1_000 {
        let more = cursor
            .as_ref()
            .map(|c| format!("&cursor={c}"))
            .unwrap_or_default();
        let path = format!("/api/v1/group/pending?limit={limit}{query}{more}");
        let (status, page) = http_json(addr, "GET", &path, None, None).await;
        assert_eq!(status, 200, "{path}: {page}");
        records.extend(page["records"].as_array().unwrap().iter().cloned());
        cursor = page["next_cursor"].as_str().map(str::to_owned);
        pages.push(page);
        if cursor.is_none() {
            break;
        }
    }
    assert!(cursor.is_none(), "more than 1,000 pages");
    (records, pages)
}

/// Any instance lists the whole group's records in due order, a page at a time, each once;
/// finds one by key wherever it is; and cancels across the group with an outcome per member,
/// a repeat changing nothing.
async fn group_listing_and_bulk(live: &[Instance], t: &Topics, due: u64, n: u64) -> u64 {
    let addresses: Vec<String> = live
        .iter()
        .map(|i| format!("127.0.0.1:{}", i.port))
        .collect();
    let (records, pages) = list_group(&live[1], "", 45).await;
    let refs: std::collections::BTreeSet<&str> =
        records.iter().map(|r| r["ref"].as_str().unwrap()).collect();
    assert_eq!(
        (records.len(), refs.len()),
        (n as usize, n as usize),
        "each record once"
    );
    let dues: Vec<u64> = records
        .iter()
        .map(|r| r["due_ms"].as_u64().unwrap())
        .collect();
    assert!(
        dues.windows(2).all(|w| w[0] <= w[1]),
        "not in due order: {dues:?}"
    );
    assert!(pages.len() >= (n / 45) as usize, "{} pages", pages.len());
    // Every member is asked for the first page; later ones ask those with more to list.
    assert_eq!(pages[0]["members"].as_array().unwrap().len(), 3);
    assert!(pages.iter().all(|p| p["partial"] == false));
    for a in &addresses {
        let served = records
            .iter()
            .filter(|r| r["served_by"] == a.as_str())
            .count();
        assert!(served > 0, "{a} served none of the records");
    }

    // A search by key finds the one record, whichever instance holds it.
    let (found, _) = list_group(&live[0], "&key=k17", 100).await;
    assert_eq!(found.len(), 1, "{found:?}");
    let k17 = records
        .iter()
        .find(|r| r["ref"] == found[0]["ref"])
        .unwrap();
    assert_eq!(found[0]["served_by"], k17["served_by"]);
    assert_eq!(found[0]["due_ms"], due + 17 * 1_000);

    // Cancel what is due first, across the group, from the third instance.
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], live[2].port));
    let first = (0..n).filter(|i| i % 31 == 0).count() as u64;
    let body = serde_json::json!({"target": t.target, "due_to": due.to_string()});
    let (status, done) = http_json(
        addr,
        "POST",
        "/api/v1/group/bulk/cancel",
        Some(body.clone()),
        None,
    )
    .await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(
        (done["matched"].as_u64(), done["changed"].as_u64()),
        (Some(first), Some(first)),
        "{done}"
    );
    assert_eq!(done["partial"], false);
    let members = done["members"].as_array().unwrap();
    assert_eq!(members.len(), 3, "{done}");
    let each: u64 = members
        .iter()
        .map(|m| m["result"]["changed"].as_u64().unwrap())
        .sum();
    assert_eq!(each, first, "the members' own counts: {done}");
    // Repeating it is safe: nothing is left to change.
    let (status, again) =
        http_json(addr, "POST", "/api/v1/group/bulk/cancel", Some(body), None).await;
    assert_eq!(
        (status, again["changed"].as_u64()),
        (200, Some(0)),
        "{again}"
    );
    let (left, _) = list_group(&live[0], "", 50).await;
    assert_eq!(left.len() as u64, n - first);
    assert!(left.iter().all(|r| r["due_ms"].as_u64().unwrap() > due));
    // A filter no member could take is refused once, before any member is asked.
    let (status, refused) = http_json(
        addr,
        "POST",
        "/api/v1/group/bulk/cancel",
        Some(serde_json::json!({"due_to": "soon"})),
        None,
    )
    .await;
    assert_eq!(status, 400, "{refused}");
    first
}

/// A rolling restart and a resize as Kubernetes does them, under load, in the default mode: each
/// of two instances in turn gets SIGTERM, exits, and comes back with its data directory (a
/// StatefulSet's pod and its volume); then the group grows to four and shrinks back to two,
/// the highest ordinals leaving first. Every handoff is clean, so nothing is lost, nothing is
/// early, and nothing fires twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_a_rolling_restart_and_a_resize_fire_every_record_once_and_never_early() {
    let kafka = Kafka::start();
    const PARTS: i32 = 8;
    let t = topics(&kafka, PARTS).await;
    let logs = TempDir::new().unwrap();
    let dirs: Vec<TempDir> = (0..4).map(|_| TempDir::new().unwrap()).collect();
    let names = ["a", "b", "c", "d"];
    let start = |k: usize| spawn_flags(&kafka, &t, (dirs[k].path(), logs.path()), names[k], &[]);
    let mut live: Vec<Option<Instance>> = vec![Some(start(0)), Some(start(1)), None, None];
    for i in live.iter().flatten() {
        wait_ready(i.port, Duration::from_secs(60)).await;
    }
    // Records due from 8 s to 88 s on; the last change of membership is over well before the
    // last of them, so that a record fired twice by a handoff shows in the report.
    const N: u64 = 20_000;
    let verify = verify(&kafka, &t, N, ("8s", "80s", "90s"));
    let pause = || tokio::time::sleep(Duration::from_secs(8));

    for (k, slot) in live.iter_mut().enumerate().take(2) {
        pause().await;
        stop_gracefully(slot.take().unwrap());
        let i = start(k);
        wait_ready(i.port, Duration::from_secs(60)).await;
        *slot = Some(i);
    }
    pause().await;
    for (k, slot) in live.iter_mut().enumerate().skip(2) {
        let i = start(k);
        wait_ready(i.port, Duration::from_secs(60)).await;
        *slot = Some(i);
    }
    let four: Vec<&Instance> = live.iter().flatten().collect();
    wait_shared(&four, PARTS as u64, logs.path()).await;
    pause().await;
    for k in [3, 2] {
        stop_gracefully(live[k].take().unwrap());
    }

    let report = report(verify).await;
    eprintln!(
        "rolling restart of 2, grow to 4, shrink to 2: {N} records over 80 s; \
         kafka-delay verify: {report}"
    );
    assert!(
        report["lost"] == 0 && report["early"] == 0 && report["duplicates"] == 0,
        "verify said {report}\n{}",
        logs_tail(logs.path())
    );
    drop(live);
}

/// A changelog topic that cannot hold the pending state stops the start with a message that
/// says what to fix: too few partitions, then a cleanup policy that deletes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_a_misconfigured_changelog_stops_the_start_saying_what_to_fix() {
    let kafka = Kafka::start();
    let logs = TempDir::new().unwrap();
    for (partitions, says) in [(1, "has 1 partitions but"), (2, "cleanup.policy=delete")] {
        let t = topics(&kafka, 2).await;
        let changelog = format!("g-{}-{}-changelog", t.id, t.delay);
        kafka.create_topic(&changelog, partitions).await;
        let data = TempDir::new().unwrap();
        let mut i = spawn(&kafka, &t, data.path(), logs.path(), "a");
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(s) = i._proc.0.try_wait().unwrap() {
                break s;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "still running with a changelog of {partitions} partitions\n{}",
                logs_tail(logs.path())
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let log = std::fs::read_to_string(logs.path().join("a.log")).unwrap();
        assert!(!status.success());
        assert!(log.contains(says) && log.contains(&changelog), "{log}");
        std::fs::remove_file(logs.path().join("a.log")).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_a_data_dir_written_without_the_changelog_is_taken_into_it_at_the_first_start_with_it(
) {
    let kafka = Kafka::start();
    let t = topics(&kafka, 2).await;
    let (data, logs) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let dirs = (data.path(), logs.path());
    let a = spawn_flags(&kafka, &t, dirs, "a", &["--no-changelog"]);
    wait_ready(a.port, Duration::from_secs(60)).await;
    assert_eq!(mode_of(&a).await, ("local".to_owned(), "-".to_owned()));
    const N: u64 = 200;
    let base = now_ms() + 20_000;
    let dues = produce_due(&kafka, &t, N, 2, |i| base + i * 10).await;
    wait_pending_all(&[&a], N, logs.path()).await;
    // Past the auto-commit interval: consuming the source again cannot bring them back.
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop_gracefully(a);

    // The same instance and data directory, in the default mode: the records stay pending.
    let a = spawn_flags(&kafka, &t, dirs, "a", &[]);
    wait_ready(a.port, Duration::from_secs(60)).await;
    assert_eq!(mode_of(&a).await.0, "changelog");
    wait_pending_all(&[&a], N, logs.path()).await;
    // And they are in the changelog: the disk lost with the process loses nothing.
    drop(a);
    std::fs::remove_dir_all(data.path()).unwrap();
    std::fs::create_dir(data.path()).unwrap();
    let a = spawn_flags(&kafka, &t, dirs, "a", &[]);
    wait_ready(a.port, Duration::from_secs(60)).await;
    let got = read_all(&kafka, &t, 2, N, Duration::from_secs(60)).await;
    let result = tally(&got, &dues);
    eprintln!("a --no-changelog data dir taken into the changelog, then lost: {result:?}");
    assert!(
        result.all_once_never_early(),
        "{result:?}\n{}",
        logs_tail(logs.path())
    );
    drop(a);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_a_second_member_without_the_changelog_or_of_another_mode_is_refused() {
    let kafka = Kafka::start();
    let t = topics(&kafka, 2).await;
    let logs = TempDir::new().unwrap();
    let dirs: Vec<TempDir> = (0..5).map(|_| TempDir::new().unwrap()).collect();
    let at = |i: usize| (dirs[i].path(), logs.path());
    let a = spawn_flags(&kafka, &t, at(0), "a", &["--no-changelog"]);
    wait_ready(a.port, Duration::from_secs(60)).await;
    // Ready comes before the group's assignment: a is a member once it was assigned its
    // partitions (both: it is alone).
    wait_for("a member with its partitions", logs.path(), async || {
        let log = std::fs::read_to_string(logs.path().join("a.log")).unwrap_or_default();
        (!log.contains("source partitions assigned partitions=2"))
            .then(|| "no assignment".to_owned())
    })
    .await;
    let a_id = format!("kafka-delay/local@127.0.0.1:{}", a.port);

    // Beside an instance without the changelog, neither a second one nor one with it runs.
    let b = spawn_flags(&kafka, &t, at(1), "b", &["--no-changelog"]);
    let c = spawn_flags(&kafka, &t, at(2), "c", &[]);
    let log = |name: &str| logs.path().join(format!("{name}.log"));
    let (b, c) = (exit_code(b, &log("b")), exit_code(c, &log("c")));
    let said =
        |name: &str| std::fs::read_to_string(logs.path().join(format!("{name}.log"))).unwrap();
    for (name, code, what) in [
        ("b", b, "must be alone in its group"),
        ("c", c, "runs the local mode"),
    ] {
        let log = said(name);
        assert!(
            code.is_some_and(|c| c != 0) && log.contains(&a_id) && log.contains(what),
            "{name} exited {code:?}; its log:\n{log}"
        );
    }
    // The first one goes on.
    wait_ready(a.port, Duration::from_secs(5)).await;

    // Members with the changelog run one mode: an exactly-once one is refused beside them.
    stop_gracefully(a);
    let d = spawn_flags(&kafka, &t, at(3), "d", &[]);
    wait_ready(d.port, Duration::from_secs(60)).await;
    let e = spawn_flags(&kafka, &t, at(4), "e", &["--exactly-once"]);
    let code = exit_code(e, &log("e"));
    let log = said("e");
    let d_id = format!("kafka-delay/changelog@127.0.0.1:{}", d.port);
    assert!(
        code.is_some_and(|c| c != 0)
            && log.contains(&d_id)
            && log.contains("runs the changelog mode"),
        "e exited {code:?}; its log:\n{log}"
    );
    assert_eq!(
        mode_of(&d).await,
        ("changelog".to_owned(), "changelog".to_owned())
    );
    drop(d);
}

/// Produces `r{i}:` padded to `bytes` for each `i` of `range` to `topic`, due at `due(i)`,
/// spread over `partitions`, each acknowledged before the next.
async fn produce_sized(
    kafka: &Kafka,
    (topic, target): (&str, &str),
    range: std::ops::Range<u64>,
    (partitions, bytes): (u64, usize),
    due: impl Fn(u64) -> u64,
) {
    let p = kafka.producer();
    for i in range {
        let mut value = format!("r{i}:");
        value.extend(std::iter::repeat_n('x', bytes.saturating_sub(value.len())));
        let at = due(i).to_string();
        common::produce_to(
            &p,
            topic,
            Some((i % partitions) as i32),
            Some(format!("k{i}").as_bytes()),
            Some(value.as_bytes()),
            &[("delay-target", target), ("delay-until", at.as_str())],
        )
        .await;
    }
}

/// The last changelog entry of each record of `source`'s changelog (group `g-{id}`):
/// `(pointers, values)` among the pending ones (tombstones left out).
async fn changelog_forms(kafka: &Kafka, t: &Topics, source: &str) -> (usize, usize) {
    let topic = format!("g-{}-{source}-changelog", t.id);
    let r = reader(kafka, &topic, 2);
    let mut last: HashMap<(i32, Vec<u8>), Option<u8>> = HashMap::new();
    for g in collect(&r, usize::MAX, Duration::from_secs(3)).await {
        let m = &g.msg;
        let Some(key) = rdkafka::Message::key(m).filter(|k| k.first() == Some(&b'r')) else {
            continue;
        };
        last.insert(
            (rdkafka::Message::partition(m), key.to_vec()),
            rdkafka::Message::payload(m).and_then(|v| v.first().copied()),
        );
    }
    let first = |b: u8| last.values().filter(|v| **v == Some(b)).count();
    (first(0x80), first(1))
}

/// Sets `retention.ms` of `topic`.
async fn set_retention(kafka: &Kafka, topic: &str, ms: u64) {
    use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, ResourceSpecifier};
    let admin: AdminClient<_> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", kafka.brokers())
        .create()
        .unwrap();
    let ms = ms.to_string();
    let alter = AlterConfig::new(ResourceSpecifier::Topic(topic)).set("retention.ms", &ms);
    for r in admin
        .alter_configs([&alter], &AdminOptions::new())
        .await
        .unwrap()
    {
        r.expect("retention.ms set");
    }
}

/// Deletes every record of `topic`'s `partitions`, as retention would.
async fn delete_all_records(kafka: &Kafka, topic: &str, partitions: i32) {
    use rdkafka::admin::{AdminClient, AdminOptions};
    let admin: AdminClient<_> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", kafka.brokers())
        .create()
        .unwrap();
    let mut tpl = rdkafka::TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, rdkafka::Offset::End)
            .unwrap();
    }
    let done = admin
        .delete_records(&tpl, &AdminOptions::new())
        .await
        .unwrap();
    for e in done.elements() {
        assert!(e.error().is_ok(), "{e:?}");
    }
}

/// The changelog points at values its source topics keep (the entries hold no value), and a
/// data directory wiped after `kill -9` restores them from the source records; a topic whose
/// retention is cut below its records' due times gets their values copied to the changelog,
/// so its records survive the source's deleting them too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_pointed_at_values_and_values_copied_when_retention_shrinks_survive_a_wiped_disk(
) {
    let kafka = Kafka::start();
    let t = topics(&kafka, 2).await;
    let short = t.delay_topic("short");
    kafka.create_topic(&short, 2).await;
    let (data, logs) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let a = spawn_flags(&kafka, &t, (data.path(), logs.path()), "a", &[]);
    wait_ready(a.port, Duration::from_secs(60)).await;
    wait_for("4 partitions owned", logs.path(), async || {
        let owned = gauge(&a, "kafka_delay_partitions_owned").await;
        (owned != 4).then(|| format!("{owned} owned"))
    })
    .await;
    // The watcher reads a newly owned topic's retention within a second.
    tokio::time::sleep(Duration::from_secs(3)).await;

    const N: u64 = 100;
    let base = now_ms() + 75_000;
    let due = |i: u64| base + i * 10;
    produce_sized(&kafka, (&t.delay, &t.target), 0..N, (2, 300), due).await;
    produce_sized(&kafka, (&short, &t.target), N..2 * N, (2, 300), due).await;
    wait_pending_all(&[&a], 2 * N, logs.path()).await;
    // Both topics keep their records for a week: every entry points at its value.
    assert_eq!(changelog_forms(&kafka, &t, &t.delay).await, (N as usize, 0));
    assert_eq!(changelog_forms(&kafka, &t, &short).await, (N as usize, 0));

    // `short` now keeps records for 30 s, less than they wait: their values are copied.
    set_retention(&kafka, &short, 30_000).await;
    wait_for(
        "values of the shortened topic copied",
        logs.path(),
        async || {
            let forms = changelog_forms(&kafka, &t, &short).await;
            (forms != (0, N as usize)).then(|| format!("(pointers, values) {forms:?}"))
        },
    )
    .await;
    assert_eq!(changelog_forms(&kafka, &t, &t.delay).await, (N as usize, 0));
    // Retention deletes them from the source; past the auto-commit, consuming it again cannot
    // bring them back either.
    delete_all_records(&kafka, &short, 2).await;
    tokio::time::sleep(Duration::from_secs(3)).await;

    drop(a);
    std::fs::remove_dir_all(data.path()).unwrap();
    std::fs::create_dir(data.path()).unwrap();
    let a = spawn_flags(&kafka, &t, (data.path(), logs.path()), "a", &[]);
    wait_ready(a.port, Duration::from_secs(60)).await;
    let dues: Vec<u64> = (0..2 * N).map(due).collect();
    let wait = Duration::from_millis(due(2 * N - 1).saturating_sub(now_ms()) + 20_000);
    let got = read_all(&kafka, &t, 2, 2 * N, wait).await;
    let result = tally(&got, &dues);
    assert!(
        result.all_once_never_early(),
        "{result:?}\n{}",
        logs_tail(logs.path())
    );
}
