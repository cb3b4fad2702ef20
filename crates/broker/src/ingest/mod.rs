//! The ingest task: Kafka record -> contract -> dead letter or store -> offset -> wheel.
//!
//! Records are taken in groups (whatever the consumer has ready, up to the mode's
//! [`Durable::max_group`]) so that one RocksDB write batch, and one fsync when `sync` is on,
//! covers many records (group commit). For each group, in this order:
//! 1. every record is interpreted; a rejected record becomes a dead letter, which the
//!    durability mode writes before the group is stored, or with it;
//! 2. one write batch stores the records, cancels, replacements and the next offset of every
//!    partition in the group;
//! 3. the durability mode makes the group safe beyond this disk (nothing to do with RocksDB
//!    alone; the changelog; a transaction) — [`Durable::after_store`];
//! 4. the offsets are stored in the consumer for its next (auto-)commit, unless the mode
//!    committed them with the group;
//! 5. the new records go to the scheduler.
//!
//! Steps 3 to 5 run in the background, while the next group is read and stored (1 and 2), when
//! the mode waits on the network for step 3 ([`Durable::in_flight`]; `safe`): in order, one
//! group at a time made safe and the next made ready meanwhile. Where the mode lingers
//! ([`Durable::linger`]), step 5 comes first, at once, and steps 3 and 4 follow after the
//! linger, group after group.
//!
//! A record below the offset already stored for its partition was ingested before a crash and
//! is skipped. A RocksDB write failure (a full disk) pauses consumption and is retried; no
//! offset is stored for anything not in RocksDB. The task never sleeps on a due time.

mod consumer;
mod context;
pub mod coverage;
mod durable;
mod safe;
mod topics;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{BorrowedMessage, Message};
use tokio::sync::watch;
use tracing::{debug, error, info, warn};

pub use consumer::{consumer, consumer_config, ready_now, subscribe, Broken};
pub use context::IngestContext;
pub use durable::{Durable, Guard, Last, OffsetCommit, Rebalance, Sending, Stored, Turn};
pub use topics::TopicCreator;

use crate::backoff::Backoff;
use crate::dead_letter::{DeadLetter, DeadLetters, Origin};
use crate::kafka::header_refs;
use crate::metrics::Metrics;
use crate::scheduler::Inserts;
use crate::store::{Applied, IngestOp, Store};
use kafka_delay_core::clock::Clock;
use kafka_delay_core::id::Pid;
use kafka_delay_core::record::{Command, Contract, HeaderRef, Incoming, Reject};
use safe::{Finisher, Pipeline, Taken};

/// Longest wait for the commit of the stored offsets at shutdown. librdkafka's synchronous
/// commit has no timeout of its own, and one was seen waiting forever (a CI run, with the mock
/// cluster still up): shutdown must end regardless. Nothing is lost without that commit, since
/// RocksDB holds the offsets ingest resumes from.
const FINAL_COMMIT_WAIT: Duration = Duration::from_secs(10);

/// Commits `offsets` synchronously on a thread of its own and waits at most `wait` for the
/// answer: `None` when none came, or the thread could not be started (a thread left waiting
/// holds no runtime worker and nothing the process waits for at exit).
async fn commit_within<X, C>(
    consumer: Arc<C>,
    offsets: rdkafka::TopicPartitionList,
    wait: Duration,
) -> Option<rdkafka::error::KafkaResult<()>>
where
    X: rdkafka::consumer::ConsumerContext + 'static,
    C: Consumer<X> + Send + Sync + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("final-commit".into())
        .spawn(move || {
            let _ = tx.send(consumer.commit(&offsets, CommitMode::Sync));
        })
        .ok()?;
    tokio::time::timeout(wait, rx).await.ok()?.ok()
}

/// What a group of consumed records comes to.
struct Interpreted<'m> {
    /// The store operations, in offset order.
    ops: Vec<IngestOp>,
    /// The timestamp of each operation's source record.
    stamps: Vec<Option<u64>>,
    /// The rejected records, for the dead-letter topic.
    dead: Vec<DeadLetter>,
    /// The last offset of each source partition in the group, by the partition's store id.
    last: Last<'m>,
}

