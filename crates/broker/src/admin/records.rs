//! One record at a time: list and search pending records, show one, cancel, reschedule and
//! fire now; and the JSON a record is shown as.

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::Json;
use serde::Deserialize;
use serde_json::Value;

use super::answers::{
    value, Cancelled, Elsewhere, HeaderText, Listing, Member, Moved, Owners, Record, Source,
    Summary,
};
use super::forward::{forward, locate, Located};
use super::{bad, internal, Admin, ApiError, ApiResult, MAX_PAGE, SCAN_BUDGET};
use crate::store::{Position, Store};
use kafka_delay_core::id::RecordId;
use kafka_delay_core::record::StoredRecord;
use kafka_delay_core::time::{parse_duration_ms, parse_epoch_ms_or_rfc3339};

/// A record id in the API: 16 hex digits.
pub(super) fn parse_id(text: &str) -> Result<RecordId, ApiError> {
    u64::from_str_radix(text, 16)
        .ok()
        .filter(|_| text.len() == 16)
        .map(RecordId)
        .ok_or_else(|| bad(format!("'{text}' is not a record id (16 hex digits)")))
}

pub(super) fn id_text(rid: RecordId) -> String {
    format!("{:016x}", rid.0)
}

pub(super) fn rfc3339(ms: u64) -> String {
    chrono::DateTime::from_timestamp_millis(ms as i64)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_default()
}

pub(super) fn summary(store: &Store, rid: RecordId, due_ms: u64, target: &str) -> Summary {
    let (topic, partition) = store.partition_of(rid.pid()).unwrap_or_default();
    Summary {
        id: id_text(rid),
        due_ms,
        due: rfc3339(due_ms),
        target: target.to_owned(),
        reference: format!("{topic}:{partition}:{}", rid.offset()),
        source: Source {
            topic,
            partition,
            offset: rid.offset(),
        },
    }
}

pub(super) fn detail(store: &Store, rid: RecordId, rec: &StoredRecord) -> Record {
    let utf8 = |b: Option<&[u8]>| {
        b.and_then(|b| std::str::from_utf8(b).ok())
            .map(str::to_owned)
    };
    Record {
        summary: summary(store, rid, rec.due_ms(), rec.target()),
        delay_id: utf8(rec.id()),
        key: utf8(rec.key()),
        value: utf8(rec.value()),
        value_hex: crate::admin::console::hex(rec.value()),
        value_bytes: rec.value().map(<[u8]>::len),
        headers: rec
            .headers()
            .map(|h| HeaderText {
                key: h.key.to_owned(),
                value: utf8(h.value),
            })
            .collect(),
    }
}

/// Which records a listing or a bulk action covers.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Filter {
    pub(super) target: Option<String>,
    /// Due at or after (epoch ms or RFC 3339).
    pub(super) due_from: Option<String>,
    /// Due at or before (epoch ms or RFC 3339).
    pub(super) due_to: Option<String>,
    /// The delay-id (in any source partition).
    pub(super) delay_id: Option<String>,
    /// The key, as text (each index entry examined is read to compare it).
    pub(super) key: Option<String>,
    pub(super) limit: Option<usize>,
    pub(super) cursor: Option<String>,
    /// Bulk only: act on every pending record when no other filter is given.
    #[serde(default)]
    pub(super) all: bool,
}

pub(super) fn time_bound(name: &str, v: &Option<String>) -> Result<Option<u64>, ApiError> {
    v.as_deref()
        .map(|t| parse_epoch_ms_or_rfc3339(t).map_err(|e| bad(format!("{name}: {e}"))))
        .transpose()
}

pub(super) fn parse_cursor(c: &str) -> Result<Position, ApiError> {
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
pub(super) fn select(
    store: &Store,
    f: &Filter,
    limit: usize,
    budget: usize,
) -> Result<Selected, ApiError> {
    let from = time_bound("due_from", &f.due_from)?.unwrap_or(0);
    let to = time_bound("due_to", &f.due_to)?.unwrap_or(u64::MAX);
    // Copies of partitions owned elsewhere (standbys, a partition being restored) are not shown.
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
            let ok = target_ok(rec.target()) && key_ok(rid) && store.owns(rid.pid());
            if (from..=to).contains(&due) && ok {
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
            store.owns(rid.pid()) && target_ok(t) && key_ok(rid)
        })
        .map_err(internal)?;
    let next = next.map(|p| match p {
        Position::At(due, rid) => format!("{due}-{}", id_text(rid)),
        Position::Due(due) => format!("{due}-{}", id_text(RecordId(0))),
    });
    Ok((rows, next))
}

