//! What the two changelog modes share: partitions move between the instances of a group
//! through the handoff, and operators' changes go to the changelog before they are answered.

use std::collections::HashMap;
use std::sync::Arc;

use rdkafka::consumer::BaseConsumer;
use rdkafka::TopicPartitionList;

use crate::admin::Cluster;
use crate::changelog::handoff::Handoff;
use crate::changelog::operate::Operators;
use crate::changelog::owners::Owner;
use crate::changelog::takeover::Resumes;
use crate::changelog::{Changelog, GroupError};
use crate::ingest::{IngestContext, Rebalance};
use crate::store::Store;
use kafka_delay_core::id::{Pid, RecordId};
use kafka_delay_core::record::StoredRecord;

/// An instance of a group whose partitions move between instances.
#[derive(Debug)]
pub struct Grouped {
    store: Arc<Store>,
    changelog: Changelog,
    handoff: Arc<Handoff>,
    resumes: Arc<Resumes>,
    operators: Operators,
}

impl Grouped {
    /// `store`'s partitions, logged to `changelog`, moving through `handoff`; the restore
    /// task says in `resumes` where ingest resumes each.
    pub fn new(
        (store, changelog): (Arc<Store>, Changelog),
        handoff: Arc<Handoff>,
        resumes: Arc<Resumes>,
        operators: Operators,
    ) -> Self {
        Self {
            store,
            changelog,
            handoff,
            resumes,
            operators,
        }
    }

    /// The rebalance callback's side of the handoff.
    pub fn handoff(&self) -> &Arc<Handoff> {
        &self.handoff
    }

    /// The changelog.
    pub fn changelog(&self) -> &Changelog {
        &self.changelog
    }

    /// The store whose partitions move.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// Where ingest resumes the partitions handed over since the last call.
    pub fn take_resumed(&self) -> HashMap<Pid, i64> {
        self.resumes.take()
    }

    /// Where this instance's HTTP server is reached.
    pub fn advertised(&self) -> &str {
        self.operators.advertised()
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
        Some(self.operators.advertised())
    }

    fn owners(&self) -> Option<Result<Vec<Owner>, GroupError>> {
        Some(self.operators.owners())
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
        self.operators.write_now(&changes)
    }
}
