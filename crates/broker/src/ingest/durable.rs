//! What ingest asks of the durability mode: each group made safe beyond this disk, the source
//! offsets committed, and what happens when partitions change owner.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::BaseConsumer;
use rdkafka::TopicPartitionList;
use tokio::sync::{oneshot, watch};

use super::IngestContext;
use crate::dead_letter::{DeadLetter, DeadLetters};
use crate::store::{Applied, IngestOp, StoreError};
use crate::BoxFuture;
use kafka_delay_core::id::Pid;

/// Longest a group's dead letters may take before each is retried on its own.
const DEAD_LETTER_WAIT: Duration = Duration::from_secs(60);

/// The last offset of each source partition in a group, by the partition's store id.
pub type Last<'m> = HashMap<Pid, (&'m str, i32, i64)>;

/// Held while a group is made safe in the background ([`Durable::in_flight`]); dropped once it
/// is.
pub type Guard = Box<dyn Send>;

/// The target records of a group's records due at ingest, handed to the producer at once
/// ([`Durable::fire_now`]): the task waiting for their acknowledgements, which ends with the
/// places in the group's operations of the records their target refused.
pub type Sending = tokio::task::JoinHandle<Vec<usize>>;

/// When the group stored before this one is safe (or its task ended). Nothing of a group may
/// be made visible before that: groups are made safe in the order they were stored. A mode may
/// prepare a group's writes while it waits.
#[derive(Debug, Default)]
pub struct Turn(Option<oneshot::Receiver<()>>);

impl Turn {
    /// The turn that comes when `before` says so (`None`: at once).
    pub fn after(before: Option<oneshot::Receiver<()>>) -> Self {
        Self(before)
    }

    /// Waits for the group before this one; at once when waited for already.
    pub async fn come(&mut self) {
        if let Some(before) = self.0.take() {
            let _ = before.await; // safe, or its task ended: either way it is over
        }
    }
}

/// A group of records RocksDB has taken, for the durability mode to make safe beyond this disk.
#[derive(Debug)]
pub struct Stored<'a, 'm> {
    /// The group's store operations, in offset order.
    pub ops: &'a [IngestOp],
    /// The timestamp (epoch ms) of each operation's source record, in the same order.
    pub stamps: &'a [Option<u64>],
    /// What RocksDB did with them; the mode adds the records it had to store after all
    /// (a record that was to fire with the group and could not).
    pub applied: &'a mut Applied,
    /// The last offset of each source partition; the mode leaves out partitions that are no
    /// longer owned here.
    pub last: &'a mut Last<'m>,
    /// The group's rejected records.
    pub dead: &'a [DeadLetter],
    /// Where rejected records go.
    pub dead_letters: &'a DeadLetters,
    /// Turns true when the broker stops: a write that keeps failing gives up then.
    pub stopping: Option<&'a watch::Receiver<bool>>,
    /// The group's records due at ingest, on their way to their targets
    /// ([`Durable::fire_now`]).
    pub sending: Option<Sending>,
    /// When the group before this one is safe: the mode waits for it ([`Turn::come`]) before
    /// it writes anything of this group.
    pub turn: &'a mut Turn,
    /// The store's ownership stamp once the group was read ([`Store::ownership_now`]): a
    /// partition whose stamp is later now ([`Store::owned_since`]) was revoked and handed here
    /// again meanwhile, and what the group read of it was dropped by its restore.
    ///
    /// [`Store::ownership_now`]: crate::store::Store::ownership_now
    /// [`Store::owned_since`]: crate::store::Store::owned_since
    pub owned_at: u64,
}

/// How a group's source offsets reach the consumer group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetCommit {
    /// Stored in the consumer once the group is safe; auto-committed, and committed at
    /// shutdown.
    Consumer,
    /// Committed by the mode with the group itself: ingest commits nothing.
    WithGroup,
}

