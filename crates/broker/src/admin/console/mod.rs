//! The operator's web console: a page served at `/ui` (its HTML, script and style built into
//! the binary: no CDN, no separate server) and the read-only parts of the admin API it needs
//! beyond the pending records: an overview, the recently fired records, the dead-letter topics
//! and their records, and replays of dead letters.
//!
//! Every action the page offers is an admin API request, authorised, logged and counted like
//! any other (`crate::admin`). The page writes every value with `textContent`, never as HTML,
//! and is served with a Content-Security-Policy that allows only its own script: a record whose
//! key, value or headers hold markup is shown as text and runs nothing.

pub mod answers;
pub mod dead_letters;
pub mod group;
pub mod minutes;
pub mod replays;

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use prometheus::core::Collector;
use serde::Deserialize;

use std::sync::Arc;

use tokio::sync::watch;

use crate::admin::answers::value;
use crate::admin::{bad, internal, Admin, ApiError, ApiResult};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::publish::history;
use crate::replay::{Filter, Replay};
use answers::{
    Counts, DeadLetterTopics, DeadLetters, DuePending, FiredRecords, Held, Instance, Lateness,
    Moving, Overview, Partition, Replays, Started, TargetPending,
};
use kafka_delay_core::clock::Clock;

/// The page.
const INDEX: &str = include_str!("assets/index.html");
/// Its script.
const SCRIPT: &str = include_str!("assets/app.js");
/// Its style.
const STYLE: &str = include_str!("assets/app.css");
/// Only the page's own script and style, no frames, no other origin.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'";

/// Routes of the console's API, as (method, path) in the OpenAPI document's notation.
pub const ROUTES: [(&str, &str); 7] = [
    ("get", "/api/v1/overview"),
    ("get", "/api/v1/group/overview"),
    ("get", "/api/v1/fired"),
    ("get", "/api/v1/dead-letters"),
    ("get", "/api/v1/dead-letters/{topic}"),
    ("post", "/api/v1/dead-letters/{topic}/replay"),
    ("get", "/api/v1/replays"),
];

/// The console's page and API routes.
pub fn router(admin: Admin) -> Router {
    Router::new()
        .route("/ui", get(|| asset("text/html; charset=utf-8", INDEX)))
        .route("/ui/", get(|| asset("text/html; charset=utf-8", INDEX)))
        .route(
            "/ui/app.js",
            get(|| asset("text/javascript; charset=utf-8", SCRIPT)),
        )
        .route(
            "/ui/app.css",
            get(|| asset("text/css; charset=utf-8", STYLE)),
        )
        .route("/api/v1/overview", get(overview))
        .route("/api/v1/group/overview", get(group::overview))
        .route("/api/v1/fired", get(fired))
        .route("/api/v1/dead-letters", get(dead_letter_topics))
        .route("/api/v1/dead-letters/{topic}", get(dead_letter_records))
        .route("/api/v1/dead-letters/{topic}/replay", post(replay))
        .route("/api/v1/replays", get(replays))
        .with_state(admin)
}

async fn asset(kind: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, kind),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
}

/// Most bytes shown in hex.
const HEX_BYTES: usize = 4_096;

/// The first 4 KiB of `bytes` in hex, for values that are not text.
pub(crate) fn hex(bytes: Option<&[u8]>) -> Option<String> {
    bytes.map(|b| {
        let shown = &b[..b.len().min(HEX_BYTES)];
        shown.iter().map(|x| format!("{x:02x}")).collect()
    })
}

/// Sum of a counter family over its labels.
pub(crate) fn total(counter: &prometheus::IntCounterVec) -> u64 {
    counter
        .collect()
        .iter()
        .flat_map(|mf| mf.get_metric())
        .map(|m| m.get_counter().get_value() as u64)
        .sum()
}

/// A quantile of a histogram in ms (the upper bound of its bucket); none before a sample.
fn quantile_ms(histogram: &prometheus::Histogram, q: f64) -> Option<f64> {
    if histogram.get_sample_count() == 0 {
        return None;
    }
    crate::metrics::bucket_quantile_ms(histogram, q)
}

/// The records fire limits hold back now, by target.
fn held(metrics: &Metrics) -> Vec<Held> {
    metrics
        .fire
        .held
        .collect()
        .iter()
        .flat_map(|mf| mf.get_metric())
        .filter(|m| m.get_gauge().get_value() > 0.0)
        .map(|m| Held {
            target: m
                .get_label()
                .first()
                .map(|l| l.value().to_owned())
                .unwrap_or_default(),
            held: m.get_gauge().get_value(),
        })
        .collect()
}

async fn overview(State(a): State<Admin>, headers: HeaderMap) -> ApiResult {
    a.authorize(&headers)?;
    Ok(Json(value(&overview_here(&a, &headers).await?)))
}

