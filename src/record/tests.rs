use super::*;
use proptest::prelude::*;

const NOW: u64 = 1_763_700_000_000;

fn contract() -> Contract {
    Contract {
        source_pattern: Regex::new(r"^delay\..+").unwrap(),
        target_allow: None,
        allow_internal_targets: false,
        max_delay_ms: 365 * 86_400_000,
        max_record_bytes: 1_000,
    }
}

fn h(k: &str, v: &str) -> Header {
    Header::new(k, v)
}

fn run(topic: &str, headers: &[Header], value: Option<&[u8]>) -> Result<Command, Reject> {
    run_keyed(topic, headers, Some(b"k"), value)
}

fn run_keyed(
    topic: &str,
    headers: &[Header],
    key: Option<&[u8]>,
    value: Option<&[u8]>,
) -> Result<Command, Reject> {
    contract().interpret(
        &Incoming {
            topic,
            timestamp_ms: Some(NOW - 1_000),
            key,
            value,
            headers,
        },
        NOW,
    )
}

fn schedule(r: Result<Command, Reject>) -> Schedule {
    match r {
        Ok(Command::Schedule(s)) => s,
        other => panic!("expected a schedule, got {other:?}"),
    }
}

fn reason(r: Result<Command, Reject>) -> Reason {
    match r {
        Err(rej) => {
            assert!(!rej.detail.is_empty());
            rej.reason
        }
        other => panic!("expected a reject, got {other:?}"),
    }
}

#[test]
fn delay_until_in_epoch_ms_and_rfc3339() {
    let s = schedule(run(
        "delay.in",
        &[
            h("delay-target", "orders"),
            h("delay-until", "1763700060000"),
        ],
        Some(b"v"),
    ));
    assert_eq!(s.due_ms, NOW + 60_000);
    assert_eq!(s.target, "orders");
    let s = schedule(run(
        "delay.in",
        &[
            h("delay-target", "orders"),
            h("delay-until", "2025-11-21T04:41:00Z"),
        ],
        Some(b"v"),
    ));
    assert_eq!(s.due_ms, NOW + 60_000);
}

#[test]
fn delay_after_is_relative_to_the_record_timestamp() {
    for (after, ms) in [
        ("5000", 5_000),
        ("5s", 5_000),
        ("1h30m", 5_400_000),
        ("0", 0),
    ] {
        let s = schedule(run(
            "delay.in",
            &[h("delay-target", "t"), h("delay-after", after)],
            Some(b"v"),
        ));
        assert_eq!(s.due_ms, NOW - 1_000 + ms, "{after}");
    }
}

#[test]
fn the_topic_name_gives_a_fixed_delay() {
    let s = schedule(run("delay.30s", &[h("delay-target", "t")], Some(b"v")));
    assert_eq!(s.due_ms, NOW - 1_000 + 30_000);
    let s = schedule(run(
        "delay.30s",
        &[h("delay-target", "t"), h("delay-after", "1s")],
        Some(b"v"),
    ));
    assert_eq!(
        s.due_ms,
        NOW - 1_000 + 1_000,
        "a header wins over the topic name"
    );
    assert_eq!(
        reason(run("delay.orders", &[h("delay-target", "t")], Some(b"v"))),
        Reason::MissingDueTime
    );
}

#[test]
fn key_value_and_user_headers_are_kept_control_headers_dropped() {
    let s = schedule(run(
        "delay.in",
        &[
            h("delay-target", "t"),
            h("delay-after", "1s"),
            h("trace-id", "abc"),
            Header {
                key: "empty".into(),
                value: None,
            },
            h("delay-origin-topic", "spoofed"),
            h("trace-id", "second"),
        ],
        Some(b"payload"),
    ));
    assert_eq!(s.key.as_deref(), Some(&b"k"[..]));
    assert_eq!(s.value.as_deref(), Some(&b"payload"[..]));
    assert_eq!(
        s.headers,
        vec![
            h("trace-id", "abc"),
            Header {
                key: "empty".into(),
                value: None
            },
            h("trace-id", "second")
        ]
    );
}

