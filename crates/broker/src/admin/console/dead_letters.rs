//! Reading dead-letter topics for the console: which topics hold dead letters, and their newest
//! records with their reason codes, filtered like `kafka-delay replay`'s `--filter`s.
//!
//! Reads with a consumer of its own that joins no group and commits nothing, from the end of
//! each partition backwards by a bounded number of records, so a look at a large topic costs a
//! bounded read.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::answers::DeadLetter;
use crate::admin::answers::HeaderText;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use regex::Regex;
use serde::Serialize;

use crate::config::KafkaProp;
use crate::kafka::{client_config, headers_from};
use crate::replay::Filter;
use kafka_delay_core::record::{names, Header};

/// Most records read back from each partition for one listing.
const READ_BACK: i64 = 5_000;
/// Most bytes of a value shown in a listing (the whole value is in the topic).
const VALUE_SHOWN: usize = 16 * 1024;
/// A listing stops when nothing arrives for this long (a partition whose last offset is a
/// transaction marker or was compacted away never shows its high watermark's predecessor).
const IDLE: Duration = Duration::from_secs(1);
/// Longest a listing reads.
const READ_FOR: Duration = Duration::from_secs(10);

/// Where dead letters are.
#[derive(Debug, Clone, Default)]
pub struct Source {
    /// Bootstrap servers.
    pub brokers: String,
    /// Extra librdkafka properties.
    pub kafka_config: Vec<KafkaProp>,
    /// The broker's own dead-letter topic (rejected input, undeliverable records).
    pub topic: String,
    /// Topics named by the retry policies' dead-letter templates (`{target}` as any name).
    pub templates: Vec<Regex>,
}

/// A dead-letter topic and how many records it holds.
#[derive(Debug, Clone, Serialize)]
pub struct Topic {
    /// Its name.
    pub name: String,
    /// Partitions.
    pub partitions: usize,
    /// Records between the low and high watermarks of all its partitions.
    pub records: i64,
}

/// Turns a dead-letter template such as `{target}.dlt` into a regex for the topics it names.
pub fn template_regex(template: &str) -> Option<Regex> {
    let pattern = regex::escape(template).replace(r"\{target\}", ".+");
    Regex::new(&format!("^{pattern}$")).ok()
}

impl Source {
    /// Whether `name` is one of the dead-letter topics.
    pub fn is_dead_letter_topic(&self, name: &str) -> bool {
        name == self.topic || self.templates.iter().any(|r| r.is_match(name))
    }

    fn consumer(&self) -> Result<BaseConsumer, String> {
        client_config(&self.brokers, "kafka-delay-console", &self.kafka_config)
            .set("group.id", crate::config::CONSOLE_GROUP)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("allow.auto.create.topics", "false")
            .create()
            .map_err(|e| format!("cannot create a consumer: {e}"))
    }

