//! From due timers to produced records: claim and read them through the store's fire API,
//! let the fire limits decide, produce what they let go.

use std::sync::Arc;

use tokio::sync::Semaphore;
use tracing::{error, info};

use super::reports::Sent;
use super::{AttemptMap, Publisher};
use crate::scheduler::{Due, Wake};
use crate::store::{FireBatch, ReadFailed, ToFire};
use kafka_delay_core::limit::{Decision, Limiter};
use kafka_delay_core::record::StoredRecord;

impl Publisher {
    /// Fires a batch of due timers: the store claims and reads their records (see
    /// [`Store::claim`](crate::store::Store::claim)), the fire limits pick what goes now, and
    /// each of those is sent (by the durability mode's [`Delivery`](super::Delivery)) once an
    /// in-flight permit is free.
    pub(super) async fn fire(
        &self,
        batch: Vec<Due>,
        sem: &Arc<Semaphore>,
        attempts: &AttemptMap,
        limiter: &mut Limiter,
    ) {
        let Some(fire) = self.claim_and_read(batch).await else {
            return;
        };
        let FireBatch {
            records,
            gone,
            moved,
            already_claimed,
            not_owned,
            read_at,
        } = fire;
        self.metrics
            .fire
            .skipped
            .inc_by((already_claimed + not_owned + gone.len() + moved.len()) as u64);
        if !gone.is_empty() || !moved.is_empty() {
            let mut forgot = false;
            for id in gone.iter().chain(&moved) {
                forgot |= limiter.forget(*id).is_some();
            }
            if forgot {
                self.count_held(limiter);
            }
            let mut attempts = attempts.lock().unwrap_or_else(|e| e.into_inner());
            for id in &gone {
                attempts.remove(id);
            }
        }
        let go = self.limit(records, limiter).await;
        // Each record takes an in-flight permit; what holds one goes out before this waits
        // for another (in a transaction, only its outcome frees the permits it holds).
        let mut ready = Vec::with_capacity(go.len());
        for (fire, released_ms) in go {
            let permit = match sem.clone().try_acquire_owned() {
                Ok(p) => p,
                Err(_) => {
                    if !ready.is_empty() {
                        self.delivery.send(self, std::mem::take(&mut ready)).await;
                    }
                    // `run` owns the semaphore and never closes it.
                    let Ok(p) = sem.clone().acquire_owned().await else {
                        return;
                    };
                    p
                }
            };
            ready.push(Arc::new(Sent {
                id: fire.id,
                record: fire.record,
                _permit: permit,
                sent_ms: self.clock.now_ms(),
                released_ms,
                read_at,
            }));
        }
        if !ready.is_empty() {
            self.delivery.send(self, ready).await;
        }
    }

    /// Claims and reads the records of `batch`: on this task when all were kept in memory, on
    /// a blocking thread when some must be read from RocksDB. `None` when the read failed: the
    /// claimed timers go back to the scheduler for a second later.
    async fn claim_and_read(&self, batch: Vec<Due>) -> Option<FireBatch> {
        let claim = self.store.claim(batch.iter().map(|d| (d.at_ms, d.id)));
        drop(batch);
        if !claim.needs_read() {
            return self.read_or_retry(self.store.read_claimed(claim)).await;
        }
        let store = self.store.clone();
        let timers = claim.timers().to_vec();
        match tokio::task::spawn_blocking(move || store.read_claimed(claim)).await {
            Ok(read) => self.read_or_retry(read).await,
            Err(e) => {
                self.store.release(timers.iter().map(|t| t.1));
                error!(error = %e, "due records read task failed; retrying in 1s");
                self.retry_in_a_second(&timers).await;
                None
            }
        }
    }

    async fn read_or_retry(&self, read: Result<FireBatch, ReadFailed>) -> Option<FireBatch> {
        match read {
            Ok(fire) => Some(fire),
            Err(failed) => {
                error!(error = %failed, "cannot read due records; retrying in 1s");
                self.retry_in_a_second(&failed.timers).await;
                None
            }
        }
    }

    /// Sends timers whose read failed (their claims given back) to the scheduler again.
    pub(super) async fn retry_in_a_second(&self, timers: &[(u64, kafka_delay_core::id::RecordId)]) {
        let at = self.clock.now_ms() + 1_000;
        let retry = timers.iter().map(|&(_, id)| (at, id)).collect();
        let _ = self.retries.send(Wake::Retry(retry)).await;
    }

    /// The records the fire limits let go now, in due order, each with the time it was let go;
    /// the others are released and go back to the scheduler for the time the limits give them.
    async fn limit(&self, mut records: Vec<ToFire>, limiter: &mut Limiter) -> Vec<(ToFire, u64)> {
        if limiter.is_empty() {
            return records
                .into_iter()
                .map(|f| {
                    let due_ms = f.record.due_ms();
                    (f, due_ms)
                })
                .collect();
        }
        // In due order, then source offset: a limited target's line keeps that order.
        records.sort_unstable_by_key(|f| (f.record.due_ms(), f.id));
        let now = self.clock.now_ms();
        let mut go = Vec::with_capacity(records.len());
        let mut held = Vec::new();
        let mut held_targets = Vec::new();
        let mut early = Vec::new();
        for fire in records {
            // Never before the timer's own time, even if the clock stepped back since.
            let now = now.max(fire.at_ms);
            match limiter.decide(fire.id, fire.record.target(), fire.record.due_ms(), now) {
                Decision::Go { released_ms } => go.push((fire, released_ms)),
                Decision::Hold { until_ms } => {
                    held.push((until_ms, fire.id));
                    held_targets.push(fire.record);
                }
                Decision::Early => early.push(fire.id),
            }
        }
        crate::metrics::count_each(
            &self.metrics.fire.held_total,
            held_targets.iter().map(StoredRecord::target),
        );
        drop(held_targets);
        self.metrics.fire.skipped.inc_by(early.len() as u64);
        self.store
            .release(held.iter().map(|&(_, id)| id).chain(early));
        self.count_held(limiter);
        if !held.is_empty() && self.retries.send(Wake::Retry(held)).await.is_err() {
            info!("scheduler stopped; records held by a fire limit fire after restart");
        }
        go
    }

    /// Sets the held-back gauge of each limited target.
    pub(super) fn count_held(&self, limiter: &Limiter) {
        for (target, n) in limiter.held_by_target() {
            self.metrics
                .fire
                .held
                .with_label_values(&[target])
                .set(n as i64);
        }
    }
}
