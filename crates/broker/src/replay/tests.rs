use super::*;
use rdkafka::message::{Header as KHeader, OwnedHeaders, Timestamp};

#[test]
fn rates_and_filters_parse_or_say_how() {
    assert_eq!(parse_rate("50"), Ok(50.0));
    assert_eq!(parse_rate("50/s"), Ok(50.0));
    assert_eq!(parse_rate("120/m"), Ok(2.0));
    for bad in ["0", "-1", "fast", "5/h", "NaN/s", ""] {
        assert!(parse_rate(bad).is_err(), "{bad}");
    }
    assert_eq!(
        Filter::parse("reason=retries-exhausted"),
        Ok(Filter::Reason("retries-exhausted".into()))
    );
    assert_eq!(
        Filter::parse("header:tenant=a=b"),
        Ok(Filter::Header("tenant".into(), "a=b".into()))
    );
    for bad in ["reason", "colour=red", "header:=x"] {
        assert!(
            Filter::parse(bad).unwrap_err().contains("reason=CODE"),
            "{bad}"
        );
    }
}

#[test]
fn filters_all_have_to_match() {
    let headers = vec![
        Header::new("delay-error", "retries-exhausted"),
        Header::new("delay-target", "orders"),
        Header::new("tenant", "a"),
    ];
    let all = |fs: &[&str]| {
        fs.iter()
            .map(|f| Filter::parse(f).unwrap())
            .all(|f| f.matches(Some(b"k1"), &headers))
    };
    assert!(all(&[
        "reason=retries-exhausted",
        "target=orders",
        "key=k1",
        "header:tenant=a"
    ]));
    assert!(!all(&["reason=retries-exhausted", "target=payments"]));
    assert!(!all(&["key=k2"]));
    assert!(!all(&["header:tenant=b"]));
    assert!(all(&[]));
}

#[test]
fn replay_resets_the_count_and_drops_what_dead_lettering_added() {
    let mut h = OwnedHeaders::new();
    for (k, v) in [("delay-error", "retries-exhausted"), ("trace", "t")] {
        h = h.insert(KHeader {
            key: k,
            value: Some(v),
        });
    }
    let msg = OwnedMessage::new(
        None,
        None,
        "orders.dlt".into(),
        Timestamp::NotAvailable,
        2,
        9,
        Some(h),
    );
    let headers = vec![
        Header::new("delay-error", "retries-exhausted"),
        Header::new("delay-error-detail", "5 retries of 5"),
        Header::new("delay-target", "orders"),
        Header::new("delay-origin-offset", "4"),
        Header::new("retry-attempt", "5"),
        Header::new("retry-first-failed-at", "1763600000000"),
        Header::new("retry-reason", "503"),
        Header::new("trace", "t"),
    ];
    let out = replayed_headers(&msg, headers);
    let names: Vec<&str> = out.iter().map(|h| h.key.as_str()).collect();
    assert_eq!(
        names,
        ["delay-target", "retry-reason", "trace", REPLAYED_FROM]
    );
    assert_eq!(out[3].value.as_deref(), Some(&b"orders.dlt/2/9"[..]));
}

#[test]
fn bad_flags_say_what_to_fix() {
    let args = |from: &str, to: &str, rate: Option<&str>| ReplayArgs {
        brokers: "a:1".into(),
        from: from.into(),
        to: to.into(),
        rate: rate.map(str::to_owned),
        filter: vec![],
        dry_run: false,
        kafka_config: vec![],
    };
    assert!(args("x.dlt", "x.dlt", None)
        .validate()
        .unwrap_err()
        .to_string()
        .contains("the same topic as --from"));
    assert!(args("x.dlt", "x", Some("fast"))
        .validate()
        .unwrap_err()
        .to_string()
        .contains("--rate 'fast'"));
    assert_eq!(
        args("x.dlt", "x", Some("10/s")).validate().unwrap().rate,
        Some(10.0)
    );
}
