//! The transaction loop: gathers the work handed in into transactions, one at a time, and
//! answers each piece of work.

use std::time::{Duration, Instant};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::mpsc;
use tracing::{error, info, warn};

use super::{classify, Offsets, Out, Queued, Setup, TxnError, Work};

/// How long a transaction being gathered waits for the next piece of work.
const GAP: Duration = Duration::from_millis(2);

/// Longest a fenced loop goes without trying to renew its producer.
const RENEW_EVERY: Duration = Duration::from_secs(1);

/// The producer, or why there is none now (fenced, and when).
enum Producing {
    Ready(FutureProducer),
    Fenced(String, Instant),
}

pub(super) async fn run(producer: FutureProducer, setup: Setup, mut rx: mpsc::Receiver<Queued>) {
    let mut producing = Producing::Ready(producer);
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
        producing = renewed(producing, &setup).await;
        let started = Instant::now();
        let results = match &producing {
            Producing::Fenced(why, _) => vec![Err(TxnError::Fenced(why.clone())); batch.len()],
            Producing::Ready(p) => {
                let (p, s) = (p.clone(), setup.clone());
                let works: Vec<Work> = batch
                    .iter_mut()
                    .map(|q| std::mem::take(&mut q.work))
                    .collect();
                let n = works.len();
                tokio::task::spawn_blocking(move || transaction(&p, &s, works))
                    .await
                    .unwrap_or_else(|e| vec![Err(TxnError::Aborted(e.to_string())); n])
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
        if let Some(Err(TxnError::Fenced(why))) = results
            .iter()
            .find(|r| matches!(r, Err(TxnError::Fenced(_))))
        {
            if matches!(producing, Producing::Ready(_)) {
                error!(error = %why, "the transactional producer was fenced: another process with the same --instance-id, or this one was paused past its transaction timeout");
                producing = Producing::Fenced(why.clone(), Instant::now());
            }
        }
        for (q, r) in batch.into_iter().zip(results) {
            let _ = q.done.send(r);
        }
    }
}

/// After a fence, a new producer (at most once a second), when the setup can make one.
async fn renewed(producing: Producing, setup: &Setup) -> Producing {
    let Producing::Fenced(_, at) = producing else {
        return producing;
    };
    let Some(renew) = setup.renew.clone().filter(|_| at.elapsed() >= RENEW_EVERY) else {
        return producing;
    };
    let timeout = setup.cut.timeout;
    let made = tokio::task::spawn_blocking(move || {
        let p = renew()?;
        p.init_transactions(timeout)?;
        Ok::<_, KafkaError>(p)
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

/// Why a transaction failed: as a whole, or because of one record (its place among all).
enum Failure {
    Whole(TxnError),
    Record(usize, KafkaError),
    NotOwned(usize),
}

/// One transaction for `works`: begin, write, send offsets, commit, run the after-commit
/// hooks; aborted on any error it survives. One answer per piece of work.
fn transaction(
    producer: &FutureProducer,
    setup: &Setup,
    mut works: Vec<Work>,
) -> Vec<Result<Vec<i64>, TxnError>> {
    let n = works.len();
    let result = producer
        .begin_transaction()
        .map_err(|e| Failure::Whole(classify(e)))
        .and_then(|()| write(producer, setup, &works));
    let written = match result {
        Ok(offsets) => offsets,
        Err(failure) => {
            let abort = match &failure {
                Failure::Whole(TxnError::Fenced(_)) => Ok(()),
                _ => producer.abort_transaction(setup.cut.timeout),
            };
            return answers(&works, failure, abort.err().map(classify));
        }
    };
    for w in &mut works {
        if let Some(after) = w.after.take() {
            after();
        }
    }
    let mut at = 0;
    (0..n)
        .map(|i| {
            let k = works[i].records.len();
            at += k;
            Ok(written[at - k..at].to_vec())
        })
        .collect()
}

/// Each piece of work's answer when its transaction failed: the piece a refused record or a
/// revoked partition belongs to learns so; the others may go again.
fn answers(
    works: &[Work],
    failure: Failure,
    abort_failed: Option<TxnError>,
) -> Vec<Result<Vec<i64>, TxnError>> {
    // A producer that could not abort is in no state to begin again: it is renewed.
    if let Some(e) = abort_failed {
        let fenced = match e {
            TxnError::Fenced(_) => e,
            other => TxnError::Fenced(format!("the abort failed: {other}")),
        };
        return vec![Err(fenced); works.len()];
    }
    let whole = match &failure {
        Failure::Whole(e) => e.clone(),
        Failure::Record(_, e) => TxnError::Aborted(format!("another record failed: {e}")),
        Failure::NotOwned(_) => TxnError::Aborted("another piece's partition was revoked".into()),
    };
    let mut start = 0;
    works
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let range = start..start + w.records.len();
            start = range.end;
            match &failure {
                Failure::Record(at, error) if range.contains(at) => Err(TxnError::Rejected {
                    index: at - range.start,
                    error: error.clone(),
                }),
                Failure::NotOwned(piece) if *piece == i => Err(TxnError::Stale(
                    "a partition of this work was revoked before its transaction committed".into(),
                )),
                _ => Err(whole.clone()),
            }
        })
        .collect()
}

fn write(producer: &FutureProducer, setup: &Setup, works: &[Work]) -> Result<Vec<i64>, Failure> {
    let cut = setup.cut;
    let (outs, offsets) = gather(works);
    let mut deliveries = Vec::with_capacity(outs.len());
    for (i, out) in outs.iter().enumerate() {
        let mut rec: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&out.topic);
        if let Some(p) = out.partition {
            rec = rec.partition(p);
        }
        if let Some(k) = &out.key {
            rec = rec.key(k.as_slice());
        }
        if let Some(v) = &out.value {
            rec = rec.payload(v.as_slice());
        }
        if let Some(h) = &out.headers {
            rec = rec.headers(h.clone());
        }
        let deadline = Instant::now() + cut.timeout;
        loop {
            match producer.send_result(rec) {
                Ok(delivery) => {
                    deliveries.push(delivery);
                    break;
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back))
                    if Instant::now() < deadline =>
                {
                    rec = back;
                    producer.poll(Duration::from_millis(10));
                }
                Err((e, _)) => return Err(refused(i, e)),
            }
        }
    }
    // Every record acknowledged before the commit: rdkafka's commit flushes by polling in
    // steps of 100 ms, which the producer's own polling thread leaves idle, so a commit that
    // finds records still out waits about 100 ms for nothing.
    let handle = tokio::runtime::Handle::current();
    let mut written = Vec::with_capacity(deliveries.len());
    for (i, d) in deliveries.into_iter().enumerate() {
        match handle.block_on(d) {
            Ok(Ok(delivery)) => written.push(delivery.offset),
            Ok(Err((e, _))) => return Err(refused(i, e)),
            Err(_) => {
                return Err(Failure::Whole(TxnError::Aborted(
                    "a record's delivery was cancelled".into(),
                )))
            }
        }
    }
    // Every record is in its partition's log now: an instance assigned one of these
    // partitions after this check reads up to past them, and waits for this transaction.
    if let Some(owned) = &setup.owned {
        if let Some(i) = works
            .iter()
            .position(|w| !w.partitions.iter().all(|p| owned(*p)))
        {
            return Err(Failure::NotOwned(i));
        }
    }
    let whole = |e| Failure::Whole(classify(e));
    if !offsets.is_empty() {
        let metadata = (setup.group)().ok_or_else(|| {
            Failure::Whole(TxnError::Stale(
                "the consumer has no group metadata (not a member now)".into(),
            ))
        })?;
        let mut tpl = TopicPartitionList::new();
        for (t, p, o) in &offsets {
            tpl.add_partition_offset(t, *p, Offset::Offset(*o))
                .map_err(whole)?;
        }
        producer
            .send_offsets_to_transaction(&tpl, &metadata, cut.timeout)
            .map_err(whole)?;
    }
    producer.commit_transaction(cut.timeout).map_err(whole)?;
    Ok(written)
}

