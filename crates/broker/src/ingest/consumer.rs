//! The ingest consumer: its librdkafka settings, its subscription, and reading what it holds
//! without waiting.

use std::sync::Arc;

use rdkafka::consumer::{Consumer, StreamConsumer};

use super::IngestContext;
use super::Rebalance;
use crate::config::Config;
use crate::kafka::{base_config, KafkaSetupError};
use crate::metrics::Metrics;

/// The ingest consumer's librdkafka configuration (also what `kafka-delay-bench` gives its
/// passthrough consumer, so that both read Kafka the same way).
pub fn consumer_config(config: &Config) -> rdkafka::ClientConfig {
    let mut c = base_config(config);
    c.set("group.id", &config.kafka.group_id)
        .set("enable.auto.offset.store", "false")
        .set("allow.auto.create.topics", "false")
        .set(
            "topic.metadata.refresh.interval.ms",
            crate::config::millis(config.kafka.topic_refresh).to_string(),
        );
    if let Some(id) = &config.kafka.instance_id {
        c.set("group.instance.id", id);
    }
    let defaults = [
        ("enable.auto.commit", "true"),
        ("auto.commit.interval.ms", "1000"),
        ("auto.offset.reset", "earliest"),
        // Low enough that a restarted instance is consuming again within seconds even where
        // the cluster does not honour static membership; the minimum Kafka brokers allow.
        ("session.timeout.ms", "6000"),
        ("isolation.level", "read_committed"),
        // Kafka answers a fetch as soon as data arrives; brokers that hold a fetch for its
        // whole wait (librdkafka's mock cluster) would add up to this much to ingest latency.
        ("fetch.wait.max.ms", "100"),
        // Once more than `queued.min.messages` (100,000) records wait in the local queue,
        // librdkafka postpones the next fetch by this much (its default is a whole second): a
        // backlog bigger than that was consumed in bursts with one-second pauses between them.
        ("fetch.queue.backoff.ms", "10"),
        // Consumer lag per partition for the metrics.
        ("statistics.interval.ms", "5000"),
    ];
    set_defaults(&mut c, config, &defaults);
    c
}

/// Sets each of `defaults` the operator did not set with `--kafka-config`.
fn set_defaults(c: &mut rdkafka::ClientConfig, config: &Config, defaults: &[(&str, &str)]) {
    for (k, v) in defaults {
        if !config.kafka.properties.iter().any(|p| p.key == *k) {
            c.set(*k, *v);
        }
    }
}

/// Creates the ingest consumer (not yet subscribed: see [`subscribe`]). A `client_id` names
/// the member to the rest of the group (with several instances: its HTTP address, for the
/// owners lookup); the mode's `defaults` are set where the operator set nothing.
///
/// # Errors
/// [`KafkaSetupError::Client`] for an invalid property.
pub fn consumer(
    config: &Config,
    metrics: Metrics,
    rebalance: Arc<dyn Rebalance>,
    client_id: Option<&str>,
    defaults: &[(&str, &str)],
) -> Result<StreamConsumer<IngestContext>, KafkaSetupError> {
    let mut c = consumer_config(config);
    if let Some(id) = client_id {
        c.set("client.id", id);
    }
    set_defaults(&mut c, config, defaults);
    c.create_with_context(IngestContext { metrics, rebalance })
        .map_err(|source| KafkaSetupError::Client {
            client: "consumer",
            source,
        })
}

/// Subscribes the consumer to the source pattern.
///
/// # Errors
/// [`KafkaSetupError::Client`] for an invalid pattern.
pub fn subscribe(
    config: &Config,
    consumer: &StreamConsumer<IngestContext>,
) -> Result<(), KafkaSetupError> {
    // librdkafka treats a subscription starting with ^ as a regex.
    let pattern = config.contract.source_pattern.as_str();
    let subscription = if pattern.starts_with('^') {
        pattern.to_owned()
    } else {
        format!("^.*{pattern}")
    };
    consumer
        .subscribe(&[&subscription])
        .map_err(|source| KafkaSetupError::Client {
            client: "consumer subscription",
            source,
        })
}

/// Polls `future` once and returns its output if it is ready at once: how a group takes what
/// the consumer already holds without arming a timer per record.
pub fn ready_now<F: std::future::Future>(future: F) -> Option<F::Output> {
    let mut future = std::pin::pin!(future);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match future.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(out) => Some(out),
        std::task::Poll::Pending => None,
    }
}

/// A consumer that librdkafka will never use again: a fatal error, such as a static member
/// fenced because the coordinator gave its instance id a new member id (librdkafka rejoins
/// with a new member id after its session timed out, for example while the coordinator was
/// down past `session.timeout.ms`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broken(pub String);

impl Broken {
    /// The fatal error `consumer` hit, if it did (said in the log).
    pub(super) fn of(consumer: &StreamConsumer<IngestContext>) -> Option<Broken> {
        let (code, reason) = consumer.client().fatal_error()?;
        tracing::error!(?code, %reason, "the Kafka consumer failed for good; ingest ends");
        Some(Broken(format!("{code:?}: {reason}")))
    }
}

impl std::fmt::Display for Broken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
