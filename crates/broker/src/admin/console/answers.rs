//! The console API's answers as types: each serializes to the shape
//! `schemas/admin.openapi.json` documents (`admin/schema_tests.rs` checks every one).

use serde::Serialize;

use super::dead_letters::Topic;
use super::minutes::Minute;
use super::replays::Job;
use crate::admin::answers::HeaderText;
use crate::publish::history::Fired;

/// A source partition.
#[derive(Debug, Clone, Serialize)]
pub struct Partition {
    /// Source topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
}

/// The instance that answered.
#[derive(Debug, Clone, Serialize)]
pub struct Instance {
    /// `--instance-id` (static membership), if set.
    pub id: Option<String>,
    /// The consumer group.
    pub group: String,
    /// The address the request reached it at (its `Host`), else its HTTP listener.
    pub http: String,
    /// The broker's version.
    pub version: &'static str,
    /// The source partitions it owns.
    pub owned_partitions: Vec<Partition>,
}

/// Records pending for a target.
#[derive(Debug, Clone, Serialize)]
pub struct TargetPending {
    /// Target topic.
    pub target: String,
    /// Records pending.
    pub pending: u64,
}

/// Records pending that come due within a bucket of time.
#[derive(Debug, Clone, Serialize)]
pub struct DuePending {
    /// The bucket (`overdue`, `<1m`, ..., `later`).
    pub bucket: &'static str,
    /// Records pending.
    pub pending: u64,
}

/// Records a fire limit holds back for a target.
#[derive(Debug, Clone, Serialize)]
pub struct Held {
    /// Target topic.
    pub target: String,
    /// Records held.
    pub held: f64,
}

/// Lateness quantiles, ms (null before the first sample).
#[derive(Debug, Clone, Serialize)]
pub struct Lateness {
    /// Median of due to handed to the producer.
    pub fire_p50: Option<f64>,
    /// 99th percentile of due to handed to the producer.
    pub fire_p99: Option<f64>,
    /// Median of due to acknowledged by the target.
    pub delivery_p50: Option<f64>,
    /// 99th percentile of due to acknowledged by the target.
    pub delivery_p99: Option<f64>,
}

/// The counts an overview gives, an instance's or the group's sums: the same fields in both.
#[derive(Debug, Clone, Serialize)]
pub struct Counts {
    /// Records pending in the partitions owned (standby copies left out).
    pub pending: u64,
    /// Pending by target, most first.
    pub by_target: Vec<TargetPending>,
    /// Pending by when they come due.
    pub by_due: Vec<DuePending>,
    /// How overdue the earliest pending record is, ms (0 when none is).
    pub oldest_overdue_ms: u64,
    /// Records fire limits hold back, by target.
    pub held: Vec<Held>,
    /// Records fired since start.
    pub fired_total: u64,
    /// Records dead-lettered since start.
    pub dead_lettered_total: u64,
}

/// `GET /api/v1/overview`.
#[derive(Debug, Clone, Serialize)]
pub struct Overview {
    /// The instance's clock, epoch ms.
    pub now_ms: u64,
    /// Who answered.
    pub instance: Instance,
    /// This instance's counts.
    #[serde(flatten)]
    pub counts: Counts,
    /// Fired and dead-lettered in each of the last minutes.
    pub per_minute: Vec<Minute>,
    /// Lateness quantiles.
    pub lateness_ms: Lateness,
    /// Handoffs: what this instance restores and keeps warm for others.
    pub moving: Moving,
}

/// What an instance restores from the changelog and keeps as standby copies now.
#[derive(Debug, Clone, Serialize)]
pub struct Moving {
    /// Source partitions assigned here and still being restored.
    pub partitions_restoring: i64,
    /// Changelog entries those restores have still to read.
    pub restore_remaining_entries: i64,
    /// Partitions owned elsewhere that this instance keeps a warm copy of.
    pub partitions_standby: i64,
    /// Records in those copies (not in `pending`).
    pub standby_records: i64,
    /// Changelog entries the copies were behind when they last caught up.
    pub standby_lag_entries: i64,
}

/// A member of the group as `GET /api/v1/group/overview` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct Member {
    /// The HTTP address it advertises (null for a member that is not kafka-delay).
    pub http: Option<String>,
    /// Its `client.id` in the group (null where this instance holds every record).
    pub client_id: Option<String>,
    /// Its durability mode, as it says in the group (null where it does not say).
    pub mode: Option<String>,
    /// The source partitions the group assigned it.
    pub partitions: Vec<Partition>,
    /// Whether it gave its overview in time.
    pub answered: bool,
    /// Why not, when it did not.
    pub error: Option<String>,
    /// Its `GET /api/v1/overview` answer, when it gave one.
    pub overview: Option<serde_json::Value>,
}

/// `GET /api/v1/group/overview`: every member's overview and their sums.
#[derive(Debug, Clone, Serialize)]
pub struct GroupOverview {
    /// The asked instance's clock, epoch ms.
    pub now_ms: u64,
    /// The consumer group.
    pub group: String,
    /// The instance asked (its `Host`, else its HTTP listener).
    pub asked: String,
    /// Whether a member did not answer (the sums leave it out; its entry says why).
    pub partial: bool,
    /// How long each member was given to answer, ms.
    pub wait_ms: u64,
    /// The members' counts summed, over those that answered (the oldest overdue: the most
    /// overdue of theirs).
    #[serde(flatten)]
    pub counts: Counts,
    /// Every member of the group, as its coordinator lists them.
    pub members: Vec<Member>,
}

/// `GET /api/v1/fired`.
#[derive(Debug, Clone, Serialize)]
pub struct FiredRecords {
    /// Newest first.
    pub records: Vec<Fired>,
    /// How many fired records the instance keeps.
    pub kept: usize,
}

/// `GET /api/v1/dead-letters`.
#[derive(Debug, Clone, Serialize)]
pub struct DeadLetterTopics {
    /// The broker's own dead-letter topic and those the retry policies name.
    pub topics: Vec<Topic>,
}

/// A dead letter as the console shows it.
#[derive(Debug, Clone, Serialize)]
pub struct DeadLetter {
    /// Dead-letter topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Its timestamp, epoch ms.
    pub timestamp_ms: i64,
    /// The `delay-error` header: the reason code.
    pub reason: Option<String>,
    /// The `delay-error-detail` header.
    pub detail: Option<String>,
    /// The `delay-target` header.
    pub target: Option<String>,
    /// The key as text (null when not UTF-8).
    pub key: Option<String>,
    /// The value's first bytes as text (lossy).
    pub value: Option<String>,
    /// The value's length in bytes.
    pub value_bytes: Option<usize>,
    /// The value's first bytes in hex.
    pub value_hex: Option<String>,
    /// Every header, its value as text (lossy).
    pub headers: Vec<HeaderText>,
}

/// `GET /api/v1/dead-letters/{topic}`.
#[derive(Debug, Clone, Serialize)]
pub struct DeadLetters {
    /// Newest first.
    pub records: Vec<DeadLetter>,
}

/// `POST /api/v1/dead-letters/{topic}/replay`.
#[derive(Debug, Clone, Serialize)]
pub struct Started {
    /// The replay, as `GET /api/v1/replays` shows it.
    pub replay: Job,
}

/// `GET /api/v1/replays`.
#[derive(Debug, Clone, Serialize)]
pub struct Replays {
    /// Newest first.
    pub replays: Vec<Job>,
}
