//! The binary as users run it: the broker process is killed with SIGKILL and restarted against
//! a Kafka in another process (Apache Kafka under `make test`, else `kafka-delay sandbox`); `run --embedded-kafka` is driven with
//! kcat; bad flags fail at start with a message.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::procs::*;
use common::*;
use tempfile::TempDir;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_and_restart_loses_nothing_and_fires_again_within_seconds() {
    let (sandbox, brokers) = process_kafka();
    // Apache Kafka honours static membership: a restarted broker with the same --instance-id
    // gets its partitions back at once. The mock cluster of `sandbox` ignores it, so there the
    // group waits for the killed member's session to time out before anything new is consumed.
    let static_membership_honoured = sandbox.is_none();
    let kafka = Kafka::External(brokers.clone());
    let t = Topics::new();
    kafka.create_topic(&t.delay, 1).await;
    let target_parts = kafka.create_topic(&t.target, 1).await;
    kafka.create_topic(&t.dlt, 1).await;
    let data = TempDir::new().unwrap();
    let port = free_port();
    let mut broker = spawn_broker(&brokers, &t, &data, port);
    wait_ready(port, Duration::from_secs(60)).await;

    let p = kafka.producer();
    let base = now_ms() + 2_000;
    const N: u64 = 300;
    // One every 20 ms for 6 s.
    produce_numbered(&p, &t.delay, &t.target, (0..N).map(|i| (i, base + i * 20))).await;
    let reader = reader(&kafka, &t.target, target_parts);
    // Kill the broker while it is firing, three times, restarting at once each time. Right
    // after each kill a record due at once is produced: its arrival shows that consumption
    // resumed (the stored records show that firing did).
    let mut got = Vec::new();
    let (mut to_fired, mut to_consumed, mut after_ready) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..3 {
        got.extend(collect(&reader, 40, Duration::from_secs(20)).await);
        broker.0.kill().expect("SIGKILL");
        broker.0.wait().unwrap();
        let killed_at = Instant::now();
        let probe = format!("resumed-{round}");
        if static_membership_honoured {
            produce(
                &p,
                &t.delay,
                None,
                Some(&probe),
                &[("delay-target", &t.target), ("delay-after", "0")],
            )
            .await;
        }
        broker = spawn_broker(&brokers, &t, &data, port);
        let ready = wait_ready(port, Duration::from_secs(30)).await;
        assert!(
            ready < Duration::from_secs(10),
            "round {round}: ready after {ready:?}"
        );
        let ready_at = Instant::now();
        // Read until a record fired by the new process (fired after the kill) has arrived and,
        // on Apache Kafka, the record produced after the kill.
        let killed_ms = now_ms() - killed_at.elapsed().as_millis() as u64;
        let (mut fired_at, mut consumed_at) = (None, None);
        let deadline = Instant::now() + Duration::from_secs(90);
        while fired_at.is_none() || (static_membership_honoured && consumed_at.is_none()) {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some(g) = collect(&reader, 1, left).await.into_iter().next() else {
                break;
            };
            if fired_at.is_none() && g.num("delay-fired-ms") >= killed_ms {
                fired_at = Some(Instant::now());
            }
            if g.value().as_deref() == Some(probe.as_str()) {
                consumed_at = Some(Instant::now());
            }
            got.push(g);
        }
        let fired_at =
            fired_at.unwrap_or_else(|| panic!("round {round}: nothing fired after the restart"));
        to_fired.push(fired_at - killed_at);
        if static_membership_honoured {
            let consumed_at = consumed_at.unwrap_or_else(|| {
                panic!("round {round}: the record produced after the kill did not arrive in 90 s")
            });
            to_consumed.push(consumed_at - killed_at);
            after_ready.push(consumed_at.saturating_duration_since(ready_at));
        }
    }
    eprintln!(
        "kill -9 x3: from the kill to the first record fired {to_fired:.2?}; to a record \
         produced after the kill delivered (consumption resumed; external Kafka only) \
         {to_consumed:.2?}, of which after the restarted broker was ready {after_ready:.2?}"
    );
    assert!(
        to_fired.iter().all(|d| *d < Duration::from_secs(15)),
        "firing resumed within seconds: {to_fired:?}"
    );
    if static_membership_honoured {
        // The restarted instance takes over its static member's partitions at once. Without
        // static membership (KAFKA_DELAY_TEST_FLAGS=--no-static-membership) the group first
        // has to drop the killed member, at least its session (kafka-delay's 6 s), and this
        // fails.
        assert!(
            after_ready.iter().all(|d| *d < Duration::from_secs(3)),
            "consuming again within half the session timeout of ready: {after_ready:?}"
        );
    }
    got.extend(collect(&reader, N as usize * 2, Duration::from_secs(30)).await);
    got.retain(|g| !g.value().is_some_and(|v| v.starts_with("resumed-")));
    let mut seen = std::collections::HashMap::<String, usize>::new();
    for g in &got {
        let value = g.value().unwrap();
        *seen.entry(value.clone()).or_default() += 1;
        // Never early: received no sooner than the due time this test planned for it.
        let i: u64 = value
            .strip_prefix('r')
            .and_then(|i| i.parse().ok())
            .unwrap();
        assert!(g.received_ms >= base + i * 20, "{value} early");
    }
    let missing: Vec<u64> = (0..N)
        .filter(|i| !seen.contains_key(&format!("r{i}")))
        .collect();
    assert!(missing.is_empty(), "lost after kill -9: {missing:?}");
    let duplicates: usize = seen.values().map(|c| c - 1).sum();
    eprintln!("kill -9 x3: {N} records, 0 lost, {duplicates} duplicates (in-flight window 64)");
    assert!(
        duplicates <= 3 * 64,
        "duplicates bounded by the in-flight window per crash"
    );
    // A records produced while the broker was down for good measure is consumed too.
    produce(
        &p,
        &t.delay,
        None,
        Some("after"),
        &[("delay-target", &t.target), ("delay-after", "0")],
    )
    .await;
    let after = collect(&reader, 1, Duration::from_secs(20)).await;
    assert_eq!(after.last().and_then(Got::value).as_deref(), Some("after"));

    // SIGTERM: a clean stop that exits 0.
    let pid = broker.0.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = broker.0.try_wait().unwrap() {
            assert!(status.success(), "clean exit on SIGTERM: {status}");
            break;
        }
        assert!(Instant::now() < deadline, "no exit within 30s of SIGTERM");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn embedded_kafka_mode_delivers_records_produced_with_kcat() {
    let data = TempDir::new().unwrap();
    let http = format!("127.0.0.1:{}", free_port());
    let (_broker, brokers) = spawn_announcing(&[
        "run",
        "--embedded-kafka",
        "--data-dir",
        data.path().to_str().unwrap(),
        "--http-addr",
        &http,
    ]);
    let kcat = |args: &[&str], input: &str| {
        use std::io::Write;
        // Bounded: kcat never runs for more than 30 s.
        let mut c = Command::new("timeout")
            .args(["30", "kcat", "-b", &brokers])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kcat is installed by `make deps`");
        c.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        let out = c.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "kcat {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // The target must exist (kafka-delay never creates topics); kcat's metadata request creates it.
    kcat(&["-L", "-t", "orders"], "");
    kcat(
        &[
            "-P",
            "-t",
            "delay.demo",
            "-K",
            ":",
            "-H",
            "delay-target=orders",
            "-H",
            "delay-after=1s",
            "-H",
            "app=demo",
        ],
        "order-1:hello from kcat\n",
    );
    let started = Instant::now();
    let out = kcat(
        &[
            "-C",
            "-t",
            "orders",
            "-o",
            "beginning",
            "-c",
            "1",
            "-f",
            "%k|%s|%h\\n",
        ],
        "",
    );
    assert!(started.elapsed() < Duration::from_secs(30));
    assert!(out.starts_with("order-1|hello from kcat|"), "{out}");
    assert!(
        out.contains("app=demo") && out.contains("delay-origin-topic=delay.demo"),
        "{out}"
    );
}

#[test]
fn bad_flags_fail_at_start_with_a_message_saying_what_to_fix() {
    let cases: [(&[&str], &str); 7] = [
        (&["run"], "--brokers"),
        (
            &["run", "--brokers", "127.0.0.1:1", "--max-delay", "ten days"],
            "--max-delay",
        ),
        (
            &[
                "run",
                "--brokers",
                "127.0.0.1:1",
                "--kafka-config",
                "bootstrap.servers=x",
            ],
            "--brokers",
        ),
        (
            &[
                "run",
                "--brokers",
                "127.0.0.1:1",
                "--dead-letter-topic",
                "delay.dead",
            ],
            "loop",
        ),
        (
            &[
                "run",
                "--brokers",
                "127.0.0.1:1",
                "--fire-rate",
                "^orders$=fast",
            ],
            "rate 'fast': give records per time unit, e.g. 500/s",
        ),
        (
            &[
                "run",
                "--brokers",
                "127.0.0.1:1",
                "--fire-rate",
                "^orders$=500/s,burst=0",
            ],
            "burst '0': a whole number from 1",
        ),
        (
            &[
                "run",
                "--brokers",
                "127.0.0.1:1",
                "--fire-rate-global",
                "0/s",
            ],
            "--fire-rate-global",
        ),
    ];
    for (args, want) in cases {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
    }
    let out = Command::new(BIN)
        .args(["run", "--brokers", "127.0.0.1:1"])
        .env("KAFKA_DELAY_SOURCE_PATTERN", "([")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--source-pattern"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_command_shows_progress_and_a_summary_and_a_dry_run_moves_nothing() {
    let (_kafka_proc, brokers) = process_kafka();
    let kafka = Kafka::External(brokers.clone());
    let id = unique("r").replace('-', "_");
    let (dlt, to) = (format!("out-{id}.dlt"), format!("out-{id}"));
    let dlt_parts = kafka.create_topic(&dlt, 1).await;
    let to_parts = kafka.create_topic(&to, 1).await;
    let producer = kafka.producer();
    for i in 0..3 {
        let reason = if i == 2 {
            "target-not-found"
        } else {
            "retries-exhausted"
        };
        let key = format!("k{i}");
        produce(
            &producer,
            &dlt,
            Some(&key),
            Some("v"),
            &[("delay-error", reason), ("retry-attempt", "5")],
        )
        .await;
    }
    let replay = |extra: &[&str]| {
        let out = Command::new("timeout")
            .args(["60", BIN, "replay", "--brokers", &brokers, "--from", &dlt])
            .args(extra)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, out, err) = replay(&[
        "--to",
        &to,
        "--dry-run",
        "--filter",
        "reason=retries-exhausted",
    ]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains("dry run: would move 2, skipped 1, failed 0 (read 3 of 3"),
        "{out}"
    );
    assert!(
        err.contains(&format!("replay {dlt} -> {to}: read 3/3")),
        "{err}"
    );
    assert_eq!(
        topic_size(&kafka, &to, to_parts),
        0,
        "a dry run moves nothing"
    );

    let (code, out, err) = replay(&["--to", &to, "--rate", "100/s"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("moved 3, skipped 0, failed 0"), "{out}");
    assert_eq!(topic_size(&kafka, &to, to_parts), 3);
    assert_eq!(
        topic_size(&kafka, &dlt, dlt_parts),
        3,
        "the dead letters stay"
    );

    let (code, _, err) = replay(&["--to", "no-such-topic-anywhere"]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("'no-such-topic-anywhere' (--to) does not exist"),
        "{err}"
    );
    let (code, _, err) = replay(&["--to", &to, "--rate", "fast"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("--rate 'fast'"), "{err}");
}
