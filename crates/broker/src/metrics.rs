//! Prometheus metrics, all registered in one place against a registry that is passed in, so
//! tests get their own registry. Names: `kafka_delay_<subsystem>_<what>_<unit>`; labels are
//! bounded (source topic, target topic, reason code, error kind), never a key or an id.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

/// Lateness buckets in seconds: fine enough to show milliseconds (and to tell 10 ms, the
/// delivery target with the default linger, from 15 or 20), wide enough for outages.
const LATENESS_BUCKETS: [f64; 23] = [
    0.000_5, 0.001, 0.002, 0.003, 0.005, 0.007_5, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25,
    0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3_600.0,
];

/// Adds one to `counter` for each label: one `inc_by` per distinct label rather than a label
/// lookup per record (a batch of records usually has one or a few).
pub fn count_each<'a>(counter: &IntCounterVec, labels: impl IntoIterator<Item = &'a str>) {
    let mut tally: Vec<(&str, u64)> = Vec::new();
    for label in labels {
        match tally.iter_mut().find(|(l, _)| *l == label) {
            Some((_, n)) => *n += 1,
            None => tally.push((label, 1)),
        }
    }
    for (label, n) in tally {
        counter.with_label_values(&[label]).inc_by(n);
    }
}

/// Every metric of the broker.
#[derive(Debug, Clone)]
pub struct Metrics {
    /// Records consumed from delay topics, by source topic.
    pub ingested: IntCounterVec,
    /// Records that could not be scheduled, by reason code.
    pub rejected: IntCounterVec,
    /// Pending records replaced by a newer record with the same id.
    pub replaced: IntCounter,
    /// Pending records cancelled by id.
    pub cancelled: IntCounter,
    /// Records published to their target, by target topic.
    pub fired: IntCounterVec,
    /// Records sent to the dead-letter topic, by reason code (ingest and fire).
    pub dead_lettered: IntCounterVec,
    /// Failed produce attempts, by error kind.
    pub produce_errors: IntCounterVec,
    /// Consumer retries scheduled, by target topic.
    pub retries: IntCounterVec,
    /// Consumer retries that used up their attempts, by target topic.
    pub retries_exhausted: IntCounterVec,
    /// Wheel entries skipped at fire time because their record was cancelled or replaced.
    pub fire_skipped: IntCounter,
    /// Records pending in RocksDB.
    pub pending: IntGauge,
    /// Entries in the in-memory timing wheel.
    pub wheel_entries: IntGauge,
    /// Records loaded from RocksDB into the wheel as its horizon advanced (recovery included).
    pub wheel_loaded: IntCounter,
    /// The wheel holds every pending record due before this time (epoch seconds).
    pub wheel_loaded_until: IntGauge,
    /// Fire time minus due time (the wheel's lateness).
    pub fire_lateness: Histogram,
    /// Delivery acknowledgement time minus due time, or minus the time a fire limit let the
    /// record go: lateness caused by load, not by limits.
    pub delivery_lateness: Histogram,
    /// For records a fire limit or spread held back: the time it let them go minus their due
    /// time (intended lateness).
    pub fire_limit_lateness: Histogram,
    /// Records held back by a fire limit or spread now, by target topic.
    pub fire_held: IntGaugeVec,
    /// Times a record was held back by a fire limit or spread, by target topic.
    pub fire_held_total: IntCounterVec,
    /// Delivery acknowledgement time minus the time the record was handed to the producer
    /// (Kafka's produce round trip under the broker's load, linger included).
    pub produce_round_trip: Histogram,
    /// Records loaded from RocksDB at the last start.
    pub recovered: IntGauge,
    /// 1 once recovery is done and the broker is consuming.
    pub ready: IntGauge,
    /// Build information.
    pub build_info: IntGaugeVec,
    /// Pending records by target topic (refreshed on scrape).
    pub pending_by_target: IntGaugeVec,
    /// Pending records by due bucket: overdue, 1m, 1h, 1d, later (refreshed on scrape).
    pub pending_by_due: IntGaugeVec,
    /// Age of the oldest pending record that is past due, 0 when none (refreshed on scrape).
    pub oldest_overdue: prometheus::Gauge,
    /// RocksDB size: SST files plus memtables, all column families (refreshed on scrape).
    pub store_size: IntGauge,
    /// 1 while RocksDB stops writes (write stall), else 0 (refreshed on scrape).
    pub store_write_stopped: IntGauge,
    /// RocksDB's delayed write rate while it slows writes, bytes/s; 0 when not delayed.
    pub store_delayed_write_rate: IntGauge,
    /// 1 while RocksDB accepts writes, 0 after a failed write until one succeeds.
    pub store_healthy: IntGauge,
    /// Records due soon kept in memory as well, and the bytes they count for (refreshed on
    /// scrape).
    pub store_kept_records: IntGauge,
    /// See `store_kept_records`.
    pub store_kept_bytes: IntGauge,
    /// Records fired from memory instead of read from RocksDB (brought up to date on scrape).
    pub store_kept_fired: IntCounter,
    /// The store's count behind `store_kept_fired` at the last scrape (scrapes may overlap).
    kept_fired_seen: Arc<AtomicU64>,
    /// Consumer lag of each source partition, from librdkafka's statistics.
    pub consumer_lag: IntGaugeVec,
    /// Admin API requests that change state, by action and outcome.
    pub admin_requests: IntCounterVec,
}

