//! The transaction loop: gathers the work handed in into transactions, one at a time, and
//! answers each piece of work.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::{BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::mpsc;
use tracing::{error, info, warn};

use super::acks::Tally;
use super::end::{answers, collateral, commit, committing, looked_up};
use super::outcome::Outcome;
use super::refused::Refused;
use super::stuck::{retire, watched, Phase, Step, HUNG};
use super::{classify, Offsets, Out, Owned, Placed, Queued, Setup, TxnError, TxnProducer, Work};
use crate::kafka_clock::KafkaClock;

/// How long a transaction being gathered waits for the next piece of work.
const GAP: Duration = Duration::from_millis(2);

/// Longest a fenced loop goes without trying to renew its producer.
const RENEW_EVERY: Duration = Duration::from_secs(1);

/// The producer, or why there is none now (fenced, and when).
enum Producing {
    Ready(TxnProducer),
    Fenced(String, Instant),
}

pub(super) async fn run(producer: TxnProducer, setup: Setup, mut rx: mpsc::Receiver<Queued>) {
    let mut producing = Producing::Ready(producer);
    let mut refused = Refused::default();
    let cut = setup.cut;
    while let Some(first) = rx.recv().await {
        // What queued up while the last transaction committed joins this one, and what follows
        // within `GAP` of the last piece; it is cut when nothing more comes (waiting longer
        // only delays the work in it, whose senders wait for the commit), at `max_records`, or
        // after `interval` of work still arriving.
        let mut batch = vec![first];
        let mut records = batch[0].work.records.len();
        let deadline = tokio::time::Instant::now() + cut.interval;
        while records < cut.max_records {
            let gap = (tokio::time::Instant::now() + GAP).min(deadline);
            match tokio::time::timeout_at(gap, rx.recv()).await {
                Ok(Some(w)) => {
                    records += w.work.records.len();
                    batch.push(w);
                }
                _ => break,
            }
        }
        let mut batch = answer_refused(batch, &mut refused);
        if batch.is_empty() {
            continue;
        }
        producing = renewed(producing, &setup).await;
        let started = Instant::now();
        let Outcome {
            answers: results,
            spent,
            ..
        } = match &producing {
            Producing::Fenced(why, _) => {
                let answers = vec![Err(TxnError::Fenced(why.clone())); batch.len()];
                Outcome::new(answers, Vec::new(), None)
            }
            Producing::Ready(p) => {
                let works = batch.iter_mut().map(|q| std::mem::take(&mut q.work));
                let mut outcome = on_its_thread(p, &setup, works.collect()).await;
                refused.learn(std::mem::take(&mut outcome.refused), Instant::now());
                outcome
            }
        };
        let failed = results.iter().find_map(|r| r.as_ref().err());
        if let Some(e) = failed {
            warn!(error = %e, pieces = results.len(), "transaction not committed");
        }
        if let Some(observe) = &setup.observe {
            // The piece whose record was refused, or whose partition moved, names the cause.
            let cause = results
                .iter()
                .filter_map(|r| r.as_ref().err())
                .find(|e| !matches!(e, TxnError::Aborted(_)))
                .or(failed);
            observe(
                cause.map_or("committed", TxnError::outcome),
                started.elapsed(),
            );
        }
        if let Some(why) = spent {
            if matches!(producing, Producing::Ready(_)) {
                error!(error = %why, "the transactional producer cannot go on and is renewed: fenced (another process with the same --instance-id, or this one paused past its transaction timeout) or its abort failed");
                let fenced = Producing::Fenced(why, Instant::now());
                if let Producing::Ready(old) = std::mem::replace(&mut producing, fenced) {
                    retire(old);
                }
            }
        }
        for (q, r) in batch.into_iter().zip(results) {
            let _ = q.done.send(r);
        }
    }
}

/// One transaction for `works` on a blocking thread, watched ([`watched`]).
async fn on_its_thread(producer: &TxnProducer, setup: &Setup, works: Vec<Work>) -> Outcome {
    let (p, s, n) = (producer.clone(), setup.clone(), works.len());
    let phase = Arc::new(Phase::default());
    let c = phase.clone();
    let running = tokio::task::spawn_blocking(move || transaction(&p, &s, works, &c));
    match watched(running, &phase, setup.cut.stuck).await {
        Some(Ok(done)) => done,
        Some(Err(e)) => Outcome::new(vec![Err(TxnError::Aborted(e.to_string())); n], vec![], None),
        None => Outcome::new(vec![Err(TxnError::Fenced(HUNG.into())); n], vec![], None),
    }
}

