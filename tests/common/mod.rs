//! Test harness: a Kafka broker over TCP on 127.0.0.1 (librdkafka's mock cluster in this
//! process, or the broker named by KAFKA_DELAY_TEST_BROKERS: Apache Kafka under `make test`),
//! unique topics per test, a real RocksDB in a TempDir, and the broker started in-process.
#![allow(dead_code)]

pub(crate) mod apache;
pub(crate) mod browser;
pub(crate) mod group;
pub(crate) mod netcut;
pub(crate) mod procs;

use std::collections::HashMap;

use std::sync::Arc;
use std::time::{Duration, Instant};

use kafka_delay::app::{self, Running};
use kafka_delay::config::{Config, RunArgs};
use kafka_delay_core::clock::{Clock, SystemClock};
pub(crate) use kafka_delay_testkit::{now_ms, unique, Kafka};
use prometheus::Registry;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use tempfile::TempDir;

/// One test's topics.
pub(crate) struct Topics {
    pub(crate) id: String,
    pub(crate) delay: String,
    pub(crate) target: String,
    pub(crate) dlt: String,
    pub(crate) pattern: String,
}

impl Topics {
    pub(crate) fn new() -> Self {
        let id = unique("t").replace('-', "_");
        Topics {
            delay: format!("delay.{id}.in"),
            target: format!("out-{id}"),
            dlt: format!("dlt-{id}"),
            pattern: format!(r"^delay\.{id}\..+"),
            id,
        }
    }

    /// A delay topic of this test with a suffix (e.g. "30s" gives a fixed-delay topic).
    pub(crate) fn delay_topic(&self, suffix: &str) -> String {
        format!("delay.{}.{suffix}", self.id)
    }
}

pub(crate) fn config(kafka: &Kafka, topics: &Topics, data: &TempDir, extra: &[&str]) -> Config {
    let brokers = kafka.brokers();
    let data_dir = data.path().to_str().unwrap().to_owned();
    let group = format!("g-{}", topics.id);
    let retry_topic = topics.delay_topic("retry");
    let retry_topics = format!(r"^delay\.{}\.retry$", topics.id);
    let instance = format!("i-{}", topics.id);
    // Extra flags for a particular external broker, e.g. KAFKA_DELAY_TEST_FLAGS=--no-static-membership
    let env_flags = std::env::var("KAFKA_DELAY_TEST_FLAGS").unwrap_or_default();
    let dynamic = env_flags.contains("--no-static-membership");
    let mut args = vec![
        "kafka-delay",
        "run",
        "--brokers",
        &brokers,
        "--data-dir",
        &data_dir,
        "--http-addr",
        "127.0.0.1:0",
        "--group-id",
        &group,
        "--source-pattern",
        &topics.pattern,
        "--dead-letter-topic",
        &topics.dlt,
        "--topic-refresh",
        "500ms",
        "--retry-topic",
        &retry_topic,
        "--retry-topics",
        &retry_topics,
        "--fire-max-attempts",
        "2",
        "--fire-backoff-max",
        "1s",
        "--kafka-config",
        "session.timeout.ms=6000",
    ];
    if !dynamic {
        args.extend_from_slice(&["--instance-id", &instance]);
    }
    args.extend(env_flags.split_whitespace());
    args.extend_from_slice(extra);
    RunArgs::try_parse_flags(&args[2..])
        .expect("flags")
        .validate()
        .expect("valid config")
}

pub(crate) async fn start(config: Config) -> Running {
    start_with_clock(config, Arc::new(SystemClock)).await
}

pub(crate) async fn start_with_clock(config: Config, clock: Arc<dyn Clock>) -> Running {
    tokio::time::timeout(
        Duration::from_secs(60),
        app::start(config, clock, Registry::new()),
    )
    .await
    .expect("broker starts within 60s")
    .expect("broker starts")
}

/// Produces one record and waits for its acknowledgement.
pub(crate) async fn produce(
    producer: &FutureProducer,
    topic: &str,
    key: Option<&str>,
    value: Option<&str>,
    headers: &[(&str, &str)],
) {
    produce_to(
        producer,
        topic,
        None,
        key.map(str::as_bytes),
        value.map(str::as_bytes),
        headers,
    )
    .await
}

