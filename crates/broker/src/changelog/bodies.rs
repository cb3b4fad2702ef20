//! The restore's side of pointers: the values of pointed-at records, read back from their
//! source topic ([`super::values`] decides which entries are pointers).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use tracing::error;

use super::restore::{restore_consumer, Part, RestoreError};
use crate::config::Config;
use crate::store::Store;
use kafka_delay_core::changelog::{resolve, Restored};

/// Offsets further apart than this are reached by a seek rather than read through.
const GAP: i64 = 10_000;

/// Reads pointed-at values from the source topics; its consumer is made on first use.
pub(super) struct Bodies<'c> {
    config: &'c Config,
    consumer: Option<BaseConsumer>,
    wait: Duration,
    /// The partition the consumer reads, and the offset after the last record it returned:
    /// the next batch's offsets at or after it are read on without a seek.
    at: Option<(String, i32, i64)>,
    /// Each source partition's offsets as last asked: `(low, high)`.
    marks: HashMap<(String, i32), (i64, i64)>,
}

impl<'c> Bodies<'c> {
    pub(super) fn new(config: &'c Config, wait: Duration) -> Self {
        Self {
            config,
            consumer: None,
            wait,
            at: None,
            marks: HashMap::new(),
        }
    }

    /// Replaces each pointer in `entries` (of partition `part`) by the record it stands for,
    /// its value read from the source topic. A pointer whose source record is gone (deleted by
    /// hand, or the topic made again) cannot be restored: it is left out and logged.
    ///
    /// # Errors
    /// The source topic could not be read.
    pub(super) fn resolve(
        &mut self,
        store: &Store,
        part: &Part,
        entries: &mut Vec<Restored>,
    ) -> Result<(), RestoreError> {
        let wanted: Vec<i64> = entries
            .iter()
            .filter_map(|e| match e {
                Restored::Pointer { offset, .. } => Some(*offset),
                _ => None,
            })
            .collect();
        if wanted.is_empty() {
            return Ok(());
        }
        let Some((topic, partition)) = store.partition_of(part.pid) else {
            return Err(RestoreError::Kafka {
                topic: part.topic.clone(),
                partition: part.partition,
                source: KafkaError::Subscription("source partition unknown to the store".into()),
            });
        };
        let values =
            self.read(&topic, partition, wanted)
                .map_err(|source| RestoreError::Kafka {
                    topic: topic.clone(),
                    partition,
                    source,
                })?;
        let mut lost = Vec::new();
        entries.retain_mut(|e| {
            let Restored::Pointer {
                offset,
                envelope,
                value_len,
            } = e
            else {
                return true;
            };
            let offset = *offset;
            match values
                .get(&offset)
                .ok_or_else(|| "not in the source topic".to_owned())
                .and_then(|v| {
                    resolve(envelope, *value_len, v.as_deref()).map_err(|m| m.to_string())
                }) {
                Ok(record) => {
                    *e = Restored::Record { offset, record };
                    true
                }
                Err(why) => {
                    lost.push((offset, why));
                    false
                }
            }
        });
        if !lost.is_empty() {
            error!(%topic, partition, records = lost.len(), first = ?lost.first(),
                   "changelog entries point at source records that are gone: these records \
                    cannot be restored (a source topic's records deleted by hand, or the topic \
                    made again; --changelog-copy-values copies every value)");
        }
        Ok(())
    }

    /// The values at `wanted` (ascending) offsets of `topic`/`partition`; an offset the
    /// partition no longer has is left out.
    fn read(
        &mut self,
        topic: &str,
        partition: i32,
        mut wanted: Vec<i64>,
    ) -> Result<HashMap<i64, Option<Vec<u8>>>, KafkaError> {
        if self.consumer.is_none() {
            let c =
                restore_consumer(self.config, topic, "read_committed").map_err(|e| match e {
                    RestoreError::Kafka { source, .. } => source,
                    other => KafkaError::ClientCreation(other.to_string()),
                })?;
            self.consumer = Some(c);
        }
        let consumer = self.consumer.as_ref().expect("made above");
        wanted.sort_unstable();
        wanted.dedup();
        // Asked once per partition, and again when an offset is past the end asked: the
        // offsets before the start are gone, and none past the end can be pointed at.
        let key = (topic.to_owned(), partition);
        let last = wanted.last().copied().unwrap_or(-1);
        let (low, high) = match self.marks.get(&key) {
            Some(&(low, high)) if last < high => (low, high),
            _ => {
                let marks = consumer.fetch_watermarks(topic, partition, self.wait)?;
                self.marks.insert(key, marks);
                marks
            }
        };
        wanted.retain(|&o| o >= low && o < high);
        let mut out = HashMap::with_capacity(wanted.len());
        let mut i = 0;
        while i < wanted.len() {
            let reading_on = matches!(&self.at, Some((t, p, next))
                if t == topic && *p == partition && (0..=GAP).contains(&(wanted[i] - next)));
            if !reading_on {
                let mut tpl = TopicPartitionList::new();
                tpl.add_partition_offset(topic, partition, Offset::Offset(wanted[i]))?;
                consumer.assign(&tpl)?;
                self.at = Some((topic.to_owned(), partition, wanted[i]));
            }
            let deadline = Instant::now() + self.wait;
            'read: loop {
                match consumer.poll(Duration::from_millis(100)) {
                    None if Instant::now() >= deadline => {
                        return Err(KafkaError::MessageConsumption(
                            rdkafka::types::RDKafkaErrorCode::OperationTimedOut,
                        ))
                    }
                    None => {}
                    Some(Err(KafkaError::PartitionEOF(_))) => return Ok(out),
                    Some(Err(e)) => {
                        self.at = None;
                        return Err(e);
                    }
                    Some(Ok(m)) => {
                        let at = m.offset();
                        if let Some((.., next)) = &mut self.at {
                            *next = at + 1;
                        }
                        while i < wanted.len() && wanted[i] < at {
                            i += 1; // not there (an aborted transaction's, or compacted)
                        }
                        if i < wanted.len() && wanted[i] == at {
                            out.insert(at, m.payload().map(<[u8]>::to_vec));
                            i += 1;
                        }
                        if i >= wanted.len() || wanted[i] - at > GAP {
                            break 'read;
                        }
                    }
                }
            }
        }
        Ok(out)
    }
}
