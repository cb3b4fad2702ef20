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

    /// Stops the broker and copies its directory (data, configuration, log) to `to`.
    #[allow(dead_code)] // not every suite that includes this module keeps a broker
    pub(crate) fn keep(&self, to: &Path) {
        self.stop();
        let copied = Command::new("cp")
            .arg("-a")
            .arg(self.dir.path())
            .arg(to)
            .status()
            .expect("cp");
        assert!(
            copied.success(),
            "cannot copy the broker's directory to {}",
            to.display()
        );
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

/// A production-shaped cluster of this test's (`scripts/kafka.sh cluster`): three KRaft nodes,
/// replication factor 3 and `min.insync.replicas=2`, SASL_SSL with SCRAM, the StandardAuthorizer.
/// Each user's password is `NAME-secret`; `admin` is the super user. Stopped when dropped, and
/// by the script's watchdog if this test process dies first.
pub(crate) struct Secured {
    dir: TempDir,
    brokers: String,
}

impl Secured {
    pub(crate) fn start() -> Self {
        let dir = TempDir::new().expect("temp dir");
        let pid = std::process::id().to_string();
        let out = kafka_sh(&["cluster", dir.path().to_str().unwrap(), &pid]);
        let brokers = out
            .lines()
            .find_map(|l| l.strip_prefix("bootstrap.servers="))
            .expect("bootstrap.servers= line")
            .to_owned();
        Secured { dir, brokers }
    }

    pub(crate) fn brokers(&self) -> &str {
        &self.brokers
    }

    pub(crate) fn path(&self, file: &str) -> String {
        self.dir.path().join(file).to_str().unwrap().to_owned()
    }

    /// librdkafka's properties to connect as `user`, as KEY=VALUE.
    pub(crate) fn client_props(&self, user: &str) -> Vec<(String, String)> {
        [
            ("security.protocol", "SASL_SSL".to_owned()),
            ("sasl.mechanisms", "SCRAM-SHA-512".to_owned()),
            ("sasl.username", user.to_owned()),
            ("sasl.password", format!("{user}-secret")),
            ("ssl.ca.location", self.path("ca.pem")),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    /// Runs one of Kafka's tools as the admin (`--bootstrap-server` and `--command-config` are
    /// added); panics with its output when it fails.
    pub(crate) fn tool(&self, class: &str, args: &[&str]) -> String {
        let config = self.path("admin.properties");
        let mut all = vec![
            "tool",
            class,
            "--bootstrap-server",
            &self.brokers,
            "--command-config",
            &config,
        ];
        all.extend(args);
        kafka_sh(&all)
    }

    /// SIGKILL of node `n` (1 to 3).
    pub(crate) fn kill(&self, n: u32) {
        kafka_sh(&["kill", &self.path(&format!("node{n}"))]);
    }

    /// Starts node `n` again with its data.
    pub(crate) fn restart(&self, n: u32) {
        let pid = std::process::id().to_string();
        kafka_sh(&["start", &self.path(&format!("node{n}")), &pid]);
    }
}

impl Drop for Secured {
    fn drop(&mut self) {
        for n in 1..=3 {
            let _ = Command::new("bash")
                .arg(script())
                .args(["kill", &self.path(&format!("node{n}"))])
                .stdin(Stdio::null())
                .output();
        }
    }
}
