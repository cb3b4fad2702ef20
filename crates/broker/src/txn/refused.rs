//! Topics the cluster refuses to let this producer write, learned from its transactions.
//!
//! A transaction that names a topic the authorizer refuses fails as a whole: the coordinator
//! refuses to add its partitions, librdkafka purges every record of the transaction (the
//! refused record's report says "purged" like all the others), and aborting it fails as well
//! when no partition could be added, which leaves the producer unusable. The only place that
//! names the refused topic is librdkafka's log line for the AddPartitionsToTxn answer, which
//! [`TxnContext`] reads. The loop then names the records of that topic as refused (they go to
//! the dead-letter topic as `target-denied`), and [`Refused`] keeps the topic for a while so
//! that later records to it are refused before they spoil another transaction.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::client::DefaultClientContext;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::error::KafkaError;
use rdkafka::message::{DeliveryResult, Message};
use rdkafka::producer::{ProducerContext, ThreadedProducer};
use rdkafka::ClientContext;
use tracing::warn;

use super::acks::Tallies;

/// How long a refused topic is refused without asking the cluster again (an operator may
/// grant the access meanwhile).
pub(crate) const REMEMBER: Duration = Duration::from_secs(30);

/// The transactional producer, and the topics its coordinator refused since
/// [`TxnProducer::take_refused`] was last called. Its delivery reports are counted into the
/// transaction's tally ([`super::acks`]).
#[derive(Clone)]
pub struct TxnProducer {
    producer: ThreadedProducer<TxnContext>,
    refused: Arc<Mutex<Vec<String>>>,
}

impl TxnProducer {
    /// A transactional producer of `config` (which has a `transactional.id`).
    ///
    /// # Errors
    /// librdkafka refuses the configuration.
    pub fn new(config: &ClientConfig) -> Result<Self, KafkaError> {
        let refused = Arc::new(Mutex::new(Vec::new()));
        let producer = config.create_with_context(TxnContext {
            refused: refused.clone(),
            tallies: Tallies::default(),
        })?;
        Ok(Self { producer, refused })
    }

    /// The topics refused since the last call.
    pub(crate) fn take_refused(&self) -> Vec<String> {
        std::mem::take(&mut *self.refused.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The tallies its delivery reports are counted into.
    pub(super) fn tallies(&self) -> &Tallies {
        &rdkafka::producer::Producer::context(&self.producer).tallies
    }
}

impl std::ops::Deref for TxnProducer {
    type Target = ThreadedProducer<TxnContext>;
    fn deref(&self) -> &Self::Target {
        &self.producer
    }
}

impl std::fmt::Debug for TxnProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxnProducer").finish_non_exhaustive()
    }
}

/// The transactional producer's context: librdkafka's log as usual, the refused topics its
/// `ADDPARTS` lines name, and each delivery report counted into its transaction's tally.
#[derive(Debug)]
pub struct TxnContext {
    refused: Arc<Mutex<Vec<String>>>,
    tallies: Tallies,
}

impl ProducerContext for TxnContext {
    /// The record's place in its transaction, with the tally's number.
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, opaque: usize) {
        match result {
            Ok(m) => self.tallies.report(opaque, Ok((m.offset(), m.timestamp()))),
            Err((e, _)) => self.tallies.report(opaque, Err(e)),
        }
    }
}

impl ClientContext for TxnContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        if let Some(topic) = refused_topic(fac, log_message) {
            let mut refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
            if !refused.iter().any(|t| t == topic) {
                refused.push(topic.to_owned());
            }
        }
        DefaultClientContext.log(level, fac, log_message);
    }
}

/// The topic of librdkafka's `ADDPARTS` line for a partition the coordinator refused for
/// authorization: `... Failed to add partition "TOPIC" [P] to transaction: Broker: Topic
/// authorization failed`.
pub(crate) fn refused_topic<'a>(fac: &str, line: &'a str) -> Option<&'a str> {
    if fac != "ADDPARTS" || !line.ends_with("Topic authorization failed") {
        return None;
    }
    let (_, rest) = line.split_once("Failed to add partition \"")?;
    let (topic, _) = rest.split_once("\" [")?;
    Some(topic)
}

/// Refused topics and when each was learned.
#[derive(Debug, Default)]
pub(crate) struct Refused {
    topics: HashMap<String, Instant>,
}

impl Refused {
    /// Remembers `topics` as refused now.
    pub(crate) fn learn(&mut self, topics: Vec<String>, now: Instant) {
        if !topics.is_empty() {
            warn!(?topics, remember_s = REMEMBER.as_secs(),
                  "the cluster refuses this principal writing these topics; their records are refused");
        }
        for t in topics {
            self.topics.insert(t, now);
        }
    }

    /// Whether `topic` was refused less than [`REMEMBER`] before `now`.
    pub(crate) fn refuses(&mut self, topic: &str, now: Instant) -> bool {
        self.topics
            .retain(|_, at| now.saturating_duration_since(*at) < REMEMBER);
        self.topics.contains_key(topic)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refused_topic_is_read_from_librdkafkas_line_and_nothing_else_is() {
        let line = "TxnCoordinator/2: Failed to add partition \"team-a.secret\" [1] to \
                    transaction: Broker: Topic authorization failed";
        assert_eq!(refused_topic("ADDPARTS", line), Some("team-a.secret"));
        assert_eq!(refused_topic("TXNERR", line), None);
        let other = "TxnCoordinator/2: Failed to add partition \"x-changelog\" [0] to \
                     transaction: Broker: Operation not attempted";
        assert_eq!(refused_topic("ADDPARTS", other), None);
    }

    #[test]
    fn a_refused_topic_is_refused_for_a_while_then_tried_again() {
        let (mut r, t0) = (Refused::default(), Instant::now());
        r.learn(vec!["a".into()], t0);
        assert!(r.refuses("a", t0 + Duration::from_secs(1)));
        assert!(!r.refuses("b", t0));
        assert!(!r.refuses("a", t0 + REMEMBER));
    }
}
