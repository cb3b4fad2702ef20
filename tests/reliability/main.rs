//! Faults, one file per family: the broker's own process and disk (`crashes.rs`: kill -9 at
//! random moments, crashes at each step of the durability order, a clock that jumps, a full
//! disk), Kafka's (`kafka_faults.rs`: an outage, a broker restart, refused and deleted
//! targets), and bad input (`bad_input.rs`: a flood of malformed records, secrets in logs).
//! Every check goes through the verifier's [`Tally`]: lost, duplicated, early, lateness.
//! Bounded for CI; `KAFKA_DELAY_SOAK=1` (see RELIABILITY.md) runs the long versions.
//!
//! Tests named `mock_cluster_*` inject their fault through librdkafka's in-process mock cluster
//! and always run on it; tests named `apache_kafka_*` need a real Apache Kafka (an Apache Kafka
//! process restarted, DeleteTopics) and run on `common::apache`'s. The others run on the Kafka
//! of the run (`make test`: the mock cluster, then Apache Kafka).

#[path = "../common/mod.rs"]
mod common;

mod bad_input;
mod crashes;
mod kafka_faults;

use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::procs::*;
use common::*;
use kafka_delay::verify::{Arrival, Report, Tally};
use kafka_delay_core::clock::OffsetClock;
use kafka_delay_testkit::topic_exists;
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
                Ok(m) => tally.lock().unwrap().observe(m.payload(), Arrival::of(&m)),
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