/// The work of `batch` that names no topic the cluster refused a moment ago; the rest is
/// answered at once (in a transaction it would spoil the others').
fn answer_refused(batch: Vec<Queued>, refused: &mut Refused) -> Vec<Queued> {
    let now = Instant::now();
    let mut kept = Vec::with_capacity(batch.len());
    for q in batch {
        let denied: Vec<(usize, KafkaError)> = (q.work.records.iter().enumerate())
            .filter(|(_, r)| refused.refuses(&r.topic, now))
            .map(|(i, _)| (i, denied()))
            .collect();
        if denied.is_empty() {
            kept.push(q);
        } else {
            let _ = q.done.send(Err(TxnError::Rejected(denied)));
        }
    }
    kept
}

/// After a fence, a new producer (at most once a second), when the setup can make one. Work
/// that arrives while fenced waits for the renewal rather than failing at once: a dead letter
/// refused as fenced goes back to firing its record, whose refusal can fence the producer
/// again, and records in step with it would never reach a live producer.
async fn renewed(producing: Producing, setup: &Setup) -> Producing {
    let Producing::Fenced(_, at) = producing else {
        return producing;
    };
    let Some(renew) = setup.renew.clone() else {
        return producing;
    };
    tokio::time::sleep(RENEW_EVERY.saturating_sub(at.elapsed())).await;
    let timeout = setup.cut.timeout;
    let made = tokio::task::spawn_blocking(move || {
        let p = renew()?;
        match p.init_transactions(timeout) {
            Ok(()) => Ok(p),
            Err(e) => {
                retire(p);
                Err(e)
            }
        }
    })
    .await;
    match made {
        Ok(Ok(p)) => {
            info!("transactional producer renewed after a fence");
            Producing::Ready(p)
        }
        Ok(Err(e)) => renewal_failed(&e.to_string()),
        Err(e) => renewal_failed(&e.to_string()),
    }
}

/// A renewal that failed is tried again a second later; meanwhile work is refused as fenced.
fn renewal_failed(e: &str) -> Producing {
    warn!(error = %e, "cannot renew the fenced transactional producer; trying again in a second");
    Producing::Fenced(
        format!("the producer was fenced and renewing it failed: {e}"),
        Instant::now(),
    )
}

/// The records of a batch, and its offsets merged (the highest per partition).
fn gather(works: &[Work]) -> (Vec<&Out>, Offsets) {
    let mut outs = Vec::new();
    let mut offsets: Offsets = Vec::new();
    for w in works {
        outs.extend(w.records.iter());
        for (t, p, o) in &w.offsets {
            match offsets.iter_mut().find(|(t2, p2, _)| t2 == t && p2 == p) {
                Some(e) => e.2 = e.2.max(*o),
                None => offsets.push((t.clone(), *p, *o)),
            }
        }
    }
    (outs, offsets)
}

/// Why a transaction failed: as a whole, or because of records (their places among all;
/// with the topics the authorizer refused, when that was the cause).
pub(super) enum Failure {
    Whole(TxnError),
    Records(Vec<(usize, KafkaError)>, Vec<String>),
    NotOwned(usize),
    /// The commit call failed without saying whether the commit happened: the records'
    /// offsets, and where each record was written that names its partition.
    Committing(TxnError, Vec<i64>, Vec<Placed>),
}

/// The refusal of a record to a topic the authorizer refuses.
fn denied() -> KafkaError {
    KafkaError::MessageProduction(RDKafkaErrorCode::TopicAuthorizationFailed)
}

/// One transaction for `works`: begin, write, send offsets, commit, run the after-commit
/// hooks; aborted on any error it survives.
fn transaction(
    producer: &TxnProducer,
    setup: &Setup,
    mut works: Vec<Work>,
    phase: &Phase,
) -> Outcome {
    let n = works.len();
    let result = producer
        .begin_transaction()
        .map_err(|e| Failure::Whole(classify(e)))
        .and_then(|()| write(producer, setup, &mut works, phase));
    let (written, spent) = match result {
        Ok(offsets) => (offsets, None),
        Err(Failure::Committing(error, offsets, placed)) => {
            match looked_up(setup, &error, &placed) {
                Some(true) => (offsets, Some(error)),
                _ => return Outcome::new(vec![Err(error); n], Vec::new(), None),
            }
        }
        Err(failure) => {
            let abort = match &failure {
                Failure::Whole(TxnError::Fenced(_)) => Ok(()),
                _ => {
                    phase.at(Step::Abort);
                    producer.abort_transaction(setup.cut.timeout)
                }
            };
            let learned = match &failure {
                Failure::Records(_, topics) => topics.clone(),
                _ => Vec::new(),
            };
            let abort_failed = abort.err().map(classify);
            let answers = answers(&works, failure, abort_failed.clone());
            return Outcome::new(answers, learned, abort_failed.as_ref());
        }
    };
    for w in &mut works {
        if let Some(after) = w.after.take() {
            after();
        }
    }
    let mut at = 0;
    let answers = (0..n)
        .map(|i| {
            let k = works[i].records.len();
            at += k;
            Ok(written[at - k..at].to_vec())
        })
        .collect();
    let mut outcome = Outcome::new(answers, Vec::new(), None);
    // A producer whose commit call failed cannot go on, even when its commit happened.
    outcome.spent = spent.map(|e| e.to_string());
    outcome
}

