//! The group's pending records from any instance: `GET /api/v1/group/pending` lists and
//! searches every member's records, merged in due order, with one cursor that pages across
//! them; `POST /api/v1/group/bulk/{cancel,reschedule,fire}` applies a bulk action on every
//! member and says what each one did.
//!
//! The instance asked sends the request to each member at the address it advertises (with the
//! caller's token) and answers for itself directly. A member that does not answer in time,
//! answers an error, or advertises no address is named with the reason and the answer is
//! marked `partial`: its records are missing from the page, or the action was not applied
//! there, and repeating the request is safe (a bulk action changes only what is still as the
//! filter says; a listing's cursor keeps that member's place).
//!
//! Every member lists only the partitions it fires, never a standby copy, so a record is
//! listed once. A rebalance between two pages can repeat or skip a record whose partition
//! moved; the members' list says who answered each page.

use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::Json;
use serde_json::Value;

use super::answers::{value, Answered, GroupBulk};
use super::bulk::{bulk_cancel, bulk_fire, bulk_reschedule, Bulk};
use super::forward::send;
use super::records::Filter;
use super::{bad, internal, Admin, ApiError, ApiResult};

mod listing;
pub(in crate::admin) use listing::pending;

/// How long a member may take to apply a bulk action (up to 100,000 records).
const BULK_WAIT: Duration = Duration::from_secs(60);

/// A member to ask: this instance, or another at its advertised address.
#[derive(Debug, Clone)]
pub(super) struct Asked {
    /// Its advertised HTTP address (`None`: this instance, which holds every record of its
    /// group, or a member that advertises none).
    pub(super) http: Option<String>,
    pub(super) client_id: Option<String>,
    pub(super) here: bool,
}

/// Every member of the group, this one included.
pub(super) async fn members(a: &Admin) -> Result<Vec<Asked>, ApiError> {
    let cluster = a.cluster.clone();
    let this = cluster.this().map(str::to_owned);
    let owners = tokio::task::spawn_blocking(move || cluster.owners())
        .await
        .map_err(internal)?;
    match owners {
        None => Ok(vec![Asked {
            http: None,
            client_id: None,
            here: true,
        }]),
        Some(Err(e)) => Err(ApiError(StatusCode::SERVICE_UNAVAILABLE, e.to_string())),
        Some(Ok(owners)) => Ok(owners
            .into_iter()
            .map(|o| Asked {
                here: o.http.is_some() && o.http == this,
                http: o.http,
                client_id: Some(o.client_id),
            })
            .collect()),
    }
}

/// The key a member has in a cursor.
pub(super) fn key(m: &Asked) -> String {
    m.http.clone().unwrap_or_else(|| "this".to_owned())
}

/// Asks every member at once with `ask` (given the member) and returns their answers in the
/// members' order, each within `wait`.
pub(super) async fn ask_all<T, F, Fut>(
    members: &[T],
    wait: Duration,
    ask: F,
) -> Vec<Result<Value, String>>
where
    T: Clone,
    F: Fn(T) -> Fut,
    Fut: std::future::Future<Output = Result<Value, String>> + Send + 'static,
{
    let mut asks = tokio::task::JoinSet::new();
    for (i, m) in members.iter().enumerate() {
        let asked = ask(m.clone());
        asks.spawn(async move {
            let answer = tokio::time::timeout(wait, asked)
                .await
                .unwrap_or_else(|_| Err(format!("no answer within {} s", wait.as_secs())));
            (i, answer)
        });
    }
    let mut answers: Vec<Option<Result<Value, String>>> = vec![None; members.len()];
    while let Some(done) = asks.join_next().await {
        if let Ok((i, answer)) = done {
            answers[i] = Some(answer);
        }
    }
    answers
        .into_iter()
        .map(|a| a.unwrap_or_else(|| Err("the request failed".to_owned())))
        .collect()
}

