//! What a failed produce means: classified by librdkafka error code into transient failures
//! (retried with backoff, without limit) and permanent ones (retried a bounded number of
//! times, then dead-lettered).

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use kafka_delay_core::record::Reason;

/// How failed deliveries are retried.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Attempts before a permanently failing record is dead-lettered.
    pub max_attempts: u32,
    /// Longest backoff, ms.
    pub backoff_max_ms: u64,
}

impl RetryPolicy {
    /// Backoff after `attempt` failures: 100 ms doubling, capped.
    pub fn backoff_ms(&self, attempt: u32) -> u64 {
        100u64
            .saturating_mul(1u64 << attempt.saturating_sub(1).min(20))
            .min(self.backoff_max_ms)
    }
}

/// What a failed produce means for the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Retry later, without limit.
    Transient,
    /// Retry a bounded number of times, then dead-letter with this reason.
    Permanent(Reason),
}

/// Every error kind [`classify`] returns, and `dead_letter` for a dead letter not written yet
/// (the `kind` label of the produce-error metric).
pub const ERROR_KINDS: [&str; 8] = [
    "unknown_topic",
    "authorization",
    "rejected",
    "timeout",
    "queue_full",
    "transient",
    "other",
    "dead_letter",
];

/// Classifies a produce error, with a bounded label for metrics.
pub fn classify(err: &KafkaError) -> (Failure, &'static str) {
    use RDKafkaErrorCode as C;
    match err.rdkafka_error_code() {
        Some(C::UnknownTopicOrPartition | C::UnknownTopic | C::UnknownPartition) => {
            (Failure::Permanent(Reason::TargetNotFound), "unknown_topic")
        }
        Some(C::TopicAuthorizationFailed | C::ClusterAuthorizationFailed) => {
            (Failure::Permanent(Reason::TargetDenied), "authorization")
        }
        Some(
            C::MessageSizeTooLarge
            | C::InvalidMessageSize
            | C::InvalidMessage
            | C::InvalidRecord
            | C::PolicyViolation,
        ) => (Failure::Permanent(Reason::DeliveryFailed), "rejected"),
        Some(C::MessageTimedOut) => (Failure::Transient, "timeout"),
        Some(C::QueueFull) => (Failure::Transient, "queue_full"),
        Some(_) => (Failure::Transient, "transient"),
        None => (Failure::Transient, "other"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_is_capped() {
        let p = RetryPolicy {
            max_attempts: 3,
            backoff_max_ms: 1_000,
        };
        assert_eq!(
            (1..=6).map(|a| p.backoff_ms(a)).collect::<Vec<_>>(),
            vec![100, 200, 400, 800, 1_000, 1_000]
        );
        assert_eq!(p.backoff_ms(u32::MAX), 1_000);
    }

    #[test]
    fn errors_are_classified_by_code() {
        let e = |c| KafkaError::MessageProduction(c);
        assert_eq!(
            classify(&e(RDKafkaErrorCode::UnknownTopicOrPartition)).0,
            Failure::Permanent(Reason::TargetNotFound)
        );
        assert_eq!(
            classify(&e(RDKafkaErrorCode::UnknownTopic)).0,
            Failure::Permanent(Reason::TargetNotFound)
        );
        assert_eq!(
            classify(&e(RDKafkaErrorCode::TopicAuthorizationFailed)).0,
            Failure::Permanent(Reason::TargetDenied)
        );
        assert_eq!(
            classify(&e(RDKafkaErrorCode::MessageSizeTooLarge)).0,
            Failure::Permanent(Reason::DeliveryFailed)
        );
        assert_eq!(
            classify(&e(RDKafkaErrorCode::MessageTimedOut)).0,
            Failure::Transient
        );
        assert_eq!(
            classify(&e(RDKafkaErrorCode::NotLeaderForPartition)).0,
            Failure::Transient
        );
        assert_eq!(classify(&KafkaError::Canceled).0, Failure::Transient);
        // Every kind is one of the pre-registered metric labels.
        for code in [
            RDKafkaErrorCode::UnknownTopic,
            RDKafkaErrorCode::TopicAuthorizationFailed,
            RDKafkaErrorCode::MessageSizeTooLarge,
            RDKafkaErrorCode::MessageTimedOut,
            RDKafkaErrorCode::QueueFull,
            RDKafkaErrorCode::NotLeaderForPartition,
        ] {
            assert!(ERROR_KINDS.contains(&classify(&e(code)).1), "{code:?}");
        }
        assert!(ERROR_KINDS.contains(&classify(&KafkaError::Canceled).1));
    }
}
