//! The changelog: each source partition's pending state, in a compacted Kafka topic, so that
//! the partition can move to another instance and a lost data directory loses nothing.
//!
//! Source topic `T` has the changelog topic `<group-id>-T-changelog`, with (at least) as many
//! partitions; source partition `p` writes to changelog partition `p`, named explicitly, never
//! through the partitioner. Its entries ([`Entry`]), keyed so that compaction keeps only the
//! latest of each:
//!
//! | key                   | value                                   |
//! |-----------------------|-----------------------------------------|
//! | `r` ++ offset (8 B)   | the pending record (its stored bytes), or a tombstone once it is gone |
//! | `o`                   | the next source offset ingest will consume (8 B) |
//!
//! Every change reaches RocksDB first and the changelog second: ingest stores a group, writes
//! it to the changelog, waits for the acknowledgement, and only then stores the source offsets
//! for commit and hands the records to the scheduler. A delete after delivery writes a
//! tombstone. See [`restore`] for the way back and [`handoff`] for partitions changing owner.

mod exactly;
pub mod handoff;
mod operate;
pub mod owners;
pub mod restore;
pub mod standby;
pub mod topics;

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use tracing::warn;

use crate::config::Config;
use crate::kafka::{base_config, KafkaSetupError};
use crate::store::{Pid, RecordId, Restored, Store, StoredRecord};

/// One change to a partition's pending state, to write.
#[derive(Debug, Clone, Copy)]
pub enum Entry<'a> {
    /// The record at this source offset is pending as given (new, or moved by an operator).
    Record(i64, &'a StoredRecord),
    /// The record at this source offset is gone (fired, cancelled, replaced).
    Gone(i64),
    /// Ingest consumed the source partition up to here (exclusive).
    SourceOffset(i64),
}

impl Entry<'_> {
    fn key(&self) -> Vec<u8> {
        match self {
            Entry::Record(offset, _) | Entry::Gone(offset) => {
                let mut k = Vec::with_capacity(9);
                k.push(b'r');
                k.extend_from_slice(&offset.to_be_bytes());
                k
            }
            Entry::SourceOffset(_) => b"o".to_vec(),
        }
    }

    fn payload(&self) -> Option<Vec<u8>> {
        match self {
            Entry::Record(_, record) => Some(record.encoded().to_vec()),
            Entry::Gone(_) => None,
            Entry::SourceOffset(next) => Some(next.to_be_bytes().to_vec()),
        }
    }
}

/// Reads a changelog entry back; `Err` names what is wrong with one that cannot be read.
///
/// # Errors
/// A key or value of the wrong shape, or a record that does not decode.
pub fn decode(key: Option<&[u8]>, payload: Option<&[u8]>) -> Result<Restored, String> {
    match (key, payload) {
        (Some([b'o']), Some(v)) => v
            .try_into()
            .map(|b| Restored::SourceOffset(i64::from_be_bytes(b)))
            .map_err(|_| format!("source offset of {} bytes", v.len())),
        (Some([b'r', rest @ ..]), value) => {
            let offset = i64::from_be_bytes(
                rest.try_into()
                    .map_err(|_| format!("record key of {} bytes", rest.len() + 1))?,
            );
            match value {
                None => Ok(Restored::Gone { offset }),
                Some(v) => StoredRecord::from_bytes(v.to_vec())
                    .map(|record| Restored::Record { offset, record }),
            }
        }
        (k, _) => Err(format!("unknown key {k:?}")),
    }
}

