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
//! kept a while ([`super::kept`]: a partition that comes back reads only its changelog's tail)
//! before it is dropped. A partition lost without a revoke (this instance was cut off) cannot do any of
//! that: the records it had in flight may fire again on the new owner.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::TopicPartitionList;
use tokio::sync::{mpsc, watch};
use tracing::{error, info, warn};

use super::moving::{blocking, Moving};
use super::restore::Part;
use crate::config::millis;
use kafka_delay_core::id::Pid;

/// What the rebalance callback hands the restore task.
#[derive(Debug)]
pub(super) enum Event {
    /// Partitions assigned, to restore.
    Assigned(Vec<Part>),
    /// Partitions revoked, to keep for a while and then drop.
    Revoked(Vec<Pid>),
}

/// The rebalance callback's side of partitions changing owner.
#[derive(Debug)]
pub struct Handoff {
    moving: Arc<Moving>,
    events: mpsc::UnboundedSender<Event>,
    /// Set at shutdown: a revoke then keeps the local state (the checkpoint makes the next
    /// start read only the changelog's tail).
    stopping: AtomicBool,
    /// Whether any assignment has been seen: partitions in the local store that the first one
    /// does not include are handed to the restore task as revoked.
    first_seen: AtomicBool,
    /// Delete-after-delivery tombstones not yet handed to the changelog's producer.
    owed: AtomicUsize,
    /// Counts revokes: a lingering ingest group is written at once when it changes.
    revokes: watch::Sender<u64>,
}

/// Changelog writes owed while it lives ([`Handoff::owing`]).
#[derive(Debug)]
pub struct Owing(Arc<Handoff>);

impl Drop for Owing {
    fn drop(&mut self) {
        self.0.paid();
    }
}

/// The receiving end of [`Handoff`]'s events, for the restore task.
#[derive(Debug)]
pub struct Events(pub(super) mpsc::UnboundedReceiver<Event>);

impl Handoff {
    /// The callback's side of `moving`, and the events it sends the restore task.
    pub fn new(moving: Arc<Moving>) -> (Self, Events) {
        let (tx, rx) = mpsc::unbounded_channel();
        let h = Self {
            moving,
            events: tx,
            stopping: AtomicBool::new(false),
            first_seen: AtomicBool::new(false),
            owed: AtomicUsize::new(0),
            revokes: watch::Sender::new(0),
        };
        (h, Events(rx))
    }

    /// Changes when a revoke starts: the groups ingest lets linger before the changelog has
    /// them, which the revoke waits for, are written at once then.
    pub fn revokes(&self) -> watch::Receiver<u64> {
        self.revokes.subscribe()
    }

    /// From now on a revoke keeps the local state (the process is stopping).
    pub fn stopping(&self) {
        self.stopping.store(true, Ordering::Relaxed);
    }

    /// A delete after delivery is about to write tombstones, or an ingest group its entries
    /// ([`Handoff::paid`] when handed to the producer, or acknowledged): a revoke waits for
    /// them.
    pub fn owe(&self) {
        self.owed.fetch_add(1, Ordering::AcqRel);
    }

    /// See [`Handoff::owe`].
    pub fn paid(&self) {
        self.owed.fetch_sub(1, Ordering::AcqRel);
    }

