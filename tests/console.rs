//! The web console in a browser: `tests/console/console.mjs` (playwright-core driving Debian's
//! Chromium) clicks through it against a broker on Apache Kafka, and this test checks on Kafka
//! what the clicks did. Named `apache_kafka_*`: they need Apache Kafka (`make test` runs them
//! there, in its `broker` lane).

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::browser::{browse, screenshots};
use common::*;
use serde_json::json;

/// The id of the one pending record with `delay_id`, once it is pending.
async fn pending_id(addr: std::net::SocketAddr, delay_id: &str, token: Option<&str>) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = http_json(
            addr,
            "GET",
            &format!("/api/v1/pending?delay_id={delay_id}"),
            None,
            token,
        )
        .await;
        assert_eq!(status, 200, "{body}");
        if let Some(id) = body["records"][0]["id"].as_str() {
            return id.to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "{delay_id} not pending within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_console_searches_acts_replays_and_shows_markup_as_text() {
    let env = Env::start(1, &[]).await;
    let (kafka, t, addr) = (&env.kafka, &env.t, env.broker.http_addr());
    let bulk_target = format!("{}-bulk", t.target);
    kafka.create_topic(&bulk_target, 1).await;
    let producer = kafka.producer();
    let reader = reader(kafka, &t.target, 1);
    let hour = "1h";
    let schedule =
        |delay_id: &'static str, key: &'static str, value: &'static str, after: &'static str| {
            let (producer, topic, target) = (&producer, t.delay.clone(), t.target.clone());
            async move {
                produce(
                    producer,
                    &topic,
                    Some(key),
                    Some(value),
                    &[
                        ("delay-target", &target),
                        ("delay-after", after),
                        ("delay-id", delay_id),
                        ("x-html", "<b>bold</b>"),
                    ],
                )
                .await
            }
        };
    schedule("find-me", "k-find", r#"{"order": 42}"#, hour).await;
    let cancel_due = now_ms() + 40_000;
    schedule("cancel-me", "k-cancel", "cancelled", "40s").await;
    schedule("fire-me", "k-fire", "fired from the page", hour).await;
    schedule(
        "script",
        "<img src=x onerror=alert(2)>",
        "<script>alert(1)</script>",
        hour,
    )
    .await;
    for i in 0..3 {
        let key = format!("b{i}");
        produce(
            &producer,
            &t.delay,
            Some(&key),
            Some("bulk"),
            &[("delay-target", &bulk_target), ("delay-after", hour)],
        )
        .await;
    }
    // A record without a target: dead-lettered as missing-target.
    produce(
        &producer,
        &t.delay,
        Some("k-dead"),
        Some("dead"),
        &[("delay-after", "1s")],
    )
    .await;
    let ids = json!({
        "target": t.target,
        "bulk_target": bulk_target,
        "dead_topic": t.dlt,
        "find": pending_id(addr, "find-me", None).await,
        "find_delay_id": "find-me",
        "find_key": "k-find",
        "cancel": pending_id(addr, "cancel-me", None).await,
        "fire": pending_id(addr, "fire-me", None).await,
        "fire_delay_id": "fire-me",
        "script": pending_id(addr, "script", None).await,
    });
    // The dead letter is there before the page looks for it.
    let deadline = Instant::now() + Duration::from_secs(20);
    while topic_size(kafka, &t.dlt, 1) < 1 {
        assert!(Instant::now() < deadline, "no dead letter within 20 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (shots, _tmp) = screenshots();
    let url = format!("http://{addr}");
    let r = browse("open", &url, &ids, None, &shots);
    assert_eq!(r["dialogs"], json!([]), "markup in a record ran");

    // On Kafka: the fired record arrives at once, the replayed dead letter arrives, the
    // cancelled one never (it was due 25 s after it was produced).
    let fired_at = r["fired_at"].as_u64().unwrap();
    let got = collect(&reader, 2, Duration::from_secs(30)).await;
    let by = by_value(&got);
    let fired = by["fired from the page"].num("delay-fired-ms");
    println!(
        "fired from the page: {} ms after the click",
        fired as i64 - fired_at as i64
    );
    assert!(fired < fired_at + 2_000, "fire now took more than 2 s");
    let replayed = &by["dead"];
    assert!(replayed
        .header("delay-replayed-from")
        .unwrap()
        .starts_with(&t.dlt));
    // Past the cancelled record's due time, nothing more arrives.
    let wait = (cancel_due + 3_000).saturating_sub(now_ms()).max(3_000);
    let more = collect(&reader, 1, Duration::from_millis(wait)).await;
    assert!(
        more.is_empty(),
        "a record arrived that was cancelled or that only another origin fired: {:?}",
        more[0].value()
    );
    let (_, left) = http_json(
        addr,
        "GET",
        "/api/v1/pending?delay_id=cancel-me",
        None,
        None,
    )
    .await;
    assert_eq!(left["records"], json!([]));

    // The bulk reschedule moved the bulk target's records by two hours.
    let (_, bulk) = http_json(
        addr,
        "GET",
        &format!("/api/v1/pending?target={bulk_target}"),
        None,
        None,
    )
    .await;
    let dues: Vec<u64> = bulk["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["due_ms"].as_u64().unwrap())
        .collect();
    assert_eq!(dues.len(), 3);
    assert!(dues.iter().all(|&d| d > now_ms() + 6_000_000), "{dues:?}");

    // The other origin's page changed nothing: the record it tried to fire or cancel is
    // pending, due in about an hour, and nothing was bulk-cancelled.
    println!("cross-origin attempts: {}", r["cross_origin"]);
    let (status, find) = http_json(
        addr,
        "GET",
        &format!("/api/v1/pending/{}", ids["find"].as_str().unwrap()),
        None,
        None,
    )
    .await;
    assert_eq!(
        status, 200,
        "the record a page of another origin tried to cancel is gone"
    );
    assert!(find["due_ms"].as_u64().unwrap() > now_ms() + 3_000_000);
    let (_, scrape) = http_get(addr, "/metrics").await;
    let denied = metric(
        &scrape,
        "kafka_delay_admin_requests_total{action=\"fire\",outcome=\"denied\"}",
    );
    assert_eq!(
        denied,
        Some(1.0),
        "the cross-origin fire was refused and counted"
    );
    env.broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_console_without_the_token_can_read_and_change_nothing() {
    let token = "console-test-token-0123456789";
    let env = Env::start(1, &["--admin-token", token]).await;
    let (kafka, t, addr) = (&env.kafka, &env.t, env.broker.http_addr());
    produce(
        &kafka.producer(),
        &t.delay,
        Some("k"),
        Some("v"),
        &[
            ("delay-target", &t.target),
            ("delay-after", "1h"),
            ("delay-id", "guarded"),
        ],
    )
    .await;
    let ids = json!({
        "target": t.target,
        "find": pending_id(addr, "guarded", Some(token)).await,
    });
    let (shots, _tmp) = screenshots();
    browse(
        "token",
        &format!("http://{addr}"),
        &ids,
        Some(token),
        &shots,
    );
    let (status, body) = http_json(
        addr,
        "GET",
        &format!("/api/v1/pending/{}", ids["find"].as_str().unwrap()),
        None,
        Some(token),
    )
    .await;
    assert_eq!(status, 200, "still pending: {body}");
    assert!(body["due_ms"].as_u64().unwrap() > now_ms() + 3_000_000);
    env.broker.shutdown().await;
}

#[test]
fn the_readme_shows_every_screenshot_the_browser_test_takes() {
    let readme = std::fs::read_to_string(
        Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join("README.md"),
    )
    .unwrap();
    let script = std::fs::read_to_string(
        Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join("tests/console/console.mjs"),
    )
    .unwrap();
    let names: Vec<&str> = script
        .match_indices("shot(page, \"")
        .map(|(i, m)| {
            let rest = &script[i + m.len()..];
            &rest[..rest.find('"').unwrap()]
        })
        .collect();
    assert!(names.len() >= 6, "{names:?}");
    for name in names {
        let path = format!("docs/console/{name}.png");
        assert!(readme.contains(&path), "README does not show {path}");
        assert!(
            Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
                .join(&path)
                .exists(),
            "{path} is missing: run the console tests with KAFKA_DELAY_UPDATE_SCREENSHOTS=1"
        );
    }
}