impl Metrics {
    /// Creates and registers every metric.
    ///
    /// # Errors
    /// A registration error (a name registered twice in the same registry).
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        fn reg<T: prometheus::core::Collector + Clone + 'static>(
            r: &Registry,
            m: T,
        ) -> Result<T, prometheus::Error> {
            r.register(Box::new(m.clone()))?;
            Ok(m)
        }
        let counter_vec = |name: &str, help: &str, label: &str| {
            reg(
                registry,
                IntCounterVec::new(Opts::new(name, help), &[label])?,
            )
        };
        let lateness = |name: &str, help: &str| {
            reg(
                registry,
                Histogram::with_opts(
                    HistogramOpts::new(name, help).buckets(LATENESS_BUCKETS.to_vec()),
                )?,
            )
        };
        let gauge = |name: &str, help: &str| reg(registry, IntGauge::new(name, help)?);
        let gauge_vec = |name: &str, help: &str, labels: &[&str]| {
            reg(registry, IntGaugeVec::new(Opts::new(name, help), labels)?)
        };
        let m = Self {
            ingested: counter_vec(
                "kafka_delay_ingest_records_total",
                "Records consumed from delay topics.",
                "topic",
            )?,
            rejected: counter_vec(
                "kafka_delay_ingest_rejected_total",
                "Records that could not be scheduled, by reason.",
                "reason",
            )?,
            replaced: reg(
                registry,
                IntCounter::new(
                    "kafka_delay_ingest_replaced_total",
                    "Pending records replaced by a newer record with the same delay-id.",
                )?,
            )?,
            cancelled: reg(
                registry,
                IntCounter::new(
                    "kafka_delay_ingest_cancelled_total",
                    "Pending records cancelled by id.",
                )?,
            )?,
            fired: counter_vec(
                "kafka_delay_fire_records_total",
                "Records published to their target topic.",
                "target",
            )?,
            dead_lettered: counter_vec(
                "kafka_delay_dead_letter_records_total",
                "Records sent to the dead-letter topic, by reason.",
                "reason",
            )?,
            produce_errors: counter_vec(
                "kafka_delay_fire_produce_errors_total",
                "Failed produce attempts, by error kind.",
                "kind",
            )?,
            retries: counter_vec(
                "kafka_delay_retry_records_total",
                "Consumer retries scheduled, by target topic.",
                "target",
            )?,
            retries_exhausted: counter_vec(
                "kafka_delay_retry_exhausted_total",
                "Consumer retries that used up their attempts and went to the target's dead-letter topic.",
                "target",
            )?,
            fire_skipped: reg(
                registry,
                IntCounter::new(
                    "kafka_delay_fire_skipped_total",
                    "Timer entries whose record had been cancelled or replaced.",
                )?,
            )?,
            pending: reg(
                registry,
                IntGauge::new("kafka_delay_pending_records", "Records pending in RocksDB.")?,
            )?,
            wheel_entries: reg(
                registry,
                IntGauge::new(
                    "kafka_delay_wheel_entries",
                    "Entries in the in-memory timing wheel.",
                )?,
            )?,
            wheel_loaded: reg(
                registry,
                IntCounter::new(
                    "kafka_delay_wheel_loaded_records_total",
                    "Records loaded from RocksDB's due index into the wheel as its horizon advanced.",
                )?,
            )?,
            wheel_loaded_until: reg(
                registry,
                IntGauge::new(
                    "kafka_delay_wheel_loaded_until_seconds",
                    "The wheel holds every pending record due before this time (Unix seconds); later ones wait in RocksDB.",
                )?,
            )?,
            fire_lateness: lateness(
                "kafka_delay_fire_lateness_seconds",
                "Time the timer fired minus the time it was set for (the record's due time, or the time a fire limit let it go).",
            )?,
            delivery_lateness: lateness(
                "kafka_delay_delivery_lateness_seconds",
                "Time the target acknowledged the record minus its due time, or minus the time a fire limit let it go (lateness from load, not from limits).",
            )?,
            fire_limit_lateness: lateness(
                "kafka_delay_fire_limit_lateness_seconds",
                "For records a fire limit or spread held back: the time it let them go minus their due time.",
            )?,
            fire_held: gauge_vec(
                "kafka_delay_fire_held_records",
                "Records held back by a fire limit or spread now, by target topic.",
                &["target"],
            )?,
            fire_held_total: counter_vec(
                "kafka_delay_fire_held_total",
                "Times a record was held back by a fire limit or spread, by target topic.",
                "target",
            )?,
            produce_round_trip: lateness(
                "kafka_delay_fire_produce_seconds",
                "Time the target acknowledged the record minus the time it was handed to the producer.",
            )?,
            recovered: reg(
                registry,
                IntGauge::new(
                    "kafka_delay_recovery_records",
                    "Pending records loaded from RocksDB at start.",
                )?,
            )?,
            ready: reg(
                registry,
                IntGauge::new(
                    "kafka_delay_ready",
                    "1 once recovery is done and the broker consumes.",
                )?,
            )?,
            build_info: reg(
                registry,
                IntGaugeVec::new(
                    Opts::new("kafka_delay_build_info", "Build information."),
                    &["version"],
                )?,
            )?,
            pending_by_target: gauge_vec(
                "kafka_delay_pending_target_records",
                "Records pending, by target topic.",
                &["target"],
            )?,
            pending_by_due: gauge_vec(
                "kafka_delay_pending_due_records",
                "Records pending, by when they are due: overdue, within 1m, 1h, 1d, or later.",
                &["due"],
            )?,
            oldest_overdue: reg(
                registry,
                prometheus::Gauge::new(
                    "kafka_delay_pending_oldest_overdue_seconds",
                    "How long the oldest pending record has been past its due time; 0 when none is.",
                )?,
            )?,
            store_size: gauge(
                "kafka_delay_store_size_bytes",
                "RocksDB size: SST files and memtables of every column family.",
            )?,
            store_write_stopped: gauge(
                "kafka_delay_store_write_stopped",
                "1 while RocksDB stops writes (write stall).",
            )?,
            store_delayed_write_rate: gauge(
                "kafka_delay_store_delayed_write_rate_bytes",
                "RocksDB's write rate limit while it delays writes, bytes per second; 0 when not delayed.",
            )?,
            store_healthy: gauge(
                "kafka_delay_store_healthy",
                "1 while RocksDB accepts writes; 0 after a failed write, until one succeeds.",
            )?,
            store_kept_records: gauge(
                "kafka_delay_store_kept_in_memory_records",
                "Records due soon kept in memory as well as in RocksDB until they fire (--keep-in-memory-within).",
            )?,
            store_kept_bytes: gauge(
                "kafka_delay_store_kept_in_memory_bytes",
                "What the records kept in memory count for against --keep-in-memory-mb.",
            )?,
            store_kept_fired: reg(
                registry,
                IntCounter::new(
                    "kafka_delay_store_kept_in_memory_fired_total",
                    "Records fired from memory instead of read from RocksDB.",
                )?,
            )?,
            kept_fired_seen: Arc::default(),
            consumer_lag: gauge_vec(
                "kafka_delay_ingest_consumer_lag_records",
                "Records not yet consumed in each source partition (librdkafka statistics).",
                &["topic", "partition"],
            )?,
            admin_requests: reg(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        "kafka_delay_admin_requests_total",
                        "Admin API requests that change state, by action and outcome.",
                    ),
                    &["action", "outcome"],
                )?,
            )?,
        };
        // Known label values start at 0, so rates and alerts work before the first event.
        for reason in crate::record::Reason::ALL {
            m.rejected.with_label_values(&[reason.code()]);
            m.dead_lettered.with_label_values(&[reason.code()]);
        }
        for kind in crate::publish::ERROR_KINDS {
            m.produce_errors.with_label_values(&[kind]);
        }
        for action in crate::admin::ACTIONS {
            for outcome in crate::admin::OUTCOMES {
                m.admin_requests.with_label_values(&[action, outcome]);
            }
        }
        m.build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        #[cfg(target_os = "linux")]
        registry.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))?;
        Ok(m)
    }
}

