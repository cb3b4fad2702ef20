//! The publish task: due record -> target topic -> delivery report -> delete from the store.
//!
//! For each batch of due ids from the scheduler it claims them (a record already being
//! published through another timer is skipped), reads the records (one multi-get), produces
//! each to its target with provenance headers, and hands the delivery futures to a completion
//! task. At most `in_flight` records are between "produced" and "deleted" at once: that window
//! bounds the duplicates a crash can cause. Delivered records are deleted in batches.
//!
//! Failures are classified by librdkafka error code. Transient ones (timeouts, broker down,
//! leader changes) are retried through the scheduler with exponential backoff, without limit:
//! the record is never dropped. Permanent ones (unknown target, authorization, too large) are
//! retried `fire_max_attempts` times and then dead-lettered. A retry goes back through the wheel,
//! so one unavailable target never holds up the others.

pub mod dead_letter;
pub mod history;
pub mod reports;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::{BaseRecord, Producer};
use tokio::sync::{mpsc, oneshot, watch, Semaphore};
use tracing::{error, info, warn};

use crate::clock::Clock;
use crate::hashing::BuildMul;
use crate::limit::{Decision, Limiter, Limits};
use crate::metrics::Metrics;
use crate::record::{names, Header, HeaderRef, Reason, Reject};
use crate::scheduler::{Due, Inserts, Wake};
use crate::store::wal::DEFERRED_SYNC;
use crate::store::{RecordId, Store, StoredRecord};
use dead_letter::{DeadLetter, DeadLetters, Origin};
use reports::{Completions, PublishProducer, Reports, Sent};

/// How failed deliveries are retried.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Attempts before a permanently failing record is dead-lettered.
    pub max_attempts: u32,
    /// Longest backoff, ms.
    pub backoff_max_ms: u64,
}

impl RetryPolicy {
    /// Backoff after `attempt` failures: 100 ms doubling, capped.
    pub fn backoff_ms(&self, attempt: u32) -> u64 {
        100u64
            .saturating_mul(1u64 << attempt.saturating_sub(1).min(20))
            .min(self.backoff_max_ms)
    }
}

/// What a failed produce means for the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Retry later, without limit.
    Transient,
    /// Retry a bounded number of times, then dead-letter with this reason.
    Permanent(Reason),
}

/// Every error kind [`classify`] returns, and `dead_letter` for a dead letter not written yet
/// (the `kind` label of the produce-error metric).
pub const ERROR_KINDS: [&str; 8] = [
    "unknown_topic",
    "authorization",
    "rejected",
    "timeout",
    "queue_full",
    "transient",
    "other",
    "dead_letter",
];

