use std::collections::BTreeMap;

use super::*;

const T0: u64 = 1_763_700_000_000;

fn limits(rules: &[&str], global: Option<&str>) -> Limits {
    Limits {
        rules: rules
            .iter()
            .map(|r| Limits::parse_rule(r).unwrap())
            .collect(),
        global: global.map(|g| Limits::parse_global(g).unwrap()),
    }
}

fn rid(n: u64) -> RecordId {
    RecordId(n)
}

/// The broker's loop in miniature: timers come up in time order (ties in id order), each is
/// decided at its time, a hold puts it back. Returns `(id, target, sent_ms)` in sending order.
fn run(limiter: &mut Limiter, records: &[(u64, &str, u64)]) -> Vec<(u64, String, u64)> {
    let mut timers: BTreeMap<(u64, u64), (String, u64)> = records
        .iter()
        .map(|&(id, target, due)| ((due, id), (target.to_owned(), due)))
        .collect();
    let mut sent = Vec::new();
    while let Some(((at, id), (target, due))) = timers.pop_first() {
        match limiter.decide(rid(id), &target, due, at) {
            Decision::Go { released_ms } => {
                assert!(released_ms >= due && released_ms <= at);
                sent.push((id, target, at));
            }
            Decision::Hold { until_ms } => {
                assert!(until_ms > at);
                timers.insert((until_ms, id), (target, due));
            }
            Decision::Early => panic!("no second timer here"),
        }
    }
    assert_eq!(limiter.held(), 0);
    sent
}

#[test]
fn a_limited_target_goes_out_at_its_rate_in_due_order_and_never_early() {
    let mut l = Limiter::new(limits(&["^orders$=100/s"], None));
    let wave: Vec<(u64, &str, u64)> = (0..2_000).map(|i| (i, "orders", T0)).collect();
    let sent = run(&mut l, &wave);
    assert_eq!(sent.len(), 2_000);
    let ids: Vec<u64> = sent.iter().map(|s| s.0).collect();
    assert_eq!(
        ids,
        (0..2_000).collect::<Vec<_>>(),
        "due order, then id order"
    );
    for (i, (_, _, at)) in sent.iter().enumerate() {
        assert_eq!(*at, T0 + 10 * i as u64, "record {i}");
    }
}

#[test]
fn other_targets_are_not_held_by_a_limited_one() {
    let mut l = Limiter::new(limits(&["^orders$=100/s"], None));
    let mut records: Vec<(u64, &str, u64)> = (0..2_000).map(|i| (i, "orders", T0)).collect();
    records.extend((2_000..2_500).map(|i| (i, "emails", T0)));
    records.extend((2_500..3_000).map(|i| (i, "sms", T0 + 1)));
    let sent = run(&mut l, &records);
    for (id, target, at) in &sent {
        match target.as_str() {
            "emails" => assert_eq!(*at, T0, "{id}"),
            "sms" => assert_eq!(*at, T0 + 1, "{id}"),
            _ => {}
        }
    }
    let last = sent.iter().filter(|s| s.1 == "orders").map(|s| s.2).max();
    assert_eq!(last, Some(T0 + 19_990));
}

#[test]
fn a_burst_goes_at_once_then_the_pace_holds() {
    let mut l = Limiter::new(limits(&["^orders$=10/s,burst=5"], None));
    let sent = run(
        &mut l,
        &(0..8).map(|i| (i, "orders", T0)).collect::<Vec<_>>(),
    );
    let at: Vec<u64> = sent.iter().map(|s| s.2 - T0).collect();
    assert_eq!(at, vec![0, 0, 0, 0, 0, 100, 200, 300]);
}

#[test]
fn a_pace_above_a_thousand_a_second_shares_milliseconds_without_lagging() {
    let mut l = Limiter::new(limits(&["^t$=4000/s"], None));
    let sent = run(
        &mut l,
        &(0..4_000).map(|i| (i, "t", T0)).collect::<Vec<_>>(),
    );
    let last = sent.last().unwrap().2;
    assert_eq!(last, T0 + 999);
    // Never more than four in a millisecond.
    let mut per_ms: BTreeMap<u64, u32> = BTreeMap::new();
    for s in &sent {
        *per_ms.entry(s.2).or_default() += 1;
    }
    assert!(per_ms.values().all(|&n| n <= 4));
}

