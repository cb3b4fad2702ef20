//! A transaction that does not return, and a producer whose drop does not: the loop must go
//! on without them.

use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use tracing::{error, warn};

use super::TxnProducer;

/// How long a transaction may go on before the loop gives it up (or, once its commit was sent,
/// says so and waits on), and how long a retired producer's drop may take before that is said.
pub(super) const STUCK: Duration = Duration::from_secs(60);

/// A transaction's phase, which it and its watcher change once each, whichever comes first:
/// it is running; its commit is sent (it may commit: it is waited for); it was given up (it
/// must not commit).
pub(super) const RUNNING: u8 = 0;
const COMMITTING: u8 = 1;
const GIVEN_UP: u8 = 2;

/// Whether the transaction may send its commit (it was not given up); from then on it is not.
pub(super) fn may_commit(phase: &AtomicU8) -> bool {
    (phase.compare_exchange(RUNNING, COMMITTING, Ordering::AcqRel, Ordering::Acquire)).is_ok()
}

/// Whether the watcher gave the transaction up (its commit was not sent); from then on it may
/// not send it.
fn give_up(phase: &AtomicU8) -> bool {
    (phase.compare_exchange(RUNNING, GIVEN_UP, Ordering::AcqRel, Ordering::Acquire)).is_ok()
}

/// Why a hung transaction's work goes again.
pub(super) const HUNG: &str =
    "a transaction did not return within a minute, before its commit was sent; \
                    its producer is renewed (which fences it) and its work goes again";

/// The transaction's outcome; `None` if it has not returned after [`STUCK`] and its commit
/// was not sent: its producer is given up. A transaction open that long was aborted by the
/// coordinator (`transaction.timeout.ms` is shorter), and the renewed producer fences it, so
/// its work can go again. One whose commit was sent is waited for (the commit may have
/// happened), saying so every [`STUCK`].
pub(super) async fn watched<T>(
    mut running: tokio::task::JoinHandle<T>,
    phase: &AtomicU8,
) -> Option<Result<T, tokio::task::JoinError>> {
    let started = Instant::now();
    loop {
        match tokio::time::timeout(STUCK, &mut running).await {
            Ok(outcome) => return Some(outcome),
            Err(_) if give_up(phase) => {
                error!(secs = started.elapsed().as_secs(), "{HUNG}");
                return None;
            }
            Err(_) => error!(
                secs = started.elapsed().as_secs(),
                "a transaction's commit has not returned; nothing else commits here until it does"
            ),
        }
    }
}

/// Drops a producer that is done with on a blocking thread. Dropping purges its queues, which
/// waits for each of its broker threads to answer without a bound, and then joins its
/// threads: on the loop, a drop that hangs would stop every transaction of this instance while
/// its partitions stay assigned here, and nothing would fire.
pub(super) fn retire(producer: TxnProducer) {
    let dropping = tokio::task::spawn_blocking(move || drop(producer));
    tokio::spawn(async move {
        if tokio::time::timeout(STUCK, dropping).await.is_err() {
            warn!(
                secs = STUCK.as_secs(),
                "a retired transactional producer is still being dropped; its threads are left behind"
            );
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transaction_either_commits_or_is_given_up_never_both() {
        let sent = AtomicU8::new(RUNNING);
        assert!(may_commit(&sent));
        assert!(!give_up(&sent), "a sent commit is waited for");
        let abandoned = AtomicU8::new(RUNNING);
        assert!(give_up(&abandoned));
        assert!(
            !may_commit(&abandoned),
            "a given-up transaction never commits"
        );
    }
}