impl Metrics {
    /// Sets the gauges that are read from the store rather than counted as things happen:
    /// pending by target and by due bucket, the oldest overdue age, RocksDB size and stalls.
    pub fn refresh_from_store(&self, store: &crate::store::Store, now_ms: u64, healthy: bool) {
        let snap = store.pending_stats(now_ms);
        self.pending_by_target.reset();
        for (target, n) in &snap.by_target {
            self.pending_by_target
                .with_label_values(&[target])
                .set(*n as i64);
        }
        for (bucket, n) in crate::store::stats::BUCKETS.iter().zip(snap.by_due) {
            self.pending_by_due
                .with_label_values(&[bucket])
                .set(n as i64);
        }
        let overdue_ms = store
            .earliest_due()
            .ok()
            .flatten()
            .map_or(0, |due| now_ms.saturating_sub(due));
        self.oldest_overdue.set(overdue_ms as f64 / 1000.0);
        self.pending.set(store.pending() as i64);
        self.store_size.set(store.size_bytes() as i64);
        let (stopped, rate) = store.write_stall();
        self.store_write_stopped.set(i64::from(stopped));
        self.store_delayed_write_rate.set(rate as i64);
        self.store_healthy.set(i64::from(healthy));
        let (kept, bytes, fired) = store.kept_in_memory();
        self.store_kept_records.set(kept as i64);
        self.store_kept_bytes.set(bytes as i64);
        // The store counts; the counter catches up with it, each step by one scrape only.
        let seen = self.kept_fired_seen.fetch_max(fired, Ordering::Relaxed);
        self.store_kept_fired.inc_by(fired.saturating_sub(seen));
    }
}

