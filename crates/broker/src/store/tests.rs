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

#[test]
fn a_scheduled_record_survives_reopen_with_its_offset() {
    let dir = TempDir::new().unwrap();
    let rid;
    {
        let store = open(&dir);
        let pid = store.partition_id("delay.in", 3).unwrap();
        let applied = store
            .apply(
                &[IngestOp::Schedule {
                    pid,
                    offset: 41,
                    schedule: sched(None, 1_000, "v"),
                }],
                0,
            )
            .unwrap();
        rid = applied.inserted[0].1;
        assert_eq!(
            applied.inserted,
            vec![(1_000, RecordId::new(pid, 41).unwrap())]
        );
    }
    let store = open(&dir);
    assert_eq!(store.partition_id("delay.in", 3).unwrap(), rid.pid());
    assert_eq!(store.partition_of(rid.pid()), Some(("delay.in".into(), 3)));
    assert_eq!(store.next_offsets().unwrap()[&rid.pid()], 42);
    assert_eq!(pending(&store), vec![(1_000, rid)]);
    let got = store.get(&[rid]).unwrap();
    let rec = got[0].as_ref().expect("stored");
    assert_eq!(rec.value(), Some(&b"v"[..]));
    let headers: Vec<Header> = rec.headers().map(|h| h.to_header()).collect();
    assert_eq!(headers, vec![Header::new("h", "1")]);
    assert_eq!(store.pending(), 1);
}

#[test]
fn the_same_id_replaces_and_a_cancel_removes_in_the_same_partition_only() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    let p0 = store.partition_id("delay.in", 0).unwrap();
    let p1 = store.partition_id("delay.in", 1).unwrap();
    let a = store
        .apply(
            &[
                IngestOp::Schedule {
                    pid: p0,
                    offset: 0,
                    schedule: sched(Some("x"), 500, "first"),
                },
                IngestOp::Schedule {
                    pid: p1,
                    offset: 0,
                    schedule: sched(Some("x"), 600, "other partition"),
                },
            ],
            0,
        )
        .unwrap();
    assert_eq!(a.replaced, 0);
    let b = store
        .apply(
            &[IngestOp::Schedule {
                pid: p0,
                offset: 1,
                schedule: sched(Some("x"), 900, "second"),
            }],
            0,
        )
        .unwrap();
    assert_eq!(b.replaced, 1);
    let first = a.inserted[0].1;
    let second = b.inserted[0].1;
    assert_eq!(store.get(&[first]).unwrap(), vec![None]);
    assert_eq!(pending(&store), vec![(600, a.inserted[1].1), (900, second)]);
    let c = store
        .apply(
            &[
                IngestOp::Cancel {
                    pid: p0,
                    offset: 2,
                    id: b"x".to_vec(),
                },
                IngestOp::Cancel {
                    pid: p0,
                    offset: 3,
                    id: b"nothing".to_vec(),
                },
            ],
            0,
        )
        .unwrap();
    assert_eq!((c.cancelled, c.cancel_missed), (1, 1));
    assert_eq!(pending(&store), vec![(600, a.inserted[1].1)]);
    assert_eq!(store.next_offsets().unwrap()[&p0], 4);
    assert_eq!(store.pending(), 1);
}

#[test]
fn reschedule_and_cancel_in_one_batch_see_each_other() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    let p = store.partition_id("delay.in", 0).unwrap();
    let a = store
        .apply(
            &[
                IngestOp::Schedule {
                    pid: p,
                    offset: 0,
                    schedule: sched(Some("x"), 500, "1"),
                },
                IngestOp::Schedule {
                    pid: p,
                    offset: 1,
                    schedule: sched(Some("x"), 700, "2"),
                },
                IngestOp::Cancel {
                    pid: p,
                    offset: 2,
                    id: b"x".to_vec(),
                },
                IngestOp::Schedule {
                    pid: p,
                    offset: 3,
                    schedule: sched(Some("x"), 800, "3"),
                },
            ],
            0,
        )
        .unwrap();
    assert_eq!((a.replaced, a.cancelled), (1, 1));
    assert_eq!(pending(&store), vec![(800, RecordId::new(p, 3).unwrap())]);
    assert_eq!(store.pending(), 1);
}

#[test]
fn removing_a_fired_record_keeps_a_newer_mapping_of_its_id() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    let p = store.partition_id("delay.in", 0).unwrap();
    let old = store
        .apply(
            &[IngestOp::Schedule {
                pid: p,
                offset: 0,
                schedule: sched(Some("x"), 500, "old"),
            }],
            0,
        )
        .unwrap()
        .inserted[0]
        .1;
    let firing = fire(&store, &[(500, old)]);
    assert_eq!(firing.records.len(), 1);
    // While `old` is being delivered, a reschedule arrives.
    let new = store
        .apply(
            &[IngestOp::Schedule {
                pid: p,
                offset: 1,
                schedule: sched(Some("x"), 900, "new"),
            }],
            0,
        )
        .unwrap()
        .inserted[0]
        .1;
    assert_eq!(
        store.delivered(&fired(&firing), firing.read_at).unwrap(),
        0,
        "already replaced"
    );
    // The new mapping still works: a cancel finds it.
    let c = store
        .apply(
            &[IngestOp::Cancel {
                pid: p,
                offset: 2,
                id: b"x".to_vec(),
            }],
            0,
        )
        .unwrap();
    assert_eq!(c.cancelled, 1);
    assert_eq!(store.get(&[new]).unwrap(), vec![None]);
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

