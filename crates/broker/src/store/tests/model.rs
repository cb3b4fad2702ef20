//! The store against a model (`BTreeMap<(due, id), _>`) under random operations.

use super::*;

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
