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
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tracing::{error, info, warn};

use crate::store::Pid;

/// How long a transaction being gathered waits for the next piece of work.
const GAP: Duration = Duration::from_millis(2);

/// Longest a fenced loop goes without trying to renew its producer.
const RENEW_EVERY: Duration = Duration::from_secs(1);

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
    /// This work's record at `index` was refused: handing it in again as it is fails again
    /// if the refusal is permanent (an unknown topic, a record too large).
    #[error("record {index} refused: {error}")]
    Rejected {
        /// The record's place in the work.
        index: usize,
        /// Kafka's refusal.
        error: KafkaError,
    },
    /// The consumer's generation is over, or a partition of the work is no longer owned
    /// here: its partitions belong to another member now.
    #[error("the consumer group moved on (this member's partitions were reassigned): {0}")]
    Stale(String),
    /// A newer producer with the same `transactional.id` took over (or this process was
    /// paused past its transaction timeout): nothing more commits until the producer is
    /// renewed ([`Setup::renew`]).
    #[error("fenced by a newer producer with the same transactional.id: {0}")]
    Fenced(String),
}

/// How transactions are cut.
#[derive(Debug, Clone, Copy)]
pub struct Cut {
    /// Longest a transaction keeps taking work that is still arriving.
    pub interval: Duration,
    /// Records after which a transaction is cut at once.
    pub max_records: usize,
    /// Longest a commit, abort or offset send may block.
    pub timeout: Duration,
}

/// The consumer's group metadata, read when a transaction sends offsets.
pub type GroupMetadata = Arc<dyn Fn() -> Option<ConsumerGroupMetadata> + Send + Sync>;

/// Whether a source partition is still owned here.
pub type Owned = Arc<dyn Fn(Pid) -> bool + Send + Sync>;

/// Makes a new transactional producer (same `transactional.id`) after a fence.
pub type Renew = Arc<dyn Fn() -> Result<FutureProducer, KafkaError> + Send + Sync>;

/// Offsets to commit: (topic, partition, next offset).
pub type Offsets = Vec<(String, i32, i64)>;

/// Run after a transaction committed, before any of its work hears so (blocking).
pub type AfterCommit = Box<dyn FnOnce() + Send>;

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
    /// After a fence, a new producer is made with this (once a second at most); without it
    /// a fence is final.
    pub renew: Option<Renew>,
}