    /// [`Handoff::owe`] now, [`Handoff::paid`] when the guard is dropped.
    pub fn owing(self: &Arc<Self>) -> Owing {
        self.owe();
        Owing(self.clone())
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
        let m = &self.moving;
        let mut parts = Vec::new();
        for e in tpl.elements() {
            if m.changelog.is_changelog(e.topic()) {
                error!(topic = e.topic(), partition = e.partition(),
                       "--source-pattern matches a changelog topic; it stays paused (narrow the pattern)");
                continue;
            }
            let pid = match m.store.partition_id(e.topic(), e.partition()) {
                Ok(pid) => pid,
                Err(err) => {
                    error!(topic = e.topic(), partition = e.partition(), error = %err,
                           "cannot register a source partition; it stays paused");
                    continue;
                }
            };
            let cancelled = Arc::new(AtomicBool::new(false));
            m.restoring().insert(pid, cancelled.clone());
            parts.push(Part {
                pid,
                topic: e.topic().to_owned(),
                partition: e.partition(),
                cancelled,
            });
        }
        // A standby pass under way stops (at its next chunk); the next pass goes on from where
        // it stopped.
        m.stop_catching_up();
        m.count_restoring();
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
            .moving
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
    /// changelog writes they owe, then hands them to the restore task (which keeps their state
    /// for a while, then drops it).
    pub fn on_revoke(&self, tpl: &TopicPartitionList) {
        let m = &self.moving;
        let pids: Vec<Pid> = tpl
            .elements()
            .iter()
            .filter_map(|e| m.store.lookup_partition(e.topic(), e.partition()))
            .collect();
        for pid in &pids {
            if let Some(flag) = m.restoring().remove(pid) {
                flag.store(true, Ordering::Relaxed);
            }
            m.store.disown(*pid);
        }
        m.count_restoring();
        self.revokes.send_modify(|n| *n += 1);
        let wait = m.config.cluster.handoff_wait;
        let started = Instant::now();
        let settled = || {
            pids.iter().all(|p| m.store.claimed_in(*p) == 0)
                && self.owed.load(Ordering::Acquire) == 0
        };
        blocking(|| {
            while !settled() && started.elapsed() < wait {
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        let in_flight: usize = pids.iter().map(|p| m.store.claimed_in(*p)).sum();
        let flushed = blocking(|| m.changelog.flush(wait.saturating_sub(started.elapsed())));
        m.metrics.broker.handoff_unsettled.inc_by(in_flight as u64);
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
        self.moving.config.cluster.standby_replicas > 0
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;
    use crate::changelog::Changelog;
    use crate::config::RunArgs;
    use crate::metrics::Metrics;
    use crate::store::{Store, StoreOptions};

    /// A handoff over a real store; its changelog producer never connects (nothing is written).
    fn handoff(dir: &std::path::Path) -> Arc<Handoff> {
        let run = RunArgs::try_parse_flags(["--brokers", "127.0.0.1:9", "--changelog"])
            .expect("flags parse");
        let config = Arc::new(run.validate().expect("valid"));
        let store = Arc::new(Store::open(dir, StoreOptions::default()).expect("store"));
        let changelog = Changelog::new(&config, Arc::default()).expect("producer");
        let metrics = Metrics::new(&prometheus::Registry::new(), &Default::default()).unwrap();
        let moving = Moving::new(store, changelog, config, metrics);
        Arc::new(Handoff::new(moving).0)
    }

    /// Revokes partition `delay.a`/0 on a thread of its own: the receiver hears when it ends.
    fn revoke(h: &Arc<Handoff>) -> mpsc::Receiver<()> {
        let (done, revoked) = mpsc::channel();
        let revoking = h.clone();
        std::thread::spawn(move || {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition("delay.a", 0);
            revoking.on_revoke(&tpl);
            let _ = done.send(());
        });
        revoked
    }

    #[test]
    fn a_revoke_waits_for_the_changelog_writes_owed_until_they_are_paid() {
        let dir = tempfile::tempdir().unwrap();
        let h = handoff(dir.path());
        // An ingest group waiting for the changelog's acknowledgement (`Durable::in_flight`).
        let owing = h.owing();
        let revoked = revoke(&h);
        assert!(
            revoked.recv_timeout(Duration::from_millis(500)).is_err(),
            "the partition was let go while a group still owed its changelog writes"
        );
        drop(owing);
        revoked
            .recv_timeout(Duration::from_secs(5))
            .expect("the revoke ends once the group is acknowledged");
    }

    #[test]
    fn a_revoke_tells_the_lingering_groups_it_waits_for_to_be_written_now() {
        let dir = tempfile::tempdir().unwrap();
        let h = handoff(dir.path());
        // A group lingering before the changelog has it (`Durable::linger`).
        let revokes = h.revokes();
        let owing = h.owing();
        let revoked = revoke(&h);
        let asked = Instant::now();
        while !revokes.has_changed().unwrap() {
            assert!(
                asked.elapsed() < Duration::from_secs(2),
                "the revoke waits for a lingering group without telling it"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(owing);
        revoked
            .recv_timeout(Duration::from_secs(5))
            .expect("the revoke ends once the group is written");
    }
}