    /// Every dead-letter topic that exists, with its size. Blocking.
    ///
    /// # Errors
    /// The cluster's answer when it cannot be asked.
    pub fn topics(&self) -> Result<Vec<Topic>, String> {
        let c = self.consumer()?;
        let md = c
            .fetch_metadata(None, Duration::from_secs(10))
            .map_err(|e| format!("cannot list topics: {e}"))?;
        let mut out = Vec::new();
        for t in md.topics() {
            let name = t.name();
            if !self.is_dead_letter_topic(name) {
                continue;
            }
            let mut records = 0;
            for p in t.partitions() {
                if let Ok((low, high)) = c.fetch_watermarks(name, p.id(), Duration::from_secs(5)) {
                    records += high - low;
                }
            }
            out.push(Topic {
                name: name.to_owned(),
                partitions: t.partitions().len(),
                records,
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// The newest records of `topic` that match every filter, newest first, at most `limit`.
    /// Blocking.
    ///
    /// # Errors
    /// A missing topic, or the cluster's answer when it cannot be read.
    pub fn newest(
        &self,
        topic: &str,
        filters: &[Filter],
        limit: usize,
    ) -> Result<Vec<DeadLetter>, String> {
        if !self.is_dead_letter_topic(topic) {
            return Err(format!(
                "'{topic}' is not a dead-letter topic (the broker's own or one a retry policy names)"
            ));
        }
        let c = self.consumer()?;
        let mut ends = assign_tail(&c, topic)?;
        if ends.is_empty() {
            return Ok(Vec::new());
        }
        let deadline = Instant::now() + READ_FOR;
        let mut last_record = Instant::now();
        // At most twice `limit` kept at a time: the newest `limit` are kept whenever it fills.
        let mut found: Vec<DeadLetter> = Vec::new();
        while !ends.is_empty() && Instant::now() < deadline && last_record.elapsed() < IDLE {
            let Some(msg) = c.poll(Duration::from_millis(200)) else {
                continue;
            };
            last_record = Instant::now();
            let msg = msg.map_err(|e| format!("reading '{topic}': {e}"))?;
            let (p, offset) = (msg.partition(), msg.offset());
            if ends.get(&p).is_some_and(|&high| offset + 1 >= high) {
                ends.remove(&p);
            }
            let headers = headers_from(msg.headers());
            if !filters.iter().all(|f| f.matches(msg.key(), &headers)) {
                continue;
            }
            found.push(row(topic, &msg, &headers));
            if found.len() >= 2 * limit {
                newest_first(&mut found, limit);
            }
        }
        newest_first(&mut found, limit);
        Ok(found)
    }
}

/// Assigns the last [`READ_BACK`] records of each partition of `topic`, and returns where
/// each partition ends now (partitions with no records are left out).
fn assign_tail(c: &BaseConsumer, topic: &str) -> Result<HashMap<i32, i64>, String> {
    let partitions = crate::kafka::partitions_of(c.client(), topic)
        .map_err(|e| format!("cannot read '{topic}': {e}"))?;
    if partitions.is_empty() {
        return Err(format!("no dead-letter topic '{topic}'"));
    }
    let mut tpl = TopicPartitionList::new();
    let mut ends = HashMap::new();
    for p in partitions {
        let (low, high) = c
            .fetch_watermarks(topic, p, Duration::from_secs(5))
            .map_err(|e| format!("cannot read the offsets of '{topic}': {e}"))?;
        if high > low {
            let from = low.max(high - READ_BACK);
            tpl.add_partition_offset(topic, p, Offset::Offset(from))
                .map_err(|e| e.to_string())?;
            ends.insert(p, high);
        }
    }
    if !ends.is_empty() {
        c.assign(&tpl)
            .map_err(|e| format!("cannot read '{topic}': {e}"))?;
    }
    Ok(ends)
}

/// A dead letter as the console shows it.
fn row(topic: &str, msg: &BorrowedMessage<'_>, headers: &[Header]) -> DeadLetter {
    let text = |v: Option<&[u8]>| v.map(|v| String::from_utf8_lossy(v).into_owned());
    let header = |name: &str| {
        headers
            .iter()
            .find(|h| h.key == name)
            .and_then(|h| text(h.value.as_deref()))
    };
    let payload = msg.payload();
    DeadLetter {
        topic: topic.to_owned(),
        partition: msg.partition(),
        offset: msg.offset(),
        timestamp_ms: msg.timestamp().to_millis().unwrap_or(0),
        reason: header(names::ERROR),
        detail: header(names::ERROR_DETAIL),
        target: header(names::TARGET),
        key: msg
            .key()
            .and_then(|k| std::str::from_utf8(k).ok())
            .map(str::to_owned),
        value: text(payload.map(|v| &v[..v.len().min(VALUE_SHOWN)])),
        value_bytes: payload.map(<[u8]>::len),
        value_hex: super::hex(payload),
        headers: headers
            .iter()
            .map(|h| HeaderText {
                key: h.key.clone(),
                value: text(h.value.as_deref()),
            })
            .collect(),
    }
}

/// Keeps the `limit` newest, newest first.
fn newest_first(found: &mut Vec<DeadLetter>, limit: usize) {
    found.sort_by_key(|d| std::cmp::Reverse(d.timestamp_ms));
    found.truncate(limit);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_name_the_topics_they_make() {
        let r = template_regex("{target}.dlt").unwrap();
        assert!(r.is_match("orders.dlt"));
        assert!(!r.is_match("orders.dltx"));
        assert!(!r.is_match(".dlt"));
        let r = template_regex("dlt.{target}").unwrap();
        assert!(r.is_match("dlt.payments"));
        assert!(!r.is_match("dltxpayments"));
    }
}