#[test]
fn a_delete_after_delivery_with_nothing_changed_since_the_read_removes_every_record() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    let (read_at, read) = read_three(&store, None);
    // Other records delivered meanwhile do not change the count.
    let (others_at, others) = read_three(&store, None);
    assert_eq!(store.delivered(&refs(&others), others_at).unwrap(), 3);
    assert_eq!(changes(&store), read_at.0);
    assert_eq!(store.delivered(&refs(&read), read_at).unwrap(), 3);
    assert_eq!(store.pending(), 0);
    assert_eq!(by_target_total(&store), 0);
    let ids: Vec<RecordId> = read.iter().map(|r| r.0).collect();
    assert_eq!(store.get(&ids).unwrap(), vec![None, None, None]);
}

#[test]
fn with_sync_a_delete_after_delivery_defers_its_fsync_until_a_synced_write_or_a_pause() {
    let dir = TempDir::new().unwrap();
    let mut store = Store::open(dir.path(), StoreOptions::durable_only(true)).expect("open store");
    // An hour between the deletes' own fsyncs, so that the interval never runs out here.
    store.wal = wal::WalSync::new(true, Duration::from_secs(3600));
    let (read_at, read) = read_three(&store, None);
    assert!(store.sync_owed().is_none(), "the ingest write synced");
    assert_eq!(store.delivered(&refs(&read), read_at).unwrap(), 3);
    assert!(
        store.sync_owed().is_some(),
        "a delete inside the interval waits for its fsync"
    );
    // The next ingest write syncs the log, and with it the delete written before.
    let (read_at, second) = read_three(&store, None);
    assert!(store.sync_owed().is_none());
    store.delivered(&refs(&second), read_at).unwrap();
    assert!(store.sync_owed().is_some());
    // A pause in deliveries pays it.
    store.sync_if_owed().unwrap();
    assert!(store.sync_owed().is_none());
    // Once the interval has run out, a delete syncs by itself.
    let (read_at, third) = read_three(&store, None);
    store.wal = wal::WalSync::new(true, Duration::ZERO);
    store.delivered(&refs(&third), read_at).unwrap();
    assert!(store.sync_owed().is_none());
    drop(store);
    // Everything deleted is gone after a reopen, whether its own write synced or not.
    let store = open(&dir);
    assert_eq!(store.pending(), 0);
    assert_eq!(by_target_total(&store), 0);
}

#[test]
fn without_sync_nothing_is_ever_owed() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    let (read_at, read) = read_three(&store, None);
    store.delivered(&refs(&read), read_at).unwrap();
    assert!(store.sync_owed().is_none());
}

#[test]
fn a_delete_after_delivery_checks_again_once_a_record_was_cancelled_replaced_or_moved() {
    // An operator's cancel of one of them while they were being delivered.
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    let (read_at, read) = read_three(&store, None);
    assert!(store.cancel(read[1].0).unwrap().is_some());
    assert_ne!(changes(&store), read_at.0);
    assert_eq!(store.delivered(&refs(&read), read_at).unwrap(), 2);
    assert_eq!(store.pending(), 0);
    assert_eq!(by_target_total(&store), 0);

    // A replacement by id through ingest.
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    let (read_at, read) = read_three(&store, Some("x"));
    let p = store.lookup_partition("delay.in", 0).unwrap();
    let applied = store
        .apply(
            &[IngestOp::Schedule {
                pid: p,
                offset: 3,
                schedule: sched(Some("x"), 900, "new"),
            }],
            0,
        )
        .unwrap();
    assert_eq!(applied.replaced, 1);
    assert_eq!(store.delivered(&refs(&read), read_at).unwrap(), 2);
    assert_eq!(store.pending(), 1, "the replacement is still pending");
    assert_eq!(by_target_total(&store), 1);

    // An operator's move to an hour later: the record was delivered, so it goes, with its
    // due-index entry at the new time and its count in the new minute.
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    let (read_at, read) = read_three(&store, None);
    assert_eq!(store.reschedule(read[2].0, 3_600_000).unwrap(), Some(102));
    assert_ne!(changes(&store), read_at.0);
    assert_eq!(store.delivered(&refs(&read), read_at).unwrap(), 3);
    assert_eq!(store.pending(), 0);
    assert_eq!(store.pending_stats(0).by_due, [0; 5]);
    assert_eq!(by_target_total(&store), 0);
    // The scan deletes the gathered due-index entries first: the one at the new time went.
    assert_eq!(pending(&store), vec![]);
}

// ---- Crash between every step of the durability order ----------------------------------
// A crash is the process dying: the store is dropped without a clean shutdown and opened again.
// "Kafka's committed offset" is modelled by a variable the pipeline updates after the batch.

#[test]
fn crash_after_consume_before_the_batch_loses_nothing() {
    let dir = TempDir::new().unwrap();
    let kafka_committed: i64 = 0;
    {
        let store = open(&dir);
        store.partition_id("delay.in", 0).unwrap();
        // consumed offset 0 ... crash before apply
    }
    let store = open(&dir);
    assert!(pending(&store).is_empty());
    assert!(store.next_offsets().unwrap().is_empty());
    // Consumption resumes at Kafka's committed offset: the record is read again.
    assert_eq!(kafka_committed, 0);
}

#[test]
fn crash_after_the_batch_before_the_offset_commit_neither_loses_nor_duplicates() {
    let dir = TempDir::new().unwrap();
    let kafka_committed: i64 = 0;
    let pid;
    {
        let store = open(&dir);
        pid = store.partition_id("delay.in", 0).unwrap();
        store
            .apply(
                &[IngestOp::Schedule {
                    pid,
                    offset: 0,
                    schedule: sched(None, 500, "v"),
                }],
                0,
            )
            .unwrap();
        // crash: Kafka's offset was not committed, the wheel insert never happened
    }
    let store = open(&dir);
    // The wheel is rebuilt from the due index ...
    assert_eq!(pending(&store).len(), 1);
    // ... and consumption resumes from the stored offset, past what Kafka still has committed,
    // so offset 0 is not ingested a second time.
    assert_eq!(store.next_offsets().unwrap()[&pid], 1);
    assert!(kafka_committed < 1);
}