/// Writes the records of `works` (their headers go to the producer: nothing reads them after)
/// and commits the transaction with their offsets: each record's offset.
fn write(
    producer: &TxnProducer,
    setup: &Setup,
    works: &mut [Work],
    phase: &Phase,
) -> Result<Vec<i64>, Failure> {
    let cut = setup.cut;
    phase.at(Step::Send);
    let headers: Vec<Option<OwnedHeaders>> = (works.iter_mut())
        .flat_map(|w| w.records.iter_mut().map(|o| o.headers.take()))
        .collect();
    let (outs, offsets) = gather(works);
    let tally = producer.tallies().open(outs.len());
    hand(producer, &tally, &outs, headers, cut.timeout)?;
    phase.at(Step::Acknowledge);
    let written = acknowledged(producer, &outs, &tally, setup.kafka_clock.as_deref())?;
    // The member's generation is read before its partitions are checked: a generation it
    // joins after the check (its revocations then already done) must not commit this
    // transaction's offsets, or records of a partition another member took over and restored
    // before they reached the log would commit here too. Read after the check, it could.
    phase.at(Step::Offsets);
    let metadata = member(setup, &offsets)?;
    // Every record is in its partition's log now: an instance assigned one of these
    // partitions after this check reads up to past them, and waits for this transaction.
    if let Some(owned) = &setup.owned {
        if let Some(i) = works.iter().position(|w| !owned_for(owned, w)) {
            return Err(Failure::NotOwned(i));
        }
    }
    let whole = |e| Failure::Whole(classify(e));
    if let Some(metadata) = metadata {
        let mut tpl = TopicPartitionList::new();
        for (t, p, o) in &offsets {
            tpl.add_partition_offset(t, *p, Offset::Offset(*o))
                .map_err(whole)?;
        }
        producer
            .send_offsets_to_transaction(&tpl, &metadata, cut.timeout)
            .map_err(whole)?;
    }
    if !phase.may_commit() {
        return Err(Failure::Whole(TxnError::Fenced(HUNG.into())));
    }
    crate::failpoint::hit("before-commit");
    commit(producer, setup).map_err(|e| committing(e, &outs, &written))?;
    Ok(written)
}

/// Hands every record to the producer, counted in `tally`, each with its headers; waits while
/// the producer's queue is full, for at most `timeout` per record.
fn hand(
    producer: &TxnProducer,
    tally: &Tally,
    outs: &[&Out],
    mut headers: Vec<Option<OwnedHeaders>>,
    timeout: Duration,
) -> Result<(), Failure> {
    for (i, out) in outs.iter().enumerate() {
        let mut rec: BaseRecord<'_, [u8], [u8], usize> =
            BaseRecord::with_opaque_to(&out.topic, tally.handing(i));
        if let Some(p) = out.partition {
            rec = rec.partition(p);
        }
        if let Some(k) = &out.key {
            rec = rec.key(k.as_slice());
        }
        if let Some(v) = &out.value {
            rec = rec.payload(v.as_slice());
        }
        if let Some(h) = headers.get_mut(i).and_then(Option::take) {
            rec = rec.headers(h);
        }
        let deadline = Instant::now() + timeout;
        loop {
            match producer.send(rec) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back))
                    if Instant::now() < deadline =>
                {
                    rec = back;
                    producer.poll(Duration::from_millis(10));
                }
                Err((e, _)) => {
                    tally.not_taken();
                    return Err(refused(i, e));
                }
            }
        }
    }
    Ok(())
}

