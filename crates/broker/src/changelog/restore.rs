//! Restoring partitions from the changelog: from the local checkpoint when there is one (only
//! the tail), from the beginning otherwise, up to the end the changelog had when the restore
//! began. Blocking; runs on a thread of its own.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus::IntGauge;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use tracing::warn;

use super::bodies::Bodies;
use super::progress::{Progress, Report};
use crate::config::Config;
use crate::kafka::base_config;
use crate::metrics::BrokerMetrics;
use crate::store::{Store, StoreError};
use kafka_delay_core::changelog::{decode, Checkpoint, Restored};
use kafka_delay_core::id::Pid;

/// Entries applied per write batch.
const CHUNK: usize = 4_096;

/// A partition to restore.
#[derive(Debug, Clone)]
pub struct Part {
    /// Its id in the store.
    pub pid: Pid,
    /// The changelog topic.
    pub topic: String,
    /// The partition (the source partition's number).
    pub partition: i32,
    /// Turns true when the partition is revoked: the restore of it stops.
    pub cancelled: Arc<AtomicBool>,
}

/// What a restore did for one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// Where ingest resumes (the changelog's last source offset), if it says.
    pub source_next: Option<i64>,
    /// Entries read from the changelog.
    pub entries: u64,
    /// Whether it started from a local checkpoint (only the tail was read).
    pub from_checkpoint: bool,
    /// Records the partition gained (less when it lost some).
    pub delta: i64,
}

/// Why a restore failed.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// Reading the changelog failed.
    #[error("reading changelog {topic}/{partition}: {source}")]
    Kafka {
        /// Changelog topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// librdkafka's error.
        source: KafkaError,
    },
    /// Writing RocksDB failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A later stage of the restore (resolving pointers, writing RocksDB) stopped; its own
    /// error is the one returned.
    #[error("a stage of the restore stopped")]
    WriterStopped,
    /// An entry could not be read.
    #[error("changelog {topic}/{partition} offset {offset}: {detail}")]
    Corrupt {
        /// Changelog topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// Offset of the entry.
        offset: i64,
        /// What is wrong.
        detail: kafka_delay_core::changelog::DecodeError,
    },
}

/// Restores `parts` into `store` and returns each one's outcome (a cancelled one is left out).
/// `metrics`, when given, show the entries still to read, every second, and the time the
/// restore took.
///
/// # Errors
/// The first partition that could not be restored; what was applied of it stays, with its
/// checkpoint, so a second try reads only the rest.
pub fn restore(
    config: &Config,
    store: &Store,
    parts: Vec<Part>,
    wait: Duration,
    metrics: Option<&BrokerMetrics>,
) -> Result<HashMap<Pid, Outcome>, RestoreError> {
    let started = Instant::now();
    let remaining = metrics.map(|m| &m.restore_remaining);
    // One consumer per changelog topic: librdkafka's end-of-partition event names only the
    // partition's number.
    let mut by_topic: HashMap<String, Vec<Part>> = HashMap::new();
    for part in parts {
        by_topic.entry(part.topic.clone()).or_default().push(part);
    }
    let mut out = HashMap::new();
    let mut bodies = Bodies::new(config, wait);
    for (topic, parts) in by_topic {
        let mut progress = Vec::with_capacity(parts.len());
        // Entries are read committed; each partition is read up to its log end, past any
        // transaction still open there (read committed, the end would be where that
        // transaction began: an exactly-once instance's firing that commits later would
        // then be missed).
        let consumer = restore_consumer(config, &topic, "read_committed")?;
        let ends = restore_consumer(config, &topic, "read_uncommitted")?;
        for (index, part) in parts.into_iter().enumerate() {
            progress.push(start(store, &ends, (index, part), wait)?);
        }
        let deltas = read_and_write(
            store,
            &mut bodies,
            &consumer,
            &mut progress,
            (remaining, wait),
        )?;
        close([consumer, ends]);
        for (p, delta) in progress.iter_mut().zip(deltas) {
            p.delta = delta;
        }
        out.extend(
            progress
                .into_iter()
                .filter(|p| !p.part.cancelled.load(Ordering::Relaxed))
                .map(|p| {
                    (
                        p.part.pid,
                        Outcome {
                            source_next: p.source_next,
                            entries: p.entries,
                            from_checkpoint: p.from_checkpoint,
                            delta: p.delta,
                        },
                    )
                }),
        );
    }
    close(bodies.into_consumer());
    if let Some(m) = metrics {
        m.restore_remaining.set(0);
        m.restore_seconds.inc_by(started.elapsed().as_secs_f64());
    }
    Ok(out)
}

pub(super) fn restore_consumer(
    config: &Config,
    topic: &str,
    isolation: &str,
) -> Result<BaseConsumer, RestoreError> {
    let mut c = base_config(config);
    c.set("group.id", config.kafka.restore_group())
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", isolation)
        // A full prefetch queue otherwise stops fetching for a second (librdkafka's default),
        // which a restore reading as fast as it can spends waiting.
        .set("fetch.queue.backoff.ms", "10");
    c.create().map_err(|source| RestoreError::Kafka {
        topic: topic.to_owned(),
        partition: -1,
        source,
    })
}

