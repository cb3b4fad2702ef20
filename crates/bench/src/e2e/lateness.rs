//! The sweep for the highest rate the broker sustains while records are being produced, and
//! the lateness run at a share of it with records pending in RocksDB.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus::Registry;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;

use super::{Lateness, SweepStep};
use crate::harness::{bucket_bounds, config, paced, percentiles, Kafka};
use crate::machine::MachineTicks;
use crate::BenchError;
use kafka_delay::app;
use kafka_delay::kafka;
use kafka_delay_core::clock::{Clock, SystemClock};

/// A sweep step keeps up when every record arrives and fire p99 is within this.
const KEPT_UP_FIRE_P99_MS: u64 = 100;

impl Kafka {
    /// From a fifth of `ceiling` (the broker's throughput rate), up by a quarter per step of
    /// `step_for` while every record fires within 100 ms (p99) of its due time; if the first
    /// step does not keep up, down by a fifth per step until one does. At most eight steps,
    /// none above `ceiling`. Prints a table row per step.
    pub(super) async fn sweep(
        &self,
        ceiling: f64,
        step_for: Duration,
        delay_ms: u64,
    ) -> Result<Vec<SweepStep>, BenchError> {
        println!();
        println!("| sweep rate rec/s | records | received | early | fire p99 ms | kept up | CPU steal % |");
        println!("|---|---|---|---|---|---|---|");
        let mut steps = Vec::new();
        let mut rate = ceiling / 5.0;
        let mut rising = None;
        for step in 0..8 {
            if rate > ceiling {
                break;
            }
            let l = self
                .lateness(&format!(".s{step}"), 0, rate, step_for, delay_ms)
                .await?;
            let s = SweepStep {
                rate_per_s: rate,
                records: l.records,
                received: l.received,
                early: l.early,
                fire_p99_ms: l.fire_ms[1],
                kept_up: l.received == l.records && l.fire_ms[1] <= KEPT_UP_FIRE_P99_MS,
                steal_percent: l.steal_percent,
            };
            println!(
                "| {:.0} | {} | {} | {} | {} | {} | {:.1} |",
                s.rate_per_s,
                s.records,
                s.received,
                s.early,
                s.fire_p99_ms,
                if s.kept_up { "yes" } else { "no" },
                s.steal_percent
            );
            let kept_up = s.kept_up;
            steps.push(s);
            match (*rising.get_or_insert(kept_up), kept_up) {
                (true, true) => rate *= 1.25,
                (false, false) => rate *= 0.8,
                _ => break,
            }
        }
        Ok(steps)
    }

