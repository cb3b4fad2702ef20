//! Whether a transaction committed, read from the log: after a commit call that failed
//! without saying (its answer lost on a connection that broke, a fatal error after the commit
//! request was sent), the records the transaction wrote are the only witness.

use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use super::Placed;

/// Whether the transactional record at `placed` is committed: `Some(true)` once a
/// read-committed consumer (made from `client`, which must be allowed to read the topic)
/// reads it, `Some(false)` once the partition's last stable offset is past it and it was not
/// read (its transaction aborted), `None` when neither happens within `within` (its
/// transaction still open) or the log cannot be read. Blocking.
pub fn committed(client: &ClientConfig, placed: &Placed, within: Duration) -> Option<bool> {
    let (topic, partition, offset) = placed;
    let consumer: BaseConsumer = client
        .clone()
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", "read_committed")
        .create()
        .ok()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, *partition, Offset::Offset(*offset))
        .ok()?;
    consumer.assign(&tpl).ok()?;
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) if m.partition() == *partition => return Some(m.offset() == *offset),
            // Read up to the last stable offset without it: aborted if that is past it.
            Some(Err(KafkaError::PartitionEOF(_))) => {
                let (_, stable) = consumer
                    .fetch_watermarks(topic, *partition, Duration::from_secs(5))
                    .ok()?;
                if stable > *offset {
                    return Some(false);
                }
            }
            _ => {}
        }
    }
    None
}
