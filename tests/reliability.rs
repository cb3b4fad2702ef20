//! Faults: kill -9 at random moments, crashes at each step of the durability order
//! (failpoints), a Kafka outage, a clock that jumps, a flood of bad input, and secrets in logs.
//! Every check goes through the verifier's [`Tally`]: lost, duplicated, early, lateness.
//! Bounded for CI; `KAFKA_DELAY_SOAK=1` (see RELIABILITY.md) runs the long versions.
//!
//! Tests named `mock_cluster_*` inject their fault through librdkafka's in-process mock cluster
//! and always run on it; tests named `apache_kafka_*` need a real Apache Kafka (an Apache Kafka
//! process restarted, DeleteTopics) and run on `common::apache`'s. The others run on the Kafka
//! of the run (`make test`: the mock cluster, then Apache Kafka).

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::procs::*;
use common::*;
use kafka_delay::verify::{Report, Tally};
use kafka_delay_core::clock::OffsetClock;
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use tempfile::TempDir;

/// Header name and value pairs of a generated record.
type Headers<'a> = Vec<(&'a str, Vec<u8>)>;

fn soak() -> bool {
    std::env::var("KAFKA_DELAY_SOAK").is_ok_and(|v| v == "1")
}

fn env_u64(name: &str, ci: u64, soak_value: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if soak() { soak_value } else { ci })
}

/// Consumes `topic` into the tally until the test ends.
fn collector(kafka: &Kafka, topic: &str, partitions: i32, tally: Arc<Mutex<Tally>>) {
    let c = reader(kafka, topic, partitions);
    tokio::spawn(async move {
        loop {
            match c.recv().await {
                Ok(m) => tally.lock().unwrap().observe(m.payload(), m.headers()),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    });
}

async fn wait_complete(tally: &Arc<Mutex<Tally>>, within: Duration) -> Report {
    let deadline = Instant::now() + within;
    while !tally.lock().unwrap().complete() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Duplicates of the last records arrive right after them.
    tokio::time::sleep(Duration::from_secs(2)).await;
    tally.lock().unwrap().report()
}

/// Produces record `i` of the plan for every `i` in `range`, due at `dues[i]`.
async fn produce_plan(
    p: &FutureProducer,
    delay: &str,
    target: &str,
    tally: &Arc<Mutex<Tally>>,
    dues: &[u64],
    range: std::ops::Range<usize>,
) {
    let mut pending = Vec::new();
    for i in range {
        let value = tally.lock().unwrap().value(i);
        let due = dues[i].to_string();
        let key = format!("k{i}");
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "delay-target",
                value: Some(target),
            })
            .insert(Header {
                key: "delay-until",
                value: Some(&due),
            });
        let rec = FutureRecord::to(delay)
            .key(&key)
            .payload(&value)
            .headers(headers);
        pending.push(p.send_result(rec).map_err(|(e, _)| e).expect("queued"));
    }
    for f in pending {
        f.await
            .expect("delivered")
            .map_err(|(e, _)| e)
            .expect("acknowledged");
    }
}

/// Produces `n` numbered records due from `start` every `spacing_ms` to the test's target, with
/// a collector tallying what arrives there.
async fn produce_tallied(
    kafka: &Kafka,
    t: &Topics,
    n: usize,
    start: u64,
    spacing_ms: u64,
) -> Arc<Mutex<Tally>> {
    let (tally, dues) = tally(n, start, spacing_ms);
    collector(kafka, &t.target, 1, tally.clone());
    produce_plan(&kafka.producer(), &t.delay, &t.target, &tally, &dues, 0..n).await;
    tally
}

fn tally(n: usize, start: u64, spacing_ms: u64) -> (Arc<Mutex<Tally>>, Vec<u64>) {
    let dues: Vec<u64> = (0..n as u64).map(|i| start + i * spacing_ms).collect();
    (
        Arc::new(Mutex::new(Tally::new(&unique("run"), dues.clone()))),
        dues,
    )
}