#[test]
fn crash_after_delivery_before_the_delete_fires_again_after_restart() {
    let dir = TempDir::new().unwrap();
    let rid;
    {
        let store = open(&dir);
        let pid = store.partition_id("delay.in", 0).unwrap();
        rid = store
            .apply(
                &[IngestOp::Schedule {
                    pid,
                    offset: 0,
                    schedule: sched(None, 500, "v"),
                }],
                0,
            )
            .unwrap()
            .inserted[0]
            .1;
        let firing = fire(&store, &[(500, rid)]);
        assert_eq!(firing.records.len(), 1);
        // produced, delivery report received ... crash before `delivered`
    }
    let store = open(&dir);
    assert_eq!(
        pending(&store),
        vec![(500, rid)],
        "still pending: published again (at least once)"
    );
}

#[test]
fn crash_after_the_delete_does_not_fire_again() {
    let dir = TempDir::new().unwrap();
    let rid;
    {
        let store = open(&dir);
        let pid = store.partition_id("delay.in", 0).unwrap();
        rid = store
            .apply(
                &[IngestOp::Schedule {
                    pid,
                    offset: 0,
                    schedule: sched(Some("x"), 500, "v"),
                }],
                0,
            )
            .unwrap()
            .inserted[0]
            .1;
        let firing = fire(&store, &[(500, rid)]);
        assert_eq!(store.delivered(&fired(&firing), firing.read_at).unwrap(), 1);
        // crash right after the delete batch, its due-index entry still gathered
    }
    let store = open(&dir);
    assert_eq!(store.pending(), 0);
    // The entry left in the index is loaded into the wheel; when it comes up there is nothing
    // to publish, and it is forgotten.
    let again = fire(&store, &[(500, rid)]);
    assert!(again.records.is_empty());
    assert_eq!(again.gone, vec![rid]);
    assert!(pending(&store).is_empty());
    // The id mapping went with it: a cancel of "x" finds nothing.
    let pid = store.partition_id("delay.in", 0).unwrap();
    let c = store
        .apply(
            &[IngestOp::Cancel {
                pid,
                offset: 1,
                id: b"x".to_vec(),
            }],
            0,
        )
        .unwrap();
    assert_eq!(c.cancel_missed, 1);
}

#[test]
fn a_second_process_cannot_open_the_same_directory() {
    let dir = TempDir::new().unwrap();
    let _first = open(&dir);
    let err = Store::open(dir.path(), StoreOptions::default()).unwrap_err();
    assert!(err.to_string().contains("cannot open RocksDB"), "{err}");
}

