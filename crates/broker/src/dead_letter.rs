//! The dead-letter topic: records that cannot be scheduled or delivered, with the reason.
//!
//! A dead letter carries the original key, value and headers, plus `delay-error` (a stable
//! reason code), `delay-error-detail` (a sentence) and the origin topic, partition and offset.
//! Transient produce failures are retried with backoff until the dead letter is acknowledged; a
//! dead letter refused as too large is sent again without its value (the origin coordinates
//! still point at the original), so a poison record never stalls the pipeline.

use std::time::Duration;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{FutureProducer, FutureRecord};
use tracing::warn;

use crate::backoff::Backoff;
use crate::kafka::headers_to;
use crate::metrics::Metrics;
use kafka_delay_core::record::{names, Header, Reject};

/// Where a record came from.
#[derive(Debug, Clone)]
pub struct Origin {
    /// Source topic.
    pub topic: String,
    /// Source partition.
    pub partition: i32,
    /// Source offset.
    pub offset: i64,
}

/// A record on its way to the dead-letter topic.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    /// Original key.
    pub key: Option<Vec<u8>>,
    /// Original value.
    pub value: Option<Vec<u8>>,
    /// Original headers (reserved reason/origin headers are replaced).
    pub headers: Vec<Header>,
    /// Why.
    pub reject: Reject,
    /// Where from.
    pub origin: Origin,
}

/// Why a dead letter could not be written.
#[derive(Debug, thiserror::Error)]
#[error("dead-letter topic '{topic}' refused a record from {origin_topic}/{partition}@{offset}: {source}")]
pub struct DeadLetterError {
    /// The dead-letter topic.
    pub topic: String,
    /// Origin topic.
    pub origin_topic: String,
    /// Origin partition.
    pub partition: i32,
    /// Origin offset.
    pub offset: i64,
    /// The producer's error.
    pub source: KafkaError,
}

/// Writes dead letters.
#[derive(Clone)]
pub struct DeadLetters {
    producer: FutureProducer,
    topic: String,
    metrics: Metrics,
}

const REPLACED: [&str; 5] = [
    names::ERROR,
    names::ERROR_DETAIL,
    names::ORIGIN_TOPIC,
    names::ORIGIN_PARTITION,
    names::ORIGIN_OFFSET,
];

impl std::fmt::Debug for DeadLetters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeadLetters")
            .field("topic", &self.topic)
            .finish_non_exhaustive()
    }
}

/// Whether Kafka refused a record for its size: a dead letter so refused goes again without
/// its value (the rule every path that writes dead letters follows).
pub fn too_large(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::InvalidMessageSize)
    )
}

/// The headers of a dead letter: the record's own, then the reason and the origin.
fn dead_letter_headers(dl: &DeadLetter) -> Vec<Header> {
    let mut headers: Vec<Header> = dl
        .headers
        .iter()
        .filter(|h| !REPLACED.contains(&h.key.as_str()))
        .cloned()
        .collect();
    headers.push(Header::new(names::ERROR, dl.reject.reason.code()));
    headers.push(Header::new(names::ERROR_DETAIL, dl.reject.detail.as_str()));
    headers.push(Header::new(names::ORIGIN_TOPIC, dl.origin.topic.as_str()));
    headers.push(Header::new(
        names::ORIGIN_PARTITION,
        dl.origin.partition.to_string(),
    ));
    headers.push(Header::new(
        names::ORIGIN_OFFSET,
        dl.origin.offset.to_string(),
    ));
    headers
}

/// The detail header of a dead letter sent without its value.
fn without_value(dl: &DeadLetter, headers: &mut Vec<Header>) {
    headers.retain(|h| h.key != names::ERROR_DETAIL);
    headers.push(Header::new(
        names::ERROR_DETAIL,
        format!(
            "{} (value of {} bytes dropped: too large for the dead-letter topic; read it at the origin offset)",
            dl.reject.detail,
            dl.value.as_ref().map_or(0, Vec::len)
        ),
    ));
}

impl DeadLetters {
    /// Dead letters go to `topic` through `producer`.
    pub fn new(producer: FutureProducer, topic: String, metrics: Metrics) -> Self {
        Self {
            producer,
            topic,
            metrics,
        }
    }

    /// The dead-letter topic.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// A dead letter as a record for a transaction; without its value (for a topic that
    /// refused it as too large), its detail says so.
    pub fn out(&self, dl: &DeadLetter, with_value: bool) -> crate::txn::Out {
        let mut headers = dead_letter_headers(dl);
        if !with_value {
            without_value(dl, &mut headers);
        }
        crate::txn::Out {
            topic: self.topic.clone(),
            partition: None,
            key: dl.key.clone(),
            value: dl.value.clone().filter(|_| with_value),
            headers: Some(headers_to(&headers)),
        }
    }

