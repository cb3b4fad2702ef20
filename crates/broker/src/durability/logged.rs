//! The changelog mode (`--changelog`): every change to a partition's pending state also goes to
//! its compacted changelog topic, so that the partition can move to another instance and a lost
//! disk loses nothing. A group is safe once the changelog acknowledged it (then its offsets are
//! stored and its records reach the wheel); a delivered record's tombstone follows its delete.

use std::collections::HashMap;
use std::sync::Arc;

use tracing::{error, warn};

use super::grouped::Grouped;
use crate::backoff::Backoff;
use crate::changelog::group_entries;
use crate::ingest::{Durable, OffsetCommit, Stored};
use crate::publish::reports::Sent;
use crate::publish::{Delivery, Publisher};
use crate::store::{ReadMark, StoreError};
use crate::BoxFuture;
use kafka_delay_core::changelog::{Checkpoint, Entry};
use kafka_delay_core::id::Pid;

/// The changelog mode.
#[derive(Debug)]
pub struct Logged {
    grouped: Arc<Grouped>,
}

impl Logged {
    /// Over the group's parts.
    pub fn new(grouped: Arc<Grouped>) -> Self {
        Self { grouped }
    }

    /// Writes what a group changed to the changelog, per source partition, and waits for it;
    /// then checkpoints each partition. Tried again until it works; `false` when stopping
    /// first.
    async fn log_changes(&self, group: Stored<'_, '_>) -> bool {
        let g = &self.grouped;
        let mut by_pid = group_entries(group.ops, group.applied);
        for (pid, &(topic, partition, offset)) in group.last.iter() {
            let entries = by_pid.entry(*pid).or_default();
            entries.push(Entry::SourceOffset(offset + 1));
            let mut backoff = Backoff::standard();
            loop {
                match g.changelog().write(topic, partition, entries).await {
                    Ok(next) => {
                        let at = Checkpoint {
                            changelog_next: next,
                            source_next: Some(offset + 1),
                        };
                        if let Err(e) = g.store().set_checkpoint(*pid, at) {
                            warn!(%topic, partition, error = %e, "cannot write the changelog checkpoint");
                        }
                        break;
                    }
                    Err(e) => {
                        error!(%topic, partition, error = %e,
                               "cannot write to the changelog; consumption paused, retrying");
                        if group.stopping.is_some_and(|s| *s.borrow()) {
                            return false;
                        }
                        backoff.wait().await;
                    }
                }
            }
        }
        true
    }
}

impl Durable for Logged {
    /// Nothing at start: each partition resumes as its restore says ([`Durable::resumed`]).
    fn start_offsets(&self) -> Result<HashMap<Pid, i64>, StoreError> {
        Ok(HashMap::new())
    }

    fn resumed(&self) -> HashMap<Pid, i64> {
        self.grouped.take_resumed()
    }

    fn after_store<'a, 'm: 'a>(&'a self, group: Stored<'a, 'm>) -> BoxFuture<'a, bool> {
        Box::pin(self.log_changes(group))
    }

    fn offset_commit(&self) -> OffsetCommit {
        OffsetCommit::Consumer
    }

    fn max_group(&self) -> usize {
        super::WAITING_GROUP
    }
}

impl Delivery for Logged {
    /// The delete here, then the tombstones (a revoke waits until they are handed to the
    /// changelog's producer).
    fn finish<'a>(
        &'a self,
        p: &'a Publisher,
        done: Arc<Vec<Arc<Sent>>>,
        read_at: ReadMark,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            crate::failpoint::hit("after-delivery");
            let (g, h) = (&self.grouped, self.grouped.handoff());
            h.owe();
            p.delete_in_store(done.clone(), read_at).await;
            g.changelog()
                .gone(g.store(), done.iter().map(|s| s.id))
                .await;
            h.paid();
        })
    }
}