#[derive(Debug, Clone)]
enum Op {
    Schedule {
        id: Option<u8>,
        due: u64,
    },
    Cancel {
        id: u8,
    },
    /// One batch: a record with an id, then another with the same id or a cancel of it.
    Pair {
        id: u8,
        due: u64,
        then: Option<u64>,
    },
    /// Deliver what is due up to `upto`, but for the records whose offset is `keep` modulo 3.
    Fire {
        upto: u64,
        keep: u64,
    },
    Reopen,
    /// An operator cancels the n-th pending record.
    AdminCancel {
        nth: usize,
    },
    /// An operator moves the n-th pending record.
    AdminMove {
        nth: usize,
        due: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (prop::option::of(0u8..4), 0u64..100).prop_map(|(id, due)| Op::Schedule { id, due }),
        1 => (0u8..4).prop_map(|id| Op::Cancel { id }),
        1 => (0u8..4, 0u64..100, prop::option::of(0u64..100))
            .prop_map(|(id, due, then)| Op::Pair { id, due, then }),
        2 => (0u64..100, 0u64..4).prop_map(|(upto, keep)| Op::Fire { upto, keep }),
        1 => Just(Op::Reopen),
        1 => (0usize..8).prop_map(|nth| Op::AdminCancel { nth }),
        1 => (0usize..8, 0u64..100).prop_map(|(nth, due)| Op::AdminMove { nth, due }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// The store against a model map: after any sequence of schedules, reschedules, cancels,
    /// fires, operator cancels and moves, and reopens, the due index holds exactly the model's
    /// records, in due order, and the counts by target (kept in every write batch and read back
    /// at a reopen) agree with it. With records due by 50 kept in memory as well (`keep_bytes`
    /// of them: none, a few, all), what is read is still the model's.
    #[test]
    fn store_matches_a_model(
        ops in prop::collection::vec(op(), 1..40),
        keep_bytes in prop_oneof![Just(0usize), Just(700), Just(1 << 20)],
    ) {
        let dir = TempDir::new().unwrap();
        let options = StoreOptions { sync: false, keep_within_ms: 50, keep_bytes };
        let open = |dir: &TempDir| Store::open(dir.path(), options).expect("open store");
        // Records arrive at 0: those due by 50 are kept in memory as well.
        let apply = |store: &Store, ops: &[IngestOp]| store.apply(ops, 0).map(|_| ());
        let mut store = open(&dir);
        let pid = store.partition_id("delay.in", 0).unwrap();
        // (due, id) -> (delay-id, target)
        let mut model: BTreeMap<(u64, RecordId), (Option<u8>, String)> = BTreeMap::new();
        let mut offset = 0i64;
        for op in ops {
            match op {
                Op::Schedule { id, due } => {
                    if let Some(id) = id {
                        model.retain(|_, v| v.0 != Some(id));
                    }
                    let target = format!("t{}", due % 3);
                    let s = sched_to(&target, id.map(|i| format!("id{i}")).as_deref(), due, "v");
                    apply(&store, &[IngestOp::Schedule { pid, offset, schedule: s }]).unwrap();
                    model.insert((due, RecordId::new(pid, offset).unwrap()), (id, target));
                    offset += 1;
                }
                Op::Cancel { id } => {
                    model.retain(|_, v| v.0 != Some(id));
                    apply(&store, &[IngestOp::Cancel { pid, offset, id: format!("id{id}").into_bytes() }]).unwrap();
                    offset += 1;
                }
                Op::Pair { id, due, then } => {
                    model.retain(|_, v| v.0 != Some(id));
                    let name = format!("id{id}");
                    let first = IngestOp::Schedule { pid, offset, schedule: sched_to("t0", Some(&name), due, "v") };
                    let second = match then {
                        Some(due) => IngestOp::Schedule { pid, offset: offset + 1, schedule: sched_to("t1", Some(&name), due, "w") },
                        None => IngestOp::Cancel { pid, offset: offset + 1, id: name.into_bytes() },
                    };
                    apply(&store, &[first, second]).unwrap();
                    if let Some(due) = then {
                        model.insert((due, RecordId::new(pid, offset + 1).unwrap()), (Some(id), "t1".into()));
                    }
                    offset += 2;
                }
                Op::Fire { upto, keep } => {
                    // Every third one stays behind unless `keep` is 3: delivered records with
                    // pending ones between them, as when deliveries finish out of order.
                    let stays = |r: &RecordId| r.offset() as u64 % 3 == keep;
                    let due: Vec<(u64, RecordId)> = pending(&store).into_iter().filter(|(d, r)| *d <= upto && !stays(r)).collect();
                    let firing = fire(&store, &due);
                    // What the publisher reads is the record as it is now: pending, at its
                    // current due time.
                    prop_assert_eq!(firing.records.len(), due.len());
                    for f in &firing.records {
                        prop_assert!(model.contains_key(&(f.record.due_ms(), f.id)), "{:?} read at {}", f.id, f.record.due_ms());
                    }
                    // And the wheel's stale timers (records cancelled, replaced or delivered)
                    // read nothing.
                    let gone: Vec<(u64, RecordId)> = (0..offset)
                        .map(|o| (upto, RecordId::new(pid, o).unwrap()))
                        .filter(|(_, r)| !model.keys().any(|(_, m)| m == r))
                        .collect();
                    let stale = fire(&store, &gone);
                    prop_assert!(stale.records.is_empty(), "a gone record was read");
                    prop_assert_eq!(stale.gone.len(), gone.len());
                    store.delivered(&fired(&firing), firing.read_at).unwrap();
                    model.retain(|(d, r), _| *d > upto || stays(r));
                }
                Op::Reopen => {
                    drop(store);
                    // The counts checked below are the persisted ones, read back at open.
                    store = open(&dir);
                }
                Op::AdminCancel { nth } => {
                    if let Some(&k) = model.keys().nth(nth) {
                        prop_assert!(store.cancel(k.1).unwrap().is_some());
                        model.remove(&k);
                        prop_assert!(store.cancel(k.1).unwrap().is_none(), "gone after a cancel");
                    }
                }
                Op::AdminMove { nth, due } => {
                    if let Some(&k) = model.keys().nth(nth) {
                        prop_assert_eq!(store.reschedule(k.1, due).unwrap(), Some(k.0));
                        let v = model.remove(&k).unwrap();
                        model.insert((due, k.1), v);
                    }
                }
            }
            // Counts first: `pending` rescans and would rebuild them.
            let mut by_target: BTreeMap<String, u64> = BTreeMap::new();
            for (_, t) in model.values() {
                *by_target.entry(t.clone()).or_default() += 1;
            }
            let snap = store.pending_stats(0);
            prop_assert_eq!(snap.by_target, by_target.into_iter().collect::<Vec<_>>());
            prop_assert_eq!(snap.by_due[1], model.len() as u64);
            let want: Vec<(u64, RecordId)> = model.keys().copied().collect();
            prop_assert_eq!(pending(&store), want);
            prop_assert_eq!(store.pending() as usize, model.len());
        }
        if offset > 0 {
            prop_assert_eq!(store.next_offsets().unwrap()[&pid], offset);
        }
    }
}

#[test]
fn a_data_directory_without_kept_counts_is_counted_once_and_then_read_back() {
    let dir = TempDir::new().unwrap();
    {
        let store = open(&dir);
        let pid = store.partition_id("delay.in", 0).unwrap();
        let ops: Vec<IngestOp> = (0..10)
            .map(|i| {
                let s = sched_to(&format!("t{}", i % 2), None, 60_000 * (i % 4), "v");
                IngestOp::Schedule {
                    pid,
                    offset: i as i64,
                    schedule: s,
                }
            })
            .collect();
        store.apply(&ops, 0).unwrap();
        // What a data directory written before counts were kept looks like.
        let mut wipe = store.batch();
        wipe.delete::<column::Meta>(&codec::MetaKey::counts_kept());
        wipe.clear_counts();
        store.write_required(wipe, "test wipe").unwrap();
    }
    let store = open(&dir);
    assert_eq!(store.pending(), 10);
    let want = vec![("t0".to_string(), 5), ("t1".to_string(), 5)];
    assert_eq!(store.pending_stats(0).by_target, want);
    assert!(
        store.restore_counts().unwrap() == (10, false),
        "the scan wrote them"
    );
    drop(store);
    let store = open(&dir);
    assert_eq!(store.pending_stats(0).by_target, want);
    assert_eq!(store.pending(), 10);
    assert_eq!(store.earliest_due().unwrap(), Some(0));
}

#[test]
fn listing_pages_through_the_due_index_with_filters_and_a_budget() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    let pid = store.partition_id("delay.in", 0).unwrap();
    let ops: Vec<IngestOp> = (0..10)
        .map(|i| {
            let target = if i % 2 == 0 { "even" } else { "odd" };
            let s = sched_to(target, Some(&format!("id{i}")), 1_000 + i as u64 * 10, "v");
            IngestOp::Schedule {
                pid,
                offset: i,
                schedule: s,
            }
        })
        .collect();
    store.apply(&ops, 0).unwrap();
    // Page through the odd ones, 2 at a time.
    let mut from = Position::Due(0);
    let mut seen = Vec::new();
    loop {
        let (page, next) = store
            .list(from, u64::MAX, 2, usize::MAX, |_, _, t| t == "odd")
            .unwrap();
        seen.extend(page.iter().map(|(d, _, t)| (*d, t.clone())));
        match next {
            Some(p) => from = p,
            None => break,
        }
    }
    let want: Vec<(u64, String)> = (0..10)
        .filter(|i| i % 2 == 1)
        .map(|i| (1_000 + i * 10, "odd".to_owned()))
        .collect();
    assert_eq!(seen, want);
    // A due-time range, and a budget that stops early with a position to go on from.
    let (page, next) = store
        .list(Position::Due(1_020), 1_050, 100, 100, |_, _, _| true)
        .unwrap();
    assert_eq!(
        page.iter().map(|p| p.0).collect::<Vec<_>>(),
        [1_020, 1_030, 1_040, 1_050]
    );
    assert_eq!(next, None);
    let (page, next) = store
        .list(Position::Due(0), u64::MAX, 100, 3, |_, _, _| true)
        .unwrap();
    assert_eq!(page.len(), 3);
    assert_eq!(
        next,
        Some(Position::At(1_030, RecordId::new(pid, 3).unwrap()))
    );
    assert_eq!(
        store.find_id(b"id4").unwrap(),
        vec![(1_040, RecordId::new(pid, 4).unwrap())]
    );
    assert_eq!(store.find_id(b"nope").unwrap(), vec![]);
}

#[test]
fn due_ranges_are_bounded_on_both_sides_and_resume_after_the_last_entry() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    let pid = store.partition_id("delay.in", 0).unwrap();
    let ops: Vec<IngestOp> = (0..10)
        .map(|i| IngestOp::Schedule {
            pid,
            offset: i,
            schedule: sched(None, 1_000 + (i as u64 / 2) * 100, "v"),
        })
        .collect();
    store.apply(&ops, 0).unwrap();
    let rid = |o| RecordId::new(pid, o).unwrap();
    // [1_100, 1_300): the four entries due at 1_100 and 1_200, in order.
    let all = store.due_range((1_100, RecordId(0)), 1_300, 100).unwrap();
    assert_eq!(
        all,
        vec![
            (1_100, rid(2)),
            (1_100, rid(3)),
            (1_200, rid(4)),
            (1_200, rid(5))
        ]
    );
    // Paged by two: the second page starts right after the last entry of the first.
    let first = store.due_range((1_100, RecordId(0)), 1_300, 2).unwrap();
    let (d, r) = first[1];
    let second = store.due_range(due_key_after(d, r), 1_300, 2).unwrap();
    assert_eq!([first, second].concat(), all);
    assert!(store
        .due_range((1_300, RecordId(0)), 1_300, 10)
        .unwrap()
        .is_empty());
}