/// A quantile of a histogram in ms: the upper bound of the first bucket holding `q` of its
/// samples (none when no bucket does).
pub fn bucket_quantile_ms(histogram: &Histogram, q: f64) -> Option<f64> {
    use prometheus::core::Metric;
    let m = histogram.metric();
    let h = m.get_histogram();
    let count = h.get_sample_count() as f64;
    h.get_bucket()
        .iter()
        .find(|b| b.cumulative_count() as f64 >= q * count)
        .map(|b| b.upper_bound() * 1_000.0)
}

/// Renders a registry in the Prometheus text format.
pub fn render(registry: &Registry) -> String {
    use prometheus::Encoder;
    let mut out = Vec::new();
    let encoder = prometheus::TextEncoder::new();
    if encoder.encode(&registry.gather(), &mut out).is_err() {
        return String::new();
    }
    String::from_utf8(out).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn count_each_adds_one_per_label_occurrence() {
        let registry = Registry::new();
        let m = Metrics::new(&registry).unwrap();
        count_each(&m.fired, ["a", "b", "a", "a"]);
        count_each(&m.fired, []);
        assert_eq!(m.fired.with_label_values(&["a"]).get(), 3);
        assert_eq!(m.fired.with_label_values(&["b"]).get(), 1);
    }

    #[test]
    fn every_metric_registers_once_and_renders() {
        let registry = Registry::new();
        let m = Metrics::new(&registry).unwrap();
        m.fired.with_label_values(&["orders"]).inc();
        m.fire_lateness.observe(0.001);
        let text = render(&registry);
        assert!(text.contains("kafka_delay_fire_records_total{target=\"orders\"} 1"));
        assert!(text.contains("kafka_delay_build_info{version="));
        assert!(
            Metrics::new(&registry).is_err(),
            "a second registration is refused"
        );
        assert!(
            Metrics::new(&Registry::new()).is_ok(),
            "a fresh registry is independent"
        );
    }
}
