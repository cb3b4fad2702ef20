//! The benchmark commands at tiny sizes, so that the figures of BENCHMARKS.md come from code
//! that is tested: every side of a round moves all its records, and the JSON carries what the
//! tables print. They run against KAFKA_DELAY_TEST_BROKERS when set, else on an embedded cluster.

use std::process::Command;

use tempfile::TempDir;

const BIN: &str = env!("CARGO_BIN_EXE_kafka-delay-bench");

/// Runs `kafka-delay-bench <line> <extra> --json <file>` within `seconds` (against
/// KAFKA_DELAY_TEST_BROKERS when set, else on the embedded cluster), asserts it succeeded, and
/// returns its stdout and the JSON it wrote.
fn bench(seconds: u32, line: &str, extra: &[&str]) -> (String, serde_json::Value) {
    let brokers = std::env::var("KAFKA_DELAY_TEST_BROKERS").unwrap_or_default();
    let extra: Vec<&str> = if brokers.is_empty() {
        extra.to_vec()
    } else {
        [extra, &["--brokers", &brokers]].concat()
    };
    let dir = TempDir::new().unwrap();
    let json = dir.path().join("bench.json");
    let out = Command::new("timeout")
        .arg(seconds.to_string())
        .arg(BIN)
        .args(line.split_whitespace())
        .args(&extra)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let written = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    (stdout, written)
}

/// `kafka-delay-bench e2e` as the README's figures are made, at a tiny size on the Kafka of the run: every
/// side of a throughput round moves all its records (the stored passthrough fails the run if
/// one is left in its RocksDB) and the JSON carries each side's rate.
#[test]
fn bench_e2e_moves_every_record_through_each_side_and_writes_the_rates() {
    let (stdout, report) = bench(
        120,
        "e2e --records 2000 --value-bytes 100 --rounds 1 --partitions 4 --sweep-for 0s",
        &[],
    );
    assert!(stdout.contains("stored passthrough rec/s"), "{stdout}");
    let rows = report["throughput"].as_array().unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["records"], 2000);
    for side in [
        "passthrough_per_s",
        "stored_passthrough_per_s",
        "broker_per_s",
        "broker_sync_per_s",
    ] {
        let rate = rows[0][side].as_f64().unwrap_or(0.0);
        assert!(rate > 0.0, "{side}: {}", rows[0]);
    }
    let busy = rows[0]["machine_busy_percent"].as_array().unwrap();
    assert_eq!(busy.len(), 3);
}

/// `kafka-delay-bench recovery` at a tiny size on the Kafka of the run: the broker process it times comes up
/// with every filled record pending and only those due within the horizon in its wheel, and the
/// same records are re-consumed from Kafka in the same run.
#[test]
fn bench_recovery_times_a_broker_process_over_a_filled_store_and_a_reconsume_of_the_same_records() {
    let work = TempDir::new().unwrap();
    // 3,000 records due evenly over 3 hours: about a third within the one-hour horizon.
    let (stdout, rows) = bench(
        180,
        "recovery --counts 3000 --spread 3h --horizon 1h --settle 0s",
        &["--work-dir", work.path().to_str().unwrap()],
    );
    assert!(stdout.contains("| 3000 |"), "{stdout}");
    let row = &rows.as_array().unwrap()[0];
    assert_eq!(row["pending"], 3000);
    assert_eq!(row["pending_reported"], 3000, "{row}");
    let in_wheel = row["in_wheel"].as_u64().unwrap();
    assert!(
        (900..=1100).contains(&in_wheel),
        "the first hour only: {row}"
    );
    assert!(row["start_to_ready_s"].as_f64().unwrap() > 0.0, "{row}");
    assert!(row["counts_restored_s"].as_f64().is_some(), "{row}");
    assert!(row["wheel_armed_s"].as_f64().is_some(), "{row}");
    assert!(row["rss_bytes"].as_u64().unwrap() > 1_000_000, "{row}");
    assert!(row["reconsume_s"].as_f64().unwrap() > 0.0, "{row}");
}

/// `kafka-delay-bench modes` at a tiny size on the Kafka of the run: the passthrough and the
/// broker in every mode that Kafka runs (on the embedded cluster only `local`) each move all
/// their records, and the JSON carries each mode's rate and its ratio to the passthrough.
#[test]
fn bench_modes_moves_every_record_through_the_passthrough_and_each_mode() {
    let on_kafka = std::env::var("KAFKA_DELAY_TEST_BROKERS").is_ok_and(|b| !b.is_empty());
    let modes = if on_kafka {
        "local,changelog,exactly-once"
    } else {
        "local"
    };
    let line =
        format!("modes --records 2000 --value-bytes 100 --rounds 1 --partitions 4 --modes {modes}");
    let (stdout, rows) = bench(180, &line, &[]);
    assert!(
        stdout.contains("| 100 B | 2000 x 1 | passthrough |"),
        "{stdout}"
    );
    let row = &rows.as_array().unwrap()[0];
    assert!(row["passthrough_per_s"].as_f64().unwrap() > 0.0, "{row}");
    let measured: Vec<&str> = row["modes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            assert!(m["per_s"].as_f64().unwrap() > 0.0, "{m}");
            assert!(m["of_passthrough"].as_f64().unwrap() > 0.0, "{m}");
            m["mode"].as_str().unwrap()
        })
        .collect();
    assert_eq!(measured.join(","), modes);
}

/// `kafka-delay-bench wave` at a tiny size on Apache Kafka: in each production mode every
/// record of the wave, all due at one instant the bench planned, arrives once and none before
/// that instant by Kafka's append time, and the JSON carries the drain rate beside its
/// passthrough's, and the drain's CPU per record. Without Apache Kafka the command says it
/// needs one.
#[test]
fn bench_wave_fires_every_record_of_a_wave_once_and_none_early_in_each_production_mode() {
    let on_kafka = std::env::var("KAFKA_DELAY_TEST_BROKERS").is_ok_and(|b| !b.is_empty());
    if !on_kafka {
        let out = Command::new(BIN)
            .args(["wave", "--records", "10"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains("--brokers"),
            "{stderr}"
        );
        return;
    }
    let line = "wave --records 2000 --partitions 4 --lead 15s --modes changelog,exactly-once";
    let (stdout, waves) = bench(240, line, &[]);
    assert!(stdout.contains("| changelog | 2000 |"), "{stdout}");
    let waves = waves.as_array().unwrap();
    let modes: Vec<&str> = waves.iter().map(|w| w["mode"].as_str().unwrap()).collect();
    assert_eq!(modes, ["changelog", "exactly-once"]);
    for w in waves {
        let v = &w["verdict"];
        assert_eq!(v["arrival"], "log-append-time", "{w}");
        assert_eq!(v["received"], 2000, "{w}");
        assert_eq!(
            (&v["early"], &v["lost"], &v["duplicates"]),
            (&0.into(), &0.into(), &0.into()),
            "{w}"
        );
        assert!(w["drain_per_s"].as_f64().unwrap() > 0.0, "{w}");
        assert!(w["of_passthrough"].as_f64().unwrap() > 0.0, "{w}");
        assert!(
            w["drain_cpu_us_per_record"]
                .as_f64()
                .is_some_and(|c| c >= 0.0),
            "{w}"
        );
    }
}
