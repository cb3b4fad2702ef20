use super::*;
use proptest::prelude::*;

const NOW: u64 = 1_763_700_000_000;

fn contract() -> Contract {
    Contract {
        source_pattern: Regex::new(r"^delay\..+").unwrap(),
        target_allow: None,
        routes: Vec::new(),
        allow_internal_targets: false,
        max_delay_ms: 365 * 86_400_000,
        max_record_bytes: 1_000,
        retry: crate::retry::Retries {
            default: crate::retry::Policy::parse(
                "delay=1s,factor=2,max-delay=1m,jitter=0,max-attempts=3",
                &crate::retry::Policy::default(),
            )
            .unwrap(),
            ..crate::retry::Retries::default()
        },
    }
}

fn h(k: &str, v: &str) -> Header {
    Header::new(k, v)
}

/// The headers as a consumed record carries them.
fn refs(headers: &[Header]) -> Vec<HeaderRef<'_>> {
    headers.iter().map(Header::borrowed).collect()
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
            headers: &refs(headers),
        },
        NOW,
    )
}

fn schedule(r: Result<Command, Reject>) -> StoredRecord {
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
    assert_eq!(s.due_ms(), NOW + 60_000);
    assert_eq!(s.target(), "orders");
    let s = schedule(run(
        "delay.in",
        &[
            h("delay-target", "orders"),
            h("delay-until", "2025-11-21T04:41:00Z"),
        ],
        Some(b"v"),
    ));
    assert_eq!(s.due_ms(), NOW + 60_000);
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
        assert_eq!(s.due_ms(), NOW - 1_000 + ms, "{after}");
    }
}

#[test]
fn the_topic_name_gives_a_fixed_delay() {
    let s = schedule(run("delay.30s", &[h("delay-target", "t")], Some(b"v")));
    assert_eq!(s.due_ms(), NOW - 1_000 + 30_000);
    let s = schedule(run(
        "delay.30s",
        &[h("delay-target", "t"), h("delay-after", "1s")],
        Some(b"v"),
    ));
    assert_eq!(
        s.due_ms(),
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
    assert_eq!(s.key(), Some(&b"k"[..]));
    assert_eq!(s.value(), Some(&b"payload"[..]));
    assert_eq!(
        s.to_headers(),
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
    assert_eq!(s.id(), Some(&b"job-1"[..]));
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
    assert_eq!(s.value(), None);
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
    assert_eq!(s.due_ms(), NOW + 120_000);
    assert_eq!(s.target(), "out");
    assert_eq!(s.id(), Some(&b"schedule-7"[..]));
    assert_eq!(s.key(), Some(&b"target-key"[..]));
    assert!(s.header_count() == 0);
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
    assert_eq!(s.due_ms(), 1_700_000_000_000);
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
        Just("retry-after".to_owned()),
        Just("retry-attempt".to_owned()),
        Just("retry-max-attempts".to_owned()),
        Just("retry-first-failed-at".to_owned()),
        "[a-z-]{1,12}",
    ];
    let values = prop::option::of(prop_oneof![
        prop::collection::vec(any::<u8>(), 0..16),
        "[0-9]{0,22}".prop_map(String::into_bytes),
        "-?[0-9]{1,6}(ms|s|m|h|d)?".prop_map(String::into_bytes),
        "[a-z._-]{0,10}".prop_map(String::into_bytes),
        "(Mon|Fri), [0-9]{1,2} Nov 20[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2} GMT"
            .prop_map(String::into_bytes),
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
        topic in prop_oneof![Just("delay.in".to_owned()), Just("delay.5s".to_owned()), Just("delay.retry".to_owned()), "[a-z.0-9]{1,10}"],
    ) {
        let c = contract();
        let rec = Incoming { topic: &topic, timestamp_ms: Some(NOW), key: key.as_deref(), value: value.as_deref(), headers: &refs(&headers) };
        match c.interpret(&rec, NOW) {
            Ok(Command::Schedule(s)) => {
                prop_assert!(s.due_ms() <= NOW + c.max_delay_ms);
                prop_assert!(c.check_target(s.target()).is_ok());
                prop_assert!(s.headers().all(|h| !is_reserved(h.key)));
            }
            Ok(Command::Retry { schedule: s, attempt }) => {
                prop_assert!(s.due_ms() <= NOW + c.max_delay_ms);
                prop_assert!(c.check_target(s.target()).is_ok());
                prop_assert!((1..=3).contains(&attempt));
                prop_assert_eq!(s.headers().filter(|h| h.key == "retry-attempt").count(), 1);
                prop_assert!(s.headers().all(|h| !is_reserved(h.key) && h.key != "retry-after"));
            }
            Ok(Command::Exhausted { schedule: s, target }) => {
                prop_assert_eq!(s.target(), format!("{target}.dlt"));
                prop_assert_eq!(s.due_ms(), NOW);
                prop_assert!(s.headers().any(|h| h.key == "delay-error"));
            }
            Ok(Command::Cancel { .. }) | Err(_) => {}
        }
    }
}

fn retry(headers: &[Header]) -> Result<Command, Reject> {
    let mut all = vec![h("delay-target", "orders")];
    all.extend_from_slice(headers);
    run("delay.retry", &all, Some(b"v"))
}

fn retried(r: Result<Command, Reject>) -> (StoredRecord, u32) {
    match r {
        Ok(Command::Retry { schedule, attempt }) => (schedule, attempt),
        other => panic!("expected a retry, got {other:?}"),
    }
}

fn value_of<'a>(s: &'a StoredRecord, name: &str) -> Vec<&'a str> {
    s.headers()
        .filter(|x| x.key == name)
        .map(|x| std::str::from_utf8(x.value.unwrap()).unwrap())
        .collect()
}