/// The changelog's producer and naming.
#[derive(Clone)]
pub struct Changelog {
    producer: FutureProducer,
    group: String,
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
    /// The changelog's idempotent producer (acks from every in-sync replica, no reordering).
    ///
    /// # Errors
    /// [`KafkaSetupError::Client`] for an invalid property.
    pub fn new(config: &Config) -> Result<Self, KafkaSetupError> {
        let mut c = base_config(config);
        c.set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "2")
            .set("compression.type", "lz4")
            .set("allow.auto.create.topics", "false")
            .set("message.timeout.ms", ACK_WAIT.as_millis().to_string());
        let producer = c.create().map_err(|source| KafkaSetupError::Client {
            client: "changelog producer",
            source,
        })?;
        Ok(Self {
            producer,
            group: config.kafka.group_id.clone(),
        })
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
        let topic = self.topic_of(source);
        let mut acks = Vec::with_capacity(entries.len());
        for e in entries {
            acks.push(self.send(&topic, partition, e).await?);
        }
        let mut next = -1;
        for ack in acks {
            match ack.await {
                Ok(Ok(delivery)) => next = next.max(delivery.offset + 1),
                Ok(Err((e, _))) => return Err(e),
                Err(_) => return Err(KafkaError::Canceled),
            }
        }
        Ok(next)
    }

    /// Writes `entries` without waiting for Kafka: a failure is logged (the records it names
    /// may fire again after a restore; they are never lost).
    pub async fn write_later(&self, source: &str, partition: i32, entries: &[Entry<'_>]) {
        let topic = self.topic_of(source);
        for e in entries {
            match self.send(&topic, partition, e).await {
                Ok(ack) => drop(ack),
                Err(e) => warn!(%topic, partition, error = %e, "changelog write failed"),
            }
        }
    }

    /// Writes the tombstones of records that are gone (delivered), without waiting.
    pub async fn gone(&self, store: &Store, ids: impl Iterator<Item = RecordId>) {
        let mut by_pid: HashMap<Pid, Vec<Entry<'_>>> = HashMap::new();
        for id in ids {
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

    /// Enqueues one entry, waiting while librdkafka's queue is full.
    async fn send(
        &self,
        topic: &str,
        partition: i32,
        e: &Entry<'_>,
    ) -> Result<rdkafka::producer::DeliveryFuture, KafkaError> {
        let key = e.key();
        let payload = e.payload();
        loop {
            let mut r = FutureRecord::<[u8], [u8]>::to(topic)
                .partition(partition)
                .key(&key);
            if let Some(p) = &payload {
                r = r.payload(p);
            }
            match self.producer.send_result(r) {
                Ok(ack) => return Ok(ack),
                Err((
                    KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull),
                    _,
                )) => {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err((e, _)) => return Err(e),
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

    /// The producer, for its first id request at start.
    pub fn producer(&self) -> &FutureProducer {
        &self.producer
    }
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

    fn record(due: u64) -> StoredRecord {
        StoredRecord::new(due, "out", Some(b"id-1"), Some(b"k"), Some(b"v"), [])
    }

    #[test]
    fn entries_read_back_as_what_they_wrote() {
        let r = record(1_234);
        for (e, want) in [
            (
                Entry::Record(7, &r),
                Restored::Record {
                    offset: 7,
                    record: r.clone(),
                },
            ),
            (Entry::Gone(7), Restored::Gone { offset: 7 }),
            (Entry::SourceOffset(99), Restored::SourceOffset(99)),
        ] {
            assert_eq!(decode(Some(&e.key()), e.payload().as_deref()), Ok(want));
        }
        // A record and its tombstone share a key, so compaction keeps only the tombstone.
        assert_eq!(Entry::Record(7, &r).key(), Entry::Gone(7).key());
        assert_ne!(Entry::Gone(7).key(), Entry::Gone(8).key());
    }

    #[test]
    fn entries_of_the_wrong_shape_are_named() {
        assert!(decode(Some(b"x"), Some(b"1"))
            .unwrap_err()
            .contains("unknown key"));
        assert!(decode(Some(b"o"), Some(b"123"))
            .unwrap_err()
            .contains("3 bytes"));
        assert!(decode(Some(b"r12"), None)
            .unwrap_err()
            .contains("record key"));
        assert!(decode(None, None).is_err());
    }

    #[test]
    fn changelog_topics_are_named_by_group_and_source() {
        assert_eq!(
            topic_name("kafka-delay", "delay.orders"),
            "kafka-delay-delay.orders-changelog"
        );
    }
}
