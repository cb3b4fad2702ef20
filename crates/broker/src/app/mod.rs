//! Wires the broker together and runs it: store -> HTTP -> the durability mode, chosen and
//! started -> Kafka clients -> scheduler and publisher -> recovery -> ingest -> ready.
//! [`Running::shutdown`] stops it in the reverse order.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use prometheus::Registry;
use rdkafka::consumer::StreamConsumer;
use rdkafka::producer::{FutureProducer, Producer as _};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::config::{millis, Config};
use crate::dead_letter::DeadLetters;
use crate::durability::{Context, Durability, DurabilityError, Prepared};
use crate::http::{self, Health};
use crate::ingest::{self, Durable, Ingest, IngestContext};
use crate::kafka::{self, KafkaSetupError};
use crate::kafka_clock::HeldBack;
use crate::metrics::{Labels, Metrics};
use crate::publish::history::History;
use crate::publish::reports::{publish_producer, PublishProducer, Reports};
use crate::publish::{Delivery, Publisher, RetryPolicy};
use crate::scheduler::{Due, Inserts, Scheduler, Wake};
use crate::slice;
use crate::store::{Store, StoreError, StoreOptions};
use crate::{admin, publish};
use kafka_delay_core::clock::Clock;
use kafka_delay_core::record::Reason;

mod running;
pub use running::Running;

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
    /// The durability mode: a changelog topic that cannot hold the pending state, a cluster
    /// that cannot run transactions.
    #[error(transparent)]
    Durability(#[from] DurabilityError),
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

/// What every part of a running broker shares.
#[derive(Clone)]
struct Shared {
    store: Arc<Store>,
    metrics: Metrics,
    /// The wall clock held back to the Kafka cluster's: every part's time.
    clock: Arc<HeldBack>,
    health: Health,
    /// New timers for the scheduler (new records, retries, operators' moves).
    inserts: Inserts,
    /// The most recently fired records, for the console.
    history: History,
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
    let health = Health::default();
    health.store_healthy.store(true, Ordering::Relaxed);
    let (stop_ingest, stop_ingest_rx) = watch::channel(false);
    let (stop_rest, stop_rest_rx) = watch::channel(false);
    let (inserts, insert_rx) = mpsc::channel::<Wake>(1_024);
    let store = open_store(&config).await?;
    let metrics = new_metrics(&registry)?;
    let (prepared, shared, http, http_addr) = prepare(
        &config,
        (store, metrics, HeldBack::learning(clock), health, inserts),
        &registry,
        stop_rest_rx.clone(),
    )
    .await?;

    let producer = kafka::producer(&config)?;
    kafka::ensure_dead_letter_topic(&config, &producer).await?;
    prepared.check_cluster().await?;
    let (consumer, durability) =
        start_durability(&config, &shared, prepared, stop_ingest_rx.clone()).await?;
    // The counts by target and due time were restored when the store was opened; the wheel
    // reads what is due within the horizon and reports itself armed.
    let recovered = shared.store.pending();
    let (due_tx, due_rx) = mpsc::channel(64);
    let (scheduler, mut armed) =
        start_scheduler(&config, &shared, insert_rx, due_tx, stop_rest_rx.clone())?;
    let publishing = Publishing {
        producer: &producer,
        delivery: durability.delivery.clone(),
    };
    let (ingest_producer, publisher) =
        start_publishing(&config, &shared, publishing, due_rx, stop_rest_rx).await?;

    wait_armed(&config, &shared, &mut armed, recovered).await;
    let (broken_tx, broken) = watch::channel(None);
    let ingest = start_ingest(
        &config,
        &shared,
        (producer, ingest_producer),
        (consumer, durability.ingest.clone()),
        (stop_ingest_rx, broken_tx),
    )
    .await?;
    shared.health.ready.store(true, Ordering::Relaxed);
    shared.metrics.broker.ready.set(1);
    info!(recovered, "ready");
    Ok(Running {
        stop_ingest,
        stop_rest,
        ingest,
        broken,
        scheduler,
        publisher,
        http,
        http_addr,
        durability,
        store: shared.store,
        metrics: shared.metrics,
        health: shared.health,
    })
}

/// The ingest consumer (not yet subscribed) and the durability mode, started: what it runs
/// alongside ingest (the restore and standby tasks, the transaction loop) runs from here on.
async fn start_durability(
    config: &Config,
    shared: &Shared,
    prepared: Prepared,
    stop: watch::Receiver<bool>,
) -> Result<(Arc<StreamConsumer<IngestContext>>, Durability), StartError> {
    let consumer = Arc::new(ingest::consumer(
        config,
        shared.metrics.clone(),
        prepared.rebalance(),
        prepared.client_id().as_deref(),
        prepared.consumer_defaults(),
    )?);
    let durability = prepared
        .start(Context {
            consumer: consumer.clone(),
            inserts: shared.inserts.clone(),
            clock: shared.clock.clone(),
            stop,
            history: shared.history.clone(),
        })
        .await?;
    Ok((consumer, durability))
}

/// Binds the HTTP address, picks the durability mode and serves the HTTP API (health,
/// metrics, admin): what needs the address before the Kafka clients are made.
async fn prepare(
    config: &Config,
    (store, metrics, clock, health, inserts): (Arc<Store>, Metrics, Arc<HeldBack>, Health, Inserts),
    registry: &Registry,
    stop: watch::Receiver<bool>,
) -> Result<(Prepared, Shared, JoinHandle<()>, SocketAddr), StartError> {
    let (listener, http_addr) =
        http::bind(config.http.addr)
            .await
            .map_err(|source| StartError::Http {
                addr: config.http.addr,
                source,
            })?;
    // Said before the cluster is asked anything: a cluster that does not answer shows here.
    info!(%http_addr, data_dir = %config.store.data_dir.display(), brokers = %config.kafka.brokers,
          kafka_config = ?config.kafka.properties, "kafka-delay starting");
    let advertised = http::advertised(config.http.advertised.as_deref(), http_addr);
    let parts = (store.clone(), metrics.clone(), clock.kafka().clone());
    let prepared = Prepared::new(config, parts, advertised).await?;
    let shared = Shared {
        store,
        metrics,
        clock,
        health,
        inserts,
        history: History::default(),
    };
    let http = start_http(
        config,
        &shared,
        registry,
        prepared.cluster(),
        listener,
        stop,
    );
    Ok((prepared, shared, http, http_addr))
}

/// What the publisher is built from besides the shared parts.
struct Publishing<'a> {
    producer: &'a FutureProducer,
    delivery: Arc<dyn Delivery>,
}

