//! Which records' values the changelog copies and which it points at in their source topic.
//!
//! A record's changelog entry is a pointer ([`Entry::Pointer`]) when its source topic keeps the
//! record until `--changelog-copy-margin` after it is due: `cleanup.policy=delete`, no
//! `retention.bytes`, and a `retention.ms` that outlasts the due time from the record's own
//! timestamp ([`Retention::keeps`]). Otherwise, and for a topic whose configuration is not
//! known yet, the value is copied. [`watch`] reads the configuration of the source topics owned
//! here, and when a topic's retention gets shorter it writes every pending record of the topic
//! to the changelog again with its value, so that no pointer outlives its record.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::Changelog;
use crate::config::{Config, ValueCopy};
use crate::kafka::base_config;
use crate::store::Store;
use kafka_delay_core::changelog::{Entry, Retention};
use kafka_delay_core::id::{Pid, RecordId};
use kafka_delay_core::record::StoredRecord;

/// Values shorter than this are copied: a pointer would save little and cost the restore a
/// read of the source.
const MIN_POINTED: usize = 64;
/// How often the configuration of every source topic owned here is read again.
const RECHECK: Duration = Duration::from_secs(30);
/// How often the watcher looks for owned topics it has no configuration of.
const TICK: Duration = Duration::from_secs(1);
/// How long after a topic's retention got shorter its records are written again: ingest groups
/// that chose pointers under the old retention have reached the changelog by then.
const SETTLE: Duration = Duration::from_secs(2);
/// Records written again per changelog write.
const CHUNK: usize = 4_096;

/// The source topics' retention as last read, and how values are chosen.
#[derive(Debug)]
pub struct Values {
    copy: ValueCopy,
    known: RwLock<HashMap<String, Retention>>,
}

impl Values {
    /// No topic known yet: every value is copied until [`watch`] reads the topics.
    pub fn new(copy: ValueCopy) -> Self {
        Self {
            copy,
            known: RwLock::new(HashMap::new()),
        }
    }

    /// The entry of `record`, at `offset` of source topic `topic`, with the source record's
    /// timestamp: a pointer where the topic keeps the record long enough, its value otherwise.
    pub fn entry<'a>(
        &self,
        topic: &str,
        offset: i64,
        record: &'a StoredRecord,
        timestamp_ms: Option<u64>,
    ) -> Entry<'a> {
        let ValueCopy::Unless(margin) = self.copy else {
            return Entry::Record(offset, record);
        };
        let until = record
            .due_ms()
            .saturating_add(u64::try_from(margin.as_millis()).unwrap_or(u64::MAX));
        let kept = timestamp_ms.is_some_and(|t| {
            self.known
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .get(topic)
                .is_some_and(|r| r.keeps(t, until))
        });
        if kept && record.value().is_some_and(|v| v.len() >= MIN_POINTED) {
            Entry::Pointer(offset, record)
        } else {
            Entry::Record(offset, record)
        }
    }

    /// Which of `topics` have no known configuration.
    fn unknown<'t>(&self, topics: &'t BTreeSet<String>) -> Vec<&'t str> {
        let known = self
            .known
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        topics
            .iter()
            .filter(|t| !known.contains_key(*t))
            .map(String::as_str)
            .collect()
    }

    /// Takes what a read of the topics' configuration found; returns the topics whose
    /// retention got shorter (their pointers may outlive their records).
    pub fn learn(&self, read: HashMap<String, Retention>) -> Vec<String> {
        let mut known = self
            .known
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut shorter = Vec::new();
        for (topic, now) in read {
            match known.insert(topic.clone(), now) {
                Some(before) if now.shorter_than(&before) => {
                    info!(%topic, ?before, ?now, "source topic keeps its records for less time: \
                          its pending records' values are copied to the changelog");
                    shorter.push(topic);
                }
                None => debug!(%topic, retention = ?now, "source topic's retention read"),
                _ => {}
            }
        }
        shorter
    }

    /// Drops what is known of `topic`: its values are copied until it is read again.
    fn forget(&self, topic: &str) {
        self.known
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(topic);
    }

    /// Whether values are ever pointed at.
    fn points(&self) -> bool {
        matches!(self.copy, ValueCopy::Unless(_))
    }
}

