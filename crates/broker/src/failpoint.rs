//! Crash points in the durability order, for the fault tests. Compiled in only with the
//! `failpoints` feature (the test command enables it); without it [`hit`] is empty.
//!
//! `KAFKA_DELAY_FAILPOINT=<name>` makes the process abort (like `kill -9`: no unwinding, no
//! flush) the first time it reaches that point:
//! - `after-consume`: records consumed and interpreted, nothing stored;
//! - `after-store-write`: the ingest batch is in RocksDB, its offsets not yet stored for commit;
//! - `after-delivery`: delivery reports received, the records not yet deleted.

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
