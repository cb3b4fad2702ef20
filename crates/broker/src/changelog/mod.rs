//! The changelog: each source partition's pending state, in a compacted Kafka topic, so that
//! the partition can move to another instance and a lost data directory loses nothing.
//!
//! Source topic `T` has the changelog topic `<group-id>-T-changelog`, with (at least) as many
//! partitions; source partition `p` writes to changelog partition `p`, named explicitly, never
//! through the partitioner. Its entries and their encoding are `kafka_delay_core::changelog`'s
//! ([`Entry`]).
//!
//! Every change reaches RocksDB first and the changelog second: ingest stores a group, writes
//! it to the changelog, waits for the acknowledgement, and only then stores the source offsets
//! for commit. The group's records reach the scheduler after that acknowledgement, or, with a
//! linger, at once, and then a record that fires before its group is written gets neither an
//! entry nor a tombstone ([`unlogged`]). A delete after delivery writes a tombstone. See
//! [`restore`] for the way back.
//!
//! Partitions changing owner go through three roles that share [`moving::Moving`] (what is
//! being restored or caught up here): the rebalance callback ([`handoff::Handoff`]), the restore
//! task ([`takeover::Takeover`]) and, with standby replicas, the standby pass
//! ([`standby::Standbys`]). A member found gone is removed from the group by
//! [`departed::Departed`], so that its partitions move before its session runs out. What the
//! admin API asks of the group is [`operate::Operators`]'s.

pub mod acks;
pub mod adopt;
mod bodies;
pub mod coordinator;
pub mod departed;
pub mod handoff;
pub mod kept;
pub mod leave;
pub mod moving;
pub mod operate;
pub mod owners;
mod progress;
pub mod restore;
pub mod standby;
pub mod takeover;
pub mod topics;
pub mod unlogged;
pub mod values;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseRecord, Producer};
use tracing::warn;

use acks::{Acks, ChangelogProducer, Counted};

use crate::config::Config;
use crate::kafka::{base_config, KafkaSetupError};
use crate::kafka_clock::KafkaClock;
use crate::store::{Applied, IngestOp, Store};
use kafka_delay_core::changelog::Entry;
use kafka_delay_core::id::{Pid, RecordId, MAX_OFFSET};

/// Why a step of moving partitions between instances failed; each names what it was doing.
#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    /// The group coordinator did not describe the group.
    #[error("cannot describe group {group}: {source}")]
    Describe {
        /// The consumer group.
        group: String,
        /// librdkafka's error.
        source: KafkaError,
    },
    /// The group's coordinator, asked directly ([`coordinator::Coordinator`]), did not
    /// describe the group.
    #[error("cannot describe group {group} at its coordinator: {source}")]
    Coordinator {
        /// The consumer group.
        group: String,
        /// What the coordinator answered, or why it could not be asked.
        source: crate::wire::WireError,
    },
    /// A member's assignment could not be read.
    #[error("unreadable assignment of {bytes} bytes")]
    Assignment {
        /// Its length.
        bytes: usize,
    },
    /// The changelog did not take a write.
    #[error("changelog {topic}/{partition}: {source}")]
    Write {
        /// Changelog topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// librdkafka's error.
        source: KafkaError,
    },
    /// A changelog topic that cannot hold the pending state.
    #[error(transparent)]
    Topic(#[from] topics::TopicError),
    /// Reading a changelog back failed.
    #[error(transparent)]
    Restore(#[from] restore::RestoreError),
    /// RocksDB.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// A blocking task could not finish (it panicked, or the runtime is stopping).
    #[error("{what} task failed: {detail}")]
    Task {
        /// What the task did.
        what: &'static str,
        /// The join error.
        detail: String,
    },
    /// Restores of these source topics failed (a standby pass).
    #[error("{0}")]
    Topics(String),
}

/// The changelog's producer and naming.
#[derive(Clone)]
pub struct Changelog {
    producer: Arc<ChangelogProducer>,
    group: String,
    /// Learns the cluster's clock from the acknowledgements' append times.
    kafka_clock: Arc<KafkaClock>,
    /// Which records' values are copied, which pointed at.
    values: Arc<values::Values>,
    /// Records in the wheel whose group is not written yet.
    unlogged: Arc<unlogged::Unlogged>,
}

impl std::fmt::Debug for Changelog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Changelog")
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}

/// Longest wait for the changelog's acknowledgements before a write is retried.
const ACK_WAIT: Duration = Duration::from_secs(30);