/// The ingest task's state.
pub struct Ingest {
    /// The subscribed consumer (shared with the group of records it lent out).
    pub consumer: Arc<StreamConsumer<IngestContext>>,
    /// The store.
    pub store: Arc<Store>,
    /// The header contract.
    pub contract: Contract,
    /// Wall clock.
    pub clock: Arc<dyn Clock>,
    /// Metrics.
    pub metrics: Metrics,
    /// New records go here.
    pub scheduler: Inserts,
    /// Rejected records go here.
    pub dead: DeadLetters,
    /// Next offset to ingest per partition (anything below was stored before).
    pub next_offsets: HashMap<Pid, i64>,
    /// False while RocksDB refuses writes.
    pub store_healthy: Arc<AtomicBool>,
    /// Creates the targets' retry dead-letter topics on first use.
    pub dead_letter_topics: TopicCreator,
    /// Set by [`Ingest::run`]: a RocksDB write that keeps failing gives up when it turns true.
    pub stopping: Option<watch::Receiver<bool>>,
    /// What makes each group safe, and how its offsets are committed.
    pub durability: Arc<dyn Durable>,
    /// Set when the consumer hit a fatal error ([`Broken`]): ingest has ended and the
    /// instance must start its Kafka clients again.
    pub broken: watch::Sender<Option<Broken>>,
}

impl std::fmt::Debug for Ingest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ingest")
            .field("partitions", &self.next_offsets.len())
            .finish_non_exhaustive()
    }
}

