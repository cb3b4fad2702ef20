//! The changelog mode (`--changelog`): every change to a partition's pending state also goes to
//! its compacted changelog topic, so that the partition can move to another instance and a lost
//! disk loses nothing. A group is safe once the changelog acknowledged it (then its offsets are
//! stored and its records reach the wheel); a delivered record's tombstone follows its delete.
//!
//! With `--changelog-linger` (on by default), a group's records reach the wheel at once and the
//! group is written only after the linger: a record that fired by then is left out of it and
//! gets no tombstone ([`crate::changelog::unlogged`]). Until the group is written its source
//! offsets are not stored, so a crash reads it again from the source topic.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use prometheus::IntGauge;
use tracing::{error, warn};

use super::grouped::Grouped;
use crate::backoff::Backoff;
use crate::changelog::group_entries;
use crate::ingest::{Durable, Guard, OffsetCommit, Stored};
use crate::publish::reports::Sent;
use crate::publish::{Delivery, Publisher};
use crate::store::{Applied, ReadMark, StoreError};
use crate::BoxFuture;
use kafka_delay_core::changelog::{Checkpoint, Entry};
use kafka_delay_core::id::{Pid, RecordId};

/// The changelog mode.
#[derive(Debug)]
pub struct Logged {
    grouped: Arc<Grouped>,
    /// How long a group's records are in the wheel before the group is written (zero: none).
    linger: Duration,
    /// How many records are in the wheel and not yet in the changelog.
    lingering: IntGauge,
}

impl Logged {
    /// Over the group's parts, each group written `linger` after its records reach the wheel;
    /// `lingering` shows how many records wait for that.
    pub fn new(grouped: Arc<Grouped>, linger: Duration, lingering: IntGauge) -> Self {
        Self {
            grouped,
            linger,
            lingering,
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
    async fn log_changes(&self, group: Stored<'_, '_>) -> bool {
        let g = &self.grouped;
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
