//! Records due soon, kept in memory as well as in RocksDB until they fire, so that firing them
//! needs no read (the read before publishing was about a tenth of the broker's CPU per record
//! at full throughput, docs/decisions.md).
//!
//! A copy, never the only one: every record here is also in the `records` column, and a record
//! not found here is read from there. The store keeps it true (see `Store::claim`):
//! - a record goes in with the batch that writes it, under the store's mutex, just before the
//!   write (so nothing can find it in RocksDB without finding the copy, and fire it twice: once
//!   read, once from a copy kept after the read), and only if it is due by the cut-off ingest
//!   gives (its arrival plus `--keep-in-memory-within`). If the write fails, no timer exists
//!   for the copy; ingest writes the same batch again, which replaces it;
//! - a record leaves when it is read for firing, and **before** anything deletes or moves it in
//!   RocksDB (a cancel, a replacement, an operator's cancel or move), so a read after that sees
//!   RocksDB's answer;
//! - the bytes held are bounded (`--keep-in-memory-mb`): a record that does not fit is not kept.
//!   Records the publisher never asks for (its process stopping is the usual reason) would
//!   hold their bytes; when it is full, those due more than [`STALE_MS`] ago go, at most once a
//!   second.

use std::collections::HashMap;

use kafka_delay_core::hashing::BuildMul;
use kafka_delay_core::id::RecordId;
use kafka_delay_core::record::StoredRecord;

/// A kept record due this long ago that was never asked for is dropped when the memory is
/// full: firing is ms late, so one not asked for by then is not going to be.
pub const STALE_MS: u64 = 60_000;

/// Bytes a kept record counts for beyond its encoding: the map's entry and the record's spans.
const ENTRY_OVERHEAD: usize = 96;

/// See the module doc.
#[derive(Debug, Default)]
pub struct Near {
    records: HashMap<RecordId, StoredRecord, BuildMul>,
    /// What the kept records count for (their encodings plus [`ENTRY_OVERHEAD`] each).
    bytes: usize,
    /// At most this many bytes are kept; 0 keeps nothing.
    max_bytes: usize,
    /// When the last sweep for stale records ran (the `now_ms` of the insert that did it).
    swept_ms: u64,
    /// Records taken from here by [`Near::take`] over the life of the process.
    hits: u64,
}

impl Near {
    /// Keeps at most `max_bytes`.
    pub fn new(max_bytes: usize) -> Self {
        Self {
            max_bytes,
            ..Self::default()
        }
    }

    /// Whether anything is ever kept.
    pub fn enabled(&self) -> bool {
        self.max_bytes > 0
    }

    /// Keeps `record` unless it does not fit; returns whether it was kept. `now_ms` is the
    /// time of the write, for the sweep of stale records.
    pub fn insert(&mut self, id: RecordId, record: &StoredRecord, now_ms: u64) -> bool {
        let size = cost(record);
        if self.bytes + size > self.max_bytes && now_ms >= self.swept_ms.saturating_add(1_000) {
            self.swept_ms = now_ms;
            let stale_before = now_ms.saturating_sub(STALE_MS);
            let mut freed = 0;
            self.records.retain(|_, r| {
                let keep = r.due_ms() >= stale_before;
                if !keep {
                    freed += cost(r);
                }
                keep
            });
            self.bytes -= freed;
        }
        if self.bytes + size > self.max_bytes {
            return false;
        }
        if let Some(old) = self.records.insert(id, record.clone()) {
            self.bytes -= cost(&old);
        }
        self.bytes += size;
        true
    }

    /// Takes the record out for firing, if kept.
    pub fn take(&mut self, id: RecordId) -> Option<StoredRecord> {
        let r = self.remove(id)?;
        self.hits += 1;
        Some(r)
    }

    /// Forgets the record (it is about to be deleted or moved in RocksDB).
    pub fn forget(&mut self, id: RecordId) {
        self.remove(id);
    }