pub(super) async fn list(
    State(a): State<Admin>,
    headers: HeaderMap,
    Query(f): Query<Filter>,
) -> ApiResult {
    a.authorize(&headers)?;
    let limit = f.limit.unwrap_or(100).clamp(1, MAX_PAGE);
    let store = a.store.clone();
    let (rows, next) = tokio::task::spawn_blocking(move || select(&store, &f, limit, SCAN_BUDGET))
        .await
        .map_err(internal)??;
    let listing = Listing {
        records: rows
            .iter()
            .map(|(due, rid, t)| summary(&a.store, *rid, *due, t))
            .collect(),
        next_cursor: next,
        elsewhere: elsewhere(&a).await,
    };
    Ok(Json(value(&listing)))
}

/// With several instances: the other instances and their partitions, whose records this one
/// does not list or change (ask each, or use a record's ref, which any instance sends on).
/// `None` where this instance holds every record of its group.
pub(super) async fn elsewhere(a: &Admin) -> Option<Elsewhere> {
    let cluster = a.cluster.clone();
    let this = cluster.this().map(str::to_owned);
    let answer = match tokio::task::spawn_blocking(move || cluster.owners()).await {
        Ok(Some(Ok(owners))) => Elsewhere::Members(
            owners
                .into_iter()
                .filter(|o| o.http.is_none() || o.http != this)
                .map(|o| Member {
                    http: o.http,
                    partitions: o.partitions,
                })
                .collect(),
        ),
        Ok(None) => return None,
        Ok(Some(Err(e))) => Elsewhere::Error {
            error: e.to_string(),
        },
        Err(e) => Elsewhere::Error {
            error: e.to_string(),
        },
    };
    Some(answer)
}

