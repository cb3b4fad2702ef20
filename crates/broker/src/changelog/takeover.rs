//! The restore task: assigned partitions restored from their changelog and made to fire here,
//! revoked ones dropped, in the order the rebalance callback saw them.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{Consumer, ConsumerContext, StreamConsumer};
use rdkafka::{Offset, TopicPartitionList};
use tracing::{error, info, warn};

use super::handoff::{lock, Event, Events, Handoff};
use super::restore::{self, Outcome, Part};
use super::{topics, GroupError};
use crate::backoff::Backoff;
use crate::scheduler::{Inserts, Wake};
use kafka_delay_core::id::Pid;

impl Handoff {
    /// The restore task: restores what is assigned, drops what was revoked, in the order the
    /// callback saw them.
    pub async fn run<C>(
        self: Arc<Self>,
        mut events: Events,
        consumer: Arc<StreamConsumer<C>>,
        scheduler: Inserts,
        (horizon_ms, clock): (u64, Arc<dyn kafka_delay_core::clock::Clock>),
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
                topics::ensure(&config, source, &changelog.topic_of(source), replication)?;
            }
            let parts = parts
                .into_iter()
                .map(|p| Part {
                    topic: changelog.topic_of(&p.topic),
                    ..p
                })
                .collect();
            Ok(restore::restore(
                &config,
                &store,
                parts,
                Duration::from_secs(10),
                Some(&remaining),
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
        self.metrics.broker.restored_entries.inc_by(outcome.entries);
        if self.lock_restoring().remove(&part.pid).is_none() {
            return; // revoked meanwhile
        }
        self.count_restoring();
        let pid = part.pid;
        if let Some(hook) = &self.on_restored {
            (hook.0)(pid, outcome.source_next).await;
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
                lock(&self.resumes).insert(pid, next);
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
