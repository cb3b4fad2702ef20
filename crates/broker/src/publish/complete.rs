//! The completion task: delivery reports in batches -> the store's delete after delivery;
//! failures retried through the scheduler or dead-lettered.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::error::KafkaError;
use tokio::sync::oneshot;
use tracing::{debug, error, info, warn};

use super::failure::{classify, Failure};
use super::reports::{Completions, Sent};
use super::{history, AttemptMap, Fault, Outcome, Publisher};
use crate::backoff::Backoff;
use crate::dead_letter::{DeadLetter, Origin};
use crate::metrics::Metrics;
use crate::scheduler::Wake;
use crate::store::{ReadMark, Store, StoreError};
use kafka_delay_core::id::RecordId;
use kafka_delay_core::record::StoredRecord;
use kafka_delay_core::record::{names, Header, HeaderRef, Reason, Reject};

/// Records a delivered record's lateness and round trip (`released_ms`: when the fire limits
/// let it go, its due time when none held it; `sent_ms`: handed to Kafka; `reported_ms`:
/// acknowledged), and what the console shows of it.
pub(crate) fn observe_delivery(
    metrics: &Metrics,
    (id, record): (RecordId, &StoredRecord),
    (released_ms, sent_ms, reported_ms): (u64, u64, u64),
) -> history::Fired {
    // Lateness from load: from the time the fire limits let it go (its due time when none
    // held it); what a limit added is kept apart.
    let due_ms = record.due_ms();
    metrics
        .fire
        .delivery_lateness
        .observe(reported_ms.saturating_sub(released_ms.max(due_ms)) as f64 / 1000.0);
    if released_ms > due_ms {
        metrics
            .fire
            .limit_lateness
            .observe((released_ms - due_ms) as f64 / 1000.0);
    }
    metrics
        .fire
        .produce_round_trip
        .observe(reported_ms.saturating_sub(sent_ms) as f64 / 1000.0);
    history::Fired {
        id: id.0,
        target: record.target().to_owned(),
        key: history::text(record.key()),
        delay_id: history::text(record.id()),
        due_ms,
        fired_ms: sent_ms,
        acked_ms: reported_ms,
    }
}

/// How often a delete after delivery is tried (over about 6 s) before it is given up.
const TRIES: u32 = 8;

/// What became of a record whose delivery failed.
enum Failed {
    /// Dead-lettered: deleted like a delivered one.
    DeadLettered(Arc<Sent>),
    /// To try again at this time; the record keeps its in-flight permit until the batch is
    /// handled.
    Retry(u64, Arc<Sent>),
}

