//! A group's last steps, once RocksDB took it: the durability mode makes it safe beyond this
//! disk, its offsets are stored in the consumer, its records reach the wheel.
//!
//! Where the mode waits on the network for that (the changelog's acknowledgement), the steps run
//! in the background while ingest reads and stores the next groups ([`Pipeline`]): groups become
//! safe in the order they were stored (each waits for its [`Turn`]), and the guard the mode
//! gives for each ([`Durable::in_flight`]), held until the group is safe, makes a revoke wait
//! for it. Either
//! - a group's records reach the wheel only once it is safe, and two groups at a time are in
//!   flight: one being made safe, the next prepared meanwhile (its transaction's records made
//!   ready while the one before commits); or
//! - where the mode lingers ([`Durable::linger`]), they reach the wheel at once, and the group
//!   is made safe once the linger is over (at once when the broker stops), after the group
//!   before it.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use rdkafka::consumer::{Consumer, StreamConsumer};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, error, warn};

use super::{Durable, Guard, IngestContext, Last, OffsetCommit, Sending, Stored, Turn};
use crate::dead_letter::{DeadLetter, DeadLetters};
use crate::metrics::Metrics;
use crate::scheduler::{Inserts, Wake};
use crate::store::{Applied, IngestOp, Store};
use kafka_delay_core::id::Pid;

/// A group RocksDB took, owned, to be made safe.
#[derive(Debug)]
pub(super) struct Taken {
    /// The group's store operations, in offset order.
    pub ops: Arc<Vec<IngestOp>>,
    /// The timestamp of each operation's source record.
    pub stamps: Vec<Option<u64>>,
    /// What RocksDB did with them.
    pub applied: Applied,
    /// The last offset of each source partition in the group.
    pub last: HashMap<Pid, (String, i32, i64)>,
    /// The group's rejected records.
    pub dead: Vec<DeadLetter>,
    /// Its records due at ingest, on their way to their targets.
    pub sending: Option<Sending>,
    /// The store's ownership stamp once the group was read ([`Stored::owned_at`]).
    pub owned_at: u64,
}

/// The next offset of each partition a group made safe.
pub(super) type Settled = Vec<(Pid, i64)>;

/// What a group's last steps need, cloned from the ingest task.
#[derive(Clone)]
pub(super) struct Finisher {
    pub durability: Arc<dyn Durable>,
    pub consumer: Arc<StreamConsumer<IngestContext>>,
    pub store: Arc<Store>,
    pub scheduler: Inserts,
    pub metrics: Metrics,
    pub dead_letters: DeadLetters,
    pub stopping: Option<watch::Receiver<bool>>,
}

impl Finisher {
    /// Makes `group` safe once its `turn` comes (holding `guard` until then), stores its
    /// offsets and hands its records to the wheel: the next offset of each partition made safe
    /// (none when the mode did not make it safe).
    pub(super) async fn finish(
        &self,
        mut group: Taken,
        guard: Option<Guard>,
        mut turn: Turn,
    ) -> Settled {
        let settled = self.make_safe(&mut group, guard, &mut turn).await;
        if !settled.is_empty() {
            self.to_wheel(&mut group.applied).await;
        }
        settled
    }

