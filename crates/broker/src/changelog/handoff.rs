//! Source partitions changing owner.
//!
//! **Assigned:** the partition is assigned paused (nothing of it is consumed), restored from
//! its changelog on a thread of its own, then owned: its timers go to the scheduler (overdue
//! ones fire at once, in due order), ingest resumes at the source offset the changelog holds,
//! and the partition is resumed.
//!
//! **Revoked**, inside the rebalance callback, before librdkafka lets the partition go: the
//! partition stops firing, its deliveries in flight finish (or are abandoned after
//! `--handoff-wait`), every changelog write owed is acknowledged, and its local state is then
//! dropped. A partition lost without a revoke (this instance was cut off) cannot do any of
//! that: the records it had in flight may fire again on the new owner.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, StreamConsumer};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::mpsc;
use tracing::{error, info, warn};

use super::restore::{self, Outcome, Part};
use super::{topics, Changelog};
use crate::config::{millis, Config};
use crate::metrics::Metrics;
use crate::scheduler::{Inserts, Wake};
use crate::store::{Pid, Store};
use crate::txn::Transactions;

/// Where ingest resumes each partition it was handed: set before the partition is resumed,
/// taken by ingest before its next group.
pub type Resumes = Arc<Mutex<HashMap<Pid, i64>>>;

/// What the rebalance callback hands the task that restores.
#[derive(Debug)]
enum Event {
    Assigned(Vec<Part>),
    Revoked(Vec<Pid>),
}

/// Shared by the rebalance callback and the task that restores partitions.
#[derive(Debug)]
pub struct Handoff {
    pub(super) store: Arc<Store>,
    pub(super) changelog: Changelog,
    pub(super) config: Arc<Config>,
    events: mpsc::UnboundedSender<Event>,
    /// The partitions being restored, and the flag that stops each.
    restoring: Mutex<HashMap<Pid, Arc<AtomicBool>>>,
    /// The partitions a standby pass is catching up, and the flag that stops each (an
    /// assignment stops it). Locked after `restoring`.
    pub(super) standby: Mutex<HashMap<Pid, Arc<AtomicBool>>>,
    /// Held by every restore and standby pass: one at a time writes a partition's state.
    pub(super) restore_lock: Arc<Mutex<()>>,
    /// Records in each warm copy.
    pub(super) warm: Mutex<HashMap<Pid, u64>>,
    /// Set at shutdown: a revoke then keeps the local state (the checkpoint makes the next
    /// start read only the changelog's tail).
    stopping: AtomicBool,
    /// Whether any assignment has been seen: partitions in the local store that the first one
    /// does not include are dropped.
    first_seen: AtomicBool,
    /// Delete-after-delivery tombstones not yet handed to the changelog's producer.
    owed: AtomicUsize,
    resumes: Resumes,
    pub(super) metrics: Metrics,
    /// Where this instance's HTTP server is reached, once it listens.
    pub(super) advertised: std::sync::OnceLock<String>,
    /// With exactly-once: the transaction loop, once ingest has started it.
    pub(super) transactions: std::sync::OnceLock<Transactions>,
    /// With exactly-once: the source offset up to which each owned partition's ingest has
    /// committed (the offset a firing transaction commits for the group).
    pub(super) consumed: Mutex<HashMap<Pid, i64>>,
}

/// The receiving end of [`Handoff`]'s events, for [`Handoff::run`].
#[derive(Debug)]
pub struct Events(mpsc::UnboundedReceiver<Event>);

impl Handoff {
    /// A handoff for `store`'s partitions.
    pub fn new(
        store: Arc<Store>,
        changelog: Changelog,
        config: Arc<Config>,
        metrics: Metrics,
    ) -> (Arc<Self>, Events) {
        let (tx, rx) = mpsc::unbounded_channel();
        store.track_ownership();
        let h = Self {
            store,
            changelog,
            config,
            events: tx,
            restoring: Mutex::default(),
            standby: Mutex::default(),
            restore_lock: Arc::default(),
            warm: Mutex::default(),
            stopping: AtomicBool::new(false),
            first_seen: AtomicBool::new(false),
            owed: AtomicUsize::new(0),
            resumes: Arc::default(),
            metrics,
            advertised: std::sync::OnceLock::new(),
            transactions: std::sync::OnceLock::new(),
            consumed: Mutex::default(),
        };
        (Arc::new(h), Events(rx))
    }