impl Publisher {
    /// The completion task: deletes delivered records in batches and routes failures. While
    /// a delete after delivery waits for its fsync (only with `--sync`), a pause in deliveries
    /// syncs it rather than the next write, whenever that is.
    pub(super) async fn complete(
        self,
        completions: Completions,
        mut stop: oneshot::Receiver<()>,
        attempts: AttemptMap,
    ) {
        let mut rx = completions.0;
        loop {
            let owed = self.store.sync_owed();
            let first = tokio::select! {
                o = rx.recv() => match o { Some(o) => o, None => return },
                _ = &mut stop => return,
                _ = tokio::time::sleep(owed.unwrap_or_default()), if owed.is_some() => {
                    let store = self.store.clone();
                    match tokio::task::spawn_blocking(move || store.sync_if_owed()).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => warn!(error = %e, "cannot sync the write-ahead log"),
                        Err(e) => error!(error = %e, "write-ahead log sync task failed"),
                    }
                    continue;
                }
            };
            let mut outcomes = vec![first];
            while outcomes.len() < 1_024 {
                match rx.try_recv() {
                    Ok(o) => outcomes.push(o),
                    Err(_) => break,
                }
            }
            self.handle(outcomes, &attempts).await;
        }
    }

    async fn handle(&self, outcomes: Vec<Outcome>, attempts: &AttemptMap) {
        let now = self.clock.now_ms();
        // The oldest change count any of them was read at: if the store's is still that, none
        // was cancelled, replaced or moved since.
        let Some(read_at) = outcomes.iter().map(|o| o.sent.read_at).min() else {
            return;
        };
        let mut finished: Vec<Arc<Sent>> = Vec::with_capacity(outcomes.len());
        let mut fired = Vec::with_capacity(outcomes.len());
        // Dead-lettered after failed deliveries: deleted like the delivered ones, not counted.
        let mut dead_lettered = Vec::new();
        // The records to try again, with their in-flight permits, until this batch is handled.
        let mut permits = Vec::new();
        let mut retry: Vec<(u64, RecordId)> = Vec::new();
        for o in outcomes {
            match o.result {
                Ok(()) => {
                    fired.push(self.observe_delivery(&o.sent, o.reported_ms));
                    finished.push(o.sent);
                }
                Err(Fault::Again(why)) => {
                    debug!(id = %o.sent.id.0, %why, "transaction aborted; firing again");
                    retry.push((now + 100, o.sent.id));
                    permits.push(o.sent);
                }
                Err(Fault::Kafka(err)) => match self.failed(o.sent, &err, now, attempts).await {
                    Failed::DeadLettered(sent) => dead_lettered.push(sent),
                    Failed::Retry(at, sent) => {
                        retry.push((at, sent.id));
                        permits.push(sent);
                    }
                },
            }
        }
        self.count_fired(&finished, attempts);
        self.history.extend(fired);
        finished.append(&mut dead_lettered);
        if !finished.is_empty() {
            self.delivery
                .finish(self, Arc::new(finished), read_at)
                .await;
        }
        // The store released the deleted ones' claims; these are given back to try again.
        self.store.release(retry.iter().map(|&(_, id)| id));
        drop(permits);
        if !retry.is_empty() && self.retries.send(Wake::Retry(retry)).await.is_err() {
            info!("scheduler stopped; records awaiting a retry fire again after restart");
        }
        self.metrics
            .pending
            .records
            .set(self.store.pending() as i64);
    }

    /// Records a delivered record's lateness and round trip, and what the console shows of it.
    fn observe_delivery(&self, sent: &Sent, reported_ms: u64) -> history::Fired {
        observe_delivery(
            &self.metrics,
            (sent.id, &sent.record),
            (sent.released_ms, sent.sent_ms, reported_ms),
        )
    }

    /// Counts a failed delivery and decides: retry with backoff, or (a permanent failure too
    /// many times) dead-letter it.
    async fn failed(
        &self,
        sent: Arc<Sent>,
        err: &KafkaError,
        now: u64,
        attempts: &AttemptMap,
    ) -> Failed {
        let (failure, kind) = classify(err);
        self.metrics
            .fire
            .produce_errors
            .with_label_values(&[kind])
            .inc();
        let a = {
            let mut map = attempts.lock().unwrap_or_else(|e| e.into_inner());
            let a = map.entry(sent.id).or_default();
            a.total += 1;
            if matches!(failure, Failure::Permanent(_)) {
                a.permanent += 1;
            }
            *a
        };
        match failure {
            Failure::Permanent(reason) if a.permanent >= self.policy.max_attempts => {
                if self.dead_letter(&sent, reason, err, a.total).await {
                    attempts
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&sent.id);
                    Failed::DeadLettered(sent)
                } else {
                    Failed::Retry(now + self.policy.backoff_max_ms, sent)
                }
            }
            _ => {
                if a.total == 1 {
                    warn!(target = %sent.record.target(), error = %err, kind,
                          "delivery failed; retrying with backoff");
                }
                Failed::Retry(now + self.policy.backoff_ms(a.total), sent)
            }
        }
    }

    /// Counts delivered records by target and forgets their failed attempts.
    fn count_fired(&self, delivered: &[Arc<Sent>], attempts: &AttemptMap) {
        crate::metrics::count_each(
            &self.metrics.fire.records,
            delivered.iter().map(|s| s.record.target()),
        );
        let mut attempts = attempts.lock().unwrap_or_else(|e| e.into_inner());
        if !attempts.is_empty() {
            for s in delivered {
                attempts.remove(&s.id);
            }
        }
    }

    async fn dead_letter(
        &self,
        sent: &Arc<Sent>,
        reason: Reason,
        err: &KafkaError,
        attempts: u32,
    ) -> bool {
        let (id, record) = (sent.id, &sent.record);
        let (topic, partition) = self.store.partition_of(id.pid()).unwrap_or_default();
        // A retry dead letter that could not reach its own topic keeps the target it was
        // retried for, and gets this failure's reason instead of its own.
        let mut headers: Vec<Header> = record
            .headers()
            .filter(|h| h.key != names::ERROR && h.key != names::ERROR_DETAIL)
            .map(HeaderRef::to_header)
            .collect();
        if !headers.iter().any(|h| h.key == names::TARGET) {
            headers.push(Header::new(names::TARGET, record.target()));
        }
        headers.push(Header::new(names::DUE_MS, record.due_ms().to_string()));
        let dl = DeadLetter {
            key: record.key().map(<[u8]>::to_vec),
            value: record.value().map(<[u8]>::to_vec),
            headers,
            reject: Reject::new(
                reason,
                format!(
                    "publishing to '{}' failed {attempts} times; last error: {err}",
                    record.target()
                ),
            ),
            origin: Origin {
                topic,
                partition,
                offset: id.offset(),
            },
        };
        self.delivery.dead_letter(self, sent, &dl).await
    }

    /// Writes a dead letter of an undeliverable record and waits for it; `true` once written.
    pub(crate) async fn dead_letter_now(&self, dl: &DeadLetter) -> bool {
        match self.dead.deliver(dl, Duration::from_secs(30)).await {
            Ok(()) => {
                warn!(origin = %dl.origin.topic, partition = dl.origin.partition,
                      offset = dl.origin.offset, reason = %dl.reject.reason,
                      "record dead-lettered after failed deliveries");
                true
            }
            Err(e) => {
                error!(error = %e, "cannot dead-letter an undeliverable record; retrying later");
                false
            }
        }
    }

    /// The store's delete after delivery, on a blocking thread, tried again with backoff for a
    /// few seconds; given up after that (the records fire again after a restart), and their
    /// claims given back.
    pub(crate) async fn delete_in_store(&self, finished: Arc<Vec<Arc<Sent>>>, read_at: ReadMark) {
        let (store, batch) = (self.store.clone(), finished.clone());
        let deleted =
            tokio::task::spawn_blocking(move || delete_delivered(&store, &batch, read_at, TRIES))
                .await;
        if let Err(e) = deleted
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()))
        {
            error!(error = %e, records = finished.len(),
                   "giving up deleting delivered records; they fire again after restart");
            self.store.release(finished.iter().map(|s| s.id));
        }
    }
}

/// Deletes delivered records ([`Store::delivered`]), tried `tries` times with a backoff from
/// 50 ms (blocking): the one delete after delivery of every durability mode.
///
/// # Errors
/// The last refusal, once every try failed.
pub(crate) fn delete_delivered(
    store: &Store,
    done: &[Arc<Sent>],
    read_at: ReadMark,
    tries: u32,
) -> Result<(), StoreError> {
    let refs: Vec<(RecordId, &StoredRecord)> = done.iter().map(|s| (s.id, &s.record)).collect();
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(5));
    let mut tried = 1;
    loop {
        match store.delivered(&refs, read_at) {
            Ok(_) => return Ok(()),
            Err(e) if tried >= tries => return Err(e),
            Err(e) => warn!(error = %e, "cannot delete delivered records yet; retrying"),
        }
        std::thread::sleep(backoff.next_pause());
        tried += 1;
    }
}
