//! A small client API for applications: delayed records, cancels and retries, built as rdkafka
//! records ready to send with any producer.
//!
//! ```no_run
//! # async fn f(producer: rdkafka::producer::FutureProducer, msg: rdkafka::message::OwnedMessage) {
//! use std::time::Duration;
//! use kafka_delay_client::DelayedRecord;
//!
//! // Publish "reminder" to `emails` in 15 minutes, replaceable and cancellable by its id.
//! let rec = DelayedRecord::new("delay.emails", "emails")
//!     .after(Duration::from_secs(900))
//!     .id("reminder-42")
//!     .key("user-42")
//!     .value("reminder");
//! producer.send(rec.record(), Duration::from_secs(5)).await.unwrap();
//!
//! // A consumed record that cannot be processed now: back on its topic in 30 s.
//! let retry = DelayedRecord::retry(&msg, "delay.retry")
//!     .retry_after(Duration::from_secs(30))
//!     .reason("inventory service unavailable");
//! producer.send(retry.record(), Duration::from_secs(5)).await.unwrap();
//! # }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod headers;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rdkafka::message::{Headers, Message, OwnedHeaders};
use rdkafka::producer::FutureRecord;

use kafka_delay_core::record::{is_reserved, names, Header};
use kafka_delay_core::retry::names as retry;

use crate::headers::{headers_from, headers_to};

/// A record for a delay topic: where it goes, when, and what it carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DelayedRecord {
    topic: String,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Vec<Header>,
}

impl DelayedRecord {
    /// A record produced to `delay_topic` (a topic kafka-delay consumes, such as `delay.orders`)
    /// to be published to `target`. Give a due time with [`after`](Self::after) or
    /// [`at`](Self::at), or use a delay topic whose name ends in a duration (`delay.30s`).
    pub fn new(delay_topic: impl Into<String>, target: &str) -> Self {
        Self {
            topic: delay_topic.into(),
            key: None,
            value: Some(Vec::new()),
            headers: vec![Header::new(names::TARGET, target)],
        }
    }

    /// Publish `delay` after the record's timestamp (the `delay-after` header, in ms).
    pub fn after(self, delay: Duration) -> Self {
        self.without(&[names::UNTIL, names::AFTER])
            .header(names::AFTER, delay.as_millis().to_string())
    }

    /// Publish at `time` (the `delay-until` header, in epoch ms).
    pub fn at(self, time: SystemTime) -> Self {
        let ms = time
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        self.without(&[names::UNTIL, names::AFTER])
            .header(names::UNTIL, ms.to_string())
    }

    /// An id: a later record with the same id (and key, so it lands on the same partition)
    /// replaces this one; [`cancel`](Self::cancel) drops it.
    pub fn id(self, id: &str) -> Self {
        self.without(&[names::ID]).header(names::ID, id)
    }

