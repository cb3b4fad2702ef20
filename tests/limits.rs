//! Fire limits on a real broker: a limited target paced while others go at once, a restart in
//! the middle of a paced wave, and the admin API's bulk fire and consumer retries paced alike.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use common::procs::{free_port, process_kafka, spawn_broker_with, wait_ready};
use common::*;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::json;
use tempfile::TempDir;

/// Sends `r{i}` keyed `k{i}` for each `i` in `ids` to `topic`, with `headers`, all in flight at
/// once, and waits for every acknowledgement.
async fn produce_many(
    producer: &FutureProducer,
    topic: &str,
    ids: std::ops::Range<u32>,
    headers: &[(&str, &str)],
) {
    let mut acks = Vec::new();
    for i in ids {
        let (key, value) = (format!("k{i}"), format!("r{i}"));
        let hs = headers.iter().fold(OwnedHeaders::new(), |hs, (k, v)| {
            hs.insert(Header {
                key: k,
                value: Some(*v),
            })
        });
        let rec = FutureRecord::to(topic)
            .key(&key)
            .payload(&value)
            .headers(hs);
        acks.push(
            producer
                .send_result(rec)
                .map_err(|(e, _)| e)
                .expect("queued"),
        );
    }
    for ack in acks {
        ack.await.expect("not cancelled").expect("acknowledged");
    }
}

/// Counts per 5 s window from the first of `times` (ms, sorted), full windows only.
fn per_five_seconds(times: &[u64]) -> Vec<usize> {
    let (first, last) = (times[0], *times.last().unwrap());
    (0..)
        .map(|k| first + 5_000 * k)
        .take_while(|start| start + 5_000 <= last)
        .map(|start| {
            times
                .iter()
                .filter(|&&t| (start..start + 5_000).contains(&t))
                .count()
        })
        .collect()
}

/// The most records in any 5 s window starting at one of `times` (ms, sorted).
fn busiest_five_seconds(times: &[u64]) -> usize {
    let mut most = 0;
    let mut end = 0;
    for (i, &t) in times.iter().enumerate() {
        while end < times.len() && times[end] < t + 5_000 {
            end += 1;
        }
        most = most.max(end - i);
    }
    most
}

fn p99(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v[(v.len() * 99).div_ceil(100) - 1]
}

