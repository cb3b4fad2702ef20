//! The admin HTTP API (JSON, described in `schemas/admin.openapi.json`): list and search pending
//! records, show one, cancel, reschedule and fire now, one at a time or in bulk by target and
//! due-time range.
//!
//! Access: with `--admin-token` every `/api/` request needs `Authorization: Bearer <token>`.
//! Without one, the API answers only when the server listens on loopback (the default); on any
//! other address it refuses with 403, so exposing `/metrics` never exposes the records. Every
//! request that changes state is logged at info and counted in
//! `kafka_delay_admin_requests_total{action,outcome}`.
//!
//! A reschedule moves the record in RocksDB and puts a new timer in the wheel; the old timer is
//! skipped when it comes up (the record's due time no longer matches it), so nothing fires
//! early and nothing fires twice.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use tracing::info;

use crate::clock::Clock;
use crate::metrics::Metrics;
use crate::record::time::{parse_duration_ms, parse_epoch_ms_or_rfc3339};
use crate::scheduler::{Inserts, Wake};
use crate::store::{Position, RecordId, Store, StoredRecord};

/// Routes of the API, as (method, path) in the OpenAPI document's notation.
pub const ROUTES: [(&str, &str); 8] = [
    ("get", "/api/v1/pending"),
    ("get", "/api/v1/pending/{id}"),
    ("delete", "/api/v1/pending/{id}"),
    ("post", "/api/v1/pending/{id}/reschedule"),
    ("post", "/api/v1/pending/{id}/fire"),
    ("post", "/api/v1/bulk/cancel"),
    ("post", "/api/v1/bulk/reschedule"),
    ("post", "/api/v1/bulk/fire"),
];

/// Actions counted in `kafka_delay_admin_requests_total`.
pub const ACTIONS: [&str; 7] = [
    "cancel",
    "reschedule",
    "fire",
    "bulk_cancel",
    "bulk_reschedule",
    "bulk_fire",
    "replay",
];
/// Outcomes counted in `kafka_delay_admin_requests_total`.
pub const OUTCOMES: [&str; 4] = ["ok", "not_found", "error", "denied"];

/// Most records one listing returns.
const MAX_PAGE: usize = 1_000;
/// Most index entries one listing examines (a filter that matches little returns a cursor).
const SCAN_BUDGET: usize = 100_000;
/// Most records one bulk request changes; `more: true` says to repeat it.
const MAX_BULK: usize = 100_000;

/// What the API needs.
#[derive(Clone)]
pub struct Admin {
    /// The store.
    pub store: Arc<Store>,
    /// New timers for rescheduled records.
    pub scheduler: Inserts,
    /// Wall clock.
    pub clock: Arc<dyn Clock>,
    /// Metrics.
    pub metrics: Metrics,
    /// Bearer token, when set.
    pub token: Option<String>,
    /// Whether the server listens on loopback only.
    pub loopback: bool,
    /// Furthest a reschedule may move a record ahead of now.
    pub max_delay_ms: u64,
    /// What the web console's part of the API reads.
    pub console: crate::console::Console,
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin")
            .field("token", &self.token.as_ref().map(|_| "[redacted]"))
            .field("loopback", &self.loopback)
            .finish_non_exhaustive()
    }
}

/// An error answer: a status and a sentence.
#[derive(Debug)]
pub(crate) struct ApiError(pub(crate) StatusCode, pub(crate) String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "error": self.1 }))).into_response()
    }
}

pub(crate) type ApiResult = Result<Json<Value>, ApiError>;

pub(crate) fn bad(msg: impl Into<String>) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, msg.into())
}

pub(crate) fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
}

/// The API's routes, to merge into the HTTP server's router.
pub fn router(admin: Admin) -> Router {
    Router::new()
        .route("/api/v1/pending", get(list))
        .route("/api/v1/pending/{id}", get(show).delete(cancel))
        .route("/api/v1/pending/{id}/reschedule", post(reschedule))
        .route("/api/v1/pending/{id}/fire", post(fire))
        .route("/api/v1/bulk/cancel", post(bulk_cancel))
        .route("/api/v1/bulk/reschedule", post(bulk_reschedule))
        .route("/api/v1/bulk/fire", post(bulk_fire))
        .with_state(admin.clone())
        .merge(crate::console::router(admin))
}