#[test]
fn delay_id_reschedules_and_a_null_value_cancels() {
    let s = schedule(run(
        "delay.in",
        &[
            h("delay-target", "t"),
            h("delay-after", "1s"),
            h("delay-id", "job-1"),
        ],
        Some(b"v"),
    ));
    assert_eq!(s.id.as_deref(), Some(&b"job-1"[..]));
    assert_eq!(
        run("delay.in", &[h("delay-id", "job-1")], None),
        Ok(Command::Cancel {
            id: b"job-1".to_vec()
        })
    );
    // A tombstone without an id is a payload like any other.
    let s = schedule(run(
        "delay.in",
        &[h("delay-target", "compacted"), h("delay-after", "1s")],
        None,
    ));
    assert_eq!(s.value, None);
}

#[test]
fn etf1_scheduler_headers_are_understood() {
    let s = schedule(run_keyed(
        "schedules",
        &[
            h("scheduler-epoch", "1763700120"),
            h("scheduler-target-topic", "out"),
            h("scheduler-target-key", "target-key"),
        ],
        Some(b"schedule-7"),
        Some(b"v"),
    ));
    assert_eq!(s.due_ms, NOW + 120_000);
    assert_eq!(s.target, "out");
    assert_eq!(s.id.as_deref(), Some(&b"schedule-7"[..]));
    assert_eq!(s.key.as_deref(), Some(&b"target-key"[..]));
    assert!(s.headers.is_empty());
    assert_eq!(
        run_keyed("schedules", &[], Some(b"schedule-7"), None),
        Ok(Command::Cancel {
            id: b"schedule-7".to_vec()
        })
    );
    assert_eq!(
        reason(run_keyed(
            "schedules",
            &[
                h("scheduler-epoch", "1763700120"),
                h("scheduler-target-topic", "out")
            ],
            None,
            Some(b"v")
        )),
        Reason::MissingId
    );
}

#[test]
fn every_bad_input_class_has_its_reason() {
    let t = || h("delay-target", "t");
    let after = || h("delay-after", "1s");
    let cases: Vec<(Vec<Header>, Reason)> = vec![
        (vec![after()], Reason::MissingTarget),
        (vec![h("delay-target", ""), after()], Reason::InvalidTarget),
        (
            vec![h("delay-target", &"x".repeat(250)), after()],
            Reason::InvalidTarget,
        ),
        (
            vec![h("delay-target", "a/b"), after()],
            Reason::InvalidTarget,
        ),
        (
            vec![h("delay-target", ".."), after()],
            Reason::InvalidTarget,
        ),
        (
            vec![h("delay-target", "__consumer_offsets"), after()],
            Reason::TargetInternal,
        ),
        (
            vec![h("delay-target", "delay.5m"), after()],
            Reason::TargetLoop,
        ),
        (vec![t()], Reason::MissingDueTime),
        (vec![t(), h("delay-until", "-5")], Reason::InvalidDueTime),
        (
            vec![t(), h("delay-until", "1.7e12")],
            Reason::InvalidDueTime,
        ),
        (
            vec![t(), h("delay-until", "99999999999999999999999")],
            Reason::InvalidDueTime,
        ),
        (
            vec![t(), h("delay-until", "1763700000")],
            Reason::InvalidDueTime,
        ),
        (vec![t(), h("delay-after", "-1000")], Reason::InvalidDueTime),
        (vec![t(), h("delay-after", "1.5s")], Reason::InvalidDueTime),
        (vec![t(), h("delay-after", "soon")], Reason::InvalidDueTime),
        (
            vec![t(), h("delay-after", "9223372036854775807")],
            Reason::DueTooFar,
        ),
        (vec![t(), h("delay-after", "400d")], Reason::DueTooFar),
        (
            vec![t(), after(), h("delay-until", "1763700060000")],
            Reason::ConflictingDueTime,
        ),
        (
            vec![t(), h("delay-after", "1s"), h("delay-after", "2s")],
            Reason::ConflictingHeaders,
        ),
        (
            vec![h("delay-target", "a"), h("delay-target", "b"), after()],
            Reason::ConflictingHeaders,
        ),
        (
            vec![
                Header {
                    key: "delay-target".into(),
                    value: Some(vec![0xff, 0xfe]),
                },
                after(),
            ],
            Reason::InvalidHeader,
        ),
        (
            vec![
                Header {
                    key: "delay-target".into(),
                    value: None,
                },
                after(),
            ],
            Reason::InvalidHeader,
        ),
    ];
    for (headers, want) in cases {
        assert_eq!(
            reason(run("delay.in", &headers, Some(b"v"))),
            want,
            "{headers:?}"
        );
    }
    // Identical repeats are fine.
    schedule(run("delay.in", &[t(), t(), after(), after()], Some(b"v")));
    assert_eq!(
        reason(run("delay.in", &[t(), after()], Some(&[0u8; 1_001]))),
        Reason::Oversized
    );
}

