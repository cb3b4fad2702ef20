//! Instances of one group on Apache Kafka, for the cluster and exactly-once suites: spawned
//! with a changelog, killed, paused, stopped; and `kafka-delay verify` as the judge.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::procs::{free_port, spawn_instance, Proc, BIN};
use super::{Kafka, Topics};

/// One `kafka-delay run --changelog` of the test's group, logging to `logs/<name>.log`.
pub(crate) struct Instance {
    pub(crate) _proc: Proc,
    pub(crate) port: u16,
}

pub(crate) fn spawn(kafka: &Kafka, t: &Topics, data: &Path, logs: &Path, name: &str) -> Instance {
    spawn_with(kafka, t, (data, logs), name, &[])
}

/// [`spawn`] with more flags.
pub(crate) fn spawn_with(
    kafka: &Kafka,
    t: &Topics,
    (data, logs): (&Path, &Path),
    name: &str,
    more: &[&str],
) -> Instance {
    let port = free_port();
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(logs.join(format!("{name}.log")))
        .unwrap();
    let mut flags = vec!["--changelog", "--changelog-replication", "1"];
    flags.extend(more);
    let proc = spawn_instance(
        &kafka.brokers(),
        t,
        (data, port),
        Some(name),
        &[],
        &flags,
        Stdio::from(log),
    );
    Instance { _proc: proc, port }
}

/// The last lines of every instance's log, for a failure message.
pub(crate) fn logs_tail(logs: &Path) -> String {
    let mut out = String::new();
    for e in std::fs::read_dir(logs).unwrap().flatten() {
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        out += &format!("--- {}\n", e.path().display());
        for l in &lines[lines.len().saturating_sub(25)..] {
            out += l;
            out += "\n";
        }
    }
    out
}

pub(crate) fn soak() -> bool {
    std::env::var("KAFKA_DELAY_SOAK").is_ok_and(|v| v == "1")
}

/// Stops an instance as an orchestrator would (SIGTERM), waiting at most 60 s.
pub(crate) fn stop_gracefully(mut i: Instance) {
    let pid = i._proc.0.id().to_string();
    let _ = Command::new("kill").args(["-TERM", &pid]).status();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        if let Ok(Some(_)) = i._proc.0.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("instance did not stop within 60 s of SIGTERM");
}

impl Instance {
    /// Sends `signal` (`STOP`, `CONT`, `KILL`...) to the instance.
    pub(crate) fn signal(&self, signal: &str) {
        let pid = self._proc.0.id().to_string();
        let ok = Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -{signal} {pid}");
    }
}

/// `kafka-delay verify` producing `count` records to the test's delay topic, due over
/// `window` from `lead` on, and reading the target (read_committed) until all arrived or
/// `grace` after the last due time.
pub(crate) fn verify(
    kafka: &Kafka,
    t: &Topics,
    count: u64,
    (lead, window, grace): (&str, &str, &str),
) -> Child {
    Command::new(BIN)
        .args([
            "verify",
            "--brokers",
            &kafka.brokers(),
            "--delay-topic",
            &t.delay,
        ])
        .args(["--target", &t.target, "--count", &count.to_string()])
        .args([
            "--lead", lead, "--window", window, "--grace", grace, "--json",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn kafka-delay verify")
}

/// The report of a [`verify`] run (its last line, JSON), waiting for it to finish.
pub(crate) async fn report(verify: Child) -> serde_json::Value {
    let out = tokio::task::spawn_blocking(move || verify.wait_with_output())
        .await
        .unwrap()
        .expect("kafka-delay verify ran");
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap_or_default()
}
