//! Kafka transactions, the building block of exactly-once firing: one transactional producer,
//! and a loop that puts the work handed to it (records to write, a consumer group's offsets to
//! commit) into transactions, one at a time. Work that queued up while the previous
//! transaction committed goes in the next one, up to a number of records; every piece of work
//! learns whether its transaction committed.
//!
//! A transaction's offsets go to the group coordinator with the consumer's group metadata
//! (KIP-447): a member whose generation is over (its partitions were given to another member
//! while it was cut off) cannot commit, and nothing it wrote in that transaction becomes
//! visible to read_committed consumers. A newer producer with the same `transactional.id`
//! fences an older one for good.

use std::sync::Arc;
use std::time::Duration;

use crate::kafka_clock::KafkaClock;
use kafka_delay_core::id::Pid;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::{FutureProducer, Producer};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

mod acks;
mod end;
pub mod lookup;
mod outcome;
mod refused;
mod run;
mod stuck;

pub use refused::{TxnContext, TxnProducer};

/// A record to write in a transaction.
#[derive(Debug, Clone, Default)]
pub struct Out {
    /// Topic.
    pub topic: String,
    /// Partition; `None` leaves it to the partitioner.
    pub partition: Option<i32>,
    /// Key.
    pub key: Option<Vec<u8>>,
    /// Value; `None` is a tombstone.
    pub value: Option<Vec<u8>>,
    /// Headers.
    pub headers: Option<OwnedHeaders>,
}

/// Why work did not commit. In every case nothing of its transaction is visible to
/// read_committed consumers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TxnError {
    /// The transaction was aborted (another piece's record, or the commit, failed); the work
    /// may be handed in again as it is.
    #[error("transaction aborted: {0}")]
    Aborted(String),
    /// Records of this work were refused, each with its place in the work and Kafka's
    /// refusal: handing them in again as they are fails again if the refusal is permanent (an
    /// unknown topic, a record too large, a topic the authorizer refuses); the work's other
    /// records may go again.
    #[error("{} record(s) refused, the first (record {}): {}", .0.len(),
            .0.first().map_or(0, |r| r.0),
            .0.first().map_or_else(String::new, |r| r.1.to_string()))]
    Rejected(Vec<(usize, KafkaError)>),
    /// The consumer's generation is over, or a partition of the work is no longer owned
    /// here: its partitions belong to another member now. `forgotten`: the coordinator no
    /// longer knows this member at all (its session ended while the coordinator was away, it
    /// was removed, or a newer member took its instance id), which no retry mends: only a
    /// rejoin, through the rebalance callback.
    #[error("the consumer group moved on (this member's partitions were reassigned): {text}")]
    Stale { text: String, forgotten: bool },
    /// A newer producer with the same `transactional.id` took over (or this process was
    /// paused past its transaction timeout): nothing more commits until the producer is
    /// renewed ([`Setup::renew`]).
    #[error("fenced by a newer producer with the same transactional.id: {0}")]
    Fenced(String),
}

impl TxnError {
    /// Kafka's refusal of the work's record at `index`, if it was refused.
    pub fn refusal(&self, index: usize) -> Option<&KafkaError> {
        match self {
            TxnError::Rejected(refused) => refused.iter().find(|r| r.0 == index).map(|r| &r.1),
            _ => None,
        }
    }

    /// The outcome's name in metrics.
    pub fn outcome(&self) -> &'static str {
        match self {
            TxnError::Aborted(_) => "aborted",
            TxnError::Rejected(_) => "rejected",
            TxnError::Stale { .. } => "stale",
            TxnError::Fenced(_) => "fenced",
        }
    }
}

/// How transactions are cut.
#[derive(Debug, Clone, Copy)]
pub struct Cut {
    /// Longest a transaction keeps taking work that is still arriving.
    pub interval: Duration,
    /// Records after which a transaction is cut at once.
    pub max_records: usize,
    /// Longest an abort, an offset send or a producer's initialization may block.
    pub timeout: Duration,
    /// Longest one call waiting for a commit blocks. A commit still going on after it is
    /// waited for by calling again: once sent, a commit is never given up.
    pub commit_wait: Duration,
    /// Longest a transaction may run before its commit is sent: past it the loop gives the
    /// transaction up and renews its producer (which fences it), and its work goes again.
    /// Twice the producer's `transaction.timeout.ms` ([`Cut::stuck_after`]): by then its
    /// coordinator has aborted it, and every other transaction of this instance waits on it.
    pub stuck: Duration,
}

impl Cut {
    /// The [`Cut::stuck`] of a producer whose transaction timeout is `transaction_timeout`.
    pub const fn stuck_after(transaction_timeout: Duration) -> Duration {
        transaction_timeout.saturating_mul(2)
    }
}

/// The consumer's group metadata, read when a transaction sends offsets.
pub type GroupMetadata = Arc<dyn Fn() -> Option<ConsumerGroupMetadata> + Send + Sync>;

