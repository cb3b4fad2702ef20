//! Prometheus metrics, grouped by subsystem (`groups.rs`), all registered against a registry
//! that is passed in, so tests get their own registry; the label values they start with are
//! handed in too ([`Labels`]). Names: `kafka_delay_<subsystem>_<what>_<unit>`; labels are
//! bounded (source topic, target topic, reason code, error kind), never a key or an id.

mod groups;

use std::sync::atomic::Ordering;

pub use groups::{
    BrokerMetrics, FireMetrics, IngestMetrics, OperatingMetrics, PendingMetrics, RetryMetrics,
    StoreMetrics, WheelMetrics,
};
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

/// The label values each labelled metric starts with at 0, handed in by whoever owns them (the
/// contract's reason codes, the publisher's error kinds, the admin API's actions and
/// outcomes), so that rates and alerts work before the first event.
#[derive(Debug, Clone, Copy, Default)]
pub struct Labels<'a> {
    /// Reason codes of rejected and dead-lettered records.
    pub reasons: &'a [&'a str],
    /// Kinds of produce errors.
    pub produce_errors: &'a [&'a str],
    /// Admin actions that change state.
    pub admin_actions: &'a [&'a str],
    /// Their outcomes.
    pub admin_outcomes: &'a [&'a str],
}

/// Registers metrics against one registry.
pub(crate) struct Registrar<'r>(&'r Registry);

impl Registrar<'_> {
    fn register<T: prometheus::core::Collector + Clone + 'static>(
        &self,
        m: T,
    ) -> prometheus::Result<T> {
        self.0.register(Box::new(m.clone()))?;
        Ok(m)
    }

    fn counter(&self, name: &str, help: &str) -> prometheus::Result<IntCounter> {
        self.register(IntCounter::new(name, help)?)
    }

    fn counter_vec(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> prometheus::Result<IntCounterVec> {
        self.register(IntCounterVec::new(Opts::new(name, help), labels)?)
    }

    fn gauge(&self, name: &str, help: &str) -> prometheus::Result<IntGauge> {
        self.register(IntGauge::new(name, help)?)
    }

    fn gauge_vec(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> prometheus::Result<IntGaugeVec> {
        self.register(IntGaugeVec::new(Opts::new(name, help), labels)?)
    }

    fn lateness(&self, name: &str, help: &str) -> prometheus::Result<Histogram> {
        self.register(Histogram::with_opts(
            HistogramOpts::new(name, help).buckets(LATENESS_BUCKETS.to_vec()),
        )?)
    }
}

/// Every metric of the broker, by subsystem.
#[derive(Debug, Clone)]
pub struct Metrics {
    /// Consuming and storing.
    pub ingest: IngestMetrics,
    /// Consumers' retries.
    pub retry: RetryMetrics,
    /// Firing and delivery.
    pub fire: FireMetrics,
    /// The timing wheel.
    pub wheel: WheelMetrics,
    /// What is pending.
    pub pending: PendingMetrics,
    /// RocksDB.
    pub store: StoreMetrics,
    /// Build, recovery, readiness.
    pub broker: BrokerMetrics,
    /// Dead letters and operators' requests.
    pub operating: OperatingMetrics,
}

impl Metrics {
    /// Creates and registers every metric, the labelled ones starting with `labels` at 0.
    ///
    /// # Errors
    /// A registration error (a name registered twice in the same registry).
    pub fn new(registry: &Registry, labels: &Labels<'_>) -> Result<Self, prometheus::Error> {
        let r = Registrar(registry);
        let m = Self {
            ingest: IngestMetrics::new(&r, labels.reasons)?,
            retry: RetryMetrics::new(&r)?,
            fire: FireMetrics::new(&r, labels.produce_errors)?,
            wheel: WheelMetrics::new(&r)?,
            pending: PendingMetrics::new(&r)?,
            store: StoreMetrics::new(&r)?,
            broker: BrokerMetrics::new(&r)?,
            operating: OperatingMetrics::new(
                &r,
                labels.reasons,
                labels.admin_actions,
                labels.admin_outcomes,
            )?,
        };
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
        self.pending.by_target.reset();
        for (target, n) in &snap.by_target {
            self.pending
                .by_target
                .with_label_values(&[target])
                .set(*n as i64);
        }
        for (bucket, n) in crate::store::stats::BUCKETS.iter().zip(snap.by_due) {
            self.pending
                .by_due
                .with_label_values(&[bucket])
                .set(n as i64);
        }
        let overdue_ms = store
            .earliest_due()
            .ok()
            .flatten()
            .map_or(0, |due| now_ms.saturating_sub(due));
        self.pending.oldest_overdue.set(overdue_ms as f64 / 1000.0);
        self.pending.records.set(store.pending() as i64);
        self.broker
            .partitions_owned
            .set(store.owned_partitions() as i64);
        self.store.size.set(store.size_bytes() as i64);
        let (stopped, rate) = store.write_stall();
        self.store.write_stopped.set(i64::from(stopped));
        self.store.delayed_write_rate.set(rate as i64);
        self.store.healthy.set(i64::from(healthy));
        let (kept, bytes, fired) = store.kept_in_memory();
        self.store.kept_records.set(kept as i64);
        self.store.kept_bytes.set(bytes as i64);
        // The store counts; the counter catches up with it, each step by one scrape only.
        let seen = self
            .store
            .kept_fired_seen
            .fetch_max(fired, Ordering::Relaxed);
        self.store.kept_fired.inc_by(fired.saturating_sub(seen));
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
        let m = Metrics::new(&registry, &Labels::default()).unwrap();
        count_each(&m.fire.records, ["a", "b", "a", "a"]);
        count_each(&m.fire.records, []);
        assert_eq!(m.fire.records.with_label_values(&["a"]).get(), 3);
        assert_eq!(m.fire.records.with_label_values(&["b"]).get(), 1);
    }

    #[test]
    fn every_metric_registers_once_and_renders() {
        let registry = Registry::new();
        let m = Metrics::new(&registry, &Labels::default()).unwrap();
        m.fire.records.with_label_values(&["orders"]).inc();
        m.fire.lateness.observe(0.001);
        let text = render(&registry);
        assert!(text.contains("kafka_delay_fire_records_total{target=\"orders\"} 1"));
        assert!(text.contains("kafka_delay_build_info{version="));
        assert!(
            Metrics::new(&registry, &Labels::default()).is_err(),
            "a second registration is refused"
        );
        assert!(
            Metrics::new(&Registry::new(), &Labels::default()).is_ok(),
            "a fresh registry is independent"
        );
    }

    #[test]
    fn the_label_values_handed_in_start_at_zero() {
        let registry = Registry::new();
        let labels = Labels {
            reasons: &["missing-target"],
            produce_errors: &["timed_out"],
            admin_actions: &["cancel"],
            admin_outcomes: &["ok", "denied"],
        };
        Metrics::new(&registry, &labels).unwrap();
        let text = render(&registry);
        for line in [
            "kafka_delay_ingest_rejected_total{reason=\"missing-target\"} 0",
            "kafka_delay_dead_letter_records_total{reason=\"missing-target\"} 0",
            "kafka_delay_fire_produce_errors_total{kind=\"timed_out\"} 0",
            "kafka_delay_admin_requests_total{action=\"cancel\",outcome=\"denied\"} 0",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
    }
}
