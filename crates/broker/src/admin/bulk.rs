//! Bulk actions by filter (target, due-time range, delay-id, key): cancel, reschedule and
//! fire now, each on a blocking thread.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use serde::Deserialize;

use super::answers::{value, BulkResult};
use super::records::{elsewhere, select, time_bound, Filter, When};
use super::{bad, internal, Admin, ApiError, ApiResult, MAX_BULK};
use kafka_delay_core::id::RecordId;

/// A bulk request: the filter, and for reschedule the new time.
#[derive(Debug, Deserialize)]
pub(super) struct Bulk {
    #[serde(flatten)]
    pub(super) filter: Filter,
    #[serde(flatten)]
    pub(super) when: When,
}

/// Records changed per store call: one lock and one write batch (with `--sync` one fsync) for
/// each this many, so a bulk action of 100,000 records makes 100 writes, not 100,000.
const BATCH: usize = 1_000;

/// Selects the records `f` covers (at most [`MAX_BULK`]) and hands them to `act` in batches
/// of [`BATCH`]; `act` returns how many of a batch it changed.
pub(super) fn bulk(
    a: &Admin,
    f: &Filter,
    mut act: impl FnMut(&[RecordId]) -> Result<usize, ApiError>,
) -> ApiResult {
    check(f)?;
    let limit = f.limit.unwrap_or(MAX_BULK).clamp(1, MAX_BULK);
    let (rows, next) = select(&a.store, f, limit, usize::MAX)?;
    let ids: Vec<RecordId> = rows.iter().map(|(_, rid, _)| *rid).collect();
    let mut changed = 0;
    for batch in ids.chunks(BATCH) {
        changed += act(batch)?;
    }
    Ok(Json(value(&BulkResult {
        matched: rows.len(),
        changed,
        more: next.is_some(),
        elsewhere: None,
    })))
}

/// Refuses a bulk filter that names nothing (without `all`), carries a cursor, or has a time
/// that is not one.
pub(super) fn check(f: &Filter) -> Result<(), ApiError> {
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
    time_bound("due_from", &f.due_from)?;
    time_bound("due_to", &f.due_to)?;
    Ok(())
}

pub(super) fn bulk_what(f: &Filter) -> String {
    format!(
        "target={:?} due_from={:?} due_to={:?} delay_id={:?} key={:?} all={}",
        f.target, f.due_from, f.due_to, f.delay_id, f.key, f.all
    )
}

/// Runs a bulk action on a blocking thread: it reads up to 100,000 records and writes them in
/// batches (a key filter reads every record it examines), which must not hold up the runtime.
pub(super) async fn off_runtime(f: impl FnOnce() -> ApiResult + Send + 'static) -> ApiResult {
    tokio::task::spawn_blocking(f).await.map_err(internal)?
}

/// A bulk answer, with a changelog naming the instances whose records it did not cover.
async fn and_elsewhere(a: &Admin, answer: ApiResult) -> ApiResult {
    let Json(mut v) = answer?;
    if let Some(others) = elsewhere(a).await {
        v["elsewhere"] = value(&others);
    }
    Ok(Json(v))
}

pub(super) async fn bulk_cancel(
    State(a): State<Admin>,
    headers: HeaderMap,
    Json(f): Json<Filter>,
) -> ApiResult {
    let asked = a.clone();
    let answer = off_runtime(move || {
        a.mutate(&headers, "bulk_cancel", &bulk_what(&f), || {
            bulk(&a, &f, |ids| {
                let gone: Vec<RecordId> = a
                    .store
                    .cancel_many(ids)
                    .map_err(internal)?
                    .into_iter()
                    .map(|(rid, _)| rid)
                    .collect();
                a.log_changes(&[], &gone)?;
                Ok(gone.len())
            })
        })
    })
    .await;
    and_elsewhere(&asked, answer).await
}

pub(super) async fn bulk_reschedule(
    State(a): State<Admin>,
    headers: HeaderMap,
    Json(b): Json<Bulk>,
) -> ApiResult {
    let asked = a.clone();
    let answer = off_runtime(move || {
        a.mutate(&headers, "bulk_reschedule", &bulk_what(&b.filter), || {
            let due = b.when.resolve(a.clock.now_ms(), a.max_delay_ms)?;
            bulk_move(&a, &b.filter, due)
        })
    })
    .await;
    and_elsewhere(&asked, answer).await
}

pub(super) async fn bulk_fire(
    State(a): State<Admin>,
    headers: HeaderMap,
    Json(f): Json<Filter>,
) -> ApiResult {
    let asked = a.clone();
    let answer = off_runtime(move || {
        a.mutate(&headers, "bulk_fire", &bulk_what(&f), || {
            bulk_move(&a, &f, a.clock.now_ms())
        })
    })
    .await;
    and_elsewhere(&asked, answer).await
}

/// Moves the records `f` covers to `due` ("fire now" is a move to now) and puts their new
/// timers in the wheel.
fn bulk_move(a: &Admin, f: &Filter, due: u64) -> ApiResult {
    let mut woken = Vec::new();
    let r = bulk(a, f, |ids| {
        let moved = a.store.reschedule_many(ids, due).map_err(internal)?;
        let rids: Vec<RecordId> = moved.iter().map(|(rid, _)| *rid).collect();
        a.log_changes(&rids, &[])?;
        woken.extend(moved.iter().map(|(rid, _)| (due, *rid)));
        Ok(moved.len())
    });
    a.wake(woken);
    r
}
