use super::*;

fn config(args: &[&str]) -> Config {
    let mut all = vec!["--brokers", "k:9092"];
    all.extend(args);
    RunArgs::try_parse_flags(all)
        .expect("flags")
        .validate()
        .expect("valid")
}

fn find<'a>(rules: &'a [Acl], kind: Kind, name: &str) -> &'a Acl {
    rules
        .iter()
        .find(|r| r.kind == kind && r.name == name)
        .unwrap_or_else(|| panic!("no rule on {kind:?} {name}: {rules:#?}"))
}

#[test]
fn a_regex_becomes_the_prefix_or_name_it_matches_or_is_refused_saying_how_to_write_it() {
    assert_eq!(
        prefix_of(r"^delay\..+"),
        Ok(("delay.".into(), Pattern::Prefixed))
    );
    assert_eq!(
        prefix_of(r"^team-a\."),
        Ok(("team-a.".into(), Pattern::Prefixed))
    );
    assert_eq!(
        prefix_of(r"^orders$"),
        Ok(("orders".into(), Pattern::Literal))
    );
    assert!(prefix_of(r"team-a\.").unwrap_err().contains("anchor"));
    assert!(prefix_of(r"^(orders|payments)$")
        .unwrap_err()
        .contains("^PREFIX"));
    assert!(prefix_of(r"^team-[ab]\.").unwrap_err().contains("^PREFIX"));
    assert!(prefix_of(r"^.*").unwrap_err().contains("every topic"));
}

#[test]
fn routes_give_write_on_their_targets_only_and_exactly_once_its_transactional_ids() {
    let c = config(&[
        "--changelog",
        "--exactly-once",
        "--instance-id",
        "a",
        "--route",
        r"^delay\.team-a\..*=^team-a\.",
        "--route",
        r"^delay\.team-b\..*=^team-b\.",
    ]);
    let rules = acls(&c).unwrap();
    assert_eq!(
        find(&rules, Kind::Group, "kafka-delay").operations,
        [Op::Read, Op::Describe]
    );
    // The changelog's readers and the console find their groups' coordinators too.
    find(&rules, Kind::Group, "kafka-delay-restore");
    find(&rules, Kind::Group, "kafka-delay-console");
    // With the changelog, the source topics' retention is read: it decides which values the
    // changelog points at.
    let source = find(&rules, Kind::Topic, "delay.");
    assert_eq!(
        (source.pattern, &source.operations[..]),
        (
            Pattern::Prefixed,
            &[Op::Read, Op::Describe, Op::DescribeConfigs][..]
        )
    );
    for flags in [
        &["--no-changelog"][..],
        &["--changelog", "--changelog-copy-values"],
    ] {
        let rules = acls(&config(flags)).unwrap();
        assert_eq!(
            find(&rules, Kind::Topic, "delay.").operations,
            [Op::Read, Op::Describe],
            "{flags:?}"
        );
    }
    for t in ["team-a.", "team-b."] {
        let r = find(&rules, Kind::Topic, t);
        assert_eq!(r.pattern, Pattern::Prefixed);
        assert!(r.operations.contains(&Op::Write) && !r.operations.contains(&Op::Read));
    }
    let changelog = find(&rules, Kind::Topic, "kafka-delay-delay.");
    assert_eq!(changelog.pattern, Pattern::Prefixed);
    let named = crate::changelog::topic_name("kafka-delay", "delay.team-a.orders");
    assert!(named.starts_with(&changelog.name), "{named}");
    let txn = find(&rules, Kind::TransactionalId, "kafka-delay-");
    assert_eq!(txn.pattern, Pattern::Prefixed);
    // The flag chose the mode: the cluster's configuration is not asked.
    assert!(rules.iter().all(|r| r.kind != Kind::Cluster), "{rules:#?}");
    // Nothing on any other topic: no wildcard.
    assert!(rules.iter().all(|r| r.name != "*"), "{rules:#?}");
}

#[test]
fn without_routes_or_an_allow_list_every_topic_is_a_target_and_the_lines_say_so() {
    let c = config(&["--no-changelog"]);
    let rules = acls(&c).unwrap();
    assert!(rules
        .iter()
        .all(|r| !r.name.ends_with("-changelog") && r.name != "kafka-delay-delay."));
    assert!(rules.iter().all(|r| r.kind != Kind::TransactionalId));
    assert!(rules.iter().all(|r| r.name != "kafka-delay-restore"));
    let lines = kafka_acls_lines(&rules, "User:kafka-delay", "k:9092", "admin.properties");
    assert!(lines.contains("--topic '*'"), "{lines}");
    assert!(lines.contains("records may name any topic"), "{lines}");
    assert!(
        lines.contains(
            "kafka-acls --bootstrap-server k:9092 --command-config admin.properties --add \
         --allow-principal User:kafka-delay --operation Read --operation Describe \
         --topic delay. --resource-pattern-type prefixed"
        ),
        "{lines}"
    );
}

#[test]
fn a_route_no_acl_can_state_is_refused_naming_the_flag() {
    let c = config(&["--route", r"^delay\.a\..*=^(a|b)\."]);
    let e = acls(&c).unwrap_err();
    assert_eq!(e.flag, "--route");
    assert!(e.to_string().contains("^(a|b)"), "{e}");
}

#[test]
fn the_default_mode_may_ask_the_brokers_configuration() {
    let rules = acls(&config(&[])).unwrap();
    assert_eq!(
        find(&rules, Kind::Cluster, "kafka-cluster").operations,
        [Op::DescribeConfigs]
    );
    let lines = kafka_acls_lines(&rules, "User:kafka-delay", "k:9092", "admin.properties");
    assert!(
        lines.contains("--operation DescribeConfigs --cluster\n"),
        "{lines}"
    );
}

#[test]
fn a_retry_dead_letter_topic_outside_the_targets_gets_its_own_rule() {
    let c = config(&[
        "--route",
        r"^delay\.a\..*=^a\.",
        "--retry-policy",
        "^a\\.=dead-letter=dlq.{target}",
    ]);
    let rules = acls(&c).unwrap();
    let dlq = find(&rules, Kind::Topic, "dlq.");
    assert_eq!(dlq.pattern, Pattern::Prefixed);
    assert!(dlq.operations.contains(&Op::Write));
    // The default policy's `{target}.dlt` is under the targets' prefix: no rule of its own.
    assert!(rules.iter().all(|r| !r.name.contains("dlt")), "{rules:#?}");
}
