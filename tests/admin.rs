//! The admin HTTP API over TCP against a running broker: list, search, show, cancel,
//! reschedule (earlier and later), fire now, bulk actions, and the bearer token.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

fn ids_by_value(page: &Value) -> Vec<String> {
    page["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_list_show_cancel_move_and_fire_pending_records() {
    let env = Env::start(1, &[]).await;
    let (kafka, t, addr) = (&env.kafka, &env.t, env.broker.http_addr());
    let other = format!("{}-b", t.target);
    kafka.create_topic(&other, 1).await;
    let producer = kafka.producer();
    let base = now_ms() + 8_000;
    for i in 0..6u64 {
        let due = (base + i).to_string();
        let id = format!("d{i}");
        produce(
            &producer,
            &t.delay,
            Some(&id),
            Some(&format!("v{i}")),
            &[
                ("delay-target", &t.target),
                ("delay-until", &due),
                ("delay-id", &id),
                ("app", "x"),
            ],
        )
        .await;
    }
    for i in 0..2 {
        produce(
            &producer,
            &t.delay,
            Some("o"),
            Some(&format!("other{i}")),
            &[("delay-target", &other), ("delay-after", "60s")],
        )
        .await;
    }
    // The broker has stored all 8 once the listing shows them.
    let mut all = Value::Null;
    for _ in 0..100 {
        all = http_json(addr, "GET", "/api/v1/pending?limit=1000", None, None)
            .await
            .1;
        if all["records"].as_array().map_or(0, Vec::len) == 8 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(all["records"].as_array().unwrap().len(), 8, "{all}");
    assert_eq!(all["next_cursor"], Value::Null);

    // Paging by target, in due order.
    let path = format!("/api/v1/pending?target={}&limit=4", t.target);
    let (status, page1) = http_json(addr, "GET", &path, None, None).await;
    assert_eq!(status, 200);
    let cursor = page1["next_cursor"]
        .as_str()
        .expect("a second page")
        .to_owned();
    let (_, page2) = http_json(addr, "GET", &format!("{path}&cursor={cursor}"), None, None).await;
    assert_eq!(page2["next_cursor"], Value::Null);
    let ids: Vec<String> = [ids_by_value(&page1), ids_by_value(&page2)].concat();
    assert_eq!(ids.len(), 6);
    let dues: Vec<u64> = [&page1, &page2]
        .iter()
        .flat_map(|p| {
            p["records"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["due_ms"].as_u64().unwrap())
        })
        .collect();
    assert_eq!(dues, (0..6).map(|i| base + i).collect::<Vec<_>>());
    let id = |n: usize| ids[n].clone();

    // Search by delay-id and by due range; show one.
    let (_, found) = http_json(addr, "GET", "/api/v1/pending?delay_id=d3", None, None).await;
    assert_eq!(ids_by_value(&found), [id(3)]);
    let range = format!("/api/v1/pending?due_from={}&due_to={}", base + 1, base + 2);
    assert_eq!(
        ids_by_value(&http_json(addr, "GET", &range, None, None).await.1),
        [id(1), id(2)]
    );
    let (status, shown) = http_json(
        addr,
        "GET",
        &format!("/api/v1/pending/{}", id(0)),
        None,
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(shown["value"], "v0");
    assert_eq!(shown["key"], "d0");
    assert_eq!(shown["delay_id"], "d0");
    assert_eq!(shown["target"], t.target.as_str());
    assert_eq!(shown["headers"], json!([{"key": "app", "value": "x"}]));
    assert_eq!(shown["source"]["topic"], t.delay.as_str());

    // d3: cancel. d1: fire now. d2: two seconds from now. d4: later than it was due.
    let one = |n: usize, action: &str| format!("/api/v1/pending/{}{action}", id(n));
    assert_eq!(
        http_json(addr, "DELETE", &one(3, ""), None, None).await.0,
        200
    );
    assert_eq!(http_json(addr, "GET", &one(3, ""), None, None).await.0, 404);
    assert_eq!(
        http_json(addr, "DELETE", &one(3, ""), None, None).await.0,
        404
    );
    let fired_at = now_ms();
    assert_eq!(
        http_json(addr, "POST", &one(1, "/fire"), None, None)
            .await
            .0,
        200
    );
    let (status, moved) = http_json(
        addr,
        "POST",
        &one(2, "/reschedule"),
        Some(json!({"delay": "2s"})),
        None,
    )
    .await;
    assert_eq!(status, 200, "{moved}");
    assert_eq!(moved["previous_due_ms"], base + 2);
    let later = base + 4_000;
    let (status, _) = http_json(
        addr,
        "POST",
        &one(4, "/reschedule"),
        Some(json!({"due": later})),
        None,
    )
    .await;
    assert_eq!(status, 200);
    let (status, err) = http_json(
        addr,
        "POST",
        &one(4, "/reschedule"),
        Some(json!({"delay": "soon"})),
        None,
    )
    .await;
    assert_eq!(status, 400);
    assert!(err["error"].as_str().unwrap().contains("delay"), "{err}");

    // Bulk: everything for the other target is cancelled; a bulk without a filter is refused.
    let (status, bulk) = http_json(
        addr,
        "POST",
        "/api/v1/bulk/cancel",
        Some(json!({"target": other})),
        None,
    )
    .await;
    assert_eq!(status, 200);
    // With the changelog (the default on Apache Kafka; the mock cluster runs without it) the
    // answer names the group's other members: none here.
    let (_, metrics) = http_get(addr, "/metrics").await;
    let mut want = json!({"matched": 2, "changed": 2, "more": false});
    if !metrics.contains("kafka_delay_mode{mode=\"local\"} 1") {
        want["elsewhere"] = json!([]);
    }
    assert_eq!(
        bulk,
        want,
        "{}",
        metrics
            .lines()
            .find(|l| l.starts_with("kafka_delay_mode"))
            .unwrap_or("no mode")
    );
    let (status, _) = http_json(addr, "POST", "/api/v1/bulk/fire", Some(json!({})), None).await;
    assert_eq!(status, 400);

    // What arrives: d1 at once, d2 after 2 s, d0 and d5 when due, d4 at its new later time,
    // each once; d3 and the other target's records never.
    let reader = reader(kafka, &t.target, 1);
    let got = collect(&reader, 6, Duration::from_secs(20)).await;
    let got: HashMap<String, Got> = got.into_iter().map(|g| (g.value().unwrap(), g)).collect();
    let mut names: Vec<&str> = got.keys().map(String::as_str).collect();
    names.sort();
    assert_eq!(names, ["v0", "v1", "v2", "v4", "v5"], "each once, d3 never");
    assert!(
        got["v1"].num("delay-fired-ms") < base,
        "fired now, before its due time"
    );
    assert!(got["v1"].num("delay-fired-ms") >= fired_at);
    assert!(got["v2"].num("delay-fired-ms") >= fired_at + 2_000);
    assert!(got["v0"].num("delay-fired-ms") >= base);
    assert_eq!(got["v4"].num("delay-due-ms"), later);
    assert!(
        got["v4"].num("delay-fired-ms") >= later,
        "the old timer did not fire it early"
    );
    assert!(
        collect(&reader, 1, Duration::from_secs(1)).await.is_empty(),
        "no duplicates"
    );
    assert_eq!(topic_size(kafka, &other, 1), 0);

    let (_, body) = http_get(addr, "/metrics").await;
    for (action, n) in [
        ("cancel", 1.0),
        ("fire", 1.0),
        ("reschedule", 2.0),
        ("bulk_cancel", 1.0),
    ] {
        let line =
            format!("kafka_delay_admin_requests_total{{action=\"{action}\",outcome=\"ok\"}}");
        assert_eq!(metric(&body, &line), Some(n), "{line}");
    }
    for (action, outcome) in [
        ("cancel", "not_found"),
        ("reschedule", "error"),
        ("bulk_fire", "error"),
    ] {
        let line = format!(
            "kafka_delay_admin_requests_total{{action=\"{action}\",outcome=\"{outcome}\"}}"
        );
        assert_eq!(metric(&body, &line), Some(1.0), "{line}");
    }
    env.broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_token_every_api_request_needs_it() {
    let token = "s3cret-token-for-tests";
    let env = Env::start(1, &["--admin-token", token]).await;
    let addr = env.broker.http_addr();
    let (status, err) = http_json(addr, "GET", "/api/v1/pending", None, None).await;
    assert_eq!(status, 401, "{err}");
    let (status, _) = http_json(
        addr,
        "GET",
        "/api/v1/pending",
        None,
        Some("wrong-token-wrong-token"),
    )
    .await;
    assert_eq!(status, 401);
    let (status, page) = http_json(addr, "GET", "/api/v1/pending", None, Some(token)).await;
    assert_eq!(status, 200, "{page}");
    let (status, _) = http_json(
        addr,
        "POST",
        "/api/v1/bulk/cancel",
        Some(json!({"all": true})),
        None,
    )
    .await;
    assert_eq!(status, 401);
    let (status, done) = http_json(
        addr,
        "POST",
        "/api/v1/bulk/cancel",
        Some(json!({"all": true})),
        Some(token),
    )
    .await;
    assert_eq!(status, 200, "{done}");
    // The probe, the metrics and the health checks stay open.
    assert_eq!(http_get(addr, "/readyz").await.0, 200);
    let (_, body) = http_get(addr, "/metrics").await;
    assert_eq!(
        metric(
            &body,
            "kafka_delay_admin_requests_total{action=\"bulk_cancel\",outcome=\"denied\"}"
        ),
        Some(1.0)
    );
    env.broker.shutdown().await;
}
