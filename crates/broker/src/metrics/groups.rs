//! The metrics of each subsystem, each group registered by a constructor of its own.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use prometheus::{Counter, Gauge, Histogram, IntCounter, IntCounterVec, IntGauge, IntGaugeVec};

use super::Registrar;

/// What ingest counts.
#[derive(Debug, Clone)]
pub struct IngestMetrics {
    /// Records consumed from delay topics, by source topic.
    pub records: IntCounterVec,
    /// Records that could not be scheduled, by reason code.
    pub rejected: IntCounterVec,
    /// Pending records replaced by a newer record with the same id.
    pub replaced: IntCounter,
    /// Pending records cancelled by id.
    pub cancelled: IntCounter,
    /// Consumer lag of each source partition, from librdkafka's statistics.
    pub consumer_lag: IntGaugeVec,
}

impl IngestMetrics {
    pub(super) fn new(r: &Registrar<'_>, reasons: &[&str]) -> prometheus::Result<Self> {
        let m = Self {
            records: r.counter_vec(
                "kafka_delay_ingest_records_total",
                "Records consumed from delay topics.",
                &["topic"],
            )?,
            rejected: r.counter_vec(
                "kafka_delay_ingest_rejected_total",
                "Records that could not be scheduled, by reason.",
                &["reason"],
            )?,
            replaced: r.counter(
                "kafka_delay_ingest_replaced_total",
                "Pending records replaced by a newer record with the same delay-id.",
            )?,
            cancelled: r.counter(
                "kafka_delay_ingest_cancelled_total",
                "Pending records cancelled by id.",
            )?,
            consumer_lag: r.gauge_vec(
                "kafka_delay_ingest_consumer_lag_records",
                "Records not yet consumed in each source partition (librdkafka statistics).",
                &["topic", "partition"],
            )?,
        };
        for reason in reasons {
            m.rejected.with_label_values(&[reason]);
        }
        Ok(m)
    }
}

/// Consumers' retries.
#[derive(Debug, Clone)]
pub struct RetryMetrics {
    /// Consumer retries scheduled, by target topic.
    pub records: IntCounterVec,
    /// Consumer retries that used up their attempts, by target topic.
    pub exhausted: IntCounterVec,
}

impl RetryMetrics {
    pub(super) fn new(r: &Registrar<'_>) -> prometheus::Result<Self> {
        Ok(Self {
            records: r.counter_vec(
                "kafka_delay_retry_records_total",
                "Consumer retries scheduled, by target topic.",
                &["target"],
            )?,
            exhausted: r.counter_vec(
                "kafka_delay_retry_exhausted_total",
                "Consumer retries that used up their attempts and went to the target's dead-letter topic.",
                &["target"],
            )?,
        })
    }
}

/// Firing and delivery.
#[derive(Debug, Clone)]
pub struct FireMetrics {
    /// Records published to their target, by target topic.
    pub records: IntCounterVec,
    /// Wheel entries skipped at fire time because their record was cancelled or replaced.
    pub skipped: IntCounter,
    /// Failed produce attempts, by error kind.
    pub produce_errors: IntCounterVec,
    /// Fire time minus due time (the wheel's lateness).
    pub lateness: Histogram,
    /// Delivery acknowledgement time minus due time, or minus the time a fire limit let the
    /// record go: lateness caused by load, not by limits.
    pub delivery_lateness: Histogram,
    /// For records a fire limit or spread held back: the time it let them go minus their due
    /// time (intended lateness).
    pub limit_lateness: Histogram,
    /// Records held back by a fire limit or spread now, by target topic.
    pub held: IntGaugeVec,
    /// Times a record was held back by a fire limit or spread, by target topic.
    pub held_total: IntCounterVec,
    /// Delivery acknowledgement time minus the time the record was handed to the producer
    /// (Kafka's produce round trip under the broker's load, linger included).
    pub produce_round_trip: Histogram,
}