    /// Records due `delay_ms` after they are produced, at `rate` per second for `span`, with
    /// `pending` records waiting in RocksDB.
    pub(super) async fn lateness(
        &self,
        tag: &str,
        pending: u64,
        rate: f64,
        span: Duration,
        delay_ms: u64,
    ) -> Result<Lateness, BenchError> {
        let dir = tempfile::TempDir::new()?;
        crate::fill(&crate::FillArgs {
            data_dir: dir.path().to_owned(),
            count: pending,
            spread: "30d".into(),
            value_bytes: 100,
            target: "bench.lat.idle".into(),
            source: "delay.bench.filled".into(),
        })?;
        let tag = format!("{tag}.{}", self.run).replace('-', "_");
        let (src, dst) = (
            format!("delay.bench.lat{tag}"),
            format!("bench.lat{tag}.out"),
        );
        let (src, dst) = (src.as_str(), dst.as_str());
        let pattern = format!("^delay\\.bench\\.lat{tag}$");
        let group = format!("kd-lat{tag}");
        let mut flags = vec!["--source-pattern", &pattern, "--group-id", &group];
        flags.extend(self.broker_flags.iter().map(String::as_str));
        let config = config(&self.brokers, dir.path(), &flags)?;
        let linger_ms = 5;
        let producer = kafka::producer(&config)?;
        self.create(src, &producer, &config).await;
        self.create(dst, &producer, &config).await;
        // The pending records' target, for the few that come due during the run.
        self.create("bench.lat.idle", &producer, &config).await;
        let probe_topic = format!("bench.lat{tag}.probe");
        self.create(&probe_topic, &producer, &config).await;
        let running = app::start(config, Arc::new(SystemClock), Registry::new()).await?;
        let fired = running.metrics().fire.records.with_label_values(&[dst]);
        // Warm up until the broker consumes: one record, due at once.
        self.fill_topic(src, 1, 100, Some(dst)).await?;
        let warm = Instant::now() + Duration::from_secs(60);
        while fired.get() < 1 && Instant::now() < warm {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let reader: StreamConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .set("group.id", format!("bench-lat-reader{tag}"))
            .set("auto.offset.reset", "earliest")
            .set("fetch.wait.max.ms", "10")
            .create()?;
        reader.subscribe(&[dst])?;
        let total = (rate * span.as_secs_f64()) as u64;
        let clock = SystemClock;
        let collector = tokio::spawn(async move {
            let (mut fire, mut arrival, mut early) = (Vec::new(), Vec::new(), 0u64);
            let deadline = Instant::now() + span + Duration::from_secs(60);
            while (fire.len() as u64) < total && Instant::now() < deadline {
                let Ok(Ok(m)) = tokio::time::timeout(Duration::from_secs(1), reader.recv()).await
                else {
                    continue;
                };
                let now = clock.now_ms();
                if !m.key().is_some_and(|k| k.starts_with(b"l")) {
                    continue; // the warm-up record
                }
                let header = |name: &str| -> Option<u64> {
                    m.headers()?
                        .iter()
                        .find(|h| h.key == name)
                        .and_then(|h| std::str::from_utf8(h.value?).ok()?.parse().ok())
                };
                if let (Some(due), Some(at)) = (header("delay-due-ms"), header("delay-fired-ms")) {
                    if at < due {
                        early += 1;
                    }
                    fire.push(at.saturating_sub(due));
                    arrival.push(now.saturating_sub(due));
                }
            }
            (fire, arrival, early)
        });
        // The load generator batches for up to 50 ms: the embedded cluster searches a
        // partition's message sets linearly on every fetch, so many small batches from the
        // generator would slow Kafka itself down (records are due 5 s after they are produced).
        let p = self.producer(50)?;
        let value = vec![b'v'; 100];
        let delay = delay_ms.to_string();
        let started = Instant::now();
        let machine = MachineTicks::now();
        let produced = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let timeline = tokio::spawn(timeline(
            self.brokers.clone(),
            self.partitions.load(Ordering::Relaxed),
            running.metrics().clone(),
            src.to_owned(),
            dst.to_owned(),
            produced.clone(),
            total,
        ));
        let probing = Arc::new(AtomicBool::new(true));
        let probe = tokio::spawn(probe_acks(producer, probe_topic, probing.clone()));
        let mut acks = Vec::new();
        // Paced a millisecond at a time: a timer per record would cost the producer more CPU
        // than the broker spends on the record.
        let mut i = 0;
        while i < total {
            let by_now = paced(started, rate, total);
            while i < by_now {
                let key = format!("l{i}");
                let rec = FutureRecord::to(src).key(&key).payload(&value).headers(
                    OwnedHeaders::new()
                        .insert(Header {
                            key: "delay-target",
                            value: Some(dst),
                        })
                        .insert(Header {
                            key: "delay-after",
                            value: Some(&delay),
                        }),
                );
                acks.push(p.send_result(rec).map_err(|(e, _)| e)?);
                i += 1;
            }
            produced.store(i, std::sync::atomic::Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        for f in acks {
            f.await?.map_err(|(e, _)| e)?;
        }
        let (fire, arrival, early) = collector.await?;
        let steal_percent = machine.steal_percent_until(MachineTicks::now());
        timeline.abort();
        probing.store(false, Ordering::Relaxed);
        let probe_ack_ms = percentiles(probe.await?);
        let delivery = bucket_bounds(&running.metrics().fire.delivery_lateness);
        let wheel = bucket_bounds(&running.metrics().fire.lateness);
        let produce = bucket_bounds(&running.metrics().fire.produce_round_trip);
        let received = fire.len() as u64;
        running.shutdown().await;
        Ok(Lateness {
            pending,
            rate_per_s: rate,
            records: total,
            received,
            early,
            fire_ms: percentiles(fire),
            arrival_ms: percentiles(arrival),
            delivery_ms_at_most: delivery,
            wheel_ms_at_most: wheel,
            probe_ack_ms,
            produce_ms_at_most: produce,
            delay_ms,
            linger_ms,
            steal_percent,
        })
    }
}

/// Prints the lateness run as a table.
pub(super) fn print(l: &Lateness) {
    println!();
    println!("| pending | rate rec/s | delay ms | records | received | early | wheel p50 / p99 / p99.9 ms (at most) | fire p50 / p99 / p99.9 / max ms | arrival p50 / p99 / p99.9 / max ms | delivery ack p50 / p99 / p99.9 ms (at most) | kafka-delay's produce ack p50 / p99 / p99.9 ms (at most) | plain producer ack p50 / p99 / p99.9 / max ms | linger ms | CPU steal % |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    println!(
        "| {} | {:.0} | {} | {} | {} | {} | {} / {} / {} | {} / {} / {} / {} | {} / {} / {} / {} | {} / {} / {} | {} / {} / {} | {} / {} / {} / {} | {} | {:.1} |",
        l.pending,
        l.rate_per_s,
        l.delay_ms,
        l.records,
        l.received,
        l.early,
        l.wheel_ms_at_most[0],
        l.wheel_ms_at_most[1],
        l.wheel_ms_at_most[2],
        l.fire_ms[0],
        l.fire_ms[1],
        l.fire_ms[2],
        l.fire_ms[3],
        l.arrival_ms[0],
        l.arrival_ms[1],
        l.arrival_ms[2],
        l.arrival_ms[3],
        l.delivery_ms_at_most[0],
        l.delivery_ms_at_most[1],
        l.delivery_ms_at_most[2],
        l.produce_ms_at_most[0],
        l.produce_ms_at_most[1],
        l.produce_ms_at_most[2],
        l.probe_ack_ms[0],
        l.probe_ack_ms[1],
        l.probe_ack_ms[2],
        l.probe_ack_ms[3],
        l.linger_ms,
        l.steal_percent
    );
}

/// Sends one 100-byte record to `topic` every 10 ms, each after the last one's acknowledgement,
/// while `probing`; returns each send-to-acknowledgement time in ms.
async fn probe_acks(producer: FutureProducer, topic: String, probing: Arc<AtomicBool>) -> Vec<u64> {
    let value = [b'p'; 100];
    let mut acks = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while probing.load(Ordering::Relaxed) {
        tick.tick().await;
        let sent = Instant::now();
        let record = FutureRecord::<(), _>::to(&topic).payload(&value[..]);
        if producer.send(record, Duration::ZERO).await.is_ok() {
            acks.push(sent.elapsed().as_millis() as u64);
        }
    }
    acks
}

/// Prints, once a second on stderr, how far each stage of the lateness run has got: produced
/// (handed to the test producer), in Kafka (the source topic's high watermarks), ingested, fired,
/// and the broker's pending and wheel gauges.
async fn timeline(
    brokers: String,
    partitions: i32,
    metrics: kafka_delay::metrics::Metrics,
    src: String,
    dst: String,
    produced: Arc<std::sync::atomic::AtomicU64>,
    total: u64,
) {
    let started = Instant::now();
    let Ok(watcher) = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create::<rdkafka::consumer::BaseConsumer>()
    else {
        return;
    };
    let watcher = Arc::new(watcher);
    eprintln!("   s  produced  in Kafka  ingested     fired   pending     wheel");
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let w = watcher.clone();
        let topic = src.clone();
        let in_kafka = tokio::task::spawn_blocking(move || {
            (0..partitions)
                .filter_map(|p| w.fetch_watermarks(&topic, p, Duration::from_secs(1)).ok())
                .map(|(_, high)| high)
                .sum::<i64>()
        })
        .await
        .unwrap_or(-1);
        let fired = metrics.fire.records.with_label_values(&[&dst]).get();
        eprintln!(
            "{:4.0} {:9} {:9} {:9} {:9} {:9} {:9}",
            started.elapsed().as_secs_f64(),
            produced.load(std::sync::atomic::Ordering::Relaxed),
            in_kafka,
            metrics.ingest.records.with_label_values(&[&src]).get(),
            fired,
            metrics.pending.records.get(),
            metrics.wheel.entries.get(),
        );
        if fired > total {
            return;
        }
    }
}