#[test]
fn the_head_seek_skips_fired_records_and_still_sees_a_later_insert_below_the_low_water_mark() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    let pid = store.partition_id("delay.in", 0).unwrap();
    let ops: Vec<IngestOp> = (0..1_000)
        .map(|i| IngestOp::Schedule {
            pid,
            offset: i,
            schedule: sched(None, 10_000 + i as u64, "v"),
        })
        .collect();
    let inserted = store.apply(&ops, 0).unwrap().inserted;
    let firing = fire(&store, &inserted[..900]);
    store.delivered(&fired(&firing), firing.read_at).unwrap();
    assert_eq!(store.earliest_due().unwrap(), Some(10_900));
    // The low-water mark is now 10_900; an overdue record arrives below it.
    store
        .apply(
            &[IngestOp::Schedule {
                pid,
                offset: 1_000,
                schedule: sched(None, 5_000, "late"),
            }],
            0,
        )
        .unwrap();
    assert_eq!(store.earliest_due().unwrap(), Some(5_000));
    let rid = RecordId::new(pid, 1_000).unwrap();
    store.reschedule(rid, 20_000).unwrap();
    assert_eq!(store.earliest_due().unwrap(), Some(10_900));
    store.reschedule(rid, 1_000).unwrap();
    assert_eq!(
        store.earliest_due().unwrap(),
        Some(1_000),
        "a move below the mark"
    );
}

/// Entries in the due index as RocksDB holds them (gathered deletes not applied).
fn raw_due_entries(store: &Store) -> usize {
    store
        .db
        .iterator_cf(store.cf::<column::Due>(), rocksdb::IteratorMode::Start)
        .count()
}