impl Setup {
    /// Group metadata and cut only: no ownership check, a fence is final.
    pub fn new(group: GroupMetadata, cut: Cut) -> Self {
        Self {
            group,
            cut,
            owned: None,
            renew: None,
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
    /// Run once the transaction committed, before the commit is answered.
    pub after: Option<AfterCommit>,
}

/// A piece of work and where its answer goes.
#[derive(Debug)]
struct Queued {
    work: Work,
    done: oneshot::Sender<Result<Vec<i64>, TxnError>>,
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
        producer: FutureProducer,
        setup: Setup,
    ) -> Result<(Self, JoinHandle<()>), KafkaError> {
        producer.init_transactions(setup.cut.timeout)?;
        let (tx, rx) = mpsc::channel(1024);
        let task = tokio::spawn(run(producer, setup, rx));
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

/// The producer, or why there is none now (fenced, and when).
enum Producing {
    Ready(FutureProducer),
    Fenced(String, Instant),
}

async fn run(producer: FutureProducer, setup: Setup, mut rx: mpsc::Receiver<Queued>) {
    let mut producing = Producing::Ready(producer);
    let cut = setup.cut;
    while let Some(first) = rx.recv().await {
        // What queued up while the last transaction committed joins this one, and what follows
        // within `GAP` of the last piece; it is cut when nothing more comes (waiting longer
        // only delays the work in it, whose senders wait for the commit), at `max_records`, or
        // after `interval` of work still arriving.
        let mut batch = vec![first];
        let mut records = batch[0].work.records.len();
        let deadline = tokio::time::Instant::now() + cut.interval;
        while records < cut.max_records {
            let gap = (tokio::time::Instant::now() + GAP).min(deadline);
            match tokio::time::timeout_at(gap, rx.recv()).await {
                Ok(Some(w)) => {
                    records += w.work.records.len();
                    batch.push(w);
                }
                _ => break,
            }
        }
        producing = renewed(producing, &setup).await;
        let results = match &producing {
            Producing::Fenced(why, _) => vec![Err(TxnError::Fenced(why.clone())); batch.len()],
            Producing::Ready(p) => {
                let (p, s) = (p.clone(), setup.clone());
                let works: Vec<Work> = batch
                    .iter_mut()
                    .map(|q| std::mem::take(&mut q.work))
                    .collect();
                let n = works.len();
                tokio::task::spawn_blocking(move || transaction(&p, &s, works))
                    .await
                    .unwrap_or_else(|e| vec![Err(TxnError::Aborted(e.to_string())); n])
            }
        };
        if let Some(Err(e)) = results.iter().find(|r| r.is_err()) {
            warn!(error = %e, pieces = results.len(), "transaction not committed");
        }
        if let Some(Err(TxnError::Fenced(why))) = results
            .iter()
            .find(|r| matches!(r, Err(TxnError::Fenced(_))))
        {
            if matches!(producing, Producing::Ready(_)) {
                error!(error = %why, "the transactional producer was fenced: another process with the same --instance-id, or this one was paused past its transaction timeout");
                producing = Producing::Fenced(why.clone(), Instant::now());
            }
        }
        for (q, r) in batch.into_iter().zip(results) {
            let _ = q.done.send(r);
        }
    }
}

/// After a fence, a new producer (at most once a second), when the setup can make one.
async fn renewed(producing: Producing, setup: &Setup) -> Producing {
    let Producing::Fenced(why, at) = producing else {
        return producing;
    };
    let Some(renew) = setup.renew.clone().filter(|_| at.elapsed() >= RENEW_EVERY) else {
        return Producing::Fenced(why, at);
    };
    let timeout = setup.cut.timeout;
    let made = tokio::task::spawn_blocking(move || {
        let p = renew()?;
        p.init_transactions(timeout)?;
        Ok::<_, KafkaError>(p)
    })
    .await;
    match made {
        Ok(Ok(p)) => {
            info!("transactional producer renewed after a fence");
            Producing::Ready(p)
        }
        Ok(Err(e)) => Producing::Fenced(format!("{why}; renewing it failed: {e}"), Instant::now()),
        Err(e) => Producing::Fenced(format!("{why}; renewing it failed: {e}"), Instant::now()),
    }
}

/// The records of a batch, and its offsets merged (the highest per partition).
fn gather(works: &[Work]) -> (Vec<&Out>, Offsets) {
    let mut outs = Vec::new();
    let mut offsets: Offsets = Vec::new();
    for w in works {
        outs.extend(w.records.iter());
        for (t, p, o) in &w.offsets {
            match offsets.iter_mut().find(|(t2, p2, _)| t2 == t && p2 == p) {
                Some(e) => e.2 = e.2.max(*o),
                None => offsets.push((t.clone(), *p, *o)),
            }
        }
    }
    (outs, offsets)
}

/// Why a transaction failed: as a whole, or because of one record (its place among all).
enum Failure {
    Whole(TxnError),
    Record(usize, KafkaError),
    NotOwned(usize),
}

/// One transaction for `works`: begin, write, send offsets, commit, run the after-commit
/// hooks; aborted on any error it survives. One answer per piece of work.
fn transaction(
    producer: &FutureProducer,
    setup: &Setup,
    mut works: Vec<Work>,
) -> Vec<Result<Vec<i64>, TxnError>> {
    let n = works.len();
    let result = producer
        .begin_transaction()
        .map_err(|e| Failure::Whole(classify(e)))
        .and_then(|()| write(producer, setup, &works));
    let written = match result {
        Ok(offsets) => offsets,
        Err(failure) => {
            let abort = match &failure {
                Failure::Whole(TxnError::Fenced(_)) => Ok(()),
                _ => producer.abort_transaction(setup.cut.timeout),
            };
            return answers(&works, failure, abort.err().map(classify));
        }
    };
    for w in &mut works {
        if let Some(after) = w.after.take() {
            after();
        }
    }
    let mut at = 0;
    (0..n)
        .map(|i| {
            let k = works[i].records.len();
            at += k;
            Ok(written[at - k..at].to_vec())
        })
        .collect()
}

/// Each piece of work's answer when its transaction failed: the piece a refused record or a
/// revoked partition belongs to learns so; the others may go again.
fn answers(
    works: &[Work],
    failure: Failure,
    abort_failed: Option<TxnError>,
) -> Vec<Result<Vec<i64>, TxnError>> {
    if let Some(e @ TxnError::Fenced(_)) = abort_failed {
        return vec![Err(e); works.len()];
    }
    let whole = match &failure {
        Failure::Whole(e) => e.clone(),
        Failure::Record(_, e) => TxnError::Aborted(format!("another record failed: {e}")),
        Failure::NotOwned(_) => TxnError::Aborted("another piece's partition was revoked".into()),
    };
    let mut start = 0;
    works
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let range = start..start + w.records.len();
            start = range.end;
            match &failure {
                Failure::Record(at, error) if range.contains(at) => Err(TxnError::Rejected {
                    index: at - range.start,
                    error: error.clone(),
                }),
                Failure::NotOwned(piece) if *piece == i => Err(TxnError::Stale(
                    "a partition of this work was revoked before its transaction committed".into(),
                )),
                _ => Err(whole.clone()),
            }
        })
        .collect()
}

fn write(producer: &FutureProducer, setup: &Setup, works: &[Work]) -> Result<Vec<i64>, Failure> {
    let cut = setup.cut;
    let (outs, offsets) = gather(works);
    let mut deliveries = Vec::with_capacity(outs.len());
    for (i, out) in outs.iter().enumerate() {
        let mut rec: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&out.topic);
        if let Some(p) = out.partition {
            rec = rec.partition(p);
        }
        if let Some(k) = &out.key {
            rec = rec.key(k.as_slice());
        }
        if let Some(v) = &out.value {
            rec = rec.payload(v.as_slice());
        }
        if let Some(h) = &out.headers {
            rec = rec.headers(h.clone());
        }
        let deadline = Instant::now() + cut.timeout;
        loop {
            match producer.send_result(rec) {
                Ok(delivery) => {
                    deliveries.push(delivery);
                    break;
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back))
                    if Instant::now() < deadline =>
                {
                    rec = back;
                    producer.poll(Duration::from_millis(10));
                }
                Err((e, _)) => return Err(refused(i, e)),
            }
        }
    }
    // Every record acknowledged before the commit: rdkafka's commit flushes by polling in
    // steps of 100 ms, which the producer's own polling thread leaves idle, so a commit that
    // finds records still out waits about 100 ms for nothing.
    let handle = tokio::runtime::Handle::current();
    let mut written = Vec::with_capacity(deliveries.len());
    for (i, d) in deliveries.into_iter().enumerate() {
        match handle.block_on(d) {
            Ok(Ok(delivery)) => written.push(delivery.offset),
            Ok(Err((e, _))) => return Err(refused(i, e)),
            Err(_) => {
                return Err(Failure::Whole(TxnError::Aborted(
                    "a record's delivery was cancelled".into(),
                )))
            }
        }
    }
    // Every record is in its partition's log now: an instance assigned one of these
    // partitions after this check reads up to past them, and waits for this transaction.
    if let Some(owned) = &setup.owned {
        if let Some(i) = works
            .iter()
            .position(|w| !w.partitions.iter().all(|p| owned(*p)))
        {
            return Err(Failure::NotOwned(i));
        }
    }
    let whole = |e| Failure::Whole(classify(e));
    if !offsets.is_empty() {
        let metadata = (setup.group)().ok_or_else(|| {
            Failure::Whole(TxnError::Stale(
                "the consumer has no group metadata (not a member now)".into(),
            ))
        })?;
        let mut tpl = TopicPartitionList::new();
        for (t, p, o) in &offsets {
            tpl.add_partition_offset(t, *p, Offset::Offset(*o))
                .map_err(whole)?;
        }
        producer
            .send_offsets_to_transaction(&tpl, &metadata, cut.timeout)
            .map_err(whole)?;
    }
    producer.commit_transaction(cut.timeout).map_err(whole)?;
    Ok(written)
}

