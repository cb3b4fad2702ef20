//! How a transaction ends when it is not simply committed: a commit call waited for while
//! librdkafka goes on with it, one that failed without saying looked up in the log, and each
//! piece of work's answer when the transaction did not commit.

use std::time::{Duration, Instant};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::Producer;
use tracing::{error, warn};

use super::run::Failure;
use super::{classify, Out, Placed, Setup, TxnError, TxnProducer, Work};

/// Whether a transaction whose commit call failed with `error` committed, read from the log
/// (`setup.lookup`); said either way, since it decides whether its work goes again.
pub(super) fn looked_up(setup: &Setup, error: &TxnError, placed: &[Placed]) -> Option<bool> {
    let committed = setup.lookup.as_ref().and_then(|lookup| lookup(placed));
    match committed {
        Some(true) => {
            warn!(%error, "a transaction's commit call failed, but the log shows it committed; its work is done")
        }
        Some(false) => {
            warn!(%error, "a transaction's commit call failed and the log shows it aborted; its work goes again")
        }
        None => {
            error!(%error, "a transaction's commit call failed and whether it committed cannot be read; its work goes again, and is delivered twice if it did")
        }
    }
    committed
}

/// Each piece of work's answer when its transaction failed: the piece a refused record or a
/// revoked partition belongs to learns so; the others may go again.
pub(super) fn answers(
    works: &[Work],
    failure: Failure,
    abort_failed: Option<TxnError>,
) -> Vec<Result<Vec<i64>, TxnError>> {
    // A producer that could not abort is in no state to begin again: it is renewed, and every
    // piece goes again but those whose records were refused (librdkafka cannot abort a
    // transaction none of whose partitions it could add, as when the authorizer refuses the
    // only new topic: naming those records is what keeps them from being tried forever).
    let whole = match (&abort_failed, &failure) {
        (Some(TxnError::Fenced(e)), _) => TxnError::Fenced(e.clone()),
        (Some(other), _) => TxnError::Fenced(format!("the abort failed: {other}")),
        (None, Failure::Whole(e)) => e.clone(),
        (None, Failure::Records(r, _)) => TxnError::Aborted(format!(
            "another record failed: {}",
            r.first().map_or_else(String::new, |r| r.1.to_string())
        )),
        (None, Failure::NotOwned(_)) => {
            TxnError::Aborted("another piece's partition was revoked".into())
        }
        (None, Failure::Committing(e, ..)) => e.clone(),
    };
    // Only a record refused for itself is named: records purged or not attempted because of
    // their transaction (a fenced producer's, an aborted one's) go again with the others.
    let named: Vec<(usize, KafkaError)> = match &failure {
        Failure::Records(refused, _) => (refused.iter())
            .filter(|(_, e)| !collateral(e))
            .cloned()
            .collect(),
        _ => Vec::new(),
    };
    let mut start = 0;
    works
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let range = start..start + w.records.len();
            start = range.end;
            match &failure {
                _ if named.iter().any(|r| range.contains(&r.0)) => Err(TxnError::Rejected(
                    (named.iter())
                        .filter(|r| range.contains(&r.0))
                        .map(|(at, e)| (at - range.start, e.clone()))
                        .collect(),
                )),
                Failure::NotOwned(piece) if *piece == i && abort_failed.is_none() => {
                    Err(TxnError::Stale {
                        text: "a partition of this work was revoked before its transaction \
                               committed"
                            .into(),
                        forgotten: false,
                    })
                }
                _ => Err(whole.clone()),
            }
        })
        .collect()
}

/// The failure of a commit call: one that requires an abort says the commit did not happen
/// (a record failed before it was sent); any other leaves it unknown.
pub(super) fn committing(e: KafkaError, outs: &[&Out], written: &[i64]) -> Failure {
    let aborts = matches!(&e, KafkaError::Transaction(t) if t.txn_requires_abort())
        || matches!(&e, KafkaError::Flush(_));
    if aborts {
        return Failure::Whole(classify(e));
    }
    let placed = (outs.iter().zip(written))
        .filter_map(|(o, &at)| o.partition.map(|p| (o.topic.clone(), p, at)))
        .collect();
    let error = TxnError::Fenced(format!("its commit call failed: {}", classify(e)));
    Failure::Committing(error, written.to_vec(), placed)
}

/// Pause between two calls waiting for the same commit.
const COMMIT_AGAIN: Duration = Duration::from_millis(10);

/// Commits the transaction, waiting for it as long as librdkafka says it goes on. A commit
/// that did not return within `timeout` goes on in the background (a retriable error) and may
/// still commit: it is waited for by calling again, never aborted. An abort would fail then
/// (librdkafka refuses it while the commit is in progress), the producer would be renewed and
/// the work would go again, each of its records twice where the commit went through.
pub(super) fn commit(producer: &TxnProducer, setup: &Setup) -> Result<(), KafkaError> {
    let started = Instant::now();
    loop {
        match producer.commit_transaction(setup.cut.commit_wait) {
            #[cfg(feature = "failpoints")]
            Ok(()) if lose_answer(setup) => {
                return Err(KafkaError::MessageProduction(
                    RDKafkaErrorCode::InvalidTransactionalState,
                ))
            }
            // The flush rust-rdkafka does first timed out (every record is acknowledged by
            // now: what is left is librdkafka's own queue), or the commit itself did.
            Err(e @ KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut)) => waiting(&e, started),
            Err(KafkaError::Transaction(e)) if e.is_retriable() => waiting(&e, started),
            other => return other,
        }
        std::thread::sleep(COMMIT_AGAIN);
    }
}

/// Whether the test seam [`Setup::lose_answers`] takes this commit's answer.
#[cfg(feature = "failpoints")]
fn lose_answer(setup: &Setup) -> bool {
    use std::sync::atomic::Ordering;
    (setup.lose_answers)
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

fn waiting(e: &dyn std::fmt::Display, started: Instant) {
    warn!(error = %e, secs = started.elapsed().as_secs(),
          "a transaction's commit has not returned yet; waiting for it (it may have committed)");
}

/// Whether a record's delivery failed only because another record of its transaction did.
pub(super) fn collateral(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::OperationNotAttempted
                | RDKafkaErrorCode::PurgeQueue
                | RDKafkaErrorCode::PurgeInflight
        )
    )
}