/// Sends `method path` with `body` to the member at `http`: its answer, or why there is none.
pub(super) async fn remote(
    http: Option<String>,
    client_id: Option<String>,
    (method, path, headers, by): (Method, String, HeaderMap, String),
    body: Option<Value>,
) -> Result<Value, String> {
    let Some(http) = http else {
        return Err(format!(
            "{} advertises no HTTP address: not a kafka-delay instance",
            client_id.unwrap_or_default()
        ));
    };
    match send(&http, method, &path, &headers, &by, body).await {
        Ok((status, answer)) if status.is_success() => Ok(answer),
        Ok((status, answer)) => {
            let said = answer["error"].as_str().unwrap_or("no reason given");
            Err(format!("{http} answered {status}: {said}"))
        }
        Err(e) => Err(format!("{http} did not answer: {e}")),
    }
}

/// What a member said, as the answer shows it.
pub(super) fn answered(
    m: &Asked,
    answer: &Result<Value, String>,
    result: Option<Value>,
) -> Answered {
    Answered {
        http: m.http.clone(),
        client_id: m.client_id.clone(),
        answered: answer.is_ok(),
        error: answer.as_ref().err().cloned(),
        result,
    }
}

/// `POST /api/v1/group/bulk/{action}`: the bulk action on every member, with what each did.
pub(super) async fn bulk(
    State(a): State<Admin>,
    headers: HeaderMap,
    Path(action): Path<String>,
    Json(body): Json<Value>,
) -> ApiResult {
    a.authorize(&headers)?;
    if !["cancel", "reschedule", "fire"].contains(&action.as_str()) {
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("no bulk action '{action}' (cancel, reschedule or fire)"),
        ));
    }
    // Read here first: a body no member would take is one clear error, sent to none.
    let bulk_body: Bulk = serde_json::from_value(body.clone()).map_err(|e| bad(e.to_string()))?;
    super::bulk::check(&bulk_body.filter)?;
    if action == "reschedule" {
        bulk_body.when.resolve(a.clock.now_ms(), a.max_delay_ms)?;
    } else if bulk_body.when.due.is_some() || bulk_body.when.delay.is_some() {
        return Err(bad(format!("{action} takes no due or delay")));
    }
    let members = members(&a).await?;
    let by = a.cluster.this().unwrap_or("?").to_owned();
    let answers = ask_all(&members, BULK_WAIT, |m| {
        let (a, headers, by, body, action) = (
            a.clone(),
            headers.clone(),
            by.clone(),
            body.clone(),
            action.clone(),
        );
        async move {
            if m.here {
                return here(a, headers, &action, body).await;
            }
            let path = format!("/api/v1/bulk/{action}");
            remote(
                m.http,
                m.client_id,
                (Method::POST, path, headers, by),
                Some(body),
            )
            .await
        }
    })
    .await;
    let count = |field: &str| {
        answers
            .iter()
            .filter_map(|r| r.as_ref().ok())
            .map(|v| v[field].as_u64().unwrap_or(0))
            .sum::<u64>()
    };
    let members: Vec<Answered> = members
        .iter()
        .zip(&answers)
        .map(|(m, r)| {
            let result = r.as_ref().ok().map(|v| {
                let mut v = v.clone();
                if let Value::Object(o) = &mut v {
                    o.remove("elsewhere");
                }
                v
            });
            answered(m, r, result)
        })
        .collect();
    Ok(Json(value(&GroupBulk {
        matched: count("matched"),
        changed: count("changed"),
        more: answers
            .iter()
            .filter_map(|r| r.as_ref().ok())
            .any(|v| v["more"] == true),
        partial: answers.iter().any(Result::is_err),
        members,
    })))
}

/// The bulk action on this instance.
async fn here(a: Admin, headers: HeaderMap, action: &str, body: Value) -> Result<Value, String> {
    let parse = |e: serde_json::Error| e.to_string();
    let answer = match action {
        "cancel" => {
            let f: Filter = serde_json::from_value(body).map_err(parse)?;
            bulk_cancel(State(a), headers, Json(f)).await
        }
        "fire" => {
            let f: Filter = serde_json::from_value(body).map_err(parse)?;
            bulk_fire(State(a), headers, Json(f)).await
        }
        _ => {
            let b: Bulk = serde_json::from_value(body).map_err(parse)?;
            bulk_reschedule(State(a), headers, Json(b)).await
        }
    };
    answer.map(|Json(v)| v).map_err(|e| e.1)
}
