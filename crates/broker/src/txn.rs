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

/// How long a transaction being gathered waits for the next piece of work.
const GAP: Duration = Duration::from_millis(2);

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
    /// The transaction was aborted (a record or the commit failed); the work may be handed in
    /// again.
    #[error("transaction aborted: {0}")]
    Aborted(String),
    /// The consumer's generation is over: its partitions belong to another member now. Work
    /// for them must not be handed in again until they are assigned here again.
    #[error("the consumer group moved on (this member's partitions were reassigned): {0}")]
    Stale(String),
    /// A newer producer with the same `transactional.id` took over: this one can do nothing
    /// more.
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

/// Offsets to commit: (topic, partition, next offset).
pub type Offsets = Vec<(String, i32, i64)>;

struct Work {
    records: Vec<Out>,
    offsets: Offsets,
    done: oneshot::Sender<Result<(), TxnError>>,
}

/// Hands work to the transaction loop.
#[derive(Debug, Clone)]
pub struct Transactions {
    tx: mpsc::Sender<Work>,
}

impl std::fmt::Debug for Work {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Work({} records)", self.records.len())
    }
}

impl Transactions {
    /// Initializes the transactions of `producer` (which has a `transactional.id`), fencing
    /// any earlier producer with the same id and aborting what it left open, and starts the
    /// loop. Blocks for at most `cut.timeout`.
    ///
    /// # Errors
    /// The cluster cannot run transactions, or did not answer within the timeout.
    pub fn start(
        producer: FutureProducer,
        group: GroupMetadata,
        cut: Cut,
    ) -> Result<(Self, JoinHandle<()>), KafkaError> {
        producer.init_transactions(cut.timeout)?;
        let (tx, rx) = mpsc::channel(1024);
        let task = tokio::spawn(run(producer, group, cut, rx));
        Ok((Self { tx }, task))
    }

    /// Writes `records` and commits `offsets` in a transaction; returns once it committed or
    /// failed.
    ///
    /// # Errors
    /// See [`TxnError`]; the loop having stopped reads as [`TxnError::Fenced`].
    pub async fn submit(&self, records: Vec<Out>, offsets: Offsets) -> Result<(), TxnError> {
        let (done, result) = oneshot::channel();
        let gone = || TxnError::Fenced("the transaction loop has stopped".into());
        self.tx
            .send(Work {
                records,
                offsets,
                done,
            })
            .await
            .map_err(|_| gone())?;
        result.await.map_err(|_| gone())?
    }
}

async fn run(
    producer: FutureProducer,
    group: GroupMetadata,
    cut: Cut,
    mut rx: mpsc::Receiver<Work>,
) {
    let mut fenced: Option<String> = None;
    while let Some(first) = rx.recv().await {
        // What queued up while the last transaction committed joins this one, and what follows
        // within `GAP` of the last piece; it is cut when nothing more comes (waiting longer
        // only delays the work in it, whose senders wait for the commit), at `max_records`, or
        // after `interval` of work still arriving.
        let mut batch = vec![first];
        let mut records = batch[0].records.len();
        let deadline = tokio::time::Instant::now() + cut.interval;
        while records < cut.max_records {
            let gap = (tokio::time::Instant::now() + GAP).min(deadline);
            match tokio::time::timeout_at(gap, rx.recv()).await {
                Ok(Some(w)) => {
                    records += w.records.len();
                    batch.push(w);
                }
                _ => break,
            }
        }
        let result = match &fenced {
            Some(why) => Err(TxnError::Fenced(why.clone())),
            None => {
                let (p, g) = (producer.clone(), group.clone());
                let (outs, offsets) = gather(&mut batch);
                tokio::task::spawn_blocking(move || transaction(&p, &g, &outs, &offsets, cut))
                    .await
                    .unwrap_or_else(|e| Err(TxnError::Aborted(e.to_string())))
            }
        };
        if let Err(TxnError::Fenced(why)) = &result {
            fenced = Some(why.clone());
        }
        for w in batch {
            let _ = w.done.send(result.clone());
        }
    }
}