/// Each target partition's records arrived in due order, and in source offset order for the
/// same due time.
fn assert_in_due_order(got: &[Got]) {
    let mut by_partition: BTreeMap<i32, Vec<(u64, u64)>> = BTreeMap::new();
    for g in got {
        use rdkafka::Message;
        by_partition
            .entry(g.msg.partition())
            .or_default()
            .push((g.num("delay-due-ms"), g.num("delay-origin-offset")));
    }
    for (p, seq) in by_partition {
        assert!(
            seq.windows(2).all(|w| w[0] < w[1]),
            "partition {p} out of due order: {:?}",
            seq.windows(2).find(|w| w[0] >= w[1])
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limited_target_goes_at_its_rate_in_due_order_and_the_others_are_not_held_up() {
    let t = Topics::new();
    let limited = format!("lim-{}", t.id);
    let free = [format!("free1-{}", t.id), format!("free2-{}", t.id)];
    let rule = format!("^{limited}$=100/s");
    let env = Env::start_with(t, 1, &["--fire-rate", &rule, "--no-changelog"]).await;
    let (kafka, t, addr) = (&env.kafka, &env.t, env.broker.http_addr());
    kafka.create_topic(&limited, 2).await;
    for f in &free {
        kafka.create_topic(f, 2).await;
    }
    let producer = kafka.producer();
    let free_readers = [reader(kafka, &free[0], 2), reader(kafka, &free[1], 2)];
    let limited_reader = reader(kafka, &limited, 2);

    // The unlimited targets' lateness: arrival and firing (delay-fired-ms) minus due.
    let lateness = |got: &[Got]| -> Vec<u64> {
        got.iter()
            .map(|g| {
                let due = g.num("delay-due-ms");
                assert!(g.received_ms >= due, "{:?} arrived early", g.value());
                g.received_ms - due
            })
            .collect()
    };
    let firing = |got: &[Got]| -> Vec<u64> {
        got.iter()
            .map(|g| g.num("delay-fired-ms") - g.num("delay-due-ms"))
            .collect()
    };
    // Both targets read at once, so that neither's arrival times wait for the other's reading.
    let both = || async {
        let (a, b) = tokio::join!(
            collect(&free_readers[0], 500, Duration::from_secs(30)),
            collect(&free_readers[1], 500, Duration::from_secs(30))
        );
        assert_eq!((a.len(), b.len()), (500, 500));
        [a, b].concat()
    };
    // One round: 2,000 records for the limited target due at `wave_due`, then 500 for each
    // unlimited target due at `due`, all produced the same way; the unlimited ones' arrival
    // and firing lateness.
    let round = |due_ms: u64, wave_due: u64, first: u32| {
        let (producer, both) = (&producer, &both);
        let (delay, limited, free) = (&t.delay, &limited, &free);
        async move {
            let wave_due = wave_due.to_string();
            produce_many(
                producer,
                delay,
                first..first + 2_000,
                &[("delay-target", limited), ("delay-until", &wave_due)],
            )
            .await;
            let due = due_ms.to_string();
            for (i, f) in free.iter().enumerate() {
                let ids = i as u32 * 500..(i as u32 + 1) * 500;
                produce_many(
                    producer,
                    delay,
                    ids,
                    &[("delay-target", f), ("delay-until", &due)],
                )
                .await;
            }
            assert!(now_ms() < due_ms, "records produced before they were due");
            let got = both().await;
            (lateness(&got), firing(&got))
        }
    };
    // The baseline: the same records, the limited ones due an hour later (they stay pending).
    let due = now_ms() + 5_000;
    let (alone, fired_alone) = round(due, due + 3_600_000, 10_000).await;
    // The wave: the limited ones due in the same millisecond as the others.
    let due_ms = now_ms() + 5_000;
    let (beside, fired_beside) = round(due_ms, due_ms, 0).await;
    let worst_beside = beside.iter().copied().max().unwrap_or_default();
    let worst_fired_beside = fired_beside.iter().copied().max().unwrap_or_default();
    let (p99_alone, p99_beside) = (p99(alone), p99(beside));
    let (fired_p99_alone, fired_p99_beside) = (p99(fired_alone), p99(fired_beside));
    // While the wave is paced, its held records are counted by target.
    let (_, scrape) = http_get(addr, "/metrics").await;
    let held_series = format!("kafka_delay_fire_held_records{{target=\"{limited}\"}}");
    let held = metric(&scrape, &held_series).expect("held gauge");
    assert!(held > 1_000.0, "held now: {held}");

    let got = collect(&limited_reader, 2_000, Duration::from_secs(60)).await;
    assert_eq!(got.len(), 2_000, "every limited record delivered");
    let values: HashSet<String> = got.iter().filter_map(Got::value).collect();
    assert_eq!(values.len(), 2_000, "each once");
    let mut fired: Vec<u64> = got.iter().map(|g| g.num("delay-fired-ms")).collect();
    fired.sort_unstable();
    assert!(fired[0] >= due_ms, "never early");
    assert!(got.iter().all(|g| g.received_ms >= due_ms));
    assert_in_due_order(&got);
    let windows = per_five_seconds(&fired);
    println!(
        "limited 100/s: per 5 s {windows:?}, over {:.2} s; unlimited lateness p99 {p99_alone} ms \
         alone, {p99_beside} ms beside the wave (ratio {:.2}); fired (delay-fired-ms) p99 \
         {fired_p99_alone} ms alone, {fired_p99_beside} ms beside",
        (fired[1_999] - fired[0]) as f64 / 1e3,
        p99_beside as f64 / p99_alone.max(1) as f64
    );
    // Never faster than the limit; and at its pace, within what a shared machine allows (at
    // least three quarters of the rate: the firing itself can fall behind the limit there).
    let span = fired[1_999] - fired[0];
    assert!(
        (19_000..=26_700).contains(&span),
        "2,000 at 100/s over {span} ms"
    );
    for n in windows {
        assert!(n <= 550, "{n} in 5 s at 100/s");
    }
    // The unlimited targets were not held behind the wave: each of their records was fired,
    // and reached its target, within the first fifth of the 20 s the wave takes (held behind
    // it, they would trail it by up to 20 s). How their lateness compares with the baseline
    // round is a figure (printed above; BENCHMARKS.md has it for the release build), not a
    // timed assertion: this machine is shared.
    assert!(
        worst_fired_beside < 4_000 && worst_beside < 4_000,
        "unlimited records held behind the wave: fired up to {worst_fired_beside} ms, arrived up \
         to {worst_beside} ms after due"
    );

    let (_, scrape) = http_get(addr, "/metrics").await;
    assert_eq!(metric(&scrape, &held_series), Some(0.0));
    let held_total = format!("kafka_delay_fire_held_total{{target=\"{limited}\"}}");
    assert!(metric(&scrape, &held_total).unwrap() >= 1_999.0);
    assert!(metric(&scrape, "kafka_delay_fire_limit_lateness_seconds_count").unwrap() >= 1_999.0);
    // Lateness from load leaves out what the limit added: the wave took 20 s to go out.
    let over_5s = metric(
        &scrape,
        "kafka_delay_delivery_lateness_seconds_bucket{le=\"5\"}",
    )
    .unwrap();
    let all = metric(&scrape, "kafka_delay_delivery_lateness_seconds_count").unwrap();
    assert_eq!(over_5s, all, "no delivery counted as more than 5 s late");
    env.broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_in_the_middle_of_a_paced_wave_loses_nothing_and_keeps_the_rate() {
    let (_kafka_proc, brokers) = process_kafka();
    let kafka = Kafka::External(brokers.clone());
    let t = Topics::new();
    kafka.create_topic(&t.delay, 1).await;
    // The sandbox makes topics with a partition count of its own: read them all.
    let partitions = kafka.create_topic(&t.target, 2).await;
    kafka.create_topic(&t.dlt, 1).await;
    let data = TempDir::new().unwrap();
    let port = free_port();
    let rule = format!("^{}$=100/s", t.target);
    let env = [
        ("KAFKA_DELAY_FIRE_RATE", rule.as_str()),
        ("KAFKA_DELAY_NO_CHANGELOG", "true"),
    ];
    let broker = spawn_broker_with(&brokers, &t, &data, port, &env);
    wait_ready(port, Duration::from_secs(60)).await;
    let producer = kafka.producer();
    let reader = reader(&kafka, &t.target, partitions);
    // Due once all are stored: on a loaded machine ingest beside the wave's start slowed the
    // firing (313 in its first 5 s) and its catch-up made the busiest 5 s 644.
    let due_ms = now_ms() + 8_000;
    let due = due_ms.to_string();
    produce_many(
        &producer,
        &t.delay,
        0..1_500,
        &[("delay-target", &t.target), ("delay-until", &due)],
    )
    .await;
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let stored = Instant::now() + Duration::from_secs(20);
    while Instant::now() < stored {
        let (_, body) = http_get(addr, "/metrics").await;
        if metric(&body, "kafka_delay_pending_records") == Some(1_500.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // SIGKILL once 600 have arrived (about 6 s into the wave), then start again on the same
    // data directory.
    let mut got = collect(&reader, 600, Duration::from_secs(40)).await;
    assert_eq!(got.len(), 600);
    drop(broker);
    let killed_ms = now_ms();
    let _broker = spawn_broker_with(&brokers, &t, &data, port, &env);
    wait_ready(port, Duration::from_secs(60)).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut distinct: HashSet<String> = got.iter().filter_map(Got::value).collect();
    while distinct.len() < 1_500 && Instant::now() < deadline {
        let more = collect(&reader, 1, Duration::from_secs(5)).await;
        distinct.extend(more.iter().filter_map(Got::value));
        got.extend(more);
    }
    assert_eq!(distinct.len(), 1_500, "nothing lost");
    let duplicates = got.len() - 1_500;
    assert!(
        duplicates <= 64,
        "{duplicates} duplicates: more than the in-flight window"
    );
    let mut fired: Vec<u64> = got.iter().map(|g| g.num("delay-fired-ms")).collect();
    fired.sort_unstable();
    assert!(fired[0] >= due_ms, "never early");
    let after: Vec<u64> = fired.iter().copied().filter(|&f| f > killed_ms).collect();
    let (before, since) = (per_five_seconds(&fired), per_five_seconds(&after));
    let busiest = busiest_five_seconds(&fired);
    println!(
        "restart mid-wave: {duplicates} duplicates; per 5 s {before:?} from the start, {since:?} \
         after the restart; busiest 5 s {busiest}"
    );
    assert!(!since.is_empty(), "a full 5 s window after the restart");
    // The limit holds before and after the restart, and across it (no burst to catch up).
    assert!(before[0] <= 550, "{before:?}");
    for n in &since {
        assert!(*n <= 550, "{n} in 5 s after the restart");
    }
    assert!(busiest <= 550, "{busiest} in the busiest 5 s");
    // And the pace resumed: the windows after the restart average at least three quarters of
    // the rate. Not more: on a shared machine the firing itself can fall behind the limit
    // (442 and 410 in a loaded full run); a limiter that lost or reset its rate falls far lower.
    let mean = since.iter().sum::<usize>() / since.len();
    assert!(mean >= 375, "{since:?} in 5 s windows after the restart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_fire_and_consumer_retries_go_at_the_targets_rate() {
    let t = Topics::new();
    let rule = format!("^{}$=50/s", t.target);
    let env = Env::start_with(t, 1, &["--fire-rate", &rule, "--no-changelog"]).await;
    let (kafka, t, addr) = (&env.kafka, &env.t, env.broker.http_addr());
    let producer = kafka.producer();
    let reader = reader(kafka, &t.target, 1);
    let span = |got: &[Got]| {
        let fired: Vec<u64> = got.iter().map(|g| g.num("delay-fired-ms")).collect();
        fired.iter().max().unwrap() - fired.iter().min().unwrap()
    };

    // 100 records due in an hour, fired now in bulk: paced at 50/s, about 2 s.
    produce_many(
        &producer,
        &t.delay,
        0..100,
        &[("delay-target", &t.target), ("delay-after", "1h")],
    )
    .await;
    wait_pending(addr, 100, Duration::from_secs(30)).await;
    let (status, bulk) = http_json(
        addr,
        "POST",
        "/api/v1/bulk/fire",
        Some(json!({"target": t.target})),
        None,
    )
    .await;
    assert_eq!(status, 200, "{bulk}");
    assert_eq!(bulk["changed"], 100);
    let got = collect(&reader, 100, Duration::from_secs(30)).await;
    assert_eq!(got.len(), 100);
    assert_in_due_order(&got);
    let bulk_span = span(&got);

    // 100 consumer retries due at once: paced the same way.
    let retry = t.delay_topic("retry");
    produce_many(
        &producer,
        &retry,
        0..100,
        &[("delay-target", &t.target), ("retry-after", "0")],
    )
    .await;
    let got = collect(&reader, 100, Duration::from_secs(30)).await;
    assert_eq!(got.len(), 100);
    assert!(got
        .iter()
        .all(|g| g.header("retry-attempt").as_deref() == Some("1")));
    let retry_span = span(&got);
    println!("50/s: bulk fire of 100 over {bulk_span} ms, 100 retries over {retry_span} ms");
    // 99 intervals of 20 ms: 1,980 ms; never much faster.
    assert!(bulk_span >= 1_900, "bulk fire over {bulk_span} ms");
    assert!(retry_span >= 1_900, "retries over {retry_span} ms");
    let values: HashMap<String, u32> =
        got.iter()
            .filter_map(Got::value)
            .fold(HashMap::new(), |mut m, v| {
                *m.entry(v).or_default() += 1;
                m
            });
    assert_eq!(values.len(), 100);
    env.broker.shutdown().await;
}