impl Admin {
    /// Lets a request through if it comes from this server's own pages or from outside a
    /// browser, and carries the token when one is set (see [`same_origin`]).
    pub(crate) fn authorize(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        same_origin(headers, self.token.is_none())?;
        match &self.token {
            Some(token) => {
                let given = headers
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("Bearer "))
                    .unwrap_or_default();
                if constant_time_eq(given.as_bytes(), token.as_bytes()) {
                    Ok(())
                } else {
                    Err(ApiError(
                        StatusCode::UNAUTHORIZED,
                        "missing or wrong bearer token (Authorization: Bearer <--admin-token>)"
                            .into(),
                    ))
                }
            }
            None if self.loopback => Ok(()),
            None => Err(ApiError(
                StatusCode::FORBIDDEN,
                "the admin API is off on a non-loopback listener without --admin-token".into(),
            )),
        }
    }

    fn count(&self, action: &str, outcome: &str) {
        self.metrics
            .admin_requests
            .with_label_values(&[action, outcome])
            .inc();
    }

    /// Runs a state-changing action: authorizes, counts and logs it.
    pub(crate) fn mutate(
        &self,
        headers: &HeaderMap,
        action: &str,
        what: &str,
        f: impl FnOnce() -> ApiResult,
    ) -> ApiResult {
        if let Err(e) = self.authorize(headers) {
            self.count(action, "denied");
            info!(action, what, status = e.0.as_u16(), "admin request denied");
            return Err(e);
        }
        let result = f();
        match &result {
            Ok(body) => {
                self.count(action, "ok");
                info!(action, what, result = %body.0, "admin request");
            }
            Err(e) => {
                self.count(
                    action,
                    if e.0 == StatusCode::NOT_FOUND {
                        "not_found"
                    } else {
                        "error"
                    },
                );
                info!(action, what, status = e.0.as_u16(), error = %e.1, "admin request failed");
            }
        }
        result
    }

    fn wake(&self, entries: Vec<(u64, RecordId)>) {
        if entries.is_empty() {
            return;
        }
        // The channel is bounded; a full one means the scheduler is behind. The record is in
        // RocksDB with its new due time either way, and is loaded at the next start.
        if self
            .scheduler
            .try_send(Wake::Indexed(entries.clone()))
            .is_err()
        {
            let tx = self.scheduler.clone();
            tokio::spawn(async move {
                let _ = tx.send(Wake::Indexed(entries)).await;
            });
        }
    }
}

/// Refuses what a page of another origin could send from an operator's browser (CSRF), and,
/// when no token is set, a request for a host name that is not a loopback one (DNS rebinding:
/// another site's name made to point at 127.0.0.1 would make its pages same-origin).
///
/// Browsers mark every request a page makes: `Origin` on every POST and DELETE (and on
/// cross-origin GETs), `Sec-Fetch-Site` on all of them. A request whose `Origin` is not this
/// host, or whose `Sec-Fetch-Site` says another site, is refused; curl and other clients send
/// neither and are let through. The API never answers a CORS preflight, so a cross-origin
/// page cannot send a request with a JSON body or a bearer token either.
fn same_origin(headers: &HeaderMap, loopback_only: bool) -> Result<(), ApiError> {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let host = get("host").unwrap_or_default();
    let refuse = |why: String| Err(ApiError(StatusCode::FORBIDDEN, why));
    if let Some(origin) = get("origin") {
        let authority = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"));
        if authority != Some(host) {
            return refuse(format!(
                "cross-origin request refused: Origin {origin} is not this server ({host})"
            ));
        }
    }
    if matches!(get("sec-fetch-site"), Some("cross-site" | "same-site")) {
        return refuse("cross-site request refused".into());
    }
    if loopback_only && !host.is_empty() && !is_loopback_host(host) {
        return refuse(format!(
            "host '{host}' is not a loopback name: without --admin-token the API answers only \
             requests for 127.0.0.1, [::1] or localhost"
        ));
    }
    Ok(())
}

/// Whether a `Host` header names a loopback address (with or without a port).
fn is_loopback_host(host: &str) -> bool {
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.chars().all(|c| c.is_ascii_digit()) && !name.ends_with(':') => {
            name
        }
        _ => host,
    };
    let name = name.trim_start_matches('[').trim_end_matches(']');
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A record id in the API: 16 hex digits.
fn parse_id(text: &str) -> Result<RecordId, ApiError> {
    u64::from_str_radix(text, 16)
        .ok()
        .filter(|_| text.len() == 16)
        .map(RecordId)
        .ok_or_else(|| bad(format!("'{text}' is not a record id (16 hex digits)")))
}

