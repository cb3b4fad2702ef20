//! A transaction's delivery reports, counted rather than sent one by one.
//!
//! The loop runs one transaction at a time. Before it hands the transaction's records to the
//! producer it opens a [`Tally`] for them in the producer's context; each record's delivery
//! opaque is its place in the transaction and the tally's number, and the producer's polling
//! thread writes each report into the tally (the offset, the refusal to name, the latest
//! timestamp) and wakes the loop's thread when the last is in. No future, channel or
//! allocation per record. A report of an earlier transaction (a purged record's, after its
//! abort) carries another tally's number and is dropped.

use std::sync::atomic::{AtomicI64, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use rdkafka::error::KafkaError;
use rdkafka::Timestamp;

use super::end::collateral;
use crate::kafka_clock::LatestStamp;

/// The reports of one transaction's records.
#[derive(Debug)]
pub(super) struct Tally {
    number: u32,
    /// Each record's offset once acknowledged (`-1` until then).
    offsets: Vec<AtomicI64>,
    /// Records handed to the producer and not yet reported, plus one while the loop may still
    /// hand more.
    outstanding: AtomicUsize,
    /// The latest report's timestamp.
    stamp: LatestStamp,
    /// The refusal to name: a record refused for itself over one failed with its
    /// transaction, wherever it is in the transaction.
    failed: Mutex<Option<(usize, KafkaError)>>,
    done: (Mutex<bool>, Condvar),
}

/// What a transaction's reports said: each record's offset, in order, or the refusal to name
/// (the record's place and Kafka's error).
pub(super) type Reported = Result<Vec<i64>, (usize, KafkaError)>;

/// The open tally of the transaction under way, and the next tally's number.
#[derive(Debug, Default)]
pub(super) struct Tallies {
    open: Mutex<Option<Arc<Tally>>>,
    next: AtomicU32,
}

/// The delivery opaque of the record at `index` of tally `number`.
fn opaque(number: u32, index: usize) -> usize {
    ((number as usize) << 32) | (index & 0xffff_ffff)
}

/// The tally number and the index an [`opaque`] holds.
fn split(opaque: usize) -> (u32, usize) {
    ((opaque >> 32) as u32, opaque & 0xffff_ffff)
}

impl Tallies {
    /// Opens the tally of a transaction of `records` records (the one before it is dropped).
    pub(super) fn open(&self, records: usize) -> Arc<Tally> {
        let number = self.next.fetch_add(1, Ordering::Relaxed);
        let tally = Arc::new(Tally {
            number,
            offsets: (0..records).map(|_| AtomicI64::new(-1)).collect(),
            outstanding: AtomicUsize::new(1),
            stamp: LatestStamp::default(),
            failed: Mutex::default(),
            done: (Mutex::new(false), Condvar::new()),
        });
        *lock(&self.open) = Some(tally.clone());
        tally
    }

    /// Counts a report of the record whose opaque is `opaque`: its offset, or its refusal.
    pub(super) fn report(&self, opaque: usize, result: Result<(i64, Timestamp), &KafkaError>) {
        let open = lock(&self.open);
        let (number, index) = split(opaque);
        let Some(tally) = open.as_ref().filter(|t| t.number == number) else {
            return; // a report of an earlier transaction
        };
        match result {
            Ok((offset, stamp)) => {
                if let Some(o) = tally.offsets.get(index) {
                    o.store(offset, Ordering::Relaxed);
                }
                tally.stamp.note(stamp);
            }
            Err(e) => {
                let mut failed = lock(&tally.failed);
                if failed
                    .as_ref()
                    .is_none_or(|(_, f)| collateral(f) && !collateral(e))
                {
                    *failed = Some((index, e.clone()));
                }
            }
        }
        tally.count();
    }
}

impl Tally {
    /// The opaque of the record at `index`, about to be handed to the producer.
    pub(super) fn handing(&self, index: usize) -> usize {
        self.outstanding.fetch_add(1, Ordering::Relaxed);
        opaque(self.number, index)
    }

    /// A record the producer did not take after all.
    pub(super) fn not_taken(&self) {
        self.count();
    }

    /// Every record is handed to the producer: waits until all are reported. The offsets of
    /// the records in order, or the refusal to name, with the latest timestamp reported.
    pub(super) fn wait(&self) -> (Reported, Option<Timestamp>) {
        self.count();
        let (lock_done, cv) = &self.done;
        let mut done = lock(lock_done);
        while !*done {
            done = cv.wait(done).unwrap_or_else(|e| e.into_inner());
        }
        drop(done);
        let result = match lock(&self.failed).take() {
            Some(failed) => Err(failed),
            None => Ok(self
                .offsets
                .iter()
                .map(|o| o.load(Ordering::Relaxed))
                .collect()),
        };
        (result, self.stamp.get())
    }

    /// Counts one report (or the loop's hold); the last wakes the loop.
    fn count(&self) {
        if self.outstanding.fetch_sub(1, Ordering::AcqRel) == 1 {
            let (done, cv) = &self.done;
            *lock(done) = true;
            cv.notify_all();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::error::RDKafkaErrorCode;

    #[test]
    fn the_loop_waits_for_every_report_and_gets_the_offsets_in_order() {
        let tallies = Arc::new(Tallies::default());
        let tally = tallies.open(3);
        let opaques: Vec<usize> = (0..3).map(|i| tally.handing(i)).collect();
        let t = tallies.clone();
        let reporter = std::thread::spawn(move || {
            for (n, o) in opaques.into_iter().rev().enumerate() {
                std::thread::sleep(std::time::Duration::from_millis(20));
                t.report(
                    o,
                    Ok((100 - n as i64, Timestamp::LogAppendTime(7 + n as i64))),
                );
            }
        });
        let (offsets, stamp) = tally.wait();
        reporter.join().unwrap();
        assert_eq!(offsets.unwrap(), vec![98, 99, 100]);
        assert_eq!(stamp, Some(Timestamp::LogAppendTime(9)));
    }

    #[test]
    fn the_record_refused_for_itself_is_named_and_an_earlier_transactions_report_is_not_counted() {
        let tallies = Tallies::default();
        let earlier = tallies.open(1);
        let stale = earlier.handing(0);
        let tally = tallies.open(3);
        let o: Vec<usize> = (0..3).map(|i| tally.handing(i)).collect();
        let code = KafkaError::MessageProduction;
        // A purged record of the transaction before: counted nowhere.
        tallies.report(stale, Err(&code(RDKafkaErrorCode::MessageSizeTooLarge)));
        tallies.report(o[0], Err(&code(RDKafkaErrorCode::OperationNotAttempted)));
        tallies.report(o[2], Err(&code(RDKafkaErrorCode::MessageSizeTooLarge)));
        tallies.report(o[1], Err(&code(RDKafkaErrorCode::PurgeQueue)));
        let (result, _) = tally.wait();
        let (index, e) = result.unwrap_err();
        assert_eq!(index, 2);
        assert_eq!(
            e.rdkafka_error_code(),
            Some(RDKafkaErrorCode::MessageSizeTooLarge)
        );
    }

    #[test]
    fn a_record_not_taken_is_not_waited_for() {
        let tallies = Tallies::default();
        let tally = tallies.open(2);
        let first = tally.handing(0);
        tally.handing(1);
        tally.not_taken();
        tallies.report(first, Ok((5, Timestamp::NotAvailable)));
        let (offsets, stamp) = tally.wait();
        assert_eq!(offsets.unwrap(), vec![5, -1]);
        assert_eq!(stamp, None);
    }
}