    /// Makes `group` safe once its `turn` comes (holding `guard` until then) and stores its
    /// offsets: the next offset of each partition made safe (none when the mode did not make
    /// it safe, and then it is consumed again, here or by the partition's new owner).
    async fn make_safe(&self, group: &mut Taken, guard: Option<Guard>, turn: &mut Turn) -> Settled {
        let mut last: Last<'_> = group
            .last
            .iter()
            .map(|(pid, (topic, partition, offset))| (*pid, (topic.as_str(), *partition, *offset)))
            .collect();
        let stored = Stored {
            ops: &group.ops,
            stamps: &group.stamps,
            applied: &mut group.applied,
            last: &mut last,
            dead: &group.dead,
            dead_letters: &self.dead_letters,
            stopping: self.stopping.as_ref(),
            sending: group.sending.take(),
            turn: &mut *turn,
            owned_at: group.owned_at,
        };
        let safe = self.durability.after_store(stored).await;
        // The group after this one waits for this one's end, which never comes before the
        // turn of this one, whatever the mode did.
        turn.come().await;
        drop(guard);
        if !safe {
            return Vec::new();
        }
        let store_offsets = self.durability.offset_commit() == OffsetCommit::Consumer;
        let mut settled = Vec::with_capacity(last.len());
        for (pid, (topic, partition, offset)) in last {
            if store_offsets {
                if let Err(e) = self.consumer.store_offset(topic, partition, offset) {
                    debug!(%topic, partition, error = %e, "offset not stored (partition revoked?)");
                }
            }
            settled.push((pid, offset + 1));
        }
        settled
    }

    /// Hands the group's new records to the wheel and counts what it did (once: a second
    /// call hands over and counts only what was added since).
    pub(super) async fn to_wheel(&self, applied: &mut Applied) {
        let replaced = std::mem::take(&mut applied.replaced);
        let cancelled = std::mem::take(&mut applied.cancelled);
        self.metrics.ingest.replaced.inc_by(replaced as u64);
        self.metrics.ingest.cancelled.inc_by(cancelled as u64);
        self.metrics
            .pending
            .records
            .set(self.store.pending() as i64);
        let inserted = std::mem::take(&mut applied.inserted);
        if !inserted.is_empty() && self.scheduler.send(Wake::Indexed(inserted)).await.is_err() {
            warn!("scheduler stopped; new records will be loaded from RocksDB at the next start");
        }
    }

    /// Starts `group`'s last steps in the background, holding `guard` until it is safe, once
    /// its `turn` comes; `done` says when they are over.
    fn spawn(
        &self,
        (group, guard): (Taken, Guard),
        turn: Turn,
        done: oneshot::Sender<()>,
    ) -> InFlight {
        let this = self.clone();
        let task = tokio::spawn(async move {
            let settled = this.finish(group, Some(guard), turn).await;
            let _ = done.send(());
            settled
        });
        InFlight {
            task,
            resumed: HashMap::new(),
        }
    }

    /// Makes `group`, whose records are in the wheel already, safe in the background at
    /// `until` (or as soon as the broker stops or the mode hurries), once `after` (the group
    /// before it) is safe; `done` says when it is.
    fn linger(
        &self,
        (mut group, guard): (Taken, Guard),
        until: Instant,
        after: Option<oneshot::Receiver<()>>,
        done: oneshot::Sender<()>,
    ) -> InFlight {
        let this = self.clone();
        let hurry = self.durability.hurry();
        let task = tokio::spawn(async move {
            let stopping = async {
                match this.stopping.clone() {
                    Some(mut s) => drop(s.wait_for(|s| *s).await),
                    None => std::future::pending().await,
                }
            };
            let hurried = async {
                let changed = match hurry {
                    Some(mut h) => h.changed().await.is_ok(),
                    None => false,
                };
                if !changed {
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                () = tokio::time::sleep_until(until) => {}
                () = stopping => {}
                () = hurried => {}
            }
            let mut turn = Turn::after(after);
            turn.come().await;
            let settled = this.make_safe(&mut group, Some(guard), &mut turn).await;
            let _ = done.send(());
            if !settled.is_empty() {
                // Records due at ingest that their target refused, stored after all.
                this.to_wheel(&mut group.applied).await;
            }
            settled
        });
        InFlight {
            task,
            resumed: HashMap::new(),
        }
    }
}

/// Most lingering groups in flight: ingest waits for the oldest beyond that.
const MOST_LINGERING: usize = 4_096;

/// Most groups in flight that reach the wheel once safe: one being made safe, the next made
/// ready meanwhile. Ingest waits for the oldest beyond that (reading and storing the group
/// after them meanwhile).
const MOST_WAITING: usize = 2;

/// The groups being made safe in the background, oldest first.
#[derive(Debug, Default)]
pub(super) struct Pipeline {
    groups: VecDeque<InFlight>,
    /// Says when the newest lingering group is safe.
    newest: Option<oneshot::Receiver<()>>,
}

impl Pipeline {
    /// Partitions restored meanwhile resume where their restore says, whatever the groups in
    /// flight settle.
    pub(super) fn resumed(&mut self, resumed: &HashMap<Pid, i64>) {
        if !resumed.is_empty() {
            for g in &mut self.groups {
                g.resumed(resumed);
            }
        }
    }