/// Closes `consumers` on a thread of their own: closing a librdkafka client waits up to a
/// tenth of a second for its threads to stop, which the partitions just restored, waiting to
/// fire, do not have to wait for.
pub(super) fn close(consumers: impl IntoIterator<Item = BaseConsumer> + Send + 'static) {
    let closing = std::thread::Builder::new()
        .name("restore-close".into())
        .spawn(move || consumers.into_iter().for_each(drop));
    // Without a thread, `consumers` were closed here, when the closure was dropped.
    drop(closing);
}

fn kafka(part: &Part, source: KafkaError) -> RestoreError {
    RestoreError::Kafka {
        topic: part.topic.clone(),
        partition: part.partition,
        source,
    }
}

/// A batch of one partition's entries, with the checkpoint they reach.
struct Batch {
    index: usize,
    part: Part,
    entries: Vec<Restored>,
    at: Checkpoint,
}

/// A restore runs on three threads: this one reads the changelog and decodes its entries; a
/// second reads the values pointers name from the source topics; a third applies the batches
/// to RocksDB, in the order read. Each works on the next batch while the one after it works
/// on the last. Returns what each partition gained.
fn read_and_write(
    store: &Store,
    bodies: &mut Bodies<'_>,
    consumer: &BaseConsumer,
    progress: &mut [Progress],
    (remaining, wait): (Option<&IntGauge>, Duration),
) -> Result<Vec<i64>, RestoreError> {
    let absent: Vec<Option<i64>> = progress.iter().map(|p| p.absent_above).collect();
    std::thread::scope(|scope| {
        let (to_resolve, resolving) = sync_channel::<Batch>(AHEAD);
        let (to_write, writing) = sync_channel::<Batch>(AHEAD);
        let writer = stage(scope, "restore-write", move || {
            write_all(store, &writing, absent)
        })?;
        let resolver = stage(scope, "restore-resolve", move || {
            resolve_all(store, bodies, &resolving, &to_write)
        })?;
        let read = (|| {
            read_topic(&to_resolve, consumer, progress, (remaining, wait))?;
            // The checkpoint of a partition with nothing (left) to read, and what is buffered.
            for p in progress.iter_mut() {
                if !p.part.cancelled.load(Ordering::Relaxed) {
                    apply(&to_resolve, p)?;
                }
            }
            Ok(())
        })();
        drop(to_resolve);
        let resolved = resolver.join().unwrap_or(Err(RestoreError::WriterStopped));
        let written = writer.join().unwrap_or(Err(RestoreError::WriterStopped));
        // The first stage to fail says why: a later one stopping stops those before it.
        written.and_then(|deltas| resolved.and(read).map(|()| deltas))
    })
}

/// Batches handed to the next stage before a stage waits for it.
const AHEAD: usize = 2;

/// Starts a stage of the restore on a thread of its own.
fn stage<'scope, T: Send + 'scope>(
    scope: &'scope std::thread::Scope<'scope, '_>,
    name: &str,
    work: impl FnOnce() -> Result<T, RestoreError> + Send + 'scope,
) -> Result<std::thread::ScopedJoinHandle<'scope, Result<T, RestoreError>>, RestoreError> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn_scoped(scope, work)
        .map_err(|e| {
            RestoreError::Store(StoreError::Corrupt {
                what: "restore thread",
                detail: e.to_string(),
            })
        })
}

/// The resolver: replaces each batch's pointers by the records they stand for.
fn resolve_all(
    store: &Store,
    bodies: &mut Bodies<'_>,
    batches: &Receiver<Batch>,
    writer: &SyncSender<Batch>,
) -> Result<(), RestoreError> {
    for mut b in batches {
        bodies.resolve(store, &b.part, &mut b.entries)?;
        writer.send(b).map_err(|_| RestoreError::WriterStopped)?;
    }
    Ok(())
}

/// The writer: applies each batch with its checkpoint, in the order read.
fn write_all(
    store: &Store,
    batches: &Receiver<Batch>,
    mut absent: Vec<Option<i64>>,
) -> Result<Vec<i64>, RestoreError> {
    let mut deltas = vec![0; absent.len()];
    for b in batches {
        deltas[b.index] += store.restore(b.part.pid, &b.entries, b.at, &mut absent[b.index])?;
    }
    Ok(deltas)
}