impl FireMetrics {
    pub(super) fn new(r: &Registrar<'_>, error_kinds: &[&str]) -> prometheus::Result<Self> {
        let m = Self {
            records: r.counter_vec(
                "kafka_delay_fire_records_total",
                "Records published to their target topic.",
                &["target"],
            )?,
            skipped: r.counter(
                "kafka_delay_fire_skipped_total",
                "Timer entries whose record had been cancelled or replaced.",
            )?,
            produce_errors: r.counter_vec(
                "kafka_delay_fire_produce_errors_total",
                "Failed produce attempts, by error kind.",
                &["kind"],
            )?,
            lateness: r.lateness(
                "kafka_delay_fire_lateness_seconds",
                "Time the timer fired minus the time it was set for (the record's due time, or the time a fire limit let it go).",
            )?,
            delivery_lateness: r.lateness(
                "kafka_delay_delivery_lateness_seconds",
                "Time the target acknowledged the record minus its due time, or minus the time a fire limit let it go (lateness from load, not from limits).",
            )?,
            limit_lateness: r.lateness(
                "kafka_delay_fire_limit_lateness_seconds",
                "For records a fire limit or spread held back: the time it let them go minus their due time.",
            )?,
            held: r.gauge_vec(
                "kafka_delay_fire_held_records",
                "Records held back by a fire limit or spread now, by target topic.",
                &["target"],
            )?,
            held_total: r.counter_vec(
                "kafka_delay_fire_held_total",
                "Times a record was held back by a fire limit or spread, by target topic.",
                &["target"],
            )?,
            produce_round_trip: r.lateness(
                "kafka_delay_fire_produce_seconds",
                "Time the target acknowledged the record minus the time it was handed to the producer.",
            )?,
        };
        for kind in error_kinds {
            m.produce_errors.with_label_values(&[kind]);
        }
        Ok(m)
    }
}

/// The timing wheel.
#[derive(Debug, Clone)]
pub struct WheelMetrics {
    /// Entries in the in-memory timing wheel.
    pub entries: IntGauge,
    /// Records loaded from RocksDB into the wheel as its horizon advanced (recovery included).
    pub loaded: IntCounter,
    /// The wheel holds every pending record due before this time (epoch seconds).
    pub loaded_until: IntGauge,
}

impl WheelMetrics {
    pub(super) fn new(r: &Registrar<'_>) -> prometheus::Result<Self> {
        Ok(Self {
            entries: r.gauge(
                "kafka_delay_wheel_entries",
                "Entries in the in-memory timing wheel.",
            )?,
            loaded: r.counter(
                "kafka_delay_wheel_loaded_records_total",
                "Records loaded from RocksDB's due index into the wheel as its horizon advanced.",
            )?,
            loaded_until: r.gauge(
                "kafka_delay_wheel_loaded_until_seconds",
                "The wheel holds every pending record due before this time (Unix seconds); later ones wait in RocksDB.",
            )?,
        })
    }
}

/// What is pending (the gauges read from the store are refreshed on scrape).
#[derive(Debug, Clone)]
pub struct PendingMetrics {
    /// Records pending in RocksDB.
    pub records: IntGauge,
    /// Pending records by target topic.
    pub by_target: IntGaugeVec,
    /// Pending records by due bucket: overdue, 1m, 1h, 1d, later.
    pub by_due: IntGaugeVec,
    /// Age of the oldest pending record that is past due, 0 when none.
    pub oldest_overdue: Gauge,
}

impl PendingMetrics {
    pub(super) fn new(r: &Registrar<'_>) -> prometheus::Result<Self> {
        Ok(Self {
            records: r.gauge("kafka_delay_pending_records", "Records pending in RocksDB.")?,
            by_target: r.gauge_vec(
                "kafka_delay_pending_target_records",
                "Records pending, by target topic.",
                &["target"],
            )?,
            by_due: r.gauge_vec(
                "kafka_delay_pending_due_records",
                "Records pending, by when they are due: overdue, within 1m, 1h, 1d, or later.",
                &["due"],
            )?,
            oldest_overdue: r.register(Gauge::new(
                "kafka_delay_pending_oldest_overdue_seconds",
                "How long the oldest pending record has been past its due time; 0 when none is.",
            )?)?,
        })
    }
}

/// RocksDB (refreshed on scrape).
#[derive(Debug, Clone)]
pub struct StoreMetrics {
    /// RocksDB size: SST files plus memtables, all column families.
    pub size: IntGauge,
    /// 1 while RocksDB stops writes (write stall), else 0.
    pub write_stopped: IntGauge,
    /// RocksDB's delayed write rate while it slows writes, bytes/s; 0 when not delayed.
    pub delayed_write_rate: IntGauge,
    /// 1 while RocksDB accepts writes, 0 after a failed write until one succeeds.
    pub healthy: IntGauge,
    /// Records due soon kept in memory as well.
    pub kept_records: IntGauge,
    /// What the records kept in memory count for.
    pub kept_bytes: IntGauge,
    /// Records fired from memory instead of read from RocksDB.
    pub kept_fired: IntCounter,
    /// The store's count behind `kept_fired` at the last scrape (scrapes may overlap).
    pub(super) kept_fired_seen: Arc<AtomicU64>,
}