fn id_text(rid: RecordId) -> String {
    format!("{:016x}", rid.0)
}

fn rfc3339(ms: u64) -> String {
    chrono::DateTime::from_timestamp_millis(ms as i64)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_default()
}

fn summary(store: &Store, rid: RecordId, due_ms: u64, target: &str) -> Value {
    let (topic, partition) = store.partition_of(rid.pid()).unwrap_or_default();
    json!({
        "id": id_text(rid),
        "due_ms": due_ms,
        "due": rfc3339(due_ms),
        "target": target,
        "source": { "topic": topic, "partition": partition, "offset": rid.offset() },
    })
}

/// `bytes` as text when they are UTF-8, else null.
pub(crate) fn text(bytes: Option<&[u8]>) -> Value {
    bytes
        .and_then(|b| std::str::from_utf8(b).ok())
        .map_or(Value::Null, |s| Value::String(s.to_owned()))
}

fn detail(store: &Store, rid: RecordId, rec: &StoredRecord) -> Value {
    let mut v = summary(store, rid, rec.due_ms(), rec.target());
    v["delay_id"] = text(rec.id());
    v["key"] = text(rec.key());
    v["value"] = text(rec.value());
    v["value_hex"] = crate::console::hex(rec.value());
    v["value_bytes"] = json!(rec.value().map(<[u8]>::len));
    v["headers"] = rec
        .headers()
        .map(|h| json!({ "key": h.key, "value": text(h.value) }))
        .collect();
    v
}

/// Which records a listing or a bulk action covers.
#[derive(Debug, Default, Deserialize)]
struct Filter {
    target: Option<String>,
    /// Due at or after (epoch ms or RFC 3339).
    due_from: Option<String>,
    /// Due at or before (epoch ms or RFC 3339).
    due_to: Option<String>,
    /// The delay-id (in any source partition).
    delay_id: Option<String>,
    /// The key, as text (each index entry examined is read to compare it).
    key: Option<String>,
    limit: Option<usize>,
    cursor: Option<String>,
    /// Bulk only: act on every pending record when no other filter is given.
    #[serde(default)]
    all: bool,
}

fn time_bound(name: &str, v: &Option<String>) -> Result<Option<u64>, ApiError> {
    v.as_deref()
        .map(|t| parse_epoch_ms_or_rfc3339(t).map_err(|e| bad(format!("{name}: {e}"))))
        .transpose()
}

fn parse_cursor(c: &str) -> Result<Position, ApiError> {
    let (due, id) = c
        .split_once('-')
        .ok_or_else(|| bad(format!("cursor '{c}' is not one this API returned")))?;
    let due = due
        .parse()
        .map_err(|_| bad(format!("cursor '{c}' is not one this API returned")))?;
    Ok(Position::At(due, parse_id(id)?))
}

/// Matching (due, id, target) triples and the cursor to go on from, as the API shows it.
type Selected = (Vec<(u64, RecordId, String)>, Option<String>);

/// Matching records as (due, id, target), up to `limit`, and the cursor to go on from.
fn select(store: &Store, f: &Filter, limit: usize, budget: usize) -> Result<Selected, ApiError> {
    let from = time_bound("due_from", &f.due_from)?.unwrap_or(0);
    let to = time_bound("due_to", &f.due_to)?.unwrap_or(u64::MAX);
    let target_ok = |t: &str| f.target.as_deref().is_none_or(|want| want == t);
    let key_ok = |rid: RecordId| {
        f.key.as_deref().is_none_or(|want| {
            store
                .get(&[rid])
                .ok()
                .and_then(|mut r| r.pop().flatten())
                .is_some_and(|r| r.key() == Some(want.as_bytes()))
        })
    };
    if let Some(id) = &f.delay_id {
        let mut out = Vec::new();
        for (due, rid) in store.find_id(id.as_bytes()).map_err(internal)? {
            let Some(rec) = store.get(&[rid]).map_err(internal)?.pop().flatten() else {
                continue;
            };
            if (from..=to).contains(&due) && target_ok(rec.target()) && key_ok(rid) {
                out.push((due, rid, rec.target().to_owned()));
            }
        }
        return Ok((out, None));
    }
    let start = match &f.cursor {
        Some(c) => parse_cursor(c)?,
        None => Position::Due(from),
    };
    let (rows, next) = store
        .list(start, to, limit, budget, |_, rid, t| {
            target_ok(t) && key_ok(rid)
        })
        .map_err(internal)?;
    let next = next.map(|p| match p {
        Position::At(due, rid) => format!("{due}-{}", id_text(rid)),
        Position::Due(due) => format!("{due}-{}", id_text(RecordId(0))),
    });
    Ok((rows, next))
}

