use std::time::Duration;

use super::*;
use kafka_delay_core::retry;

fn parse(args: &[&str]) -> Result<Config, String> {
    let run = RunArgs::try_parse_flags(args).map_err(|e| e.to_string())?;
    run.validate().map_err(|e| e.to_string())
}

#[test]
fn retry_policies_layer_on_the_default() {
    let c = parse(&[
        "--brokers",
        "a:1",
        "--retry-default",
        "max-attempts=3,delay=2s",
        "--retry-policy",
        r"^orders\.=backoff=fixed,delay=10s",
        "--retry-policy",
        "^payments=dead-letter=dlt.{target}",
    ])
    .unwrap();
    let r = &c.contract.retry;
    assert_eq!(r.policy_for("billing").max_attempts, 3);
    assert_eq!(r.policy_for("billing").delay_ms, 2_000);
    let orders = r.policy_for("orders.eu");
    assert_eq!(orders.backoff, retry::Backoff::Fixed);
    assert_eq!((orders.delay_ms, orders.max_attempts), (10_000, 3));
    assert_eq!(
        r.policy_for("payments").dead_letter_topic("payments"),
        "dlt.payments"
    );
    assert_eq!(
        r.policy_for("billing").dead_letter_topic("billing"),
        "billing.dlt"
    );
    assert_eq!(c.topics.retry.as_deref(), Some("delay.retry"));
    assert!(r.topics.is_match("delay.retry"));
}

#[test]
fn defaults_are_sane() {
    let c = parse(&["--brokers", "127.0.0.1:9092"]).unwrap();
    assert_eq!(c.topics.dead_letter, "delay-dead-letter");
    assert_eq!(c.contract.max_delay_ms, 365 * 86_400_000);
    assert!(c.contract.source_pattern.is_match("delay.30s"));
    assert!(!c.contract.source_pattern.is_match(&c.topics.dead_letter));
    assert!(c.kafka.instance_id.unwrap().starts_with("kafka-delay-"));
    let c = parse(&["--brokers", "a:1", "--no-static-membership"]).unwrap();
    assert_eq!(c.kafka.instance_id, None);
    assert!(!c.store.sync);
    // A slice of its own for the scheduler's thread: closer to due, no more CPU per record.
    assert_eq!(c.wheel.scheduler_slice, Some(Duration::from_millis(1)));
    // Records due within 5 s of arrival fire from memory, up to 64 MiB of them.
    assert_eq!(
        (c.store.keep_within, c.store.keep_bytes),
        (Duration::from_secs(5), 64 << 20)
    );
    let c = parse(&["--brokers", "a:1", "--keep-in-memory-mb", "0"]).unwrap();
    assert_eq!(c.store.keep_bytes, 0);
    // A custom source pattern the default retry topic does not match: no retry topic.
    let c = parse(&["--brokers", "a:1", "--source-pattern", r"^later\..+"]).unwrap();
    assert_eq!(c.topics.retry, None);
    let c = parse(&["--brokers", "a:1", "--retry-topic", ""]).unwrap();
    assert_eq!(c.topics.retry, None);
}

