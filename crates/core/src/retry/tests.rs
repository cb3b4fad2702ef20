use super::*;
use proptest::prelude::*;

fn exp(spec: &str) -> Policy {
    Policy::parse(spec, &Policy::default()).unwrap()
}

#[test]
fn default_spec_is_the_default_policy() {
    assert_eq!(exp(DEFAULT_SPEC), Policy::default());
}

#[test]
fn exponential_doubles_up_to_the_cap() {
    let p = exp("delay=100ms,factor=2,max-delay=1s,jitter=0");
    let waits: Vec<u64> = (1..=6).map(|n| p.delay_for(n, 0.7)).collect();
    assert_eq!(waits, [100, 200, 400, 800, 1_000, 1_000]);
    // Far past any realistic attempt count the cap still holds and nothing overflows.
    assert_eq!(p.delay_for(u32::MAX, 0.5), 1_000);
}

#[test]
fn fixed_waits_the_same_every_time() {
    let p = exp("backoff=fixed,delay=30s,jitter=0");
    assert!((1..=10).all(|n| p.delay_for(n, 0.3) == 30_000));
}

#[test]
fn jitter_spreads_within_its_fraction() {
    let p = exp("delay=1s,factor=3,max-delay=1h,jitter=0.2");
    assert_eq!(p.delay_for(1, 0.0), 800);
    assert_eq!(p.delay_for(1, 0.5), 1_000);
    assert_eq!(p.delay_for(2, 0.0), 2_400);
    assert!(p.delay_for(2, 0.999_999) <= 3_600);
}

#[test]
fn dead_letter_template() {
    assert_eq!(Policy::default().dead_letter_topic("orders"), "orders.dlt");
    assert_eq!(
        exp("dead-letter=all-retries-dlt").dead_letter_topic("orders"),
        "all-retries-dlt"
    );
}

#[test]
fn bad_specs_name_the_key() {
    for (spec, want) in [
        ("delay", "not KEY=VALUE"),
        ("backoff=linear", "fixed or exponential"),
        ("delay=10", "delay:"),
        ("factor=0.5", "factor '0.5'"),
        ("factor=NaN", "factor 'NaN'"),
        ("jitter=1", "jitter '1'"),
        ("jitter=-0.1", "jitter '-0.1'"),
        ("max-attempts=-1", "max-attempts '-1'"),
        ("max-attempts=2000000", "max-attempts"),
        ("dead-letter=", "dead-letter is empty"),
        ("delay=0ms", "more than 0"),
        ("colour=red", "unknown key 'colour'"),
    ] {
        let e = Policy::parse(spec, &Policy::default()).unwrap_err();
        assert!(e.contains(want), "{spec}: {e}");
    }
}

#[test]
fn first_matching_target_pattern_wins() {
    let r = Retries {
        by_target: vec![
            (Regex::new("^orders").unwrap(), exp("max-attempts=1")),
            (Regex::new("^ord").unwrap(), exp("max-attempts=2")),
        ],
        ..Retries::default()
    };
    assert_eq!(r.policy_for("orders").max_attempts, 1);
    assert_eq!(r.policy_for("ordinal").max_attempts, 2);
    assert_eq!(r.policy_for("billing").max_attempts, 5);
}

proptest! {
    #[test]
    fn waits_stay_within_jitter_and_cap(
        delay in 1u64..100_000, factor in 1.0f64..10.0, cap in 1u64..10_000_000,
        jitter in 0.0f64..0.99, attempt in 1u32..200, seed in any::<u64>(),
    ) {
        let p = Policy { delay_ms: delay, factor, max_delay_ms: cap, jitter, ..Policy::default() };
        let u = unit_interval(seed);
        prop_assert!((0.0..1.0).contains(&u));
        let exact = (delay as f64 * factor.powi(attempt as i32 - 1)).min(cap as f64);
        let wait = p.delay_for(attempt, u) as f64;
        prop_assert!(wait <= cap as f64 + 0.5);
        prop_assert!(wait >= (exact * (1.0 - jitter)).floor() - 1.0);
        prop_assert!(wait <= (exact * (1.0 + jitter)).ceil() + 1.0);
    }

    #[test]
    fn without_jitter_waits_never_shrink(delay in 1u64..10_000, factor in 1.0f64..4.0, attempt in 1u32..100) {
        let p = Policy { delay_ms: delay, factor, jitter: 0.0, ..Policy::default() };
        prop_assert!(p.delay_for(attempt + 1, 0.5) >= p.delay_for(attempt, 0.5));
    }
}

#[test]
fn the_schema_documents_every_retry_header_and_policy_key_with_its_default() {
    let schema: serde_json::Value =
        serde_json::from_str(include_str!("../../../../schemas/headers.schema.json")).unwrap();
    let headers = &schema["properties"]["headers"]["properties"];
    for name in [
        names::AFTER,
        names::ATTEMPT,
        names::FIRST_FAILED_AT,
        names::MAX_ATTEMPTS,
        names::REASON,
    ] {
        assert!(headers[name].is_object(), "{name} missing from the schema");
    }
    let keys = schema["$defs"]["retry-policy"]["properties"]
        .as_object()
        .expect("retry-policy in the schema");
    let mut spec = Vec::new();
    for (key, def) in keys {
        let default = match &def["default"] {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        spec.push(format!("{key}={default}"));
    }
    assert_eq!(keys.len(), 7);
    assert_eq!(
        Policy::parse(&spec.join(","), &Policy::default()),
        Ok(Policy::default()),
        "the schema's defaults are the code's"
    );
}