#[test]
fn due_entries_of_delivered_records_are_gathered_deleted_as_ranges_and_forgotten_after_a_crash() {
    let dir = TempDir::new().unwrap();
    let mut store = open(&dir);
    let p = store.partition_id("delay.in", 0).unwrap();
    let ops: Vec<IngestOp> = (1..=40)
        .map(|i| IngestOp::Schedule {
            pid: p,
            offset: i,
            schedule: sched(None, 1_000 + i as u64, "v"),
        })
        .collect();
    let all = store.apply(&ops, 0).unwrap().inserted;
    let firing = fire(&store, &all);
    let read_at = firing.read_at;
    let read = fired(&firing);
    let offsets = |pick: &dyn Fn(i64) -> bool| -> Vec<(RecordId, &StoredRecord)> {
        read.iter()
            .copied()
            .filter(|(r, _)| pick(r.offset()))
            .collect()
    };
    // 1-20 are delivered but 7 and 15, reported per target partition (offset modulo 4), as
    // delivery reports arrive: every fourth record in due order per report.
    let delivered = |o: i64| o <= 20 && o != 7 && o != 15;
    for (n, part) in [1, 2, 3, 0].into_iter().enumerate() {
        let batch = offsets(&|o| delivered(o) && o % 4 == part);
        store.delivered(&batch, read_at).unwrap();
        if n < 3 {
            // 13 gathered, under the 16 gathered before a delete in tests.
            assert_eq!(raw_due_entries(&store), 40, "gathered after report {n}");
        }
    }
    // Deleted together: 1-6, 8-14 and 16-20, three range tombstones, no point tombstone.
    assert_eq!(raw_due_entries(&store), 22);
    let point_deletes = store
        .db
        .property_int_value_cf(
            store.cf::<column::Due>(),
            "rocksdb.num-deletes-active-mem-table",
        )
        .unwrap();
    assert_eq!(point_deletes, Some(0));
    assert_eq!(store.pending(), 22);
    assert_eq!(by_target_total(&store), 22);
    // One more, gathered: the head seek deletes what was gathered before it looks.
    store.delivered(&offsets(&|o| o == 21), read_at).unwrap();
    assert_eq!(raw_due_entries(&store), 22);
    assert_eq!(store.earliest_due().unwrap(), Some(1_007));
    assert_eq!(raw_due_entries(&store), 21);
    // A crash with an entry gathered: it is still in the index after the restart, its record
    // is not; the publisher finds nothing to publish for it and forgets it.
    store.delivered(&offsets(&|o| o == 22), read_at).unwrap();
    drop(store);
    store = open(&dir);
    assert_eq!(store.pending(), 20, "the counts went with the records");
    assert_eq!(raw_due_entries(&store), 21);
    assert_eq!(store.get(&[all[21].1]).unwrap(), vec![None]);
    let stale = fire(&store, &[all[21]]);
    assert!(stale.records.is_empty());
    assert_eq!(stale.gone, vec![all[21].1]);
    let want: Vec<(u64, RecordId)> = all
        .iter()
        .copied()
        .filter(|(_, r)| !delivered(r.offset()) && r.offset() > 22)
        .chain([all[6], all[14]])
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(pending(&store), want);
    assert_eq!(raw_due_entries(&store), 20);
    // A later record inside a deleted range is there.
    let later = store
        .apply(
            &[IngestOp::Schedule {
                pid: p,
                offset: 41,
                schedule: sched(None, 1_003, "later"),
            }],
            0,
        )
        .unwrap()
        .inserted[0];
    assert_eq!(pending(&store)[0], later);
}

#[test]
fn records_due_soon_fire_from_memory_and_leave_it_before_a_cancel_or_move_reaches_rocksdb() {
    let dir = TempDir::new().unwrap();
    let options = StoreOptions {
        sync: false,
        keep_within_ms: 1_000,
        keep_bytes: 1 << 20,
    };
    let store = Store::open(dir.path(), options).unwrap();
    let pid = store.partition_id("delay.in", 0).unwrap();
    let at = |offset, due, id: Option<&str>| IngestOp::Schedule {
        pid,
        offset,
        schedule: sched(id, due, "v"),
    };
    let rid = |offset| RecordId::new(pid, offset).unwrap();
    // Arriving at 1,000: due by 2,000 is kept, 5,000 is not.
    store
        .apply(
            &[
                at(0, 1_500, None),
                at(1, 1_500, Some("x")),
                at(2, 1_800, None),
                at(3, 5_000, None),
            ],
            1_000,
        )
        .unwrap();
    assert_eq!(store.kept_in_memory().0, 3);
    // An operator's cancel and move take the record out of memory first.
    assert!(store.cancel(rid(1)).unwrap().is_some());
    assert_eq!(store.reschedule(rid(2), 1_900).unwrap(), Some(1_800));
    assert_eq!(store.kept_in_memory().0, 1);
    // An operator's read leaves it there.
    assert_eq!(
        store.get(&[rid(0)]).unwrap()[0],
        Some(sched(None, 1_500, "v"))
    );
    assert_eq!(store.kept_in_memory().0, 1);
    let got = fire(
        &store,
        &[
            (1_500, rid(0)),
            (1_500, rid(1)),
            (1_900, rid(2)),
            (5_000, rid(3)),
        ],
    );
    let dues: Vec<(RecordId, u64)> = got
        .records
        .iter()
        .map(|f| (f.id, f.record.due_ms()))
        .collect();
    assert_eq!(
        dues,
        vec![(rid(0), 1_500), (rid(2), 1_900), (rid(3), 5_000)]
    );
    assert_eq!(got.gone, vec![rid(1)]);
    assert_eq!(
        got.records[0].record,
        sched(None, 1_500, "v"),
        "the record as written"
    );
    // Only the first came from memory, and it has left it.
    assert_eq!(store.kept_in_memory(), (0, 0, 1));
    // A replacement and a cancel arriving through ingest do the same.
    store.apply(&[at(4, 1_200, Some("y"))], 1_000).unwrap();
    store.apply(&[at(5, 1_300, Some("y"))], 1_000).unwrap();
    store
        .apply(
            &[IngestOp::Cancel {
                pid,
                offset: 6,
                id: b"y".to_vec(),
            }],
            1_000,
        )
        .unwrap();
    assert_eq!(
        fire(&store, &[(1_200, rid(4)), (1_300, rid(5))]).gone,
        vec![rid(4), rid(5)]
    );
    assert_eq!(store.kept_in_memory(), (0, 0, 1));
    // A record due later than the window after its arrival is not kept.
    store.apply(&[at(7, 1_100, None)], 0).unwrap();
    assert_eq!(store.kept_in_memory().0, 0);
}

