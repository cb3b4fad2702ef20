//! The topics ingest writes to on first use: the targets' retry dead-letter topics.

use std::collections::HashSet;
use std::sync::Arc;

use rdkafka::producer::FutureProducer;
use tracing::{info, warn};

use crate::config::Config;
use crate::kafka::ensure_topic;

/// Creates topics the broker writes to on first use (the retry dead-letter topics), once each.
#[derive(Clone)]
pub struct TopicCreator {
    config: Arc<Config>,
    producer: FutureProducer,
    known: HashSet<String>,
}

impl std::fmt::Debug for TopicCreator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopicCreator")
            .field("known", &self.known.len())
            .finish_non_exhaustive()
    }
}

impl TopicCreator {
    /// Topics are created with `config.topics.partitions` partitions.
    pub fn new(config: Arc<Config>, producer: FutureProducer) -> Self {
        Self {
            config,
            producer,
            known: HashSet::new(),
        }
    }

    /// Makes sure `topic` exists. When it cannot be created the record is still scheduled: the
    /// fire path retries it and then dead-letters it to the broker's topic, so nothing is lost.
    pub(super) async fn ensure(&mut self, topic: &str) {
        if self.known.contains(topic) {
            return;
        }
        let partitions = self.config.topics.partitions;
        match ensure_topic(&self.config, &self.producer, topic, partitions).await {
            Ok(()) => {
                info!(%topic, "retry dead-letter topic ready");
                self.known.insert(topic.to_owned());
            }
            Err(e) => warn!(%topic, error = %e, "cannot create a retry dead-letter topic"),
        }
    }
}
