//! Handing a due record to the producer: its own headers plus the provenance headers, built
//! straight into librdkafka's; a full queue is waited out.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::BaseRecord;

use super::reports::Sent;
use super::Publisher;
use crate::store::Store;
use kafka_delay_core::id::RecordId;
use kafka_delay_core::record::names;
use kafka_delay_core::record::StoredRecord;

impl Publisher {
    /// The record's headers and the provenance headers added to every published record
    /// ([`provenance`]).
    pub(crate) fn provenance(
        &self,
        id: RecordId,
        record: &StoredRecord,
        fired_ms: u64,
    ) -> OwnedHeaders {
        provenance(&self.store, id, record, fired_ms)
    }

    /// Hands a record to the producer; its outcome arrives through [`Reports`]. A full queue
    /// is waited out; any other refusal is returned with the record.
    pub(crate) async fn produce(&self, mut sent: Arc<Sent>) -> Result<(), (KafkaError, Arc<Sent>)> {
        // The produce call borrows the topic, key and value from this handle while the record
        // travels as the delivery opaque.
        let borrowed = sent.clone();
        let record = &borrowed.record;
        let mut headers = Some(self.provenance(sent.id, record, sent.sent_ms));
        loop {
            let mut rec =
                BaseRecord::<[u8], [u8], Arc<Sent>>::with_opaque_to(record.target(), sent);
            if let Some(h) = headers.take() {
                rec = rec.headers(h);
            }
            if let Some(k) = record.key() {
                rec = rec.key(k);
            }
            if let Some(v) = record.value() {
                rec = rec.payload(v);
            }
            match self.producer.send(rec) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), rec)) => {
                    sent = rec.delivery_opaque;
                    headers = rec.headers;
                    self.metrics
                        .fire
                        .produce_errors
                        .with_label_values(&["queue_full"])
                        .inc();
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err((e, rec)) => return Err((e, rec.delivery_opaque)),
            }
        }
    }
}

/// `n` in decimal digits, written at the end of `buf`.
fn decimal(n: i64, buf: &mut [u8; 20]) -> &[u8] {
    let mut rest = n.unsigned_abs();
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    if n < 0 {
        at -= 1;
        buf[at] = b'-';
    }
    &buf[at..]
}

/// The record's headers and the provenance headers added to every published record, built
/// straight into librdkafka's headers (no copy of the record's own first, no string per
/// number, the source topic read in place).
pub(crate) fn provenance(
    store: &Store,
    id: RecordId,
    record: &StoredRecord,
    fired_ms: u64,
) -> OwnedHeaders {
    let build = |topic: &str, partition: i32| {
        let mut digits = [[0u8; 20]; 4];
        let [p, o, d, f] = &mut digits;
        let added = [
            (names::ORIGIN_TOPIC, topic.as_bytes()),
            (names::ORIGIN_PARTITION, decimal(i64::from(partition), p)),
            (names::ORIGIN_OFFSET, decimal(id.offset(), o)),
            (names::DUE_MS, decimal(record.due_ms() as i64, d)),
            (names::FIRED_MS, decimal(fired_ms as i64, f)),
        ];
        let own = record.headers().map(|h| (h.key, h.value));
        own.chain(added.into_iter().map(|(k, v)| (k, Some(v))))
            .fold(
                OwnedHeaders::new_with_capacity(record.header_count() + added.len()),
                |acc, (key, value)| acc.insert(rdkafka::message::Header { key, value }),
            )
    };
    store
        .with_partition(id.pid(), build)
        .unwrap_or_else(|| build("", 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_writes_what_to_string_writes() {
        for n in [0, 7, 10, 31, 1_765_000_000_123, -1, -42, i64::MAX, i64::MIN] {
            let mut buf = [0u8; 20];
            assert_eq!(decimal(n, &mut buf), n.to_string().as_bytes(), "{n}");
        }
    }
}
