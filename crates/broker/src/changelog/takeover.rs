//! The restore task: assigned partitions restored from their changelog and made to fire here,
//! revoked ones kept for a while ([`super::kept`]) then dropped, in the order the rebalance
//! callback saw them.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{Consumer, ConsumerContext, StreamConsumer};
use rdkafka::{Offset, TopicPartitionList};
use tracing::{error, info, warn};

use super::handoff::{Event, Events};
use super::kept::Kept;
use super::moving::{lock, Moving};
use super::restore::{self, Outcome, Part};
use super::{topics, GroupError};
use crate::backoff::Backoff;
use crate::scheduler::{Inserts, Wake};
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

/// Where ingest resumes each partition handed to this instance: set by the restore task before
/// the partition is resumed, taken by ingest before its next group.
#[derive(Debug, Default)]
pub struct Resumes(Mutex<HashMap<Pid, i64>>);

impl Resumes {
    /// Where ingest resumes the partitions handed over since the last call.
    pub fn take(&self) -> HashMap<Pid, i64> {
        std::mem::take(&mut *lock(&self.0))
    }
}

/// The restore task's side of partitions changing owner.
#[derive(Debug)]
pub struct Takeover {
    moving: Arc<Moving>,
    events: Events,
    resumes: Arc<Resumes>,
    /// Run once a partition is restored, before it fires here.
    on_restored: Option<OnRestored>,
    /// The source topics whose changelog has been checked, with the partitions it was
    /// checked for.
    ensured: Arc<Mutex<HashMap<String, usize>>>,
}

impl Takeover {
    /// The task that acts on `events`, telling ingest through `resumes` where each partition
    /// it takes over resumes.
    pub fn new(
        moving: Arc<Moving>,
        events: Events,
        resumes: Arc<Resumes>,
        on_restored: Option<OnRestored>,
    ) -> Self {
        Self {
            moving,
            events,
            resumes,
            on_restored,
            ensured: Arc::default(),
        }
    }

    /// The restore task: restores what is assigned, keeps what was revoked for a while, in the
    /// order the callback saw them, and drops what stayed away too long.
    pub async fn run<C>(
        mut self,
        consumer: Arc<StreamConsumer<C>>,
        scheduler: Inserts,
        (horizon_ms, clock): (u64, Arc<dyn kafka_delay_core::clock::Clock>),
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) where
        C: ConsumerContext + 'static,
    {
        let mut kept = Kept::default();
        loop {
            let expiry = kept.next_expiry();
            let stopped = async { stop.wait_for(|s| *s).await.is_ok() };
            let event = tokio::select! {
                _ = stopped => return, // lets go of the consumer, so it can close
                () = until_expiry(expiry) => {
                    self.drop_expired(&mut kept).await;
                    continue;
                }
                e = self.events.0.recv() => e,
            };
            match event {
                None => return,
                Some(Event::Revoked(pids)) => self.keep(&mut kept, pids).await,
                Some(Event::Assigned(parts)) => {
                    parts.iter().for_each(|p| kept.assigned(p.pid));
                    kept.settled(Instant::now());
                    self.show(&kept);
                    let until = clock.now_ms().saturating_add(horizon_ms);
                    self.take_over(parts, &consumer, &scheduler, until).await;
                }
            }
        }
    }

