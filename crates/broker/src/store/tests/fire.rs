//! The fire path: claims, the delete after delivery, the due index's gathered deletes, records kept in memory.

use super::*;

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