/// Classifies a produce error, with a bounded label for metrics.
pub fn classify(err: &KafkaError) -> (Failure, &'static str) {
    use RDKafkaErrorCode as C;
    match err.rdkafka_error_code() {
        Some(C::UnknownTopicOrPartition | C::UnknownTopic | C::UnknownPartition) => {
            (Failure::Permanent(Reason::TargetNotFound), "unknown_topic")
        }
        Some(C::TopicAuthorizationFailed | C::ClusterAuthorizationFailed) => {
            (Failure::Permanent(Reason::TargetDenied), "authorization")
        }
        Some(
            C::MessageSizeTooLarge
            | C::InvalidMessageSize
            | C::InvalidMessage
            | C::InvalidRecord
            | C::PolicyViolation,
        ) => (Failure::Permanent(Reason::DeliveryFailed), "rejected"),
        Some(C::MessageTimedOut) => (Failure::Transient, "timeout"),
        Some(C::QueueFull) => (Failure::Transient, "queue_full"),
        Some(_) => (Failure::Transient, "transient"),
        None => (Failure::Transient, "other"),
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Attempts {
    total: u32,
    permanent: u32,
}

type AttemptMap = Arc<Mutex<HashMap<RecordId, Attempts, BuildMul>>>;

/// What became of one produced record.
#[derive(Debug)]
pub struct Outcome {
    sent: Arc<Sent>,
    result: Result<(), KafkaError>,
    /// When the delivery report arrived (epoch ms), before any queueing on our side.
    reported_ms: u64,
}

/// Everything the publish side needs.
#[derive(Clone)]
pub struct Publisher {
    /// The store.
    pub store: Arc<Store>,
    /// Idempotent producer whose delivery reports go to `reports`.
    pub producer: PublishProducer,
    /// Where outcomes go (the producer's context holds the same channel).
    pub reports: Reports,
    /// Dead-letter writer.
    pub dead: DeadLetters,
    /// Metrics.
    pub metrics: Metrics,
    /// Wall clock.
    pub clock: Arc<dyn Clock>,
    /// Back to the scheduler, for retries.
    pub retries: Inserts,
    /// Retry rules.
    pub policy: RetryPolicy,
    /// Most records between produce and delete.
    pub in_flight: usize,
    /// Records between produce and delete: a second timer for one of them (an operator moved
    /// it) is skipped rather than published twice.
    pub in_flight_ids: Arc<Mutex<HashSet<RecordId, BuildMul>>>,
    /// Fire rate limits and spreading.
    pub limits: Arc<Limits>,
    /// The most recently fired records, for the console.
    pub history: history::History,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("policy", &self.policy)
            .field("in_flight", &self.in_flight)
            .finish_non_exhaustive()
    }
}

impl Publisher {
    /// Runs until `shutdown` or until the scheduler closes its channel, then finishes the
    /// deliveries in flight (deleting what was acknowledged) and flushes the producer.
    pub async fn run(
        self,
        mut due: mpsc::Receiver<Vec<Due>>,
        mut shutdown: watch::Receiver<bool>,
        completions: Completions,
    ) {
        let sem = Arc::new(Semaphore::new(self.in_flight));
        let attempts: AttemptMap = Arc::default();
        let mut limiter = Limiter::new(Limits::clone(&self.limits));
        let (stop_completer, stopped) = oneshot::channel();
        let completer = tokio::spawn(
            self.clone()
                .complete(completions, stopped, attempts.clone()),
        );
        loop {
            let batch = tokio::select! {
                biased;
                _ = shutdown.changed() => break,
                b = due.recv() => match b { Some(b) => b, None => break },
            };
            self.fire(batch, &sem, &attempts, &mut limiter).await;
        }
        // Every record between produce and delete holds a permit until its outcome has been
        // handled: once all are back, nothing is in flight. librdkafka reports every record
        // within `message.timeout.ms` (30 s).
        let all = u32::try_from(self.in_flight).unwrap_or(u32::MAX);
        if tokio::time::timeout(Duration::from_secs(45), sem.acquire_many(all))
            .await
            .is_err()
        {
            warn!("deliveries still in flight at shutdown; they fire again after restart");
        }
        let _ = stop_completer.send(());
        if completer.await.is_err() {
            error!("publish completion task failed");
        }
        let producer = self.producer.clone();
        let flushed =
            tokio::task::spawn_blocking(move || producer.flush(Duration::from_secs(10))).await;
        if !matches!(flushed, Ok(Ok(()))) {
            warn!("producer flush did not finish; unacknowledged records fire again after restart");
        }
    }

    async fn fire(
        &self,
        batch: Vec<Due>,
        sem: &Arc<Semaphore>,
        attempts: &AttemptMap,
        limiter: &mut Limiter,
    ) {
        // Claim each record before reading it: one already being published through another
        // timer (an operator moved it) is skipped, and one read after its claim stays in the
        // store until this publisher deletes it, unless the store's change count moves (see
        // `Store::remove_delivered`).
        let handed_out = batch.len();
        let batch: Vec<Due> = {
            let mut in_flight = self.in_flight_ids.lock().unwrap_or_else(|e| e.into_inner());
            let claimed: Vec<Due> = batch
                .into_iter()
                .filter(|d| in_flight.insert(d.id))
                .collect();
            claimed
        };
        self.metrics
            .fire_skipped
            .inc_by((handed_out - batch.len()) as u64);
        if batch.is_empty() {
            return;
        }
        let ids: Vec<RecordId> = batch.iter().map(|d| d.id).collect();
        // `Store::get_for_firing` in two halves: records kept in memory are taken here; only
        // when some were not does a blocking thread read the rest from RocksDB.
        let read_at = self.store.changes();
        let kept = self.store.take_kept(&ids);
        let read = if kept.iter().all(Option::is_some) {
            Ok(Ok(kept))
        } else {
            let store = self.store.clone();
            tokio::task::spawn_blocking(move || store.read_missing(&ids, kept)).await
        };
        let records = match read {
            Ok(Ok(r)) => r,
            other => {
                let why = match other {
                    Ok(Err(e)) => e.to_string(),
                    _ => "read task failed".into(),
                };
                error!(error = %why, records = batch.len(), "cannot read due records; retrying in 1s");
                self.release(batch.iter().map(|d| d.id));
                let at = self.clock.now_ms() + 1_000;
                let _ = self
                    .retries
                    .send(Wake::Retry(batch.iter().map(|d| (at, d.id)).collect()))
                    .await;
                return;
            }
        };
        let mut publish = Vec::with_capacity(batch.len());
        let mut gone = Vec::new();
        let mut moved = Vec::new();
        for (due, record) in batch.into_iter().zip(records) {
            match record {
                // Cancelled or replaced after it entered the wheel (lazy cancellation), or
                // delivered before a crash that lost the deletion of its due-index entry.
                None => gone.push(due),
                // Moved later by an operator: the entry at the new time will fire it.
                Some(record) if record.due_ms() > due.at_ms => moved.push(due.id),
                Some(record) => publish.push((due, record)),
            }
        }
        if !gone.is_empty() || !moved.is_empty() {
            self.release(gone.iter().map(|d| d.id).chain(moved.iter().copied()));
            let mut forgot = false;
            for id in gone.iter().map(|d| d.id).chain(moved.iter().copied()) {
                forgot |= limiter.forget(id).is_some();
            }
            if forgot {
                self.count_held(limiter);
            }
            self.metrics
                .fire_skipped
                .inc_by((gone.len() + moved.len()) as u64);
            let mut attempts = attempts.lock().unwrap_or_else(|e| e.into_inner());
            for d in &gone {
                attempts.remove(&d.id);
            }
        }
        if !gone.is_empty() {
            // A due-index entry left behind is deleted with the next gathered ones.
            let store = self.store.clone();
            let entries: Vec<(u64, RecordId)> = gone.iter().map(|d| (d.at_ms, d.id)).collect();
            tokio::task::spawn_blocking(move || store.forget_due(entries));
        }
        let publish = self.limit(publish, limiter).await;
        for (due, record, released_ms) in publish {
            // `run` owns the semaphore and never closes it.
            let Ok(permit) = sem.clone().acquire_owned().await else {
                return;
            };
            let sent = Arc::new(Sent {
                id: due.id,
                record,
                _permit: permit,
                sent_ms: self.clock.now_ms(),
                released_ms,
                read_at,
            });
            if let Err((e, sent)) = self.produce(sent).await {
                self.reports.send(sent, Err(e));
            }
        }
    }

    /// The records the fire limits let go now, in due order, each with the time it was let go;
    /// the others go back to the scheduler for the time the limits give them.
    async fn limit(
        &self,
        mut records: Vec<(Due, StoredRecord)>,
        limiter: &mut Limiter,
    ) -> Vec<(Due, StoredRecord, u64)> {
        if limiter.is_empty() {
            return records
                .into_iter()
                .map(|(due, r)| {
                    let due_ms = r.due_ms();
                    (due, r, due_ms)
                })
                .collect();
        }
        // In due order, then source offset: a limited target's line keeps that order.
        records.sort_unstable_by_key(|(d, r)| (r.due_ms(), d.id));
        let now = self.clock.now_ms();
        let mut go = Vec::with_capacity(records.len());
        let mut held = Vec::new();
        let mut held_targets = Vec::new();
        let mut early = Vec::new();
        for (due, record) in records {
            // Never before the timer's own time, even if the clock stepped back since.
            let now = now.max(due.at_ms);
            match limiter.decide(due.id, record.target(), record.due_ms(), now) {
                Decision::Go { released_ms } => go.push((due, record, released_ms)),
                Decision::Hold { until_ms } => {
                    held.push((until_ms, due.id));
                    held_targets.push(record);
                }
                Decision::Early => early.push(due.id),
            }
        }
        crate::metrics::count_each(
            &self.metrics.fire_held_total,
            held_targets.iter().map(StoredRecord::target),
        );
        drop(held_targets);
        self.metrics.fire_skipped.inc_by(early.len() as u64);
        self.release(held.iter().map(|&(_, id)| id).chain(early));
        self.count_held(limiter);
        if !held.is_empty() && self.retries.send(Wake::Retry(held)).await.is_err() {
            info!("scheduler stopped; records held by a fire limit fire after restart");
        }
        go
    }

    /// Sets the held-back gauge of each limited target.
    fn count_held(&self, limiter: &Limiter) {
        for (target, n) in limiter.held_by_target() {
            self.metrics
                .fire_held
                .with_label_values(&[target])
                .set(n as i64);
        }
    }

    /// Gives up the claims on records that will not be published now.
    fn release(&self, ids: impl Iterator<Item = RecordId>) {
        let mut in_flight = self.in_flight_ids.lock().unwrap_or_else(|e| e.into_inner());
        for id in ids {
            in_flight.remove(&id);
        }
    }

    /// The record's headers and the provenance headers added to every published record, built
    /// straight into librdkafka's headers (no copy of the record's own first, no string per
    /// number, the source topic read in place).
    fn provenance(&self, id: RecordId, record: &StoredRecord, fired_ms: u64) -> OwnedHeaders {
        let build = |topic: &str, partition: i32| {
            let mut digits = [[0u8; 20]; 4];
            let [p, o, d, f] = &mut digits;
            let added = [
                (names::ORIGIN_TOPIC, topic.as_bytes()),
                (names::ORIGIN_PARTITION, decimal(i64::from(partition), p)),
                (names::ORIGIN_OFFSET, decimal(id.offset(), o)),
                (names::DUE_MS, decimal(record.due_ms() as i64, d)),
                (names::FIRED_MS, decimal(fired_ms as i64, f)),
            ];
            let own = record.headers().map(|h| (h.key, h.value));
            own.chain(added.into_iter().map(|(k, v)| (k, Some(v))))
                .fold(
                    OwnedHeaders::new_with_capacity(record.header_count() + added.len()),
                    |acc, (key, value)| acc.insert(rdkafka::message::Header { key, value }),
                )
        };
        self.store
            .with_partition(id.pid(), build)
            .unwrap_or_else(|| build("", 0))
    }

    /// Hands a record to the producer; its outcome arrives through [`Reports`]. A full queue
    /// is waited out; any other refusal is returned with the record.
    async fn produce(&self, mut sent: Arc<Sent>) -> Result<(), (KafkaError, Arc<Sent>)> {
        // The produce call borrows the topic, key and value from this handle while the record
        // travels as the delivery opaque.
        let borrowed = sent.clone();
        let record = &borrowed.record;
        let mut headers = Some(self.provenance(sent.id, record, sent.sent_ms));
        loop {
            let mut rec =
                BaseRecord::<[u8], [u8], Arc<Sent>>::with_opaque_to(record.target(), sent);
            if let Some(h) = headers.take() {
                rec = rec.headers(h);
            }
            if let Some(k) = record.key() {
                rec = rec.key(k);
            }
            if let Some(v) = record.value() {
                rec = rec.payload(v);
            }
            match self.producer.send(rec) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), rec)) => {
                    sent = rec.delivery_opaque;
                    headers = rec.headers;
                    self.metrics
                        .produce_errors
                        .with_label_values(&["queue_full"])
                        .inc();
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err((e, rec)) => return Err((e, rec.delivery_opaque)),
            }
        }
    }

    /// The completion task: deletes delivered records in batches and routes failures.
    async fn complete(
        self,
        completions: Completions,
        mut stop: oneshot::Receiver<()>,
        attempts: AttemptMap,
    ) {
        let mut rx = completions.0;
        loop {
            let first = tokio::select! {
                o = rx.recv() => match o { Some(o) => o, None => return },
                _ = &mut stop => return,
                // Deliveries paused with a delete still unsynced (only with `--sync`): sync
                // it now rather than at the next write, whenever that is.
                _ = tokio::time::sleep(DEFERRED_SYNC), if self.store.sync_owed() => {
                    let store = self.store.clone();
                    match tokio::task::spawn_blocking(move || store.sync_deferred()).await {
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
        let mut finished: Vec<Arc<Sent>> = Vec::new();
        // The records to try again, with their in-flight permits, until this batch is handled.
        let mut permits = Vec::new();
        let mut retry: Vec<(u64, RecordId)> = Vec::new();
        let ids: Vec<RecordId> = outcomes.iter().map(|o| o.sent.id).collect();
        // The oldest change count any of them was read at: if the store's is still that, none
        // was cancelled, replaced or moved since.
        let read_at = outcomes.iter().map(|o| o.sent.read_at).min().unwrap_or(0);
        // Dead-lettered after failed deliveries: deleted like the delivered ones, not counted.
        let mut dead_lettered = Vec::new();
        let mut fired = Vec::new();
        for o in outcomes {
            let sent = o.sent;
            let err = match o.result {
                Ok(()) => {
                    // Lateness from load: from the time the fire limits let it go (its due
                    // time when none held it); what a limit added is kept apart.
                    let due_ms = sent.record.due_ms();
                    self.metrics.delivery_lateness.observe(
                        o.reported_ms.saturating_sub(sent.released_ms.max(due_ms)) as f64 / 1000.0,
                    );
                    if sent.released_ms > due_ms {
                        self.metrics
                            .fire_limit_lateness
                            .observe((sent.released_ms - due_ms) as f64 / 1000.0);
                    }
                    fired.push(history::Fired {
                        id: sent.id.0,
                        target: sent.record.target().to_owned(),
                        key: history::text(sent.record.key()),
                        delay_id: history::text(sent.record.id()),
                        due_ms,
                        fired_ms: sent.sent_ms,
                        acked_ms: o.reported_ms,
                    });
                    self.metrics
                        .produce_round_trip
                        .observe(o.reported_ms.saturating_sub(sent.sent_ms) as f64 / 1000.0);
                    finished.push(sent);
                    continue;
                }
                Err(e) => e,
            };
            let (failure, kind) = classify(&err);
            self.metrics.produce_errors.with_label_values(&[kind]).inc();
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
                    if self
                        .dead_letter(sent.id, &sent.record, reason, &err, a.total)
                        .await
                    {
                        attempts
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .remove(&sent.id);
                        dead_lettered.push(sent);
                    } else {
                        retry.push((now + self.policy.backoff_max_ms, sent.id));
                        permits.push(sent);
                    }
                }
                _ => {
                    if a.total == 1 {
                        warn!(target = %sent.record.target(), error = %err, kind,
                              "delivery failed; retrying with backoff");
                    }
                    retry.push((now + self.policy.backoff_ms(a.total), sent.id));
                    permits.push(sent);
                }
            }
        }
        self.count_fired(&finished, attempts);
        self.history.extend(fired);
        finished.append(&mut dead_lettered);
        // Shared with the blocking delete; their permits go back with the others' below.
        let finished = Arc::new(finished);
        if !finished.is_empty() {
            crate::failpoint::hit("after-delivery");
            self.remove(&finished, read_at).await;
        }
        {
            let mut in_flight = self.in_flight_ids.lock().unwrap_or_else(|e| e.into_inner());
            for id in &ids {
                in_flight.remove(id);
            }
        }
        drop((finished, permits));
        if !retry.is_empty() && self.retries.send(Wake::Retry(retry)).await.is_err() {
            info!("scheduler stopped; records awaiting a retry fire again after restart");
        }
        self.metrics.pending.set(self.store.pending() as i64);
    }

    /// Counts delivered records by target and forgets their failed attempts.
    fn count_fired(&self, delivered: &[Arc<Sent>], attempts: &AttemptMap) {
        crate::metrics::count_each(
            &self.metrics.fired,
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
        id: RecordId,
        record: &StoredRecord,
        reason: Reason,
        err: &KafkaError,
        attempts: u32,
    ) -> bool {
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
        match self.dead.deliver(&dl, Duration::from_secs(30)).await {
            Ok(()) => {
                warn!(target = %record.target(), reason = %reason, attempts,
                      "record dead-lettered after failed deliveries");
                true
            }
            Err(e) => {
                error!(error = %e, "cannot dead-letter an undeliverable record; retrying later");
                false
            }
        }
    }

    async fn remove(&self, finished: &Arc<Vec<Arc<Sent>>>, read_at: u64) {
        let mut delay = Duration::from_millis(50);
        loop {
            let store = self.store.clone();
            let batch = finished.clone();
            let result = tokio::task::spawn_blocking(move || {
                let refs: Vec<(RecordId, &StoredRecord)> =
                    batch.iter().map(|s| (s.id, &s.record)).collect();
                store.remove_delivered(&refs, read_at)
            })
            .await;
            match result {
                Ok(Ok(_)) => return,
                Ok(Err(e)) if delay < Duration::from_secs(5) => {
                    warn!(error = %e, "cannot delete delivered records yet; retrying");
                }
                other => {
                    error!(result = ?other.map(|r| r.map(|_| ())), records = finished.len(),
                           "giving up deleting delivered records; they fire again after restart");
                    return;
                }
            }
            tokio::time::sleep(delay).await;
            delay *= 2;
        }
    }
}

/// `n` in decimal digits, written at the end of `buf`.
fn decimal(n: i64, buf: &mut [u8; 20]) -> &[u8] {
    let mut rest = n.unsigned_abs();
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    if n < 0 {
        at -= 1;
        buf[at] = b'-';
    }
    &buf[at..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_writes_what_to_string_writes() {
        for n in [0, 7, 10, 31, 1_765_000_000_123, -1, -42, i64::MAX, i64::MIN] {
            let mut buf = [0u8; 20];
            assert_eq!(decimal(n, &mut buf), n.to_string().as_bytes(), "{n}");
        }
    }

    #[test]
    fn backoff_doubles_and_is_capped() {
        let p = RetryPolicy {
            max_attempts: 3,
            backoff_max_ms: 1_000,
        };
        assert_eq!(
            (1..=6).map(|a| p.backoff_ms(a)).collect::<Vec<_>>(),
            vec![100, 200, 400, 800, 1_000, 1_000]
        );
        assert_eq!(p.backoff_ms(u32::MAX), 1_000);
    }

    #[test]
    fn errors_are_classified_by_code() {
        let e = |c| KafkaError::MessageProduction(c);
        assert_eq!(
            classify(&e(RDKafkaErrorCode::UnknownTopicOrPartition)).0,
            Failure::Permanent(Reason::TargetNotFound)
        );
        assert_eq!(
            classify(&e(RDKafkaErrorCode::UnknownTopic)).0,
            Failure::Permanent(Reason::TargetNotFound)
        );
        assert_eq!(
            classify(&e(RDKafkaErrorCode::TopicAuthorizationFailed)).0,
            Failure::Permanent(Reason::TargetDenied)
        );
        assert_eq!(
            classify(&e(RDKafkaErrorCode::MessageSizeTooLarge)).0,
            Failure::Permanent(Reason::DeliveryFailed)
        );
        assert_eq!(
            classify(&e(RDKafkaErrorCode::MessageTimedOut)).0,
            Failure::Transient
        );
        assert_eq!(
            classify(&e(RDKafkaErrorCode::NotLeaderForPartition)).0,
            Failure::Transient
        );
        assert_eq!(classify(&KafkaError::Canceled).0, Failure::Transient);
        // Every kind is one of the pre-registered metric labels.
        for code in [
            RDKafkaErrorCode::UnknownTopic,
            RDKafkaErrorCode::TopicAuthorizationFailed,
            RDKafkaErrorCode::MessageSizeTooLarge,
            RDKafkaErrorCode::MessageTimedOut,
            RDKafkaErrorCode::QueueFull,
            RDKafkaErrorCode::NotLeaderForPartition,
        ] {
            assert!(ERROR_KINDS.contains(&classify(&e(code)).1), "{code:?}");
        }
        assert!(ERROR_KINDS.contains(&classify(&KafkaError::Canceled).1));
    }
}
