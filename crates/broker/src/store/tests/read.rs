//! Reading: kept counts, listings, due ranges, the head seek, operators' bulk actions.

use super::*;

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

#[test]
fn a_dense_read_walks_an_iterator_and_finds_what_point_reads_find() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    let (a, b) = (
        store.partition_id("delay.in", 0).unwrap(),
        store.partition_id("delay.in", 1).unwrap(),
    );
    // Partition a: offsets 0..100 and 120..300 (a gap longer than an iterator steps over);
    // partition b: 0..50. In each, offset 5 replaced by offset 7 (deleted).
    let written = |pid, offset: i64| {
        let id = match offset {
            5 | 7 => Some("same"),
            _ => None,
        };
        IngestOp::Schedule {
            pid,
            offset,
            schedule: sched(id, 1_000, &format!("v{pid}-{offset}")),
        }
    };
    let ops: Vec<IngestOp> = (0..100)
        .chain(120..300)
        .map(|o| written(a, o))
        .chain((0..50).map(|o| written(b, o)))
        .collect();
    store.apply(&ops, 0).unwrap();
    // Asked in no order, with ids that are not there, and without 150..170 (more records
    // than an iterator steps over before it seeks).
    let mut ids: Vec<RecordId> = (0..150)
        .chain(170..310)
        .map(|o| RecordId::new(a, o).unwrap())
        .chain((0..60).map(|o| RecordId::new(b, o).unwrap()))
        .collect();
    ids.reverse();
    ids.swap(3, 200);
    let sorted: Vec<(RecordId, usize)> = {
        let mut s: Vec<_> = ids.iter().copied().zip(0..).collect();
        s.sort_unstable();
        s
    };
    assert!(super::super::read::dense(&sorted), "the batch is dense");
    let walked = store.get(&ids).unwrap();
    for (id, got) in ids.iter().zip(&walked) {
        let point = store.get(&[*id]).unwrap().remove(0);
        assert_eq!(got, &point, "record {id:?}");
    }
    let values: Vec<Option<&[u8]>> = walked
        .iter()
        .map(|r| r.as_ref().and_then(|r| r.value()))
        .collect();
    let present = |pid, o: i64| {
        values[ids
            .iter()
            .position(|i| *i == RecordId::new(pid, o).unwrap())
            .unwrap()]
    };
    assert_eq!(present(a, 4), Some(&b"v0-4"[..]));
    assert_eq!(present(a, 5), None, "replaced");
    assert_eq!(present(a, 7), Some(&b"v0-7"[..]));
    assert_eq!(present(a, 110), None, "never written");
    assert_eq!(present(a, 149), Some(&b"v0-149"[..]));
    assert_eq!(present(a, 170), Some(&b"v0-170"[..]), "after the seek");
    assert_eq!(present(a, 299), Some(&b"v0-299"[..]));
    assert_eq!(present(a, 305), None);
    assert_eq!(present(b, 49), Some(format!("v{b}-49").as_bytes()));
    assert_eq!(present(b, 5), None, "replaced");
    assert_eq!(present(b, 55), None);
    assert_eq!(walked.iter().flatten().count(), 100 + 180 - 20 + 50 - 2);
}

#[test]
fn only_a_large_batch_of_close_ids_counts_as_dense() {
    let ids = |offsets: &[i64]| -> Vec<(RecordId, usize)> {
        offsets
            .iter()
            .map(|&o| (RecordId::new(0, o).unwrap(), 0))
            .collect()
    };
    let dense = super::super::read::dense;
    assert!(dense(&ids(&(0..32).collect::<Vec<_>>())));
    assert!(!dense(&ids(&(0..31).collect::<Vec<_>>())), "too few");
    assert!(dense(&ids(&(0..64).map(|o| o * 2).collect::<Vec<_>>())));
    assert!(
        !dense(&ids(&(0..64).map(|o| o * 3).collect::<Vec<_>>())),
        "too sparse"
    );
}
