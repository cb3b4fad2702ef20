//! Ingest: records scheduled, replaced, cancelled and moved in a batch, kept across a reopen.

use super::*;

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
fn a_record_fired_at_ingest_is_not_stored_and_replaces_the_pending_one_with_its_id() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    let p = store.partition_id("delay.in", 0).unwrap();
    let a = store
        .apply(
            &[
                IngestOp::Schedule {
                    pid: p,
                    offset: 0,
                    schedule: sched(Some("x"), 5_000, "later"),
                },
                IngestOp::Schedule {
                    pid: p,
                    offset: 1,
                    schedule: sched(Some("y"), 6_000, "kept"),
                },
            ],
            0,
        )
        .unwrap();
    let b = store
        .apply(
            &[
                IngestOp::Fire {
                    pid: p,
                    offset: 2,
                    record: sched(Some("x"), 100, "now"),
                },
                IngestOp::Fire {
                    pid: p,
                    offset: 3,
                    record: sched(None, 100, "no id"),
                },
            ],
            200,
        )
        .unwrap();
    assert!(b.inserted.is_empty(), "{:?}", b.inserted);
    assert_eq!(b.replaced, 1);
    assert_eq!(b.removed, vec![a.inserted[0].1]);
    assert_eq!(pending(&store), vec![(6_000, a.inserted[1].1)]);
    assert_eq!(store.pending(), 1);
    assert_eq!(store.next_offsets().unwrap()[&p], 4);
    // The id maps to nothing now: a record scheduled with it later replaces nothing.
    let c = store
        .apply(
            &[IngestOp::Schedule {
                pid: p,
                offset: 4,
                schedule: sched(Some("x"), 7_000, "again"),
            }],
            200,
        )
        .unwrap();
    assert_eq!(c.replaced, 0);
    assert_eq!(store.pending(), 2);
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
