//! The exactly-once mode (`--changelog --exactly-once`): the changelog mode, with every write
//! in a Kafka transaction. An ingest group (its changelog entries, dead letters and source
//! offsets) commits in one (`ingest.rs`); a fire batch (its target records, their tombstones and
//! the group's offsets of their source partitions) in another (`fire.rs`). Both go through one
//! transaction loop, started before anything fires (`start.rs`).
//!
//! A record already due when it is ingested fires in its group's transaction instead, and is
//! never stored ([`super::due`]).
//!
//! A firing transaction commits the source offsets ingest has committed ([`Consumed`]), so that
//! the group coordinator fences a member whose generation is over; a partition restored here
//! first drops what an ingest whose transaction never committed left in RocksDB.

mod fire;
mod ingest;
mod start;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tracing::{error, info};

pub(super) use start::start;

use super::due;
use super::grouped::Grouped;
use crate::store::Store;
use crate::txn::Transactions;
use kafka_delay_core::id::Pid;

/// The exactly-once mode.
#[derive(Debug)]
pub(super) struct Exactly {
    grouped: Arc<Grouped>,
    transactions: Transactions,
    consumed: Arc<Consumed>,
    /// Records due when ingested fire with their group ([`due`]).
    at_ingest: due::AtIngest,
    /// Most records in an ingest group (`--transaction-records`).
    max_group: usize,
    /// Set when ingest found this member's group gone ([`crate::ingest::Durable::broken`]).
    broken: Mutex<Option<String>>,
}

/// The source offset up to which each owned partition's ingest has committed (the offset a
/// firing transaction commits for the group).
#[derive(Debug)]
pub(super) struct Consumed {
    store: Arc<Store>,
    next: Mutex<HashMap<Pid, i64>>,
}

impl Consumed {
    /// Nothing committed yet.
    pub(super) fn new(store: Arc<Store>) -> Self {
        Self {
            store,
            next: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Pid, i64>> {
        self.next.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The source offset up to which `pid`'s ingest has committed, if known.
    pub(super) fn get(&self, pid: Pid) -> Option<i64> {
        self.lock().get(&pid).copied()
    }

    /// Ingest committed `pid` up to `next` (exclusive).
    pub(super) fn set(&self, pid: Pid, next: i64) {
        let mut c = self.lock();
        let e = c.entry(pid).or_insert(next);
        *e = (*e).max(next);
    }

    /// Local records at or past the source offset the changelog holds were stored by an
    /// ingest whose transaction never committed (a crash, a revoke): they go, and are consumed
    /// again. Nothing of them can have fired (a record fires only after its ingest committed).
    pub(super) async fn forget_uncommitted(&self, pid: Pid, source_next: Option<i64>) {
        let from = source_next.unwrap_or(0);
        self.lock().remove(&pid);
        if let Some(next) = source_next {
            self.set(pid, next);
        }
        let store = self.store.clone();
        match tokio::task::spawn_blocking(move || store.drop_uncommitted(pid, from)).await {
            Ok(Ok(0)) => {}
            Ok(Ok(n)) => info!(
                records = n,
                from, "records of an uncommitted ingest dropped; they are consumed again"
            ),
            Ok(Err(e)) => error!(error = %e, "cannot drop the records of an uncommitted ingest"),
            Err(e) => error!(error = %e, "uncommitted records drop task failed"),
        }
    }
}
