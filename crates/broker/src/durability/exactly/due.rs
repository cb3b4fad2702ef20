//! Records already due when they are ingested, in the exactly-once mode: each fires in the
//! transaction that commits its ingest group, its target record beside the group's changelog
//! entries and source offsets. It costs Kafka one record, where a record that waits costs
//! three (its changelog entry, then its target record and its tombstone in a second
//! transaction), and it is never stored here: the transaction that publishes it is the one
//! that consumes it, so a crash before the commit leaves nothing visible and the record is
//! consumed again, and after it nothing is left to fire.
//!
//! A record its target refuses (an unknown topic, a record too large, a topic the authorizer
//! refuses) is stored after all and fires through the wheel, where a failure is retried and
//! dead-lettered as for any record. With fire limits set, nothing fires at ingest (every
//! record passes the limiter).

use std::collections::HashSet;
use std::sync::Arc;

use crate::ingest::Last;
use crate::metrics::Metrics;
use crate::publish::history::History;
use crate::publish::{observe_delivery, provenance};
use crate::store::{Applied, IngestOp, Store};
use crate::txn::Out;
use kafka_delay_core::clock::Clock;
use kafka_delay_core::id::RecordId;
use kafka_delay_core::record::StoredRecord;

/// What firing at ingest needs: whether it is on, and where a fire is counted.
#[derive(Clone)]
pub(in crate::durability) struct AtIngest {
    /// Off with fire limits.
    pub(in crate::durability) on: bool,
    pub(in crate::durability) clock: Arc<dyn Clock>,
    pub(in crate::durability) metrics: Metrics,
    pub(in crate::durability) history: History,
}

impl std::fmt::Debug for AtIngest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AtIngest")
            .field("on", &self.on)
            .finish_non_exhaustive()
    }
}

/// A group's records that fire with it: the ones its target refused are stored after all.
#[derive(Debug, Default)]
pub(super) struct Firing {
    /// The places in the group's operations of the records stored after all.
    stored: HashSet<usize>,
    /// Their store operations, their source timestamps, and what storing them did.
    pub(super) ops: Vec<IngestOp>,
    pub(super) stamps: Vec<Option<u64>>,
    pub(super) applied: Applied,
}

impl Firing {
    /// The records of `ops` that fire with the group: their place in `ops`, their id and the
    /// record, in the partitions of `last` only.
    pub(super) fn firing<'o>(
        &'o self,
        ops: &'o [IngestOp],
        last: &'o Last<'_>,
    ) -> impl Iterator<Item = (usize, RecordId, &'o StoredRecord)> + 'o {
        ops.iter().enumerate().filter_map(move |(i, op)| match op {
            IngestOp::Fire {
                pid,
                offset,
                record,
            } if !self.stored.contains(&i) && last.contains_key(pid) => {
                Some((i, RecordId::new(*pid, *offset)?, record))
            }
            _ => None,
        })
    }

    /// Stores the records at `places` in `ops` after all (their target refused them), to fire
    /// through the wheel.
    ///
    /// # Errors
    /// RocksDB refused the write (why); nothing was stored.
    pub(super) async fn store(
        &mut self,
        store: &Arc<Store>,
        (ops, stamps): (&[IngestOp], &[Option<u64>]),
        places: &[usize],
        now_ms: u64,
    ) -> Result<(), String> {
        let mut scheduled = Vec::with_capacity(places.len());
        for &i in places {
            if let Some(IngestOp::Fire {
                pid,
                offset,
                record,
            }) = ops.get(i)
            {
                scheduled.push(IngestOp::Schedule {
                    pid: *pid,
                    offset: *offset,
                    schedule: record.clone(),
                });
            }
        }
        let batch = Arc::new(scheduled);
        let (s, b) = (store.clone(), batch.clone());
        let applied = match tokio::task::spawn_blocking(move || s.apply(&b, now_ms)).await {
            Ok(r) => r.map_err(|e| e.to_string())?,
            Err(e) => return Err(format!("store write task: {e}")),
        };
        self.stored.extend(places);
        self.stamps
            .extend(places.iter().map(|&i| stamps.get(i).copied().flatten()));
        self.ops.extend(batch.iter().cloned());
        self.applied.inserted.extend(applied.inserted);
        self.applied.replaced += applied.replaced;
        self.applied.removed.extend(applied.removed);
        Ok(())
    }
}

impl AtIngest {
    /// The target record of a record that fires now.
    pub(super) fn out(&self, store: &Store, id: RecordId, record: &StoredRecord, at: u64) -> Out {
        Out {
            topic: record.target().to_owned(),
            partition: None,
            key: record.key().map(<[u8]>::to_vec),
            value: record.value().map(<[u8]>::to_vec),
            headers: Some(provenance(store, id, record, at)),
        }
    }

    /// Counts records whose transaction committed: handed to Kafka at `sent_ms`.
    pub(super) fn fired<'r>(
        &self,
        fired: impl IntoIterator<Item = (RecordId, &'r StoredRecord)>,
        sent_ms: u64,
    ) {
        let now = self.clock.now_ms();
        let mut targets = Vec::new();
        let mut shown = Vec::new();
        for (id, record) in fired {
            targets.push(record.target());
            shown.push(observe_delivery(
                &self.metrics,
                (id, record),
                (record.due_ms(), sent_ms, now),
            ));
        }
        crate::metrics::count_each(&self.metrics.fire.records, targets);
        self.history.extend(shown);
    }

    /// The wall clock, epoch ms.
    pub(super) fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }
}