impl Ingest {
    /// Runs until `shutdown`, then commits the stored offsets.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        self.stopping = Some(shutdown.clone());
        // The records are read where librdkafka holds them (no copy of each one first): they
        // borrow this handle, not `self`, which processing them changes.
        let consumer = self.consumer.clone();
        let finisher = self.finisher();
        let mut in_flight = Pipeline::default();
        // Whether the consumer can still commit when the loop ends.
        let usable = loop {
            let first = tokio::select! {
                biased;
                _ = shutdown.wait_for(|s| *s) => break true,
                m = consumer.recv() => m,
            };
            let first = match first {
                Ok(m) => m,
                Err(e) => {
                    if let Some(broken) = Broken::of(&consumer) {
                        self.broken.send_replace(Some(broken));
                        break false; // nothing can be committed through it
                    }
                    warn!(error = %e, "consumer error");
                    continue;
                }
            };
            let mut group = vec![first];
            let max_group = self.durability.max_group();
            while group.len() < max_group {
                match ready_now(consumer.recv()) {
                    Some(Ok(m)) => group.push(m),
                    _ => break,
                }
            }
            self.process(group, &finisher, &mut in_flight).await;
            if let Some(why) = self.durability.broken() {
                self.broken.send_replace(Some(Broken(why)));
                break false;
            }
        };
        // The groups in flight end before ingest does: they hold the store, which the shutdown
        // closes once ingest has ended.
        self.next_offsets.extend(in_flight.settle_all().await);
        if !usable {
            return;
        }
        // Commit exactly what RocksDB holds, for the partitions still assigned: never the
        // consumer's position, which can be past a group that was fetched but not stored.
        let mut tpl = rdkafka::TopicPartitionList::new();
        let assigned = self.consumer.assignment().unwrap_or_default();
        for (pid, next) in &self.next_offsets {
            let Some((topic, partition)) = self.store.partition_of(*pid) else {
                continue;
            };
            if assigned.find_partition(&topic, partition).is_some() {
                let _ = tpl.add_partition_offset(&topic, partition, rdkafka::Offset::Offset(*next));
            }
        }
        if tpl.count() == 0 || self.durability.offset_commit() == OffsetCommit::WithGroup {
            return;
        }
        let partitions = tpl.count();
        match commit_within(self.consumer.clone(), tpl, FINAL_COMMIT_WAIT).await {
            Some(Ok(())) => info!(partitions, "offsets committed"),
            Some(Err(e)) => debug!(error = %e, "no offsets committed at shutdown"),
            None => warn!(
                partitions,
                wait_s = FINAL_COMMIT_WAIT.as_secs(),
                "offsets not committed at shutdown in time; ingest resumes from the offsets in \
                 RocksDB and skips what it already stored"
            ),
        }
    }

    /// Interprets and stores `group`, then has `finisher` make it safe: here, or in the
    /// background while the next group is read ([`safe`]), after the groups `in_flight` before
    /// it.
    async fn process(
        &mut self,
        group: Vec<BorrowedMessage<'_>>,
        finisher: &Finisher,
        in_flight: &mut Pipeline,
    ) {
        if let Some(m) = group.first() {
            debug!(
                topic = m.topic(),
                partition = m.partition(),
                offset = m.offset(),
                records = group.len(),
                "group"
            );
        }
        let resumed = self.durability.resumed();
        self.next_offsets.extend(&resumed);
        in_flight.resumed(&resumed);
        let now = self.clock.now_ms();
        let Interpreted {
            ops,
            stamps,
            dead,
            last,
        } = self.interpret(&group, now).await;
        if ops.is_empty() {
            return;
        }
        // After the group's partitions were found owned (a revoke comes only when the consumer
        // is polled, after this group is handed on).
        let owned_at = self.store.ownership_now();
        let ops = Arc::new(ops);
        crate::failpoint::hit("after-consume");
        self.durability.before_store(&self.dead, &dead).await;
        let Some(applied) = self.apply(ops.clone(), now).await else {
            // Stopping while RocksDB refuses writes: no offset is stored for this group, so
            // Kafka delivers it again after the restart.
            return;
        };
        crate::failpoint::hit("after-store-write");
        let sending = self.durability.fire_now(&ops, &last).await;
        let taken = Taken {
            sending,
            ops,
            stamps,
            applied,
            last: last
                .into_iter()
                .map(|(pid, (topic, partition, offset))| {
                    (pid, (topic.to_owned(), partition, offset))
                })
                .collect(),
            dead,
            owned_at,
        };
        let settled = match self.durability.in_flight() {
            Some(guard) => in_flight.start(finisher, taken, guard).await,
            None => finisher.finish(taken, None, Turn::default()).await,
        };
        self.next_offsets.extend(settled);
    }

    /// What a group's last steps need (built once, when ingest starts).
    fn finisher(&self) -> Finisher {
        Finisher {
            durability: self.durability.clone(),
            consumer: self.consumer.clone(),
            store: self.store.clone(),
            scheduler: self.scheduler.clone(),
            metrics: self.metrics.clone(),
            dead_letters: self.dead.clone(),
            stopping: self.stopping.clone(),
        }
    }

    /// Reads a group through the contract: a store operation for every record not stored
    /// before, a dead letter for every rejected one, and the last offset of each partition.
    async fn interpret<'m>(
        &mut self,
        group: &'m [BorrowedMessage<'_>],
        now: u64,
    ) -> Interpreted<'m> {
        let mut out = Interpreted {
            ops: Vec::with_capacity(group.len()),
            stamps: Vec::with_capacity(group.len()),
            dead: Vec::new(),
            last: HashMap::new(),
        };
        // The source topic of each record taken, for the metric.
        let mut ingested: Vec<&str> = Vec::with_capacity(group.len());
        // A group holds runs of records from one partition: its id is looked up once per run,
        // with whether it is ingested here (with a changelog, only once restored).
        let mut current: Option<(&str, i32, Pid, bool)> = None;
        // Each record's headers, read in place (the contract copies the ones it carries on).
        let mut headers: Vec<HeaderRef<'_>> = Vec::new();
        let fires_due = self.durability.fires_due();
        for m in group {
            let (topic, partition, offset) = (m.topic(), m.partition(), m.offset());
            let (pid, ours) = match current {
                Some((t, p, pid, ours)) if t == topic && p == partition => (pid, ours),
                _ => {
                    let pid = self.partition_id(topic, partition).await;
                    let ours = self.store.owns(pid);
                    current = Some((topic, partition, pid, ours));
                    (pid, ours)
                }
            };
            if !ours {
                debug!(%topic, partition, offset, "partition not restored here; skipped");
                continue; // fetched before a revoke, or before the restore: consumed again
            }
            if offset < self.next_offsets.get(&pid).copied().unwrap_or(0) {
                debug!(%topic, partition, offset, "already stored; skipped");
                continue; // stored before a crash; Kafka's commit had not caught up
            }
            ingested.push(topic);
            header_refs(m.headers(), &mut headers);
            let timestamp_ms = m
                .timestamp()
                .to_millis()
                .and_then(|t| u64::try_from(t).ok());
            out.stamps.push(timestamp_ms);
            let incoming = Incoming {
                topic,
                timestamp_ms,
                key: m.key(),
                value: m.payload(),
                headers: &headers,
            };
            let interpreted = self.contract.interpret(&incoming, now);
            match self.op(interpreted, pid, (topic, partition, offset)).await {
                Ok(op) if fires_due => out.ops.push(fire_if_due(op, now)),
                Ok(op) => out.ops.push(op),
                Err(reject) => {
                    out.ops.push(IngestOp::Skip { pid, offset });
                    out.dead.push(DeadLetter {
                        key: m.key().map(<[u8]>::to_vec),
                        value: m.payload().map(<[u8]>::to_vec),
                        headers: headers.iter().map(|h| h.to_header()).collect(),
                        reject,
                        origin: Origin {
                            topic: topic.to_owned(),
                            partition,
                            offset,
                        },
                    });
                }
            }
            out.last.insert(pid, (topic, partition, offset));
        }
        crate::metrics::count_each(&self.metrics.ingest.records, ingested);
        out
    }

    /// The store operation for one interpreted record, counting retries; a rejected record is
    /// counted and handed back.
    async fn op(
        &mut self,
        interpreted: Result<Command, Reject>,
        pid: Pid,
        (topic, partition, offset): (&str, i32, i64),
    ) -> Result<IngestOp, Reject> {
        let schedule = match interpreted {
            Ok(Command::Schedule(schedule)) => schedule,
            Ok(Command::Retry { schedule, attempt }) => {
                debug!(%topic, partition, offset, target = %schedule.target(), attempt, "retry");
                self.metrics
                    .retry
                    .records
                    .with_label_values(&[schedule.target()])
                    .inc();
                schedule
            }
            Ok(Command::Exhausted { schedule, target }) => {
                debug!(%topic, partition, offset, %target, dead_letter = %schedule.target(),
                       "retries exhausted");
                self.metrics
                    .retry
                    .exhausted
                    .with_label_values(&[&target])
                    .inc();
                self.dead_letter_topics.ensure(schedule.target()).await;
                schedule
            }
            Ok(Command::Cancel { id }) => return Ok(IngestOp::Cancel { pid, offset, id }),
            Err(reject) => {
                debug!(%topic, partition, offset, reason = %reject.reason, detail = %reject.detail,
                       "record rejected");
                self.metrics
                    .ingest
                    .rejected
                    .with_label_values(&[reject.reason.code()])
                    .inc();
                return Err(reject);
            }
        };
        Ok(IngestOp::Schedule {
            pid,
            offset,
            schedule,
        })
    }

    async fn partition_id(&self, topic: &str, partition: i32) -> Pid {
        let mut backoff = Backoff::standard();
        loop {
            match self.store.partition_id(topic, partition) {
                Ok(pid) => return pid,
                Err(e) => {
                    error!(%topic, partition, error = %e, "cannot register source partition; retrying");
                    backoff.wait().await;
                }
            }
        }
    }

    /// Writes the group's effects (records that arrived at `now`), retrying until RocksDB takes
    /// them or the broker stops.
    async fn apply(&self, ops: Arc<Vec<IngestOp>>, now: u64) -> Option<Applied> {
        // Shared with the blocking write, not copied: a retry after a failed write uses it again.
        let mut backoff = Backoff::standard();
        loop {
            if self.stopping.as_ref().is_some_and(|s| *s.borrow()) {
                return None;
            }
            let store = self.store.clone();
            let batch = ops.clone();
            match tokio::task::spawn_blocking(move || store.apply(&batch, now)).await {
                Ok(Ok(applied)) => {
                    self.store_healthy.store(true, Ordering::Relaxed);
                    return Some(applied);
                }
                Ok(Err(e)) => {
                    self.store_healthy.store(false, Ordering::Relaxed);
                    error!(error = %e, "cannot write to RocksDB; consumption paused, retrying");
                }
                Err(e) => error!(error = %e, "store write task failed; retrying"),
            }
            backoff.wait().await;
        }
    }
}

