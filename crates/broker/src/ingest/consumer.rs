//! The ingest consumer: its librdkafka settings, the group size, and reading what it holds
//! without waiting.

use std::sync::Arc;

use rdkafka::consumer::{Consumer, StreamConsumer};

use super::IngestContext;
use crate::changelog::handoff::Handoff;
use crate::config::Config;
use crate::kafka::{base_config, KafkaSetupError};
use crate::metrics::Metrics;
use crate::store::Store;

/// Most records in one group. A group only fills when the consumer has a backlog. With `sync`
/// each group costs one fsync (with a changelog, one round trip to Kafka), so larger groups
/// mean fewer of them; without it, a large group
/// keeps a runtime worker from the publisher for longer and delivery lateness grows
/// (docs/decisions.md has the figures).
pub fn max_group(waits_per_group: bool) -> usize {
    if waits_per_group {
        2_048
    } else {
        512
    }
}

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
        // With exactly-once the offsets commit in ingest's transactions.
        (
            "enable.auto.commit",
            if config.cluster.transactional_id.is_some() {
                "false"
            } else {
                "true"
            },
        ),
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
        // A rebalance moves only the partitions that change owner; the others keep firing.
        (
            "partition.assignment.strategy",
            if config.cluster.changelog {
                "cooperative-sticky"
            } else {
                "range,roundrobin"
            },
        ),
    ];
    for (k, v) in defaults {
        if !config.kafka.properties.iter().any(|p| p.key == k) {
            c.set(k, v);
        }
    }
    c
}

/// Creates the consumer and subscribes it to the source pattern.
///
/// # Errors
/// [`KafkaSetupError::Client`] for an invalid property or pattern.
pub fn consumer(
    config: &Config,
    store: Arc<Store>,
    metrics: Metrics,
    handoff: Option<Arc<Handoff>>,
) -> Result<StreamConsumer<IngestContext>, KafkaSetupError> {
    let mut c = consumer_config(config);
    // The group coordinator shows every member's client.id: with a changelog it carries where
    // this instance's HTTP server is, so any instance can name a partition's owner.
    if let Some(addr) = handoff.as_ref().and_then(|h| h.advertised()) {
        c.set(
            "client.id",
            format!("{}{addr}", crate::changelog::owners::CLIENT_ID_PREFIX),
        );
    }
    let consumer: StreamConsumer<IngestContext> = c
        .create_with_context(IngestContext {
            store,
            metrics,
            handoff,
        })
        .map_err(|source| KafkaSetupError::Client {
            client: "consumer",
            source,
        })?;
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
        })?;
    Ok(consumer)
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
