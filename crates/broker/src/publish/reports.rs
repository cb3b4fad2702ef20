//! Delivery reports, straight from librdkafka's polling thread into the completion task.
//!
//! Each produced record carries what its outcome needs (its id, the record, the in-flight
//! permit) as the delivery opaque, one allocation that the produce call also borrows the
//! record's topic, key and value from; the producer's context turns the report into an
//! [`Outcome`] and sends it on one channel. No task or future per record, and the
//! acknowledgement time is taken when the report arrives.

use std::sync::Arc;

use rdkafka::message::DeliveryResult;
use rdkafka::producer::{ProducerContext, ThreadedProducer};
use rdkafka::ClientContext;
use tokio::sync::{mpsc, OwnedSemaphorePermit};

use super::Outcome;
use crate::config::Config;
use crate::kafka::{producer_config, KafkaSetupError};
use crate::store::ReadMark;
use kafka_delay_core::clock::Clock;
use kafka_delay_core::id::RecordId;
use kafka_delay_core::record::StoredRecord;

/// A record handed to the producer, until its outcome has been handled (it holds the
/// in-flight permit until then).
#[derive(Debug)]
pub struct Sent {
    pub(crate) id: RecordId,
    pub(crate) record: StoredRecord,
    /// Held, not read: the in-flight slot goes back when the last handle is dropped.
    pub(crate) _permit: OwnedSemaphorePermit,
    /// When it was handed to the producer (epoch ms; its `delay-fired-ms`).
    pub(crate) sent_ms: u64,
    /// When the fire limits let it go (epoch ms): its due time when none held it.
    pub(crate) released_ms: u64,
    /// The store's change count when it was claimed, for the delete after delivery.
    pub(crate) read_at: ReadMark,
}

/// The producer that publishes due records: [`producer_config`]'s settings, with every delivery
/// report sent to the completion task.
///
/// # Errors
/// [`KafkaSetupError::Client`] for an invalid property.
pub fn publish_producer(
    config: &Config,
    reports: Reports,
) -> Result<PublishProducer, KafkaSetupError> {
    producer_config(config)
        .create_with_context(reports)
        .map_err(|source| KafkaSetupError::Client {
            client: "producer",
            source,
        })
}

/// The publishing producer's context: sends every delivery report to the completion task.
#[derive(Clone)]
pub struct Reports {
    tx: mpsc::UnboundedSender<Outcome>,
    clock: Arc<dyn Clock>,
}

/// The completion task's end of the reports.
#[derive(Debug)]
pub struct Completions(pub(super) mpsc::UnboundedReceiver<Outcome>);

/// The producer that publishes due records.
pub type PublishProducer = ThreadedProducer<Reports>;

impl std::fmt::Debug for Reports {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reports").finish_non_exhaustive()
    }
}

impl Reports {
    /// A context and the completion task's end of its channel.
    pub fn new(clock: Arc<dyn Clock>) -> (Self, Completions) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Self { tx, clock }, Completions(rx))
    }

    /// An outcome known without a report (the produce call itself failed).
    pub(crate) fn send(&self, sent: Arc<Sent>, result: Result<(), rdkafka::error::KafkaError>) {
        self.send_fault(sent, result.map_err(super::Fault::Kafka));
    }

    /// An outcome: delivered, or why not.
    pub(crate) fn send_fault(&self, sent: Arc<Sent>, result: Result<(), super::Fault>) {
        // The receiver lives as long as the publisher; after that nothing waits for outcomes.
        let _ = self.tx.send(Outcome {
            sent,
            result,
            reported_ms: self.clock.now_ms(),
        });
    }
}

impl ClientContext for Reports {}

impl ProducerContext for Reports {
    type DeliveryOpaque = Arc<Sent>;

    fn delivery(&self, result: &DeliveryResult<'_>, sent: Arc<Sent>) {
        let result = match result {
            Ok(_) => Ok(()),
            Err((e, _)) => Err(e.clone()),
        };
        self.send(sent, result);
    }
}
