//! Exactly-once firing, the handoff's part: the transaction loop every writer shares, the
//! source offsets ingest has committed (what a firing transaction commits for the group, so
//! that the group coordinator fences a member whose generation is over), and the local state
//! an uncommitted ingest left behind.

use tracing::{error, info};

use super::handoff::{lock, Handoff};
use crate::store::Pid;
use crate::txn::Transactions;

impl Handoff {
    /// Whether records fire exactly once (`--exactly-once`).
    pub fn exactly_once(&self) -> bool {
        self.config.cluster.transactional_id.is_some()
    }

    /// Hands over the transaction loop (once).
    pub fn set_transactions(&self, t: Transactions) {
        let _ = self.transactions.set(t);
    }

    /// The transaction loop, once started.
    pub fn transactions(&self) -> Option<&Transactions> {
        self.transactions.get()
    }

    /// The source offset up to which `pid`'s ingest has committed, if known.
    pub fn consumed(&self, pid: Pid) -> Option<i64> {
        lock(&self.consumed).get(&pid).copied()
    }

    /// Ingest committed `pid` up to `next` (exclusive).
    pub fn set_consumed(&self, pid: Pid, next: i64) {
        let mut c = lock(&self.consumed);
        let e = c.entry(pid).or_insert(next);
        *e = (*e).max(next);
    }

    /// With exactly-once, local records at or past the source offset the changelog holds
    /// were stored by an ingest whose transaction never committed (a crash, a revoke): they
    /// go, and are consumed again. Nothing of them can have fired (a record fires only after
    /// its ingest committed).
    pub(super) async fn forget_uncommitted(&self, pid: Pid, source_next: Option<i64>) {
        let from = source_next.unwrap_or(0);
        lock(&self.consumed).remove(&pid);
        if let Some(next) = source_next {
            self.set_consumed(pid, next);
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
