//! What the two changelog modes share: partitions move between the instances of a group
//! through the handoff, and operators' changes go to the changelog before they are answered.

use std::sync::Arc;

use rdkafka::consumer::BaseConsumer;
use rdkafka::TopicPartitionList;

use crate::admin::Cluster;
use crate::changelog::handoff::Handoff;
use crate::changelog::owners::Owner;
use crate::changelog::GroupError;
use crate::ingest::{IngestContext, Rebalance};
use crate::store::Store;
use kafka_delay_core::id::RecordId;
use kafka_delay_core::record::StoredRecord;

/// An instance of a group whose partitions move between instances.
#[derive(Debug)]
pub struct Grouped {
    handoff: Arc<Handoff>,
}

impl Grouped {
    /// Over `handoff`.
    pub fn new(handoff: Arc<Handoff>) -> Self {
        Self { handoff }
    }

    /// The handoff.
    pub fn handoff(&self) -> &Arc<Handoff> {
        &self.handoff
    }
}

impl Rebalance for Grouped {
    /// Nothing to set: each partition starts where its restore says.
    fn assigning(&self, _tpl: &mut TopicPartitionList) {}

    /// Assigned paused, restored from the changelog, then resumed.
    fn assigned(&self, consumer: &BaseConsumer<IngestContext>, tpl: &TopicPartitionList) {
        self.handoff.on_assign(consumer, tpl);
    }

    /// Stops firing them and waits for what they owe the changelog.
    fn revoking(&self, tpl: &TopicPartitionList) {
        self.handoff.on_revoke(tpl);
    }
}

impl Cluster for Grouped {
    fn this(&self) -> Option<&str> {
        Some(self.handoff.advertised())
    }

    fn owners(&self) -> Option<Result<Vec<Owner>, GroupError>> {
        Some(self.handoff.owners())
    }

    fn log_changes(
        &self,
        store: &Store,
        moved: &[RecordId],
        cancelled: &[RecordId],
    ) -> Result<(), GroupError> {
        if moved.is_empty() && cancelled.is_empty() {
            return Ok(());
        }
        let now = store.get(moved)?;
        let changes: Vec<(RecordId, Option<StoredRecord>)> = moved
            .iter()
            .copied()
            .zip(now)
            .filter(|(_, r)| r.is_some())
            .chain(cancelled.iter().map(|rid| (*rid, None)))
            .collect();
        self.handoff.write_now(&changes)
    }
}
