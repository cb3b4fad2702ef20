//! A transaction that does not return, and a producer whose drop does not: the loop must go
//! on without them.

use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use tracing::{error, warn};

use super::TxnProducer;

/// How long a retired producer's drop may take before that is said.
const DROP_TAKES: Duration = Duration::from_secs(60);

/// The steps of a transaction before its commit, named when it is given up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    Begin,
    Send,
    Acknowledge,
    Offsets,
    Abort,
}

impl Step {
    const ALL: [Step; 5] = [
        Step::Begin,
        Step::Send,
        Step::Acknowledge,
        Step::Offsets,
        Step::Abort,
    ];

    fn name(self) -> &'static str {
        match self {
            Step::Begin => "beginning",
            Step::Send => "handing its records to the producer",
            Step::Acknowledge => "awaiting its records' acknowledgements",
            Step::Offsets => "sending its offsets",
            Step::Abort => "aborting",
        }
    }
}

/// A transaction's phase, which it and its watcher change once each, whichever comes first:
/// it is running; its commit is sent (it may commit: it is waited for); it was given up (it
/// must not commit). And the step it is at while running.
#[derive(Debug, Default)]
pub(super) struct Phase {
    state: AtomicU8,
    step: AtomicU8,
}

const RUNNING: u8 = 0;
const COMMITTING: u8 = 1;
const GIVEN_UP: u8 = 2;

impl Phase {
    /// The transaction is at `step`.
    pub(super) fn at(&self, step: Step) {
        self.step.store(step as u8, Ordering::Release);
    }

    fn step(&self) -> &'static str {
        let at = self.step.load(Ordering::Acquire);
        Step::ALL.get(usize::from(at)).map_or("?", |s| s.name())
    }

    /// Whether the transaction may send its commit (it was not given up); from then on it is
    /// not.
    pub(super) fn may_commit(&self) -> bool {
        (self.state)
            .compare_exchange(RUNNING, COMMITTING, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Whether the watcher gave the transaction up (its commit was not sent); from then on it
    /// may not send it.
    fn give_up(&self) -> bool {
        (self.state)
            .compare_exchange(RUNNING, GIVEN_UP, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// Why a hung transaction's work goes again.
pub(super) const HUNG: &str =
    "a transaction did not return within twice its transaction timeout, before its commit was \
     sent; its producer is renewed (which fences it) and its work goes again";

/// The transaction's outcome; `None` if it has not returned after `limit` and its commit was
/// not sent: its producer is given up. A transaction open past its transaction timeout is
/// aborted by its coordinator, and the renewed producer fences it, so its work can go again
/// (the limit is twice that timeout, `Cut::stuck`: a transaction that hangs holds up every
/// other one of this instance no longer than that). One whose commit was sent is waited for
/// (the commit may have happened), saying so every `limit`.
pub(super) async fn watched<T>(
    mut running: tokio::task::JoinHandle<T>,
    phase: &Phase,
    limit: Duration,
) -> Option<Result<T, tokio::task::JoinError>> {
    let started = Instant::now();
    loop {
        match tokio::time::timeout(limit, &mut running).await {
            Ok(outcome) => return Some(outcome),
            Err(_) if phase.give_up() => {
                error!(
                    secs = started.elapsed().as_secs(),
                    step = phase.step(),
                    "{HUNG}"
                );
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
        if tokio::time::timeout(DROP_TAKES, dropping).await.is_err() {
            warn!(
                secs = DROP_TAKES.as_secs(),
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
        let sent = Phase::default();
        assert!(sent.may_commit());
        assert!(!sent.give_up(), "a sent commit is waited for");
        let abandoned = Phase::default();
        assert!(abandoned.give_up());
        assert!(
            !abandoned.may_commit(),
            "a given-up transaction never commits"
        );
    }

    #[test]
    fn a_given_up_transaction_names_the_step_it_hung_at() {
        let phase = Phase::default();
        assert_eq!(phase.step(), "beginning");
        phase.at(Step::Offsets);
        assert_eq!(phase.step(), "sending its offsets");
    }
}