#[test]
fn bad_flags_say_what_to_fix() {
    let cases: [(&[&str], &str); 22] = [
        (
            &["--brokers", "a:1", "--retry-default", "backoff=linear"],
            "--retry-default 'backoff=linear': backoff 'linear': use fixed or exponential",
        ),
        (
            &["--brokers", "a:1", "--retry-default", "jitter=1.5"],
            "jitter '1.5'",
        ),
        (
            &["--brokers", "a:1", "--retry-policy", "^orders"],
            "REGEX=KEY=VALUE",
        ),
        (
            &["--brokers", "a:1", "--retry-policy", "^orders=tries=3"],
            "unknown key 'tries'",
        ),
        (
            &[
                "--brokers",
                "a:1",
                "--retry-default",
                "dead-letter=delay.{target}",
            ],
            "does not give a usable topic",
        ),
        (
            &["--brokers", "a:1", "--retry-topic", "retries"],
            "--retry-topic 'retries' must match",
        ),
        (&[], "--brokers"),
        (
            &["--brokers", "a:1", "--embedded-kafka"],
            "exclude each other",
        ),
        (
            &["--brokers", "a:1", "--source-pattern", "(["],
            "--source-pattern",
        ),
        (
            &["--brokers", "a:1", "--max-delay", "10 days"],
            "--max-delay",
        ),
        (
            &["--brokers", "a:1", "--dead-letter-topic", "delay.dead"],
            "would loop",
        ),
        (
            &["--brokers", "a:1", "--dead-letter-topic", "__dlt"],
            "internal",
        ),
        (
            &["--brokers", "a:1", "--kafka-config", "nokey"],
            "KEY=VALUE",
        ),
        (
            &["--brokers", "a:1", "--kafka-config", "group.id=x"],
            "--group-id",
        ),
        (
            &["--brokers", "a:1", "--log-format", "xml"],
            "[possible values: plain, json]",
        ),
        (
            &["--brokers", "a:1", "--target-allow", "("],
            "--target-allow",
        ),
        (
            &["--brokers", "a:1", "--fire-max-attempts", "0"],
            "at least 1",
        ),
        (
            &[
                "--brokers",
                "a:1",
                "--horizon",
                "10s",
                "--keep-in-memory-within",
                "1m",
            ],
            "--keep-in-memory-within 1m is longer than --horizon 10s",
        ),
        (
            &["--brokers", "a:1", "--keep-in-memory-within", "soon"],
            "--keep-in-memory-within",
        ),
        (
            &["--brokers", "a:1", "--scheduler-slice", "50us"],
            "Linux grants 100us to 100ms, or give 0 to keep the kernel's own (got 50us)",
        ),
        (
            &["--brokers", "a:1", "--scheduler-slice", "1s"],
            "Linux grants 100us to 100ms, or give 0 to keep the kernel's own (got 1s)",
        ),
        (
            &["--brokers", "a:1", "--scheduler-slice", "short"],
            "give it like 1ms or 500us",
        ),
    ];
    for (args, want) in cases {
        let err = parse(args).unwrap_err();
        assert!(err.contains(want), "{args:?}: {err}");
    }
    // A horizon too short is reported as such, not as the keep window being longer than it.
    let err = parse(&["--brokers", "a:1", "--horizon", "500ms"]).unwrap_err();
    assert!(
        err.contains("--horizon must be at least 1s (got 500ms)"),
        "{err}"
    );
    let err = parse(&["--brokers", "a:1", "--http-addr", "nowhere"]).unwrap_err();
    assert!(err.contains("--http-addr"), "{err}");
}

#[test]
fn records_due_at_ingest_fire_at_once_unless_told_not_to() {
    assert!(parse(&["--brokers", "a:1"]).unwrap().fire.at_ingest);
    let off = parse(&["--brokers", "a:1", "--no-fire-at-ingest"]).unwrap();
    assert!(!off.fire.at_ingest);
}

