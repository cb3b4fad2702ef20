//! Firing with exactly-once: the records of a fire batch go to their targets in a Kafka
//! transaction together with their changelog tombstones and the consumer group's offsets of
//! their source partitions (sent with the group metadata: a member whose generation is over
//! cannot commit). Once it committed, and before anything hears so, the records are deleted
//! here; a transaction that aborts made nothing visible, and its records fire again.
//!
//! A record the target refused (an unknown topic, a record too large) is named by the loop:
//! it goes through the usual failure handling (retries with backoff, then the dead-letter
//! topic, in a transaction too); the other records of its transaction go again at once.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::error::RDKafkaErrorCode;
use tracing::{error, warn};

use super::reports::Sent;
use super::{Fault, Publisher};
use crate::changelog::handoff::Handoff;
use crate::changelog::Entry;
use crate::dead_letter::DeadLetter;
use crate::store::{Pid, RecordId, Store, StoredRecord};
use crate::txn::{Out, Transactions, TxnError, Work};

impl Publisher {
    /// Whether records fire in transactions (`--exactly-once`).
    pub(super) fn exactly_once(&self) -> bool {
        self.handoff.as_ref().is_some_and(|h| h.exactly_once())
    }

    /// The transaction loop and the handoff, once the loop runs.
    pub(super) fn transactions(&self) -> Option<(Transactions, Arc<Handoff>)> {
        let h = self.handoff.as_ref()?;
        Some((h.transactions()?.clone(), h.clone()))
    }

    /// Fires `sents` in one piece of work; each outcome goes to the completion task.
    pub(super) fn fire_in_transaction(
        &self,
        (t, h): (Transactions, Arc<Handoff>),
        sents: Vec<Arc<Sent>>,
    ) {
        let work = self.work(&h, &sents, |s| self.target_record(s));
        let reports = self.reports.clone();
        tokio::spawn(async move {
            let result = t.commit(work).await;
            for (i, s) in sents.into_iter().enumerate() {
                let r = match &result {
                    Ok(_) => Ok(()),
                    // Each record's target record comes first, then its tombstone.
                    Err(TxnError::Rejected { index, error }) if *index == 2 * i => {
                        Err(Fault::Kafka(error.clone()))
                    }
                    Err(e) => Err(Fault::Again(e.to_string())),
                };
                reports.send_fault(s, r);
            }
        });
    }

    /// Dead-letters a record in a transaction with its tombstone; `true` once committed (it
    /// is deleted here then).
    pub(super) async fn dead_letter_in_transaction(
        &self,
        (t, h): (Transactions, Arc<Handoff>),
        sent: &Arc<Sent>,
        dl: &DeadLetter,
    ) -> bool {
        let mut with_value = true;
        loop {
            let sents = [sent.clone()];
            let work = self.work(&h, &sents, |_| self.dead.out(dl, with_value));
            match t.commit(work).await {
                Ok(_) => {
                    self.dead.count(dl);
                    return true;
                }
                Err(TxnError::Rejected { index: 0, error })
                    if with_value
                        && error.rdkafka_error_code()
                            == Some(RDKafkaErrorCode::MessageSizeTooLarge) =>
                {
                    warn!(origin = %dl.origin.topic, partition = dl.origin.partition,
                          offset = dl.origin.offset, "dead letter too large; sending it without its value");
                    with_value = false;
                }
                Err(e) => {
                    error!(error = %e, "cannot dead-letter an undeliverable record; retrying later");
                    return false;
                }
            }
        }
    }

    /// The target record of a due record, with the provenance headers.
    fn target_record(&self, s: &Sent) -> Out {
        Out {
            topic: s.record.target().to_owned(),
            partition: None,
            key: s.record.key().map(<[u8]>::to_vec),
            value: s.record.value().map(<[u8]>::to_vec),
            headers: Some(self.provenance(s.id, &s.record, s.sent_ms)),
        }
    }

    /// A piece of work for `sents`: for each, `first(sent)` then its changelog tombstone; the
    /// group's offsets of their source partitions (what ingest committed, at least past each
    /// record); after the commit, their delete here.
    fn work(&self, h: &Handoff, sents: &[Arc<Sent>], first: impl Fn(&Sent) -> Out) -> Work {
        let mut work = Work::default();
        let mut parts: HashMap<Pid, (String, i32, i64)> = HashMap::new();
        for s in sents {
            let pid = s.id.pid();
            let part = parts.entry(pid).or_insert_with(|| {
                let (topic, partition) = self.store.partition_of(pid).unwrap_or_default();
                (topic, partition, 0)
            });
            part.2 = part.2.max(s.id.offset() + 1);
            work.records.push(first(s));
            work.records.push(
                h.changelog()
                    .out(&part.0, part.1, &Entry::Gone(s.id.offset())),
            );
        }
        for (pid, (topic, partition, past)) in parts {
            let next = h.consumed(pid).map_or(past, |c| c.max(past));
            work.offsets.push((topic, partition, next));
            work.partitions.push(pid);
        }
        let (store, done) = (self.store.clone(), sents.to_vec());
        work.after = Some(Box::new(move || delete_committed(&store, &done)));
        work
    }
}

/// Deletes records whose transaction committed, before the commit is answered: a checkpoint
/// written after that answer never covers a tombstone whose record is still here. Tried a
/// few times; a record that cannot be deleted stays claimed (it does not fire here again).
fn delete_committed(store: &Store, done: &[Arc<Sent>]) {
    let Some(read_at) = done.iter().map(|s| s.read_at).min() else {
        return;
    };
    let refs: Vec<(RecordId, &StoredRecord)> = done.iter().map(|s| (s.id, &s.record)).collect();
    let mut pause = Duration::from_millis(50);
    for _ in 0..6 {
        match store.delivered(&refs, read_at) {
            Ok(_) => return,
            Err(e) => warn!(error = %e, "cannot delete fired records yet; retrying"),
        }
        std::thread::sleep(pause);
        pause *= 2;
    }
    error!(
        records = done.len(),
        "giving up deleting records whose transaction committed; they stay claimed here and \
         may fire again only if this instance restarts from a checkpoint before them"
    );
}