/// A record refused: fencing and generation errors concern the whole transaction, anything
/// else this record.
fn refused(i: usize, e: KafkaError) -> Failure {
    match classify(e.clone()) {
        TxnError::Aborted(_) => Failure::Record(i, e),
        other => Failure::Whole(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let got = answers(&batch, Failure::Record(3, refused.clone()), None);
        assert!(matches!(got[0], Err(TxnError::Aborted(_))), "{:?}", got[0]);
        assert_eq!(
            got[1],
            Err(TxnError::Rejected {
                index: 1,
                error: refused
            })
        );
        assert!(matches!(got[2], Err(TxnError::Aborted(_))), "{:?}", got[2]);
        let got = answers(&batch, Failure::NotOwned(2), None);
        assert!(matches!(got[2], Err(TxnError::Stale(_))), "{:?}", got[2]);
        assert!(matches!(got[0], Err(TxnError::Aborted(_))), "{:?}", got[0]);
        // An abort that fails fences every piece (the producer is renewed).
        for abort in [
            TxnError::Fenced("x".into()),
            TxnError::Aborted("timed out".into()),
        ] {
            let got = answers(&batch, Failure::NotOwned(2), Some(abort));
            assert!(got.iter().all(|r| matches!(r, Err(TxnError::Fenced(_)))));
        }
    }

    #[test]
    fn a_records_own_refusal_concerns_that_record_and_a_fence_the_transaction() {
        let code = |c| KafkaError::MessageProduction(c);
        assert!(matches!(
            refused(4, code(RDKafkaErrorCode::MessageSizeTooLarge)),
            Failure::Record(4, _)
        ));
        assert!(matches!(
            refused(4, code(RDKafkaErrorCode::ProducerFenced)),
            Failure::Whole(TxnError::Fenced(_))
        ));
    }
}
