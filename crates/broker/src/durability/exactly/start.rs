//! Starting the exactly-once mode: the transactional producer and its loop, before ingest or
//! the publisher can hand it anything.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::Consumer;
use tokio::task::JoinHandle;
use tracing::info;

use super::{Consumed, Exactly};
use crate::config::{millis, Config};
use crate::durability::due::AtIngest;
use crate::durability::{Context, DurabilityError, Grouped};
use crate::kafka::{transactional_producer_config, KafkaSetupError};
use crate::metrics::Metrics;
use crate::store::Store;
use crate::txn::{lookup, Cut, Placed, Setup, Transactions};

/// Longest a commit call, an abort or an offset send may block.
const TRANSACTION_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The transaction timeout `config` gives its producer (librdkafka's default when unset).
fn transaction_timeout(config: &rdkafka::ClientConfig) -> Duration {
    let ms = config
        .get("transaction.timeout.ms")
        .and_then(|v| v.parse().ok());
    Duration::from_millis(ms.unwrap_or(LIBRDKAFKA_TRANSACTION_TIMEOUT_MS))
}

/// librdkafka's default `transaction.timeout.ms`.
const LIBRDKAFKA_TRANSACTION_TIMEOUT_MS: u64 = 60_000;

/// Initializes the transactional producer (fencing whatever a previous run of this instance
/// left open) and starts the loop; returns the mode and the loop's task.
///
/// # Errors
/// The cluster cannot run transactions, or the producer cannot be made.
pub(in crate::durability) async fn start(
    config: &Config,
    id: &str,
    store: &Arc<Store>,
    (grouped, consumed): (Arc<Grouped>, Arc<Consumed>),
    cx: &Context,
    metrics: &Metrics,
) -> Result<(Arc<Exactly>, JoinHandle<()>), DurabilityError> {
    let producer_config = transactional_producer_config(config, id);
    let renew = {
        let c = producer_config.clone();
        Arc::new(move || crate::txn::producer(&c))
    };
    let producer =
        crate::txn::producer(&producer_config).map_err(|source| KafkaSetupError::Client {
            client: "transactional producer",
            source,
        })?;
    let group = {
        let c = cx.consumer.clone();
        Arc::new(move || c.group_metadata())
    };
    let owned = {
        let s = store.clone();
        Arc::new(move |pid| s.owned_since(pid))
    };
    let lookup = {
        let changelog = grouped.changelog().clone();
        let mut client = crate::kafka::base_config(config);
        client.set("group.id", config.kafka.restore_group());
        let within = Cut::stuck_after(transaction_timeout(&producer_config));
        // Every transaction writes to the changelog (entries, or a tombstone for each record
        // fired or dead-lettered), which this instance can read.
        Arc::new(move |placed: &[Placed]| {
            let on_changelog = placed.iter().find(|p| changelog.is_changelog(&p.0))?;
            lookup::committed(&client, on_changelog, within)
        })
    };
    let observed = metrics.clone();
    let setup = Setup {
        group,
        cut: Cut {
            interval: config.cluster.transaction_interval,
            max_records: config.cluster.transaction_records,
            timeout: TRANSACTION_CALL_TIMEOUT,
            commit_wait: TRANSACTION_CALL_TIMEOUT,
            stuck: Cut::stuck_after(transaction_timeout(&producer_config)),
        },
        owned: Some(owned),
        renew: Some(renew),
        kafka_clock: Some(grouped.changelog().kafka_clock().clone()),
        lookup: Some(lookup),
        #[cfg(feature = "failpoints")]
        lose_answers: Arc::default(),
        observe: Some(Arc::new(move |outcome, took| {
            observed
                .broker
                .transactions
                .with_label_values(&[outcome])
                .inc();
            observed
                .broker
                .transaction_seconds
                .observe(took.as_secs_f64());
        })),
    };
    let started = tokio::task::spawn_blocking(move || Transactions::start(producer, setup))
        .await
        .map_err(|e| DurabilityError::Task {
            what: "transactional producer start",
            detail: e.to_string(),
        })?;
    let (transactions, task) =
        started.map_err(|e| DurabilityError::Transactions(crate::txn::cannot_run(&e)))?;
    store.protect_claimed();
    info!(transactional_id = %id, records = config.cluster.transaction_records,
          interval_ms = millis(config.cluster.transaction_interval),
          "exactly-once: records fire in transactions");
    let at_ingest = AtIngest::new(config, cx, metrics);
    let exactly = Exactly {
        grouped,
        transactions,
        consumed,
        at_ingest,
        max_group: config.cluster.transaction_records,
        broken: std::sync::Mutex::default(),
    };
    Ok((Arc::new(exactly), task))
}
