//! The changelog mode (`--changelog`): every change to a partition's pending state also goes to
//! its compacted changelog topic, so that the partition can move to another instance and a lost
//! disk loses nothing. A group is safe once the changelog acknowledged it (then its offsets are
//! stored and its records reach the wheel); a delivered record's tombstone follows its delete.
//!
//! With `--changelog-linger` (on by default), a group's records reach the wheel at once and the
//! group is written only after the linger: a record that fired by then is left out of it and
//! gets no tombstone ([`crate::changelog::unlogged`]). Until the group is written its source
//! offsets are not stored, so a crash reads it again from the source topic.
//!
//! A record already due when it is ingested is handed to its target at once and never stored
//! ([`super::due`]); its group's source offsets reach the changelog only once its target has
//! acknowledged it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use prometheus::IntGauge;
use tracing::{error, warn};

use super::due::{AtIngest, FireProducer, Firing};
use super::grouped::Grouped;
use crate::backoff::Backoff;
use crate::changelog::group_entries;
use crate::ingest::{Durable, Guard, Last, OffsetCommit, Sending, Stored};
use crate::publish::reports::Sent;
use crate::publish::{Delivery, Publisher};
use crate::store::{Applied, IngestOp, ReadMark, StoreError};
use crate::BoxFuture;
use kafka_delay_core::changelog::{Checkpoint, Entry};
use kafka_delay_core::id::{Pid, RecordId};

/// The changelog mode.
pub struct Logged {
    grouped: Arc<Grouped>,
    /// How long a group's records are in the wheel before the group is written (zero: none).
    linger: Duration,
    /// How many records are in the wheel and not yet in the changelog.
    lingering: IntGauge,
    /// Records due when ingested fire at once, through this producer.
    at_ingest: AtIngest,
    producer: Arc<FireProducer>,
}

impl std::fmt::Debug for Logged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Logged")
            .field("linger", &self.linger)
            .field("at_ingest", &self.at_ingest)
            .finish_non_exhaustive()
    }
}

impl Logged {
    /// Over the group's parts, each group written `linger` after its records reach the wheel;
    /// `lingering` shows how many records wait for that. Records due when ingested fire
    /// through `producer` at once, unless `at_ingest` is off.
    pub(super) fn new(
        grouped: Arc<Grouped>,
        (linger, lingering): (Duration, IntGauge),
        (at_ingest, producer): (AtIngest, Arc<FireProducer>),
    ) -> Self {
        Self {
            grouped,
            linger,
            lingering,
            at_ingest,
            producer,
        }
    }

    /// Waits until the group's records due at ingest reached their targets, and stores the
    /// ones their target refused in `firing`, to fire through the wheel. `false` when
    /// stopping first.
    async fn settle_fires(
        &self,
        sending: Sending,
        firing: &mut Firing,
        group: &Stored<'_, '_>,
    ) -> bool {
        let refused = match sending.await {
            Ok(refused) => refused,
            Err(e) => {
                error!(error = %e, "the records due at ingest of a group were not followed to \
                       their targets; they are stored and fire again");
                firing
                    .firing(group.ops, group.last)
                    .map(|(place, ..)| place)
                    .collect()
            }
        };
        if refused.is_empty() {
            return true;
        }
        let mut backoff = Backoff::standard();
        loop {
            let now = self.at_ingest.now_ms();
            let ops = (group.ops, group.stamps);
            match firing.store(self.grouped.store(), ops, &refused, now).await {
                Ok(()) => return true,
                Err(e) => error!(error = %e,
                    "cannot store records their target refused at ingest; retrying"),
            }
            if group.stopping.is_some_and(|s| *s.borrow()) {
                return false;
            }
            backoff.wait().await;
        }
    }

    /// Shows how many records are in the wheel and not yet in the changelog.
    fn count_lingering(&self) {
        let unlogged = self.grouped.changelog().unlogged();
        self.lingering.set(unlogged.len() as i64);
    }

