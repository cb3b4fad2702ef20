//! kafka-delay used through the official Java client (`kafka-clients`, the version of the test
//! broker) against Apache Kafka: `tests/java/JavaClient.java`, run with `java` from the pinned
//! Kafka's classpath, produces delayed records, consumes the fired ones and retries one with the
//! README's Java snippet.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

const JAVA_CLIENT: &str = "tests/java/JavaClient.java";

fn manifest_file(rel: &str) -> String {
    std::fs::read_to_string(Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join(rel))
        .unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The lines between `// README java-retry begin` and `end` in the Java client, dedented.
fn tested_java_snippet() -> String {
    let src = manifest_file(JAVA_CLIENT);
    let lines: Vec<&str> = src
        .lines()
        .skip_while(|l| !l.contains("README java-retry begin"))
        .skip(1)
        .take_while(|l| !l.contains("README java-retry end"))
        .collect();
    assert!(!lines.is_empty(), "markers in {JAVA_CLIENT}");
    let indent = lines
        .iter()
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap();
    lines
        .iter()
        .map(|l| format!("{}\n", &l[indent..]))
        .collect()
}

/// The README's ```java block under "From Java".
fn readme_java_snippet() -> String {
    let readme = manifest_file("README.md");
    let from = readme.find("**From Java**").expect("README: From Java");
    let block = &readme[from..];
    let start = block.find("```java\n").expect("a java block") + "```java\n".len();
    let end = block[start..].find("```").expect("closing fence");
    block[start..start + end].to_owned()
}

#[test]
fn the_readme_java_retry_snippet_is_the_one_the_java_client_test_runs() {
    assert_eq!(readme_java_snippet(), tested_java_snippet());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_java_client_gets_delayed_records_on_its_own_partitions_and_retries_them() {
    let kafka = Kafka::External(apache::shared());
    let mut t = Topics::new();
    // The README snippet sends retries to `delay.retry` itself.
    t.pattern = format!(r"^(delay\.{}\..+|delay\.retry)$", t.id);
    kafka.create_topic("delay.retry", 1).await;
    const PARTITIONS: i32 = 12;
    let env = Env::start_on(kafka, t, PARTITIONS, &[]).await;
    let keys = "10000";
    let out = Command::new("timeout")
        .args(["300", "java", "-cp", &apache::classpath(), JAVA_CLIENT])
        .args([&env.kafka.brokers(), &env.t.delay, &env.t.target, keys])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .output()
        .expect("run java");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "the Java client test failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!(
            "received {keys} of {keys} keys on {PARTITIONS} partitions: 0 misplaced, 0 early, 0 altered, 0 duplicated"
        )),
        "{stdout}"
    );
    assert!(stdout.contains("retry-attempt=1"), "{stdout}");
    assert!(stdout.trim_end().ends_with("OK"), "{stdout}");
    env.broker.shutdown().await;
}