/// A record refused: fencing and generation errors concern the whole transaction, anything
/// else this record.
fn refused(i: usize, e: KafkaError) -> Failure {
    match classify(e.clone()) {
        TxnError::Aborted(_) => Failure::Record(i, e),
        other => Failure::Whole(other),
    }
}

/// What an error means for the work: fatal errors fence the producer; a group generation
/// that is over makes the work stale; anything else aborts the transaction.
fn classify(e: KafkaError) -> TxnError {
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
        Some(
            RDKafkaErrorCode::IllegalGeneration
            | RDKafkaErrorCode::UnknownMemberId
            | RDKafkaErrorCode::FencedInstanceId
            | RDKafkaErrorCode::RebalanceInProgress,
        ) => TxnError::Stale(text),
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
    producer.init_transactions(timeout).map_err(|e| {
        format!(
            "this Kafka cluster cannot run transactions ({e}): exactly-once needs Apache Kafka \
             2.5 or later with its transaction state log available \
             (transaction.state.log.replication.factor brokers up)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn work(offsets: &[(&str, i32, i64)], records: usize) -> Work {
        Work {
            records: vec![Out::default(); records],
            offsets: offsets
                .iter()
                .map(|(t, p, o)| ((*t).to_owned(), *p, *o))
                .collect(),
            ..Work::default()
        }
    }

    #[test]
    fn a_batch_commits_every_record_and_the_highest_offset_of_each_partition() {
        let a = work(&[("s", 0, 10), ("s", 1, 5)], 2);
        let b = work(&[("s", 0, 12), ("t", 0, 3)], 1);
        let c = work(&[("s", 1, 4)], 0);
        let batch = vec![a, b, c];
        let (outs, mut offsets) = gather(&batch);
        offsets.sort();
        assert_eq!(outs.len(), 3);
        assert_eq!(
            offsets,
            vec![("s".into(), 0, 12), ("s".into(), 1, 5), ("t".into(), 0, 3)]
        );
    }

    #[test]
    fn a_refused_record_is_named_to_its_own_work_and_the_others_may_go_again() {
        let batch = vec![work(&[], 2), work(&[], 3), work(&[], 1)];
        let refused = KafkaError::MessageProduction(RDKafkaErrorCode::UnknownTopicOrPartition);
        // The fourth record of the transaction is the second of the second piece.
        let got = answers(&batch, Failure::Record(3, refused.clone()), None);
        assert!(matches!(got[0], Err(TxnError::Aborted(_))), "{:?}", got[0]);
        assert_eq!(
            got[1],
            Err(TxnError::Rejected {
                index: 1,
                error: refused
            })
        );
        assert!(matches!(got[2], Err(TxnError::Aborted(_))), "{:?}", got[2]);
        let got = answers(&batch, Failure::NotOwned(2), None);
        assert!(matches!(got[2], Err(TxnError::Stale(_))), "{:?}", got[2]);
        assert!(matches!(got[0], Err(TxnError::Aborted(_))), "{:?}", got[0]);
        // An abort that fails with a fence fences every piece.
        let got = answers(
            &batch,
            Failure::NotOwned(2),
            Some(TxnError::Fenced("x".into())),
        );
        assert!(got.iter().all(|r| matches!(r, Err(TxnError::Fenced(_)))));
    }

    #[test]
    fn generation_errors_are_stale_and_producer_fencing_is_final() {
        let code = |c| KafkaError::MessageProduction(c);
        assert!(matches!(
            classify(code(RDKafkaErrorCode::IllegalGeneration)),
            TxnError::Stale(_)
        ));
        assert!(matches!(
            classify(code(RDKafkaErrorCode::ProducerFenced)),
            TxnError::Fenced(_)
        ));
        assert!(matches!(
            classify(code(RDKafkaErrorCode::MessageTimedOut)),
            TxnError::Aborted(_)
        ));
        // A record's own refusal concerns that record; a fence concerns the transaction.
        assert!(matches!(
            refused(4, code(RDKafkaErrorCode::MessageSizeTooLarge)),
            Failure::Record(4, _)
        ));
        assert!(matches!(
            refused(4, code(RDKafkaErrorCode::ProducerFenced)),
            Failure::Whole(TxnError::Fenced(_))
        ));
    }
}
