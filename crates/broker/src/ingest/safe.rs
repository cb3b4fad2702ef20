//! A group's last steps, once RocksDB took it: the durability mode makes it safe beyond this
//! disk, its offsets are stored in the consumer, its records reach the wheel.
//!
//! Where the mode waits on the network for that (the changelog's acknowledgement), the steps run
//! in the background while ingest reads and stores the next group: at most one group is in
//! flight, groups become safe in the order they were stored, and a group's records reach the
//! wheel only once it is safe. The guard the mode gives for it ([`Durable::in_flight`]), held
//! until the group is safe, makes a revoke wait for it.

use std::collections::HashMap;
use std::sync::Arc;

use rdkafka::consumer::{Consumer, StreamConsumer};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, error, warn};

use super::{Durable, Guard, IngestContext, Last, OffsetCommit, Stored};
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
    /// Makes `group` safe (holding `guard` until then), stores its offsets and hands its
    /// records to the wheel: the next offset of each partition made safe (none when the mode
    /// did not make it safe).
    pub(super) async fn finish(&self, group: Taken, guard: Option<Guard>) -> Settled {
        let Taken {
            ops,
            stamps,
            applied,
            last: owned,
            dead,
        } = group;
        let mut last: Last<'_> = owned
            .iter()
            .map(|(pid, (topic, partition, offset))| (*pid, (topic.as_str(), *partition, *offset)))
            .collect();
        let stored = Stored {
            ops: &ops,
            stamps: &stamps,
            applied: &applied,
            last: &mut last,
            dead: &dead,
            dead_letters: &self.dead_letters,
            stopping: self.stopping.as_ref(),
        };
        let safe = self.durability.after_store(stored).await;
        drop(guard);
        if !safe {
            return Vec::new(); // not made safe: consumed again, here or by the new owner
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
        self.metrics.ingest.replaced.inc_by(applied.replaced as u64);
        self.metrics
            .ingest
            .cancelled
            .inc_by(applied.cancelled as u64);
        self.metrics
            .pending
            .records
            .set(self.store.pending() as i64);
        if !applied.inserted.is_empty()
            && self
                .scheduler
                .send(Wake::Indexed(applied.inserted))
                .await
                .is_err()
        {
            warn!("scheduler stopped; new records will be loaded from RocksDB at the next start");
        }
        settled
    }

    /// Starts `group`'s last steps in the background, holding `guard` until it is safe.
    pub(super) fn spawn(&self, group: Taken, guard: Guard) -> InFlight {
        let this = self.clone();
        InFlight {
            task: tokio::spawn(async move { this.finish(group, Some(guard)).await }),
            resumed: HashMap::new(),
        }
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