/// Reads the retention of the source topics owned here until `stop`: a topic newly owned within
/// a second, every topic every 30 s; a topic whose retention got shorter has its pending
/// records written again with their values.
pub async fn watch(
    values: Arc<Values>,
    (store, changelog): (Arc<Store>, Changelog),
    config: Arc<Config>,
    mut stop: watch::Receiver<bool>,
) {
    if !values.points() {
        return;
    }
    let admin: AdminClient<DefaultClientContext> = match base_config(&config).create() {
        Ok(a) => a,
        Err(e) => {
            warn!(error = %e, "cannot create the admin client that reads the source topics' \
                  retention: every value is copied to the changelog");
            return;
        }
    };
    let mut checked = Instant::now() - RECHECK;
    loop {
        let owned: BTreeSet<String> = store
            .owned_pids()
            .into_iter()
            .filter_map(|pid| store.partition_of(pid).map(|(t, _)| t))
            .collect();
        let due = checked.elapsed() >= RECHECK;
        let topics: Vec<&str> = if due {
            owned.iter().map(String::as_str).collect()
        } else {
            values.unknown(&owned)
        };
        if !topics.is_empty() {
            if due {
                checked = Instant::now();
            }
            match describe(&admin, &topics).await {
                Ok(read) => {
                    for topic in values.learn(read) {
                        tokio::time::sleep(SETTLE).await;
                        if let Err(e) = copy_values(&store, &changelog, &topic).await {
                            warn!(%topic, error = %e, "cannot copy the pending values of a \
                                  topic whose retention got shorter; trying again");
                            checked = Instant::now() - RECHECK;
                            values.forget(&topic);
                        }
                    }
                }
                Err(e) => debug!(error = %e, "cannot read the source topics' retention"),
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(TICK) => {}
            _ = stop.changed() => return,
        }
    }
}

/// Reads the retention of those of `topics` not known yet, blocking: a restore calls it before
/// the partitions it restores are consumed, so that their first records are pointed at too. A
/// failure leaves them to [`watch`] (their values are copied meanwhile).
pub fn learn_now(config: &Config, values: &Values, topics: &BTreeSet<String>) {
    let unknown = values.unknown(topics);
    if !values.points() || unknown.is_empty() {
        return;
    }
    let read = base_config(config)
        .create::<AdminClient<DefaultClientContext>>()
        .map_err(|e| e.to_string())
        .and_then(|admin| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?
                .block_on(describe(&admin, &unknown))
        });
    match read {
        Ok(read) => {
            values.learn(read);
        }
        Err(e) => debug!(error = %e, "cannot read the source topics' retention yet"),
    }
}

/// The retention of `topics`, as their effective configuration says (a topic that cannot be
/// described is left out: its values are copied).
async fn describe(
    admin: &AdminClient<DefaultClientContext>,
    topics: &[&str],
) -> Result<HashMap<String, Retention>, String> {
    let specs: Vec<ResourceSpecifier<'_>> =
        topics.iter().map(|t| ResourceSpecifier::Topic(t)).collect();
    let opts = AdminOptions::new().request_timeout(Some(Duration::from_secs(10)));
    let described = admin
        .describe_configs(specs.iter(), &opts)
        .await
        .map_err(|e| e.to_string())?;
    let mut out = HashMap::new();
    for (topic, resource) in topics.iter().zip(described) {
        let resource = match resource {
            Ok(r) => r,
            Err(e) => {
                debug!(%topic, error = %e, "cannot read a source topic's retention");
                continue;
            }
        };
        let value = |name: &str| resource.get(name).and_then(|e| e.value.clone());
        let number = |name: &str| value(name).and_then(|v| v.parse::<i64>().ok());
        let (Some(policy), Some(ms), Some(bytes)) = (
            value("cleanup.policy"),
            number("retention.ms"),
            number("retention.bytes"),
        ) else {
            debug!(%topic, "a source topic's retention settings are not described");
            continue;
        };
        out.insert(
            (*topic).to_owned(),
            Retention::from_config(&policy, ms, bytes),
        );
    }
    Ok(out)
}