/// The producers of the fire side and the publisher's task; returns the ingest side's own
/// producer too (all three get their producer ids at once).
async fn start_publishing(
    config: &Config,
    shared: &Shared,
    publishing: Publishing<'_>,
    due_rx: mpsc::Receiver<Vec<Due>>,
    stop: watch::Receiver<bool>,
) -> Result<(FutureProducer, JoinHandle<()>), StartError> {
    let producer = publishing.producer;
    let (reports, completions) = Reports::new(shared.clock.clone());
    let publish_producer = publish_producer(config, reports.clone())?;
    // Its own producer: dead letters of bad input are acknowledged without waiting behind the
    // deliveries in flight on the fire side.
    let ingest_producer = kafka::producer(config)?;
    request_producer_ids(
        &config.topics.dead_letter,
        producer.clone(),
        publish_producer.clone(),
        ingest_producer.clone(),
    )
    .await;
    let publisher = publisher(config, shared, publishing, publish_producer, reports);
    Ok((
        ingest_producer,
        tokio::spawn(publisher.run(due_rx, stop, completions)),
    ))
}

/// Waits until the wheel holds what is due within the horizon, and says so.
async fn wait_armed(
    config: &Config,
    shared: &Shared,
    armed: &mut watch::Receiver<bool>,
    recovered: u64,
) {
    let started = Instant::now();
    let _ = armed.wait_for(|a| *a).await;
    info!(
        in_wheel = shared.metrics.wheel.loaded.get(),
        horizon_ms = millis(config.wheel.horizon),
        seconds = format!("{:.3}", started.elapsed().as_secs_f64()),
        "timing wheel armed"
    );
    shared.metrics.broker.recovered.set(recovered as i64);
    shared
        .metrics
        .pending
        .records
        .set(shared.store.pending() as i64);
}

/// The broker's metrics, their labels starting with every reason, error kind and admin action.
fn new_metrics(registry: &Registry) -> Result<Metrics, StartError> {
    let reasons: Vec<&str> = Reason::ALL.iter().map(|r| r.code()).collect();
    Ok(Metrics::new(
        registry,
        &Labels {
            reasons: &reasons,
            produce_errors: &publish::ERROR_KINDS,
            admin_actions: &admin::ACTIONS,
            admin_outcomes: &admin::OUTCOMES,
        },
    )?)
}

/// Opens RocksDB on a blocking thread (recovery reads the counts back).
async fn open_store(config: &Config) -> Result<Arc<Store>, StartError> {
    let dir = config.store.data_dir.clone();
    let opts = StoreOptions {
        sync: config.store.sync,
        keep_within_ms: millis(config.store.keep_within),
        keep_bytes: config.store.keep_bytes,
    };
    Ok(Arc::new(
        tokio::task::spawn_blocking(move || Store::open(&dir, opts))
            .await
            .expect("store open task")?,
    ))
}