/// This instance's overview.
async fn overview_here(a: &Admin, headers: &HeaderMap) -> Result<Overview, ApiError> {
    let now = a.clock.now_ms();
    let store = a.store.clone();
    let (snap, earliest, owned) = tokio::task::spawn_blocking(move || {
        let owned: Vec<Partition> = store
            .next_offsets()
            .unwrap_or_default()
            .into_keys()
            .filter(|pid| store.owns(*pid))
            .filter_map(|pid| store.partition_of(pid))
            .map(|(topic, partition)| Partition { topic, partition })
            .collect();
        (
            store.owned_stats(now),
            store.earliest_due().ok().flatten(),
            owned,
        )
    })
    .await
    .map_err(internal)?;
    let mut by_target: Vec<(String, u64)> = snap.by_target.into_iter().collect();
    by_target.sort_by(|x, y| y.1.cmp(&x.1).then_with(|| x.0.cmp(&y.0)));
    let by_due: Vec<DuePending> = crate::store::stats::BUCKETS
        .iter()
        .zip(snap.by_due)
        .map(|(bucket, pending)| DuePending { bucket, pending })
        .collect();
    let held = held(&a.metrics);
    let (c, b) = (&a.console, &a.metrics.broker);
    let (fired, dead) = (
        total(&a.metrics.fire.records),
        total(&a.metrics.operating.dead_lettered),
    );
    let minutes = c.minutes.per_minute(now, fired, dead);
    let http = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or(&c.http_addr);
    let answer = Overview {
        now_ms: now,
        instance: Instance {
            id: c.instance_id.clone(),
            group: c.group_id.clone(),
            http: http.to_owned(),
            version: env!("CARGO_PKG_VERSION"),
            owned_partitions: owned,
        },
        counts: Counts {
            // Standby copies are not pending here: their owner counts them.
            pending: a
                .store
                .pending()
                .saturating_sub(u64::try_from(b.standby_records.get()).unwrap_or(0)),
            by_target: by_target
                .into_iter()
                .map(|(target, pending)| TargetPending { target, pending })
                .collect(),
            by_due,
            oldest_overdue_ms: earliest.map_or(0, |due| now.saturating_sub(due)),
            held,
            fired_total: fired,
            dead_lettered_total: dead,
        },
        per_minute: minutes,
        lateness_ms: Lateness {
            fire_p50: quantile_ms(&a.metrics.fire.lateness, 0.5),
            fire_p99: quantile_ms(&a.metrics.fire.lateness, 0.99),
            delivery_p50: quantile_ms(&a.metrics.fire.delivery_lateness, 0.5),
            delivery_p99: quantile_ms(&a.metrics.fire.delivery_lateness, 0.99),
        },
        moving: Moving {
            partitions_restoring: b.partitions_restoring.get(),
            restore_remaining_entries: b.restore_remaining.get(),
            partitions_standby: b.partitions_standby.get(),
            standby_records: b.standby_records.get(),
            standby_lag_entries: b.standby_lag.get(),
        },
    };
    Ok(answer)
}

/// Filters of the recently fired records.
#[derive(Debug, Default, Deserialize)]
struct FiredFilter {
    target: Option<String>,
    delay_id: Option<String>,
    key: Option<String>,
    limit: Option<usize>,
}

async fn fired(
    State(a): State<Admin>,
    headers: HeaderMap,
    Query(f): Query<FiredFilter>,
) -> ApiResult {
    a.authorize(&headers)?;
    let limit = f.limit.unwrap_or(100).clamp(1, history::CAPACITY);
    let records = a.console.history.newest(limit, |r| {
        f.target.as_deref().is_none_or(|t| r.target == t)
            && f.delay_id
                .as_deref()
                .is_none_or(|d| r.delay_id.as_deref() == Some(d))
            && f.key.as_deref().is_none_or(|k| r.key.as_deref() == Some(k))
    });
    Ok(Json(value(&FiredRecords {
        records,
        kept: history::CAPACITY,
    })))
}

async fn dead_letter_topics(State(a): State<Admin>, headers: HeaderMap) -> ApiResult {
    a.authorize(&headers)?;
    let source = a.console.dead_letters.clone();
    let topics = tokio::task::spawn_blocking(move || source.topics())
        .await
        .map_err(internal)?
        .map_err(|e| ApiError(StatusCode::BAD_GATEWAY, e))?;
    Ok(Json(value(&DeadLetterTopics { topics })))
}

/// Filters of a dead-letter listing: those of `kafka-delay replay`'s `--filter`.
#[derive(Debug, Default, Deserialize)]
struct DeadFilter {
    reason: Option<String>,
    target: Option<String>,
    key: Option<String>,
    /// `NAME=VALUE`.
    header: Option<String>,
    limit: Option<usize>,
}

impl DeadFilter {
    /// As `replay` filters, and as the text `replay --filter` takes.
    fn filters(&self) -> Result<Vec<(Filter, String)>, ApiError> {
        let mut texts = Vec::new();
        for (name, v) in [
            ("reason", &self.reason),
            ("target", &self.target),
            ("key", &self.key),
        ] {
            if let Some(v) = v.as_deref().filter(|v| !v.is_empty()) {
                texts.push(format!("{name}={v}"));
            }
        }
        if let Some(h) = self.header.as_deref().filter(|h| !h.is_empty()) {
            texts.push(format!("header:{h}"));
        }
        texts
            .into_iter()
            .map(|t| match Filter::parse(&t) {
                Ok(f) => Ok((f, t)),
                Err(e) => Err(bad(format!("filter '{t}': {e}"))),
            })
            .collect()
    }
}