impl Changelog {
    /// The changelog's idempotent producer (acks from every in-sync replica, no reordering);
    /// its acknowledgements teach `kafka_clock` the cluster's clock.
    ///
    /// # Errors
    /// [`KafkaSetupError::Client`] for an invalid property.
    pub fn new(config: &Config, kafka_clock: Arc<KafkaClock>) -> Result<Self, KafkaSetupError> {
        let mut c = base_config(config);
        c.set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "2")
            .set("compression.type", "lz4")
            .set("allow.auto.create.topics", "false")
            .set("message.timeout.ms", ACK_WAIT.as_millis().to_string());
        let producer = c
            .create_with_context(Counted {
                kafka_clock: kafka_clock.clone(),
            })
            .map_err(|source| KafkaSetupError::Client {
                client: "changelog producer",
                source,
            })?;
        Ok(Self {
            producer: Arc::new(producer),
            group: config.kafka.group_id.clone(),
            kafka_clock,
            values: Arc::new(values::Values::new(config.cluster.changelog_copy)),
            unlogged: Arc::default(),
        })
    }

    /// Records in the wheel whose group is not written yet.
    pub fn unlogged(&self) -> &unlogged::Unlogged {
        &self.unlogged
    }

    /// The changelog topic of source topic `source`.
    pub fn topic_of(&self, source: &str) -> String {
        topic_name(&self.group, source)
    }

    /// Entry `e` of source partition `source`/`partition` as a record for a transaction.
    pub fn out(&self, source: &str, partition: i32, e: &Entry<'_>) -> crate::txn::Out {
        crate::txn::Out {
            topic: self.topic_of(source),
            partition: Some(partition),
            key: Some(e.key()),
            value: e.payload(),
            headers: None,
        }
    }

    /// Whether `topic` is one of this group's changelog topics.
    pub fn is_changelog(&self, topic: &str) -> bool {
        is_changelog_of(&self.group, topic)
    }

    /// Writes `entries` of source partition `source`/`partition` and waits until Kafka has
    /// them all; returns the changelog offset after the last one.
    ///
    /// # Errors
    /// The first entry Kafka refused; the caller writes them all again (entries are
    /// idempotent).
    pub async fn write(
        &self,
        source: &str,
        partition: i32,
        entries: &[Entry<'_>],
    ) -> Result<i64, KafkaError> {
        self.enqueue(source, partition, entries)
            .await?
            .settled()
            .await
    }

    /// Hands `entries` of source partition `source`/`partition` to the producer without
    /// waiting for Kafka: the writes of several partitions are then in flight together, and
    /// [`Pending::settled`] waits for each.
    ///
    /// # Errors
    /// The producer refused an entry (not a full queue: that is waited out).
    pub async fn enqueue(
        &self,
        source: &str,
        partition: i32,
        entries: &[Entry<'_>],
    ) -> Result<Pending<'_>, KafkaError> {
        let acks = Acks::new(self.topic_of(source), true);
        for e in entries {
            if let Err(e) = self.send(&acks, partition, e).await {
                acks.all_handed();
                return Err(e);
            }
        }
        acks.all_handed();
        Ok(Pending {
            changelog: self,
            acks,
        })
    }

    /// Writes an entry that changes nothing (the tombstone of a source offset no partition
    /// reaches) to the changelog of `source`/`partition` and waits for it: its acknowledgement
    /// says what the cluster's clock reads, before the partition fires here.
    ///
    /// # Errors
    /// Kafka did not take it.
    pub async fn probe(&self, source: &str, partition: i32) -> Result<(), KafkaError> {
        (self
            .write(source, partition, &[Entry::Gone(MAX_OFFSET)])
            .await)
            .map(drop)
    }

    /// Writes `entries` without waiting for Kafka: a failure is logged (the records it names
    /// may fire again after a restore; they are never lost).
    pub async fn write_later(&self, source: &str, partition: i32, entries: &[Entry<'_>]) {
        let acks = Acks::new(self.topic_of(source), false);
        for e in entries {
            if let Err(e) = self.send(&acks, partition, e).await {
                warn!(topic = acks.topic(), partition, error = %e, "changelog write failed");
            }
        }
        // The last report, when it comes, keeps the cluster's clock fresh ([`acks::Counted`]);
        // here when every report came before this.
        if acks.all_handed() {
            if let Some(stamp) = acks.stamp() {
                self.kafka_clock.acknowledged(acks.topic(), stamp);
            }
        }
    }

    /// Writes the tombstones of records that are gone (delivered), without waiting; a record
    /// whose group was not written yet has no entry, and gets none ([`unlogged`]).
    pub async fn gone(&self, store: &Store, ids: impl Iterator<Item = RecordId>) {
        let _ordered = self.unlogged.ordered().await;
        let mut by_pid: HashMap<Pid, Vec<Entry<'_>>> = HashMap::new();
        for id in ids.filter(|id| !self.unlogged.take(*id)) {
            by_pid
                .entry(id.pid())
                .or_default()
                .push(Entry::Gone(id.offset()));
        }
        for (pid, entries) in by_pid {
            if let Some((topic, partition)) = store.partition_of(pid) {
                self.write_later(&topic, partition, &entries).await;
            }
        }
    }

    /// Enqueues one entry of the write `acks` counts, waiting while librdkafka's queue is
    /// full.
    async fn send(
        &self,
        acks: &Arc<Acks>,
        partition: i32,
        e: &Entry<'_>,
    ) -> Result<(), KafkaError> {
        let key = e.key();
        let payload = e.payload();
        acks.handing();
        let mut opaque = acks.clone();
        loop {
            let mut r = BaseRecord::<[u8], [u8], Arc<Acks>>::with_opaque_to(acks.topic(), opaque)
                .partition(partition)
                .key(&key);
            if let Some(p) = &payload {
                r = r.payload(p);
            }
            match self.producer.send(r) {
                Ok(()) => return Ok(()),
                Err((
                    KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull),
                    r,
                )) => {
                    opaque = r.delivery_opaque;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err((e, _)) => {
                    acks.not_taken();
                    return Err(e);
                }
            }
        }
    }

    /// Waits (blocking) until every entry written so far is acknowledged, at most `wait`.
    ///
    /// # Errors
    /// Some were not acknowledged in time.
    pub fn flush(&self, wait: Duration) -> Result<(), KafkaError> {
        self.producer.flush(wait)
    }

    /// The cluster's clock as the acknowledgements of changelog writes teach it.
    pub fn kafka_clock(&self) -> &Arc<KafkaClock> {
        &self.kafka_clock
    }

    /// Which records' values are copied, which pointed at.
    pub fn values(&self) -> &Arc<values::Values> {
        &self.values
    }

    /// The producer, for its first id request at start.
    pub fn producer(&self) -> &ChangelogProducer {
        &self.producer
    }
}

/// Entries of one changelog partition handed to the producer ([`Changelog::enqueue`]), not
/// yet known to be acknowledged.
pub struct Pending<'c> {
    changelog: &'c Changelog,
    acks: Arc<Acks>,
}

