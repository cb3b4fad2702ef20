//! The header contract: what a record on a delay topic means. Pure functions, no I/O.
//!
//! [`Contract::interpret`] turns a consumed record into a [`Command`] (schedule or cancel) or a
//! [`Reject`] with a stable reason. It never panics on any input; every control header is
//! checked for UTF-8, repetition and range, and every due time it returns is at most
//! `max_delay` ahead of `now`. Header names are listed in `schemas/headers.schema.json`.

mod compat;
mod reason;
mod retrying;
mod route;
mod stored;

pub use reason::{Reason, Reject};
pub use route::Route;
pub use stored::StoredRecord;

use regex::Regex;

use crate::retry::{self, Retries};
use crate::time;

/// Header names of the contract.
pub mod names {
    /// Topic to publish to.
    pub const TARGET: &str = "delay-target";
    /// Absolute due time: epoch ms or RFC 3339.
    pub const UNTIL: &str = "delay-until";
    /// Relative due time from the record timestamp: ms or a duration with units.
    pub const AFTER: &str = "delay-after";
    /// Identity for reschedule and cancel.
    pub const ID: &str = "delay-id";
    /// etf1 kafka-message-scheduler: due time in epoch seconds.
    pub const SCHEDULER_EPOCH: &str = "scheduler-epoch";
    /// etf1 kafka-message-scheduler: target topic.
    pub const SCHEDULER_TARGET_TOPIC: &str = "scheduler-target-topic";
    /// etf1 kafka-message-scheduler: key to publish with.
    pub const SCHEDULER_TARGET_KEY: &str = "scheduler-target-key";
    /// Provenance added on publish: source topic.
    pub const ORIGIN_TOPIC: &str = "delay-origin-topic";
    /// Provenance added on publish: source partition.
    pub const ORIGIN_PARTITION: &str = "delay-origin-partition";
    /// Provenance added on publish: source offset.
    pub const ORIGIN_OFFSET: &str = "delay-origin-offset";
    /// Provenance added on publish: the due time, epoch ms.
    pub const DUE_MS: &str = "delay-due-ms";
    /// Provenance added on publish: when the broker fired it, epoch ms.
    pub const FIRED_MS: &str = "delay-fired-ms";
    /// Dead letters: the reason code.
    pub const ERROR: &str = "delay-error";
    /// Dead letters: a sentence for a person.
    pub const ERROR_DETAIL: &str = "delay-error-detail";
    /// Headers with these prefixes belong to the broker and are not carried to the target.
    pub const RESERVED_PREFIXES: [&str; 2] = ["delay-", "scheduler-"];
}

/// One Kafka header; a header may have no value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Header name.
    pub key: String,
    /// Header value, `None` for a null header.
    pub value: Option<Vec<u8>>,
}

impl Header {
    /// A header with a value.
    pub fn new(key: &str, value: impl Into<Vec<u8>>) -> Self {
        Self {
            key: key.to_owned(),
            value: Some(value.into()),
        }
    }

    /// This header, borrowed: how the contract reads a consumed record's headers.
    pub fn borrowed(&self) -> HeaderRef<'_> {
        HeaderRef {
            key: &self.key,
            value: self.value.as_deref(),
        }
    }
}

/// A header of a consumed record, read where the Kafka client holds it: the contract copies
/// only the headers it carries on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderRef<'a> {
    /// Header name.
    pub key: &'a str,
    /// Header value, `None` for a null header.
    pub value: Option<&'a [u8]>,
}

impl HeaderRef<'_> {
    /// An owned copy.
    pub fn to_header(self) -> Header {
        Header {
            key: self.key.to_owned(),
            value: self.value.map(<[u8]>::to_vec),
        }
    }
}

/// A consumed record, as the contract sees it.
#[derive(Debug, Clone, Copy)]
pub struct Incoming<'a> {
    /// Source topic.
    pub topic: &'a str,
    /// Record timestamp in epoch ms, when the record has one.
    pub timestamp_ms: Option<u64>,
    /// Record key.
    pub key: Option<&'a [u8]>,
    /// Record value; `None` is a tombstone.
    pub value: Option<&'a [u8]>,
    /// Record headers in order.
    pub headers: &'a [HeaderRef<'a>],
}

/// What a valid record asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Publish the record at its due time (replacing any pending record with the same id).
    Schedule(StoredRecord),
    /// A consumer's retry: publish back to the target at the due time, with the attempt count.
    Retry {
        /// The record to publish back (its headers carry `retry-attempt`).
        schedule: StoredRecord,
        /// This retry's number, 1 on the first.
        attempt: u32,
    },
    /// A retry whose attempts are used up: publish at once to the target's dead-letter topic.
    Exhausted {
        /// The dead letter (its `target` is the dead-letter topic).
        schedule: StoredRecord,
        /// The target the consumer wanted the record back on.
        target: String,
    },
    /// Drop the pending record with this id, if any.
    Cancel {
        /// The identity given by `delay-id` (or the key, in compatibility mode).
        id: Vec<u8>,
    },
}