async fn list(State(a): State<Admin>, headers: HeaderMap, Query(f): Query<Filter>) -> ApiResult {
    a.authorize(&headers)?;
    let limit = f.limit.unwrap_or(100).clamp(1, MAX_PAGE);
    let store = a.store.clone();
    let (rows, next) = tokio::task::spawn_blocking(move || select(&store, &f, limit, SCAN_BUDGET))
        .await
        .map_err(internal)??;
    let records: Vec<Value> = rows
        .iter()
        .map(|(due, rid, t)| summary(&a.store, *rid, *due, t))
        .collect();
    Ok(Json(json!({ "records": records, "next_cursor": next })))
}

async fn show(State(a): State<Admin>, headers: HeaderMap, Path(id): Path<String>) -> ApiResult {
    a.authorize(&headers)?;
    let rid = parse_id(&id)?;
    match a.store.get(&[rid]).map_err(internal)?.pop().flatten() {
        Some(rec) => Ok(Json(detail(&a.store, rid, &rec))),
        None => Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("no pending record {id}"),
        )),
    }
}

async fn cancel(State(a): State<Admin>, headers: HeaderMap, Path(id): Path<String>) -> ApiResult {
    a.mutate(&headers, "cancel", &id, || {
        let rid = parse_id(&id)?;
        match a.store.cancel(rid).map_err(internal)? {
            Some(rec) => Ok(Json(json!({
                "cancelled": summary(&a.store, rid, rec.due_ms(), rec.target())
            }))),
            None => Err(ApiError(
                StatusCode::NOT_FOUND,
                format!("no pending record {id}"),
            )),
        }
    })
}

/// A new due time: absolute (`due`: epoch ms or RFC 3339) or relative to now (`delay`).
#[derive(Debug, Default, Deserialize)]
struct When {
    due: Option<Value>,
    delay: Option<String>,
}

impl When {
    fn resolve(&self, now: u64, max_delay_ms: u64) -> Result<u64, ApiError> {
        let due = match (&self.due, &self.delay) {
            (Some(_), Some(_)) => return Err(bad("give due or delay, not both")),
            (None, None) => return Err(bad("give due (epoch ms or RFC 3339) or delay (like 30s)")),
            (Some(Value::Number(n)), None) => n
                .as_u64()
                .ok_or_else(|| bad(format!("due {n} is not a whole number of epoch ms")))?,
            (Some(Value::String(s)), None) => {
                parse_epoch_ms_or_rfc3339(s).map_err(|e| bad(format!("due: {e}")))?
            }
            (Some(other), None) => return Err(bad(format!("due {other} is not a time"))),
            (None, Some(d)) => {
                now.saturating_add(parse_duration_ms(d).map_err(|e| bad(format!("delay: {e}")))?)
            }
        };
        if due > now.saturating_add(max_delay_ms) {
            return Err(bad(format!(
                "due {due} is more than the maximum delay ({max_delay_ms} ms) ahead"
            )));
        }
        Ok(due)
    }
}

fn move_one(a: &Admin, id: &str, due: u64) -> ApiResult {
    let rid = parse_id(id)?;
    match a.store.reschedule(rid, due).map_err(internal)? {
        Some(previous) => {
            a.wake(vec![(due, rid)]);
            let target = a
                .store
                .get(&[rid])
                .map_err(internal)?
                .pop()
                .flatten()
                .map(|r| r.target().to_owned())
                .unwrap_or_default();
            Ok(Json(json!({
                "record": summary(&a.store, rid, due, &target),
                "previous_due_ms": previous,
            })))
        }
        None => Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("no pending record {id}"),
        )),
    }
}

async fn reschedule(
    State(a): State<Admin>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Json(when): Json<When>,
) -> ApiResult {
    a.mutate(&headers, "reschedule", &id, || {
        let due = when.resolve(a.clock.now_ms(), a.max_delay_ms)?;
        move_one(&a, &id, due)
    })
}

async fn fire(State(a): State<Admin>, headers: HeaderMap, Path(id): Path<String>) -> ApiResult {
    a.mutate(&headers, "fire", &id, || {
        move_one(&a, &id, a.clock.now_ms())
    })
}