const SENT: u64 = NOW - 1_000;

#[test]
fn a_first_retry_uses_the_backoff_and_starts_counting() {
    let (s, attempt) = retried(retry(&[h("app", "x")]));
    assert_eq!(attempt, 1);
    assert_eq!(s.target(), "orders");
    assert_eq!(s.due_ms(), SENT + 1_000);
    assert_eq!(value_of(&s, "retry-attempt"), ["1"]);
    assert_eq!(value_of(&s, "retry-first-failed-at"), [SENT.to_string()]);
    assert_eq!(value_of(&s, "app"), ["x"]);
    assert_eq!(s.value(), Some(&b"v"[..]));
    assert_eq!(s.key(), Some(&b"k"[..]));
}

#[test]
fn later_retries_count_up_and_back_off_exponentially() {
    let first = "1763600000000";
    for (previous, wait) in [(1, 2_000), (2, 4_000)] {
        let (s, attempt) = retried(retry(&[
            h("retry-attempt", &previous.to_string()),
            h("retry-first-failed-at", first),
            h("delay-origin-topic", "delay.retry"),
        ]));
        assert_eq!(attempt, previous + 1);
        assert_eq!(s.due_ms(), SENT + wait);
        assert_eq!(value_of(&s, "retry-attempt"), [(previous + 1).to_string()]);
        assert_eq!(value_of(&s, "retry-first-failed-at"), [first]);
        assert!(value_of(&s, "delay-origin-topic").is_empty());
    }
}

#[test]
fn retry_after_overrides_the_backoff() {
    let (s, _) = retried(retry(&[h("retry-after", "30")]));
    assert_eq!(s.due_ms(), SENT + 30_000);
    let (s, _) = retried(retry(&[h("retry-after", "250ms")]));
    assert_eq!(s.due_ms(), SENT + 250);
    let (s, _) = retried(retry(&[h("retry-after", "Fri, 21 Nov 2025 04:41:00 GMT")]));
    assert_eq!(s.due_ms(), 1_763_700_060_000);
    assert!(value_of(&s, "retry-after").is_empty(), "not carried back");
    // On any delay topic, retry-after makes the record a retry.
    let (s, attempt) = retried(run(
        "delay.in",
        &[h("delay-target", "orders"), h("retry-after", "2")],
        Some(b"v"),
    ));
    assert_eq!((attempt, s.due_ms()), (1, SENT + 2_000));
}