    /// Writes what a group changed to the changelog, per source partition, and waits for it;
    /// then checkpoints each partition. Every partition's entries are handed to the producer
    /// before the first acknowledgement is awaited, so a group waits about one round trip
    /// whatever number of partitions it touches. A partition whose write failed is written
    /// again until it works; `false` when stopping first.
    async fn log_changes(&self, mut group: Stored<'_, '_>) -> bool {
        let g = &self.grouped;
        let mut firing = Firing::default();
        if let Some(sending) = group.sending.take() {
            if !self.settle_fires(sending, &mut firing, &group).await {
                return false;
            }
        }
        // The changelog takes the groups' entries in the order they were stored.
        group.turn.come().await;
        let unlogged = g.changelog().unlogged();
        // A lingering group's entries are decided and handed to the producer in the order of
        // the tombstones of its records that fired meanwhile.
        let mut ordered = if self.linger.is_zero() {
            None
        } else {
            Some(unlogged.ordered().await)
        };
        let mut by_pid = group_entries(
            g.changelog(),
            (group.ops, group.stamps),
            group.applied,
            |pid| group.last.get(&pid).map(|&(topic, ..)| topic),
            |pid, offset| {
                ordered.is_none() || RecordId::new(pid, offset).is_some_and(|id| unlogged.take(id))
            },
        );
        // Records stored after all reach the wheel once the group is written.
        let stored = group_entries(
            g.changelog(),
            (&firing.ops, &firing.stamps),
            &firing.applied,
            |pid| group.last.get(&pid).map(|&(topic, ..)| topic),
            |_, _| true,
        );
        for (pid, entries) in stored {
            by_pid.entry(pid).or_default().extend(entries);
        }
        let mut writes = Vec::with_capacity(group.last.len());
        for (pid, &(topic, partition, offset)) in group.last.iter() {
            let mut entries = by_pid.remove(pid).unwrap_or_default();
            entries.push(Entry::SourceOffset(offset + 1));
            let pending = g.changelog().enqueue(topic, partition, &entries).await;
            writes.push((*pid, topic, partition, offset, entries, pending));
        }
        if ordered.take().is_some() {
            self.count_lingering();
        }
        for (pid, topic, partition, offset, entries, pending) in writes {
            let first = match pending {
                Ok(p) => p.settled().await,
                Err(e) => Err(e),
            };
            let next = match first {
                Ok(next) => next,
                Err(e) => {
                    error!(%topic, partition, error = %e,
                           "cannot write to the changelog; consumption paused, retrying");
                    match self
                        .write_until_done(topic, partition, &entries, &group)
                        .await
                    {
                        Some(next) => next,
                        None => return false,
                    }
                }
            };
            let at = Checkpoint {
                changelog_next: next,
                source_next: Some(offset + 1),
            };
            if let Err(e) = g.store().set_checkpoint(pid, at) {
                warn!(%topic, partition, error = %e, "cannot write the changelog checkpoint");
            }
        }
        firing.into_group(group.applied);
        true
    }

    /// Writes `entries` again until Kafka has them all: the changelog offset after them, or
    /// `None` when stopping first.
    async fn write_until_done(
        &self,
        topic: &str,
        partition: i32,
        entries: &[Entry<'_>],
        group: &Stored<'_, '_>,
    ) -> Option<i64> {
        let mut backoff = Backoff::standard();
        loop {
            if group.stopping.is_some_and(|s| *s.borrow()) {
                return None;
            }
            backoff.wait().await;
            match self
                .grouped
                .changelog()
                .write(topic, partition, entries)
                .await
            {
                Ok(next) => return Some(next),
                Err(e) => {
                    error!(%topic, partition, error = %e,
                           "cannot write to the changelog; consumption paused, retrying");
                }
            }
        }
    }
}

impl Durable for Logged {
    /// Nothing at start: each partition resumes as its restore says ([`Durable::resumed`]).
    fn start_offsets(&self) -> Result<HashMap<Pid, i64>, StoreError> {
        Ok(HashMap::new())
    }

    fn resumed(&self) -> HashMap<Pid, i64> {
        self.grouped.take_resumed()
    }

    fn after_store<'a, 'm: 'a>(&'a self, group: Stored<'a, 'm>) -> BoxFuture<'a, bool> {
        Box::pin(self.log_changes(group))
    }

    /// A group waits for the changelog's acknowledgement while the next is read and stored;
    /// a revoke waits for the group in flight.
    fn in_flight(&self) -> Option<Guard> {
        Some(Box::new(self.grouped.handoff().owing()))
    }

    /// With a linger, the group's records go to the wheel now, noted as unlogged.
    fn linger(&self, applied: &Applied) -> Option<Duration> {
        if self.linger.is_zero() {
            return None;
        }
        let unlogged = self.grouped.changelog().unlogged();
        unlogged.note(applied.inserted.iter().map(|&(_, id)| id));
        self.count_lingering();
        Some(self.linger)
    }

    /// A revoke: it waits for the lingering groups.
    fn hurry(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.grouped.handoff().revokes())
    }

    fn offset_commit(&self) -> OffsetCommit {
        OffsetCommit::Consumer
    }

    fn max_group(&self) -> usize {
        super::WAITING_GROUP
    }

    fn fires_due(&self) -> bool {
        self.at_ingest.on
    }

    fn fire_now<'a, 'm: 'a>(
        &'a self,
        ops: &'a Arc<Vec<IngestOp>>,
        last: &'a Last<'m>,
    ) -> BoxFuture<'a, Option<Sending>> {
        Box::pin(async move {
            if !self.at_ingest.on {
                return None;
            }
            let store = self.grouped.store();
            self.at_ingest
                .send((&self.producer, store), ops, last)
                .await
        })
    }
}

impl Delivery for Logged {
    /// The delete here, then the tombstones (a revoke waits until they are handed to the
    /// changelog's producer).
    fn finish<'a>(
        &'a self,
        p: &'a Publisher,
        done: Arc<Vec<Arc<Sent>>>,
        read_at: ReadMark,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            crate::failpoint::hit("after-delivery");
            let (g, h) = (&self.grouped, self.grouped.handoff());
            h.owe();
            p.delete_in_store(done.clone(), read_at).await;
            g.changelog()
                .gone(g.store(), done.iter().map(|s| s.id))
                .await;
            if !self.linger.is_zero() {
                self.count_lingering();
            }
            h.paid();
        })
    }
}