/// A deterministic "random" sequence (SplitMix64).
fn jitter(seed: u64, lo: u64, hi: u64) -> u64 {
    lo + (kafka_delay_core::retry::unit_interval(seed) * (hi - lo) as f64) as u64
}

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
        broker = spawn_broker(&brokers, &t, &data, port);
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
            &[("KAFKA_DELAY_FAILPOINT", point)],
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
        let _broker = spawn_broker(&brokers, &t, &data, port);
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
async fn mock_cluster_kafka_outage_loses_nothing_and_firing_catches_up() {
    let outage = Duration::from_secs(env_u64("KAFKA_DELAY_OUTAGE_SECS", 30, 120));
    let env = Env::start_on(Kafka::embedded(), Topics::new(), 1, &[]).await;
    let (kafka, t) = (&env.kafka, &env.t);
    let Some(mock) = kafka.mock() else {
        panic!("the outage test takes brokers down in the in-process mock cluster");
    };
    // 300 records due from 2 s ahead until well inside the outage.
    let tally = produce_tallied(kafka, t, 300, now_ms() + 2_000, 20).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    mock.cluster().broker_down(1).expect("broker down");
    let down_at = Instant::now();
    tokio::time::sleep(outage).await;
    mock.cluster().broker_up(1).expect("broker up");
    let up_at = Instant::now();
    let report = wait_complete(&tally, Duration::from_secs(120)).await;
    let caught_up = up_at.elapsed().saturating_sub(Duration::from_secs(2));
    eprintln!(
        "outage {:?}: {report:?}; all delivered {:?} after Kafka came back",
        up_at - down_at,
        caught_up
    );
    println!("outage {outage:?}, catch-up within {caught_up:?}\n{report}");
    assert_eq!(
        report.lost, 0,
        "lost in the outage: {:?}",
        report.lost_sample
    );
    assert_eq!(report.early, 0);
    assert_eq!(
        report.duplicates, 0,
        "idempotent producer: no duplicates without a crash"
    );
    env.broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_jumping_back_never_fires_early_and_jumping_forward_fires_what_became_due() {
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

    // 200 records due over the next hour, 20 of them in the next 3 seconds.
    let now = now_ms();
    let dues: Vec<u64> = (0..200u64)
        .map(|i| {
            if i < 20 {
                now + 2_000 + i * 50
            } else {
                now + 60_000 + i * 17_000
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
    // Forward by two hours (an hour past the real time): all 200 are due and fire.
    let jumped = Instant::now();
    clock.set_offset_ms(3_600_000);
    let report = wait_complete(&tally, Duration::from_secs(60)).await;
    eprintln!(
        "clock jumps: {report:?}, all fired {:?} after the jump forward",
        jumped.elapsed()
    );
    println!("clock back 1h then forward 1h\n{report}");
    assert_eq!(report.lost, 0);
    assert_eq!(report.early, 0, "never early by the broker's clock");
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_bad_input_is_dead_lettered_exactly_and_valid_records_are_unaffected() {
    let total = env_u64("KAFKA_DELAY_BAD_INPUT_RECORDS", 30_000, 1_000_000) as usize;
    let same_ms = total / 10;
    // Several partitions each: librdkafka's mock cluster finds a fetch offset by walking the
    // partition's message sets, so one partition of 100K+ records slows the mock, not us.
    const PARTS: i32 = 8;
    let kafka = Kafka::start();
    let t = Topics::new();
    kafka.create_topic(&t.delay, PARTS).await;
    kafka.create_topic(&t.target, PARTS).await;
    kafka.create_topic(&t.dlt, PARTS).await;
    let data = TempDir::new().unwrap();
    let flags = [
        "--target-allow",
        "^(out|probe)-",
        "--max-record-bytes",
        "4000",
    ];
    let broker = start(config(&kafka, &t, &data, &flags)).await;
    let probe = format!("probe-{}", t.id);
    kafka.create_topic(&probe, 1).await;
    wait_consuming(&kafka, &t, &probe).await;
    let (kafka, t) = (&kafka, &t);
    let internal = "__consumer_offsets";
    let long = "x".repeat(250);
    let loop_target = t.delay_topic("loop");
    let due_ok = (now_ms() + 3_000).to_string();
    let same = (now_ms() + 4_000).to_string();
    let big = vec![b'v'; 5_000];
    // Each malformed case: headers, and whether the value is the oversized one.
    let bad: Vec<(Headers<'_>, bool)> = vec![
        (vec![("delay-until", due_ok.clone().into())], false),
        (
            vec![
                ("delay-target", b"".to_vec()),
                ("delay-until", due_ok.clone().into()),
            ],
            false,
        ),
        (
            vec![
                ("delay-target", t.target.clone().into()),
                ("delay-target", b"other".to_vec()),
                ("delay-until", due_ok.clone().into()),
            ],
            false,
        ),
        (
            vec![
                ("delay-target", vec![0xff, 0xfe]),
                ("delay-until", due_ok.clone().into()),
            ],
            false,
        ),
        (
            vec![
                ("delay-target", t.target.clone().into()),
                ("delay-until", b"-5".to_vec()),
            ],
            false,
        ),
        (
            vec![
                ("delay-target", t.target.clone().into()),
                ("delay-until", b"1.5e12".to_vec()),
            ],
            false,
        ),
        (
            vec![
                ("delay-target", t.target.clone().into()),
                ("delay-until", b"99999999999999999999999".to_vec()),
            ],
            false,
        ),
        (
            vec![
                ("delay-target", t.target.clone().into()),
                ("delay-until", b"1763700000".to_vec()),
            ],
            false,
        ),
        (vec![("delay-target", t.target.clone().into())], false),
        (
            vec![
                ("delay-target", long.clone().into()),
                ("delay-until", due_ok.clone().into()),
            ],
            false,
        ),
        (
            vec![
                ("delay-target", b"bad topic!".to_vec()),
                ("delay-until", due_ok.clone().into()),
            ],
            false,
        ),
        (
            vec![
                ("delay-target", internal.into()),
                ("delay-until", due_ok.clone().into()),
            ],
            false,
        ),
        (
            vec![
                ("delay-target", loop_target.clone().into()),
                ("delay-until", due_ok.clone().into()),
            ],
            false,
        ),
        (
            vec![
                ("delay-target", b"not-allowed".to_vec()),
                ("delay-until", due_ok.clone().into()),
            ],
            false,
        ),
        (
            vec![
                ("delay-target", t.target.clone().into()),
                ("delay-until", due_ok.clone().into()),
            ],
            true,
        ),
    ];
    let producer: FutureProducer = rdkafka::config::ClientConfig::new()
        .set("bootstrap.servers", kafka.brokers())
        .set("linger.ms", "20")
        .set("queue.buffering.max.messages", "200000")
        .create()
        .unwrap();
    let started = Instant::now();
    let (mut n_bad, mut n_good) = (0u64, 0u64);
    let mut pending = Vec::new();
    for i in 0..total {
        // Every third record is malformed; 1 in 10 valid ones are due in the same millisecond.
        let (headers, oversized, key): (Headers<'_>, bool, Option<Vec<u8>>) = if i % 3 == 0 {
            let (h, o) = bad[(i / 3) % bad.len()].clone();
            n_bad += 1;
            (h, o, None)
        } else {
            n_good += 1;
            let due = if (n_good as usize) <= same_ms {
                same.clone()
            } else {
                due_ok.clone()
            };
            let key = (i % 7 != 0).then(|| format!("k{i}").into_bytes());
            (
                vec![
                    ("delay-target", t.target.clone().into()),
                    ("delay-until", due.into()),
                ],
                false,
                key,
            )
        };
        let mut hs = OwnedHeaders::new();
        for (k, v) in &headers {
            hs = hs.insert(Header {
                key: k,
                value: Some(v.as_slice()),
            });
        }
        let value: Option<&[u8]> = if oversized {
            Some(&big)
        } else if i % 11 == 0 {
            None
        } else {
            Some(b"v")
        };
        let mut rec = FutureRecord::<[u8], [u8]>::to(&t.delay).headers(hs);
        if let Some(k) = &key {
            rec = rec.key(k);
        }
        if let Some(v) = value {
            rec = rec.payload(v);
        }
        loop {
            match producer.send_result(rec) {
                Ok(f) => {
                    pending.push(f);
                    break;
                }
                Err((_, back)) => {
                    rec = back;
                    for f in pending.drain(..) {
                        f.await.unwrap().map_err(|(e, _)| e).unwrap();
                    }
                }
            }
        }
        if pending.len() >= 50_000 {
            for f in pending.drain(..) {
                f.await.unwrap().map_err(|(e, _)| e).unwrap();
            }
            // The mock cluster keeps only about 5 MB per partition and deletes older batches,
            // so producing far ahead of the broker would lose records inside "Kafka" (a 1M
            // run without this lost half of them there). Keep the broker within 50K records.
            let lag_deadline = Instant::now() + Duration::from_secs(120);
            while ingested(broker.http_addr()).await + 50_000 < i + 1
                && Instant::now() < lag_deadline
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    for f in pending.drain(..) {
        f.await.unwrap().map_err(|(e, _)| e).unwrap();
    }
    let produced = started.elapsed();
    // Null-value records with an id-less, target-ful shape are still valid schedules
    // (tombstones are published as tombstones), so valid = every record not in `bad`.
    let deadline = Instant::now() + Duration::from_secs(if soak() { 1_800 } else { 300 });
    let (mut dead, mut delivered) = (0i64, 0i64);
    while Instant::now() < deadline {
        dead = topic_size(kafka, &t.dlt, PARTS);
        delivered = topic_size(kafka, &t.target, PARTS);
        if dead >= n_bad as i64 && delivered >= n_good as i64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let took = started.elapsed();
    if dead != n_bad as i64 || delivered != n_good as i64 {
        let (_, metrics) = http_get(broker.http_addr(), "/metrics").await;
        let interesting: Vec<&str> = metrics
            .lines()
            .filter(|l| {
                l.starts_with("kafka_delay_") && !l.ends_with(" 0") && !l.contains("_bucket")
            })
            .collect();
        eprintln!("metrics:\n{}", interesting.join("\n"));
    }
    eprintln!(
        "bad input: {total} records ({n_bad} malformed, {n_good} valid, {same_ms} due in one ms) produced in {produced:?}; dead letters {dead}, delivered {delivered}, all done in {took:?}"
    );
    println!("| {total} | {n_bad} | {dead} | {n_good} | {delivered} | {same_ms} | {took:?} |");
    assert_eq!(dead, n_bad as i64, "one dead letter per malformed record");
    assert_eq!(
        delivered, n_good as i64,
        "every valid record delivered once"
    );
    assert_eq!(
        http_get(broker.http_addr(), "/readyz").await.0,
        200,
        "no stall"
    );
    broker.shutdown().await;
}

/// Records the broker has consumed from its source topics.
async fn ingested(addr: std::net::SocketAddr) -> usize {
    let (_, body) = http_get(addr, "/metrics").await;
    body.lines()
        .filter(|l| l.starts_with("kafka_delay_ingest_records_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as usize
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_given_to_librdkafka_never_appear_in_logs_or_errors() {
    let secret = "Hunter2-very-secret-value";
    let token = "admin-token-that-is-secret-42";
    let data = TempDir::new().unwrap();
    let http = format!("127.0.0.1:{}", free_port());
    let password = format!("sasl.password={secret}");
    // A cluster that does not answer, SASL credentials, an admin token, debug logs: it logs
    // its configuration and its connection errors, then is stopped.
    let mut child = Command::new("timeout")
        .args([
            "-s",
            "TERM",
            "8",
            BIN,
            "run",
            "--brokers",
            "127.0.0.1:1",
            "--data-dir",
        ])
        .arg(data.path())
        .args(["--http-addr", &http, "--admin-token", token])
        .args(["--kafka-config", "security.protocol=SASL_PLAINTEXT"])
        .args([
            "--kafka-config",
            "sasl.mechanism=PLAIN",
            "--kafka-config",
            "sasl.username=u",
        ])
        .args(["--kafka-config", &password])
        .env("KAFKA_DELAY_LOG", "debug")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = String::new();
    let mut err = String::new();
    use std::io::Read;
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    child.wait().unwrap();
    let all = format!("{out}{err}");
    assert!(
        all.contains("sasl.password=[redacted]"),
        "the configuration is logged, redacted:\n{all}"
    );
    assert!(!all.contains(secret), "the SASL password leaked:\n{all}");
    assert!(!all.contains(token), "the admin token leaked:\n{all}");
    // And a configuration error that names the property does not print its value.
    let bad = Command::new(BIN)
        .args(["run", "--brokers", "127.0.0.1:1", "--data-dir"])
        .arg(data.path())
        .args([
            "--kafka-config",
            &password,
            "--kafka-config",
            "sasl.mechanism=NOPE",
        ])
        .args(["--http-addr", &format!("127.0.0.1:{}", free_port())])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&bad.stdout),
        String::from_utf8_lossy(&bad.stderr)
    );
    assert!(
        !bad.status.success(),
        "an unknown SASL mechanism fails at start: {text}"
    );
    assert!(
        !text.contains(secret),
        "the password leaked in an error:\n{text}"
    );
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

/// Poison targets: after records were scheduled for them, one target is refused (the cluster
/// answers TOPIC_AUTHORIZATION_FAILED for it) and one disappears (UNKNOWN_TOPIC_OR_PARTITION,
/// what a deleted topic looks like), injected with the mock cluster's per-topic metadata errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_cluster_refused_and_deleted_targets_are_dead_lettered_after_bounded_retries_and_others_keep_firing(
) {
    let kafka = Kafka::embedded();
    let t = Topics::new();
    let (refused, deleted) = (format!("refused-{}", t.id), format!("deleted-{}", t.id));
    for topic in [&t.delay, &t.target, &t.dlt, &refused, &deleted] {
        kafka.create_topic(topic, 1).await;
    }
    let data = TempDir::new().unwrap();
    // The test configuration: --fire-max-attempts 2, --fire-backoff-max 1s.
    let broker = start(config(&kafka, &t, &data, &[])).await;
    wait_consuming(&kafka, &t, &t.target).await;
    let due = (now_ms() + 3_000).to_string();
    let p = kafka.producer();
    for i in 0..10 {
        for (target, name) in [(&refused, "r"), (&deleted, "d"), (&t.target, "ok")] {
            produce(
                &p,
                &t.delay,
                Some(&format!("{name}{i}")),
                Some(&format!("{name}{i}")),
                &[("delay-target", target), ("delay-until", &due)],
            )
            .await;
        }
    }
    // Scheduled; now the cluster refuses one target and forgets the other.
    let mock = kafka
        .mock()
        .expect("the mock cluster injects per-topic errors")
        .cluster();
    mock.topic_error(
        &refused,
        rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED,
    )
    .unwrap();
    mock.topic_error(
        &deleted,
        rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART,
    )
    .unwrap();
    let out = reader(&kafka, &t.target, 1);
    let ok = collect(&out, 11, Duration::from_secs(30)).await;
    // The probe of wait_consuming went to the target too.
    let fired: Vec<&Got> = ok
        .iter()
        .filter(|g| g.key().is_some_and(|k| k.starts_with("ok")))
        .collect();
    assert_eq!(fired.len(), 10, "the healthy target keeps firing");
    let due_ms: u64 = due.parse().unwrap();
    let worst = fired
        .iter()
        .map(|g| g.num("delay-fired-ms") - due_ms)
        .max()
        .unwrap();
    eprintln!("healthy target: 10 fired, at most {worst} ms after due");
    assert!(
        fired.iter().all(|g| g.num("delay-fired-ms") >= due_ms),
        "never early"
    );
    let dlt = reader(&kafka, &t.dlt, 1);
    let dead = collect(&dlt, 20, Duration::from_secs(90)).await;
    let reasons: std::collections::BTreeMap<(String, String), usize> =
        dead.iter().fold(Default::default(), |mut m, g| {
            let key = (
                g.header("delay-target").unwrap_or_default(),
                g.header("delay-error").unwrap_or_default(),
            );
            *m.entry(key).or_default() += 1;
            m
        });
    eprintln!("dead letters: {reasons:?}");
    assert_eq!(
        dead.len(),
        20,
        "every poisoned record dead-lettered once: {reasons:?}"
    );
    assert_eq!(
        reasons.get(&(refused.clone(), "target-denied".into())),
        Some(&10),
        "{reasons:?}"
    );
    assert_eq!(
        reasons.get(&(deleted.clone(), "target-not-found".into())),
        Some(&10),
        "{reasons:?}"
    );
    // Nothing is left pending.
    assert_eq!(broker.store().pending(), 0);
    broker.shutdown().await;
}

/// Apache Kafka stopped (SIGTERM, a clean JVM shutdown) for 10 s while 300 records come due,
/// then started again with its data: nothing lost, nothing early, and the idempotent producer
/// publishes nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_broker_restart_while_records_come_due_loses_nothing() {
    let apache = apache::Private::start();
    let kafka = Kafka::External(apache.brokers().to_owned());
    let env = Env::start_on(kafka, Topics::new(), 1, &[]).await;
    let (kafka, t) = (&env.kafka, &env.t);
    // Due from 3 s ahead over 9 s: before, during and after the outage.
    let tally = produce_tallied(kafka, t, 300, now_ms() + 3_000, 30).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    apache.stop();
    let down_at = Instant::now();
    tokio::time::sleep(Duration::from_secs(10)).await;
    apache.restart();
    let up_at = Instant::now();
    let report = wait_complete(&tally, Duration::from_secs(120)).await;
    let complete = up_at.elapsed().saturating_sub(Duration::from_secs(2));
    eprintln!(
        "Apache Kafka down {:?}: {report:?}; complete within {complete:?} after it came back",
        up_at - down_at
    );
    println!("Apache Kafka restart: down {:?}\n{report}", up_at - down_at);
    assert_eq!(report.lost, 0, "lost: {:?}", report.lost_sample);
    assert_eq!(report.early, 0, "fired early");
    assert_eq!(
        report.duplicates, 0,
        "the idempotent producer publishes nothing twice across a broker restart"
    );
    env.broker.shutdown().await;
}

/// A target topic deleted with DeleteTopics after records were scheduled for it (due 10 s
/// later): they are dead-lettered as `target-not-found` once each after bounded retries (the
/// broker's producer never re-creates a topic, whatever the cluster's auto.create.topics.enable),
/// nothing is left pending, and a healthy target keeps firing on time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_target_deleted_with_delete_topics_is_dead_lettered_and_others_keep_firing() {
    let kafka = Kafka::External(apache::shared());
    let t = Topics::new();
    let deleted = format!("deleted-{}", t.id);
    kafka.create_topic(&deleted, 1).await;
    // The test configuration: --fire-max-attempts 2, --fire-backoff-max 1s.
    let env = Env::start_on(kafka, t, 1, &[]).await;
    let (kafka, t) = (&env.kafka, &env.t);
    let due_ms = now_ms() + 10_000;
    let due = due_ms.to_string();
    let p = kafka.producer();
    for i in 0..10 {
        for (target, name) in [(&deleted, "d"), (&t.target, "ok")] {
            produce(
                &p,
                &t.delay,
                Some(&format!("{name}{i}")),
                Some(&format!("{name}{i}")),
                &[("delay-target", target), ("delay-until", &due)],
            )
            .await;
        }
    }
    kafka.delete_topic(&deleted).await;
    assert!(now_ms() < due_ms, "deleted before the records came due");
    let out = reader(kafka, &t.target, 1);
    let fired: Vec<Got> = collect(&out, 11, Duration::from_secs(30))
        .await
        .into_iter()
        .filter(|g| g.key().is_some_and(|k| k.starts_with("ok")))
        .collect();
    assert_eq!(fired.len(), 10, "the healthy target keeps firing");
    assert!(
        fired.iter().all(|g| g.num("delay-fired-ms") >= due_ms),
        "never early"
    );
    let dlt = reader(kafka, &t.dlt, 1);
    let dead = collect(&dlt, 10, Duration::from_secs(90)).await;
    let reasons: std::collections::BTreeMap<(String, String), usize> =
        dead.iter().fold(Default::default(), |mut m, g| {
            let key = (
                g.header("delay-target").unwrap_or_default(),
                g.header("delay-error").unwrap_or_default(),
            );
            *m.entry(key).or_default() += 1;
            m
        });
    eprintln!("a target deleted with DeleteTopics: dead letters {reasons:?}");
    assert_eq!(
        reasons.get(&(deleted.clone(), "target-not-found".into())),
        Some(&10),
        "{reasons:?}"
    );
    // Nothing more arrives, and nothing is left pending.
    assert!(collect(&dlt, 1, Duration::from_secs(3)).await.is_empty());
    assert_eq!(env.broker.store().pending(), 0);
    assert!(
        !topic_exists(kafka, &deleted),
        "firing did not re-create the deleted topic"
    );
    env.broker.shutdown().await;
}