impl StoreMetrics {
    pub(super) fn new(r: &Registrar<'_>) -> prometheus::Result<Self> {
        Ok(Self {
            size: r.gauge(
                "kafka_delay_store_size_bytes",
                "RocksDB size: SST files and memtables of every column family.",
            )?,
            write_stopped: r.gauge(
                "kafka_delay_store_write_stopped",
                "1 while RocksDB stops writes (write stall).",
            )?,
            delayed_write_rate: r.gauge(
                "kafka_delay_store_delayed_write_rate_bytes",
                "RocksDB's write rate limit while it delays writes, bytes per second; 0 when not delayed.",
            )?,
            healthy: r.gauge(
                "kafka_delay_store_healthy",
                "1 while RocksDB accepts writes; 0 after a failed write, until one succeeds.",
            )?,
            kept_records: r.gauge(
                "kafka_delay_store_kept_in_memory_records",
                "Records due soon kept in memory as well as in RocksDB until they fire (--keep-in-memory-within).",
            )?,
            kept_bytes: r.gauge(
                "kafka_delay_store_kept_in_memory_bytes",
                "What the records kept in memory count for against --keep-in-memory-mb.",
            )?,
            kept_fired: r.counter(
                "kafka_delay_store_kept_in_memory_fired_total",
                "Records fired from memory instead of read from RocksDB.",
            )?,
            kept_fired_seen: Arc::default(),
        })
    }
}

/// The broker as a whole: build, recovery, readiness.
#[derive(Debug, Clone)]
pub struct BrokerMetrics {
    /// Records loaded from RocksDB at the last start.
    pub recovered: IntGauge,
    /// 1 once recovery is done and the broker is consuming.
    pub ready: IntGauge,
    /// Build information.
    pub build_info: IntGaugeVec,
    /// 1 for the durability mode this instance runs (`local`, `changelog`, `exactly-once`).
    pub mode: IntGaugeVec,
    /// Source partitions firing from this instance.
    pub partitions_owned: IntGauge,
    /// Source partitions assigned here and being restored from the changelog.
    pub partitions_restoring: IntGauge,
    /// Changelog entries read by restores.
    pub restored_entries: IntCounter,
    /// Changelog entries the restores of assigned partitions have still to read.
    pub restore_remaining: IntGauge,
    /// Time the restores of assigned partitions spent reading the changelog and writing
    /// RocksDB.
    pub restore_seconds: Counter,
    /// Partitions owned elsewhere that this instance keeps a warm copy of.
    pub partitions_standby: IntGauge,
    /// Records in those copies (counted in the pending gauges too).
    pub standby_records: IntGauge,
    /// Changelog entries the copies were behind when they last caught up.
    pub standby_lag: IntGauge,
    /// Records in the wheel whose ingest group is not written to the changelog yet.
    pub changelog_lingering: IntGauge,
    /// Members removed from the group by this instance because they were gone.
    pub members_removed: IntCounter,
    /// Records still in flight when their partition was let go: they may fire again.
    pub handoff_unsettled: IntCounter,
    /// With exactly-once: transactions by outcome.
    pub transactions: IntCounterVec,
    /// With exactly-once: a transaction's time from its first record written to its answer.
    pub transaction_seconds: Histogram,
    /// How far this instance's clock runs ahead of the Kafka cluster's (records are held
    /// back to Kafka's clock meanwhile).
    pub clock_ahead: Gauge,
}

/// `kafka_delay_changelog_lingering_records`' help.
const LINGERING: &str = "Records in the timing wheel whose ingest group is not in the \
                         changelog yet (--changelog-linger): a crash now reads them again from \
                         their source topic.";
/// `kafka_delay_restore_seconds_total` and its help.
const RESTORE_SECONDS: (&str, &str) = (
    "kafka_delay_restore_seconds_total",
    "Time restores of assigned partitions spent reading the changelog and writing RocksDB \
     (restored entries over it: the restore's rate).",
);
/// `kafka_delay_group_members_removed_total`'s help.
const REMOVED: &str = "Members this instance removed from the group because their HTTP server \
                       refused connections (a killed instance).";