    /// Keeps the state of the revoked `pids` (those neither owned nor being restored here
    /// again), counted as copies so that this instance's pending leaves them out.
    async fn keep(&self, kept: &mut Kept, pids: Vec<Pid>) {
        let m = self.moving.clone();
        let counted = tokio::task::spawn_blocking(move || {
            let away = |p: &Pid| !m.store.owns(*p) && !m.restoring().contains_key(p);
            let away: Vec<Pid> = pids.into_iter().filter(away).collect();
            away.into_iter()
                .map(|p| (p, m.store.count_copy(p).unwrap_or(0)))
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        let now = Instant::now();
        for (pid, records) in counted {
            kept.revoked(pid, records, now);
        }
        self.show(kept);
    }

    /// Drops the state of the kept partitions whose time is up.
    async fn drop_expired(&self, kept: &mut Kept) {
        let gone = kept.expired(Instant::now());
        let m = self.moving.clone();
        let _ = tokio::task::spawn_blocking(move || m.drop_owned_elsewhere(gone)).await;
        self.show(kept);
    }

    /// The kept partitions in the copies' gauges (standby copies, when there are any, are
    /// counted by their pass instead).
    fn show(&self, kept: &Kept) {
        let m = &self.moving;
        if m.config.cluster.standby_replicas == 0 {
            let (partitions, records) = kept.totals();
            m.metrics.broker.partitions_standby.set(partitions as i64);
            m.metrics.broker.standby_records.set(records as i64);
        }
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
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
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
                    backoff.wait().await;
                }
            }
        }
    }

    async fn restore(&self, parts: Vec<Part>) -> Result<HashMap<Pid, Outcome>, GroupError> {
        let (m, ensured) = (self.moving.clone(), self.ensured.clone());
        tokio::task::spawn_blocking(move || {
            let (store, config, changelog) = (&m.store, &m.config, &m.changelog);
            let _turn = m.writer_turn();
            let replication = config.cluster.changelog_replication;
            let sources: HashSet<&str> = parts.iter().map(|p| p.topic.as_str()).collect();
            for source in &sources {
                // A changelog checked once for a source's partitions is not checked again for
                // them: each check is a new admin client and four requests, a good part of a
                // takeover's time.
                let highest = parts
                    .iter()
                    .filter(|p| p.topic == *source)
                    .map(|p| p.partition);
                let highest = highest.max().unwrap_or(0);
                let known = lock(&ensured).get(*source).copied();
                if known.is_none_or(|n| usize::try_from(highest).is_ok_and(|h| h >= n)) {
                    let n =
                        topics::ensure(config, source, &changelog.topic_of(source), replication)?;
                    lock(&ensured).insert((*source).to_owned(), n);
                }
            }
            let sources = sources.into_iter().map(str::to_owned).collect();
            super::values::learn_now(config, changelog.values(), &sources);
            let parts = parts
                .into_iter()
                .map(|p| Part {
                    topic: changelog.topic_of(&p.topic),
                    ..p
                })
                .collect();
            Ok(restore::restore(
                config,
                store,
                parts,
                Duration::from_secs(10),
                Some(&m.metrics.broker),
            )?)
        })
        .await
        .map_err(|e| GroupError::Task {
            what: "restore",
            detail: e.to_string(),
        })?
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
        let m = &self.moving;
        m.metrics.broker.restored_entries.inc_by(outcome.entries);
        // Nothing fires here before an acknowledgement said what the cluster's clock reads.
        // Asked while the partition is still restoring: one neither restoring nor owned here
        // has its local state dropped as owned elsewhere.
        if let Err(e) = m.changelog.probe(&part.topic, part.partition).await {
            warn!(topic = %part.topic, partition = part.partition, error = %e,
                  "the changelog did not answer a probe of the cluster's clock; firing by this instance's clock");
        }
        if m.restoring().remove(&part.pid).is_none() {
            return; // revoked meanwhile
        }
        m.count_restoring();
        let pid = part.pid;
        if let Some(hook) = &self.on_restored {
            (hook.0)(pid, outcome.source_next).await;
        }
        m.store.own(pid);
        let store = m.store.clone();
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
                lock(&self.resumes.0).insert(pid, next);
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
              pending = m.store.pending(), ms = started.elapsed().as_millis() as u64,
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
        let latest = self.moving.config.kafka.properties.iter().any(|p| {
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

/// Waits until `at`, or for ever when there is nothing to wait for.
async fn until_expiry(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}
