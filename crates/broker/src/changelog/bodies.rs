//! The restore's side of pointers: the values of pointed-at records, read back from their
//! source topic ([`super::values`] decides which entries are pointers).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use tracing::error;

use super::restore::{poll, restore_consumer, Part, RestoreError};
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

    /// The consumer it made, if it made one.
    pub(super) fn into_consumer(self) -> Option<BaseConsumer> {
        self.consumer
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
        // Each pointer's source offset and place, in offset order.
        let mut wanted: Vec<(i64, usize)> = entries
            .iter()
            .enumerate()
            .filter_map(|(i, e)| match e {
                Restored::Pointer { offset, .. } => Some((*offset, i)),
                _ => None,
            })
            .collect();
        if wanted.is_empty() {
            return Ok(());
        }
        wanted.sort_unstable();
        let Some((topic, partition)) = store.partition_of(part.pid) else {
            return Err(RestoreError::Kafka {
                topic: part.topic.clone(),
                partition: part.partition,
                source: KafkaError::Subscription("source partition unknown to the store".into()),
            });
        };
        // Resolved as the source's records are read, without a copy of their values.
        let mut mismatched = Vec::new();
        self.read(&topic, partition, &wanted, |i, value| {
            fill(entries, i, value, &mut mismatched);
        })
        .map_err(|source| RestoreError::Kafka {
            topic: topic.clone(),
            partition,
            source,
        })?;
        let lost = settle(entries, mismatched);
        if !lost.is_empty() {
            error!(%topic, partition, records = lost.len(), first = ?lost.first(),
                   "changelog entries point at source records that are gone: these records \
                    cannot be restored (a source topic's records deleted by hand, or the topic \
                    made again; --changelog-copy-values copies every value)");
        }
        Ok(())
    }

    /// Reads the records at the `wanted` offsets of `topic`/`partition` (ascending, each with
    /// a place) and hands each place the value at its offset; a place whose offset the
    /// partition no longer has is left out.
    fn read(
        &mut self,
        topic: &str,
        partition: i32,
        wanted: &[(i64, usize)],
        mut found: impl FnMut(usize, Option<&[u8]>),
    ) -> Result<(), KafkaError> {
        if self.consumer.is_none() {
            let c =
                restore_consumer(self.config, topic, "read_committed").map_err(|e| match e {
                    RestoreError::Kafka { source, .. } => source,
                    other => KafkaError::ClientCreation(other.to_string()),
                })?;
            self.consumer = Some(c);
        }
        let consumer = self.consumer.as_ref().expect("made above");
        // Asked once per partition, and again when an offset is past the end asked: the
        // offsets before the start are gone, and none past the end can be pointed at.
        let key = (topic.to_owned(), partition);
        let last = wanted.last().map_or(-1, |&(o, _)| o);
        let (low, high) = match self.marks.get(&key) {
            Some(&(low, high)) if last < high => (low, high),
            _ => {
                let marks = consumer.fetch_watermarks(topic, partition, self.wait)?;
                self.marks.insert(key, marks);
                marks
            }
        };
        let wanted = &wanted[wanted.partition_point(|&(o, _)| o < low)..];
        let wanted = &wanted[..wanted.partition_point(|&(o, _)| o < high)];
        let mut i = 0;
        while i < wanted.len() {
            let reading_on = matches!(&self.at, Some((t, p, next))
                if t == topic && *p == partition && (0..=GAP).contains(&(wanted[i].0 - next)));
            if !reading_on {
                let mut tpl = TopicPartitionList::new();
                tpl.add_partition_offset(topic, partition, Offset::Offset(wanted[i].0))?;
                consumer.assign(&tpl)?;
                self.at = Some((topic.to_owned(), partition, wanted[i].0));
            }
            let deadline = Instant::now() + self.wait;
            'read: loop {
                match poll(consumer, Duration::from_millis(100)) {
                    None if Instant::now() >= deadline => {
                        return Err(KafkaError::MessageConsumption(
                            rdkafka::types::RDKafkaErrorCode::OperationTimedOut,
                        ))
                    }
                    None => {}
                    Some(Err(KafkaError::PartitionEOF(_))) => return Ok(()),
                    Some(Err(e)) => {
                        self.at = None;
                        return Err(e);
                    }
                    Some(Ok(m)) => {
                        let at = m.offset();
                        if let Some((.., next)) = &mut self.at {
                            *next = at + 1;
                        }
                        while i < wanted.len() && wanted[i].0 < at {
                            i += 1; // not there (an aborted transaction's, or compacted)
                        }
                        while i < wanted.len() && wanted[i].0 == at {
                            found(wanted[i].1, m.payload());
                            i += 1;
                        }
                        if i >= wanted.len() || wanted[i].0 - at > GAP {
                            break 'read;
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// Replaces the pointer at `entries[i]` by the record it stands for, given the value at its
/// source offset; one whose value is not the one it was written for stays, noted in
/// `mismatched`.
fn fill(
    entries: &mut [Restored],
    i: usize,
    value: Option<&[u8]>,
    mismatched: &mut Vec<(i64, String)>,
) {
    let Restored::Pointer {
        offset,
        envelope,
        value_len,
    } = &entries[i]
    else {
        return;
    };
    match resolve(envelope, *value_len, value) {
        Ok(record) => {
            entries[i] = Restored::Record {
                offset: *offset,
                record,
            }
        }
        Err(m) => mismatched.push((*offset, m.to_string())),
    }
}

/// Leaves out the pointers [`fill`] did not replace and says why each could not be restored:
/// not in the source topic, or (`mismatched`) not the record it was written for.
fn settle(entries: &mut Vec<Restored>, mut mismatched: Vec<(i64, String)>) -> Vec<(i64, String)> {
    mismatched.sort_unstable();
    let mut lost = Vec::new();
    entries.retain(|e| match e {
        Restored::Pointer { offset, .. } => {
            if mismatched
                .binary_search_by_key(offset, |(o, _)| *o)
                .is_err()
            {
                lost.push((*offset, "not in the source topic".to_owned()));
            }
            false
        }
        _ => true,
    });
    lost.extend(mismatched);
    lost
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_delay_core::record::StoredRecord;

    fn record(value: Option<&[u8]>) -> StoredRecord {
        StoredRecord::new(1_000, "t", Some(b"id"), Some(b"k"), value, [])
    }

    fn pointer(offset: i64, value_len: u32) -> Restored {
        Restored::Pointer {
            offset,
            envelope: record(None),
            value_len,
        }
    }

    #[test]
    fn pointers_take_their_values_and_the_rest_are_left_out_with_a_reason() {
        let mut entries = vec![
            pointer(5, 3),
            Restored::Record {
                offset: 6,
                record: record(Some(b"own")),
            },
            pointer(7, 3),
            pointer(8, 3),
            Restored::Gone { offset: 4 },
        ];
        let mut mismatched = Vec::new();
        fill(&mut entries, 0, Some(b"abc"), &mut mismatched);
        // The source record at 7 is another one (the topic made again): its value differs.
        fill(&mut entries, 2, Some(b"longer"), &mut mismatched);
        // A place that is no pointer is left as it is.
        fill(&mut entries, 1, Some(b"xyz"), &mut mismatched);
        // Nothing came for 8 (deleted from the source).
        let lost = settle(&mut entries, mismatched);
        assert_eq!(
            entries,
            [
                Restored::Record {
                    offset: 5,
                    record: record(Some(b"abc"))
                },
                Restored::Record {
                    offset: 6,
                    record: record(Some(b"own"))
                },
                Restored::Gone { offset: 4 },
            ]
        );
        assert_eq!(lost.len(), 2);
        assert_eq!(lost[0], (8, "not in the source topic".to_owned()));
        assert_eq!(lost[1].0, 7);
        assert_eq!(
            lost[1].1,
            "the source record's value is 6 bytes, the pointer says 3"
        );
    }
}