#[test]
fn exhausted_retries_go_to_the_targets_dead_letter_topic() {
    let r = retry(&[
        h("retry-attempt", "3"),
        h("retry-first-failed-at", "1763600000000"),
        h("retry-reason", "payment service down"),
        h("retry-after", "5"),
    ]);
    let Ok(Command::Exhausted {
        schedule: s,
        target,
    }) = r
    else {
        panic!("expected exhausted, got {r:?}");
    };
    assert_eq!(target, "orders");
    assert_eq!(s.target(), "orders.dlt");
    assert_eq!(s.due_ms(), NOW, "dead-lettered at once");
    assert_eq!(value_of(&s, "delay-error"), ["retries-exhausted"]);
    assert_eq!(value_of(&s, "delay-target"), ["orders"]);
    assert_eq!(value_of(&s, "retry-attempt"), ["3"]);
    assert_eq!(value_of(&s, "retry-first-failed-at"), ["1763600000000"]);
    assert_eq!(value_of(&s, "retry-reason"), ["payment service down"]);
    assert!(value_of(&s, "delay-error-detail")[0].contains("3 retries of 3"));
}

#[test]
fn a_malformed_retry_after_is_rejected_even_when_the_attempts_are_used_up() {
    // Two different values of retry-after: the record says two things, and is rejected to the
    // broker's dead-letter topic rather than counted as exhausted.
    let r = retry(&[
        h("retry-attempt", "3"),
        h("retry-after", "5"),
        h("retry-after", "10"),
    ]);
    let Err(rej) = r else {
        panic!("expected a rejection, got {r:?}");
    };
    assert_eq!(rej.reason, Reason::ConflictingHeaders, "{rej:?}");
}

#[test]
fn retry_max_attempts_lowers_the_limit_but_never_raises_it() {
    let lowered = retry(&[h("retry-max-attempts", "1"), h("retry-attempt", "1")]);
    assert!(
        matches!(lowered, Ok(Command::Exhausted { .. })),
        "{lowered:?}"
    );
    let (s, attempt) = retried(retry(&[h("retry-max-attempts", "1")]));
    assert_eq!(attempt, 1);
    assert_eq!(
        value_of(&s, "retry-max-attempts"),
        ["1"],
        "kept for the next pass"
    );
    let raised = retry(&[h("retry-max-attempts", "50"), h("retry-attempt", "3")]);
    assert!(
        matches!(raised, Ok(Command::Exhausted { .. })),
        "{raised:?}"
    );
    let none = retry(&[h("retry-max-attempts", "0")]);
    assert!(matches!(none, Ok(Command::Exhausted { .. })), "{none:?}");
}

#[test]
fn malformed_retry_headers_are_rejected_with_a_reason() {
    for (headers, want) in [
        (vec![h("retry-after", "soon")], Reason::InvalidRetryHeader),
        (vec![h("retry-after", "-5")], Reason::InvalidRetryHeader),
        (vec![h("retry-after", "1.5")], Reason::InvalidRetryHeader),
        (vec![h("retry-attempt", "two")], Reason::InvalidRetryHeader),
        (vec![h("retry-attempt", "-1")], Reason::InvalidRetryHeader),
        (
            vec![h("retry-attempt", "99999999999")],
            Reason::InvalidRetryHeader,
        ),
        (
            vec![h("retry-max-attempts", "1e3")],
            Reason::InvalidRetryHeader,
        ),
        (
            vec![h("retry-first-failed-at", "1763600000")],
            Reason::InvalidRetryHeader,
        ),
        (
            vec![h("retry-after", "5"), h("retry-after", "6")],
            Reason::ConflictingHeaders,
        ),
        (
            vec![h("retry-after", "5"), h("delay-after", "6s")],
            Reason::ConflictingDueTime,
        ),
        (vec![h("retry-after", "400d")], Reason::DueTooFar),
    ] {
        assert_eq!(reason(retry(&headers)), want, "{headers:?}");
    }
    let no_target = run("delay.retry", &[h("retry-after", "5")], Some(b"v"));
    assert_eq!(reason(no_target), Reason::MissingTarget);
    let mut bad = vec![h("delay-target", "orders")];
    bad.push(Header {
        key: "retry-after".into(),
        value: Some(vec![0xff]),
    });
    assert_eq!(
        reason(run("delay.retry", &bad, Some(b"v"))),
        Reason::InvalidHeader
    );
}