    /// The record key (published with it).
    pub fn key(mut self, key: impl Into<Vec<u8>>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// The record value (published with it).
    pub fn value(mut self, value: impl Into<Vec<u8>>) -> Self {
        self.value = Some(value.into());
        self
    }

    /// A header published with the record. Names starting with `delay-` or `scheduler-` are
    /// the broker's and are not published.
    pub fn header(mut self, name: &str, value: impl Into<Vec<u8>>) -> Self {
        self.headers.push(Header::new(name, value));
        self
    }

    /// Cancels the pending record `id`. Use the key the record was scheduled with, so the
    /// cancel lands on the same partition (ids are scoped to a partition).
    pub fn cancel(delay_topic: impl Into<String>, id: &str, key: Option<&[u8]>) -> Self {
        Self {
            topic: delay_topic.into(),
            key: key.map(<[u8]>::to_vec),
            value: None,
            headers: vec![Header::new(names::ID, id)],
        }
    }

    /// A retry of a consumed record: its key, value and headers, sent to `retry_topic` (such as
    /// `delay.retry`) to come back on the topic it was consumed from. Without
    /// [`retry_after`](Self::retry_after) the target's backoff policy sets the wait. The broker
    /// counts the attempts in `retry-attempt`; when they are used up the record goes to the
    /// target's dead-letter topic.
    pub fn retry<M: Message>(msg: &M, retry_topic: impl Into<String>) -> Self {
        let mut headers: Vec<Header> = headers_from(msg.headers())
            .into_iter()
            .filter(|h| !is_reserved(&h.key) && h.key != retry::AFTER && h.key != retry::REASON)
            .collect();
        headers.push(Header::new(names::TARGET, msg.topic()));
        Self {
            topic: retry_topic.into(),
            key: msg.key().map(<[u8]>::to_vec),
            value: msg.payload().map(<[u8]>::to_vec),
            headers,
        }
    }

    /// Retry after `delay` (the `retry-after` header, as a duration in ms).
    pub fn retry_after(self, delay: Duration) -> Self {
        self.without(&[retry::AFTER])
            .header(retry::AFTER, format!("{}ms", delay.as_millis()))
    }

    /// Why the record failed (`retry-reason`); kept on the dead-letter record.
    pub fn reason(self, reason: &str) -> Self {
        self.without(&[retry::REASON]).header(retry::REASON, reason)
    }

    /// At most `attempts` retries for this record (lowers the target's policy, never raises it).
    pub fn max_attempts(self, attempts: u32) -> Self {
        self.without(&[retry::MAX_ATTEMPTS])
            .header(retry::MAX_ATTEMPTS, attempts.to_string())
    }

    /// The delay topic to produce to.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The headers, in order.
    pub fn headers(&self) -> &[Header] {
        &self.headers
    }

    /// The record, ready for [`FutureProducer::send`](rdkafka::producer::FutureProducer::send).
    pub fn record(&self) -> FutureRecord<'_, [u8], [u8]> {
        let mut r = FutureRecord::to(&self.topic).headers(headers_to(&self.headers));
        if let Some(k) = &self.key {
            r = r.key(k.as_slice());
        }
        if let Some(v) = &self.value {
            r = r.payload(v.as_slice());
        }
        r
    }

    fn without(mut self, names: &[&str]) -> Self {
        self.headers.retain(|h| !names.contains(&h.key.as_str()));
        self
    }
}

