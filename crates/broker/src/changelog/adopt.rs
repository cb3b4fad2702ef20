//! A data directory written without the changelog (`--no-changelog`, or an earlier version's
//! default), taken into the changelog on the first start with it: before the instance joins
//! its group, each partition's pending records and source offset are written to its changelog
//! partition and checkpointed, so the restore that follows the assignment keeps them (local
//! state without a checkpoint is state the restore cannot trust, and drops).

use std::time::Duration;

use rdkafka::producer::Producer;
use thiserror::Error;
use tracing::{info, warn};

use super::Changelog;
use crate::kafka::partitions_of;
use crate::store::{Store, StoreError};
use kafka_delay_core::changelog::{Checkpoint, Entry};
use kafka_delay_core::id::Pid;

/// Records written to the changelog in one go.
const CHUNK: usize = 4_096;

/// Why a data directory could not be taken into the changelog.
#[derive(Debug, Error)]
pub enum AdoptError {
    /// The store could not be read or its checkpoint written.
    #[error("taking the data directory into the changelog: {0}")]
    Store(#[from] StoreError),
    /// Kafka did not take the entries.
    #[error("taking the data directory into the changelog: writing {topic}/{partition}: {detail}")]
    Kafka {
        /// The changelog topic.
        topic: String,
        /// Its partition.
        partition: i32,
        /// What failed.
        detail: String,
    },
    /// The changelog partition has entries of its own already: two copies of one partition's
    /// state, and no way to tell which is right.
    #[error("the data directory holds {records} pending records of {source_topic}/{partition} written without the changelog, and its changelog partition ({topic}) already has entries, written by another instance: keep this instance on --no-changelog (and alone in its group) until it has fired them, or move the data directory aside if the changelog is the copy to keep")]
    Conflict {
        /// The source topic.
        source_topic: String,
        /// The partition.
        partition: i32,
        /// The changelog topic.
        topic: String,
        /// Pending records of the partition here.
        records: usize,
    },
}

/// Writes every partition of `store` that has state but no checkpoint (it was written without
/// the changelog) to its changelog partition, then checkpoints it there. Returns the records
/// written. Blocking; to run before the ingest consumer joins its group.
///
/// # Errors
/// An [`AdoptError`]; what was written of a partition before it is rewritten by a second try
/// (entries are idempotent) and nothing is checkpointed for it.
pub fn adopt(store: &Store, changelog: &Changelog, wait: Duration) -> Result<u64, AdoptError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| AdoptError::Kafka {
            topic: String::new(),
            partition: -1,
            detail: e.to_string(),
        })?;
    let mut written = 0u64;
    for pid in store.partitions_with_state() {
        if store.checkpoint(pid)?.is_none() {
            written += partition(store, changelog, pid, (&runtime, wait))?;
        }
    }
    if written > 0 {
        changelog.flush(wait).map_err(|e| AdoptError::Kafka {
            topic: String::new(),
            partition: -1,
            detail: e.to_string(),
        })?;
    }
    Ok(written)
}

/// [`adopt`] of partition `pid`: its records and source offset written to its changelog
/// partition, then its checkpoint. Returns the records written.
fn partition(
    store: &Store,
    changelog: &Changelog,
    pid: Pid,
    (runtime, wait): (&tokio::runtime::Runtime, Duration),
) -> Result<u64, AdoptError> {
    let Some((source, partition)) = store.partition_of(pid) else {
        return Ok(0);
    };
    let ids: Vec<_> = store
        .due_of_partition(pid, u64::MAX)?
        .into_iter()
        .map(|(_, id)| id)
        .collect();
    let source_next = store.next_offset(pid)?;
    if ids.is_empty() && source_next.is_none() {
        return Ok(0);
    }
    let topic = changelog.topic_of(&source);
    let kafka = |detail: String| AdoptError::Kafka {
        topic: topic.clone(),
        partition,
        detail,
    };
    let client = changelog.producer().client();
    if partitions_of(client, &topic)
        .map_err(|e| kafka(e.to_string()))?
        .is_empty()
    {
        warn!(%source, partition, records = ids.len(), %topic,
              "no changelog topic for these records (their source topic is gone?): left as they are");
        return Ok(0);
    }
    let (low, high) = client
        .fetch_watermarks(&topic, partition, wait)
        .map_err(|e| kafka(e.to_string()))?;
    if high > low {
        return Err(AdoptError::Conflict {
            source_topic: source,
            partition,
            topic,
            records: ids.len(),
        });
    }
    let mut next = high;
    for chunk in ids.chunks(CHUNK) {
        let records = store.get(chunk)?;
        let entries: Vec<Entry<'_>> = chunk
            .iter()
            .zip(&records)
            .filter_map(|(id, r)| r.as_ref().map(|r| Entry::Record(id.offset(), r)))
            .collect();
        next = runtime
            .block_on(changelog.write(&source, partition, &entries))
            .map_err(|e| kafka(e.to_string()))?
            .max(next);
    }
    if let Some(offset) = source_next {
        next = runtime
            .block_on(changelog.write(&source, partition, &[Entry::SourceOffset(offset)]))
            .map_err(|e| kafka(e.to_string()))?
            .max(next);
    }
    store.set_checkpoint(
        pid,
        Checkpoint {
            changelog_next: next,
            source_next,
        },
    )?;
    info!(%source, partition, records = ids.len(), ?source_next, changelog_next = next,
          "records written without the changelog taken into it");
    Ok(ids.len() as u64)
}