#[test]
fn a_claimed_record_is_skipped_by_a_second_timer_until_it_is_delivered_or_released() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    let pid = store.partition_id("delay.in", 0).unwrap();
    let ops: Vec<IngestOp> = (0..3)
        .map(|i| IngestOp::Schedule {
            pid,
            offset: i,
            schedule: sched(None, 100, "v"),
        })
        .collect();
    let timers = store.apply(&ops, 0).unwrap().inserted;
    let first = fire(&store, &timers[..2]);
    assert_eq!(first.records.len(), 2);
    // An operator moved the first later, then back: its second timer comes up while the
    // first is in flight, and a timer for the third comes up twice in one batch.
    let second = fire(&store, &[timers[0], timers[2], timers[2]]);
    assert_eq!(second.already_claimed, 2);
    assert_eq!(second.records.len(), 1);
    assert_eq!(second.records[0].id, timers[2].1);
    // The third is held by a fire limit: given back, it can be claimed again.
    store.release([timers[2].1]);
    assert_eq!(fire(&store, &[timers[2]]).records.len(), 1);
    // The first is delivered: its claim goes with it, and a late timer finds it gone.
    assert_eq!(
        store.delivered(&fired(&first)[..1], first.read_at).unwrap(),
        1
    );
    let late = fire(&store, &[timers[0]]);
    assert_eq!((late.already_claimed, late.gone.len()), (0, 1));
    // A timer earlier than its record's due time (an operator moved it later) fires nothing:
    // the timer at the new time will.
    assert_eq!(store.reschedule(timers[1].1, 5_000).unwrap(), Some(100));
    store.release([timers[1].1]);
    let early = fire(&store, &[timers[1]]);
    assert_eq!(early.moved, vec![timers[1].1]);
    assert!(early.records.is_empty());
    assert_eq!(fire(&store, &[(5_000, timers[1].1)]).records.len(), 1);
}

#[test]
fn bulk_cancels_and_moves_change_only_pending_records_in_one_write_each() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    let p = store.partition_id("delay.in", 0).unwrap();
    let ops: Vec<IngestOp> = (0..6)
        .map(|i| IngestOp::Schedule {
            pid: p,
            offset: i,
            schedule: sched_to(
                if i % 2 == 0 { "even" } else { "odd" },
                Some(&format!("id-{i}")),
                1_000 + i as u64,
                "v",
            ),
        })
        .collect();
    store.apply(&ops, 0).unwrap();
    let rid = |offset| RecordId::new(p, offset).unwrap();
    let before = changes(&store);
    // Offset 9 was never stored: it is left out of the answer; a repeated id counts once.
    let gone = store
        .cancel_many(&[rid(0), rid(1), rid(9), rid(0)])
        .unwrap();
    assert_eq!(
        gone.iter().map(|(r, _)| *r).collect::<Vec<_>>(),
        vec![rid(0), rid(1)]
    );
    assert_eq!(changes(&store), before + 1, "one write for the batch");
    assert_eq!(store.pending(), 4);
    // A cancelled record is no longer there to move; the others move with their old times.
    let moved = store
        .reschedule_many(&[rid(1), rid(2), rid(3), rid(2)], 50_000)
        .unwrap();
    assert_eq!(moved, vec![(rid(2), 1_002), (rid(3), 1_003)]);
    assert_eq!(
        pending(&store),
        vec![
            (1_004, rid(4)),
            (1_005, rid(5)),
            (50_000, rid(2)),
            (50_000, rid(3))
        ]
    );
    // The counts follow, and survive a restart.
    let stats = store.pending_stats(0);
    assert_eq!(by_target_total(&store), 4);
    assert!(stats.by_target.contains(&("even".to_owned(), 2)));
    drop(store);
    let store = open(&dir);
    assert_eq!(store.pending(), 4);
    assert_eq!(by_target_total(&store), 4);
    // An id of a cancelled record is free again; a moved one still maps to its record.
    let again = store
        .apply(
            &[IngestOp::Cancel {
                pid: p,
                offset: 6,
                id: b"id-2".to_vec(),
            }],
            0,
        )
        .unwrap();
    assert_eq!(again.cancelled, 1);
    assert_eq!(store.pending(), 3);
}

/// A record's changelog history restored into a store: `r` at offset 0 (id x), then replaced
/// by offset 1 (same id), offset 2 pending, offset 3 fired (put then gone), source offset 4.
fn history() -> Vec<Restored> {
    vec![
        Restored::Record {
            offset: 0,
            record: sched(Some("x"), 5_000, "first"),
        },
        Restored::Record {
            offset: 1,
            record: sched(Some("x"), 6_000, "second"),
        },
        Restored::Gone { offset: 0 },
        Restored::Record {
            offset: 2,
            record: sched_to("other", None, 7_000, "third"),
        },
        Restored::Record {
            offset: 3,
            record: sched(None, 8_000, "fourth"),
        },
        Restored::Gone { offset: 3 },
        Restored::SourceOffset(4),
    ]
}