#[test]
fn an_unusable_retry_dead_letter_topic_is_a_reject() {
    let mut c = contract();
    c.retry.default.dead_letter = "delay.{target}".into();
    let headers = [h("delay-target", "orders"), h("retry-attempt", "3")];
    let rec = Incoming {
        topic: "delay.retry",
        timestamp_ms: Some(SENT),
        key: None,
        value: Some(b"v"),
        headers: &headers.each_ref().map(Header::borrowed),
    };
    let rej = c.interpret(&rec, NOW).unwrap_err();
    assert_eq!(rej.reason, Reason::RetriesExhausted);
    assert!(rej.detail.contains("would loop"), "{}", rej.detail);
}

/// The shared contract vectors (`schemas/contract-vectors.json`), which the client helpers are
/// tested on as well: the broker's contract must give every expected outcome.
mod vectors {
    use super::*;
    use serde_json::Value;

    const VECTORS: &str = include_str!("../../../../schemas/contract-vectors.json");

    /// A value of the vectors: a string, null, `{"hex": ..}` or `{"repeat": s, "times": n}`.
    fn bytes(v: &Value) -> Option<Vec<u8>> {
        match v {
            Value::Null => None,
            Value::String(s) => Some(s.as_bytes().to_vec()),
            Value::Object(o) if o.contains_key("hex") => {
                let hex = o["hex"].as_str().expect("hex string");
                Some(
                    (0..hex.len())
                        .step_by(2)
                        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
                        .collect(),
                )
            }
            Value::Object(o) => {
                let times = o["times"].as_u64().expect("times") as usize;
                Some(
                    o["repeat"]
                        .as_str()
                        .expect("repeat")
                        .repeat(times)
                        .into_bytes(),
                )
            }
            other => panic!("not a vector value: {other}"),
        }
    }

    fn text(v: &Value) -> Option<String> {
        bytes(v).map(|b| String::from_utf8(b).expect("UTF-8"))
    }

    fn contract_of(spec: &Value) -> Contract {
        let policy = crate::retry::Policy::parse(
            spec["retry_default"].as_str().unwrap(),
            &crate::retry::Policy::default(),
        )
        .expect("retry_default");
        Contract {
            source_pattern: Regex::new(spec["source_pattern"].as_str().unwrap()).unwrap(),
            target_allow: None,
            routes: Vec::new(),
            allow_internal_targets: false,
            max_delay_ms: spec["max_delay_ms"].as_u64().unwrap(),
            max_record_bytes: spec["max_record_bytes"].as_u64().unwrap() as usize,
            retry: crate::retry::Retries {
                topics: Regex::new(spec["retry_topics"].as_str().unwrap()).unwrap(),
                default: policy,
                by_target: Vec::new(),
            },
        }
    }

    /// The listed headers are on the record with these values.
    fn has_headers(name: &str, s: &StoredRecord, want: &Value) {
        for pair in want.as_array().into_iter().flatten() {
            let (k, v) = (pair[0].as_str().unwrap(), text(&pair[1]));
            let got: Vec<Option<String>> = s
                .headers()
                .filter(|h| h.key == k)
                .map(|h| h.value.map(|b| String::from_utf8_lossy(b).into_owned()))
                .collect();
            assert_eq!(got, vec![v], "{name}: header {k}");
        }
    }

