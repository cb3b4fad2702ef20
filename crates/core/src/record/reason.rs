//! Why a record was dead-lettered: stable machine-readable codes (the `delay-error` header) and a
//! human sentence (the `delay-error-detail` header). The codes are a public contract, listed in
//! `schemas/dead-letter.schema.json`; never rename one.

use std::fmt;

/// A stable reason code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// No `delay-target` (or `scheduler-target-topic`) header.
    MissingTarget,
    /// The target is not a legal Kafka topic name (empty, too long, illegal characters).
    InvalidTarget,
    /// The target is an internal topic (`__*`).
    TargetInternal,
    /// The target matches the source pattern: publishing there would loop.
    TargetLoop,
    /// The target does not match the configured allow-list pattern.
    TargetNotAllowed,
    /// No due time: no `delay-until`, `delay-after`, `scheduler-epoch` and no delay in the topic name.
    MissingDueTime,
    /// A due-time header could not be parsed (negative, fraction, overflow, epoch seconds...).
    InvalidDueTime,
    /// More than one way of giving the due time was used at once.
    ConflictingDueTime,
    /// The due time is further ahead than the configured maximum delay.
    DueTooFar,
    /// A control header is not UTF-8 or has no value.
    InvalidHeader,
    /// A control header appears more than once with different values.
    ConflictingHeaders,
    /// A compatibility-mode (`scheduler-*`) record has no key to identify it.
    MissingId,
    /// The record is larger than the configured maximum.
    Oversized,
    /// At fire time the target topic did not exist, after the configured attempts.
    TargetNotFound,
    /// At fire time the broker refused the target (authorization), after the configured attempts.
    TargetDenied,
    /// At fire time the record was refused for another permanent reason, after the attempts.
    DeliveryFailed,
    /// A retry header (`retry-after`, `retry-attempt`, `retry-max-attempts`,
    /// `retry-first-failed-at`) could not be parsed.
    InvalidRetryHeader,
    /// A retried record used up its attempts (written to the target's dead-letter topic).
    RetriesExhausted,
}

impl Reason {
    /// Every reason, in a stable order.
    pub const ALL: [Reason; 18] = [
        Reason::MissingTarget,
        Reason::InvalidTarget,
        Reason::TargetInternal,
        Reason::TargetLoop,
        Reason::TargetNotAllowed,
        Reason::MissingDueTime,
        Reason::InvalidDueTime,
        Reason::ConflictingDueTime,
        Reason::DueTooFar,
        Reason::InvalidHeader,
        Reason::ConflictingHeaders,
        Reason::MissingId,
        Reason::Oversized,
        Reason::TargetNotFound,
        Reason::TargetDenied,
        Reason::DeliveryFailed,
        Reason::InvalidRetryHeader,
        Reason::RetriesExhausted,
    ];

    /// The code written to the `delay-error` header and used as a metric label.
    pub fn code(self) -> &'static str {
        match self {
            Reason::MissingTarget => "missing-target",
            Reason::InvalidTarget => "invalid-target",
            Reason::TargetInternal => "target-internal",
            Reason::TargetLoop => "target-loop",
            Reason::TargetNotAllowed => "target-not-allowed",
            Reason::MissingDueTime => "missing-due-time",
            Reason::InvalidDueTime => "invalid-due-time",
            Reason::ConflictingDueTime => "conflicting-due-time",
            Reason::DueTooFar => "due-too-far",
            Reason::InvalidHeader => "invalid-header",
            Reason::ConflictingHeaders => "conflicting-headers",
            Reason::MissingId => "missing-id",
            Reason::Oversized => "oversized",
            Reason::TargetNotFound => "target-not-found",
            Reason::TargetDenied => "target-denied",
            Reason::DeliveryFailed => "delivery-failed",
            Reason::InvalidRetryHeader => "invalid-retry-header",
            Reason::RetriesExhausted => "retries-exhausted",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

/// A record that cannot be scheduled: a reason code and a sentence for a person.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reject {
    /// The stable code.
    pub reason: Reason,
    /// What was wrong, naming the header and value.
    pub detail: String,
}

impl Reject {
    /// A rejection with `reason` and `detail`.
    pub fn new(reason: Reason, detail: impl Into<String>) -> Self {
        Self {
            reason,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for Reject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.reason, self.detail)
    }
}

impl std::error::Error for Reject {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_kebab_case_and_match_the_schema() {
        let codes: Vec<&str> = Reason::ALL.iter().map(|r| r.code()).collect();
        let mut unique = codes.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), codes.len());
        for c in &codes {
            assert!(
                c.bytes().all(|b| b.is_ascii_lowercase() || b == b'-'),
                "{c}"
            );
        }
        let schema: serde_json::Value =
            serde_json::from_str(include_str!("../../../../schemas/dead-letter.schema.json"))
                .expect("schema parses");
        let listed: Vec<&str> = schema["properties"]["headers"]["properties"]["delay-error"]
            ["enum"]
            .as_array()
            .expect("delay-error enum in the schema")
            .iter()
            .map(|v| v.as_str().expect("string"))
            .collect();
        assert_eq!(
            listed, codes,
            "schemas/dead-letter.schema.json lists every reason in order"
        );
    }
}
