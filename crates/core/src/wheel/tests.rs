use super::*;
use proptest::prelude::*;
use std::collections::BTreeMap;

const BASE: u64 = 1_763_700_000_000; // an epoch-ms time in 2025

fn drain(wheel: &mut Wheel<u64>, now: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    while let Some(e) = wheel.poll(now) {
        out.push(e);
    }
    out
}

#[test]
fn fires_at_the_due_millisecond_and_not_before() {
    for delay in [
        1u64,
        63,
        64,
        65,
        4_095,
        4_096,
        262_144,
        3_600_000,
        86_400_000 * 30,
    ] {
        let mut wheel = Wheel::new(BASE);
        wheel.insert(BASE + delay, 7).unwrap();
        assert!(
            drain(&mut wheel, BASE + delay - 1).is_empty(),
            "early at {delay}"
        );
        assert_eq!(
            drain(&mut wheel, BASE + delay),
            vec![(BASE + delay, 7)],
            "delay {delay}"
        );
        assert!(wheel.is_empty());
    }
}

#[test]
fn an_insert_already_due_is_handed_back() {
    let mut wheel = Wheel::new(BASE);
    assert_eq!(
        wheel.insert(BASE, 1),
        Err(Elapsed {
            due: BASE,
            value: 1
        })
    );
    assert_eq!(
        wheel.insert(BASE - 10, 2),
        Err(Elapsed {
            due: BASE - 10,
            value: 2
        })
    );
    assert!(wheel.is_empty());
}

#[test]
fn same_millisecond_fires_in_insertion_order() {
    let mut wheel = Wheel::new(BASE);
    for v in 0..100 {
        wheel.insert(BASE + 5_000, v).unwrap();
    }
    let fired: Vec<u64> = drain(&mut wheel, BASE + 5_000)
        .into_iter()
        .map(|e| e.1)
        .collect();
    assert_eq!(fired, (0..100).collect::<Vec<_>>());
}

#[test]
fn cancel_is_honoured_and_a_stale_handle_does_nothing() {
    let mut wheel = Wheel::new(BASE);
    let a = wheel.insert(BASE + 100, 1).unwrap();
    let b = wheel.insert(BASE + 100, 2).unwrap();
    assert!(wheel.cancel(a));
    assert!(!wheel.cancel(a), "cancelled twice");
    assert_eq!(wheel.len(), 1);
    assert_eq!(drain(&mut wheel, BASE + 100), vec![(BASE + 100, 2)]);
    assert!(!wheel.cancel(b), "already fired");
    // The cancelled entry's index is reclaimed and reused; the old handle must not touch the
    // new entry.
    assert_eq!(wheel.allocated(), 0);
    let c = wheel.insert(BASE + 200, 3).unwrap();
    assert!(!wheel.cancel(a));
    assert!(!wheel.cancel(b));
    assert!(wheel.cancel(c));
    assert!(
        drain(&mut wheel, BASE + 200).is_empty(),
        "cancelled, not handed out"
    );
}

#[test]
fn next_deadline_is_never_after_the_earliest_due() {
    let mut wheel = Wheel::new(BASE);
    assert_eq!(wheel.next_deadline(), None);
    wheel.insert(BASE + 10_000, 1).unwrap();
    wheel.insert(BASE + 70, 2).unwrap();
    let d = wheel.next_deadline().unwrap();
    assert!(d <= BASE + 70 && d > BASE);
}

#[test]
fn entries_beyond_the_wheel_range_wait_in_the_overflow_and_fire_on_time() {
    let mut wheel = Wheel::new(BASE);
    let far = BASE + RANGE_MS + 12_345;
    wheel.insert(far, 9).unwrap();
    let mut now = BASE;
    // Walk time forward in big steps the way a scheduler would, by deadlines.
    while let Some(d) = wheel.next_deadline() {
        assert!(d <= far);
        if d == far {
            break;
        }
        now = d;
        assert!(drain(&mut wheel, now).is_empty());
    }
    assert!(now < far);
    assert_eq!(drain(&mut wheel, far), vec![(far, 9)]);
}

#[test]
fn a_clock_going_backwards_fires_nothing_early() {
    let mut wheel = Wheel::new(BASE);
    wheel.insert(BASE + 1_000, 1).unwrap();
    assert!(drain(&mut wheel, BASE + 500).is_empty());
    assert!(drain(&mut wheel, BASE - 3_600_000).is_empty());
    assert_eq!(wheel.elapsed(), BASE + 500);
    assert_eq!(drain(&mut wheel, BASE + 1_000), vec![(BASE + 1_000, 1)]);
}

#[test]
fn a_big_jump_forward_fires_everything_that_became_due() {
    let mut wheel = Wheel::new(BASE);
    for i in 0..1_000u64 {
        wheel.insert(BASE + 1 + i * 3_700, i).unwrap();
    }
    let fired = drain(&mut wheel, BASE + 3_700 * 500);
    assert_eq!(fired.len(), 500); // due BASE+1+i*3700 <= BASE+3700*500 for i in 0..500
    assert!(fired.windows(2).all(|w| w[0].0 <= w[1].0), "in due order");
}

