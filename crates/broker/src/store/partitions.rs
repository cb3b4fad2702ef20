//! Source partitions: each gets a dense id ([`Pid`]) on first sight, kept in the `meta`
//! column, and its next offset to ingest is kept in the `offsets` column.

use std::collections::HashMap;

use rocksdb::WriteOptions;

use super::codec::{MetaKey, NextOffset, PidKey};
use super::column::{Meta, Offsets};
use super::{io, Result, Store, StoreError};
use kafka_delay_core::id::Pid;

/// The source partitions seen, by name and by id.
#[derive(Debug, Default)]
pub(super) struct Partitions {
    by_name: HashMap<(String, i32), Pid>,
    pub(super) by_pid: Vec<(String, i32)>,
}

impl Store {
    pub(super) fn load_partitions(&self) -> Result<()> {
        let mut parts = self.partitions.write().unwrap_or_else(|e| e.into_inner());
        let mut found: Vec<(Pid, String, i32)> = Vec::new();
        let corrupt = |detail: &str| StoreError::Corrupt {
            what: "meta",
            detail: detail.to_owned(),
        };
        for item in self
            .db
            .prefix_iterator_cf(self.cf::<Meta>(), MetaKey::PARTITIONS)
        {
            let (k, v) = item.map_err(io("meta scan"))?;
            if !k.starts_with(MetaKey::PARTITIONS) {
                break;
            }
            let (topic, partition) =
                MetaKey::split_partition(&k).ok_or_else(|| corrupt("bad partition key"))?;
            let pid = PidKey::split(&v).ok_or_else(|| corrupt("bad partition id"))?;
            found.push((pid, topic, partition));
        }
        found.sort();
        for (i, (pid, topic, partition)) in found.into_iter().enumerate() {
            if usize::from(pid) != i {
                return Err(corrupt(&format!("partition ids are not dense at {pid}")));
            }
            parts.by_name.insert((topic.clone(), partition), pid);
            parts.by_pid.push((topic, partition));
        }
        Ok(())
    }

    /// The id of a source partition, allocated (durably) on first sight.
    ///
    /// # Errors
    /// [`StoreError::TooManyPartitions`] past 65,536 partitions, or a write failure.
    pub fn partition_id(&self, topic: &str, partition: i32) -> Result<Pid> {
        if let Some(pid) = self.lookup_partition(topic, partition) {
            return Ok(pid);
        }
        let name = (topic.to_owned(), partition);
        let mut parts = self.partitions.write().unwrap_or_else(|e| e.into_inner());
        if let Some(pid) = parts.by_name.get(&name) {
            return Ok(*pid);
        }
        let pid = Pid::try_from(parts.by_pid.len()).map_err(|_| StoreError::TooManyPartitions {
            topic: topic.to_owned(),
            partition,
        })?;
        let mut opts = WriteOptions::default();
        opts.set_sync(true);
        self.db
            .put_cf_opt(
                self.cf::<Meta>(),
                MetaKey::partition(topic, partition),
                PidKey::new(pid),
                &opts,
            )
            .map_err(io("meta write"))?;
        parts.by_name.insert(name.clone(), pid);
        parts.by_pid.push(name);
        Ok(pid)
    }

    /// The (topic, partition) of a partition id.
    pub fn partition_of(&self, pid: Pid) -> Option<(String, i32)> {
        self.with_partition(pid, |topic, partition| (topic.to_owned(), partition))
    }

    /// `f(topic, partition)` of a partition id, with the topic read in place (no copy).
    pub fn with_partition<R>(&self, pid: Pid, f: impl FnOnce(&str, i32) -> R) -> Option<R> {
        let parts = self.partitions.read().unwrap_or_else(|e| e.into_inner());
        let (topic, partition) = parts.by_pid.get(usize::from(pid))?;
        Some(f(topic, *partition))
    }

    /// The id of a source partition already seen, without allocating one.
    pub fn lookup_partition(&self, topic: &str, partition: i32) -> Option<Pid> {
        self.partitions
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .by_name
            .get(&(topic.to_owned(), partition))
            .copied()
    }

    /// How many source partitions have an id.
    pub(super) fn partition_count(&self) -> usize {
        self.partitions
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .by_pid
            .len()
    }

    /// The next offset to ingest of one source partition, if one is stored.
    ///
    /// # Errors
    /// A read failure or a corrupt entry.
    pub fn next_offset(&self, pid: Pid) -> Result<Option<i64>> {
        let Some(v) = self.get_pinned::<Offsets>(&PidKey::new(pid), "offset read")? else {
            return Ok(None);
        };
        NextOffset::split(&v)
            .map(Some)
            .ok_or_else(|| StoreError::Corrupt {
                what: "offsets",
                detail: "value is not 8 bytes".into(),
            })
    }

    /// The next offset to ingest for each source partition that has one stored.
    ///
    /// # Errors
    /// A read failure or a corrupt entry.
    pub fn next_offsets(&self) -> Result<HashMap<Pid, i64>> {
        let mut out = HashMap::new();
        for item in self
            .db
            .iterator_cf(self.cf::<Offsets>(), rocksdb::IteratorMode::Start)
        {
            let (k, v) = item.map_err(io("offsets scan"))?;
            let (Some(pid), Some(off)) = (PidKey::split(&k), NextOffset::split(&v)) else {
                return Err(StoreError::Corrupt {
                    what: "offsets",
                    detail: "bad key or value length".into(),
                });
            };
            out.insert(pid, off);
        }
        Ok(out)
    }
}
