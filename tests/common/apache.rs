//! A real Apache Kafka broker (KRaft, one JVM) for the tests that need one: started and stopped
//! by `scripts/kafka.sh`, from the version pinned in `kafka/pom.xml`.
//!
//! `make test` runs the broker suites against one shared broker (`scripts/kafka.sh run`, which
//! sets KAFKA_DELAY_TEST_BROKERS). Tests that only make sense on real Kafka use [`shared`]: that
//! broker when it is set, otherwise one started for this test process. A test that restarts
//! Kafka starts a [`Private`] broker of its own so that it never disturbs the others.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use tempfile::TempDir;

fn script() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join("scripts/kafka.sh")
}

/// Runs `scripts/kafka.sh ARGS` and returns its stdout; panics with its stderr on failure.
fn kafka_sh(args: &[&str]) -> String {
    let out = Command::new("bash")
        .arg(script())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run scripts/kafka.sh");
    assert!(
        out.status.success(),
        "scripts/kafka.sh {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// The Java classpath of the pinned Kafka (broker, `kafka-clients`, logging), fetched once.
pub(crate) fn classpath() -> String {
    match std::env::var("KAFKA_DELAY_KAFKA_CLASSPATH") {
        Ok(cp) if !cp.is_empty() => cp,
        _ => kafka_sh(&["fetch"]).trim().to_owned(),
    }
}

/// The Kafka version the tests run against.
pub(crate) fn version() -> String {
    kafka_sh(&["version"]).trim().to_owned()
}

/// A broker whose state lives in a directory of this test's; stopped (SIGKILL) when dropped,
/// and by the script's watchdog if this test process dies first.
pub(crate) struct Private {
    dir: TempDir,
    brokers: String,
}

impl Private {
    pub(crate) fn start() -> Self {
        let dir = TempDir::new().expect("temp dir");
        let brokers = Self::start_in(dir.path());
        Private { dir, brokers }
    }

    fn start_in(dir: &Path) -> String {
        let pid = std::process::id().to_string();
        let out = kafka_sh(&["start", dir.to_str().unwrap(), &pid]);
        out.lines()
            .find_map(|l| l.strip_prefix("bootstrap.servers="))
            .expect("bootstrap.servers= line")
            .to_owned()
    }

    pub(crate) fn brokers(&self) -> &str {
        &self.brokers
    }

    /// A clean stop (SIGTERM; the broker writes its producer-state snapshots and exits).
    pub(crate) fn stop(&self) {
        kafka_sh(&["stop", self.dir.path().to_str().unwrap()]);
    }

    /// SIGKILL: the JVM dies without a clean shutdown.
    pub(crate) fn kill(&self) {
        kafka_sh(&["kill", self.dir.path().to_str().unwrap()]);
    }

    /// Starts the stopped broker again on the same port with the same data.
    pub(crate) fn restart(&self) {
        let brokers = Self::start_in(self.dir.path());
        assert_eq!(brokers, self.brokers, "the same address after a restart");
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("kafka.log")).unwrap_or_default()
    }
}

impl Drop for Private {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(script())
            .args(["kill", self.dir.path().to_str().unwrap()])
            .stdin(Stdio::null())
            .output();
    }
}

/// The real Kafka of this test process: KAFKA_DELAY_TEST_BROKERS when `make test` set it (it
/// is then Apache Kafka from `scripts/kafka.sh run`), otherwise a [`Private`] broker started on
/// first use and kept for the process.
pub(crate) fn shared() -> String {
    match std::env::var("KAFKA_DELAY_TEST_BROKERS") {
        Ok(b) if !b.is_empty() => b,
        _ => {
            static OWN: OnceLock<Private> = OnceLock::new();
            OWN.get_or_init(Private::start).brokers().to_owned()
        }
    }
}