/// Serves `/metrics`, the health checks, the admin API and the console.
fn start_http(
    config: &Config,
    shared: &Shared,
    registry: &Registry,
    cluster: Arc<dyn admin::Cluster>,
    listener: tokio::net::TcpListener,
    stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let on_scrape: http::OnScrape = {
        let Shared {
            store,
            metrics,
            clock,
            health,
            ..
        } = shared.clone();
        Arc::new(move || {
            let healthy = health.store_healthy.load(Ordering::Relaxed);
            metrics.refresh_from_store(&store, clock.now_ms(), healthy);
            (metrics.broker.clock_ahead).set(clock.ahead_us() as f64 / 1e6);
        })
    };
    let console = admin::console::Console::new(config, shared.history.clone());
    console.spawn_minutes(&shared.metrics, shared.clock.clone(), stop.clone());
    let admin = admin::Admin {
        store: shared.store.clone(),
        scheduler: shared.inserts.clone(),
        clock: shared.clock.clone(),
        metrics: shared.metrics.clone(),
        token: config.http.admin_token.as_ref().map(|s| s.0.clone()),
        loopback: config.http.addr.ip().is_loopback(),
        max_delay_ms: config.contract.max_delay_ms,
        console,
        cluster,
    };
    if !admin.loopback && admin.token.is_none() {
        warn!(addr = %config.http.addr,
              "the admin API is off: the HTTP server listens beyond loopback and no --admin-token is set");
    }
    http::serve(
        listener,
        shared.health.clone(),
        registry.clone(),
        on_scrape,
        admin::router(admin),
        stop,
    )
}

/// The wheel's own thread and timer: under load, a timer on the shared runtime waits for a
/// worker to finish what it is polling (ingest's batches, the publisher), which showed as
/// milliseconds of lateness at the wheel. Returns the thread and a signal that the wheel is
/// armed (recovery loaded what is due within the horizon).
fn start_scheduler(
    config: &Config,
    shared: &Shared,
    inserts: mpsc::Receiver<Wake>,
    due: mpsc::Sender<Vec<Due>>,
    stop: watch::Receiver<bool>,
) -> Result<(std::thread::JoinHandle<()>, watch::Receiver<bool>), StartError> {
    let scheduler = Scheduler::new(
        shared.clock.clone(),
        shared.metrics.clone(),
        shared.store.clone(),
        millis(config.wheel.horizon),
    );
    let armed = scheduler.armed();
    let timer = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .map_err(StartError::Scheduler)?;
    let slice_wanted = config.wheel.scheduler_slice;
    let thread = std::thread::Builder::new()
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
            timer.block_on(scheduler.run(inserts, due, stop))
        })
        .map_err(StartError::Scheduler)?;
    Ok((thread, armed))
}

/// The publisher: due records to their targets, through the fire limits.
fn publisher(
    config: &Config,
    shared: &Shared,
    publishing: Publishing<'_>,
    publish_producer: PublishProducer,
    reports: Reports,
) -> Publisher {
    let Publishing { producer, delivery } = publishing;
    Publisher {
        store: shared.store.clone(),
        producer: publish_producer,
        reports,
        dead: DeadLetters::new(
            producer.clone(),
            config.topics.dead_letter.clone(),
            shared.metrics.clone(),
        ),
        metrics: shared.metrics.clone(),
        clock: shared.clock.clone(),
        retries: shared.inserts.clone(),
        policy: RetryPolicy {
            max_attempts: config.fire.max_attempts,
            backoff_max_ms: millis(config.fire.backoff_max),
        },
        in_flight: config.fire.in_flight,
        limits: Arc::new(config.fire.limits.clone()),
        history: shared.history.clone(),
        delivery,
    }
}

/// Creates the retry topic when missing and starts consuming the delay topics, each partition
/// from where the durability mode says.
async fn start_ingest(
    config: &Config,
    shared: &Shared,
    (producer, ingest_producer): (FutureProducer, FutureProducer),
    (consumer, durability): (Arc<StreamConsumer<IngestContext>>, Arc<dyn Durable>),
    (stop, broken): (watch::Receiver<bool>, watch::Sender<Option<ingest::Broken>>),
) -> Result<JoinHandle<()>, StartError> {
    let next_offsets = {
        let d = durability.clone();
        tokio::task::spawn_blocking(move || d.start_offsets())
            .await
            .expect("offsets task")?
    };
    if let Some(topic) = &config.topics.retry {
        if let Err(e) =
            kafka::ensure_topic(config, &producer, topic, config.topics.partitions).await
        {
            warn!(%topic, error = %e, "the retry topic does not exist and could not be created");
        }
    }
    ingest::subscribe(config, &consumer)?;
    let coverage = ingest::coverage::watch(config, &consumer, &stop);
    let ingest = Ingest {
        consumer,
        durability,
        store: shared.store.clone(),
        contract: config.contract.clone(),
        clock: shared.clock.clone(),
        metrics: shared.metrics.clone(),
        scheduler: shared.inserts.clone(),
        dead: DeadLetters::new(
            ingest_producer,
            config.topics.dead_letter.clone(),
            shared.metrics.clone(),
        ),
        next_offsets,
        store_healthy: shared.health.store_healthy.clone(),
        dead_letter_topics: ingest::TopicCreator::new(Arc::new(config.clone()), producer),
        stopping: None,
        broken,
    };
    Ok(tokio::spawn(coverage.alongside(ingest.run(stop))))
}