/// Writes every pending record of `topic`'s partitions owned here to the changelog with its
/// value, then a tombstone for each that fired meanwhile (its own tombstone may have gone
/// first).
async fn copy_values(store: &Arc<Store>, changelog: &Changelog, topic: &str) -> Result<(), String> {
    let pids: Vec<Pid> = store
        .owned_pids()
        .into_iter()
        .filter(|&pid| store.partition_of(pid).is_some_and(|(t, _)| t == topic))
        .collect();
    let mut copied: Vec<(Pid, i32, Vec<RecordId>)> = Vec::new();
    for pid in pids {
        let Some((_, partition)) = store.partition_of(pid) else {
            continue;
        };
        let s = store.clone();
        let ids: Vec<RecordId> =
            tokio::task::spawn_blocking(move || s.due_of_partition(pid, u64::MAX))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?
                .into_iter()
                .map(|(_, id)| id)
                .collect();
        let mut written = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(CHUNK) {
            if !store.owns(pid) {
                break; // revoked meanwhile: its new owner restored what the changelog holds
            }
            let records = store.get(chunk).map_err(|e| e.to_string())?;
            let entries: Vec<Entry<'_>> = chunk
                .iter()
                .zip(&records)
                .filter_map(|(id, r)| r.as_ref().map(|r| Entry::Record(id.offset(), r)))
                .collect();
            changelog
                .write(topic, partition, &entries)
                .await
                .map_err(|e| e.to_string())?;
            written.extend(
                chunk
                    .iter()
                    .zip(&records)
                    .filter(|(_, r)| r.is_some())
                    .map(|(id, _)| *id),
            );
        }
        copied.push((pid, partition, written));
    }
    // A record firing meanwhile may have written its tombstone before its copy (with
    // --exactly-once its transaction commits before the store forgets it): once such a firing
    // is over, a record the store no longer holds gets its tombstone again.
    tokio::time::sleep(SETTLE).await;
    let mut records = 0;
    for (pid, partition, written) in copied {
        records += written.len();
        for chunk in written.chunks(CHUNK) {
            let now = store.get(chunk).map_err(|e| e.to_string())?;
            if !store.owns(pid) {
                break; // what the store no longer holds may have left with the partition
            }
            let gone: Vec<Entry<'_>> = chunk
                .iter()
                .zip(&now)
                .filter(|(_, r)| r.is_none())
                .map(|(id, _)| Entry::Gone(id.offset()))
                .collect();
            if !gone.is_empty() {
                changelog
                    .write(topic, partition, &gone)
                    .await
                    .map_err(|e| e.to_string())?;
            }
        }
    }
    info!(%topic, records, "pending values copied to the changelog");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(value: usize) -> StoredRecord {
        StoredRecord::new(10_000, "out", None, None, Some(&vec![1u8; value]), [])
    }

    #[test]
    fn a_value_is_pointed_at_only_where_its_topic_is_known_to_keep_it_past_the_margin() {
        let v = Values::new(ValueCopy::Unless(Duration::from_secs(1)));
        let r = record(100);
        // Unknown topic: copied.
        assert!(matches!(v.entry("t", 1, &r, Some(0)), Entry::Record(..)));
        let week = 7 * 86_400_000;
        assert!(v
            .learn(HashMap::from([(
                "t".into(),
                Retention::from_config("delete", week, -1)
            )]))
            .is_empty());
        assert!(matches!(v.entry("t", 1, &r, Some(0)), Entry::Pointer(1, _)));
        // No timestamp, a small value, a record due past the retention: copied.
        assert!(matches!(v.entry("t", 1, &r, None), Entry::Record(..)));
        assert!(matches!(
            v.entry("t", 1, &record(10), Some(0)),
            Entry::Record(..)
        ));
        let far = StoredRecord::new(week as u64, "out", None, None, Some(&[1u8; 100]), []);
        assert!(matches!(v.entry("t", 1, &far, Some(0)), Entry::Record(..)));
        // Retention shortened: named, and values copied from then on.
        assert_eq!(
            v.learn(HashMap::from([(
                "t".into(),
                Retention::from_config("delete", 5_000, -1)
            )])),
            vec!["t".to_string()]
        );
        assert!(matches!(v.entry("t", 1, &r, Some(0)), Entry::Record(..)));
        // --changelog-copy-values copies everything.
        let all = Values::new(ValueCopy::All);
        all.learn(HashMap::from([(
            "t".into(),
            Retention::from_config("delete", -1, -1),
        )]));
        assert!(matches!(all.entry("t", 1, &r, Some(0)), Entry::Record(..)));
    }
}
