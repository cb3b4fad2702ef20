//! `--plain-producer`: Kafka's own produce round trip under a load, without kafka-delay: a
//! plain producer with the broker's producer settings carries the rate, alone or beside the
//! rest of a lateness run's traffic.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{
    BaseRecord, DeliveryResult, FutureProducer, FutureRecord, Producer, ProducerContext,
    ThreadedProducer,
};
use rdkafka::ClientContext;

use super::PlainLoad;
use crate::harness::{config, paced, percentiles, Kafka};
use crate::BenchError;
use kafka_delay::kafka;
use kafka_delay_core::clock::{Clock, SystemClock};

/// Delivery reports of a plain producer: each record's send-to-acknowledgement time, taken in
/// the delivery callback as the broker's publisher takes its own.
#[derive(Debug, Default)]
struct AckTimes(std::sync::Mutex<Vec<u64>>);

impl ClientContext for AckTimes {}

impl ProducerContext for AckTimes {
    type DeliveryOpaque = Box<Instant>;

    fn delivery(&self, result: &DeliveryResult<'_>, sent: Box<Instant>) {
        if result.is_ok() {
            let ms = sent.elapsed().as_millis() as u64;
            self.0.lock().unwrap_or_else(|e| e.into_inner()).push(ms);
        }
    }
}

impl Kafka {
    /// A plain producer with the broker's producer settings sends `rate` records a second for
    /// `span` to a topic of its own (100-byte values, keys and seven headers like the records
    /// the broker publishes), paced a millisecond at a time.
    pub(super) async fn plain_load(
        &self,
        rate: f64,
        span: Duration,
        traffic: bool,
    ) -> Result<PlainLoad, BenchError> {
        let dir = tempfile::TempDir::new()?;
        let config = config(&self.brokers, dir.path(), &[])?;
        let topic = format!("bench.plain.{}", std::process::id());
        let source = format!("bench.plain.{}.source", std::process::id());
        let admin = kafka::producer(&config)?;
        self.create(&topic, &admin, &config).await;
        self.create(&source, &admin, &config).await;
        let stop = Arc::new(AtomicBool::new(false));
        let mut rest = Vec::new();
        if traffic {
            rest.push(tokio::spawn(generate(
                self.producer(50)?,
                source.clone(),
                rate,
                span,
            )));
            for (t, group) in [(&source, "ingest"), (&topic, "reader")] {
                let consumer: StreamConsumer = kafka_delay::ingest::consumer_config(&config)
                    .set(
                        "group.id",
                        format!("bench-plain-{group}-{}", std::process::id()),
                    )
                    .create()?;
                consumer.subscribe(&[t.as_str()])?;
                rest.push(tokio::spawn(drain(consumer, stop.clone())));
            }
        }
        let settings = kafka::producer_config(&config);
        let linger_ms = settings
            .get("linger.ms")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let producer: ThreadedProducer<AckTimes> =
            settings.create_with_context(AckTimes::default())?;
        let value = vec![b'v'; 100];
        // Warm up: the topic's metadata and one round trip to every partition's leader, so that
        // the figures are not the first records waiting for metadata.
        for partition in 0..self.partitions.load(Ordering::Relaxed) {
            let record = BaseRecord::<(), _, _>::with_opaque_to(&topic, Box::new(Instant::now()))
                .partition(partition)
                .payload(&value);
            producer.send(record).map_err(|(e, _)| e)?;
        }
        let producer = tokio::task::spawn_blocking(move || {
            producer.flush(Duration::from_secs(30)).map(|()| producer)
        })
        .await??;
        producer
            .context()
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        let total = (rate * span.as_secs_f64()) as u64;
        let started = Instant::now();
        let mut i = 0;
        while i < total {
            let by_now = paced(started, rate, total);
            while i < by_now {
                let key = format!("l{i}");
                let now = SystemClock.now_ms().to_string();
                let offset = i.to_string();
                let mut headers = OwnedHeaders::new_with_capacity(7);
                for (k, v) in [
                    ("delay-target", topic.as_str()),
                    ("delay-after", "5000"),
                    ("delay-origin-topic", "delay.bench.plain"),
                    ("delay-origin-partition", "0"),
                    ("delay-origin-offset", &offset),
                    ("delay-due-ms", &now),
                    ("delay-fired-ms", &now),
                ] {
                    headers = headers.insert(Header {
                        key: k,
                        value: Some(v),
                    });
                }
                let record = BaseRecord::with_opaque_to(&topic, Box::new(Instant::now()))
                    .key(&key)
                    .payload(&value)
                    .headers(headers);
                match producer.send(record) {
                    Ok(()) => i += 1,
                    Err((e, _)) if e.rdkafka_error_code() == Some(RDKafkaErrorCode::QueueFull) => {
                        break
                    }
                    Err((e, _)) => return Err(e.into()),
                }
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        stop.store(true, Ordering::Relaxed);
        for task in rest {
            task.await?;
        }
        tokio::task::spawn_blocking(move || {
            let _ = producer.flush(Duration::from_secs(30));
            let acks = std::mem::take(
                &mut *producer
                    .context()
                    .0
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()),
            );
            Ok(PlainLoad {
                rate_per_s: rate,
                acknowledged: acks.len() as u64,
                with_traffic: traffic,
                ack_ms: percentiles(acks),
                linger_ms,
            })
        })
        .await?
    }
}

/// Prints the plain producer's run as a table.
pub(super) fn print(p: &PlainLoad) {
    println!("| plain producer, broker's settings: rate rec/s | rest of the traffic | acknowledged | ack p50 / p99 / p99.9 / max ms | linger ms |");
    println!("|---|---|---|---|---|");
    println!(
        "| {:.0} | {} | {} | {} / {} / {} / {} | {} |",
        p.rate_per_s,
        if p.with_traffic { "yes" } else { "no" },
        p.acknowledged,
        p.ack_ms[0],
        p.ack_ms[1],
        p.ack_ms[2],
        p.ack_ms[3],
        p.linger_ms
    );
}

/// Produces `rate` 100-byte records a second to `topic` for `span`, paced a millisecond at a
/// time, as the lateness run's generator does.
async fn generate(producer: FutureProducer, topic: String, rate: f64, span: Duration) {
    let value = vec![b'v'; 100];
    let total = (rate * span.as_secs_f64()) as u64;
    let started = Instant::now();
    let mut acks = Vec::new();
    let mut i = 0;
    while i < total {
        let by_now = paced(started, rate, total);
        while i < by_now {
            let key = format!("g{i}");
            match producer.send_result(FutureRecord::to(&topic).key(&key).payload(&value)) {
                Ok(ack) => acks.push(ack),
                Err(_) => break, // the local queue is full: again in a millisecond
            }
            i += 1;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    for ack in acks {
        let _ = ack.await;
    }
}

/// Reads with `consumer` until `stop`, doing nothing with the records.
async fn drain(consumer: StreamConsumer, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        let _ = tokio::time::timeout(Duration::from_millis(100), consumer.recv()).await;
    }
}
