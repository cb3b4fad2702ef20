use super::*;
use kafka_delay_core::changelog::{Checkpoint, Restored};
use kafka_delay_core::id::RecordId;
use kafka_delay_core::record::Header;
use kafka_delay_core::record::StoredRecord;
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tempfile::TempDir;

fn open(dir: &TempDir) -> Store {
    Store::open(dir.path(), StoreOptions::durable_only(false)).expect("open store")
}

fn sched(id: Option<&str>, due: u64, value: &str) -> StoredRecord {
    sched_to("out", id, due, value)
}

fn sched_to(target: &str, id: Option<&str>, due: u64, value: &str) -> StoredRecord {
    StoredRecord::new(
        due,
        target,
        id.map(str::as_bytes),
        Some(b"k"),
        Some(value.as_bytes()),
        [Header::new("h", "1").borrowed()],
    )
}

/// The store's change count now.
fn changes(store: &Store) -> u64 {
    store.changes.load(Ordering::Acquire)
}

/// Claims and reads the records of `timers` as the publisher does; none may fail to be read.
fn fire(store: &Store, timers: &[(u64, RecordId)]) -> FireBatch {
    store
        .claim_and_read(timers.iter().copied())
        .expect("read for firing")
}

/// The records of a fire batch as the delete after delivery takes them.
fn fired(batch: &FireBatch) -> Vec<(RecordId, &StoredRecord)> {
    batch.records.iter().map(|f| (f.id, &f.record)).collect()
}

fn pending(store: &Store) -> Vec<(u64, RecordId)> {
    let mut out = Vec::new();
    store.scan_due(|d, r| out.push((d, r))).unwrap();
    out
}

/// Three records claimed and read for publishing, with the change count they were read at.
fn read_three(store: &Store, id: Option<&str>) -> (ReadMark, Vec<(RecordId, StoredRecord)>) {
    let p = store.partition_id("delay.in", 0).unwrap();
    let first = store.next_offset(p).unwrap().unwrap_or(0);
    let ops: Vec<IngestOp> = (first..first + 3)
        .map(|i| IngestOp::Schedule {
            pid: p,
            offset: i,
            schedule: sched(if i == first { id } else { None }, 100 + i as u64, "v"),
        })
        .collect();
    let timers = store.apply(&ops, 0).unwrap().inserted;
    let firing = fire(store, &timers);
    assert_eq!(firing.records.len(), 3);
    let read = firing
        .records
        .into_iter()
        .map(|f| (f.id, f.record))
        .collect();
    (firing.read_at, read)
}

/// Pending records by target, added up (the counts kept beside the records).
fn by_target_total(store: &Store) -> u64 {
    store.pending_stats(0).by_target.iter().map(|t| t.1).sum()
}

fn refs(read: &[(RecordId, StoredRecord)]) -> Vec<(RecordId, &StoredRecord)> {
    read.iter().map(|(id, r)| (*id, r)).collect()
}

mod crash;
mod fire;
mod ingest;
mod model;
mod read;
mod replica;