    fn check(name: &str, got: Result<Command, Reject>, expect: &Value) {
        let (kind, want) = expect
            .as_object()
            .and_then(|o| o.iter().next())
            .expect("expect has one key");
        match (kind.as_str(), got) {
            ("reject", Err(rej)) => {
                assert_eq!(rej.reason.code(), want.as_str().unwrap(), "{name}");
                assert!(!rej.detail.is_empty(), "{name}: a sentence for a person");
            }
            ("cancel", Ok(Command::Cancel { id })) => {
                assert_eq!(Some(id), bytes(&want["id"]), "{name}");
            }
            ("schedule", Ok(Command::Schedule(s))) => {
                assert_eq!(s.target(), want["target"].as_str().unwrap(), "{name}");
                assert_eq!(s.due_ms(), want["due_ms"].as_u64().unwrap(), "{name}");
                assert_eq!(s.id().map(<[u8]>::to_vec), bytes(&want["id"]), "{name}");
                if let Some(key) = want.get("key") {
                    assert_eq!(s.key().map(<[u8]>::to_vec), bytes(key), "{name}: key");
                }
                if let Some(value) = want.get("value") {
                    assert_eq!(s.value().map(<[u8]>::to_vec), bytes(value), "{name}");
                }
                if let Some(headers) = want.get("headers") {
                    let got: Vec<(String, Option<String>)> = s
                        .headers()
                        .map(|h| {
                            let v = h.value.map(|b| String::from_utf8_lossy(b).into_owned());
                            (h.key.to_owned(), v)
                        })
                        .collect();
                    let want: Vec<(String, Option<String>)> = headers
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|p| (p[0].as_str().unwrap().to_owned(), text(&p[1])))
                        .collect();
                    assert_eq!(got, want, "{name}: the published headers");
                }
            }
            ("retry", Ok(Command::Retry { schedule, attempt })) => {
                assert_eq!(
                    schedule.target(),
                    want["target"].as_str().unwrap(),
                    "{name}"
                );
                assert_eq!(
                    schedule.due_ms(),
                    want["due_ms"].as_u64().unwrap(),
                    "{name}"
                );
                assert_eq!(
                    u64::from(attempt),
                    want["attempt"].as_u64().unwrap(),
                    "{name}"
                );
                has_headers(name, &schedule, &want["headers"]);
            }
            ("exhausted", Ok(Command::Exhausted { schedule, target })) => {
                assert_eq!(target, want["target"].as_str().unwrap(), "{name}");
                assert_eq!(
                    schedule.target(),
                    want["dead_letter"].as_str().unwrap(),
                    "{name}"
                );
                assert_eq!(
                    schedule.due_ms(),
                    want["due_ms"].as_u64().unwrap(),
                    "{name}"
                );
                has_headers(name, &schedule, &want["headers"]);
            }
            (kind, got) => panic!("{name}: expected {kind} {want}, got {got:?}"),
        }
    }

    #[test]
    fn the_shared_contract_vectors_hold() {
        let doc: Value = serde_json::from_str(VECTORS).expect("contract-vectors.json parses");
        let contract = contract_of(&doc["contract"]);
        let now = doc["now_ms"].as_u64().unwrap();
        let cases = doc["cases"].as_array().unwrap();
        let mut codes = std::collections::BTreeSet::new();
        for case in cases {
            let name = case["name"].as_str().unwrap();
            let headers: Vec<Header> = case["headers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| Header {
                    key: p[0].as_str().unwrap().to_owned(),
                    value: bytes(&p[1]),
                })
                .collect();
            let (key, value) = (bytes(&case["key"]), bytes(&case["value"]));
            let got = contract.interpret(
                &Incoming {
                    topic: case["topic"].as_str().unwrap(),
                    timestamp_ms: case["timestamp_ms"].as_u64(),
                    key: key.as_deref(),
                    value: value.as_deref(),
                    headers: &refs(&headers),
                },
                now,
            );
            if let Some(code) = case["expect"].get("reject") {
                codes.insert(code.as_str().unwrap().to_owned());
            }
            check(name, got, &case["expect"]);
        }
        // Every reason a record can be rejected for at ingest has a vector (the allow-list's
        // needs a configured --target-allow; the others arise at fire time).
        let at_fire_or_configured = [
            Reason::TargetNotAllowed,
            Reason::TargetNotFound,
            Reason::TargetDenied,
            Reason::DeliveryFailed,
            Reason::RetriesExhausted,
        ];
        for r in Reason::ALL {
            if !at_fire_or_configured.contains(&r) {
                assert!(
                    codes.contains(r.code()),
                    "no vector rejects with {}",
                    r.code()
                );
            }
        }
    }
}