impl std::fmt::Debug for Pending<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("topic", &self.acks.topic())
            .finish_non_exhaustive()
    }
}

impl Pending<'_> {
    /// Waits until Kafka has every entry; returns the changelog offset after the last one.
    ///
    /// # Errors
    /// The first entry Kafka refused; the caller writes them all again (entries are
    /// idempotent).
    pub async fn settled(self) -> Result<i64, KafkaError> {
        let (next, stamp) = self.acks.settled().await?;
        if let Some(stamp) = stamp {
            let clock = &self.changelog.kafka_clock;
            clock.acknowledged(self.acks.topic(), stamp);
        }
        Ok(next)
    }
}

/// What an ingest group changed, per source partition, as changelog entries: its records
/// (pointers where their source topic keeps them: [`values`]), then what they removed
/// (replaced or cancelled). `stamps` are the source records' timestamps, in the order of
/// `ops`; `topic_of` names each partition's topic; `logged` says whether a record (its
/// partition, its offset) gets an entry (one that fired before its group was written does not).
pub fn group_entries<'a, 't>(
    changelog: &Changelog,
    (ops, stamps): (&'a [IngestOp], &[Option<u64>]),
    applied: &Applied,
    topic_of: impl Fn(Pid) -> Option<&'t str>,
    mut logged: impl FnMut(Pid, i64) -> bool,
) -> HashMap<Pid, Vec<Entry<'a>>> {
    let mut by_pid: HashMap<Pid, Vec<Entry<'a>>> = HashMap::new();
    for (i, op) in ops.iter().enumerate() {
        if let IngestOp::Schedule {
            pid,
            offset,
            schedule,
        } = op
        {
            if !logged(*pid, *offset) {
                continue;
            }
            let entry = match topic_of(*pid) {
                Some(topic) => changelog.values.entry(
                    topic,
                    *offset,
                    schedule,
                    stamps.get(i).copied().flatten(),
                ),
                None => Entry::Record(*offset, schedule),
            };
            by_pid.entry(*pid).or_default().push(entry);
        }
    }
    for rid in &applied.removed {
        by_pid
            .entry(rid.pid())
            .or_default()
            .push(Entry::Gone(rid.offset()));
    }
    by_pid
}

/// Whether `topic` is one of consumer group `group`'s changelog topics.
pub fn is_changelog_of(group: &str, topic: &str) -> bool {
    topic
        .strip_prefix(group)
        .and_then(|t| t.strip_prefix('-'))
        .is_some_and(|t| t.ends_with("-changelog"))
}

/// The changelog topic of source topic `source` in consumer group `group`.
pub fn topic_name(group: &str, source: &str) -> String {
    format!("{group}-{source}-changelog")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changelog_topics_are_named_by_group_and_source() {
        assert_eq!(
            topic_name("kafka-delay", "delay.orders"),
            "kafka-delay-delay.orders-changelog"
        );
    }
}