#[test]
fn fire_limits_come_from_repeated_flags() {
    let c = parse(&[
        "--brokers",
        "a:1",
        "--fire-rate",
        "^orders$=500/s,burst=50",
        "--fire-rate",
        "^reminders=spread=1m",
        "--fire-rate-global",
        "2000/s",
    ])
    .unwrap();
    assert_eq!(c.fire.limits.rules.len(), 2);
    assert_eq!(c.fire.limits.rules[0].rate.unwrap().burst, 50);
    assert_eq!(c.fire.limits.rules[1].spread_ms, 60_000);
    assert_eq!(c.fire.limits.global.unwrap().per_second, 2_000.0);
    assert!(parse(&["--brokers", "a:1"]).unwrap().fire.limits.is_empty());
    for (args, says) in [
        (
            ["--fire-rate", "^orders$"],
            "invalid value '^orders$' for '--fire-rate",
        ),
        (["--fire-rate", "^orders$=500/s,burst=-1"], "burst '-1'"),
        (["--fire-rate-global", "lots"], "rate 'lots'"),
    ] {
        let err = parse(&[&["--brokers", "a:1"][..], &args[..]].concat()).unwrap_err();
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

#[test]
fn the_scheduler_slice_is_given_in_microseconds_or_milliseconds_or_left_to_the_kernel() {
    let slice = |args: &[&str]| {
        let mut full = vec!["--brokers", "a:1"];
        full.extend_from_slice(args);
        parse(&full).unwrap().wheel.scheduler_slice
    };
    assert_eq!(slice(&[]), Some(Duration::from_millis(1)));
    assert_eq!(
        slice(&["--scheduler-slice", "500us"]),
        Some(Duration::from_micros(500))
    );
    assert_eq!(
        slice(&["--scheduler-slice", "3ms"]),
        Some(Duration::from_millis(3))
    );
    assert_eq!(slice(&["--scheduler-slice", "0"]), None);
}

#[test]
fn kafka_config_passes_through_and_secrets_are_redacted() {
    let c = parse(&[
        "--brokers",
        "a:1",
        "--kafka-config",
        "sasl.password=hunter2",
        "--kafka-config",
        "linger.ms=5",
    ])
    .unwrap();
    assert_eq!(c.kafka.properties[0].value, "hunter2");
    let shown = format!("{c:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(shown.contains("linger.ms"));
}

#[test]
fn the_changelog_is_the_default_on_a_cluster_and_its_flags_are_checked() {
    let c = parse(&["--brokers", "k:9092"]).unwrap();
    assert_eq!(c.cluster.changelog, Changelog::Default);
    assert_eq!(
        parse(&["--brokers", "k:9092", "--no-changelog"])
            .unwrap()
            .cluster
            .changelog,
        Changelog::Off
    );
    assert_eq!(
        parse(&["--embedded-kafka"]).unwrap().cluster.changelog,
        Changelog::Embedded
    );
    assert_eq!(c.cluster.changelog_replication, -1);
    assert_eq!(c.cluster.handoff_wait, Duration::from_secs(10));
    // Values the source topic keeps a day past their due time are pointed at, not copied.
    assert_eq!(
        c.cluster.changelog_copy,
        ValueCopy::Unless(Duration::from_secs(86_400))
    );
    assert_eq!(
        parse(&["--brokers", "k:9092", "--changelog-copy-values"])
            .unwrap()
            .cluster
            .changelog_copy,
        ValueCopy::All
    );
    assert_eq!(
        parse(&["--brokers", "k:9092", "--changelog-copy-margin", "2h"])
            .unwrap()
            .cluster
            .changelog_copy,
        ValueCopy::Unless(Duration::from_secs(7_200))
    );
    let bad = parse(&["--brokers", "k:9092", "--changelog-copy-margin", "soon"]).unwrap_err();
    assert!(bad.contains("--changelog-copy-margin"), "{bad}");
    let c = parse(&[
        "--brokers",
        "k:9092",
        "--changelog",
        "--changelog-replication",
        "3",
        "--handoff-wait",
        "2s",
    ])
    .unwrap();
    assert_eq!(c.cluster.changelog, Changelog::On);
    assert_eq!(c.cluster.changelog_replication, 3);
    assert_eq!(c.cluster.handoff_wait, Duration::from_secs(2));
    // Groups linger 1 s before the changelog has them, within any handoff's wait.
    let linger = |flags: &[&str]| {
        let mut all = vec!["--brokers", "k:9092"];
        all.extend_from_slice(flags);
        parse(&all).map(|c| c.cluster.changelog_linger)
    };
    assert_eq!(linger(&[]), Ok(Duration::from_secs(1)));
    assert_eq!(linger(&["--changelog-linger", "0s"]), Ok(Duration::ZERO));
    assert_eq!(
        linger(&["--handoff-wait", "1s"]),
        Ok(Duration::from_millis(500))
    );
    let long = linger(&["--changelog-linger", "10s"]).unwrap_err();
    assert!(
        long.contains("--changelog-linger") && long.contains("--handoff-wait (10s)"),
        "{long}"
    );
    for (flags, names) in [
        (&["--no-changelog"][..], "--no-changelog"),
        (
            &["--exactly-once", "--instance-id", "a"][..],
            "--exactly-once",
        ),
    ] {
        let mut with = vec!["--changelog-linger", "2s"];
        with.extend_from_slice(flags);
        let refused = linger(&with).unwrap_err();
        assert!(
            refused.contains("--changelog-linger") && refused.contains(names),
            "{refused}"
        );
        // Unless set, the linger needs no flag to go with these modes.
        assert!(linger(flags).is_ok(), "{flags:?}");
    }
    let both = parse(&["--brokers", "k:9092", "--changelog", "--no-changelog"]).unwrap_err();
    assert!(both.contains("--no-changelog"), "{both}");
    let e = parse(&["--embedded-kafka", "--changelog"]).unwrap_err();
    assert!(
        e.contains("--changelog") && e.contains("--embedded-kafka"),
        "{e}"
    );
    for bad in ["0", "-2"] {
        let e = parse(&["--brokers", "k:9092", "--changelog-replication", bad]).unwrap_err();
        assert!(e.contains("--changelog-replication"), "{e}");
    }
    assert_eq!(c.cluster.standby_replicas, 0);
    let c = parse(&[
        "--brokers",
        "k:9092",
        "--changelog",
        "--standby-replicas",
        "2",
    ])
    .unwrap();
    assert_eq!(c.cluster.standby_replicas, 2);
    let c = parse(&["--brokers", "k:9092", "--standby-replicas", "1"]).unwrap();
    assert_eq!(
        c.cluster.standby_replicas, 1,
        "the default mode keeps standbys"
    );
    let e = parse(&[
        "--brokers",
        "k:9092",
        "--no-changelog",
        "--standby-replicas",
        "1",
    ])
    .unwrap_err();
    assert!(
        e.contains("--standby-replicas") && e.contains("--no-changelog"),
        "{e}"
    );
}

#[test]
fn exactly_once_needs_the_changelog_a_stable_instance_id_and_a_real_cluster() {
    let c = parse(&["--brokers", "k:9092", "--changelog"]).unwrap();
    assert_eq!(c.cluster.transactional_id, None);
    let c = parse(&[
        "--brokers",
        "k:9092",
        "--changelog",
        "--exactly-once",
        "--instance-id",
        "a",
        "--group-id",
        "g",
    ])
    .unwrap();
    assert_eq!(c.cluster.transactional_id.as_deref(), Some("g-a"));
    assert_eq!(c.cluster.transaction_records, 10_000);
    let fails = |flags: &[&str], says: &str| {
        let e = parse(flags).unwrap_err();
        assert!(e.contains(says), "{flags:?}: {e}");
    };
    fails(
        &["--brokers", "k:9092", "--exactly-once", "--no-changelog"],
        "leave out --no-changelog",
    );
    let c = parse(&["--brokers", "k:9092", "--exactly-once", "--group-id", "g"]).unwrap();
    assert!(
        c.cluster.transactional_id.is_some(),
        "the default mode runs exactly-once"
    );
    fails(
        &["--embedded-kafka", "--exactly-once"],
        "the embedded cluster cannot run transactions",
    );
    let stable = ["--brokers", "k:9092", "--changelog", "--exactly-once"];
    fails(
        &[&stable[..], &["--no-static-membership"]].concat(),
        "give --instance-id",
    );
    fails(
        &[&stable[..], &["--transaction-records", "0"]].concat(),
        "--transaction-records",
    );
    fails(
        &[&stable[..], &["--transaction-interval", "1m"]].concat(),
        "--transaction-interval",
    );
    fails(
        &[&stable[..], &["--kafka-config", "transactional.id=x"]].concat(),
        "--exactly-once",
    );
}

#[test]
fn routes_are_read_in_order_and_a_bad_one_fails_saying_so() {
    let c = parse(&[
        "--brokers",
        "k:9092",
        "--route",
        r"^delay\.a\.=^a\.",
        "--route",
        r"^delay\.b\.=^b\.",
    ])
    .unwrap();
    let routes: Vec<String> = c.contract.routes.iter().map(ToString::to_string).collect();
    assert_eq!(routes, [r"^delay\.a\.=^a\.", r"^delay\.b\.=^b\."]);
    let e = parse(&["--brokers", "k:9092", "--route", "no-equals-sign"]).unwrap_err();
    assert!(
        e.contains("--route") && e.contains("SOURCES=TARGETS"),
        "{e}"
    );
}