    /// Where ingest resumes the partitions handed over.
    pub fn resumes(&self) -> Resumes {
        self.resumes.clone()
    }

    /// The changelog.
    pub fn changelog(&self) -> &Changelog {
        &self.changelog
    }

    /// From now on a revoke keeps the local state (the process is stopping).
    pub fn stopping(&self) {
        self.stopping.store(true, Ordering::Relaxed);
    }

    /// A delete after delivery is about to write tombstones ([`Handoff::paid`] when handed to
    /// the producer): a revoke waits for them.
    pub fn owe(&self) {
        self.owed.fetch_add(1, Ordering::AcqRel);
    }

    /// See [`Handoff::owe`].
    pub fn paid(&self) {
        self.owed.fetch_sub(1, Ordering::AcqRel);
    }

    /// In the rebalance callback: `tpl` is assigned paused and handed to the restore task.
    pub fn on_assign<C: ConsumerContext>(
        &self,
        consumer: &BaseConsumer<C>,
        tpl: &TopicPartitionList,
    ) {
        if let Err(e) = consumer.pause(tpl) {
            error!(error = %e, "cannot pause newly assigned partitions");
        }
        let mut parts = Vec::new();
        for e in tpl.elements() {
            if self.changelog.is_changelog(e.topic()) {
                error!(topic = e.topic(), partition = e.partition(),
                       "--source-pattern matches a changelog topic; it stays paused (narrow the pattern)");
                continue;
            }
            let pid = match self.store.partition_id(e.topic(), e.partition()) {
                Ok(pid) => pid,
                Err(err) => {
                    error!(topic = e.topic(), partition = e.partition(), error = %err,
                           "cannot register a source partition; it stays paused");
                    continue;
                }
            };
            let cancelled = Arc::new(AtomicBool::new(false));
            self.lock_restoring().insert(pid, cancelled.clone());
            parts.push(Part {
                pid,
                topic: e.topic().to_owned(),
                partition: e.partition(),
                cancelled,
            });
        }
        // A standby pass under way stops (at its next chunk), so the restore of what is
        // assigned need not wait for it; the next pass goes on from where it stopped.
        {
            let _restoring = self.lock_restoring();
            for flag in lock(&self.standby).values() {
                flag.store(true, Ordering::Relaxed);
            }
        }
        self.count_restoring();
        // With standbys, the standby pass decides what of the rest stays.
        if !self.first_seen.swap(true, Ordering::Relaxed) && !self.keeps_copies() {
            self.drop_unassigned(&parts);
        }
        let _ = self.events.send(Event::Assigned(parts));
    }

    /// Local partitions the first assignment did not bring are another instance's now.
    fn drop_unassigned(&self, parts: &[Part]) {
        let mine: HashSet<Pid> = parts.iter().map(|p| p.pid).collect();
        let stale: Vec<Pid> = self
            .store
            .partitions_with_state()
            .into_iter()
            .filter(|pid| !mine.contains(pid))
            .collect();
        if !stale.is_empty() {
            let _ = self.events.send(Event::Revoked(stale));
        }
    }

