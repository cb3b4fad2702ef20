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

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::TopicPartitionList;
use tokio::sync::mpsc;
use tracing::{error, info, warn};

use super::restore::Part;
use super::Changelog;
use crate::config::{millis, Config};
use crate::metrics::Metrics;
use crate::store::Store;
use crate::BoxFuture;
use kafka_delay_core::id::Pid;

/// Run once a partition is restored, before it fires here: given the partition and the source
/// offset its changelog holds (the transactional mode drops what an uncommitted ingest left).
#[derive(Clone)]
pub struct OnRestored(pub Arc<dyn Fn(Pid, Option<i64>) -> BoxFuture<'static, ()> + Send + Sync>);

impl std::fmt::Debug for OnRestored {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnRestored")
    }
}

/// What the rebalance callback hands the task that restores.
#[derive(Debug)]
pub(super) enum Event {
    /// Partitions assigned, to restore.
    Assigned(Vec<Part>),
    /// Partitions revoked, to drop.
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
    /// Where ingest resumes each partition it was handed: set before the partition is
    /// resumed, taken by ingest before its next group.
    pub(super) resumes: Mutex<HashMap<Pid, i64>>,
    pub(super) metrics: Metrics,
    /// Where this instance's HTTP server is reached.
    pub(super) advertised: String,
    /// Run once a partition is restored, before it fires here.
    pub(super) on_restored: Option<OnRestored>,
}

/// The receiving end of [`Handoff`]'s events, for [`Handoff::run`].
#[derive(Debug)]
pub struct Events(pub(super) mpsc::UnboundedReceiver<Event>);

impl Handoff {
    /// A handoff for `store`'s partitions, of the instance whose HTTP server is reached at
    /// `advertised`.
    pub fn new(
        store: Arc<Store>,
        changelog: Changelog,
        config: Arc<Config>,
        metrics: Metrics,
        (advertised, on_restored): (String, Option<OnRestored>),
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
            resumes: Mutex::default(),
            metrics,
            advertised,
            on_restored,
        };
        (Arc::new(h), Events(rx))
    }

    /// Where ingest resumes the partitions handed over since the last call.
    pub fn take_resumed(&self) -> HashMap<Pid, i64> {
        std::mem::take(&mut *lock(&self.resumes))
    }

    /// The store whose partitions move.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
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

    pub(super) fn count_restoring(&self) {
        let n = self.lock_restoring().len();
        self.metrics.broker.partitions_restoring.set(n as i64);
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