/// A bulk request: the filter, and for reschedule the new time.
#[derive(Debug, Deserialize)]
struct Bulk {
    #[serde(flatten)]
    filter: Filter,
    #[serde(flatten)]
    when: When,
}

fn bulk(
    a: &Admin,
    f: &Filter,
    mut act: impl FnMut(RecordId) -> Result<bool, ApiError>,
) -> ApiResult {
    if f.target.is_none()
        && f.due_from.is_none()
        && f.due_to.is_none()
        && f.delay_id.is_none()
        && f.key.is_none()
        && !f.all
    {
        return Err(bad(
            "give target, due_from, due_to or delay_id; to act on every pending record say \"all\": true",
        ));
    }
    if f.cursor.is_some() {
        return Err(bad(
            "bulk actions take no cursor: repeat the request while more is true",
        ));
    }
    let limit = f.limit.unwrap_or(MAX_BULK).clamp(1, MAX_BULK);
    let (rows, next) = select(&a.store, f, limit, usize::MAX)?;
    let mut changed = 0u64;
    for (_, rid, _) in &rows {
        if act(*rid)? {
            changed += 1;
        }
    }
    Ok(Json(
        json!({ "matched": rows.len(), "changed": changed, "more": next.is_some() }),
    ))
}

fn bulk_what(f: &Filter) -> String {
    format!(
        "target={:?} due_from={:?} due_to={:?} delay_id={:?} key={:?} all={}",
        f.target, f.due_from, f.due_to, f.delay_id, f.key, f.all
    )
}

/// Runs a bulk action on a blocking thread: it makes up to 100,000 store calls (a key filter
/// reads every record it examines), which must not hold up the runtime.
async fn off_runtime(f: impl FnOnce() -> ApiResult + Send + 'static) -> ApiResult {
    tokio::task::spawn_blocking(f).await.map_err(internal)?
}

async fn bulk_cancel(
    State(a): State<Admin>,
    headers: HeaderMap,
    Json(f): Json<Filter>,
) -> ApiResult {
    off_runtime(move || {
        a.mutate(&headers, "bulk_cancel", &bulk_what(&f), || {
            bulk(&a, &f, |rid| {
                Ok(a.store.cancel(rid).map_err(internal)?.is_some())
            })
        })
    })
    .await
}

async fn bulk_reschedule(
    State(a): State<Admin>,
    headers: HeaderMap,
    Json(b): Json<Bulk>,
) -> ApiResult {
    off_runtime(move || {
        a.mutate(&headers, "bulk_reschedule", &bulk_what(&b.filter), || {
            let due = b.when.resolve(a.clock.now_ms(), a.max_delay_ms)?;
            let mut woken = Vec::new();
            let r = bulk(&a, &b.filter, |rid| {
                let moved = a.store.reschedule(rid, due).map_err(internal)?.is_some();
                if moved {
                    woken.push((due, rid));
                }
                Ok(moved)
            });
            a.wake(woken);
            r
        })
    })
    .await
}