    fn remove(&mut self, id: RecordId) -> Option<StoredRecord> {
        let r = self.records.remove(&id)?;
        self.bytes -= cost(&r);
        Some(r)
    }

    /// Records kept now, the bytes they count for, and records taken so far.
    pub fn stats(&self) -> (usize, usize, u64) {
        (self.records.len(), self.bytes, self.hits)
    }
}

fn cost(r: &StoredRecord) -> usize {
    r.encoded().len() + ENTRY_OVERHEAD
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(due_ms: u64, value_bytes: usize) -> StoredRecord {
        let value = vec![7u8; value_bytes];
        StoredRecord::new(due_ms, "out", None, Some(b"k"), Some(&value), [])
    }

    #[test]
    fn a_kept_record_is_taken_once_and_its_bytes_are_given_back() {
        let mut near = Near::new(10_000);
        let r = record(5, 100);
        assert!(near.insert(RecordId(1), &r, 0));
        assert_eq!(near.stats(), (1, cost(&r), 0));
        assert_eq!(near.take(RecordId(1)), Some(r));
        assert_eq!(near.take(RecordId(1)), None, "taken twice");
        assert_eq!(near.stats(), (0, 0, 1));
    }

    #[test]
    fn a_forgotten_record_is_not_there_to_take() {
        let mut near = Near::new(10_000);
        near.insert(RecordId(1), &record(5, 10), 0);
        near.insert(RecordId(2), &record(5, 10), 0);
        near.forget(RecordId(1));
        near.forget(RecordId(3));
        assert_eq!(near.take(RecordId(1)), None);
        assert!(near.take(RecordId(2)).is_some());
        assert_eq!(near.stats(), (0, 0, 1));
    }

    #[test]
    fn no_more_than_the_budget_is_kept_and_taking_makes_room_again() {
        let one = cost(&record(5, 100));
        let mut near = Near::new(3 * one + one / 2);
        for i in 0..3 {
            assert!(near.insert(RecordId(i), &record(5, 100), 0), "record {i}");
        }
        assert!(
            !near.insert(RecordId(3), &record(5, 100), 0),
            "a fourth fits"
        );
        assert_eq!(near.stats().0, 3);
        assert!(near.take(RecordId(0)).is_some());
        assert!(near.insert(RecordId(3), &record(5, 100), 0));
        assert_eq!(near.stats().1, 3 * one);
        assert!(
            !Near::new(0).insert(RecordId(9), &record(5, 1), 0),
            "0 keeps nothing"
        );
        assert!(!Near::new(0).enabled());
    }

    #[test]
    fn the_same_id_kept_again_counts_once() {
        let mut near = Near::new(10_000);
        near.insert(RecordId(1), &record(5, 100), 0);
        near.insert(RecordId(1), &record(6, 10), 0);
        assert_eq!(near.stats(), (1, cost(&record(6, 10)), 0));
        assert_eq!(near.take(RecordId(1)).map(|r| r.due_ms()), Some(6));
    }

    #[test]
    fn when_full_records_long_past_due_go_at_most_once_a_second() {
        let one = cost(&record(0, 100));
        let mut near = Near::new(2 * one);
        let now = 100_000;
        assert!(near.insert(RecordId(1), &record(now - STALE_MS - 1, 100), now));
        assert!(near.insert(RecordId(2), &record(now - STALE_MS, 100), now));
        // Full: the one due more than a minute ago goes, the one due exactly a minute ago stays.
        assert!(near.insert(RecordId(3), &record(now, 100), now));
        assert_eq!(near.take(RecordId(1)), None);
        assert!(near.take(RecordId(2)).is_some());
        assert!(near.insert(RecordId(4), &record(now - STALE_MS - 5, 100), now));
        // Full again within the second: no sweep, so nothing fits.
        assert!(!near.insert(RecordId(5), &record(now, 100), now + 999));
        assert!(near.insert(RecordId(5), &record(now, 100), now + 1_000));
        assert_eq!(near.take(RecordId(4)), None, "swept a second later");
    }
}