/// The stamp a source partition was handed here with, while it is owned here
/// ([`Store::owned_since`](crate::store::Store::owned_since)).
pub type Owned = Arc<dyn Fn(Pid) -> Option<u64> + Send + Sync>;

/// Makes a new transactional producer (same `transactional.id`) after a fence.
pub type Renew = Arc<dyn Fn() -> Result<TxnProducer, KafkaError> + Send + Sync>;

/// Offsets to commit: (topic, partition, next offset).
pub type Offsets = Vec<(String, i32, i64)>;

/// Told every transaction's outcome (`committed`, `aborted`, `rejected`, `stale`, `fenced`)
/// and how long it took.
pub type Observe = Arc<dyn Fn(&'static str, Duration) + Send + Sync>;

/// Run after a transaction committed, before any of its work hears so (blocking).
pub type AfterCommit = Box<dyn FnOnce() + Send>;

/// Where a record of a transaction was written: (topic, partition, offset).
pub type Placed = (String, i32, i64);

/// Whether the transaction that wrote the records `placed` committed (`Some(true)`) or
/// aborted (`Some(false)`), read from the log; `None` when it cannot tell. Asked after a
/// commit call failed without saying whether the commit happened (blocking).
pub type Lookup = Arc<dyn Fn(&[Placed]) -> Option<bool> + Send + Sync>;

/// What the loop needs besides the producer.
#[derive(Clone)]
pub struct Setup {
    /// The consumer group's metadata, sent with every transaction's offsets.
    pub group: GroupMetadata,
    /// How transactions are cut.
    pub cut: Cut,
    /// Checked once a transaction's records are acknowledged, before it commits: work for a
    /// partition revoked meanwhile aborts the transaction.
    pub owned: Option<Owned>,
    /// After a fence, a new producer is made with this (once a second at most; work waits
    /// for it); without it a fence is final.
    pub renew: Option<Renew>,
    /// Told each transaction's outcome.
    pub observe: Option<Observe>,
    /// Learns the cluster's clock from the records' acknowledgements.
    pub kafka_clock: Option<Arc<KafkaClock>>,
    /// Reads whether a transaction committed when its commit call failed in a way that does
    /// not say (without it, such work goes again, which duplicates it if it did commit).
    pub lookup: Option<Lookup>,
    /// Test seam (`failpoints` builds): this many commits that succeed are reported as failed,
    /// as when the coordinator's answer is lost.
    #[cfg(feature = "failpoints")]
    pub lose_answers: Arc<std::sync::atomic::AtomicUsize>,
}

impl Setup {
    /// Group metadata and cut only: no ownership check, a fence is final.
    pub fn new(group: GroupMetadata, cut: Cut) -> Self {
        Self {
            group,
            cut,
            owned: None,
            renew: None,
            observe: None,
            kafka_clock: None,
            lookup: None,
            #[cfg(feature = "failpoints")]
            lose_answers: Arc::default(),
        }
    }
}

impl std::fmt::Debug for Setup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Setup")
            .field("cut", &self.cut)
            .finish_non_exhaustive()
    }
}

/// A piece of work: records to write and offsets to commit together.
#[derive(Default)]
pub struct Work {
    /// Records to write.
    pub records: Vec<Out>,
    /// Offsets to commit.
    pub offsets: Offsets,
    /// Source partitions the work belongs to (see [`Setup::owned`]).
    pub partitions: Vec<Pid>,
    /// When given, the work belongs to them as they were owned at this stamp: one handed
    /// here again since (revoked and restored meanwhile) is not owned for it.
    pub owned_at: Option<u64>,
    /// Run once the transaction committed, before the commit is answered.
    pub after: Option<AfterCommit>,
}

/// A piece of work and where its answer goes.
#[derive(Debug)]
pub(crate) struct Queued {
    pub(crate) work: Work,
    pub(crate) done: oneshot::Sender<Result<Vec<i64>, TxnError>>,
}

/// Hands work to the transaction loop.
#[derive(Debug, Clone)]
pub struct Transactions {
    tx: mpsc::Sender<Queued>,
}

impl std::fmt::Debug for Work {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Work")
            .field("records", &self.records.len())
            .field("offsets", &self.offsets)
            .field("partitions", &self.partitions)
            .field("owned_at", &self.owned_at)
            .finish_non_exhaustive()
    }
}

impl Transactions {
    /// Initializes the transactions of `producer` (which has a `transactional.id`), fencing
    /// any earlier producer with the same id and aborting what it left open, and starts the
    /// loop. Blocks for at most `setup.cut.timeout`.
    ///
    /// # Errors
    /// The cluster cannot run transactions, or did not answer within the timeout.
    pub fn start(
        producer: TxnProducer,
        setup: Setup,
    ) -> Result<(Self, JoinHandle<()>), KafkaError> {
        producer.init_transactions(setup.cut.timeout)?;
        let (tx, rx) = mpsc::channel(1024);
        let task = tokio::spawn(run::run(producer, setup, rx));
        Ok((Self { tx }, task))
    }