async fn dead_letter_records(
    State(a): State<Admin>,
    headers: HeaderMap,
    Path(topic): Path<String>,
    Query(f): Query<DeadFilter>,
) -> ApiResult {
    a.authorize(&headers)?;
    let filters: Vec<Filter> = f.filters()?.into_iter().map(|(f, _)| f).collect();
    let limit = f.limit.unwrap_or(100).clamp(1, 1_000);
    let source = a.console.dead_letters.clone();
    let records = tokio::task::spawn_blocking(move || source.newest(&topic, &filters, limit))
        .await
        .map_err(internal)?
        .map_err(|e| ApiError(StatusCode::NOT_FOUND, e))?;
    Ok(Json(value(&DeadLetters { records })))
}

/// A replay request: the destination, a rate, and the listing's filters.
#[derive(Debug, Deserialize)]
struct ReplayRequest {
    to: String,
    /// Records per second (N, N/s or N/m); default 10/s.
    rate: Option<String>,
    #[serde(flatten)]
    filter: DeadFilter,
}

async fn replay(
    State(a): State<Admin>,
    headers: HeaderMap,
    Path(topic): Path<String>,
    Json(r): Json<ReplayRequest>,
) -> ApiResult {
    let what = format!("{topic} -> {} rate={:?}", r.to, r.rate);
    a.mutate(&headers, "replay", &what, || {
        if r.to.is_empty() {
            return Err(bad("give to: the topic to move the records to"));
        }
        if !a.console.dead_letters.is_dead_letter_topic(&topic) {
            return Err(bad(format!("'{topic}' is not a dead-letter topic")));
        }
        let rate_text = r.rate.as_deref().unwrap_or("10/s");
        let rate = crate::replay::parse_rate(rate_text)
            .map_err(|e| bad(format!("rate '{rate_text}': {e}")))?;
        let (filters, texts): (Vec<Filter>, Vec<String>) = r.filter.filters()?.into_iter().unzip();
        let source = &a.console.dead_letters;
        let job = a.console.replays.start(
            Replay {
                brokers: source.brokers.clone(),
                from: topic.clone(),
                to: r.to.clone(),
                rate: Some(rate),
                filters,
                dry_run: false,
                kafka_config: source.kafka_config.clone(),
            },
            texts,
        );
        Ok(Json(value(&Started { replay: job })))
    })
}

async fn replays(State(a): State<Admin>, headers: HeaderMap) -> ApiResult {
    a.authorize(&headers)?;
    Ok(Json(value(&Replays {
        replays: a.console.replays.list(),
    })))
}

/// What the console's API needs besides the store.
#[derive(Debug, Clone, Default)]
pub struct Console {
    /// The recently fired records.
    pub history: history::History,
    /// Where dead letters are read from.
    pub dead_letters: dead_letters::Source,
    /// Replays started here.
    pub replays: replays::Replays,
    /// Fired and dead-lettered per minute.
    pub minutes: minutes::Minutes,
    /// This instance's id (static membership), if any.
    pub instance_id: Option<String>,
    /// Its consumer group.
    pub group_id: String,
    /// Its HTTP address, as configured.
    pub http_addr: String,
}

impl Console {
    /// What the console reads besides the store, from the broker's configuration: the
    /// dead-letter topics are the broker's and those the retry policies name.
    pub fn new(config: &Config, history: history::History) -> Self {
        let retry = &config.contract.retry;
        let templates = std::iter::once(&retry.default)
            .chain(retry.by_target.iter().map(|(_, p)| p))
            .filter_map(|p| dead_letters::template_regex(&p.dead_letter))
            .collect();
        Self {
            history,
            dead_letters: dead_letters::Source {
                brokers: config.kafka.brokers.clone(),
                kafka_config: config.kafka.properties.clone(),
                topic: config.topics.dead_letter.clone(),
                templates,
            },
            replays: replays::Replays::default(),
            minutes: minutes::Minutes::default(),
            instance_id: config.kafka.instance_id.clone(),
            group_id: config.kafka.group_id.clone(),
            http_addr: config.http.addr.to_string(),
        }
    }

    /// Samples the fired and dead-lettered totals every 10 s for the per-minute counts, until
    /// `stop`.
    pub fn spawn_minutes(
        &self,
        metrics: &Metrics,
        clock: Arc<dyn Clock>,
        mut stop: watch::Receiver<bool>,
    ) {
        let (minutes, metrics) = (self.minutes.clone(), metrics.clone());
        tokio::spawn(async move {
            loop {
                minutes.sample(
                    clock.now_ms(),
                    total(&metrics.fire.records),
                    total(&metrics.operating.dead_lettered),
                );
                tokio::select! {
                    _ = stop.changed() => return,
                    _ = tokio::time::sleep(std::time::Duration::from_secs(10)) => {}
                }
            }
        });
    }
}
