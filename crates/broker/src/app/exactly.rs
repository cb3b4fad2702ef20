//! Starting exactly-once firing: the transactional producer and its loop, handed to the
//! handoff, where ingest and the publisher find it.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::producer::FutureProducer;
use tracing::info;

use super::StartError;
use crate::changelog::handoff::Handoff;
use crate::config::{millis, Config};
use crate::ingest::IngestContext;
use crate::kafka::transactional_producer_config;
use crate::store::Store;
use crate::txn::{Cut, Setup, Transactions};

/// Longest a commit, abort or offset send may block.
const TRANSACTION_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// With `--exactly-once`: initializes the transactional producer (fencing whatever a previous
/// run of this instance left open) and starts the loop. Fails when the cluster cannot run
/// transactions.
pub(super) async fn start(
    config: &Config,
    store: &Arc<Store>,
    handoff: &Arc<Handoff>,
    consumer: &Arc<StreamConsumer<IngestContext>>,
    metrics: crate::metrics::Metrics,
) -> Result<(), StartError> {
    let Some(id) = config.cluster.transactional_id.clone() else {
        return Ok(());
    };
    let producer_config = transactional_producer_config(config, &id);
    let renew = {
        let c = producer_config.clone();
        Arc::new(move || c.create::<FutureProducer>())
    };
    let producer: FutureProducer =
        producer_config
            .create()
            .map_err(|source| crate::kafka::KafkaSetupError::Client {
                client: "transactional producer",
                source,
            })?;
    let group = {
        let c = consumer.clone();
        Arc::new(move || c.group_metadata())
    };
    let owned = {
        let s = store.clone();
        Arc::new(move |pid| s.owns(pid))
    };
    let setup = Setup {
        group,
        cut: Cut {
            interval: config.cluster.transaction_interval,
            max_records: config.cluster.transaction_records,
            timeout: TRANSACTION_CALL_TIMEOUT,
        },
        owned: Some(owned),
        renew: Some(renew),
        observe: Some(Arc::new(move |outcome, took| {
            metrics
                .broker
                .transactions
                .with_label_values(&[outcome])
                .inc();
            metrics
                .broker
                .transaction_seconds
                .observe(took.as_secs_f64());
        })),
    };
    let started = tokio::task::spawn_blocking(move || Transactions::start(producer, setup))
        .await
        .map_err(|e| StartError::Transactions(e.to_string()))?;
    let (transactions, _task) =
        started.map_err(|e| StartError::Transactions(crate::txn::cannot_run(&e)))?;
    store.protect_claimed();
    handoff.set_transactions(transactions);
    info!(transactional_id = %id, records = config.cluster.transaction_records,
          interval_ms = millis(config.cluster.transaction_interval),
          "exactly-once: records fire in transactions");
    Ok(())
}
