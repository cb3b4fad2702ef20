//! What operators reach through any instance with a changelog: their changes written to the
//! changelog, and who owns which partition (this instance's advertised address included).

use std::collections::HashMap;

use super::handoff::{blocking, Handoff};
use super::Entry;
use crate::store::{Pid, RecordId, StoredRecord};

impl Handoff {
    /// Records where this instance's HTTP server is reached: `--advertised-http-addr`, else
    /// the address it listens on (this host's name for every interface).
    pub fn set_advertised(&self, bound: std::net::SocketAddr) {
        let addr = self.config.http.advertised.clone().unwrap_or_else(|| {
            if bound.ip().is_unspecified() {
                let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .map(|h| h.trim().to_owned())
                    .unwrap_or_else(|_| "localhost".into());
                format!("{host}:{}", bound.port())
            } else {
                bound.to_string()
            }
        });
        let _ = self.advertised.set(addr);
    }

    /// Where this instance's HTTP server is reached (after [`Handoff::set_advertised`]).
    pub fn advertised(&self) -> Option<&str> {
        self.advertised.get().map(String::as_str)
    }

    /// Every member of the group with its HTTP address and partitions (blocking).
    ///
    /// # Errors
    /// The group coordinator did not answer.
    pub fn owners(&self) -> Result<Vec<super::owners::Owner>, String> {
        super::owners::owners(
            rdkafka::producer::Producer::client(self.changelog.producer()),
            &self.config.kafka.group_id,
        )
    }

    /// Writes operators' changes to the changelog and waits for them (blocking; called after
    /// the store made them): a record moved (`Some`, as it is now) or cancelled (`None`).
    ///
    /// # Errors
    /// What Kafka refused; the change stands here but a restore elsewhere would not see it.
    pub fn write_now(&self, changes: &[(RecordId, Option<StoredRecord>)]) -> Result<(), String> {
        let mut by_pid: HashMap<Pid, Vec<Entry<'_>>> = HashMap::new();
        for (rid, rec) in changes {
            let e = match rec {
                Some(r) => Entry::Record(rid.offset(), r),
                None => Entry::Gone(rid.offset()),
            };
            by_pid.entry(rid.pid()).or_default().push(e);
        }
        let write = async {
            for (pid, entries) in &by_pid {
                let Some((topic, partition)) = self.store.partition_of(*pid) else {
                    continue;
                };
                self.changelog
                    .write(&topic, partition, entries)
                    .await
                    .map_err(|e| format!("changelog {topic}/{partition}: {e}"))?;
            }
            Ok(())
        };
        match tokio::runtime::Handle::try_current() {
            Ok(h) => blocking(|| h.block_on(write)),
            Err(_) => tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?
                .block_on(write),
        }
    }
}