/// Which instance of the group owns which source partition, and where its HTTP server is:
/// with several instances, each holds (and answers for) only the partitions it owns.
pub(super) async fn owners(State(a): State<Admin>, headers: HeaderMap) -> ApiResult {
    a.authorize(&headers)?;
    let cluster = a.cluster.clone();
    let this = cluster.this().map(str::to_owned);
    let owners = tokio::task::spawn_blocking(move || cluster.owners())
        .await
        .map_err(internal)?
        .ok_or_else(|| {
            ApiError(
                StatusCode::CONFLICT,
                "without --changelog every record of the group is on the one instance it runs"
                    .into(),
            )
        })?
        .map_err(|e| ApiError(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?;
    Ok(Json(value(&Owners { this, owners })))
}

pub(super) async fn show(
    State(a): State<Admin>,
    headers: HeaderMap,
    uri: Uri,
    Path(id): Path<String>,
) -> ApiResult {
    a.authorize(&headers)?;
    let rid = match locate(&a, &id)? {
        Located::Here(rid) => rid,
        Located::Elsewhere(r) => return forward(&a, &r, Method::GET, &uri, &headers, None).await,
    };
    if !a.store.owns(rid.pid()) {
        return Err(not_here(&a, &id));
    }
    match a.store.get(&[rid]).map_err(internal)?.pop().flatten() {
        Some(rec) => Ok(Json(value(&detail(&a.store, rid, &rec)))),
        None => Err(not_here(&a, &id)),
    }
}

pub(super) async fn cancel(
    State(a): State<Admin>,
    headers: HeaderMap,
    uri: Uri,
    Path(id): Path<String>,
) -> ApiResult {
    let located = locate(&a, &id);
    if let Ok(Located::Elsewhere(r)) = &located {
        a.authorize(&headers)?;
        return forward(&a, r, Method::DELETE, &uri, &headers, None).await;
    }
    a.mutate(&headers, "cancel", &id, || {
        let rid = here(&a, &id, located?)?;
        not_firing(&a, rid)?;
        match a.store.cancel(rid).map_err(internal)? {
            Some(rec) => a.log_changes(&[], &[rid]).map(|()| {
                Json(value(&Cancelled {
                    cancelled: summary(&a.store, rid, rec.due_ms(), rec.target()),
                }))
            }),
            None => Err(not_here(&a, &id)),
        }
    })
}

/// The record id of a record located here, if its partition fires here.
fn here(a: &Admin, id: &str, located: Located) -> Result<RecordId, ApiError> {
    match located {
        Located::Here(rid) if a.store.owns(rid.pid()) => Ok(rid),
        _ => Err(not_here(a, id)),
    }
}

/// A record being fired in a transaction is neither cancelled nor moved: its transaction
/// delivers it, or aborts and it fires again.
fn not_firing(a: &Admin, rid: RecordId) -> Result<(), ApiError> {
    if a.store.is_protected(rid) {
        return Err(ApiError(
            StatusCode::CONFLICT,
            "the record is being fired now, in a transaction: it is delivered, or fires again              if the transaction aborts; try again in a moment"
                .into(),
        ));
    }
    Ok(())
}

/// A record not pending here: with several instances it may be another instance's.
fn not_here(a: &Admin, id: &str) -> ApiError {
    let hint = if a.cluster.this().is_some() {
        " on this instance (record ids are per instance, and each holds only the partitions it \
         owns: ask by the record's ref, topic:partition:offset, which any instance sends on to \
         the owner; GET /api/v1/owners names every instance and its partitions)"
    } else {
        ""
    };
    ApiError(
        StatusCode::NOT_FOUND,
        format!("no pending record {id}{hint}"),
    )
}

/// A new due time: absolute (`due`: epoch ms or RFC 3339) or relative to now (`delay`).
#[derive(Debug, Default, Deserialize)]
pub(super) struct When {
    pub(super) due: Option<Value>,
    pub(super) delay: Option<String>,
}

impl When {
    pub(super) fn resolve(&self, now: u64, max_delay_ms: u64) -> Result<u64, ApiError> {
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

pub(super) fn move_one(a: &Admin, id: &str, located: Located, due: u64) -> ApiResult {
    let rid = here(a, id, located)?;
    not_firing(a, rid)?;
    match a.store.reschedule(rid, due).map_err(internal)? {
        Some(previous) => {
            a.log_changes(&[rid], &[])?;
            a.wake(vec![(due, rid)]);
            let target = a
                .store
                .get(&[rid])
                .map_err(internal)?
                .pop()
                .flatten()
                .map(|r| r.target().to_owned())
                .unwrap_or_default();
            Ok(Json(value(&Moved {
                record: summary(&a.store, rid, due, &target),
                previous_due_ms: previous,
            })))
        }
        None => Err(not_here(a, id)),
    }
}

pub(super) async fn reschedule(
    State(a): State<Admin>,
    headers: HeaderMap,
    uri: Uri,
    Path(id): Path<String>,
    Json(when): Json<Value>,
) -> ApiResult {
    let located = locate(&a, &id);
    if let Ok(Located::Elsewhere(r)) = &located {
        a.authorize(&headers)?;
        return forward(&a, r, Method::POST, &uri, &headers, Some(when)).await;
    }
    a.mutate(&headers, "reschedule", &id, || {
        let when: When = serde_json::from_value(when).map_err(|e| bad(e.to_string()))?;
        let due = when.resolve(a.clock.now_ms(), a.max_delay_ms)?;
        move_one(&a, &id, located?, due)
    })
}

pub(super) async fn fire(
    State(a): State<Admin>,
    headers: HeaderMap,
    uri: Uri,
    Path(id): Path<String>,
) -> ApiResult {
    let located = locate(&a, &id);
    if let Ok(Located::Elsewhere(r)) = &located {
        a.authorize(&headers)?;
        return forward(&a, r, Method::POST, &uri, &headers, None).await;
    }
    a.mutate(&headers, "fire", &id, || {
        move_one(&a, &id, located?, a.clock.now_ms())
    })
}