impl BrokerMetrics {
    pub(super) fn new(r: &Registrar<'_>) -> prometheus::Result<Self> {
        let m = Self {
            recovered: r.gauge(
                "kafka_delay_recovery_records",
                "Pending records loaded from RocksDB at start.",
            )?,
            ready: r.gauge(
                "kafka_delay_ready",
                "1 once recovery is done and the broker consumes.",
            )?,
            build_info: r.gauge_vec(
                "kafka_delay_build_info",
                "Build information.",
                &["version"],
            )?,
            mode: r.gauge_vec(
                "kafka_delay_mode",
                "1 for the durability mode this instance runs: local, changelog or exactly-once.",
                &["mode"],
            )?,
            partitions_owned: r.gauge(
                "kafka_delay_partitions_owned",
                "Source partitions whose records fire from this instance.",
            )?,
            partitions_restoring: r.gauge(
                "kafka_delay_partitions_restoring",
                "Source partitions assigned here and being restored from their changelog.",
            )?,
            restored_entries: r.counter(
                "kafka_delay_restored_entries_total",
                "Changelog entries read by restores.",
            )?,
            restore_remaining: r.gauge(
                "kafka_delay_restore_remaining_entries",
                "Changelog entries the restores of assigned partitions have still to read.",
            )?,
            restore_seconds: r.register(Counter::new(RESTORE_SECONDS.0, RESTORE_SECONDS.1)?)?,
            members_removed: r.counter("kafka_delay_group_members_removed_total", REMOVED)?,
            partitions_standby: r.gauge(
                "kafka_delay_partitions_standby",
                "Partitions owned by another instance that this one keeps a warm copy of.",
            )?,
            standby_records: r.gauge(
                "kafka_delay_standby_records",
                "Records in the warm copies (the pending gauges count them too).",
            )?,
            standby_lag: r.gauge(
                "kafka_delay_standby_lag_entries",
                "Changelog entries the warm copies were behind when they last caught up.",
            )?,
            changelog_lingering: r.gauge("kafka_delay_changelog_lingering_records", LINGERING)?,
            handoff_unsettled: r.counter(
                "kafka_delay_handoff_unsettled_records_total",
                "Records still in flight when their partition was let go (after --handoff-wait): \
                 the new owner may fire them again.",
            )?,
            transactions: r.counter_vec(
                "kafka_delay_transactions_total",
                "Kafka transactions (--exactly-once) by outcome: committed, aborted (records go \
                 again), rejected (a record refused), stale (partitions moved), fenced.",
                &["outcome"],
            )?,
            transaction_seconds: r.lateness(
                "kafka_delay_transaction_seconds",
                "Kafka transactions (--exactly-once): from the first record written to the commit \
                 or abort.",
            )?,
            clock_ahead: r.register(Gauge::new(
                "kafka_delay_clock_ahead_seconds",
                "How far this instance's clock runs ahead of the Kafka cluster's, as its changelog's append times show it (records fire by Kafka's clock meanwhile); 0 when it does not.",
            )?)?,
        };
        m.build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        for outcome in ["committed", "aborted", "rejected", "stale", "fenced"] {
            m.transactions.with_label_values(&[outcome]);
        }
        Ok(m)
    }
}

/// Dead letters and operators' requests.
#[derive(Debug, Clone)]
pub struct OperatingMetrics {
    /// Records sent to the dead-letter topic, by reason code (ingest and fire).
    pub dead_lettered: IntCounterVec,
    /// Admin API requests that change state, by action and outcome.
    pub admin_requests: IntCounterVec,
}

impl OperatingMetrics {
    pub(super) fn new(
        r: &Registrar<'_>,
        reasons: &[&str],
        actions: &[&str],
        outcomes: &[&str],
    ) -> prometheus::Result<Self> {
        let m = Self {
            dead_lettered: r.counter_vec(
                "kafka_delay_dead_letter_records_total",
                "Records sent to the dead-letter topic, by reason.",
                &["reason"],
            )?,
            admin_requests: r.counter_vec(
                "kafka_delay_admin_requests_total",
                "Admin API requests that change state, by action and outcome.",
                &["action", "outcome"],
            )?,
        };
        for reason in reasons {
            m.dead_lettered.with_label_values(&[reason]);
        }
        for action in actions {
            for outcome in outcomes {
                m.admin_requests.with_label_values(&[action, outcome]);
            }
        }
        Ok(m)
    }
}
