//! Crash points in the durability order, for the fault tests. Compiled in only with the
//! `failpoints` feature (the test command enables it); without it [`hit`] is empty.
//!
//! `KAFKA_DELAY_FAILPOINT=<name>` makes the process abort (like `kill -9`: no unwinding, no
//! flush) the first time it reaches that point:
//! - `after-consume`: records consumed and interpreted, nothing stored;
//! - `after-store-write`: the ingest batch is in RocksDB, its offsets not yet stored for commit;
//! - `after-delivery`: delivery reports received, the records not yet deleted;
//! - `before-commit` (exactly-once): a transaction's records and offsets sent, not committed
//!   (it stays open until fenced or timed out).
//!
//! `KAFKA_DELAY_TEST_CLOCK_FILE=<path>` steps the process's wall clock ([`wall_clock`]);
//! `KAFKA_DELAY_TEST_NO_HOLD_BACK` takes out its hold-back to Kafka's clock ([`hold_back`]), the
//! control of the clock tests; `KAFKA_DELAY_TEST_FAILED_RESTARTS=<n>` fails the first `n` starts
//! in place ([`fail_restart`]).

use std::sync::Arc;

use kafka_delay_core::clock::{Clock, SystemClock};

/// Aborts the process when `KAFKA_DELAY_FAILPOINT` names this point.
#[inline]
pub fn hit(name: &str) {
    #[cfg(feature = "failpoints")]
    {
        static ARMED: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
        let armed = ARMED.get_or_init(|| std::env::var("KAFKA_DELAY_FAILPOINT").ok());
        if armed.as_deref() == Some(name) {
            eprintln!("kafka-delay: failpoint {name}: aborting");
            std::process::abort();
        }
    }
    #[cfg(not(feature = "failpoints"))]
    let _ = name;
}

/// The wall clock of `kafka-delay run`: the system's; with the `failpoints` feature and
/// `KAFKA_DELAY_TEST_CLOCK_FILE` set, the system's plus the signed milliseconds that file
/// holds, read again every 50 ms (a test steps the clock of this process alone by writing it).
pub fn wall_clock() -> Arc<dyn Clock> {
    #[cfg(feature = "failpoints")]
    if let Ok(path) = std::env::var("KAFKA_DELAY_TEST_CLOCK_FILE") {
        let clock = kafka_delay_core::clock::OffsetClock::default();
        let stepped = clock.clone();
        std::thread::spawn(move || loop {
            let offset = std::fs::read_to_string(&path)
                .ok()
                .and_then(|s| s.trim().parse::<i64>().ok());
            if let Some(ms) = offset {
                stepped.set_offset_ms(ms);
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        });
        return Arc::new(clock);
    }
    Arc::new(SystemClock)
}

/// Whether this start in place is to fail: with the `failpoints` feature and
/// `KAFKA_DELAY_TEST_FAILED_RESTARTS=<n>` set, the first `n` starts after a restart in place fail,
/// as one that meets a broker cut off does (the control of the test that shows them tried
/// again); never otherwise.
pub fn fail_restart() -> bool {
    #[cfg(feature = "failpoints")]
    {
        use std::sync::atomic::{AtomicU32, Ordering};
        static LEFT: std::sync::OnceLock<AtomicU32> = std::sync::OnceLock::new();
        let left = LEFT.get_or_init(|| {
            let n = std::env::var("KAFKA_DELAY_TEST_FAILED_RESTARTS").ok();
            AtomicU32::new(n.and_then(|n| n.parse().ok()).unwrap_or(0))
        });
        left.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
    }
    #[cfg(not(feature = "failpoints"))]
    false
}

/// Whether the wall clock is held back to the Kafka cluster's
/// ([`crate::kafka_clock::HeldBack`]): always, but with the `failpoints` feature and
/// `KAFKA_DELAY_TEST_NO_HOLD_BACK` set, where a test shows what the hold-back prevents.
pub fn hold_back() -> bool {
    #[cfg(feature = "failpoints")]
    if std::env::var_os("KAFKA_DELAY_TEST_NO_HOLD_BACK").is_some() {
        return false;
    }
    true
}
