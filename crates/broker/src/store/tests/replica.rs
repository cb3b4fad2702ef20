//! The store as a replica of the changelog: restores, dropping a partition, ownership.

use super::*;

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

#[test]
fn a_partition_handed_here_again_after_a_revoke_is_not_the_one_owned_before() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    let (a, b) = (
        store.partition_id("delay.in", 0).unwrap(),
        store.partition_id("delay.in", 1).unwrap(),
    );
    // Without a changelog every partition is owned, always the same way.
    assert_eq!((store.owned_since(a), store.ownership_now()), (Some(0), 0));
    store.track_ownership();
    assert_eq!(store.owned_since(a), None);
    store.own(a);
    store.own(b);
    // Read with both owned: the group's partitions are the ones it was read for.
    let read_at = store.ownership_now();
    assert!(store.owned_since(a).is_some_and(|s| s <= read_at));
    assert!(store.owned_since(b).is_some_and(|s| s <= read_at));
    // Owning what is owned changes nothing.
    store.own(a);
    assert!(store.owned_since(a).is_some_and(|s| s <= read_at));
    // Revoked and restored here again: owned, but not since the group was read.
    store.disown(a);
    assert_eq!(store.owned_since(a), None);
    store.own(a);
    assert!(store.owned_since(a).is_some_and(|s| s > read_at));
    assert!(store.owned_since(b).is_some_and(|s| s <= read_at));
}

#[test]
fn a_copys_records_are_counted_apart_from_the_owned_ones_until_it_is_owned() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    store.track_ownership();
    let (mine, theirs) = (
        store.partition_id("delay.in", 0).unwrap(),
        store.partition_id("delay.in", 1).unwrap(),
    );
    let at = Checkpoint {
        changelog_next: 7,
        source_next: Some(4),
    };
    store.restore(mine, &history(), at, &mut None).unwrap();
    store.own(mine);
    store.restore(theirs, &history(), at, &mut None).unwrap();
    let owned = |s: &Store| {
        let snap = s.owned_stats(0);
        let by_target: u64 = snap.by_target.iter().map(|t| t.1).sum();
        (by_target, snap.by_due.iter().sum::<u64>())
    };
    // Until the copy is counted, its records count as everything's.
    assert_eq!(owned(&store), (4, 4));
    assert_eq!(store.count_copy(theirs).unwrap(), 2);
    assert_eq!(owned(&store), (2, 2));
    assert_eq!(
        by_target_total(&store),
        4,
        "the store's counts keep every record"
    );
    // The copy catching up (a record put, another moved) changes its counts, not the owned.
    let more = [
        Restored::Record {
            offset: 5,
            record: sched_to("later", None, 9_000, "fifth"),
        },
        Restored::Record {
            offset: 2,
            record: sched_to("other", None, 9_500, "third"),
        },
    ];
    store.restore(theirs, &more, at, &mut None).unwrap();
    assert_eq!(owned(&store), (2, 2));
    assert_eq!(by_target_total(&store), 5);
    // Owned here: its records are this instance's.
    store.own(theirs);
    assert_eq!(owned(&store), (5, 5));
    // A copy dropped takes its counts along.
    store.disown(theirs);
    assert_eq!(store.count_copy(theirs).unwrap(), 3);
    assert_eq!(owned(&store), (2, 2));
    store.drop_partition(theirs).unwrap();
    assert_eq!(owned(&store), (2, 2));
    assert_eq!(by_target_total(&store), 2);
}
