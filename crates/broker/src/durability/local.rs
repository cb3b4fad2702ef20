//! The local mode (`--no-changelog`): RocksDB on this disk holds the only copy of every pending
//! record. A group is safe once RocksDB took it (with `--sync`, once it is on the disk); a
//! record is deleted after its target acknowledged it. One instance holds every partition of
//! its group.

use std::collections::HashMap;
use std::sync::Arc;

use rdkafka::consumer::BaseConsumer;
use rdkafka::{Offset, TopicPartitionList};
use tracing::{error, info};

use crate::admin::Cluster;
use crate::changelog::owners::Owner;
use crate::changelog::GroupError;
use crate::ingest::{Durable, IngestContext, OffsetCommit, Rebalance, Stored};
use crate::publish::reports::Sent;
use crate::publish::{Delivery, Publisher};
use crate::store::{ReadMark, Store, StoreError};
use crate::BoxFuture;
use kafka_delay_core::id::{Pid, RecordId};

/// The local mode.
#[derive(Debug)]
pub struct Local {
    store: Arc<Store>,
    max_group: usize,
}

impl Local {
    /// The local mode over `store`, taking ingest groups of at most `max_group` records.
    pub fn new(store: Arc<Store>, max_group: usize) -> Self {
        Self { store, max_group }
    }
}

impl Durable for Local {
    fn start_offsets(&self) -> Result<HashMap<Pid, i64>, StoreError> {
        self.store.next_offsets()
    }

    fn resumed(&self) -> HashMap<Pid, i64> {
        HashMap::new()
    }

    fn after_store<'a, 'm: 'a>(&'a self, _group: Stored<'a, 'm>) -> BoxFuture<'a, bool> {
        Box::pin(async { true })
    }

    fn offset_commit(&self) -> OffsetCommit {
        OffsetCommit::Consumer
    }

    fn max_group(&self) -> usize {
        self.max_group
    }
}

impl Rebalance for Local {
    /// Each assigned partition starts at the offset RocksDB holds (the durable checkpoint),
    /// not at Kafka's committed offset, which may lag behind it.
    fn assigning(&self, tpl: &mut TopicPartitionList) {
        let parts: Vec<(String, i32)> = tpl
            .elements()
            .iter()
            .map(|e| (e.topic().to_owned(), e.partition()))
            .collect();
        let mut seeded = 0;
        for (topic, partition) in parts {
            let Some(pid) = self.store.lookup_partition(&topic, partition) else {
                continue;
            };
            match self.store.next_offset(pid) {
                Ok(Some(offset)) => {
                    if tpl
                        .set_partition_offset(&topic, partition, Offset::Offset(offset))
                        .is_ok()
                    {
                        seeded += 1;
                    }
                }
                Ok(None) => {}
                Err(e) => error!(%topic, partition, error = %e, "cannot read the stored offset"),
            }
        }
        info!(
            partitions = tpl.count(),
            resumed_from_store = seeded,
            "source partitions resume where RocksDB says"
        );
    }

    fn assigned(&self, _consumer: &BaseConsumer<IngestContext>, _tpl: &TopicPartitionList) {}

    fn revoking(&self, _tpl: &TopicPartitionList) {}
}

impl Delivery for Local {
    fn finish<'a>(
        &'a self,
        p: &'a Publisher,
        done: Arc<Vec<Arc<Sent>>>,
        read_at: ReadMark,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            crate::failpoint::hit("after-delivery");
            p.delete_in_store(done, read_at).await;
        })
    }
}

impl Cluster for Local {
    fn this(&self) -> Option<&str> {
        None
    }

    fn owners(&self) -> Option<Result<Vec<Owner>, GroupError>> {
        None
    }

    fn log_changes(&self, _: &Store, _: &[RecordId], _: &[RecordId]) -> Result<(), GroupError> {
        Ok(())
    }
}