#[test]
fn a_restore_rebuilds_records_ids_counts_and_offset_and_applying_it_again_changes_nothing() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    let pid = store.partition_id("delay.in", 0).unwrap();
    let at = Checkpoint {
        changelog_next: 7,
        source_next: Some(4),
    };
    let rid = |o| RecordId::new(pid, o).unwrap();
    let want = vec![(6_000, rid(1)), (7_000, rid(2))];
    assert_eq!(store.restore(pid, &history(), at, &mut None).unwrap(), 2);
    assert_eq!(pending(&store), want);
    // A tail re-applied (a restart reads from an older checkpoint) is idempotent, and so is a
    // restore split in chunks at any point.
    assert_eq!(store.restore(pid, &history(), at, &mut None).unwrap(), 0);
    for (a, b) in [(0, 3), (3, 7)] {
        store.restore(pid, &history()[a..b], at, &mut None).unwrap();
    }
    assert_eq!(pending(&store), want);
    assert_eq!(store.pending(), 2);
    assert_eq!(by_target_total(&store), 2);
    assert_eq!(store.find_id(b"x").unwrap(), vec![(6_000, rid(1))]);
    assert_eq!(store.next_offset(pid).unwrap(), Some(4));
    assert_eq!(store.count_partition(pid).unwrap(), 2);
    assert_eq!(store.checkpoint(pid).unwrap(), Some(at));
    // A record moved by an operator elsewhere arrives as the same offset with a new due time.
    store
        .restore(
            pid,
            &[Restored::Record {
                offset: 2,
                record: sched_to("other", None, 9_000, "third"),
            }],
            at,
            &mut None,
        )
        .unwrap();
    assert_eq!(pending(&store), vec![(6_000, rid(1)), (9_000, rid(2))]);
    assert_eq!(store.pending(), 2);
    drop(store);
    let store = open(&dir);
    assert_eq!(store.pending(), 2, "counts survive a reopen");
    assert_eq!(store.checkpoint(pid).unwrap(), Some(at));
}

#[test]
fn a_restore_onto_an_empty_partition_skips_reads_and_ends_as_one_that_reads() {
    let at = Checkpoint {
        changelog_next: 7,
        source_next: Some(4),
    };
    let mut history = history();
    // An operator moved offset 2 after offset 3 was written: a key seen again, below the
    // highest put so far, which must be read.
    history.push(Restored::Record {
        offset: 2,
        record: sched_to("other", None, 9_000, "third"),
    });
    let restored = |absent: Option<i64>, chunks: &[(usize, usize)]| {
        let dir = TempDir::new().unwrap();
        let store = open(&dir);
        let pid = store.partition_id("delay.in", 0).unwrap();
        let mut absent_above = absent;
        for &(a, b) in chunks {
            store
                .restore(pid, &history[a..b], at, &mut absent_above)
                .unwrap();
        }
        (
            pending(&store),
            store.pending(),
            by_target_total(&store),
            absent_above,
        )
    };
    let reading = restored(None, &[(0, 8)]);
    for chunks in [&[(0, 8)][..], &[(0, 2), (2, 5), (5, 8)]] {
        let fresh = restored(Some(-1), chunks);
        assert_eq!(fresh.0, reading.0);
        assert_eq!((fresh.1, fresh.2), (reading.1, reading.2));
        assert_eq!(fresh.3, Some(3), "moved past every record put");
    }
    assert_eq!(reading.1, 2);
}

#[test]
fn dropping_a_partition_removes_only_its_state() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    let (mine, theirs) = (
        store.partition_id("delay.in", 0).unwrap(),
        store.partition_id("delay.in", 1).unwrap(),
    );
    let at = Checkpoint {
        changelog_next: 7,
        source_next: Some(4),
    };
    store.restore(mine, &history(), at, &mut None).unwrap();
    store.restore(theirs, &history(), at, &mut None).unwrap();
    assert_eq!(store.pending(), 4);
    assert_eq!(store.partitions_with_state(), vec![mine, theirs]);
    assert_eq!(store.drop_partition(theirs).unwrap(), 2);
    assert_eq!(store.pending(), 2);
    assert_eq!(by_target_total(&store), 2);
    assert!(pending(&store).iter().all(|(_, r)| r.pid() == mine));
    assert_eq!(store.find_id(b"x").unwrap().len(), 1);
    assert_eq!(store.checkpoint(theirs).unwrap(), None);
    assert_eq!(store.next_offset(theirs).unwrap(), None);
    assert_eq!(store.partitions_with_state(), vec![mine]);
}

#[test]
fn with_ownership_tracked_only_owned_partitions_fire_and_a_disown_reports_what_is_in_flight() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    let (a, b) = (
        store.partition_id("delay.in", 0).unwrap(),
        store.partition_id("delay.in", 1).unwrap(),
    );
    let timers = [
        (1, RecordId::new(a, 0).unwrap()),
        (1, RecordId::new(b, 0).unwrap()),
    ];
    for pid in [a, b] {
        store
            .apply(
                &[IngestOp::Schedule {
                    pid,
                    offset: 0,
                    schedule: sched(None, 1, "v"),
                }],
                0,
            )
            .unwrap();
    }
    // Without a changelog every partition fires.
    assert_eq!(store.owned_partitions(), 2);
    store.track_ownership();
    assert_eq!(store.owned_partitions(), 0);
    let batch = fire(&store, &timers);
    assert_eq!((batch.records.len(), batch.not_owned), (0, 2));
    store.own(a);
    let batch = fire(&store, &timers);
    assert_eq!((batch.records.len(), batch.not_owned), (1, 1));
    assert_eq!(batch.records[0].id.pid(), a);
    assert_eq!(store.disown(a), 1, "one record of a is being published");
    assert!(!store.owns(a));
    store.delivered(&fired(&batch), batch.read_at).unwrap();
    assert_eq!(store.claimed_in(a), 0);
}
