//! The Kafka a benchmark runs against, the clients it fills topics with, and the statistics
//! every part reports.

use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::ClientConfig;

use super::BenchError;
use kafka_delay::config::{Config, RunArgs};
use kafka_delay::kafka;

/// The Kafka every run of the benchmark uses: an embedded cluster, or the one `--brokers` names.
pub(super) struct Kafka {
    pub(super) brokers: String,
    /// The cluster (the test kit's: the suites reach Kafka the same way).
    cluster: kafka_delay_testkit::Kafka,
    /// Partitions of the topics created next (set per throughput size).
    pub(super) partitions: AtomicI32,
    /// Extra `run` flags for the brokers (not the passthrough).
    pub(super) broker_flags: Vec<String>,
    /// Part of every topic and group name of this run, so that runs against the same external
    /// cluster never read each other's records.
    pub(super) run: String,
}

/// Parses broker flags as `kafka-delay run` would.
pub(super) fn config(
    brokers: &str,
    data_dir: &std::path::Path,
    extra: &[&str],
) -> Result<Config, BenchError> {
    let dir = data_dir.display().to_string();
    let mut flags = vec![
        "--brokers",
        brokers,
        "--data-dir",
        &dir,
        "--http-addr",
        "127.0.0.1:0",
        "--dead-letter-topic",
        "bench.dlt",
    ];
    // Every run is one member of a group of its own, so static membership (which only spares
    // a restarted member a rebalance) has nothing to do here; a run that names its instance
    // (exactly-once needs the id) is a static member, alone in its group all the same.
    if !extra.contains(&"--instance-id") {
        flags.push("--no-static-membership");
    }
    flags.extend_from_slice(extra);
    Ok(RunArgs::try_parse_flags(flags)?.validate()?)
}

impl Kafka {
    /// The cluster at `brokers`, or an embedded one (three brokers) started now without it.
    pub(super) fn connect(
        brokers: Option<&str>,
        partitions: i32,
        broker_flags: &[String],
    ) -> Result<Self, BenchError> {
        let cluster = kafka_delay_testkit::Kafka::connect(brokers, 3)?;
        Ok(Self {
            brokers: cluster.brokers(),
            cluster,
            partitions: AtomicI32::new(partitions),
            broker_flags: broker_flags.to_vec(),
            run: kafka_delay_testkit::unique("run"),
        })
    }

    /// Topics created from now on get `partitions` partitions.
    pub(super) fn reset_partitions(&self, partitions: i32) {
        self.partitions.store(partitions, Ordering::Relaxed);
    }

    /// Creates `topic` with the current number of partitions; an existing topic is kept.
    pub(super) async fn create(&self, topic: &str, producer: &FutureProducer, config: &Config) {
        let partitions = self.partitions.load(Ordering::Relaxed);
        match self.cluster.mock() {
            Some(e) => {
                let _ = e.create_topic(topic, partitions);
            }
            None => {
                let _ = kafka::ensure_topic(config, producer, topic, partitions).await;
            }
        }
    }

    /// Creates target `topic` with the current number of partitions, keeping Kafka's append
    /// times (`message.timestamp.type=LogAppendTime`): a checker's clock.
    pub(super) async fn create_target(&self, topic: &str) {
        let partitions = self.partitions.load(Ordering::Relaxed);
        self.cluster.create_target_topic(topic, partitions).await;
    }

    /// The benchmark's own producer, batching for up to `linger_ms`.
    pub(super) fn producer(&self, linger_ms: u32) -> Result<FutureProducer, BenchError> {
        Ok(ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .set("linger.ms", linger_ms.to_string())
            .set("queue.buffering.max.messages", "500000")
            .create()?)
    }

    /// Produces `n` records of `size`-byte values to `topic`, with the delay headers when
    /// `target` is given (due at once).
    pub(super) async fn fill_topic(
        &self,
        topic: &str,
        n: u64,
        size: usize,
        target: Option<&str>,
    ) -> Result<(), BenchError> {
        self.fill_topic_due(topic, n, size, target, "0").await
    }

    /// [`Kafka::fill_topic`], each record due `after` (a `delay-after` value) once produced.
    pub(super) async fn fill_topic_due(
        &self,
        topic: &str,
        n: u64,
        size: usize,
        target: Option<&str>,
        after: &str,
    ) -> Result<(), BenchError> {
        self.fill_topic_with(topic, n, size, target, ("delay-after", after))
            .await
    }

    /// [`Kafka::fill_topic`] with the due-time header `due` (name, value), records keyed `k<i>`.
    pub(super) async fn fill_topic_with(
        &self,
        topic: &str,
        n: u64,
        size: usize,
        target: Option<&str>,
        due: (&str, &str),
    ) -> Result<(), BenchError> {
        let p = self.producer(5)?;
        let value = vec![b'v'; size];
        let mut acks = Vec::new();
        for i in 0..n {
            let key = format!("k{i}");
            let mut rec = FutureRecord::to(topic).key(&key).payload(&value);
            if let Some(t) = target {
                rec = rec.headers(
                    OwnedHeaders::new()
                        .insert(Header {
                            key: "delay-target",
                            value: Some(t),
                        })
                        .insert(Header {
                            key: due.0,
                            value: Some(due.1),
                        }),
                );
            }
            loop {
                match p.send_result(rec) {
                    Ok(f) => {
                        acks.push(f);
                        break;
                    }
                    Err((_, back)) => {
                        rec = back;
                        for f in acks.drain(..) {
                            f.await?.map_err(|(e, _)| e)?;
                        }
                    }
                }
            }
        }
        for f in acks {
            f.await?.map_err(|(e, _)| e)?;
        }
        p.flush(Duration::from_secs(30))?;
        Ok(())
    }
}

/// The middle value (the upper one of an even count; 0 for none).
pub(super) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// p50, p99, p99.9 and the maximum (zeros for none).
pub(super) fn percentiles(mut v: Vec<u64>) -> [u64; 4] {
    if v.is_empty() {
        return [0; 4];
    }
    v.sort_unstable();
    let at = |q: f64| v[((v.len() as f64 * q) as usize).min(v.len() - 1)];
    [at(0.5), at(0.99), at(0.999), v[v.len() - 1]]
}

/// How many of `total` records paced at `rate` a second should have been sent by now (one more
/// than the elapsed time allows, so the first goes at once).
pub(super) fn paced(started: Instant, rate: f64, total: u64) -> u64 {
    ((started.elapsed().as_secs_f64() * rate) as u64 + 1).min(total)
}

/// The upper bounds, in ms, of the buckets holding p50, p99 and p99.9 of a histogram in seconds.
pub(super) fn bucket_bounds(histogram: &prometheus::Histogram) -> [f64; 3] {
    [0.5, 0.99, 0.999]
        .map(|q| kafka_delay::metrics::bucket_quantile_ms(histogram, q).unwrap_or(f64::INFINITY))
}