pub(crate) async fn produce_to(
    producer: &FutureProducer,
    topic: &str,
    partition: Option<i32>,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    headers: &[(&str, &str)],
) {
    let mut hs = OwnedHeaders::new();
    for (k, v) in headers {
        hs = hs.insert(Header {
            key: k,
            value: Some(*v),
        });
    }
    let mut rec = FutureRecord::<[u8], [u8]>::to(topic).headers(hs);
    if let Some(p) = partition {
        rec = rec.partition(p);
    }
    if let Some(k) = key {
        rec = rec.key(k);
    }
    if let Some(v) = value {
        rec = rec.payload(v);
    }
    producer
        .send(rec, Duration::from_secs(20))
        .await
        .map_err(|(e, _)| e)
        .expect("produce acknowledged");
}

/// A consumer of `topic` from the beginning of its `partitions` partitions (no group).
pub(crate) fn reader(kafka: &Kafka, topic: &str, partitions: i32) -> StreamConsumer {
    let c: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka.brokers())
        .set("group.id", unique("reader"))
        .set("fetch.wait.max.ms", "50")
        .set("enable.auto.commit", "false")
        .set("allow.auto.create.topics", "false")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    c.assign(&tpl).expect("assign");
    c
}

/// A received record with the local time it arrived.
#[derive(Debug, Clone)]
pub(crate) struct Got {
    pub(crate) msg: OwnedMessage,
    pub(crate) received_ms: u64,
}

impl Got {
    pub(crate) fn header(&self, name: &str) -> Option<String> {
        let hs = self.msg.headers()?;
        hs.iter()
            .find(|h| h.key == name)
            .and_then(|h| h.value.map(|v| String::from_utf8_lossy(v).into_owned()))
    }

