//! What operators reach through any instance with a changelog: their changes written to the
//! changelog, and who owns which partition (this instance's advertised address included).

use std::collections::HashMap;
use std::sync::Arc;

use super::moving::blocking;
use super::{Changelog, GroupError};
use crate::store::Store;
use kafka_delay_core::changelog::Entry;
use kafka_delay_core::id::{Pid, RecordId};
use kafka_delay_core::record::StoredRecord;

/// What the admin API asks of a group of instances.
#[derive(Debug)]
pub struct Operators {
    store: Arc<Store>,
    changelog: Changelog,
    group: String,
    /// Where this instance's HTTP server is reached.
    advertised: String,
}

impl Operators {
    /// For the instance of consumer group `group` whose HTTP server is reached at `advertised`.
    pub fn new(store: Arc<Store>, changelog: Changelog, group: String, advertised: String) -> Self {
        Self {
            store,
            changelog,
            group,
            advertised,
        }
    }

    /// Where this instance's HTTP server is reached.
    pub fn advertised(&self) -> &str {
        &self.advertised
    }

    /// Every member of the group with its HTTP address and partitions (blocking).
    ///
    /// # Errors
    /// The group coordinator did not answer.
    pub fn owners(&self) -> Result<Vec<super::owners::Owner>, GroupError> {
        super::owners::owners(
            rdkafka::producer::Producer::client(self.changelog.producer()),
            &self.group,
        )
    }

    /// Writes operators' changes to the changelog and waits for them (blocking; called after
    /// the store made them): a record moved (`Some`, as it is now) or cancelled (`None`). A
    /// record whose group is not written yet gets its entry here, and none from its group.
    ///
    /// # Errors
    /// What Kafka refused; the change stands here but a restore elsewhere would not see it.
    pub fn write_now(
        &self,
        changes: &[(RecordId, Option<StoredRecord>)],
    ) -> Result<(), GroupError> {
        let mut by_pid: HashMap<Pid, Vec<Entry<'_>>> = HashMap::new();
        for (rid, rec) in changes {
            let e = match rec {
                Some(r) => Entry::Record(rid.offset(), r),
                None => Entry::Gone(rid.offset()),
            };
            by_pid.entry(rid.pid()).or_default().push(e);
        }
        let write = async {
            let _ordered = self.changelog.unlogged().ordered().await;
            for (rid, _) in changes {
                self.changelog.unlogged().take(*rid);
            }
            for (pid, entries) in &by_pid {
                let Some((topic, partition)) = self.store.partition_of(*pid) else {
                    continue;
                };
                self.changelog
                    .write(&topic, partition, entries)
                    .await
                    .map_err(|source| GroupError::Write {
                        topic: self.changelog.topic_of(&topic),
                        partition,
                        source,
                    })?;
            }
            Ok(())
        };
        match tokio::runtime::Handle::try_current() {
            Ok(h) => blocking(|| h.block_on(write)),
            Err(_) => tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| GroupError::Task {
                    what: "changelog write",
                    detail: e.to_string(),
                })?
                .block_on(write),
        }
    }
}