/// The offset of each record of the transaction once all are acknowledged, or the failure
/// that names the refused records.
fn acknowledged(
    producer: &TxnProducer,
    outs: &[&Out],
    tally: &Tally,
    kafka_clock: Option<&KafkaClock>,
) -> Result<Vec<i64>, Failure> {
    // Every record acknowledged before the commit: rdkafka's commit flushes by polling in
    // steps of 100 ms, which the producer's own polling thread leaves idle, so a commit that
    // finds records still out waits about 100 ms for nothing.
    // Every report is read: a refused record fails the others of its transaction too (they
    // are reported "not attempted" or purged), and the one to name is the record refused for
    // itself, wherever it is in the batch.
    let (written, stamp) = tally.wait();
    // One sample per transaction: the latest acknowledgement.
    if let (Some(clock), Some(stamp)) = (kafka_clock, stamp) {
        clock.appended(stamp);
    }
    match written {
        Ok(written) => Ok(written),
        Err((i, e)) => {
            // Refused by the authorizer: every record of the refused topics is named.
            let topics = producer.take_refused();
            if collateral(&e) && !topics.is_empty() {
                let records = (outs.iter().enumerate())
                    .filter(|(_, o)| topics.contains(&o.topic))
                    .map(|(i, _)| (i, denied()))
                    .collect();
                return Err(Failure::Records(records, topics));
            }
            Err(refused(i, e))
        }
    }
}

/// Whether every partition `work` belongs to is owned here, as it was at the work's stamp.
fn owned_for(owned: &Owned, work: &Work) -> bool {
    work.partitions
        .iter()
        .all(|p| owned(*p).is_some_and(|since| work.owned_at.is_none_or(|at| since <= at)))
}

/// The member's group metadata, when there are `offsets` to commit with it.
fn member(setup: &Setup, offsets: &Offsets) -> Result<Option<ConsumerGroupMetadata>, Failure> {
    if offsets.is_empty() {
        return Ok(None);
    }
    let metadata = (setup.group)().ok_or_else(|| {
        Failure::Whole(TxnError::Stale {
            text: "the consumer has no group metadata (not a member now)".into(),
            forgotten: false,
        })
    })?;
    Ok(Some(metadata))
}