    pub(crate) fn headers(&self) -> Vec<(String, Option<String>)> {
        self.msg
            .headers()
            .map(|hs| {
                hs.iter()
                    .map(|h| {
                        (
                            h.key.to_owned(),
                            h.value.map(|v| String::from_utf8_lossy(v).into_owned()),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    pub(crate) fn value(&self) -> Option<String> {
        self.msg
            .payload()
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }

    pub(crate) fn key(&self) -> Option<String> {
        self.msg
            .key()
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }

    pub(crate) fn num(&self, name: &str) -> u64 {
        self.header(name)
            .unwrap_or_else(|| panic!("header {name}"))
            .parse()
            .expect("number")
    }
}

/// Reads until `n` records arrived or `timeout` passed.
pub(crate) async fn collect(c: &StreamConsumer, n: usize, timeout: Duration) -> Vec<Got> {
    let deadline = Instant::now() + timeout;
    let mut out = Vec::new();
    while out.len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        match tokio::time::timeout(left, c.recv()).await {
            Ok(Ok(m)) => out.push(Got {
                msg: m.detach(),
                received_ms: now_ms(),
            }),
            Ok(Err(e)) => panic!("consume error: {e}"),
            Err(_) => break,
        }
    }
    out
}

/// Waits until the broker consumes: a probe record due at once reaches `target`.
pub(crate) async fn wait_consuming(kafka: &Kafka, topics: &Topics, probe_target: &str) {
    let producer = kafka.producer();
    let reader = reader(kafka, probe_target, 1);
    produce(
        &producer,
        &topics.delay,
        None,
        Some("probe"),
        &[("delay-target", probe_target), ("delay-after", "0")],
    )
    .await;
    let got = collect(&reader, 1, Duration::from_secs(45)).await;
    assert_eq!(
        got.len(),
        1,
        "the broker did not start consuming within 45s"
    );
}

/// Produces `r{i}` keyed `k{i}` to `topic` for each `(i, due)`, due at `due` on `target`.
pub(crate) async fn produce_numbered(
    producer: &FutureProducer,
    topic: &str,
    target: &str,
    dues: impl IntoIterator<Item = (u64, u64)>,
) {
    for (i, due) in dues {
        let due = due.to_string();
        let (key, value) = (format!("k{i}"), format!("r{i}"));
        produce(
            producer,
            topic,
            Some(&key),
            Some(&value),
            &[("delay-target", target), ("delay-until", &due)],
        )
        .await;
    }
}

/// A test's whole setup: Kafka, its topics (delay, target, dead-letter: 1 partition each, the
/// target with `target_partitions`), a RocksDB directory, and a broker that is consuming.
pub(crate) struct Env {
    pub(crate) kafka: Kafka,
    pub(crate) t: Topics,
    pub(crate) data: TempDir,
    pub(crate) broker: Running,
}

impl Env {
    pub(crate) async fn start(target_partitions: i32, extra: &[&str]) -> Env {
        Env::start_with(Topics::new(), target_partitions, extra).await
    }

    /// [`Env::start`] with topics chosen before (for flags that name them).
    pub(crate) async fn start_with(t: Topics, target_partitions: i32, extra: &[&str]) -> Env {
        Env::start_on(Kafka::start(), t, target_partitions, extra).await
    }

    /// [`Env::start_with`] on a Kafka of the test's choosing.
    pub(crate) async fn start_on(
        kafka: Kafka,
        t: Topics,
        target_partitions: i32,
        extra: &[&str],
    ) -> Env {
        kafka.create_topic(&t.delay, 1).await;
        kafka.create_topic(&t.target, target_partitions).await;
        kafka.create_topic(&t.dlt, 1).await;
        let data = TempDir::new().unwrap();
        let broker = start(config(&kafka, &t, &data, extra)).await;
        let probe = format!("probe-{}", t.id);
        kafka.create_topic(&probe, 1).await;
        wait_consuming(&kafka, &t, &probe).await;
        Env {
            kafka,
            t,
            data,
            broker,
        }
    }
}

/// Waits until `topic` exists (without creating it) and returns its partition count.
pub(crate) async fn wait_for_topic(kafka: &Kafka, topic: &str, timeout: Duration) -> i32 {
    let client: rdkafka::producer::BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", kafka.brokers())
        .set("allow.auto.create.topics", "false")
        .create()
        .expect("client");
    let deadline = Instant::now() + timeout;
    loop {
        let n = client
            .client()
            .fetch_metadata(Some(topic), Duration::from_secs(5))
            .ok()
            .and_then(|md| {
                md.topics()
                    .iter()
                    .find(|t| t.name() == topic && t.error().is_none())
                    .map(|t| t.partitions().len())
            })
            .unwrap_or(0);
        if n > 0 {
            return n as i32;
        }
        assert!(
            Instant::now() < deadline,
            "topic {topic} not created within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether the cluster knows `topic` now (asked without creating it).
/// Records in `topic` (sum of high watermarks less low ones).
pub(crate) fn topic_size(kafka: &Kafka, topic: &str, partitions: i32) -> i64 {
    let c: rdkafka::consumer::BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka.brokers())
        .create()
        .expect("consumer");
    (0..partitions)
        .map(|p| {
            let (lo, hi) = c
                .fetch_watermarks(topic, p, Duration::from_secs(5))
                .expect("watermarks");
            hi - lo
        })
        .sum()
}

/// GET on the broker's HTTP server; returns (status, body).
pub(crate) async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.unwrap();
    let status = buf
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// [`http_get`] of a server that may be gone: `None` when nothing answers within 5 s.
pub(crate) async fn http_get_at(addr: std::net::SocketAddr, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ask = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
        s.write_all(request.as_bytes()).await.ok()?;
        let mut buf = String::new();
        s.read_to_string(&mut buf).await.ok()?;
        let status = buf.split_whitespace().nth(1)?.parse().ok()?;
        let body = buf.split_once("\r\n\r\n").map(|(_, b)| b.to_owned());
        Some((status, body.unwrap_or_default()))
    };
    tokio::time::timeout(Duration::from_secs(5), ask)
        .await
        .ok()
        .flatten()
}

/// An HTTP request to the broker's server with an optional JSON body and bearer token;
/// returns (status, parsed JSON body or Null).
pub(crate) async fn http_json(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    body: Option<serde_json::Value>,
    token: Option<&str>,
) -> (u16, serde_json::Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.unwrap();
    let status = buf
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let text = buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .unwrap_or_default();
    (
        status,
        serde_json::from_str(text).unwrap_or(serde_json::Value::Null),
    )
}

/// Waits until the instance serving `addr` reports `n` records pending
/// (`kafka_delay_pending_records`); panics after `within`.
pub(crate) async fn wait_pending(addr: std::net::SocketAddr, n: u64, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let (_, body) = http_get(addr, "/metrics").await;
        if metric(&body, "kafka_delay_pending_records") == Some(n as f64) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{n} records pending within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The value of metric `name` (exact name with labels) of the instance whose HTTP server is
/// on 127.0.0.1:`port`; `None` where it has no such line or does not answer within 2 s.
pub(crate) async fn metric_at(port: u16, name: &str) -> Option<f64> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let scraped = tokio::time::timeout(Duration::from_secs(2), http_get_at(addr, "/metrics"));
    match scraped.await {
        Ok(Some((200, body))) => metric(&body, name),
        _ => None,
    }
}

/// The value of a metric line (exact name with labels) from /metrics.
pub(crate) fn metric(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

pub(crate) fn by_value(got: &[Got]) -> HashMap<String, Got> {
    got.iter()
        .map(|g| (g.value().unwrap_or_default(), g.clone()))
        .collect()
}