/// Which retry this record is: 0 for a first delivery, n on the n-th retry (`retry-attempt`).
pub fn attempt<M: Message>(msg: &M) -> u32 {
    header_text(msg, retry::ATTEMPT)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// When the record first failed, epoch ms (`retry-first-failed-at`), on a retried record.
pub fn first_failed_at<M: Message>(msg: &M) -> Option<u64> {
    header_text(msg, retry::FIRST_FAILED_AT).and_then(|v| v.parse().ok())
}

fn header_text<M: Message>(msg: &M, name: &str) -> Option<String> {
    let headers = msg.headers()?;
    headers
        .iter()
        .filter(|h| h.key == name)
        .last()
        .and_then(|h| h.value)
        .and_then(|v| std::str::from_utf8(v).ok())
        .map(str::to_owned)
}

/// The headers of `record` as rdkafka's owned headers (for producers that take them apart).
pub fn owned_headers(record: &DelayedRecord) -> OwnedHeaders {
    headers_to(&record.headers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_delay_core::record::{Command, Contract, Incoming};
    use rdkafka::message::{Header as KHeader, OwnedMessage, Timestamp};

    const NOW: u64 = 1_763_700_000_000;

    fn contract() -> Contract {
        Contract {
            source_pattern: regex::Regex::new(r"^delay\..+").unwrap(),
            target_allow: None,
            routes: Vec::new(),
            allow_internal_targets: false,
            max_delay_ms: 86_400_000,
            max_record_bytes: 10_000,
            retry: kafka_delay_core::retry::Retries::default(),
        }
    }

    /// What the broker makes of the record: the helper's output must satisfy the contract.
    fn interpret(r: &DelayedRecord) -> Command {
        contract()
            .interpret(
                &Incoming {
                    topic: r.topic(),
                    timestamp_ms: Some(NOW),
                    key: r.key.as_deref(),
                    value: r.value.as_deref(),
                    headers: &r.headers().iter().map(Header::borrowed).collect::<Vec<_>>(),
                },
                NOW,
            )
            .expect("the broker accepts what the helper builds")
    }

    fn consumed(headers: &[(&str, &str)]) -> OwnedMessage {
        let mut h = OwnedHeaders::new();
        for (k, v) in headers {
            h = h.insert(KHeader {
                key: k,
                value: Some(v.as_bytes()),
            });
        }
        OwnedMessage::new(
            Some(b"payload".to_vec()),
            Some(b"key-1".to_vec()),
            "orders".into(),
            Timestamp::CreateTime(NOW as i64),
            0,
            7,
            Some(h),
        )
    }

    #[test]
    fn a_delayed_record_is_scheduled_as_built() {
        let r = DelayedRecord::new("delay.emails", "emails")
            .after(Duration::from_secs(90))
            .id("r-1")
            .key("k")
            .value("v")
            .header("trace", "abc");
        let Command::Schedule(s) = interpret(&r) else {
            panic!("not a schedule")
        };
        assert_eq!(s.target(), "emails");
        assert_eq!(s.due_ms(), NOW + 90_000);
        assert_eq!(s.id(), Some(&b"r-1"[..]));
        assert_eq!(
            (s.key().unwrap(), s.value().unwrap()),
            (&b"k"[..], &b"v"[..])
        );
        assert_eq!(s.to_headers(), vec![Header::new("trace", "abc")]);
        let at = DelayedRecord::new("delay.emails", "emails")
            .after(Duration::from_secs(1))
            .at(UNIX_EPOCH + Duration::from_millis(NOW + 5_000));
        let Command::Schedule(s) = interpret(&at) else {
            panic!("not a schedule")
        };
        assert_eq!(s.due_ms(), NOW + 5_000, "at() replaces after()");
        let rec = r.record();
        assert_eq!(rec.topic, "delay.emails");
        assert_eq!(rec.headers.as_ref().map(|h| h.count()), Some(4));
    }

    #[test]
    fn cancel_is_an_id_with_a_null_value() {
        let c = DelayedRecord::cancel("delay.emails", "r-1", Some(b"k"));
        assert_eq!(
            interpret(&c),
            Command::Cancel {
                id: b"r-1".to_vec()
            }
        );
        assert!(c.record().payload.is_none());
    }

    #[test]
    fn a_retry_copies_the_record_and_comes_back_to_its_topic() {
        let msg = consumed(&[
            ("trace", "abc"),
            ("retry-attempt", "2"),
            ("retry-first-failed-at", "1763600000000"),
            ("retry-after", "1"),
            ("delay-origin-topic", "delay.retry"),
        ]);
        assert_eq!(attempt(&msg), 2);
        assert_eq!(first_failed_at(&msg), Some(1_763_600_000_000));
        let r = DelayedRecord::retry(&msg, "delay.retry")
            .retry_after(Duration::from_millis(1_500))
            .reason("downstream 503");
        let Command::Retry {
            schedule: s,
            attempt,
        } = interpret(&r)
        else {
            panic!("not a retry")
        };
        assert_eq!(attempt, 3);
        assert_eq!(s.target(), "orders");
        assert_eq!(s.due_ms(), NOW + 1_500);
        assert_eq!(s.key(), Some(&b"key-1"[..]));
        assert_eq!(s.value(), Some(&b"payload"[..]));
        let names: Vec<&str> = s.headers().map(|h| h.key).collect();
        assert_eq!(
            names,
            [
                "trace",
                "retry-reason",
                "retry-attempt",
                "retry-first-failed-at"
            ]
        );
        assert_eq!(attempt_of_fresh(), 0);
    }

    fn attempt_of_fresh() -> u32 {
        attempt(&consumed(&[]))
    }

    #[test]
    fn max_attempts_sends_the_next_retry_to_the_dead_letter_topic() {
        let msg = consumed(&[("retry-attempt", "1")]);
        let r = DelayedRecord::retry(&msg, "delay.retry").max_attempts(1);
        assert!(matches!(interpret(&r), Command::Exhausted { .. }));
    }
}