async fn bulk_fire(State(a): State<Admin>, headers: HeaderMap, Json(f): Json<Filter>) -> ApiResult {
    off_runtime(move || {
        a.mutate(&headers, "bulk_fire", &bulk_what(&f), || {
            let now = a.clock.now_ms();
            let mut woken = Vec::new();
            let r = bulk(&a, &f, |rid| {
                let moved = a.store.reschedule(rid, now).map_err(internal)?.is_some();
                if moved {
                    woken.push((now, rid));
                }
                Ok(moved)
            });
            a.wake(woken);
            r
        })
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_of_other_origins_and_rebound_host_names_are_refused() {
        let h = |pairs: &[(&'static str, &str)]| {
            let mut m = HeaderMap::new();
            for (k, v) in pairs {
                m.insert(*k, v.parse().unwrap());
            }
            m
        };
        // curl: no Origin, no Sec-Fetch-Site.
        assert!(same_origin(&h(&[("host", "127.0.0.1:9464")]), true).is_ok());
        assert!(same_origin(&h(&[("host", "localhost")]), true).is_ok());
        assert!(same_origin(&h(&[("host", "[::1]:9464")]), true).is_ok());
        // The console's own page.
        let own = [
            ("host", "127.0.0.1:9464"),
            ("origin", "http://127.0.0.1:9464"),
            ("sec-fetch-site", "same-origin"),
        ];
        assert!(same_origin(&h(&own), true).is_ok());
        // Another site's page posting to the loopback API.
        for bad in [
            vec![
                ("host", "127.0.0.1:9464"),
                ("origin", "https://evil.example"),
            ],
            vec![("host", "127.0.0.1:9464"), ("origin", "null")],
            vec![("host", "127.0.0.1:9464"), ("sec-fetch-site", "cross-site")],
            vec![
                ("host", "127.0.0.1:9464"),
                ("origin", "http://127.0.0.1:8080"),
            ],
        ] {
            assert_eq!(
                same_origin(&h(&bad), true).unwrap_err().0,
                StatusCode::FORBIDDEN,
                "{bad:?}"
            );
        }
        // DNS rebinding: another name for 127.0.0.1 is refused without a token, allowed with.
        let rebound = [
            ("host", "evil.example:9464"),
            ("origin", "http://evil.example:9464"),
        ];
        assert!(same_origin(&h(&rebound), true).is_err());
        assert!(same_origin(&h(&rebound), false).is_ok());
        assert!(!is_loopback_host("127.0.0.1.evil.example"));
        assert!(is_loopback_host("127.0.0.2:80"));
    }

    #[test]
    fn the_openapi_document_lists_exactly_the_routes() {
        let doc: Value =
            serde_json::from_str(include_str!("../../../schemas/admin.openapi.json")).unwrap();
        assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
        let mut documented: Vec<(String, String)> = Vec::new();
        for (path, ops) in doc["paths"].as_object().unwrap() {
            for method in ops.as_object().unwrap().keys() {
                if ["get", "post", "delete", "put", "patch"].contains(&method.as_str()) {
                    documented.push((method.clone(), path.clone()));
                }
            }
        }
        documented.sort();
        let mut routes: Vec<(String, String)> = ROUTES
            .iter()
            .chain(&crate::console::ROUTES)
            .map(|(m, p)| ((*m).into(), (*p).into()))
            .collect();
        routes.sort();
        assert_eq!(documented, routes);
    }

    #[test]
    fn without_a_token_only_a_loopback_listener_answers() {
        let dir = tempfile::TempDir::new().unwrap();
        let store =
            Arc::new(Store::open(dir.path(), crate::store::StoreOptions::default()).unwrap());
        let (tx, _rx) = tokio::sync::mpsc::channel(1);
        let admin = |token: Option<&str>, loopback| Admin {
            store: store.clone(),
            scheduler: tx.clone(),
            clock: Arc::new(crate::clock::SystemClock),
            metrics: Metrics::new(&prometheus::Registry::new()).unwrap(),
            token: token.map(str::to_owned),
            loopback,
            max_delay_ms: 1,
            console: crate::console::Console::default(),
        };
        let none = HeaderMap::new();
        let mut good = HeaderMap::new();
        good.insert("authorization", "Bearer t0ken-t0ken-t0ken".parse().unwrap());
        assert!(admin(None, true).authorize(&none).is_ok());
        assert_eq!(
            admin(None, false).authorize(&good).unwrap_err().0,
            StatusCode::FORBIDDEN
        );
        let with = admin(Some("t0ken-t0ken-t0ken"), false);
        assert!(with.authorize(&good).is_ok());
        assert_eq!(
            with.authorize(&none).unwrap_err().0,
            StatusCode::UNAUTHORIZED
        );
        assert!(
            !format!("{with:?}").contains("t0ken"),
            "the token is never printed"
        );
    }

    #[test]
    fn ids_and_times() {
        assert_eq!(
            parse_id("0001000000000007").unwrap(),
            RecordId::new(1, 7).unwrap()
        );
        assert!(parse_id("7").is_err());
        assert!(parse_id("zz01000000000007").is_err());
        let w = When {
            due: None,
            delay: Some("30s".into()),
        };
        assert_eq!(w.resolve(1_000, 60_000).unwrap(), 31_000);
        let w = When {
            due: Some(json!(5_000)),
            delay: None,
        };
        assert_eq!(w.resolve(1_000, 60_000).unwrap(), 5_000);
        let w = When {
            due: Some(json!("2025-11-21T04:40:00Z")),
            delay: None,
        };
        assert_eq!(
            w.resolve(1_763_700_000_000, 60_000).unwrap(),
            1_763_700_000_000
        );
        let far = When {
            due: None,
            delay: Some("2m".into()),
        };
        assert!(far
            .resolve(0, 60_000)
            .unwrap_err()
            .1
            .contains("maximum delay"));
        assert!(When::default().resolve(0, 1).is_err());
        assert!(constant_time_eq(b"abc", b"abc") && !constant_time_eq(b"abc", b"abd"));
    }
}
