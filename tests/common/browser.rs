//! The web console in a browser: `tests/console/console.mjs` (playwright-core driving Debian's
//! Chromium) run for one phase against a running broker.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// Where the screenshots go: the README's (`docs/console/`) with
/// KAFKA_DELAY_UPDATE_SCREENSHOTS=1, a temporary directory otherwise.
pub(crate) fn screenshots() -> (PathBuf, Option<tempfile::TempDir>) {
    if std::env::var("KAFKA_DELAY_UPDATE_SCREENSHOTS").is_ok_and(|v| v == "1") {
        let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join("docs/console");
        std::fs::create_dir_all(&dir).unwrap();
        (dir, None)
    } else {
        let tmp = tempfile::TempDir::new().unwrap();
        (tmp.path().to_owned(), Some(tmp))
    }
}

/// Runs the browser script for `phase` and returns its outcome.
pub(crate) fn browse(
    phase: &str,
    url: &str,
    ids: &Value,
    token: Option<&str>,
    shots: &Path,
) -> Value {
    let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join("tests/console");
    assert!(
        dir.join("node_modules/playwright-core").exists(),
        "playwright-core is not installed: run `make console` (npm ci in tests/console)"
    );
    let result = tempfile::NamedTempFile::new().unwrap();
    let out = Command::new("node")
        .arg("console.mjs")
        .current_dir(&dir)
        .env("CONSOLE_PHASE", phase)
        .env("CONSOLE_URL", url)
        .env("CONSOLE_IDS", ids.to_string())
        .env("CONSOLE_TOKEN", token.unwrap_or(""))
        .env("CONSOLE_SCREENSHOTS", shots)
        .env("CONSOLE_RESULT", result.path())
        .output()
        .expect("node runs");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{log}");
    assert!(out.status.success(), "the browser test failed:\n{log}");
    serde_json::from_str(&std::fs::read_to_string(result.path()).unwrap()).unwrap()
}
