//! Several instances with a changelog, on Apache Kafka (the mock cluster honours neither static
//! membership nor cooperative rebalancing): a lost data directory loses nothing, and a killed
//! instance's partitions move to the others with their pending records.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use common::group::{
    logs_tail, report, soak, spawn, spawn_with, stop_gracefully, verify, Instance,
};
use common::procs::wait_ready;
use common::{collect, http_get, http_json, metric, now_ms, reader, Got, Kafka, Topics};
use rdkafka::producer::FutureRecord;
use tempfile::TempDir;

async fn gauge(i: &Instance, name: &str) -> u64 {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], i.port));
    match tokio::time::timeout(Duration::from_secs(2), http_get(addr, "/metrics")).await {
        Ok((200, body)) => metric(&body, name).unwrap_or(0.0) as u64,
        _ => 0,
    }
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
/// own.
async fn wait_pending(instances: &[&Instance], n: u64, logs: &Path) {
    wait_for(&format!("{n} in all"), logs, async || {
        let mut held = Vec::new();
        for i in instances {
            held.push(pending(i).await);
        }
        (held.iter().sum::<u64>() != n).then(|| format!("pending {held:?}"))
    })
    .await;
}

/// Produces `r{i}` for i in 0..n, due at `due(i)`, to partition `i % partitions`, waiting for
/// all acknowledgements at the end.
async fn produce_due(kafka: &Kafka, t: &Topics, n: u64, partitions: u64, due: impl Fn(u64) -> u64) {
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
}

/// What arrived: lost, duplicated and early records among `r0..r{n}`.
#[derive(Default)]
struct Tally {
    lost: Vec<u64>,
    duplicates: u64,
    early: u64,
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

fn tally(got: &[Got], n: u64) -> Tally {
    let mut seen: HashMap<u64, u64> = HashMap::new();
    let mut t = Tally::default();
    for g in got {
        let Some(i) = g
            .value()
            .and_then(|v| v.strip_prefix('r').and_then(|s| s.parse().ok()))
        else {
            continue;
        };
        *seen.entry(i).or_default() += 1;
        let due = g.num("delay-due-ms");
        if g.num("delay-fired-ms") < due || g.received_ms < due {
            t.early += 1;
        }
    }
    t.lost = (0..n).filter(|i| !seen.contains_key(i)).collect();
    t.duplicates = seen.values().map(|c| c - 1).sum();
    t
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
    let missing = |got: &[Got]| tally(got, n).lost.iter().any(|i| !cancelled.contains(i));
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
    kafka.create_topic(&t.target, partitions).await;
    kafka.create_topic(&t.dlt, 1).await;
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_a_data_dir_wiped_after_kill_9_is_restored_from_the_changelog() {
    let kafka = Kafka::start();
    let t = topics(&kafka, 2).await;
    let (data, logs) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let a = spawn(&kafka, &t, data.path(), logs.path(), "a");
    wait_ready(a.port, Duration::from_secs(60)).await;
    const N: u64 = 300;
    let base = now_ms() + 12_000;
    produce_due(&kafka, &t, N, 2, |i| base + i * 10).await;
    wait_pending(&[&a], N, logs.path()).await;
    // Past the consumer's auto-commit interval: Kafka's committed offsets are past the 300, so
    // consuming the source again cannot bring them back.
    tokio::time::sleep(Duration::from_secs(3)).await;

    // The disk is lost with the process: nothing of the 300 is left on this machine.
    drop(a);
    std::fs::remove_dir_all(data.path()).unwrap();
    std::fs::create_dir(data.path()).unwrap();
    let a = spawn(&kafka, &t, data.path(), logs.path(), "a");
    wait_ready(a.port, Duration::from_secs(60)).await;

    let got = read_all(&kafka, &t, 2, N, Duration::from_secs(60)).await;
    let result = tally(&got, N);
    eprintln!("wiped data dir: {result:?}");
    assert!(
        result.lost.is_empty() && result.duplicates == 0 && result.early == 0,
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
    produce_due(&kafka, &t, N, PARTS as u64, |i| base + i * 10).await;
    wait_pending(&[&a, &b], N, logs.path()).await;
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
    wait_pending(&[&b, &c], N, logs.path()).await;
    let takeover = killed.elapsed();

    let got = read_all(&kafka, &t, PARTS, N, Duration::from_secs(90)).await;
    let result = tally(&got, N);
    eprintln!(
        "a killed holding {held_a} of {N}, b held {held_b}; every partition owned and all {N} \
         pending again {takeover:.1?} after the kill; after the handoff: {result:?}"
    );
    assert!(
        result.lost.is_empty() && result.duplicates == 0 && result.early == 0,
        "{result:?}\n{}",
        logs_tail(logs.path())
    );
    drop((b, c));
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
    let standby = ["--standby-replicas", "1"];
    let a = spawn_with(&kafka, &t, (dirs[0].path(), logs.path()), "a", &standby);
    let b = spawn_with(&kafka, &t, (dirs[1].path(), logs.path()), "b", &standby);
    wait_ready(a.port, Duration::from_secs(60)).await;
    wait_ready(b.port, Duration::from_secs(60)).await;
    wait_shared(&[&a, &b], PARTS as u64, logs.path()).await;
    const N: u64 = 2_000;
    let base = now_ms() + 40_000;
    produce_due(&kafka, &t, N, PARTS as u64, |i| base + i * 5).await;
    wait_pending(&[&a, &b], N, logs.path()).await;
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

    // a dies; b takes its partitions from its warm copies, reading only their tails.
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
    wait_pending(&[&b], N - 1, logs.path()).await;
    let takeover = killed.elapsed();
    let read = gauge(&b, "kafka_delay_restored_entries_total").await - before;
    eprintln!(
        "a killed holding {held_a}; b owned everything {takeover:.1?} later, reading {read} \
         changelog entries"
    );
    // Without the copy, b would read every entry of a's partitions: at least one per record.
    assert!(
        read < held_a / 10,
        "b read {read} entries to take over {held_a} records\n{}",
        logs_tail(logs.path())
    );

    let within = Duration::from_secs(90);
    let got = read_all_but(&kafka, &t, (PARTS, N), &[cancelled_i], within).await;
    let result = tally(&got, N);
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