/// What the durability mode does with each group ingest takes. Built once at start (see
/// `crate::durability`); ingest never asks which mode it runs in.
pub trait Durable: Send + Sync + std::fmt::Debug {
    /// Where each source partition resumes when ingest starts (anything below was stored).
    /// Blocking.
    ///
    /// # Errors
    /// RocksDB could not be read.
    fn start_offsets(&self) -> Result<HashMap<Pid, i64>, StoreError>;
    /// Where the partitions handed to this instance since the last call resume.
    fn resumed(&self) -> HashMap<Pid, i64>;
    /// Before the group is stored: what becomes of its rejected records. Unless the mode says
    /// otherwise, they are written to the dead-letter topic and acknowledged first.
    fn before_store<'a>(
        &'a self,
        dead_letters: &'a DeadLetters,
        dead: &'a [DeadLetter],
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if !dead.is_empty() {
                dead_letters.deliver_all(dead, DEAD_LETTER_WAIT).await;
            }
        })
    }
    /// After RocksDB took the group, before its offsets are stored and its records reach the
    /// wheel: makes it safe beyond this disk, once its turn has come ([`Stored::turn`]).
    /// `false`: not made safe (stopping, or none of its partitions is owned here any more);
    /// nothing of the group is acknowledged.
    fn after_store<'a, 'm: 'a>(&'a self, group: Stored<'a, 'm>) -> BoxFuture<'a, bool>;
    /// Whether ingest reads and stores the next groups while this mode makes the last one
    /// safe ([`Durable::after_store`]), for a mode that waits on the network for it: then the
    /// guard, held until that group is safe, that a revoke waits for. Asked once per group.
    fn in_flight(&self) -> Option<Guard> {
        None
    }
    /// For a mode with [`Durable::in_flight`]: whether the group's records reach the wheel now,
    /// before the group is made safe, and how long after that it is made safe (records that
    /// fire meanwhile may need nothing written; the mode notes them here). `None`: the group
    /// is made safe first. Asked once per group, after [`Durable::in_flight`].
    fn linger(&self, _applied: &Applied) -> Option<Duration> {
        None
    }
    /// For a mode that lingers: changes when the lingering groups are to be made safe at once
    /// (a revoke waits for them).
    fn hurry(&self) -> Option<watch::Receiver<u64>> {
        None
    }
    /// Whether a record already due when it is ingested fires with its group
    /// ([`IngestOp::Fire`], never stored) rather than through the store and the wheel:
    /// published by [`Durable::after_store`] in the Kafka transaction that commits its source
    /// offset, or handed to the producer at once by [`Durable::fire_now`].
    fn fires_due(&self) -> bool {
        false
    }
    /// Once RocksDB took the group: hands the target records of its records due at ingest
    /// to the producer at once, for a mode that fires them at least once; the group's source
    /// offsets are made safe only after their acknowledgements ([`Stored::sending`]).
    fn fire_now<'a, 'm: 'a>(
        &'a self,
        _ops: &'a Arc<Vec<IngestOp>>,
        _last: &'a Last<'m>,
    ) -> BoxFuture<'a, Option<Sending>> {
        Box::pin(async { None })
    }
    /// How source offsets reach the group.
    fn offset_commit(&self) -> OffsetCommit;
    /// Most records in one group.
    fn max_group(&self) -> usize;
    /// Why the consumer must start again, once the mode found that out: its group moved on
    /// while a group of records waited to commit, and it rejoins only when polled.
    fn broken(&self) -> Option<String> {
        None
    }
}

/// What the durability mode does when source partitions change owner (called in the consumer's
/// rebalance callback).
pub trait Rebalance: Send + Sync + std::fmt::Debug {
    /// Before `tpl` is assigned: may set where its partitions start.
    fn assigning(&self, tpl: &mut TopicPartitionList);
    /// Once `tpl` is assigned.
    fn assigned(&self, consumer: &BaseConsumer<IngestContext>, tpl: &TopicPartitionList);
    /// Before `tpl` is let go.
    fn revoking(&self, tpl: &TopicPartitionList);
}