#[test]
fn the_global_limit_paces_every_target_together() {
    let mut l = Limiter::new(limits(&[], Some("100/s")));
    let records: Vec<(u64, &str, u64)> = (0..100)
        .map(|i| (i, if i % 2 == 0 { "a" } else { "b" }, T0))
        .collect();
    let sent = run(&mut l, &records);
    for (i, s) in sent.iter().enumerate() {
        assert_eq!(s.2, T0 + 10 * i as u64);
    }
}

#[test]
fn a_target_limit_and_the_global_limit_both_hold() {
    let mut l = Limiter::new(limits(&["^slow$=10/s"], Some("100/s")));
    let mut records: Vec<(u64, &str, u64)> = (0..20).map(|i| (i, "slow", T0)).collect();
    records.extend((20..120).map(|i| (i, "fast", T0)));
    let sent = run(&mut l, &records);
    let slow: Vec<u64> = sent.iter().filter(|s| s.1 == "slow").map(|s| s.2).collect();
    assert!(slow.windows(2).all(|w| w[1] - w[0] >= 100), "{slow:?}");
    let mut all: Vec<u64> = sent.iter().map(|s| s.2).collect();
    all.sort_unstable();
    assert!(all.windows(2).all(|w| w[1] - w[0] >= 10), "{all:?}");
    // The slow target's line does not reserve global capacity ahead of time: the fast records
    // take the global pace as they come, one every 10 ms after the first slow one, and the
    // slow ones then go at their own pace.
    let fast_last = sent.iter().filter(|s| s.1 == "fast").map(|s| s.2).max();
    assert_eq!(fast_last, Some(T0 + 1_000));
    assert_eq!(slow.last(), Some(&(T0 + 2_810)));
}

#[test]
fn a_long_line_on_one_target_does_not_hold_up_others_under_a_global_limit() {
    let mut l = Limiter::new(limits(&["^slow$=1/s"], Some("1000/s")));
    let mut records: Vec<(u64, &str, u64)> = (0..1_000).map(|i| (i, "slow", T0)).collect();
    records.extend((1_000..1_100).map(|i| (i, "fast", T0 + 1)));
    let sent = run(&mut l, &records);
    let fast_last = sent
        .iter()
        .filter(|s| s.1 == "fast")
        .map(|s| s.2)
        .max()
        .unwrap();
    // 100 fast records at 1,000/s: about 100 ms, not behind the slow target's 1,000 s line.
    assert!(
        fast_last <= T0 + 1 + 101,
        "the last fast record went at T0 + {}",
        fast_last - T0
    );
}

#[test]
fn a_spread_wave_goes_within_its_window_never_early_and_the_same_after_a_restart() {
    let rules = ["^reminders$=spread=10s"];
    let wave: Vec<(u64, &str, u64)> = (0..1_000).map(|i| (i, "reminders", T0)).collect();
    let first = run(&mut Limiter::new(limits(&rules, None)), &wave);
    assert!(first.iter().all(|s| (T0..T0 + 10_000).contains(&s.2)));
    // Spread over the window: every second of it gets some.
    for second in 0..10 {
        let n = first
            .iter()
            .filter(|s| (s.2 - T0) / 1_000 == second)
            .count();
        assert!((50..=150).contains(&n), "second {second}: {n}");
    }
    let again = run(&mut Limiter::new(limits(&rules, None)), &wave);
    let times = |v: &[(u64, String, u64)]| {
        let mut t: Vec<(u64, u64)> = v.iter().map(|s| (s.0, s.2)).collect();
        t.sort_unstable();
        t
    };
    assert_eq!(times(&first), times(&again));
}

#[test]
fn a_spread_and_a_rate_together_pace_the_spread_records() {
    let mut l = Limiter::new(limits(&["^r$=10/s,spread=1s"], None));
    let sent = run(&mut l, &(0..30).map(|i| (i, "r", T0)).collect::<Vec<_>>());
    let at: Vec<u64> = sent.iter().map(|s| s.2).collect();
    assert!(at.iter().all(|&t| t >= T0));
    assert!(at.windows(2).all(|w| w[1] - w[0] >= 100), "{at:?}");
}

