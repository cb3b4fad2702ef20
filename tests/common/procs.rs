//! Running the `kafka-delay` binary: a sandbox Kafka in its own process, brokers that can be
//! killed with SIGKILL and restarted.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::{http_get_at, Topics};

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_kafka-delay");

pub(crate) struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a process that prints `bootstrap.servers=...` and returns it with the address.
pub(crate) fn spawn_announcing(args: &[&str]) -> (Proc, String) {
    let mut child = Command::new(BIN)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn kafka-delay");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        if let Some(Ok(line)) = lines.next() {
            let _ = tx.send(line);
        }
        for _ in lines {}
    });
    let line = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("bootstrap line within 60s");
    let addr = line
        .strip_prefix("bootstrap.servers=")
        .expect("bootstrap.servers= line")
        .to_owned();
    assert!(addr.starts_with("127.0.0.1:"), "{addr}");
    (Proc(child), addr)
}

/// The Kafka that broker processes of a test talk to: KAFKA_DELAY_TEST_BROKERS when set (Apache
/// Kafka under `make test`), otherwise `kafka-delay sandbox`, the mock cluster in a process of
/// its own, so that it outlives the brokers the test kills.
pub(crate) fn process_kafka() -> (Option<Proc>, String) {
    match std::env::var("KAFKA_DELAY_TEST_BROKERS") {
        Ok(b) if !b.is_empty() => (None, b),
        _ => {
            let (sandbox, brokers) = spawn_announcing(&["sandbox"]);
            (Some(sandbox), brokers)
        }
    }
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub(crate) fn spawn_broker(brokers: &str, t: &Topics, data: &TempDir, http_port: u16) -> Proc {
    spawn_broker_with(brokers, t, data, http_port, &[])
}

/// [`spawn_broker`] with extra environment variables (a failpoint, say).
pub(crate) fn spawn_broker_with(
    brokers: &str,
    t: &Topics,
    data: &TempDir,
    http_port: u16,
    env: &[(&str, &str)],
) -> Proc {
    // Extra flags for a run, e.g. KAFKA_DELAY_TEST_FLAGS=--no-static-membership (which then
    // replaces --instance-id).
    let env_flags = std::env::var("KAFKA_DELAY_TEST_FLAGS").unwrap_or_default();
    let instance = (!env_flags.contains("--no-static-membership")).then(|| format!("i-{}", t.id));
    let flags: Vec<&str> = env_flags.split_whitespace().collect();
    let (data, out) = (data.path(), Stdio::null());
    spawn_instance(
        brokers,
        t,
        (data, http_port),
        instance.as_deref(),
        env,
        &flags,
        out,
    )
}

/// A `kafka-delay run` of the test's group and topics on `data` and `http_port`, as member
/// `instance` (static membership) when given, with `extra` flags; its logs go to `stderr`.
pub(crate) fn spawn_instance(
    brokers: &str,
    t: &Topics,
    (data, http_port): (&std::path::Path, u16),
    instance: Option<&str>,
    env: &[(&str, &str)],
    extra: &[&str],
    stderr: Stdio,
) -> Proc {
    let http = format!("127.0.0.1:{http_port}");
    let instance: Vec<&str> = instance
        .map(|i| vec!["--instance-id", i])
        .unwrap_or_default();
    let child = Command::new(BIN)
        .envs(env.iter().copied())
        .args([
            "run",
            "--brokers",
            brokers,
            "--data-dir",
            data.to_str().unwrap(),
            "--http-addr",
            &http,
            "--group-id",
            &format!("g-{}", t.id),
            "--source-pattern",
            &t.pattern,
            "--dead-letter-topic",
            &t.dlt,
            "--topic-refresh",
            "500ms",
            "--in-flight",
            "64",
        ])
        .args(&instance)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("spawn broker");
    Proc(child)
}

pub(crate) async fn wait_ready(port: u16, within: Duration) -> Duration {
    let started = Instant::now();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    loop {
        // A server restarting in place can take the request and close before answering: that
        // is not ready yet either.
        if let Ok(Some((200, _))) =
            tokio::time::timeout(Duration::from_secs(1), http_get_at(addr, "/readyz")).await
        {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "broker not ready within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
