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
    let mut flags = vec!["--changelog", "--changelog-replication", "1"];
    flags.extend(more);
    spawn_flags(kafka, t, (data, logs), name, &flags)
}

/// A `kafka-delay run` of the test's group with only `flags` (no `--changelog`: the mode is
/// the default one unless a flag says otherwise), logging to `logs/<name>.log`.
pub(crate) fn spawn_flags(
    kafka: &Kafka,
    t: &Topics,
    (data, logs): (&Path, &Path),
    name: &str,
    flags: &[&str],
) -> Instance {
    spawn_env(kafka, t, (data, logs), name, flags, &[])
}

/// [`spawn_flags`] with `env` set for the process.
pub(crate) fn spawn_env(
    kafka: &Kafka,
    t: &Topics,
    (data, logs): (&Path, &Path),
    name: &str,
    flags: &[&str],
    env: &[(&str, &str)],
) -> Instance {
    let port = free_port();
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(logs.join(format!("{name}.log")))
        .unwrap();
    let proc = spawn_instance(
        &kafka.brokers(),
        t,
        (data, port),
        Some(name),
        env,
        flags,
        Stdio::from(log),
    );
    Instance { _proc: proc, port }
}

/// Every instance's log for a failure message: each kind of line counted (level, where, and
/// the message without its fields, with the times of its first and last line), then the last
/// lines. A failure's output is cut short where it is read, and the counts say what the
/// instance kept doing, which the last lines alone do not.
pub(crate) fn logs_tail(logs: &Path) -> String {
    // A disk that filled up silences every log at once; say how full it is.
    let df = Command::new("df").arg("-h").arg(logs).output();
    let mut out = df.map_or_else(
        |e| format!("df: {e}\n"),
        |o| String::from_utf8_lossy(&o.stdout).into_owned(),
    );
    for e in std::fs::read_dir(logs).unwrap().flatten() {
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        out += &format!("--- {}: {} lines\n", e.path().display(), lines.len());
        out += &kinds_of_lines(&lines);
        for l in &lines[lines.len().saturating_sub(12)..] {
            out += l;
            out += "\n";
        }
    }
    out
}

/// `count first..last kind` for each kind of line, in the order each first appeared.
fn kinds_of_lines(lines: &[&str]) -> String {
    let mut kinds: Vec<(String, usize, &str, &str)> = Vec::new();
    for l in lines {
        let mut words = l.split_whitespace();
        let time = words.next().unwrap_or_default();
        let kind: Vec<&str> = words
            .take_while(|w| {
                !w.split_once('=').is_some_and(|(k, _)| {
                    !k.is_empty() && k.chars().all(|c| c.is_alphanumeric() || c == '_')
                })
            })
            .collect();
        let kind: String = kind.join(" ").chars().take(140).collect();
        let time = time.get(11..23).unwrap_or(time);
        match kinds.iter_mut().find(|k| k.0 == kind) {
            Some(k) => (k.1, k.3) = (k.1 + 1, time),
            None => kinds.push((kind, 1, time, time)),
        }
    }
    let mut out: String = (kinds.iter().take(40))
        .map(|(kind, n, first, last)| format!("  {n:>6} {first}..{last} {kind}\n"))
        .collect();
    if kinds.len() > 40 {
        out += &format!("  ... and {} more kinds\n", kinds.len() - 40);
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
        if signal == "STOP" {
            wait_stopped(&pid);
        }
    }
}

/// Waits until every thread of `pid` is stopped. `kill -STOP` returns once the signal is
/// queued: the process stops when one of its threads next runs, and on a loaded machine
/// another thread can still answer a request in between.
fn wait_stopped(pid: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let stopped = || {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return false;
        };
        tasks.flatten().all(|t| {
            let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
            // `pid (comm) state ...`: comm may hold spaces and parentheses.
            let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start());
            state.is_some_and(|s| s.starts_with('T') || s.starts_with('t'))
        })
    };
    while !stopped() {
        assert!(
            std::time::Instant::now() < deadline,
            "pid {pid} not stopped 10 s after SIGSTOP"
        );
        std::thread::sleep(Duration::from_millis(10));
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
    let report: serde_json::Value =
        serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap_or_default();
    // Judged by Kafka's clock (the target's append time), and every record of the run read.
    assert_eq!(
        (report["arrival"].as_str(), report["mangled"].as_u64()),
        (Some("log-append-time"), Some(0)),
        "{report}"
    );
    report
}
