//! Ingest with exactly-once firing: what a group changed (its changelog entries), its dead
//! letters and its source offsets commit in one Kafka transaction, sent with the consumer's
//! group metadata. A crash before the commit leaves nothing visible: the group is consumed
//! again, and the records RocksDB took meanwhile are dropped when the partition is restored
//! (see `Handoff::forget_uncommitted`).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use rdkafka::error::RDKafkaErrorCode;
use tracing::{error, warn};

use super::Ingest;
use crate::changelog::handoff::Handoff;
use crate::changelog::Entry;
use crate::dead_letter::DeadLetter;
use crate::store::{Applied, Checkpoint, IngestOp, Pid};
use crate::txn::{Transactions, TxnError, Work};

/// The last offset of each source partition in a group, by the partition's store id.
pub(super) type Last<'m> = HashMap<Pid, (&'m str, i32, i64)>;

impl Ingest {
    /// Commits what a group changed in one transaction, tried again until it commits; then
    /// checkpoints each partition. Partitions revoked meanwhile are left out (their new
    /// owner consumes them again). `false` when stopping first, or when none is left.
    pub(super) async fn commit_group(
        &self,
        h: &Handoff,
        t: &Transactions,
        (ops, applied): (&[IngestOp], &Applied),
        last: &mut Last<'_>,
        dead: &[DeadLetter],
    ) -> bool {
        // Dead letters the topic refused as too large go again without their value.
        let mut valueless: HashSet<usize> = HashSet::new();
        let mut delay = Duration::from_millis(100);
        loop {
            if self.stopping.as_ref().is_some_and(|s| *s.borrow()) {
                return false;
            }
            last.retain(|pid, _| self.store.owns(*pid));
            if last.is_empty() {
                return false;
            }
            let (work, changelog) = self.group_work(h, (ops, applied), last, dead, &valueless);
            let refused = match t.commit(work).await {
                Ok(written) => {
                    self.checkpoint(h, last, &changelog, &written);
                    for (dl, _) in dead_of(dead, last) {
                        self.dead.count(dl);
                    }
                    return true;
                }
                Err(TxnError::Rejected { index, error }) => {
                    let too_large = matches!(
                        error.rdkafka_error_code(),
                        Some(RDKafkaErrorCode::MessageSizeTooLarge)
                    );
                    match index.checked_sub(changelog.len()) {
                        Some(i) if too_large => {
                            let (_, at) = dead_of(dead, last).nth(i).unwrap_or((&dead[0], 0));
                            valueless.insert(at);
                            continue;
                        }
                        _ => TxnError::Rejected { index, error },
                    }
                }
                Err(e) => e,
            };
            error!(error = %refused, "cannot commit an ingested group; consumption paused, retrying");
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(10));
        }
    }

    /// The transaction of a group: each partition's changelog entries (records, what they
    /// removed, the next source offset), then the dead letters, and the source offsets.
    /// Also returns the partition of each changelog entry, in order.
    fn group_work(
        &self,
        h: &Handoff,
        (ops, applied): (&[IngestOp], &Applied),
        last: &Last<'_>,
        dead: &[DeadLetter],
        valueless: &HashSet<usize>,
    ) -> (Work, Vec<Pid>) {
        let mut by_pid = super::changes_by_pid(ops, applied);
        let mut work = Work::default();
        let mut changelog = Vec::new();
        for (pid, &(topic, partition, offset)) in last {
            let entries = by_pid.entry(*pid).or_default();
            entries.push(Entry::SourceOffset(offset + 1));
            for e in entries.iter() {
                work.records.push(h.changelog().out(topic, partition, e));
                changelog.push(*pid);
            }
            work.offsets.push((topic.to_owned(), partition, offset + 1));
            work.partitions.push(*pid);
        }
        for (dl, at) in dead_of(dead, last) {
            work.records
                .push(self.dead.out(dl, !valueless.contains(&at)));
        }
        (work, changelog)
    }

    /// After the commit: each partition's checkpoint (the changelog offset after its last
    /// entry) and the source offset firing transactions commit for it.
    fn checkpoint(&self, h: &Handoff, last: &Last<'_>, changelog: &[Pid], written: &[i64]) {
        let mut next: HashMap<Pid, i64> = HashMap::new();
        for (pid, offset) in changelog.iter().zip(written) {
            let n = next.entry(*pid).or_insert(0);
            *n = (*n).max(offset + 1);
        }
        for (pid, &(topic, partition, offset)) in last {
            h.set_consumed(*pid, offset + 1);
            let Some(&changelog_next) = next.get(pid) else {
                continue;
            };
            let at = Checkpoint {
                changelog_next,
                source_next: Some(offset + 1),
            };
            if let Err(e) = self.store.set_checkpoint(*pid, at) {
                warn!(%topic, partition, error = %e, "cannot write the changelog checkpoint");
            }
        }
    }
}

/// The dead letters of the partitions in `last`, with their place in `dead`.
fn dead_of<'d>(
    dead: &'d [DeadLetter],
    last: &'d Last<'_>,
) -> impl Iterator<Item = (&'d DeadLetter, usize)> + 'd {
    dead.iter().enumerate().filter_map(move |(i, dl)| {
        last.values()
            .any(|(t, p, _)| *t == dl.origin.topic && *p == dl.origin.partition)
            .then_some((dl, i))
    })
}