/// The rules records are checked against; built once from the configuration.
#[derive(Debug, Clone)]
pub struct Contract {
    /// Pattern of source topics; a target matching it would loop.
    pub source_pattern: Regex,
    /// When set, targets must match it.
    pub target_allow: Option<Regex>,
    /// Which targets the records of which source topics may name (none: any).
    pub routes: Vec<Route>,
    /// Allow targets starting with `__`.
    pub allow_internal_targets: bool,
    /// Furthest a due time may be ahead of now.
    pub max_delay_ms: u64,
    /// Largest key + value + headers accepted.
    pub max_record_bytes: usize,
    /// Retry topics and backoff policies.
    pub retry: Retries,
}

/// Longest legal Kafka topic name.
const MAX_TOPIC_LEN: usize = 249;

impl Contract {
    /// Interprets one consumed record at wall-clock time `now_ms`.
    ///
    /// # Errors
    /// A [`Reject`] with the reason the record cannot be scheduled.
    pub fn interpret(&self, rec: &Incoming<'_>, now_ms: u64) -> Result<Command, Reject> {
        let size = rec.key.map_or(0, <[u8]>::len)
            + rec.value.map_or(0, <[u8]>::len)
            + rec
                .headers
                .iter()
                .map(|h| h.key.len() + h.value.map_or(0, <[u8]>::len))
                .sum::<usize>();
        if size > self.max_record_bytes {
            return Err(Reject::new(
                Reason::Oversized,
                format!(
                    "record is {size} bytes (key + value + headers), over the {} byte maximum",
                    self.max_record_bytes
                ),
            ));
        }
        let target = control(rec.headers, names::TARGET)?;
        let compat_target = control(rec.headers, names::SCHEDULER_TARGET_TOPIC)?;
        let delay_id = control(rec.headers, names::ID)?;
        let compat = target.is_none()
            && (compat_target.is_some()
                || control(rec.headers, names::SCHEDULER_EPOCH)?.is_some()
                || (rec.value.is_none() && delay_id.is_none() && rec.key.is_some()));
        if compat {
            return self.interpret_compat(rec, compat_target, now_ms);
        }
        let id = delay_id.map(str::as_bytes);
        if rec.value.is_none() {
            if let Some(id) = id {
                return Ok(Command::Cancel { id: id.to_vec() });
            }
        }
        let Some(target) = target else {
            return Err(Reject::new(
                Reason::MissingTarget,
                "no delay-target header: name the topic to publish to",
            ));
        };
        self.check_target(target)?;
        route::check(&self.routes, rec.topic, target)?;
        if self.retry.topics.is_match(rec.topic)
            || control(rec.headers, retry::names::AFTER)?.is_some()
        {
            return self.interpret_retry(rec, target, id, now_ms);
        }
        let due_ms = self.due_time(rec, now_ms)?;
        Ok(Command::Schedule(StoredRecord::new(
            due_ms,
            target,
            id,
            rec.key,
            rec.value,
            user_headers(rec.headers),
        )))
    }

    /// Checks a dead-letter topic name: Kafka's rules, not internal, not looping; the
    /// allow-list does not apply (dead-letter topics are the operator's choice).
    ///
    /// # Errors
    /// A [`Reject`] naming the rule the name breaks.
    pub fn check_dead_letter_topic(&self, topic: &str) -> Result<(), Reject> {
        match self.check_target(topic) {
            Err(rej) if rej.reason != Reason::TargetNotAllowed => Err(rej),
            _ => Ok(()),
        }
    }

    /// `due` when it is within the maximum delay of `now_ms`.
    fn within_max_delay(&self, due: u64, now_ms: u64) -> Result<u64, Reject> {
        if due > now_ms.saturating_add(self.max_delay_ms) {
            return Err(Reject::new(
                Reason::DueTooFar,
                format!(
                    "due time {due} is {} ms ahead, over the maximum delay of {} ms",
                    due - now_ms,
                    self.max_delay_ms
                ),
            ));
        }
        Ok(due)
    }

