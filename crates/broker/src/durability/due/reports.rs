//! The delivery reports of the records that fire at ingest, counted per group rather than
//! sent one by one.
//!
//! Each target record handed to the producer carries its [`Place`]: its group's [`Reports`]
//! and its place in the group's operations. The producer's polling thread notes a refusal
//! there and counts the report; the last one wakes the group's task. No future or channel per
//! record, and nothing of the record is copied back.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rdkafka::message::DeliveryResult;
use rdkafka::producer::{ProducerContext, ThreadedProducer};
use rdkafka::ClientContext;
use tokio::sync::Notify;

/// The producer of the records that fire at ingest.
pub(in crate::durability) type FireProducer = ThreadedProducer<Counted>;

/// Its context: counts each report into its group's [`Reports`].
#[derive(Debug)]
pub(in crate::durability) struct Counted;

impl ClientContext for Counted {}

impl ProducerContext for Counted {
    type DeliveryOpaque = Box<Place>;

    fn delivery(&self, result: &DeliveryResult<'_>, place: Box<Place>) {
        if let Err((e, _)) = result {
            super::refused_at_ingest(e);
            place.reports.refused(place.at);
        }
        place.reports.report();
    }
}

/// Where a target record's report goes.
#[derive(Debug)]
pub(in crate::durability) struct Place {
    reports: Arc<Reports>,
    /// The record's place in its group's operations.
    at: usize,
}

impl Place {
    /// The report of the record at `at` in its group's operations, counted into `reports`.
    pub(in crate::durability) fn new(reports: &Arc<Reports>, at: usize) -> Box<Self> {
        Box::new(Self {
            reports: reports.clone(),
            at,
        })
    }
}

/// What Kafka answered for one group's records that fire at ingest.
#[derive(Debug)]
pub(in crate::durability) struct Reports {
    /// Records handed to the producer and not yet reported, plus one while the group may
    /// still hand more.
    outstanding: AtomicUsize,
    /// The places of the records Kafka refused.
    refused: Mutex<Vec<usize>>,
    done: Notify,
}

impl Reports {
    pub(in crate::durability) fn new() -> Arc<Self> {
        Arc::new(Self {
            outstanding: AtomicUsize::new(1),
            refused: Mutex::new(Vec::new()),
            done: Notify::new(),
        })
    }

    /// One more record is about to be handed to the producer.
    pub(in crate::durability) fn handing(&self) {
        self.outstanding.fetch_add(1, Ordering::Relaxed);
    }

    /// A record the producer did not take after all (the group notes it itself).
    pub(in crate::durability) fn not_taken(&self) {
        self.report();
    }

    /// Every record of the group is handed to the producer.
    pub(in crate::durability) fn all_handed(&self) {
        self.report();
    }

    fn refused(&self, at: usize) {
        self.refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(at);
    }

    /// Counts one report (or the group's hold).
    fn report(&self) {
        if self.outstanding.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.done.notify_one();
        }
    }

    /// Waits until every record handed is reported: the places of those Kafka refused.
    pub(in crate::durability) async fn settled(&self) -> Vec<usize> {
        while self.outstanding.load(Ordering::Acquire) != 0 {
            self.done.notified().await;
        }
        std::mem::take(&mut *self.refused.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_group_settles_after_its_last_report_with_the_places_refused() {
        let reports = Reports::new();
        let places: Vec<Box<Place>> = [3, 5, 8]
            .into_iter()
            .map(|at| {
                reports.handing();
                Place::new(&reports, at)
            })
            .collect();
        reports.all_handed();
        let waiter = {
            let reports = reports.clone();
            tokio::spawn(async move { reports.settled().await })
        };
        let mut places = places.into_iter();
        let first = places.next().unwrap();
        first.reports.report();
        let second = places.next().unwrap();
        second.reports.refused(second.at);
        second.reports.report();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "settled before its last report");
        places.next().unwrap().reports.report();
        assert_eq!(waiter.await.unwrap(), vec![5]);
    }

    #[tokio::test]
    async fn a_record_not_taken_is_not_waited_for() {
        let reports = Reports::new();
        reports.handing();
        reports.not_taken();
        reports.all_handed();
        assert!(reports.settled().await.is_empty());
    }
}