/// The records of a batch, and its offsets merged (the highest per partition).
fn gather(batch: &mut [Work]) -> (Vec<Out>, Offsets) {
    let mut outs = Vec::new();
    let mut offsets: Offsets = Vec::new();
    for w in batch.iter_mut() {
        outs.append(&mut w.records);
        for (t, p, o) in w.offsets.drain(..) {
            match offsets.iter_mut().find(|(t2, p2, _)| *t2 == t && *p2 == p) {
                Some(e) => e.2 = e.2.max(o),
                None => offsets.push((t, p, o)),
            }
        }
    }
    (outs, offsets)
}

/// One transaction: begin, write, send offsets, commit; aborted on any error it survives.
fn transaction(
    producer: &FutureProducer,
    group: &GroupMetadata,
    outs: &[Out],
    offsets: &Offsets,
    cut: Cut,
) -> Result<(), TxnError> {
    producer.begin_transaction().map_err(classify)?;
    let result = write(producer, group, outs, offsets, cut);
    if let Err(TxnError::Aborted(_) | TxnError::Stale(_)) = &result {
        if let Err(e) = producer.abort_transaction(cut.timeout) {
            return Err(classify(e));
        }
    }
    result
}

fn write(
    producer: &FutureProducer,
    group: &GroupMetadata,
    outs: &[Out],
    offsets: &Offsets,
    cut: Cut,
) -> Result<(), TxnError> {
    let mut deliveries = Vec::with_capacity(outs.len());
    for out in outs {
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
                Err((e, _)) => return Err(classify(e)),
            }
        }
    }
    // Every record acknowledged before the commit: rdkafka's commit flushes by polling in
    // steps of 100 ms, which the producer's own polling thread leaves idle, so a commit that
    // finds records still out waits about 100 ms for nothing.
    let handle = tokio::runtime::Handle::current();
    for d in deliveries {
        match handle.block_on(d) {
            Ok(Ok(_)) => {}
            Ok(Err((e, _))) => return Err(classify(e)),
            Err(_) => {
                return Err(TxnError::Aborted(
                    "a record's delivery was cancelled".into(),
                ))
            }
        }
    }
    if !offsets.is_empty() {
        let metadata = group().ok_or_else(|| {
            TxnError::Stale("the consumer has no group metadata (not a member now)".into())
        })?;
        let mut tpl = TopicPartitionList::new();
        for (t, p, o) in offsets {
            tpl.add_partition_offset(t, *p, Offset::Offset(*o))
                .map_err(classify)?;
        }
        producer
            .send_offsets_to_transaction(&tpl, &metadata, cut.timeout)
            .map_err(classify)?;
    }
    producer.commit_transaction(cut.timeout).map_err(classify)
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

    fn work(
        offsets: &[(&str, i32, i64)],
        records: usize,
    ) -> (Work, oneshot::Receiver<Result<(), TxnError>>) {
        let (done, rx) = oneshot::channel();
        let w = Work {
            records: vec![Out::default(); records],
            offsets: offsets
                .iter()
                .map(|(t, p, o)| ((*t).to_owned(), *p, *o))
                .collect(),
            done,
        };
        (w, rx)
    }

    #[test]
    fn a_batch_commits_every_record_and_the_highest_offset_of_each_partition() {
        let (a, _ra) = work(&[("s", 0, 10), ("s", 1, 5)], 2);
        let (b, _rb) = work(&[("s", 0, 12), ("t", 0, 3)], 1);
        let (c, _rc) = work(&[("s", 1, 4)], 0);
        let mut batch = vec![a, b, c];
        let (outs, mut offsets) = gather(&mut batch);
        offsets.sort();
        assert_eq!(outs.len(), 3);
        assert_eq!(
            offsets,
            vec![("s".into(), 0, 12), ("s".into(), 1, 5), ("t".into(), 0, 3)]
        );
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
    }
}