    /// Checks a target topic name against Kafka's rules and the broker's policy.
    ///
    /// # Errors
    /// A [`Reject`] naming the rule the target breaks.
    pub fn check_target(&self, target: &str) -> Result<(), Reject> {
        let invalid = |why: &str| {
            Err(Reject::new(
                Reason::InvalidTarget,
                format!("target topic '{}' {why}", target.escape_debug()),
            ))
        };
        if target.is_empty() {
            return invalid("is empty");
        }
        if target.len() > MAX_TOPIC_LEN {
            return invalid("is longer than 249 characters");
        }
        if target == "." || target == ".." {
            return invalid("is not a legal topic name");
        }
        if !target
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
        {
            return invalid("has characters other than ASCII letters, digits, '.', '_' and '-'");
        }
        if target.starts_with("__") && !self.allow_internal_targets {
            return Err(Reject::new(
                Reason::TargetInternal,
                format!("target topic '{target}' is internal (starts with __)"),
            ));
        }
        if self.source_pattern.is_match(target) {
            return Err(Reject::new(
                Reason::TargetLoop,
                format!(
                    "target topic '{target}' matches the source pattern '{}' and would loop",
                    self.source_pattern
                ),
            ));
        }
        if let Some(allow) = &self.target_allow {
            if !allow.is_match(target) {
                return Err(Reject::new(
                    Reason::TargetNotAllowed,
                    format!("target topic '{target}' does not match the allow-list '{allow}'"),
                ));
            }
        }
        Ok(())
    }

    /// The due time from `delay-until`, `delay-after`, `scheduler-epoch` or the topic name.
    fn due_time(&self, rec: &Incoming<'_>, now_ms: u64) -> Result<u64, Reject> {
        let until = control(rec.headers, names::UNTIL)?;
        let after = control(rec.headers, names::AFTER)?;
        let epoch = control(rec.headers, names::SCHEDULER_EPOCH)?;
        let given = [until.is_some(), after.is_some(), epoch.is_some()];
        if given.iter().filter(|g| **g).count() > 1 {
            return Err(Reject::new(
                Reason::ConflictingDueTime,
                "more than one of delay-until, delay-after and scheduler-epoch: give one",
            ));
        }
        let base = rec.timestamp_ms.unwrap_or(now_ms);
        let invalid = |header: &str, e: time::TimeError| {
            Reject::new(Reason::InvalidDueTime, format!("{header}: {e}"))
        };
        let due = if let Some(until) = until {
            time::parse_epoch_ms_or_rfc3339(until).map_err(|e| invalid(names::UNTIL, e))?
        } else if let Some(after) = after {
            let digits = after.strip_prefix('-').unwrap_or(after);
            let ms = if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
                time::parse_integer(after, "milliseconds")
            } else {
                time::parse_duration_ms(after)
            }
            .map_err(|e| invalid(names::AFTER, e))?;
            base.checked_add(ms).ok_or_else(|| {
                Reject::new(
                    Reason::InvalidDueTime,
                    format!("delay-after: '{after}' overflows"),
                )
            })?
        } else if let Some(epoch) = epoch {
            let secs = time::parse_integer(epoch, "epoch seconds")
                .map_err(|e| invalid(names::SCHEDULER_EPOCH, e))?;
            secs.checked_mul(1000).ok_or_else(|| {
                Reject::new(
                    Reason::InvalidDueTime,
                    format!("scheduler-epoch: '{epoch}' is out of range"),
                )
            })?
        } else if let Some(ms) = topic_delay_ms(rec.topic) {
            base.saturating_add(ms)
        } else {
            return Err(Reject::new(
                Reason::MissingDueTime,
                format!(
                    "no delay-until or delay-after header, and topic '{}' does not end in a duration (like delay.30s)",
                    rec.topic
                ),
            ));
        };
        self.within_max_delay(due, now_ms)
    }
}

/// The fixed delay a topic name gives: the part after its last `.`, when it is a duration.
pub fn topic_delay_ms(topic: &str) -> Option<u64> {
    let (_, suffix) = topic.rsplit_once('.')?;
    time::parse_duration_ms(suffix).ok()
}

/// Whether a header name belongs to the broker (control or provenance).
pub fn is_reserved(name: &str) -> bool {
    names::RESERVED_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// The headers a record carries on to its target: all but the reserved ones, read in place.
fn user_headers<'a, 'h>(headers: &'a [HeaderRef<'h>]) -> impl Iterator<Item = HeaderRef<'h>> + 'a {
    headers.iter().copied().filter(|h| !is_reserved(h.key))
}

/// The value of a control header: absent, or one UTF-8 value (repeats must agree).
fn control<'h>(headers: &[HeaderRef<'h>], name: &str) -> Result<Option<&'h str>, Reject> {
    let mut found: Option<&'h str> = None;
    for h in headers.iter().filter(|h| h.key == name) {
        let Some(bytes) = h.value else {
            return Err(Reject::new(
                Reason::InvalidHeader,
                format!("header {name} has no value"),
            ));
        };
        let Ok(text) = std::str::from_utf8(bytes) else {
            return Err(Reject::new(
                Reason::InvalidHeader,
                format!("header {name} is not UTF-8"),
            ));
        };
        match found {
            Some(prev) if prev != text => {
                return Err(Reject::new(
                    Reason::ConflictingHeaders,
                    format!(
                    "header {name} appears more than once with different values ('{}' and '{}')",
                    prev.escape_debug(),
                    text.escape_debug()
                ),
                ))
            }
            _ => found = Some(text),
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests;