    /// Writes `records` and commits `offsets` in a transaction; returns once it committed or
    /// failed.
    ///
    /// # Errors
    /// See [`TxnError`]; the loop having stopped reads as [`TxnError::Fenced`].
    pub async fn submit(&self, records: Vec<Out>, offsets: Offsets) -> Result<(), TxnError> {
        self.commit(Work {
            records,
            offsets,
            ..Work::default()
        })
        .await
        .map(drop)
    }

    /// Commits `work` in a transaction; returns the offset each of its records was written
    /// at once it committed.
    ///
    /// # Errors
    /// See [`TxnError`]; the loop having stopped reads as [`TxnError::Fenced`].
    pub async fn commit(&self, work: Work) -> Result<Vec<i64>, TxnError> {
        let (done, result) = oneshot::channel();
        let gone = || TxnError::Fenced("the transaction loop has stopped".into());
        self.tx
            .send(Queued { work, done })
            .await
            .map_err(|_| gone())?;
        result.await.map_err(|_| gone())?
    }
}

/// A transactional producer of `config` (which has a `transactional.id`).
///
/// # Errors
/// librdkafka refuses the configuration.
pub fn producer(config: &ClientConfig) -> Result<TxnProducer, KafkaError> {
    TxnProducer::new(config)
}

/// What an error means for the work: fatal errors fence the producer; a group generation
/// that is over makes the work stale; anything else aborts the transaction.
pub(crate) fn classify(e: KafkaError) -> TxnError {
    let text = e.to_string();
    if let KafkaError::Transaction(t) = &e {
        if t.is_fatal() {
            return TxnError::Fenced(text);
        }
    }
    match e.rdkafka_error_code() {
        Some(
            RDKafkaErrorCode::ProducerFenced
            | RDKafkaErrorCode::InvalidProducerEpoch
            | RDKafkaErrorCode::Fenced,
        ) => TxnError::Fenced(text),
        Some(RDKafkaErrorCode::IllegalGeneration | RDKafkaErrorCode::RebalanceInProgress) => {
            TxnError::Stale {
                text,
                forgotten: false,
            }
        }
        Some(RDKafkaErrorCode::UnknownMemberId | RDKafkaErrorCode::FencedInstanceId) => {
            TxnError::Stale {
                text,
                forgotten: true,
            }
        }
        _ => TxnError::Aborted(text),
    }
}

/// Whether the cluster at `config` runs transactions: a producer with a transactional id of
/// its own initializes them (which needs the transaction coordinator and its state log).
/// Blocking, for at most `timeout`.
///
/// # Errors
/// A sentence saying that the cluster cannot, with librdkafka's reason.
pub fn check(config: &ClientConfig, timeout: Duration) -> Result<(), String> {
    let id = format!(
        "kafka-delay-check-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    );
    let producer: FutureProducer = config
        .clone()
        .set("transactional.id", &id)
        .create()
        .map_err(|e| format!("cannot create a transactional producer: {e}"))?;
    producer
        .init_transactions(timeout)
        .map_err(|e| cannot_run(&e))
}

/// What a cluster's refusal to initialize transactions means, for the start-up error.
pub fn cannot_run(e: &KafkaError) -> String {
    if e.rdkafka_error_code() == Some(RDKafkaErrorCode::TransactionalIdAuthorizationFailed) {
        return format!(
            "the cluster's authorizer refuses this principal its transactional id ({e}): \
             --exactly-once needs Write and Describe on the transactional ids GROUP-INSTANCE \
             (`kafka-delay acls` prints them)"
        );
    }
    format!(
        "this Kafka cluster cannot run transactions ({e}): --exactly-once needs Apache Kafka \
         2.5 or later with its transaction state log available \
         (transaction.state.log.replication.factor brokers up)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_transactional_id_is_told_as_the_authorizers_not_the_clusters() {
        let refused = cannot_run(&KafkaError::Global(
            RDKafkaErrorCode::TransactionalIdAuthorizationFailed,
        ));
        assert!(
            refused.contains("Write and Describe on the transactional ids"),
            "{refused}"
        );
        let down = cannot_run(&KafkaError::Global(
            RDKafkaErrorCode::BrokerTransportFailure,
        ));
        assert!(down.contains("cannot run transactions"), "{down}");
    }

    #[test]
    fn generation_errors_are_stale_and_producer_fencing_is_final() {
        let code = |c| KafkaError::MessageProduction(c);
        assert!(matches!(
            classify(code(RDKafkaErrorCode::IllegalGeneration)),
            TxnError::Stale {
                forgotten: false,
                ..
            }
        ));
        for gone in [
            RDKafkaErrorCode::UnknownMemberId,
            RDKafkaErrorCode::FencedInstanceId,
        ] {
            assert!(matches!(
                classify(code(gone)),
                TxnError::Stale {
                    forgotten: true,
                    ..
                }
            ));
        }
        assert!(matches!(
            classify(code(RDKafkaErrorCode::ProducerFenced)),
            TxnError::Fenced(_)
        ));
        assert!(matches!(
            classify(code(RDKafkaErrorCode::MessageTimedOut)),
            TxnError::Aborted(_)
        ));
    }
}
