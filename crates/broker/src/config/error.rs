//! Why a flag or variable cannot be used. Every message names the flag and says what to change.

/// A flag (or its `KAFKA_DELAY_*` variable) that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Neither a cluster nor the embedded one.
    #[error("no Kafka: give --brokers HOST:PORT (KAFKA_DELAY_BROKERS) or --embedded-kafka")]
    NoKafka,
    /// Two flags that exclude each other.
    #[error("{0} and {1} exclude each other: give one")]
    Exclusive(&'static str, &'static str),
    /// A flag given with nothing in it.
    #[error("{flag} is empty: give {want}")]
    Empty {
        /// The flag.
        flag: &'static str,
        /// What it takes.
        want: &'static str,
    },
    /// A regex that does not compile.
    #[error("{flag} '{pattern}' is not a valid regex: {source}")]
    Regex {
        /// The flag.
        flag: String,
        /// The pattern given.
        pattern: String,
        /// The regex crate's error.
        source: regex::Error,
    },
    /// A value below the least that works.
    #[error("{flag} must be at least {min} (got {got})")]
    AtLeast {
        /// The flag.
        flag: &'static str,
        /// The least value.
        min: &'static str,
        /// The value given.
        got: String,
    },
    /// A value that does not parse or does not fit, with the reason.
    #[error("{flag} '{value}': {detail}")]
    Invalid {
        /// The flag.
        flag: String,
        /// The value given.
        value: String,
        /// What is wrong and what to give instead.
        detail: String,
    },
    /// A librdkafka property that kafka-delay sets itself.
    #[error("--kafka-config {key} is set by kafka-delay; use {instead}")]
    OwnedProperty {
        /// The property.
        key: String,
        /// The flag to use, or why none is needed.
        instead: &'static str,
    },
    /// Records kept in memory for longer than the wheel holds them.
    #[error(
        "--keep-in-memory-within {keep} is longer than --horizon {horizon}; records due after the \
         horizon are not in the wheel, so keeping them in memory only costs memory"
    )]
    KeepBeyondHorizon {
        /// `--keep-in-memory-within`.
        keep: String,
        /// `--horizon`.
        horizon: String,
    },
    /// A retry topic the broker would not consume as one.
    #[error("--retry-topic '{topic}' must match both --source-pattern '{source_pattern}' and --retry-topics '{retry_topics}'")]
    RetryTopicUnmatched {
        /// The topic.
        topic: String,
        /// `--source-pattern`.
        source_pattern: String,
        /// `--retry-topics`.
        retry_topics: String,
    },
    /// A retry policy whose dead-letter template gives no usable topic.
    #[error("{flag}: dead-letter '{template}' does not give a usable topic (for target 'orders': {detail})")]
    DeadLetterTemplate {
        /// `--retry-default` or `--retry-policy REGEX`.
        flag: String,
        /// The template.
        template: String,
        /// Why the topic it gives cannot be used.
        detail: String,
    },
}

impl ConfigError {
    /// A flag whose value is wrong for the reason given.
    pub fn invalid(
        flag: impl Into<String>,
        value: impl Into<String>,
        detail: impl ToString,
    ) -> Self {
        Self::Invalid {
            flag: flag.into(),
            value: value.into(),
            detail: detail.to_string(),
        }
    }

    /// A flag whose regex does not compile.
    pub fn regex(flag: impl Into<String>, pattern: &str, source: regex::Error) -> Self {
        Self::Regex {
            flag: flag.into(),
            pattern: pattern.to_owned(),
            source,
        }
    }
}