/// `op` as a record that fires with its group, when it schedules one due by `now`.
fn fire_if_due(op: IngestOp, now: u64) -> IngestOp {
    match op {
        IngestOp::Schedule {
            pid,
            offset,
            schedule,
        } if schedule.due_ms() <= now => IngestOp::Fire {
            pid,
            offset,
            record: schedule,
        },
        op => op,
    }
}

#[cfg(test)]
mod tests {

    use crate::config::{Config, RunArgs};

    fn config(extra: &[&str]) -> Config {
        let mut flags = vec!["--brokers", "127.0.0.1:9092"];
        flags.extend_from_slice(extra);
        let run = RunArgs::try_parse_flags(flags).expect("flags parse");
        run.validate().expect("valid")
    }

    #[test]
    fn the_consumer_fetches_again_soon_after_its_queue_drains_unless_told_otherwise() {
        let c = super::consumer_config(&config(&[]));
        assert_eq!(c.get("fetch.queue.backoff.ms"), Some("10"));
        assert_eq!(c.get("enable.auto.offset.store"), Some("false"));
        let c = super::consumer_config(&config(&["--kafka-config", "fetch.queue.backoff.ms=500"]));
        assert_eq!(c.get("fetch.queue.backoff.ms"), Some("500"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_commit_at_shutdown_gives_up_after_its_wait_instead_of_hanging() {
        // A consumer whose group coordinator never answers: nothing listens on the port.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let consumer: rdkafka::consumer::BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", format!("127.0.0.1:{port}"))
            .set("group.id", "never-answered")
            .create()
            .unwrap();
        let mut tpl = rdkafka::TopicPartitionList::new();
        tpl.add_partition_offset("delay.t", 0, rdkafka::Offset::Offset(7))
            .unwrap();
        let started = std::time::Instant::now();
        let answer = super::commit_within(
            std::sync::Arc::new(consumer),
            tpl,
            std::time::Duration::from_secs(2),
        )
        .await;
        // librdkafka's synchronous commit alone would still be waiting; the wait ends it.
        assert!(
            answer.is_none(),
            "an answer without a coordinator: {answer:?}"
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(30));
    }
}