    /// In the rebalance callback, before librdkafka lets `tpl` go: stops firing its
    /// partitions, waits (at most the handoff wait) for their deliveries in flight and the
    /// changelog writes they owe, then hands them to the restore task to be dropped.
    pub fn on_revoke(&self, tpl: &TopicPartitionList) {
        let pids: Vec<Pid> = tpl
            .elements()
            .iter()
            .filter_map(|e| self.store.lookup_partition(e.topic(), e.partition()))
            .collect();
        for pid in &pids {
            if let Some(flag) = self.lock_restoring().remove(pid) {
                flag.store(true, Ordering::Relaxed);
            }
            self.store.disown(*pid);
        }
        self.count_restoring();
        let wait = self.config.cluster.handoff_wait;
        let started = Instant::now();
        let settled = || {
            pids.iter().all(|p| self.store.claimed_in(*p) == 0)
                && self.owed.load(Ordering::Acquire) == 0
        };
        blocking(|| {
            while !settled() && started.elapsed() < wait {
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        let in_flight: usize = pids.iter().map(|p| self.store.claimed_in(*p)).sum();
        let flushed = blocking(|| self.changelog.flush(wait.saturating_sub(started.elapsed())));
        self.metrics
            .broker
            .handoff_unsettled
            .inc_by(in_flight as u64);
        if in_flight > 0 || flushed.is_err() {
            warn!(in_flight, flushed = ?flushed, wait_ms = millis(wait),
                  "partitions let go before all their deliveries settled; those records may fire again on the new owner");
        }
        info!(
            partitions = pids.len(),
            ms = started.elapsed().as_millis() as u64,
            "revoked partitions stopped firing and their changelog writes are acknowledged"
        );
        if !self.stopping.load(Ordering::Relaxed) && !self.keeps_copies() {
            let _ = self.events.send(Event::Revoked(pids));
        }
    }

    /// Whether partitions owned elsewhere may stay here, as standby copies.
    fn keeps_copies(&self) -> bool {
        self.config.cluster.standby_replicas > 0
    }

    pub(super) fn lock_restoring(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<Pid, Arc<AtomicBool>>> {
        lock(&self.restoring)
    }

    fn count_restoring(&self) {
        let n = self.lock_restoring().len();
        self.metrics.broker.partitions_restoring.set(n as i64);
    }

    /// The restore task: restores what is assigned, drops what was revoked, in the order the
    /// callback saw them.
    pub async fn run<C>(
        self: Arc<Self>,
        mut events: Events,
        consumer: Arc<StreamConsumer<C>>,
        scheduler: Inserts,
        (horizon_ms, clock): (u64, Arc<dyn crate::clock::Clock>),
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) where
        C: ConsumerContext + 'static,
    {
        loop {
            let event = tokio::select! {
                _ = stop.wait_for(|s| *s) => return, // lets go of the consumer, so it can close
                e = events.0.recv() => e,
            };
            match event {
                None => return,
                Some(Event::Revoked(pids)) => self.drop_partitions(pids).await,
                Some(Event::Assigned(parts)) => {
                    let until = clock.now_ms().saturating_add(horizon_ms);
                    self.take_over(parts, &consumer, &scheduler, until).await;
                }
            }
        }
    }

    async fn drop_partitions(self: &Arc<Self>, pids: Vec<Pid>) {
        let h = self.clone();
        let _ = tokio::task::spawn_blocking(move || h.drop_owned_elsewhere(pids)).await;
    }

    /// Drops the local state of those of `pids` neither owned nor being restored here, and
    /// says how many records went. Blocking.
    pub(super) fn drop_owned_elsewhere(&self, pids: impl IntoIterator<Item = Pid>) -> u64 {
        let mut dropped = 0;
        for pid in pids {
            if self.store.owns(pid) || self.lock_restoring().contains_key(&pid) {
                continue;
            }
            match self.store.drop_partition(pid) {
                Ok(n) => dropped += n,
                Err(e) => {
                    warn!(error = %e, "cannot drop the local state of a partition owned elsewhere")
                }
            }
        }
        if dropped > 0 {
            info!(
                records = dropped,
                "local state of partitions owned elsewhere dropped"
            );
        }
        dropped
    }

    /// Restores `parts` (trying again until it works or they are revoked), then makes each
    /// one fire here and resumes its consumption.
    async fn take_over<C: ConsumerContext + 'static>(
        &self,
        mut parts: Vec<Part>,
        consumer: &Arc<StreamConsumer<C>>,
        scheduler: &Inserts,
        until: u64,
    ) {
        let mut delay = Duration::from_secs(1);
        loop {
            parts.retain(|p| !p.cancelled.load(Ordering::Relaxed));
            if parts.is_empty() {
                return;
            }
            let started = Instant::now();
            match self.restore(parts.clone()).await {
                Ok(outcomes) => {
                    for part in &parts {
                        if let Some(outcome) = outcomes.get(&part.pid) {
                            self.activate(part, outcome, consumer, scheduler, until, started)
                                .await;
                        }
                    }
                    return;
                }
                Err(e) => {
                    error!(error = %e, partitions = parts.len(),
                           "cannot restore assigned partitions; they stay paused, trying again");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(30));
                }
            }
        }
    }

    async fn restore(&self, parts: Vec<Part>) -> Result<HashMap<Pid, Outcome>, String> {
        let (store, config, changelog) = (
            self.store.clone(),
            self.config.clone(),
            self.changelog.clone(),
        );
        let (one_at_a_time, remaining) = (
            self.restore_lock.clone(),
            self.metrics.broker.restore_remaining.clone(),
        );
        tokio::task::spawn_blocking(move || {
            let _turn = lock(&one_at_a_time);
            let replication = config.cluster.changelog_replication;
            let sources: HashSet<&str> = parts.iter().map(|p| p.topic.as_str()).collect();
            for source in sources {
                topics::ensure(&config, source, &changelog.topic_of(source), replication)
                    .map_err(|e| e.to_string())?;
            }
            let parts = parts
                .into_iter()
                .map(|p| Part {
                    topic: changelog.topic_of(&p.topic),
                    ..p
                })
                .collect();
            restore::restore(
                &config,
                &store,
                parts,
                Duration::from_secs(10),
                Some(&remaining),
            )
            .map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| e.to_string())?
    }

    /// The partition fires here from now on: its timers go to the scheduler, ingest resumes
    /// where the changelog says.
    async fn activate<C: ConsumerContext + 'static>(
        &self,
        part: &Part,
        outcome: &Outcome,
        consumer: &Arc<StreamConsumer<C>>,
        scheduler: &Inserts,
        until: u64,
        started: Instant,
    ) {
        self.metrics.broker.restored_entries.inc_by(outcome.entries);
        if self.lock_restoring().remove(&part.pid).is_none() {
            return; // revoked meanwhile
        }
        self.count_restoring();
        let pid = part.pid;
        if self.exactly_once() {
            self.forget_uncommitted(pid, outcome.source_next).await;
        }
        self.store.own(pid);
        lock(&self.warm).remove(&pid);
        let store = self.store.clone();
        let timers = tokio::task::spawn_blocking(move || store.due_of_partition(pid, until))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()));
        match timers {
            Ok(t) if !t.is_empty() => {
                let _ = scheduler.send(Wake::Indexed(t)).await;
            }
            Ok(_) => {}
            Err(e) => error!(error = %e, "cannot read the restored partition's timers"),
        }
        let offset = match outcome.source_next {
            Some(next) => {
                self.resumes
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(pid, next);
                Offset::Offset(next)
            }
            None => self.committed_or_reset(consumer, part).await,
        };
        let (c, topic, partition) = (consumer.clone(), part.topic.clone(), part.partition);
        // Resumed even if the seek fails: it then starts at the committed offset, which is
        // never past the changelog's (offsets are committed after the changelog has a group),
        // and ingest skips what the changelog already holds.
        let resumed = tokio::task::spawn_blocking(move || {
            let sought = c.seek(&topic, partition, offset, Duration::from_secs(10));
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(&topic, partition);
            sought.and(c.resume(&tpl))
        })
        .await;
        info!(topic = %part.topic, partition = part.partition, entries = outcome.entries,
              from_checkpoint = outcome.from_checkpoint, resume_at = ?offset,
              pending = self.store.pending(), ms = started.elapsed().as_millis() as u64,
              result = ?resumed.as_ref().map(|r| r.as_ref().map_err(|e| e.to_string())),
              "partition restored and firing here");
    }

    /// Where a partition the changelog has no source offset for starts: its committed offset,
    /// else the beginning (or the end, with `auto.offset.reset=latest`).
    async fn committed_or_reset<C: ConsumerContext + 'static>(
        &self,
        consumer: &Arc<StreamConsumer<C>>,
        part: &Part,
    ) -> Offset {
        let latest = self.config.kafka.properties.iter().any(|p| {
            p.key == "auto.offset.reset" && matches!(p.value.as_str(), "latest" | "largest" | "end")
        });
        let (c, topic, partition) = (consumer.clone(), part.topic.clone(), part.partition);
        let committed = tokio::task::spawn_blocking(move || {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(&topic, partition);
            c.committed_offsets(tpl, Duration::from_secs(10))
                .ok()
                .and_then(|t| t.elements().first().map(|e| e.offset()))
        })
        .await
        .ok()
        .flatten();
        match committed {
            Some(Offset::Offset(o)) => Offset::Offset(o),
            _ if latest => Offset::End,
            _ => Offset::Beginning,
        }
    }
}

/// `m` locked, even if a thread panicked holding it.
pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `f`, which blocks, letting the runtime move its other tasks off this worker first.
pub(super) fn blocking<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}