/// Where a partition's restore starts and ends. Local state without a checkpoint (or with one
/// past the changelog's end: the changelog was recreated) cannot be trusted and is dropped.
fn start(
    store: &Store,
    consumer: &BaseConsumer,
    (index, part): (usize, Part),
    wait: Duration,
) -> Result<Progress, RestoreError> {
    let (low, end) = consumer
        .fetch_watermarks(&part.topic, part.partition, wait)
        .map_err(|source| kafka(&part, source))?;
    let checkpoint = store.checkpoint(part.pid)?;
    let usable = checkpoint.filter(|c| c.changelog_next >= low && c.changelog_next <= end);
    if usable.is_none() {
        let dropped = store.drop_partition(part.pid)?;
        if dropped > 0 || checkpoint.is_some() {
            warn!(topic = %part.topic, partition = part.partition, dropped, ?checkpoint, low, end,
                  "local state of the partition does not match its changelog; restoring it from the beginning");
        }
    }
    Ok(Progress {
        next: usable.map_or(low, |c| c.changelog_next),
        end,
        source_next: usable.and_then(|c| c.source_next),
        buffer: Vec::new(),
        entries: 0,
        delta: 0,
        from_checkpoint: usable.is_some(),
        absent_above: usable.is_none().then_some(-1),
        held_at: None,
        part,
        index,
    })
}

/// Reads one changelog topic's partitions until each reached the end it had when the restore
/// began (or was cancelled), applying entries a chunk at a time with the checkpoint they reach.
fn read_topic(
    writer: &Writer,
    consumer: &BaseConsumer,
    progress: &mut [Progress],
    (remaining, wait): (Option<&IntGauge>, Duration),
) -> Result<(), RestoreError> {
    let mut tpl = TopicPartitionList::new();
    for p in progress.iter().filter(|p| p.next < p.end) {
        tpl.add_partition_offset(&p.part.topic, p.part.partition, Offset::Offset(p.next))
            .map_err(|source| kafka(&p.part, source))?;
    }
    if tpl.count() == 0 {
        return Ok(());
    }
    consumer
        .assign(&tpl)
        .map_err(|source| kafka(&progress[0].part, source))?;
    let index: HashMap<i32, usize> = progress
        .iter()
        .enumerate()
        .map(|(i, p)| (p.part.partition, i))
        .collect();
    let mut report = Report::new(remaining);
    while !progress.iter().all(Progress::done) {
        let polled = poll(consumer, Duration::from_millis(100));
        report.after(polled.is_none(), progress);
        match polled {
            None => {}
            // Compaction and transaction markers can leave the last offsets without a record:
            // the end-of-partition event says the rest has been read, up to the last stable
            // offset. Below the end, a transaction is still open: its outcome comes first.
            Some(Err(KafkaError::PartitionEOF(partition))) => {
                if let Some(p) = index.get(&partition).map(|&i| &mut progress[i]) {
                    let (_, stable) = consumer
                        .fetch_watermarks(&p.part.topic, partition, wait)
                        .map_err(|source| kafka(&p.part, source))?;
                    if stable >= p.end {
                        p.next = p.next.max(p.end);
                        apply(writer, p)?;
                    } else {
                        p.held(stable);
                    }
                }
            }
            Some(Err(source)) => return Err(kafka(&progress[0].part, source)),
            Some(Ok(m)) => {
                let Some(&i) = index.get(&m.partition()) else {
                    continue;
                };
                let p = &mut progress[i];
                p.held_at = None;
                if m.offset() >= p.next && !p.done() {
                    take(writer, p, &m)?;
                }
            }
        }
    }
    Ok(())
}

/// The next message of `consumer`: one already fetched without waiting, else waiting up to
/// `wait`. librdkafka reads the clock for a poll that may wait and not for one that does not,
/// and a restore mostly finds the next message fetched.
pub(super) fn poll(
    consumer: &BaseConsumer,
    wait: Duration,
) -> Option<rdkafka::error::KafkaResult<rdkafka::message::BorrowedMessage<'_>>> {
    consumer
        .poll(Duration::ZERO)
        .or_else(|| consumer.poll(wait))
}

/// Buffers the entry `m` of `p`, applying the buffer when it is a chunk or reaches the end.
fn take(
    writer: &Writer,
    p: &mut Progress,
    m: &rdkafka::message::BorrowedMessage<'_>,
) -> Result<(), RestoreError> {
    let entry = decode(m.key(), m.payload()).map_err(|detail| RestoreError::Corrupt {
        topic: p.part.topic.clone(),
        partition: p.part.partition,
        offset: m.offset(),
        detail,
    })?;
    if let Restored::SourceOffset(n) = entry {
        p.source_next = Some(n);
    }
    p.buffer.push(entry);
    p.entries += 1;
    p.next = m.offset() + 1;
    if p.buffer.len() >= CHUNK || p.next >= p.end {
        apply(writer, p)?;
    }
    Ok(())
}

/// Where batches go to be resolved and written.
type Writer = SyncSender<Batch>;

/// Hands the buffered entries to be resolved and written, with the checkpoint they reach.
fn apply(writer: &Writer, p: &mut Progress) -> Result<(), RestoreError> {
    let at = Checkpoint {
        changelog_next: p.next,
        source_next: p.source_next,
    };
    writer
        .send(Batch {
            index: p.index,
            part: p.part.clone(),
            entries: std::mem::take(&mut p.buffer),
            at,
        })
        .map_err(|_| RestoreError::WriterStopped)
}
