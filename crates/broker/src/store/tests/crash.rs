//! A crash between every step of the durability order, and one process per directory.

use super::*;

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
