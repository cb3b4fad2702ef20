//! Metrics, dashboard and compose stack, checked against a real scrape of a running broker:
//! every PromQL expression of the dashboard uses only metric names the binary exports,
//! `promtool check metrics` passes, and the compose and provisioning files parse and point at
//! files that exist. (No Docker here: the stack itself is not started.)

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

fn read(rel: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// A scrape without its help lines and histogram buckets: short enough that a failure's
/// output shows all of it.
fn brief(scrape: &str) -> String {
    scrape
        .lines()
        .filter(|l| !l.starts_with("# HELP") && !l.contains("_bucket{"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn yaml(rel: &str) -> serde_yaml::Value {
    serde_yaml::from_str(&read(rel)).unwrap_or_else(|e| panic!("{rel} does not parse: {e}"))
}

/// Series names a scrape can be queried by: every family, plus _bucket/_sum/_count of
/// histograms and summaries.
fn exported(scrape: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in scrape.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (name, kind) = (parts.next().unwrap(), parts.next().unwrap());
            names.insert(name.to_owned());
            if kind == "histogram" || kind == "summary" {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{suffix}"));
                }
            }
        }
    }
    names
}

/// Metric names in a PromQL expression: identifiers that are not functions, keywords or
/// label names (inside `{}` or after by/without).
fn metric_names(expr: &str) -> Vec<String> {
    const WORDS: [&str; 16] = [
        "sum",
        "rate",
        "by",
        "without",
        "histogram_quantile",
        "topk",
        "le",
        "max",
        "min",
        "avg",
        "count",
        "increase",
        "irate",
        "on",
        "and",
        "or",
    ];
    let mut out = Vec::new();
    let mut depth_braces = 0;
    let mut depth_label_list = false;
    let chars: Vec<char> = expr.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '{' {
            depth_braces += 1;
        } else if c == '}' {
            depth_braces -= 1;
        } else if c == '[' {
            while i < chars.len() && chars[i] != ']' {
                i += 1;
            }
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
            {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            if word == "by" || word == "without" {
                depth_label_list = true;
            } else if depth_label_list {
                // label names until the closing parenthesis
            } else if depth_braces == 0 && !WORDS.contains(&word.as_str()) {
                out.push(word);
            }
            continue;
        } else if c == ')' {
            depth_label_list = false;
        }
        i += 1;
    }
    out
}

fn dashboard_exprs() -> Vec<(String, String)> {
    let dash: Value = serde_json::from_str(&read("grafana/dashboards/kafka-delay.json")).unwrap();
    let mut out = Vec::new();
    for p in dash["panels"].as_array().unwrap() {
        if p["type"] == "row" {
            continue;
        }
        let targets = p["targets"].as_array().expect("a panel has queries");
        assert!(!targets.is_empty(), "panel {} has no query", p["title"]);
        assert_eq!(p["datasource"]["uid"], "prometheus", "panel {}", p["title"]);
        for t in targets {
            out.push((
                p["title"].as_str().unwrap().to_owned(),
                t["expr"].as_str().unwrap().to_owned(),
            ));
        }
    }
    out
}

#[test]
fn promql_names_are_found_in_expressions() {
    assert_eq!(
        metric_names(
            r#"histogram_quantile(0.99, sum by (le) (rate(kafka_delay_fire_lateness_seconds_bucket[5m])))"#
        ),
        ["kafka_delay_fire_lateness_seconds_bucket"]
    );
    assert_eq!(
        metric_names(r#"sum by (target) (rate(x_total{target="a"}[1m])) / y"#),
        ["x_total", "y"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_queries_only_exported_metrics_and_promtool_accepts_a_real_scrape() {
    // A fire limit on the target, loose enough to hold nothing here, gives the held-back
    // gauge a series.
    let t = Topics::new();
    let limit = format!("^{}$=1000/s,burst=100", t.target);
    let env = Env::start_with(t, 1, &["--fire-rate", &limit]).await;
    let (kafka, t, addr) = (&env.kafka, &env.t, env.broker.http_addr());
    // Give every labelled family a series: a delivery, a reject, a retry, a pending record.
    let producer = kafka.producer();
    let reader = reader(kafka, &t.target, 1);
    produce(
        &producer,
        &t.delay,
        Some("k"),
        Some("v"),
        &[("delay-target", &t.target), ("delay-after", "0")],
    )
    .await;
    produce(
        &producer,
        &t.delay,
        Some("k"),
        Some("v"),
        &[("delay-target", &t.target), ("delay-after", "30m")],
    )
    .await;
    produce(
        &producer,
        &t.delay,
        Some("bad"),
        Some("v"),
        &[("delay-after", "1s")],
    )
    .await;
    let retry = t.delay_topic("retry");
    produce(
        &producer,
        &retry,
        Some("r"),
        Some("v"),
        &[("delay-target", &t.target), ("retry-after", "0")],
    )
    .await;
    produce(
        &producer,
        &retry,
        Some("r"),
        Some("v"),
        &[("delay-target", &t.target), ("retry-max-attempts", "0")],
    )
    .await;
    assert_eq!(collect(&reader, 2, Duration::from_secs(30)).await.len(), 2);
    let (_, admin_status) = (
        0,
        http_json(
            addr,
            "DELETE",
            "/api/v1/pending/0000000000000000",
            None,
            None,
        )
        .await
        .0,
    );
    assert_eq!(admin_status, 404);

    // Consumer lag comes from librdkafka's statistics, every 5 s. The two deliveries above do
    // not mean every record is ingested: the 30m record and the rejected one may be in a group
    // the ingest task takes after the retry records (whose dead-letter topic it creates first),
    // so wait for the pending record and the dead letter to show too.
    const DEAD_LETTERED: &str = "kafka_delay_dead_letter_records_total{reason=\"missing-target\"}";
    let pending_target = format!(
        "kafka_delay_pending_target_records{{target=\"{}\"}}",
        t.target
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let scrape = loop {
        let (status, body) = http_get(addr, "/metrics").await;
        assert_eq!(status, 200);
        let settled = body.contains("kafka_delay_ingest_consumer_lag_records{")
            && metric(&body, &pending_target) == Some(1.0)
            && metric(&body, DEAD_LETTERED) == Some(1.0);
        if settled || Instant::now() > deadline {
            break body;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let names = exported(&scrape);
    for want in [
        "kafka_delay_ingest_consumer_lag_records",
        "kafka_delay_pending_target_records",
        "kafka_delay_pending_due_records",
        "kafka_delay_pending_oldest_overdue_seconds",
        "kafka_delay_store_size_bytes",
        "kafka_delay_store_write_stopped",
        "kafka_delay_store_kept_in_memory_fired_total",
        "kafka_delay_retry_records_total",
        "kafka_delay_retry_exhausted_total",
        "kafka_delay_fire_produce_errors_total",
        "kafka_delay_admin_requests_total",
        "kafka_delay_fire_held_records",
        "process_resident_memory_bytes",
    ] {
        assert!(
            names.contains(want),
            "{want} not exported:\n{}",
            brief(&scrape)
        );
    }
    assert_eq!(
        metric(&scrape, &pending_target),
        Some(1.0),
        "{}",
        brief(&scrape)
    );
    assert_eq!(
        metric(&scrape, DEAD_LETTERED),
        Some(1.0),
        "{}",
        brief(&scrape)
    );
    assert_eq!(
        metric(&scrape, "kafka_delay_pending_due_records{due=\"1h\"}"),
        Some(1.0)
    );
    assert!(metric(&scrape, "kafka_delay_store_size_bytes").unwrap() > 0.0);
    // The produce round trip is part of each delivered record's lateness: it starts when the
    // record is handed to the producer, at or after its due time.
    let produce = |s| metric(&scrape, &format!("kafka_delay_fire_produce_seconds_{s}")).unwrap();
    let delivery = |s| {
        metric(
            &scrape,
            &format!("kafka_delay_delivery_lateness_seconds_{s}"),
        )
        .unwrap()
    };
    assert!(produce("count") >= 2.0, "{scrape}");
    assert!(produce("count") <= delivery("count"));
    assert!(produce("sum") <= delivery("sum"), "{scrape}");
    // Every record fired (the two delivered, the exhausted retry's dead letter, the start's
    // probe) was due within --keep-in-memory-within (5 s) of its arrival: each was fired from
    // memory, which it has left. The one due in 30 minutes was not kept.
    let kept = |name| metric(&scrape, &format!("kafka_delay_store_kept_in_memory_{name}"));
    let fired = metric(&scrape, "kafka_delay_fire_lateness_seconds_count");
    assert!(fired >= Some(3.0), "{}", brief(&scrape));
    assert_eq!(kept("fired_total"), fired, "{}", brief(&scrape));
    assert_eq!(kept("records"), Some(0.0));
    assert_eq!(kept("bytes"), Some(0.0));

    let mut checked = 0;
    for (panel, expr) in dashboard_exprs() {
        for name in metric_names(&expr) {
            assert!(
                names.contains(&name),
                "panel '{panel}': {name} in `{expr}` is not exported"
            );
            checked += 1;
        }
    }
    assert!(checked >= 25, "only {checked} names checked");

    // promtool (Debian package prometheus, installed by `make deps`) on the same scrape.
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool is installed by `make deps` (Debian package prometheus)");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(scrape.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    env.broker.shutdown().await;
}

#[test]
fn compose_and_provisioning_files_parse_and_point_at_files_that_exist() {
    let compose = yaml("compose.yaml");
    let services = compose["services"].as_mapping().expect("services");
    for name in [
        "kafka",
        "kafka-delay-0",
        "kafka-delay-1",
        "prometheus",
        "grafana",
    ] {
        assert!(services.contains_key(name), "service {name}");
    }
    let kafka = &compose["services"]["kafka"];
    // The Kafka of compose.yaml is the version the test suite runs against (kafka/pom.xml).
    let pom = read("kafka/pom.xml");
    let tested = pom
        .split("<kafka.version>")
        .nth(1)
        .and_then(|s| s.split("</kafka.version>").next())
        .expect("kafka.version in kafka/pom.xml");
    assert_eq!(
        kafka["image"].as_str().unwrap(),
        format!("apache/kafka:{tested}")
    );
    assert_eq!(
        kafka["environment"]["KAFKA_PROCESS_ROLES"], "broker,controller",
        "KRaft"
    );
    // Two instances of one group, each with its own instance id and volume, the changelog on
    // (the anchors and merge keys resolved as compose resolves them).
    let instances: Vec<serde_yaml::Value> = ["kafka-delay-0", "kafka-delay-1"]
        .iter()
        .map(|name| {
            let mut svc = compose["services"][*name].clone();
            svc.apply_merge().expect("merge keys resolve");
            svc["environment"]
                .apply_merge()
                .expect("merge keys resolve");
            svc
        })
        .collect();
    for kd in &instances {
        assert_eq!(kd["build"], ".");
        assert_eq!(kd["environment"]["KAFKA_DELAY_BROKERS"], "kafka:9092");
        assert_eq!(kd["environment"]["KAFKA_DELAY_CHANGELOG"], "true");
        assert_eq!(kd["environment"]["KAFKA_DELAY_STANDBY_REPLICAS"], "1");
    }
    // Each advertises the address the other reaches it at: its service name.
    for (i, name) in ["kafka-delay-0", "kafka-delay-1"].iter().enumerate() {
        let advertised = &instances[i]["environment"]["KAFKA_DELAY_ADVERTISED_HTTP_ADDR"];
        assert_eq!(advertised.as_str(), Some(format!("{name}:9464").as_str()));
    }
    assert!(Path::new(ROOT).join("Dockerfile").is_file());
    let id = |i: usize| instances[i]["environment"]["KAFKA_DELAY_INSTANCE_ID"].clone();
    assert_ne!(id(0), id(1), "each instance its own --instance-id");
    let volume = |i: usize| instances[i]["volumes"][0].clone();
    assert_ne!(volume(0), volume(1), "each instance its own data volume");
    let http = instances[0]["environment"]["KAFKA_DELAY_HTTP_ADDR"]
        .as_str()
        .unwrap();
    let port = http.rsplit(':').next().unwrap();

    // Every bind mount of the stack names a file or directory of this repository.
    let mut mounts = Vec::new();
    for (_, svc) in services {
        for v in svc["volumes"].as_sequence().into_iter().flatten() {
            let v = v.as_str().unwrap();
            if let Some(rest) = v.strip_prefix("./") {
                let mut parts = rest.split(':');
                let host = parts.next().unwrap();
                let inside = parts.next().expect("a mount target").to_owned();
                assert!(
                    Path::new(ROOT).join(host).exists(),
                    "{host} mounted but missing"
                );
                mounts.push((host.to_owned(), inside));
            }
        }
    }
    let inside = |host: &str| {
        mounts
            .iter()
            .find(|(h, _)| h == host)
            .map(|(_, i)| i.clone())
            .unwrap_or_else(|| panic!("{host} is not mounted"))
    };

    // Prometheus scrapes kafka-delay on the port it listens on.
    let prom_file = "grafana/prometheus/prometheus.yml";
    assert_eq!(inside(prom_file), "/etc/prometheus/prometheus.yml");
    let prom = yaml(prom_file);
    let targets = &prom["scrape_configs"][0]["static_configs"][0]["targets"];
    assert_eq!(
        targets,
        &serde_yaml::to_value([
            format!("kafka-delay-0:{port}"),
            format!("kafka-delay-1:{port}")
        ])
        .unwrap()
    );

    // Grafana: the data source the dashboard uses, and a provider loading the dashboard's dir.
    let provisioning = inside("grafana/provisioning");
    assert_eq!(provisioning, "/etc/grafana/provisioning");
    let ds = yaml("grafana/provisioning/datasources/prometheus.yaml");
    assert_eq!(ds["datasources"][0]["uid"], "prometheus");
    assert_eq!(ds["datasources"][0]["url"], "http://prometheus:9090");
    let providers = yaml("grafana/provisioning/dashboards/kafka-delay.yaml");
    let path = providers["providers"][0]["options"]["path"]
        .as_str()
        .unwrap();
    assert_eq!(inside("grafana/dashboards"), path);
    let home = compose["services"]["grafana"]["environment"]
        ["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
        .as_str()
        .unwrap();
    assert_eq!(home, format!("{path}/kafka-delay.json"));
    assert!(Path::new(ROOT)
        .join("grafana/dashboards/kafka-delay.json")
        .is_file());
    assert!(!dashboard_exprs().is_empty());
}