    /// Counts a dead letter written (its transaction committed).
    pub fn count(&self, dl: &DeadLetter) {
        self.metrics
            .operating
            .dead_lettered
            .with_label_values(&[dl.reject.reason.code()])
            .inc();
    }

    /// Writes a group of dead letters, in order, and returns once every one is acknowledged:
    /// they are queued together (one round trip for the group, not one per record); one that
    /// fails goes through [`DeadLetters::deliver`] on its own, retried until it is written (the
    /// caller's offsets wait for it: nothing is lost, ingest pauses).
    pub async fn deliver_all(&self, dls: &[DeadLetter], max_wait: Duration) {
        let mut queued = Vec::with_capacity(dls.len());
        for dl in dls {
            let headers = headers_to(&dead_letter_headers(dl));
            let mut rec = FutureRecord::<[u8], [u8]>::to(&self.topic).headers(headers);
            if let Some(k) = &dl.key {
                rec = rec.key(k.as_slice());
            }
            if let Some(v) = &dl.value {
                rec = rec.payload(v.as_slice());
            }
            queued.push(self.producer.send_result(rec).ok());
        }
        let mut failed = Vec::new();
        for (dl, delivery) in dls.iter().zip(queued) {
            let ok = match delivery {
                Some(d) => matches!(d.await, Ok(Ok(_))),
                None => false,
            };
            if ok {
                self.metrics
                    .operating
                    .dead_lettered
                    .with_label_values(&[dl.reject.reason.code()])
                    .inc();
            } else {
                failed.push(dl);
            }
        }
        for dl in failed {
            let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
            while let Err(e) = self.deliver(dl, max_wait).await {
                tracing::error!(error = %e, "cannot write a dead letter; consumption paused until it succeeds");
                backoff.wait().await;
            }
        }
    }

    /// Produces one dead letter with these headers and value, and waits for its report.
    async fn send_once(
        &self,
        dl: &DeadLetter,
        headers: &[Header],
        value: Option<&[u8]>,
    ) -> Result<(), KafkaError> {
        let mut rec = FutureRecord::<[u8], [u8]>::to(&self.topic).headers(headers_to(headers));
        if let Some(k) = &dl.key {
            rec = rec.key(k.as_slice());
        }
        if let Some(v) = value {
            rec = rec.payload(v);
        }
        match self.producer.send_result(rec) {
            Ok(delivery) => match delivery.await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err((e, _))) => Err(e),
                Err(_) => Err(KafkaError::Canceled),
            },
            Err((e, _)) => Err(e),
        }
    }

    /// Writes one dead letter and waits for the acknowledgement, retrying transient failures
    /// with backoff (up to `max_wait` in all).
    ///
    /// # Errors
    /// [`DeadLetterError`] when the topic refuses the record for good (even without its value)
    /// or `max_wait` passes.
    pub async fn deliver(
        &self,
        dl: &DeadLetter,
        max_wait: Duration,
    ) -> Result<(), DeadLetterError> {
        let started = tokio::time::Instant::now();
        let mut headers = dead_letter_headers(dl);
        let mut value = dl.value.as_deref();
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        loop {
            let err = match self.send_once(dl, &headers, value).await {
                Ok(()) => {
                    self.metrics
                        .operating
                        .dead_lettered
                        .with_label_values(&[dl.reject.reason.code()])
                        .inc();
                    return Ok(());
                }
                Err(e) => e,
            };
            let too_large = too_large(&err);
            if too_large && value.is_some() {
                warn!(
                    topic = %self.topic, origin = %dl.origin.topic, partition = dl.origin.partition,
                    offset = dl.origin.offset, "dead letter too large; sending it without its value"
                );
                value = None;
                without_value(dl, &mut headers);
                continue;
            }
            let permanent = too_large
                || matches!(
                    err.rdkafka_error_code(),
                    Some(
                        RDKafkaErrorCode::TopicAuthorizationFailed
                            | RDKafkaErrorCode::InvalidRecord
                            | RDKafkaErrorCode::PolicyViolation
                    )
                );
            if permanent || started.elapsed() >= max_wait {
                return Err(DeadLetterError {
                    topic: self.topic.clone(),
                    origin_topic: dl.origin.topic.clone(),
                    partition: dl.origin.partition,
                    offset: dl.origin.offset,
                    source: err,
                });
            }
            self.metrics
                .fire
                .produce_errors
                .with_label_values(&["dead_letter"])
                .inc();
            let pause = backoff.next_pause();
            warn!(topic = %self.topic, error = %err, retry_in_ms = pause.as_millis() as u64,
                  "dead letter not written yet; retrying");
            tokio::time::sleep(pause).await;
        }
    }
}