/// A record refused: fencing and generation errors concern the whole transaction, anything
/// else this record.
fn refused(i: usize, e: KafkaError) -> Failure {
    match classify(e.clone()) {
        TxnError::Aborted(_) => Failure::Records(vec![(i, e)], Vec::new()),
        other => Failure::Whole(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_delay_core::id::Pid;

    fn work(offsets: &[(&str, i32, i64)], records: usize) -> Work {
        Work {
            records: vec![Out::default(); records],
            offsets: offsets
                .iter()
                .map(|(t, p, o)| ((*t).to_owned(), *p, *o))
                .collect(),
            ..Work::default()
        }
    }

    #[test]
    fn work_read_before_its_partition_was_handed_here_again_is_not_owned_for() {
        // Partition 1 was handed here at stamp 3, partition 2 at stamp 7; 9 is not owned.
        let owned: Owned = Arc::new(|pid| match pid {
            1 => Some(3),
            2 => Some(7),
            _ => None,
        });
        let of = |partitions: Vec<Pid>, owned_at| Work {
            partitions,
            owned_at,
            ..Work::default()
        };
        assert!(owned_for(&owned, &of(vec![1, 2], None)));
        assert!(owned_for(&owned, &of(vec![1, 2], Some(7))));
        // Read at stamp 5: partition 2 was revoked and restored here since.
        assert!(owned_for(&owned, &of(vec![1], Some(5))));
        assert!(!owned_for(&owned, &of(vec![1, 2], Some(5))));
        assert!(!owned_for(&owned, &of(vec![9], None)));
        assert!(owned_for(&owned, &of(vec![], Some(0))));
    }

    #[test]
    fn a_batch_commits_every_record_and_the_highest_offset_of_each_partition() {
        let a = work(&[("s", 0, 10), ("s", 1, 5)], 2);
        let b = work(&[("s", 0, 12), ("t", 0, 3)], 1);
        let c = work(&[("s", 1, 4)], 0);
        let batch = vec![a, b, c];
        let (outs, mut offsets) = gather(&batch);
        offsets.sort();
        assert_eq!(outs.len(), 3);
        assert_eq!(
            offsets,
            vec![("s".into(), 0, 12), ("s".into(), 1, 5), ("t".into(), 0, 3)]
        );
    }

    #[test]
    fn a_refused_record_is_named_to_its_own_work_and_the_others_may_go_again() {
        let batch = vec![work(&[], 2), work(&[], 3), work(&[], 1)];
        let refused = KafkaError::MessageProduction(RDKafkaErrorCode::UnknownTopicOrPartition);
        // The fourth record of the transaction is the second of the second piece.
        let one = |e: &KafkaError| Failure::Records(vec![(3, e.clone())], Vec::new());
        let got = answers(&batch, one(&refused), None);
        assert!(matches!(got[0], Err(TxnError::Aborted(_))), "{:?}", got[0]);
        assert_eq!(got[1], Err(TxnError::Rejected(vec![(1, refused)])));
        assert!(matches!(got[2], Err(TxnError::Aborted(_))), "{:?}", got[2]);
        let got = answers(&batch, Failure::NotOwned(2), None);
        assert!(
            matches!(got[2], Err(TxnError::Stale { .. })),
            "{:?}",
            got[2]
        );
        assert!(matches!(got[0], Err(TxnError::Aborted(_))), "{:?}", got[0]);
        // An abort that fails fences every piece (the producer is renewed).
        for abort in [
            TxnError::Fenced("x".into()),
            TxnError::Aborted("timed out".into()),
        ] {
            let got = answers(&batch, Failure::NotOwned(2), Some(abort));
            assert!(got.iter().all(|r| matches!(r, Err(TxnError::Fenced(_)))));
        }
        // ...but the pieces whose records were refused learn which, or they would go again
        // forever: the third and fourth record (of the first and second piece).
        let refused = Failure::Records(vec![(1, denied()), (3, denied())], vec!["t".into()]);
        let fenced = Some(TxnError::Fenced("INVALID_TXN_STATE".into()));
        let got = answers(&batch, refused, fenced);
        assert_eq!(got[0], Err(TxnError::Rejected(vec![(1, denied())])));
        assert_eq!(got[1], Err(TxnError::Rejected(vec![(1, denied())])));
        assert!(matches!(got[2], Err(TxnError::Fenced(_))), "{:?}", got[2]);
        // A fenced producer's records are purged with their transaction, whose abort fails:
        // nothing is named, every piece reads as fenced and goes again on a new producer.
        let purged = KafkaError::MessageProduction(RDKafkaErrorCode::PurgeQueue);
        let got = answers(
            &batch,
            Failure::Records(vec![(0, purged)], Vec::new()),
            Some(TxnError::Fenced("fenced".into())),
        );
        assert!(
            got.iter().all(|r| matches!(r, Err(TxnError::Fenced(_)))),
            "{got:?}"
        );
    }

    #[test]
    fn a_producer_whose_abort_failed_is_renewed_even_when_every_piece_was_refused() {
        // A lone record to a refused topic: its piece learns it was refused, and the abort
        // that failed leaves the producer unable to begin the next transaction.
        let batch = vec![work(&[], 2)];
        let refused = Failure::Records(vec![(0, denied())], vec!["t".into()]);
        let abort = TxnError::Fenced("INVALID_TXN_STATE".into());
        let got = answers(&batch, refused, Some(abort.clone()));
        assert_eq!(got, vec![Err(TxnError::Rejected(vec![(0, denied())]))]);
        let outcome = Outcome::new(got, vec!["t".into()], Some(&abort));
        assert!(outcome.spent.is_some(), "{outcome:?}");
        // A transaction that committed, or failed and was aborted, leaves it as it was.
        assert_eq!(Outcome::new(vec![Ok(vec![1])], vec![], None).spent, None);
        let aborted = vec![Err(TxnError::Aborted("x".into()))];
        assert_eq!(Outcome::new(aborted, vec![], None).spent, None);
        let fenced = vec![Err(TxnError::Fenced("x".into()))];
        assert_eq!(Outcome::new(fenced, vec![], None).spent, Some("x".into()));
    }

    #[test]
    fn the_record_refused_for_itself_is_named_not_one_failed_along_with_it() {
        let code = KafkaError::MessageProduction;
        assert!(collateral(&code(RDKafkaErrorCode::OperationNotAttempted)));
        assert!(collateral(&code(RDKafkaErrorCode::PurgeQueue)));
        assert!(!collateral(&code(
            RDKafkaErrorCode::TopicAuthorizationFailed
        )));
        assert!(!collateral(&code(RDKafkaErrorCode::MessageSizeTooLarge)));
    }

    #[test]
    fn a_records_own_refusal_concerns_that_record_and_a_fence_the_transaction() {
        let code = |c| KafkaError::MessageProduction(c);
        assert!(matches!(
            refused(4, code(RDKafkaErrorCode::MessageSizeTooLarge)),
            Failure::Records(r, _) if r.len() == 1 && r[0].0 == 4
        ));
        assert!(matches!(
            refused(4, code(RDKafkaErrorCode::ProducerFenced)),
            Failure::Whole(TxnError::Fenced(_))
        ));
    }
}
