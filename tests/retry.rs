//! Retry-after for consumers, end to end over TCP: an application consumes its topic, hands
//! records back through the retry topic with the client helper, and kafka-delay counts the
//! attempts, applies the backoff, dead-letters at the limit; `replay` moves them back.

mod common;

use std::time::{Duration, Instant};

use common::*;
use kafka_delay::replay::{self, Filter, Replay};
use kafka_delay_client::{self as client, DelayedRecord};
use rdkafka::producer::FutureProducer;
use rdkafka::Message;

/// Starts a broker whose default retry policy is `policy`; returns it with its retry topic
/// (`delay.<id>.retry`, set up by the common test config).
async fn start(policy: &str) -> (Env, String) {
    let env = Env::start(1, &["--retry-default", policy]).await;
    let topic = env.t.delay_topic("retry");
    (env, topic)
}

/// Sends `rec` with its timestamp set to now; returns that timestamp.
async fn send(producer: &FutureProducer, rec: &DelayedRecord) -> u64 {
    let sent = now_ms();
    producer
        .send(rec.record().timestamp(sent as i64), Duration::from_secs(20))
        .await
        .map_err(|(e, _)| e)
        .expect("retry record acknowledged");
    sent
}

async fn one(c: &rdkafka::consumer::StreamConsumer, what: &str) -> Got {
    let mut got = collect(c, 1, Duration::from_secs(30)).await;
    assert_eq!(got.len(), 1, "{what}: nothing within 30s");
    got.remove(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_retried_n_times_comes_back_n_times_counted_never_early_then_dead_letters() {
    let (env, retry_topic) = start("backoff=fixed,delay=10s,jitter=0,max-attempts=3").await;
    let (kafka, t) = (&env.kafka, &env.t);
    let producer = kafka.producer();
    let app = reader(kafka, &t.target, 1);
    produce(
        &producer,
        &t.delay,
        Some("order-7"),
        Some("payload-7"),
        &[
            ("delay-target", &t.target),
            ("delay-after", "0"),
            ("trace", "abc"),
        ],
    )
    .await;
    let mut got = one(&app, "first delivery").await;
    assert_eq!(client::attempt(&got.msg), 0);

    let mut first_failed = None;
    // Passes 1 and 2 give retry-after as a duration, pass 3 as HTTP integer seconds.
    for (n, after_ms) in [(1u32, 300u64), (2, 600), (3, 1_000)] {
        let rec = DelayedRecord::retry(&got.msg, retry_topic.as_str()).reason("inventory 503");
        let rec = if n == 3 {
            rec.header("retry-after", "1")
        } else {
            rec.retry_after(Duration::from_millis(after_ms))
        };
        let sent = send(&producer, &rec).await;
        let first = *first_failed.get_or_insert(sent);
        got = one(&app, &format!("retry {n}")).await;
        assert_eq!(client::attempt(&got.msg), n, "retry-attempt on pass {n}");
        assert_eq!(client::first_failed_at(&got.msg), Some(first));
        assert_eq!(
            got.num("delay-due-ms"),
            sent + after_ms,
            "due = sent + retry-after"
        );
        assert!(
            got.num("delay-fired-ms") >= got.num("delay-due-ms"),
            "fired early"
        );
        assert!(
            got.received_ms >= sent + after_ms,
            "pass {n} came back {} ms after sending, retry-after was {after_ms} ms",
            got.received_ms - sent
        );
        assert_eq!(got.key().as_deref(), Some("order-7"));
        assert_eq!(got.value().as_deref(), Some("payload-7"));
        assert_eq!(got.header("trace").as_deref(), Some("abc"));
        assert_eq!(got.header("retry-reason").as_deref(), Some("inventory 503"));
        assert_eq!(
            got.header("retry-after"),
            None,
            "retry-after is not carried back"
        );
    }

    // A fourth failure: the attempts are used up.
    let rec = DelayedRecord::retry(&got.msg, retry_topic.as_str())
        .retry_after(Duration::from_millis(300))
        .reason("inventory still 503");
    send(&producer, &rec).await;
    let dlt = format!("{}.dlt", t.target);
    let partitions = wait_for_topic(kafka, &dlt, Duration::from_secs(30)).await;
    let dead = one(&reader(kafka, &dlt, partitions), "dead letter").await;
    assert_eq!(
        dead.header("delay-error").as_deref(),
        Some("retries-exhausted")
    );
    assert_eq!(
        dead.header("delay-target").as_deref(),
        Some(t.target.as_str())
    );
    assert_eq!(dead.num("retry-attempt"), 3);
    assert_eq!(Some(dead.num("retry-first-failed-at")), first_failed);
    assert_eq!(
        dead.header("retry-reason").as_deref(),
        Some("inventory still 503")
    );
    assert_eq!(dead.header("trace").as_deref(), Some("abc"));
    assert!(dead
        .header("delay-error-detail")
        .unwrap()
        .contains("3 retries of 3"));
    assert_eq!(dead.key().as_deref(), Some("order-7"));
    assert_eq!(dead.value().as_deref(), Some("payload-7"));
    assert!(
        collect(&app, 1, Duration::from_secs(2)).await.is_empty(),
        "an exhausted record does not come back to the application"
    );

    let (_, body) = http_get(env.broker.http_addr(), "/metrics").await;
    let label = format!("{{target=\"{}\"}}", t.target);
    assert_eq!(
        metric(&body, &format!("kafka_delay_retry_records_total{label}")),
        Some(3.0)
    );
    assert_eq!(
        metric(&body, &format!("kafka_delay_retry_exhausted_total{label}")),
        Some(1.0)
    );
    env.broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_retry_after_the_exponential_backoff_spaces_the_attempts() {
    let (env, retry_topic) =
        start("backoff=exponential,delay=200ms,factor=2,max-delay=1s,jitter=0,max-attempts=5")
            .await;
    let (kafka, t) = (&env.kafka, &env.t);
    let producer = kafka.producer();
    let app = reader(kafka, &t.target, 1);
    produce(
        &producer,
        &t.delay,
        Some("k"),
        Some("v"),
        &[("delay-target", &t.target), ("delay-after", "0")],
    )
    .await;
    let mut got = one(&app, "first delivery").await;
    let mut observed = Vec::new();
    for (n, want) in [(1u32, 200u64), (2, 400), (3, 800), (4, 1_000), (5, 1_000)] {
        let sent = send(
            &producer,
            &DelayedRecord::retry(&got.msg, retry_topic.as_str()),
        )
        .await;
        got = one(&app, &format!("retry {n}")).await;
        assert_eq!(client::attempt(&got.msg), n);
        assert_eq!(got.num("delay-due-ms") - sent, want, "backoff of retry {n}");
        let spacing = got.received_ms - sent;
        assert!(
            spacing >= want,
            "retry {n} after {spacing} ms, backoff {want} ms"
        );
        assert!(
            spacing < want + 1_000,
            "retry {n} after {spacing} ms, backoff {want} ms: far outside the tolerance"
        );
        observed.push((want, got.num("delay-fired-ms") - sent, spacing));
    }
    println!("(backoff, sent-to-fired, sent-to-received) in ms: {observed:?}");
    env.broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_retry_headers_go_to_the_brokers_dead_letter_topic_with_a_reason() {
    let (env, retry_topic) = start(retry_default()).await;
    let (kafka, t) = (&env.kafka, &env.t);
    let producer = kafka.producer();
    let cases: [(&[(&str, &str)], &str); 5] = [
        (&[("retry-after", "soon")], "invalid-retry-header"),
        (&[("retry-after", "-5")], "invalid-retry-header"),
        (&[("retry-attempt", "two")], "invalid-retry-header"),
        (&[("retry-max-attempts", "1e3")], "invalid-retry-header"),
        (
            &[("retry-after", "5"), ("delay-after", "5s")],
            "conflicting-due-time",
        ),
    ];
    for (i, (headers, _)) in cases.iter().enumerate() {
        let mut all = vec![("delay-target", t.target.as_str())];
        all.extend_from_slice(headers);
        produce(
            &producer,
            &retry_topic,
            Some(&format!("bad{i}")),
            Some("x"),
            &all,
        )
        .await;
    }
    produce(
        &producer,
        &retry_topic,
        Some("good"),
        Some("fine"),
        &[("delay-target", &t.target), ("retry-after", "0")],
    )
    .await;
    let dead = collect(
        &reader(kafka, &t.dlt, 1),
        cases.len(),
        Duration::from_secs(30),
    )
    .await;
    // The retry topic has several partitions: match each dead letter to its record by key.
    let mut reasons: Vec<(String, String)> = dead
        .iter()
        .map(|d| (d.key().unwrap(), d.header("delay-error").unwrap()))
        .collect();
    reasons.sort();
    let want: Vec<(String, String)> = cases
        .iter()
        .enumerate()
        .map(|(i, (_, r))| (format!("bad{i}"), (*r).to_owned()))
        .collect();
    assert_eq!(
        reasons, want,
        "one dead letter per bad record, with its reason"
    );
    for d in &dead {
        assert_eq!(
            d.header("delay-origin-topic").as_deref(),
            Some(retry_topic.as_str())
        );
        assert!(!d.header("delay-error-detail").unwrap().is_empty());
    }
    let good = one(&reader(kafka, &t.target, 1), "the good retry").await;
    assert_eq!(good.value().as_deref(), Some("fine"));
    assert_eq!(client::attempt(&good.msg), 1);
    env.broker.shutdown().await;
}

fn retry_default() -> &'static str {
    "backoff=fixed,delay=100ms,jitter=0,max-attempts=3"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_moves_dead_letters_back_at_the_requested_rate_and_a_dry_run_moves_nothing() {
    let (env, retry_topic) = start(retry_default()).await;
    let (kafka, t) = (&env.kafka, &env.t);
    let producer = kafka.producer();
    let dlt = format!("{}.dlt", t.target);
    kafka.create_topic(&dlt, 1).await;
    for i in 0..12 {
        let reason = if i % 6 == 5 {
            "target-not-found"
        } else {
            "retries-exhausted"
        };
        produce(
            &producer,
            &dlt,
            Some(&format!("k{i}")),
            Some(&format!("r{i}")),
            &[
                ("delay-target", &t.target),
                ("delay-error", reason),
                ("delay-error-detail", "3 retries of 3 used"),
                ("retry-attempt", "3"),
                ("retry-first-failed-at", "1763600000000"),
                ("retry-reason", "503"),
            ],
        )
        .await;
    }
    let opts = |to: &str, rate: Option<f64>, dry_run: bool, filters: Vec<Filter>| Replay {
        brokers: kafka.brokers(),
        from: dlt.clone(),
        to: to.to_owned(),
        rate,
        filters,
        dry_run,
        kafka_config: vec![],
    };
    let exhausted = || vec![Filter::Reason("retries-exhausted".into())];

    let mut reports = 0;
    let dry = replay::run(&opts(&t.target, None, true, exhausted()), |_| reports += 1)
        .await
        .expect("dry run");
    assert_eq!(
        (dry.total, dry.read, dry.moved, dry.skipped, dry.failed),
        (12, 12, 10, 2, 0)
    );
    assert!(reports >= 1, "progress reported");
    assert_eq!(
        topic_size(kafka, &t.target, 1),
        0,
        "a dry run moves nothing"
    );

    let started = Instant::now();
    let done = replay::run(&opts(&t.target, Some(5.0), false, exhausted()), |_| {})
        .await
        .expect("replay");
    let took = started.elapsed();
    assert_eq!((done.moved, done.skipped, done.failed), (10, 2, 0));
    // 10 records at 5/s: the first goes at once, the tenth 9/5 s later.
    assert!(
        took >= Duration::from_millis(1_800),
        "10 records at 5/s took {took:?}"
    );
    let moved = collect(&reader(kafka, &t.target, 1), 10, Duration::from_secs(30)).await;
    assert_eq!(moved.len(), 10);
    let stamps: Vec<i64> = moved
        .iter()
        .map(|g| g.msg.timestamp().to_millis().unwrap())
        .collect();
    // Shown, not asserted: the record timestamps are the producer's (CreateTime) on Kafka but
    // not on every Kafka-protocol broker; the elapsed time above is the rate limit's own measure.
    let span = stamps.iter().max().unwrap() - stamps.iter().min().unwrap();
    for (i, g) in moved.iter().enumerate() {
        let n = [0, 1, 2, 3, 4, 6, 7, 8, 9, 10][i];
        assert_eq!(g.value(), Some(format!("r{n}")), "order kept");
        assert_eq!(g.header("retry-attempt"), None, "attempt count reset");
        assert_eq!(g.header("delay-error"), None);
        assert_eq!(g.header("retry-reason").as_deref(), Some("503"));
        assert_eq!(
            g.header("delay-replayed-from"),
            Some(format!("{dlt}/0/{n}"))
        );
    }
    println!("replay: 10 records at 5/s in {took:?}, produce timestamps span {span} ms");

    // Replayed into the retry topic, a record starts counting again from 1.
    let again = replay::run(
        &opts(&retry_topic, None, false, vec![Filter::Key("k0".into())]),
        |_| {},
    )
    .await
    .expect("replay to the retry topic");
    assert_eq!((again.moved, again.skipped), (1, 11));
    let back = collect(&reader(kafka, &t.target, 1), 11, Duration::from_secs(30)).await;
    let last = back.last().expect("records on the target");
    assert_eq!(last.value().as_deref(), Some("r0"));
    assert_eq!(
        client::attempt(&last.msg),
        1,
        "the count restarts after a replay"
    );
    env.broker.shutdown().await;
}