#[derive(Debug, Clone)]
enum Op {
    /// Insert at `now + delta` (delta 0 means already due).
    Insert(u64),
    /// Cancel the n-th handle ever returned (it may be fired or cancelled already).
    Cancel(usize),
    /// Move time forward by this much and drain.
    Advance(u64),
    /// Move the clock back by this much and drain.
    Back(u64),
}

fn delta() -> impl Strategy<Value = u64> {
    prop_oneof![
        0u64..3,
        0u64..200,
        0u64..100_000,
        0u64..(86_400_000 * 30),
        (RANGE_MS - 5_000)..(RANGE_MS * 2),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => delta().prop_map(Op::Insert),
        1 => any::<usize>().prop_map(Op::Cancel),
        3 => delta().prop_map(Op::Advance),
        1 => (0u64..10_000).prop_map(Op::Back),
    ]
}

fn start() -> impl Strategy<Value = u64> {
    prop_oneof![
        BASE..BASE + 1_000_000,
        // Just before a 2^36 ms block boundary, where the overflow list is re-sorted.
        Just(((BASE >> 36) + 1) << 36).prop_flat_map(|b| (b - 100_000)..b),
        0u64..100,
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// The wheel against an ordered map: the same entries fire, none early, none lost, none
    /// twice, cancels honoured, and `next_deadline` never after the earliest due entry.
    #[test]
    fn behaves_like_an_ordered_map(start in start(), ops in prop::collection::vec(op(), 1..200)) {
        let mut wheel = Wheel::new(start);
        let mut model: BTreeMap<(u64, u64), ()> = BTreeMap::new();
        let mut handles: Vec<(Handle, u64, u64)> = Vec::new();
        let mut clock = start;
        let mut high_water = start; // the latest time the wheel has been advanced to
        let mut seq = 0u64;
        for op in ops {
            match op {
                Op::Insert(d) => {
                    let due = clock.saturating_add(d);
                    seq += 1;
                    match wheel.insert(due, seq) {
                        Ok(h) => {
                            prop_assert!(due > high_water);
                            model.insert((due, seq), ());
                            handles.push((h, due, seq));
                        }
                        Err(e) => {
                            prop_assert!(due <= high_water);
                            prop_assert_eq!(e, Elapsed { due, value: seq });
                        }
                    }
                }
                Op::Cancel(n) => {
                    if handles.is_empty() { continue; }
                    let (h, due, v) = handles[n % handles.len()];
                    let live = model.remove(&(due, v)).is_some();
                    prop_assert_eq!(wheel.cancel(h), live);
                }
                Op::Advance(d) | Op::Back(d) => {
                    clock = if matches!(op, Op::Advance(_)) { clock.saturating_add(d) } else { clock.saturating_sub(d) };
                    high_water = high_water.max(clock);
                    while let Some((due, v)) = wheel.poll(clock) {
                        prop_assert!(due <= clock, "early: due {} now {}", due, clock);
                        prop_assert!(model.remove(&(due, v)).is_some(), "fired twice or never inserted: {} {}", due, v);
                    }
                    if let Some((&(first_due, _), _)) = model.iter().next() {
                        prop_assert!(first_due > high_water, "late: {} still held at {}", first_due, high_water);
                        let deadline = wheel.next_deadline();
                        prop_assert!(deadline.is_some_and(|d| d <= first_due && d > high_water),
                            "next_deadline {:?} vs first due {}", deadline, first_due);
                    }
                }
            }
            prop_assert_eq!(wheel.len(), model.len());
        }
        // Everything left fires by walking deadlines to the end.
        while let Some(d) = wheel.next_deadline() {
            let now = d.max(clock);
            while let Some((due, v)) = wheel.poll(now) {
                prop_assert!(due <= now);
                prop_assert!(model.remove(&(due, v)).is_some());
            }
            clock = now;
        }
        prop_assert!(model.is_empty(), "lost: {:?}", model);
        prop_assert_eq!(wheel.allocated(), 0);
    }
}

#[test]
fn an_entry_found_due_is_handed_out_even_if_cancelled_between_polls() {
    let mut wheel = Wheel::new(BASE);
    let a = wheel.insert(BASE + 10, 1).unwrap();
    let b = wheel.insert(BASE + 10, 2).unwrap();
    assert_eq!(wheel.poll(BASE + 10), Some((BASE + 10, 1)));
    assert_eq!(wheel.len(), 1, "the second is queued, still held");
    assert!(!wheel.cancel(a), "handed out");
    assert!(!wheel.cancel(b), "found due: too late to cancel");
    assert_eq!(wheel.poll(BASE + 10), Some((BASE + 10, 2)));
    assert!(wheel.is_empty());
}