#[test]
fn a_second_timer_before_the_release_is_dropped_and_a_forgotten_record_is_not_held() {
    let mut l = Limiter::new(limits(&["^t$=1/s"], None));
    assert_eq!(
        l.decide(rid(1), "t", T0, T0),
        Decision::Go { released_ms: T0 }
    );
    assert_eq!(
        l.decide(rid(2), "t", T0, T0),
        Decision::Hold {
            until_ms: T0 + 1_000
        }
    );
    assert_eq!(l.held_by_target().collect::<Vec<_>>(), vec![("t", 1)]);
    // An operator fired it now: its new timer comes before the release.
    assert_eq!(l.decide(rid(2), "t", T0 + 10, T0 + 10), Decision::Early);
    assert_eq!(
        l.decide(rid(2), "t", T0, T0 + 1_000),
        Decision::Go {
            released_ms: T0 + 1_000
        }
    );
    // Held, then cancelled: forgotten, counted no more.
    assert!(matches!(
        l.decide(rid(3), "t", T0, T0 + 1_000),
        Decision::Hold { .. }
    ));
    assert_eq!(l.forget(rid(3)), Some("t"));
    assert_eq!(l.forget(rid(3)), None);
    assert_eq!(l.held_by_target().collect::<Vec<_>>(), vec![("t", 0)]);
}

#[test]
fn unlimited_targets_are_released_at_their_due_time() {
    let mut l = Limiter::new(limits(&["^t$=1/s"], None));
    assert_eq!(
        l.decide(rid(1), "other", T0, T0 + 500),
        Decision::Go { released_ms: T0 }
    );
    assert_eq!(l.held_by_target().count(), 0);
}

#[test]
fn rules_parse_and_the_first_match_wins() {
    let l = limits(
        &["^orders\\.eu$=10/s", "^orders=1000/min,burst=20,spread=5s"],
        None,
    );
    assert_eq!(l.rule_for("orders.eu"), Some(0));
    assert_eq!(l.rule_for("orders.us"), Some(1));
    assert_eq!(l.rule_for("emails"), None);
    let r = &l.rules[1];
    let rate = r.rate.unwrap();
    assert!((rate.per_second - 1_000.0 / 60.0).abs() < 1e-9);
    assert_eq!(rate.burst, 20);
    assert_eq!(r.spread_ms, 5_000);
    assert_eq!(
        Limits::parse_global("5000/s,burst=100").unwrap(),
        Rate {
            per_second: 5_000.0,
            burst: 100
        }
    );
    assert_eq!(Limits::parse_global("36000/h").unwrap().per_second, 10.0);
}

#[test]
fn bad_rules_say_what_is_wrong() {
    for (text, says) in [
        ("orders", "use REGEX=RATE"),
        ("=100/s", "no regex"),
        ("(=100/s", "not a valid regex"),
        ("^o$=100", "give records per time unit"),
        ("^o$=100/week", "give records per time unit"),
        ("^o$=0/s", "must be more than 0"),
        ("^o$=-5/s", "must be more than 0"),
        ("^o$=2000000/s", "above the highest rate"),
        ("^o$=100/s,burst=0", "burst '0'"),
        ("^o$=100/s,burst=x", "burst 'x'"),
        ("^o$=burst=5", "burst without a rate"),
        ("^o$=100/s,spread=0s", "spread '0s'"),
        ("^o$=100/s,spread=2d", "spread '2d'"),
        ("^o$=100/s,spread=soon", "spread:"),
        ("^o$=100/s,jitter=5", "unknown key 'jitter'"),
        ("^o$=100/s,", "empty item"),
    ] {
        let err = Limits::parse_rule(text).unwrap_err();
        assert!(err.contains(says), "{text}: {err}");
    }
    for (text, says) in [
        ("fast", "give records per time unit"),
        ("100/s,burst=0", "burst '0'"),
        ("100/s,spread=1s", "is not burst=N"),
    ] {
        let err = Limits::parse_global(text).unwrap_err();
        assert!(err.contains(says), "{text}: {err}");
    }
}
