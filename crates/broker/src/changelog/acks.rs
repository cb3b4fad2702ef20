//! The changelog producer's delivery reports, counted rather than sent one by one.
//!
//! Every entry handed to the producer carries the [`Acks`] of its write (a partition's entries
//! of one group, an operator's change, a batch of tombstones) as its delivery opaque, one shared
//! allocation per write. The producer's polling thread counts each report into it (the highest
//! offset, the first error, the latest append time) and wakes the writer once the last report
//! is in. No future, channel or copy of the entry per record: the entry's report is a few
//! atomic operations.
//!
//! A write nobody waits for (the tombstones after a delivery) logs what Kafka refused and
//! teaches the cluster's clock from its last report.

use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rdkafka::error::KafkaError;
use rdkafka::message::{DeliveryResult, Message};
use rdkafka::producer::{ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Timestamp};
use tokio::sync::Notify;
use tracing::warn;

use crate::kafka_clock::{KafkaClock, LatestStamp};

/// The changelog's producer.
pub type ChangelogProducer = ThreadedProducer<Counted>;

/// The changelog producer's context: counts each report into its write's [`Acks`].
#[derive(Debug)]
pub struct Counted {
    /// Learns the cluster's clock from unawaited writes' last reports.
    pub(super) kafka_clock: Arc<KafkaClock>,
}

impl ClientContext for Counted {}

impl ProducerContext for Counted {
    type DeliveryOpaque = Arc<Acks>;

    fn delivery(&self, result: &DeliveryResult<'_>, acks: Arc<Acks>) {
        match result {
            Ok(m) => acks.delivered(m.offset(), m.timestamp()),
            Err((e, m)) => {
                if !acks.awaited {
                    warn!(topic = m.topic(), partition = m.partition(), error = %e,
                          "changelog write failed");
                }
                acks.failed(e);
            }
        }
        if acks.report() && !acks.awaited {
            if let Some(stamp) = acks.stamp() {
                self.kafka_clock.acknowledged(&acks.topic, stamp);
            }
        }
    }
}

/// What Kafka answered for one write's entries, counted as the reports come in.
#[derive(Debug)]
pub struct Acks {
    topic: String,
    /// Whether a writer waits for the write ([`Acks::settled`]).
    awaited: bool,
    /// Entries handed to the producer and not yet reported, plus one while the writer may
    /// still hand more.
    outstanding: AtomicUsize,
    /// The highest acknowledged offset plus one (`-1`: none yet).
    next: AtomicI64,
    /// The latest report's timestamp.
    stamp: LatestStamp,
    /// The first refusal.
    error: Mutex<Option<KafkaError>>,
    done: Notify,
}

impl Acks {
    /// For a write to changelog topic `topic`; `awaited` when a writer waits for it.
    pub(super) fn new(topic: String, awaited: bool) -> Arc<Self> {
        Arc::new(Self {
            topic,
            awaited,
            outstanding: AtomicUsize::new(1),
            next: AtomicI64::new(-1),
            stamp: LatestStamp::default(),
            error: Mutex::new(None),
            done: Notify::new(),
        })
    }

    /// The changelog topic written.
    pub(super) fn topic(&self) -> &str {
        &self.topic
    }

    /// One more entry is about to be handed to the producer.
    pub(super) fn handing(&self) {
        self.outstanding.fetch_add(1, Ordering::Relaxed);
    }

    /// An entry the producer did not take after all (the writer returns the error itself).
    pub(super) fn not_taken(&self) {
        self.report();
    }

    /// Every entry of the write is handed to the producer: the write is complete once their
    /// reports are in. `true` when they are in already.
    pub(super) fn all_handed(&self) -> bool {
        self.report()
    }

    fn delivered(&self, offset: i64, stamp: Timestamp) {
        self.next.fetch_max(offset + 1, Ordering::Relaxed);
        self.stamp.note(stamp);
    }

    fn failed(&self, e: &KafkaError) {
        let mut first = self.error.lock().unwrap_or_else(|p| p.into_inner());
        first.get_or_insert_with(|| e.clone());
    }

    /// Counts one report (or the writer's hold); `true` when it was the last.
    fn report(&self) -> bool {
        let last = self.outstanding.fetch_sub(1, Ordering::AcqRel) == 1;
        if last {
            self.done.notify_one();
        }
        last
    }

    /// The latest report's timestamp.
    pub(super) fn stamp(&self) -> Option<Timestamp> {
        self.stamp.get()
    }

    /// Waits until every entry handed is reported: the changelog offset after the last one,
    /// and the latest report's timestamp.
    ///
    /// # Errors
    /// The first entry Kafka refused.
    pub(super) async fn settled(&self) -> Result<(i64, Option<Timestamp>), KafkaError> {
        while self.outstanding.load(Ordering::Acquire) != 0 {
            self.done.notified().await;
        }
        let error = self.error.lock().unwrap_or_else(|p| p.into_inner()).take();
        match error {
            Some(e) => Err(e),
            None => Ok((self.next.load(Ordering::Relaxed), self.stamp())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_write_settles_once_its_last_entry_is_reported_with_the_highest_offset() {
        let acks = Acks::new("t".into(), true);
        for _ in 0..3 {
            acks.handing();
        }
        assert!(!acks.all_handed());
        let waiter = {
            let acks = acks.clone();
            tokio::spawn(async move { acks.settled().await })
        };
        acks.delivered(11, Timestamp::LogAppendTime(5));
        assert!(!acks.report());
        acks.delivered(12, Timestamp::LogAppendTime(7));
        assert!(!acks.report());
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "settled before its last report");
        acks.delivered(10, Timestamp::LogAppendTime(6));
        assert!(acks.report());
        let (next, stamp) = waiter.await.unwrap().unwrap();
        assert_eq!(next, 13);
        assert_eq!(stamp, Some(Timestamp::LogAppendTime(6)));
    }

    #[tokio::test]
    async fn a_refused_entry_fails_the_write_and_an_entry_not_taken_is_not_waited_for() {
        let acks = Acks::new("t".into(), true);
        acks.handing();
        acks.handing();
        acks.not_taken();
        assert!(!acks.all_handed());
        acks.failed(&KafkaError::Canceled);
        assert!(acks.report());
        assert!(matches!(acks.settled().await, Err(KafkaError::Canceled)));
    }

    #[tokio::test]
    async fn a_write_of_nothing_is_settled_at_once() {
        let acks = Acks::new("t".into(), true);
        assert!(acks.all_handed());
        assert_eq!(acks.settled().await.unwrap(), (-1, None));
    }
}
