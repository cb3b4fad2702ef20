//! Wires the broker together and runs it: store -> HTTP -> Kafka clients -> scheduler and
//! publisher -> recovery -> ingest -> ready. [`Running::shutdown`] stops it in the reverse order.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use prometheus::Registry;
use rdkafka::producer::{FutureProducer, Producer as _};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::clock::Clock;
use crate::config::{millis, Config};
use crate::dead_letter::DeadLetters;
use crate::http::{self, Health};
use crate::ingest::{self, Ingest};
use crate::kafka::{self, KafkaSetupError};
use crate::metrics::Metrics;
use crate::publish::reports::{PublishProducer, Reports};
use crate::publish::{Publisher, RetryPolicy};
use crate::scheduler::{Scheduler, Wake};
use crate::slice;
use crate::store::{Store, StoreError, StoreOptions};

/// Why the broker could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// RocksDB.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Kafka.
    #[error(transparent)]
    Kafka(#[from] KafkaSetupError),
    /// The HTTP address.
    #[error("cannot listen on {addr}: {source} (change --http-addr)")]
    Http {
        /// The address.
        addr: SocketAddr,
        /// The bind error.
        source: std::io::Error,
    },
    /// The scheduler's thread or its timer.
    #[error("cannot start the scheduler's thread: {0}")]
    Scheduler(std::io::Error),
    /// Metrics registration.
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

/// Has each idempotent producer get its id now (blocking requests, the three at once), so that
/// the first deliveries and dead letters are not held back until librdkafka's retry timer
/// ([`kafka::request_producer_id`]).
async fn request_producer_ids(
    topic: &str,
    general: FutureProducer,
    publish: PublishProducer,
    ingest: FutureProducer,
) {
    let topic = topic.to_owned();
    let _ = tokio::task::spawn_blocking(move || {
        std::thread::scope(|s| {
            s.spawn(|| kafka::request_producer_id(general.client(), &topic));
            s.spawn(|| kafka::request_producer_id(publish.client(), &topic));
            kafka::request_producer_id(ingest.client(), &topic);
        });
    })
    .await;
}

/// A started broker.
#[derive(Debug)]
pub struct Running {
    stop_ingest: watch::Sender<bool>,
    stop_rest: watch::Sender<bool>,
    ingest: JoinHandle<()>,
    scheduler: std::thread::JoinHandle<()>,
    publisher: JoinHandle<()>,
    http: JoinHandle<()>,
    http_addr: SocketAddr,
    store: Arc<Store>,
    metrics: Metrics,
    health: Health,
}

/// Starts the broker and returns once it is ready (recovery done, consumer subscribed).
///
/// # Errors
/// A [`StartError`] naming what could not be set up.
pub async fn start(
    config: Config,
    clock: Arc<dyn Clock>,
    registry: Registry,
) -> Result<Running, StartError> {
    let metrics = Metrics::new(&registry)?;
    let health = Health::default();
    health.store_healthy.store(true, Ordering::Relaxed);
    let store = {
        let dir = config.store.data_dir.clone();
        let opts = StoreOptions {
            sync: config.store.sync,
            keep_within_ms: millis(config.store.keep_within),
            keep_bytes: config.store.keep_bytes,
        };
        Arc::new(
            tokio::task::spawn_blocking(move || Store::open(&dir, opts))
                .await
                .expect("store open task")?,
        )
    };
    let (stop_ingest, stop_ingest_rx) = watch::channel(false);
    let (stop_rest, stop_rest_rx) = watch::channel(false);
    let on_scrape: http::OnScrape = {
        let (store, metrics, clock, health) = (
            store.clone(),
            metrics.clone(),
            clock.clone(),
            health.clone(),
        );
        Arc::new(move || {
            let healthy = health.store_healthy.load(Ordering::Relaxed);
            metrics.refresh_from_store(&store, clock.now_ms(), healthy);
        })
    };
    let (insert_tx, insert_rx) = mpsc::channel::<Wake>(1_024);
    let history = crate::publish::history::History::default();
    let console = console(&config, history.clone());
    spawn_minutes(&console, &metrics, clock.clone(), stop_rest_rx.clone());
    let admin = crate::admin::Admin {
        store: store.clone(),
        scheduler: insert_tx.clone(),
        clock: clock.clone(),
        metrics: metrics.clone(),
        token: config.http.admin_token.as_ref().map(|s| s.0.clone()),
        loopback: config.http.addr.ip().is_loopback(),
        max_delay_ms: config.contract.max_delay_ms,
        console,
    };
    if !admin.loopback && admin.token.is_none() {
        warn!(addr = %config.http.addr,
              "the admin API is off: the HTTP server listens beyond loopback and no --admin-token is set");
    }
    let (http_addr, http_task) = http::serve(
        config.http.addr,
        health.clone(),
        registry.clone(),
        on_scrape,
        crate::admin::router(admin),
        stop_rest_rx.clone(),
    )
    .await
    .map_err(|source| StartError::Http {
        addr: config.http.addr,
        source,
    })?;
    info!(%http_addr, data_dir = %config.store.data_dir.display(), brokers = %config.kafka.brokers,
          kafka_config = ?config.kafka.properties, "kafka-delay starting");

    let producer = kafka::producer(&config)?;
    kafka::ensure_dead_letter_topic(&config, &producer).await?;
    let dead = DeadLetters::new(
        producer.clone(),
        config.topics.dead_letter.clone(),
        metrics.clone(),
    );

    let (due_tx, due_rx) = mpsc::channel(64);
    // The counts by target and due time were restored when the store was opened; the wheel
    // reads what is due within the horizon and reports itself armed.
    let recovered = store.pending();
    let scheduler = Scheduler::new(
        clock.clone(),
        metrics.clone(),
        store.clone(),
        millis(config.wheel.horizon),
    );
    let mut armed = scheduler.armed();
    // The wheel's own thread and timer: under load, a timer on the shared runtime waits for a
    // worker to finish what it is polling (ingest's batches, the publisher), which showed as
    // milliseconds of lateness at the wheel.
    let timer = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .map_err(StartError::Scheduler)?;
    let stop_scheduler = stop_rest_rx.clone();
    let slice_wanted = config.wheel.scheduler_slice;
    let scheduler = std::thread::Builder::new()
        .name("scheduler".into())
        .spawn(move || {
            // A slice of its own gets the thread onto a core soon after its timer fires when
            // the machine is busy (crate::slice).
            if let Some(want) = slice_wanted {
                match slice::request(want) {
                    Ok(Some(s)) => info!(slice_us = s.as_micros(), "scheduler thread's time slice"),
                    Ok(None) => {
                        info!("the kernel keeps its own time slice for the scheduler thread")
                    }
                    Err(e) => warn!(error = %e, "cannot set the scheduler thread's time slice"),
                }
            }
            timer.block_on(scheduler.run(insert_rx, due_tx, stop_scheduler))
        })
        .map_err(StartError::Scheduler)?;
    let (reports, completions) = Reports::new(clock.clone());
    let publish_producer = kafka::publish_producer(&config, reports.clone())?;
    // Its own producer: dead letters of bad input are acknowledged without waiting behind the
    // deliveries in flight on the fire side.
    let ingest_producer = kafka::producer(&config)?;
    request_producer_ids(
        &config.topics.dead_letter,
        producer.clone(),
        publish_producer.clone(),
        ingest_producer.clone(),
    )
    .await;
    let publisher = Publisher {
        store: store.clone(),
        producer: publish_producer,
        reports,
        dead: dead.clone(),
        metrics: metrics.clone(),
        clock: clock.clone(),
        retries: insert_tx.clone(),
        policy: RetryPolicy {
            max_attempts: config.fire.max_attempts,
            backoff_max_ms: millis(config.fire.backoff_max),
        },
        in_flight: config.fire.in_flight,
        limits: Arc::new(config.fire.limits.clone()),
        history: history.clone(),
    };
    let publisher = tokio::spawn(publisher.run(due_rx, stop_rest_rx, completions));

    let started = Instant::now();
    let _ = armed.wait_for(|a| *a).await;
    info!(
        in_wheel = metrics.wheel_loaded.get(),
        horizon_ms = millis(config.wheel.horizon),
        seconds = format!("{:.3}", started.elapsed().as_secs_f64()),
        "timing wheel armed"
    );
    metrics.recovered.set(recovered as i64);
    metrics.pending.set(store.pending() as i64);

    let next_offsets = {
        let s = store.clone();
        tokio::task::spawn_blocking(move || s.next_offsets())
            .await
            .expect("offsets task")?
    };
    if let Some(topic) = &config.topics.retry {
        if let Err(e) =
            kafka::ensure_topic(&config, &producer, topic, config.topics.partitions).await
        {
            warn!(%topic, error = %e, "the retry topic does not exist and could not be created");
        }
    }
    let consumer = ingest::consumer(&config, store.clone(), metrics.clone())?;
    let ingest = Ingest {
        consumer: Arc::new(consumer),
        store: store.clone(),
        contract: config.contract.clone(),
        clock,
        metrics: metrics.clone(),
        scheduler: insert_tx,
        dead: DeadLetters::new(
            ingest_producer,
            config.topics.dead_letter.clone(),
            metrics.clone(),
        ),
        next_offsets,
        store_healthy: health.store_healthy.clone(),
        dead_letter_topics: ingest::TopicCreator::new(Arc::new(config.clone()), producer.clone()),
        max_group: ingest::max_group(config.store.sync),
        stopping: None,
    };
    let ingest = tokio::spawn(ingest.run(stop_ingest_rx));
    health.ready.store(true, Ordering::Relaxed);
    metrics.ready.set(1);
    info!(recovered, "ready");
    Ok(Running {
        stop_ingest,
        stop_rest,
        ingest,
        scheduler,
        publisher,
        http: http_task,
        http_addr,
        store,
        metrics,
        health,
    })
}

impl Running {
    /// The bound HTTP address.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The store.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// Stops consuming (committing offsets), stops the scheduler, finishes the deliveries in
    /// flight, flushes the producer and closes RocksDB cleanly.
    pub async fn shutdown(self) {
        info!("shutting down: stopping ingest");
        self.health.ready.store(false, Ordering::Relaxed);
        let _ = self.stop_ingest.send(true);
        let _ = self.ingest.await;
        info!("ingest stopped; finishing deliveries in flight");
        let _ = self.stop_rest.send(true);
        let scheduler = self.scheduler;
        let _ = tokio::task::spawn_blocking(move || scheduler.join()).await;
        let _ = self.publisher.await;
        let _ = self.http.await;
        let store = self.store;
        let flushed = tokio::task::spawn_blocking(move || {
            let r = store.flush();
            drop(store);
            r
        })
        .await;
        match flushed {
            Ok(Ok(())) => info!("RocksDB closed; stopped"),
            other => {
                warn!(result = ?other.map(|r| r.map_err(|e| e.to_string())), "RocksDB flush at shutdown failed")
            }
        }
    }
}

/// What the web console reads besides the store.
fn console(config: &Config, history: crate::publish::history::History) -> crate::console::Console {
    use crate::console::dead_letters::{template_regex, Source};
    let retry = &config.contract.retry;
    let templates = std::iter::once(&retry.default)
        .chain(retry.by_target.iter().map(|(_, p)| p))
        .filter_map(|p| template_regex(&p.dead_letter))
        .collect();
    crate::console::Console {
        history,
        dead_letters: Source {
            brokers: config.kafka.brokers.clone(),
            kafka_config: config.kafka.properties.clone(),
            topic: config.topics.dead_letter.clone(),
            templates,
        },
        replays: crate::console::replays::Replays::default(),
        minutes: crate::console::minutes::Minutes::default(),
        instance_id: config.kafka.instance_id.clone(),
        group_id: config.kafka.group_id.clone(),
        http_addr: config.http.addr.to_string(),
    }
}

/// Samples the fired and dead-lettered totals every 10 s for the console's per-minute counts.
fn spawn_minutes(
    console: &crate::console::Console,
    metrics: &Metrics,
    clock: Arc<dyn Clock>,
    mut stop: watch::Receiver<bool>,
) {
    let (minutes, metrics) = (console.minutes.clone(), metrics.clone());
    tokio::spawn(async move {
        loop {
            minutes.sample(
                clock.now_ms(),
                crate::console::total(&metrics.fired),
                crate::console::total(&metrics.dead_lettered),
            );
            tokio::select! {
                _ = stop.changed() => return,
                _ = tokio::time::sleep(std::time::Duration::from_secs(10)) => {}
            }
        }
    });
}
