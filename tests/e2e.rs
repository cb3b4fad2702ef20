//! End to end over TCP: producer -> delay topic -> kafka-delay (RocksDB in a TempDir) -> target.
//! Runs against the in-process mock cluster, or KAFKA_DELAY_TEST_BROKERS (Apache Kafka under
//! `make test`, or any cluster: the Kafka of compose.yaml).

mod common;

use std::time::Duration;

use common::*;
use kafka_delay::kafka::java_partition;
use kafka_delay::slice;
use rdkafka::Message;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_arrive_no_earlier_than_due_and_shortly_after() {
    let Env {
        kafka,
        t,
        data: _data,
        broker,
    } = Env::start(1, &["--scheduler-slice", "100us"]).await;
    let reader = reader(&kafka, &t.target, 1);

    // With --scheduler-slice 100us the scheduler's thread runs with the shortest time slice,
    // which gets it onto a core soon after its timer fires (what the kernel grants a thread
    // asking for it here, whatever the kernel). Other tests' brokers in this process ask for
    // the default 1 ms.
    let granted = std::thread::spawn(|| slice::request(slice::SHORTEST).unwrap())
        .join()
        .unwrap();
    let slices: Vec<_> = slice::threads_named("scheduler")
        .unwrap()
        .into_iter()
        .filter_map(|tid| slice::of(tid).ok())
        .collect();
    assert!(
        slices.contains(&granted),
        "no scheduler thread with the slice {granted:?}: {slices:?}"
    );

    let producer = kafka.producer();
    let base = now_ms();
    let mut want = Vec::new();
    for i in 0..20u64 {
        let due = base + 1_500 + i * 150;
        let header = due.to_string();
        // Half absolute, half relative.
        if i % 2 == 0 {
            produce(
                &producer,
                &t.delay,
                Some(&format!("k{i}")),
                Some(&format!("v{i}")),
                &[("delay-target", &t.target), ("delay-until", &header)],
            )
            .await;
        } else {
            let after = format!("{}ms", due - now_ms());
            produce(
                &producer,
                &t.delay,
                Some(&format!("k{i}")),
                Some(&format!("v{i}")),
                &[("delay-target", &t.target), ("delay-after", &after)],
            )
            .await;
        }
        want.push(i);
    }
    let got = collect(&reader, 20, Duration::from_secs(30)).await;
    assert_eq!(got.len(), 20, "all delivered");
    for g in &got {
        let due = g.num("delay-due-ms");
        let fired = g.num("delay-fired-ms");
        assert!(fired >= due, "fired {} ms early", due - fired);
        assert!(g.received_ms + 5 >= due, "received before due");
        assert!(fired - due < 2_000, "fired {} ms late", fired - due);
    }
    let mut lateness: Vec<u64> = got
        .iter()
        .map(|g| g.num("delay-fired-ms") - g.num("delay-due-ms"))
        .collect();
    lateness.sort_unstable();
    eprintln!(
        "lateness ms (fired - due) over {} records: min {} p50 {} max {}",
        lateness.len(),
        lateness[0],
        lateness[lateness.len() / 2],
        lateness[lateness.len() - 1]
    );
    // The counter follows each delivery report, which may come after the record is read.
    let fired = format!("kafka_delay_fire_records_total{{target=\"{}\"}}", t.target);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let body = loop {
        let (status, body) = http_get(broker.http_addr(), "/metrics").await;
        assert_eq!(status, 200);
        if metric(&body, &fired).is_some_and(|n| n >= 20.0) || std::time::Instant::now() > deadline
        {
            break body;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(metric(&body, &fired).unwrap() >= 20.0, "{fired}");
    assert_eq!(http_get(broker.http_addr(), "/readyz").await.0, 200);
    assert_eq!(http_get(broker.http_addr(), "/healthz").await.0, 200);
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_value_and_headers_are_preserved_with_provenance_and_java_partitioning() {
    let Env {
        kafka,
        t,
        data: _data,
        broker,
    } = Env::start(4, &[]).await;

    let producer = kafka.producer();
    let keys: Vec<String> = (0..12).map(|i| format!("customer-{i}")).collect();
    for k in &keys {
        produce(
            &producer,
            &t.delay,
            Some(k),
            Some(&format!("payload of {k}")),
            &[
                ("delay-target", &t.target),
                ("delay-after", "200ms"),
                ("trace-id", k),
                ("tenant", "eu"),
            ],
        )
        .await;
    }
    let reader = reader(&kafka, &t.target, 4);
    let got = collect(&reader, keys.len(), Duration::from_secs(30)).await;
    assert_eq!(got.len(), keys.len());
    for g in &got {
        let key = g.key().expect("key kept");
        assert_eq!(g.value().unwrap(), format!("payload of {key}"));
        assert_eq!(g.header("trace-id").as_deref(), Some(key.as_str()));
        assert_eq!(g.header("tenant").as_deref(), Some("eu"));
        assert_eq!(
            g.header("delay-target"),
            None,
            "control headers are not published"
        );
        assert_eq!(g.header("delay-after"), None);
        assert_eq!(
            g.header("delay-origin-topic").as_deref(),
            Some(t.delay.as_str())
        );
        assert_eq!(g.header("delay-origin-partition").as_deref(), Some("0"));
        assert!(g.header("delay-origin-offset").is_some());
        assert_eq!(
            g.msg.partition(),
            java_partition(key.as_bytes(), 4),
            "murmur2 placement of {key}"
        );
    }
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reschedule_and_cancel_by_id_including_the_etf1_headers() {
    let Env {
        kafka,
        t,
        data: _data,
        broker,
    } = Env::start(1, &[]).await;

    let p = kafka.producer();
    let tgt = t.target.as_str();
    let base = now_ms();
    let at = |ms: u64| (base + ms).to_string();
    // job-1: scheduled, then moved later: only the second version arrives, at its new time.
    produce(
        &p,
        &t.delay,
        Some("job-1"),
        Some("job-1 v1"),
        &[
            ("delay-target", tgt),
            ("delay-until", &at(2_000)),
            ("delay-id", "job-1"),
        ],
    )
    .await;
    produce(
        &p,
        &t.delay,
        Some("job-1"),
        Some("job-1 v2"),
        &[
            ("delay-target", tgt),
            ("delay-until", &at(3_500)),
            ("delay-id", "job-1"),
        ],
    )
    .await;
    // job-2: scheduled, then cancelled with a null value.
    produce(
        &p,
        &t.delay,
        Some("job-2"),
        Some("job-2 v1"),
        &[
            ("delay-target", tgt),
            ("delay-until", &at(2_000)),
            ("delay-id", "job-2"),
        ],
    )
    .await;
    produce(&p, &t.delay, Some("job-2"), None, &[("delay-id", "job-2")]).await;
    // etf1 kafka-message-scheduler: key = id, scheduler-epoch in seconds, null value cancels.
    let epoch = ((base + 3_000) / 1_000 + 1).to_string();
    produce(
        &p,
        &t.delay,
        Some("etf-1"),
        Some("etf-1 kept"),
        &[
            ("scheduler-epoch", &epoch),
            ("scheduler-target-topic", tgt),
            ("scheduler-target-key", "etf-key"),
        ],
    )
    .await;
    produce(
        &p,
        &t.delay,
        Some("etf-2"),
        Some("etf-2 cancelled"),
        &[("scheduler-epoch", &epoch), ("scheduler-target-topic", tgt)],
    )
    .await;
    produce(&p, &t.delay, Some("etf-2"), None, &[]).await;

    let reader = reader(&kafka, &t.target, 1);
    let got = collect(&reader, 3, Duration::from_secs(20)).await;
    // Wait past every due time to be sure nothing else arrives.
    let extra = collect(&reader, 1, Duration::from_secs(3)).await;
    assert!(
        extra.is_empty(),
        "unexpected: {:?}",
        extra.iter().map(Got::value).collect::<Vec<_>>()
    );
    let got = by_value(&got);
    let mut values: Vec<&String> = got.keys().collect();
    values.sort();
    assert_eq!(
        values,
        ["etf-1 kept", "job-1 v2"]
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .iter()
            .collect::<Vec<_>>()
    );
    assert!(got["job-1 v2"].num("delay-fired-ms") >= base + 3_500);
    assert_eq!(got["etf-1 kept"].key().as_deref(), Some("etf-key"));
    assert!(got["etf-1 kept"].num("delay-fired-ms") >= (base + 3_000) / 1_000 * 1_000 + 1_000);
    let (_, body) = http_get(broker.http_addr(), "/metrics").await;
    assert_eq!(
        metric(&body, "kafka_delay_ingest_replaced_total"),
        Some(1.0)
    );
    assert_eq!(
        metric(&body, "kafka_delay_ingest_cancelled_total"),
        Some(2.0)
    );
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_input_class_lands_in_the_dead_letter_topic_and_nothing_stalls() {
    let Env {
        kafka,
        t,
        data: _data,
        broker,
    } = Env::start(
        1,
        &[
            "--target-allow",
            "^(out|probe)-",
            "--max-record-bytes",
            "2000",
        ],
    )
    .await;

    let p = kafka.producer();
    let tgt = t.target.as_str();
    let loop_target = t.delay_topic("5s");
    let big = "x".repeat(3_000);
    type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, Option<&'a str>);
    let cases: Vec<Case<'_>> = vec![
        (
            "missing-target",
            vec![("delay-after", "1s"), ("trace-id", "t-1")],
            Some("a"),
        ),
        (
            "invalid-target",
            vec![("delay-target", "bad/topic"), ("delay-after", "1s")],
            Some("b"),
        ),
        (
            "target-internal",
            vec![
                ("delay-target", "__consumer_offsets"),
                ("delay-after", "1s"),
            ],
            Some("c"),
        ),
        (
            "target-loop",
            vec![("delay-target", &loop_target), ("delay-after", "1s")],
            Some("d"),
        ),
        (
            "target-not-allowed",
            vec![("delay-target", "payments"), ("delay-after", "1s")],
            Some("e"),
        ),
        ("missing-due-time", vec![("delay-target", tgt)], Some("f")),
        (
            "invalid-due-time",
            vec![("delay-target", tgt), ("delay-until", "1700000000")],
            Some("g"),
        ),
        (
            "invalid-due-time",
            vec![("delay-target", tgt), ("delay-after", "-5s")],
            Some("h"),
        ),
        (
            "conflicting-due-time",
            vec![
                ("delay-target", tgt),
                ("delay-after", "1s"),
                ("delay-until", "1999999999999"),
            ],
            Some("i"),
        ),
        (
            "due-too-far",
            vec![("delay-target", tgt), ("delay-after", "400d")],
            Some("j"),
        ),
        (
            "conflicting-headers",
            vec![
                ("delay-target", tgt),
                ("delay-target", "other"),
                ("delay-after", "1s"),
            ],
            Some("k"),
        ),
        (
            "oversized",
            vec![("delay-target", tgt), ("delay-after", "1s")],
            Some(big.as_str()),
        ),
        (
            "missing-id",
            vec![
                ("scheduler-epoch", "1999999999"),
                ("scheduler-target-topic", tgt),
            ],
            Some("m"),
        ),
    ];
    for (i, (_, headers, value)) in cases.iter().enumerate() {
        let key = if i == cases.len() - 1 {
            None
        } else {
            Some(format!("key-{i}"))
        };
        produce(&p, &t.delay, key.as_deref(), *value, headers).await;
    }
    // Non-UTF-8 header value.
    {
        use rdkafka::message::{Header, OwnedHeaders};
        use rdkafka::producer::FutureRecord;
        let hs = OwnedHeaders::new()
            .insert(Header {
                key: "delay-target",
                value: Some(&[0xffu8, 0xfe][..]),
            })
            .insert(Header {
                key: "delay-after",
                value: Some("1s"),
            });
        p.send(
            FutureRecord::<str, str>::to(&t.delay)
                .payload("n")
                .headers(hs),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e)
        .unwrap();
    }
    // A good record after all the bad ones still goes through: nothing stalled.
    produce(
        &p,
        &t.delay,
        Some("good"),
        Some("good"),
        &[("delay-target", tgt), ("delay-after", "100ms")],
    )
    .await;

    let dlt = reader(&kafka, &t.dlt, 1);
    let dead = collect(&dlt, cases.len() + 1, Duration::from_secs(30)).await;
    assert_eq!(
        dead.len(),
        cases.len() + 1,
        "one dead letter per bad record"
    );
    // A dead letter keeps the record's own headers, control ones included, so that it can be
    // mended and replayed.
    assert_eq!(dead[0].header("trace-id").as_deref(), Some("t-1"));
    assert_eq!(dead[0].header("delay-after").as_deref(), Some("1s"));
    for (i, (reason, _, value)) in cases.iter().enumerate() {
        let d = &dead[i];
        assert_eq!(
            d.header("delay-error").as_deref(),
            Some(*reason),
            "case {i}: {:?}",
            d.headers()
        );
        assert!(!d
            .header("delay-error-detail")
            .unwrap_or_default()
            .is_empty());
        assert_eq!(d.value().as_deref(), *value, "original value kept");
        assert_eq!(
            d.header("delay-origin-topic").as_deref(),
            Some(t.delay.as_str())
        );
        assert_eq!(
            d.num("delay-origin-offset"),
            (i + 1) as u64,
            "offset order (after the probe)"
        );
    }
    assert_eq!(
        dead[cases.len()].header("delay-error").as_deref(),
        Some("invalid-header")
    );
    let out = reader(&kafka, &t.target, 1);
    let good = collect(&out, 1, Duration::from_secs(20)).await;
    assert_eq!(good.len(), 1);
    assert_eq!(good[0].value().as_deref(), Some("good"));
    let (_, body) = http_get(broker.http_addr(), "/metrics").await;
    assert_eq!(
        metric(
            &body,
            "kafka_delay_ingest_rejected_total{reason=\"invalid-due-time\"}"
        ),
        Some(2.0)
    );
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_loses_nothing_and_fires_what_became_overdue_at_once() {
    let Env {
        kafka,
        t,
        data,
        broker,
    } = Env::start(1, &[]).await;

    let p = kafka.producer();
    let base = now_ms();
    // 30 records: 20 due while the broker is down, 10 due after it is back.
    let dues = (0..30u64).map(|i| {
        (
            i,
            if i < 20 {
                base + 3_000 + i * 10
            } else {
                base + 12_000 + i * 10
            },
        )
    });
    produce_numbered(&p, &t.delay, &t.target, dues).await;
    // Wait until all 30 are stored, then stop.
    wait_pending(broker.http_addr(), 30, Duration::from_secs(20)).await;
    broker.shutdown().await;
    tokio::time::sleep(Duration::from_millis(
        (base + 4_000).saturating_sub(now_ms()),
    ))
    .await;

    let restarted_at = now_ms();
    let broker = start(config(&kafka, &t, &data, &[])).await;
    let (_, body) = http_get(broker.http_addr(), "/metrics").await;
    assert_eq!(metric(&body, "kafka_delay_recovery_records"), Some(30.0));
    let reader = reader(&kafka, &t.target, 1);
    let got = collect(&reader, 30, Duration::from_secs(30)).await;
    let got = by_value(&got);
    assert_eq!(got.len(), 30, "nothing lost");
    for i in 0..20 {
        let g = &got[&format!("r{i}")];
        assert!(
            g.num("delay-fired-ms") < restarted_at + 5_000,
            "overdue r{i} fired at once after restart"
        );
    }
    for i in 20..30 {
        let g = &got[&format!("r{i}")];
        assert!(
            g.num("delay-fired-ms") >= g.num("delay-due-ms"),
            "r{i} not early"
        );
    }
    let extra = collect(&reader, 1, Duration::from_secs(2)).await;
    assert!(extra.is_empty(), "nothing ingested twice");
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_delay_topics_and_new_topics_are_picked_up_while_running() {
    let Env {
        kafka,
        t,
        data: _data,
        broker,
    } = Env::start(1, &[]).await;
    // A topic created after the broker subscribed.
    let fixed = t.delay_topic("2s");
    kafka.create_topic(&fixed, 1).await;
    let p = kafka.producer();
    let sent = now_ms();
    produce(
        &p,
        &fixed,
        None,
        Some("fixed"),
        &[("delay-target", &t.target)],
    )
    .await;
    let reader = reader(&kafka, &t.target, 1);
    let got = collect(&reader, 1, Duration::from_secs(30)).await;
    assert_eq!(
        got.len(),
        1,
        "a new delay topic is consumed without a restart"
    );
    assert!(got[0].num("delay-due-ms") >= sent + 2_000 - 50);
    assert!(got[0].num("delay-fired-ms") >= got[0].num("delay-due-ms"));
    broker.shutdown().await;
}

/// A delay topic created while the broker is down is consumed once it is back. (With static
/// membership the group hands a returning member its old assignment without a rebalance, so
/// a topic its subscription matches now but did not before has no owner until one happens.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delay_topic_created_while_the_broker_is_down_is_consumed_after_its_restart() {
    topic_created_while_down(&[]).await;
}

/// The same with the changelog, whose partitions move through the handoff (cooperative
/// rebalancing): the second subscription revokes and restores them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_a_delay_topic_created_while_a_changelog_broker_is_down_is_consumed_after_its_restart(
) {
    topic_created_while_down(&["--changelog", "--changelog-replication", "1"]).await;
}

async fn topic_created_while_down(flags: &[&str]) {
    let Env {
        kafka,
        t,
        data,
        broker,
    } = Env::start(1, flags).await;
    broker.shutdown().await;
    let later = t.delay_topic("later");
    kafka.create_topic(&later, 3).await;
    let p = kafka.producer();
    const N: usize = 30;
    for i in 0..N {
        let (key, value) = (format!("k{i}"), format!("later-{i}"));
        produce(
            &p,
            &later,
            Some(&key),
            Some(&value),
            &[("delay-target", &t.target), ("delay-after", "1s")],
        )
        .await;
    }
    let reader = reader(&kafka, &t.target, 1);
    let broker = start(config(&kafka, &t, &data, flags)).await;
    let got = collect(&reader, N, Duration::from_secs(45)).await;
    let values: std::collections::HashSet<String> = got.iter().filter_map(Got::value).collect();
    assert_eq!(
        values.len(),
        N,
        "the topic created while the broker was down: {} of {N} fired",
        values.len()
    );
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_target_is_dead_lettered_after_bounded_retries_and_others_keep_firing() {
    let Env {
        kafka,
        t,
        data: _data,
        broker,
    } = Env::start(1, &[]).await;
    let p = kafka.producer();
    let missing = format!("missing-{}", t.id);
    produce(
        &p,
        &t.delay,
        Some("lost"),
        Some("to nowhere"),
        &[("delay-target", &missing), ("delay-after", "0")],
    )
    .await;
    for i in 0..5 {
        produce(
            &p,
            &t.delay,
            None,
            Some(&format!("ok{i}")),
            &[("delay-target", &t.target), ("delay-after", "500ms")],
        )
        .await;
    }
    let out = reader(&kafka, &t.target, 1);
    assert_eq!(
        collect(&out, 5, Duration::from_secs(20)).await.len(),
        5,
        "other targets keep firing"
    );
    let dlt = reader(&kafka, &t.dlt, 1);
    let dead = collect(&dlt, 1, Duration::from_secs(40)).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(
        dead[0].header("delay-error").as_deref(),
        Some("target-not-found")
    );
    assert_eq!(
        dead[0].header("delay-target").as_deref(),
        Some(missing.as_str())
    );
    assert_eq!(dead[0].value().as_deref(), Some("to nowhere"));
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_keeps_a_sources_records_to_its_own_targets_and_dead_letters_the_rest() {
    let t = Topics::new();
    let exact = |topic: &str| format!("^{}$", topic.replace('.', r"\."));
    // The target, and the probe topic the start waits on.
    let ours = format!("^({}|probe-{})$", t.target.replace('.', r"\."), t.id);
    let route = format!("{}={ours}", exact(&t.delay));
    let Env {
        kafka,
        t,
        data: _data,
        broker,
    } = Env::start_with(t, 1, &["--route", &route]).await;
    // Another tenant's topic: it exists, and kafka-delay could write it.
    let theirs = format!("tenant-b-{}", t.id);
    kafka.create_topic(&theirs, 1).await;
    let p = kafka.producer();
    let headers = |target: &str| {
        [
            ("delay-target", target.to_owned()),
            ("delay-after", "0".to_owned()),
        ]
    };
    for (key, target) in [("theirs", theirs.as_str()), ("ours", t.target.as_str())] {
        let h = headers(target);
        let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
        produce(&p, &t.delay, Some(key), Some(key), &h).await;
    }
    let out = reader(&kafka, &t.target, 1);
    let got = collect(&out, 1, Duration::from_secs(20)).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].key().as_deref(), Some("ours"));
    let dead = collect(&reader(&kafka, &t.dlt, 1), 1, Duration::from_secs(20)).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].key().as_deref(), Some("theirs"));
    assert_eq!(
        dead[0].header("delay-error").as_deref(),
        Some("target-not-allowed")
    );
    let detail = dead[0].header("delay-error-detail").unwrap_or_default();
    assert!(detail.contains(&format!("route '{route}'")), "{detail}");
    let other = collect(&reader(&kafka, &theirs, 1), 1, Duration::from_secs(3)).await;
    assert!(other.is_empty(), "nothing reached the other tenant's topic");
    broker.shutdown().await;
}