#[test]
fn the_allow_list_and_internal_switch() {
    let mut c = contract();
    c.target_allow = Some(Regex::new("^orders\\.").unwrap());
    assert_eq!(c.check_target("orders.eu"), Ok(()));
    assert_eq!(
        c.check_target("payments").unwrap_err().reason,
        Reason::TargetNotAllowed
    );
    c.target_allow = None;
    c.allow_internal_targets = true;
    assert_eq!(c.check_target("__internal"), Ok(()));
}

#[test]
fn a_due_time_in_the_past_is_accepted() {
    let s = schedule(run(
        "delay.in",
        &[h("delay-target", "t"), h("delay-until", "1700000000000")],
        Some(b"v"),
    ));
    assert_eq!(s.due_ms, 1_700_000_000_000);
}

fn header() -> impl Strategy<Value = Header> {
    let names = prop_oneof![
        Just("delay-target".to_owned()),
        Just("delay-until".to_owned()),
        Just("delay-after".to_owned()),
        Just("delay-id".to_owned()),
        Just("scheduler-epoch".to_owned()),
        Just("scheduler-target-topic".to_owned()),
        Just("scheduler-target-key".to_owned()),
        "[a-z-]{1,12}",
    ];
    let values = prop::option::of(prop_oneof![
        prop::collection::vec(any::<u8>(), 0..16),
        "[0-9]{0,22}".prop_map(String::into_bytes),
        "-?[0-9]{1,6}(ms|s|m|h|d)?".prop_map(String::into_bytes),
        "[a-z._-]{0,10}".prop_map(String::into_bytes),
    ]);
    (names, values).prop_map(|(key, value)| Header { key, value })
}

proptest! {
    /// Any headers at all: never a panic, and a schedule is never further than the maximum
    /// delay, never to an illegal, internal or looping target, and never carries a reserved header.
    #[test]
    fn interpret_is_total_and_its_schedules_are_valid(
        headers in prop::collection::vec(header(), 0..6),
        key in prop::option::of(prop::collection::vec(any::<u8>(), 0..8)),
        value in prop::option::of(prop::collection::vec(any::<u8>(), 0..8)),
        topic in prop_oneof![Just("delay.in".to_owned()), Just("delay.5s".to_owned()), "[a-z.0-9]{1,10}"],
    ) {
        let c = contract();
        let rec = Incoming { topic: &topic, timestamp_ms: Some(NOW), key: key.as_deref(), value: value.as_deref(), headers: &headers };
        if let Ok(Command::Schedule(s)) = c.interpret(&rec, NOW) {
            prop_assert!(s.due_ms <= NOW + c.max_delay_ms);
            prop_assert!(c.check_target(&s.target).is_ok());
            prop_assert!(s.headers.iter().all(|h| !is_reserved(&h.key)));
        }
    }
}
