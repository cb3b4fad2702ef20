//! The publish task: due record -> target topic -> delivery report -> delete from the store.
//!
//! The fire protocol is the store's ([`Store::claim`], [`Store::read_claimed`],
//! [`Store::delivered`], [`Store::sync_if_owed`]); this module only drives it. For each batch of
//! due timers from the scheduler the store claims and reads the records (`fire.rs`: a record
//! already being published through another timer is skipped), the fire limits pick what goes
//! now, each is produced to its target with provenance headers (`produce.rs`), and its
//! delivery report goes to the completion task (`complete.rs`), which hands delivered records
//! back to the store in batches. At most `in_flight` records are between "produced" and
//! "deleted" at once: that window bounds the duplicates a crash can cause.
//!
//! Failures are classified by librdkafka error code (`failure.rs`). Transient ones (timeouts, broker down,
//! leader changes) are retried through the scheduler with exponential backoff, without limit:
//! the record is never dropped. Permanent ones (unknown target, authorization, too large) are
//! retried `fire_max_attempts` times and then dead-lettered. A retry goes back through the wheel,
//! so one unavailable target never holds up the others.

mod complete;
mod failure;
mod fire;
pub mod history;
mod produce;
pub mod reports;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::producer::Producer;
use tokio::sync::{mpsc, oneshot, watch, Semaphore};
use tracing::{error, warn};

use crate::dead_letter::{DeadLetter, DeadLetters};
use crate::metrics::Metrics;
use crate::scheduler::{Due, Inserts};
use crate::store::{ReadMark, Store};
use crate::BoxFuture;
pub(crate) use complete::{delete_delivered, observe_delivery};
pub use failure::{classify, Failure, RetryPolicy, ERROR_KINDS};
use kafka_delay_core::clock::Clock;
use kafka_delay_core::hashing::BuildMul;
use kafka_delay_core::id::RecordId;
use kafka_delay_core::limit::{Limiter, Limits};
pub(crate) use produce::provenance;
use reports::{Completions, PublishProducer, Reports, Sent};

#[derive(Debug, Default, Clone, Copy)]
struct Attempts {
    total: u32,
    permanent: u32,
}

type AttemptMap = Arc<Mutex<HashMap<RecordId, Attempts, BuildMul>>>;

/// Why a record did not reach its target this time.
#[derive(Debug)]
pub enum Fault {
    /// Kafka refused it, or did not acknowledge it in time.
    Kafka(KafkaError),
    /// Its transaction aborted for another reason (another record, a revoke, a fence): it
    /// goes again at once, not counted as an attempt.
    Again(String),
}

/// What became of one produced record.
#[derive(Debug)]
pub struct Outcome {
    sent: Arc<Sent>,
    result: Result<(), Fault>,
    /// When the delivery report arrived (epoch ms), before any queueing on our side.
    reported_ms: u64,
}

/// Everything the publish side needs.
#[derive(Clone)]
pub struct Publisher {
    /// The store.
    pub store: Arc<Store>,
    /// Idempotent producer whose delivery reports go to `reports`.
    pub producer: PublishProducer,
    /// Where outcomes go (the producer's context holds the same channel).
    pub reports: Reports,
    /// Dead-letter writer.
    pub dead: DeadLetters,
    /// Metrics.
    pub metrics: Metrics,
    /// Wall clock.
    pub clock: Arc<dyn Clock>,
    /// Back to the scheduler, for retries.
    pub retries: Inserts,
    /// Retry rules.
    pub policy: RetryPolicy,
    /// Most records between produce and delete.
    pub in_flight: usize,
    /// Fire rate limits and spreading.
    pub limits: Arc<Limits>,
    /// The most recently fired records, for the console.
    pub history: history::History,
    /// What the durability mode does around firing.
    pub delivery: Arc<dyn Delivery>,
}

/// What the durability mode does around firing. Built once at start (see
/// `crate::durability`); the publisher never asks which mode it runs in.
pub trait Delivery: Send + Sync + std::fmt::Debug {
    /// Sends records, each holding its in-flight permit, to their targets; each outcome
    /// reaches the completion task through [`Publisher::reports`]. Unless the mode says
    /// otherwise, each is produced at once and its outcome is its delivery report.
    fn send<'a>(&'a self, p: &'a Publisher, sents: Vec<Arc<Sent>>) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            for sent in sents {
                if let Err((e, sent)) = p.produce(sent).await {
                    p.reports.send(sent, Err(e));
                }
            }
        })
    }
    /// Records that reached their target or the dead-letter topic: their delete here (and
    /// wherever else the mode keeps them), unless the mode deleted them as they fired.
    fn finish<'a>(
        &'a self,
        p: &'a Publisher,
        done: Arc<Vec<Arc<Sent>>>,
        read_at: ReadMark,
    ) -> BoxFuture<'a, ()>;
    /// Writes a record that cannot be delivered to the dead-letter topic; `true` once it is
    /// there (and, where the mode deletes as it writes, deleted).
    /// Unless the mode says otherwise, it is written at once and the record is deleted with
    /// the delivered ones ([`Delivery::finish`]).
    fn dead_letter<'a>(
        &'a self,
        p: &'a Publisher,
        _sent: &'a Arc<Sent>,
        dl: &'a DeadLetter,
    ) -> BoxFuture<'a, bool> {
        Box::pin(p.dead_letter_now(dl))
    }
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("policy", &self.policy)
            .field("in_flight", &self.in_flight)
            .finish_non_exhaustive()
    }
}

impl Publisher {
    /// Runs until `shutdown` or until the scheduler closes its channel, then finishes the
    /// deliveries in flight (deleting what was acknowledged) and flushes the producer.
    pub async fn run(
        self,
        mut due: mpsc::Receiver<Vec<Due>>,
        mut shutdown: watch::Receiver<bool>,
        completions: Completions,
    ) {
        let sem = Arc::new(Semaphore::new(self.in_flight));
        let attempts: AttemptMap = Arc::default();
        let mut limiter = Limiter::new(Limits::clone(&self.limits));
        let (stop_completer, stopped) = oneshot::channel();
        let completer = tokio::spawn(
            self.clone()
                .complete(completions, stopped, attempts.clone()),
        );
        loop {
            let batch = tokio::select! {
                biased;
                _ = shutdown.changed() => break,
                b = due.recv() => match b { Some(b) => b, None => break },
            };
            self.fire(batch, &sem, &attempts, &mut limiter).await;
        }
        // Every record between produce and delete holds a permit until its outcome has been
        // handled: once all are back, nothing is in flight. librdkafka reports every record
        // within `message.timeout.ms` (30 s).
        let all = u32::try_from(self.in_flight).unwrap_or(u32::MAX);
        if tokio::time::timeout(Duration::from_secs(45), sem.acquire_many(all))
            .await
            .is_err()
        {
            warn!("deliveries still in flight at shutdown; they fire again after restart");
        }
        let _ = stop_completer.send(());
        if completer.await.is_err() {
            error!("publish completion task failed");
        }
        let producer = self.producer.clone();
        let flushed =
            tokio::task::spawn_blocking(move || producer.flush(Duration::from_secs(10))).await;
        if !matches!(flushed, Ok(Ok(()))) {
            warn!("producer flush did not finish; unacknowledged records fire again after restart");
        }
    }
}