    /// Waits for every group in flight: the next offsets they made safe, in order.
    pub(super) async fn settle_all(&mut self) -> Settled {
        let mut settled = Vec::new();
        while let Some(g) = self.groups.pop_front() {
            settled.extend(g.settled().await);
        }
        settled
    }

    /// Hands `group` on: made safe, its offsets stored and its records sent to the wheel,
    /// in the background while ingest goes on: the next offsets of the groups before it that
    /// are safe by now (all of them unless it lingers).
    pub(super) async fn start(
        &mut self,
        finisher: &Finisher,
        mut group: Taken,
        guard: Guard,
    ) -> Settled {
        let linger = finisher.durability.linger(&group.applied);
        if linger.is_some() {
            finisher.to_wheel(&mut group.applied).await;
        }
        let settled = self
            .settle_beyond(linger.map_or(MOST_WAITING, |_| MOST_LINGERING) - 1)
            .await;
        let (done, newest) = oneshot::channel();
        let after = self.newest.replace(newest);
        let next = match linger {
            None => finisher.spawn((group, guard), Turn::after(after), done),
            Some(linger) => {
                let until = Instant::now() + linger;
                finisher.linger((group, guard), until, after, done)
            }
        };
        self.groups.push_back(next);
        settled
    }

    /// Waits for the oldest groups until at most `most` are in flight, and takes those
    /// finished by now: the next offsets they made safe, in order.
    async fn settle_beyond(&mut self, most: usize) -> Settled {
        let mut settled = Vec::new();
        while self.groups.len() > most || self.groups.front().is_some_and(|g| g.task.is_finished())
        {
            if let Some(g) = self.groups.pop_front() {
                settled.extend(g.settled().await);
            }
        }
        settled
    }
}

/// A group being made safe in the background.
#[derive(Debug)]
pub(super) struct InFlight {
    task: JoinHandle<Settled>,
    /// Partitions restored here meanwhile, and where each resumes.
    resumed: HashMap<Pid, i64>,
}

impl InFlight {
    /// Partitions restored while the group is in flight: they resume where their restore says,
    /// whatever the group settles.
    pub(super) fn resumed(&mut self, resumed: &HashMap<Pid, i64>) {
        self.resumed.extend(resumed);
    }

    /// Waits for the group's last steps: the next offset of each partition it made safe, a
    /// partition restored meanwhile at the offset its restore gave.
    pub(super) async fn settled(self) -> Settled {
        let mut settled = match self.task.await {
            Ok(settled) => settled,
            Err(e) => {
                error!(error = %e, "an ingest group's last steps failed; it is consumed again");
                Vec::new()
            }
        };
        settled.retain(|(pid, _)| !self.resumed.contains_key(pid));
        settled.extend(self.resumed);
        settled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_partition_restored_while_a_group_is_in_flight_resumes_where_its_restore_says() {
        // The group made partitions 1 and 2 safe up to 100 and 200; meanwhile partition 2 was
        // revoked, assigned again and restored, and resumes at 150.
        let mut group = InFlight {
            task: tokio::spawn(async { vec![(1, 100), (2, 200)] }),
            resumed: HashMap::new(),
        };
        group.resumed(&HashMap::from([(2, 150)]));
        let mut next: HashMap<Pid, i64> = HashMap::new();
        next.extend(group.settled().await);
        assert_eq!(next, HashMap::from([(1, 100), (2, 150)]));
    }
}
