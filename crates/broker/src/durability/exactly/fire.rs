//! Firing in the exactly-once mode: the records of a fire batch go to their targets in a Kafka
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

use tracing::{error, warn};

use super::Exactly;
use crate::dead_letter::{self, DeadLetter};
use crate::publish::reports::Sent;
use crate::publish::{delete_delivered, Delivery, Fault, Publisher};
use crate::store::{ReadMark, Store};
use crate::txn::{Out, Work};
use crate::BoxFuture;
use kafka_delay_core::changelog::Entry;
use kafka_delay_core::id::Pid;

impl Delivery for Exactly {
    /// One transaction for `sents`; each outcome goes to the completion task once it is known.
    fn send<'a>(&'a self, p: &'a Publisher, sents: Vec<Arc<Sent>>) -> BoxFuture<'a, ()> {
        let work = self.work(p, &sents, |s| target_record(p, s));
        let (reports, transactions) = (p.reports.clone(), self.transactions.clone());
        tokio::spawn(async move {
            let result = transactions.commit(work).await;
            for (i, s) in sents.into_iter().enumerate() {
                let r = match &result {
                    Ok(_) => Ok(()),
                    // Each record's target record comes first, then its tombstone.
                    Err(e) => match e.refusal(2 * i) {
                        Some(refused) => Err(Fault::Kafka(refused.clone())),
                        None => Err(Fault::Again(e.to_string())),
                    },
                };
                reports.send_fault(s, r);
            }
        });
        Box::pin(async {})
    }

    /// Nothing: each record was deleted as its transaction committed.
    fn finish<'a>(
        &'a self,
        _p: &'a Publisher,
        _done: Arc<Vec<Arc<Sent>>>,
        _read_at: ReadMark,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }

    /// The dead letter and the record's tombstone in one transaction (too large: again
    /// without its value); `true` once committed (the record is deleted here then).
    fn dead_letter<'a>(
        &'a self,
        p: &'a Publisher,
        sent: &'a Arc<Sent>,
        dl: &'a DeadLetter,
    ) -> BoxFuture<'a, bool> {
        Box::pin(async move {
            let mut with_value = true;
            loop {
                let sents = [sent.clone()];
                let work = self.work(p, &sents, |_| p.dead.out(dl, with_value));
                match self.transactions.commit(work).await {
                    Ok(_) => {
                        p.dead.count(dl);
                        return true;
                    }
                    Err(e) if with_value && e.refusal(0).is_some_and(dead_letter::too_large) => {
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
        })
    }
}

impl Exactly {
    /// A piece of work for `sents`: for each, `first(sent)` then its changelog tombstone; the
    /// group's offsets of their source partitions (what ingest committed, at least past each
    /// record); after the commit, their delete here.
    fn work(&self, p: &Publisher, sents: &[Arc<Sent>], first: impl Fn(&Sent) -> Out) -> Work {
        let changelog = self.grouped.changelog();
        let mut work = Work::default();
        let mut parts: HashMap<Pid, (String, i32, i64)> = HashMap::new();
        for s in sents {
            let pid = s.id.pid();
            let part = parts.entry(pid).or_insert_with(|| {
                let (topic, partition) = p.store.partition_of(pid).unwrap_or_default();
                (topic, partition, 0)
            });
            part.2 = part.2.max(s.id.offset() + 1);
            work.records.push(first(s));
            work.records
                .push(changelog.out(&part.0, part.1, &Entry::Gone(s.id.offset())));
        }
        for (pid, (topic, partition, past)) in parts {
            let next = self.consumed.get(pid).map_or(past, |c| c.max(past));
            work.offsets.push((topic, partition, next));
            work.partitions.push(pid);
        }
        let (store, done) = (p.store.clone(), sents.to_vec());
        work.after = Some(Box::new(move || delete_committed(&store, &done)));
        work
    }
}

/// The target record of a due record, with the provenance headers.
fn target_record(p: &Publisher, s: &Sent) -> Out {
    Out {
        topic: s.record.target().to_owned(),
        partition: None,
        key: s.record.key().map(<[u8]>::to_vec),
        value: s.record.value().map(<[u8]>::to_vec),
        headers: Some(p.provenance(s.id, &s.record, s.sent_ms)),
    }
}

/// How often a delete of committed records is tried before it is given up.
const DELETE_TRIES: u32 = 6;

/// Deletes records whose transaction committed, before the commit is answered: a checkpoint
/// written after that answer never covers a tombstone whose record is still here. A record
/// that cannot be deleted stays claimed (it does not fire here again).
fn delete_committed(store: &Store, done: &[Arc<Sent>]) {
    let Some(read_at) = done.iter().map(|s| s.read_at).min() else {
        return;
    };
    if let Err(e) = delete_delivered(store, done, read_at, DELETE_TRIES) {
        error!(
            error = %e,
            records = done.len(),
            "giving up deleting records whose transaction committed; they stay claimed here and \
             may fire again only if this instance restarts from a checkpoint before them"
        );
    }
}
