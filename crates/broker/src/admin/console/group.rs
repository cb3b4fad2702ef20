//! `GET /api/v1/group/overview`: the group seen from any instance. The instance asked answers
//! for itself and asks every other member for its overview (`GET /api/v1/overview` at the
//! address it advertises, with the caller's token), each within [`ASK_WAIT`], then sums them.
//! A member that does not answer in time, answers an error, or advertises no address is named
//! with the reason and the answer is marked `partial`: no member is left out silently.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::Json;
use serde_json::Value;

use super::answers::{
    Counts, DuePending, GroupOverview, Held, Member, Overview, Partition, TargetPending,
};
use super::overview_here;
use crate::admin::answers::value;
use crate::admin::forward::send;
use crate::admin::{internal, Admin, ApiError, ApiResult};
use crate::changelog::owners::Owner;
use crate::store::stats::BUCKETS;

/// How long a member may take to give its overview.
pub const ASK_WAIT: Duration = Duration::from_secs(5);

pub(super) async fn overview(State(a): State<Admin>, headers: HeaderMap) -> ApiResult {
    a.authorize(&headers)?;
    let here = overview_here(&a, &headers).await?;
    let cluster = a.cluster.clone();
    let this = cluster.this().map(str::to_owned);
    let owners = tokio::task::spawn_blocking(move || cluster.owners())
        .await
        .map_err(internal)?;
    let members = match owners {
        // This instance holds every record of its group.
        None => vec![Member {
            http: Some(here.instance.http.clone()),
            client_id: None,
            mode: None,
            partitions: here.instance.owned_partitions.clone(),
            answered: true,
            error: None,
            overview: Some(value(&here)),
        }],
        Some(Err(e)) => return Err(ApiError(StatusCode::SERVICE_UNAVAILABLE, e.to_string())),
        Some(Ok(owners)) => {
            // Every member asked at once; the answer keeps the coordinator's order.
            let mut asks = tokio::task::JoinSet::new();
            for (i, o) in owners.into_iter().enumerate() {
                let (headers, this, here) = (headers.clone(), this.clone(), here.clone());
                asks.spawn(async move { (i, ask(&headers, this.as_deref(), &here, o).await) });
            }
            let mut members = Vec::new();
            while let Some(done) = asks.join_next().await {
                members.push(done.map_err(internal)?);
            }
            members.sort_by_key(|(i, _)| *i);
            members.into_iter().map(|(_, m)| m).collect()
        }
    };
    Ok(Json(value(&summed(&here, members))))
}

/// A member's overview: this instance's own, or the member's answer.
async fn ask(headers: &HeaderMap, this: Option<&str>, here: &Overview, o: Owner) -> Member {
    let partitions = o
        .partitions
        .iter()
        .map(|(topic, partition)| Partition {
            topic: topic.clone(),
            partition: *partition,
        })
        .collect();
    let mut member = Member {
        http: o.http.clone(),
        client_id: Some(o.client_id.clone()),
        mode: o.mode.clone(),
        partitions,
        answered: false,
        error: None,
        overview: None,
    };
    let Some(http) = o.http.as_deref() else {
        member.error = Some(format!(
            "{} advertises no HTTP address: not a kafka-delay instance",
            o.client_id
        ));
        return member;
    };
    if Some(http) == this {
        member.answered = true;
        member.overview = Some(value(here));
        return member;
    }
    let by = this.unwrap_or("?");
    let asked = tokio::time::timeout(
        ASK_WAIT,
        send(http, Method::GET, "/api/v1/overview", headers, by, None),
    )
    .await
    .unwrap_or_else(|_| Err(format!("no answer within {} s", ASK_WAIT.as_secs())));
    match asked {
        Ok((status, answer)) if status.is_success() => {
            member.answered = true;
            member.overview = Some(answer);
        }
        Ok((status, answer)) => {
            let said = answer["error"].as_str().unwrap_or("no reason given");
            member.error = Some(format!("{http} answered {status}: {said}"));
        }
        Err(e) => member.error = Some(format!("{http} did not answer: {e}")),
    }
    member
}

/// The members' sums over those that answered.
fn summed(here: &Overview, members: Vec<Member>) -> GroupOverview {
    let answers: Vec<&Value> = members.iter().filter_map(|m| m.overview.as_ref()).collect();
    let count = |v: &Value, field: &str| v[field].as_u64().unwrap_or(0);
    let sum = |field: &str| answers.iter().map(|v| count(v, field)).sum::<u64>();
    let mut by_target: BTreeMap<String, u64> = BTreeMap::new();
    let mut by_due: BTreeMap<String, u64> = BTreeMap::new();
    let mut held: BTreeMap<String, f64> = BTreeMap::new();
    for v in &answers {
        for t in v["by_target"].as_array().into_iter().flatten() {
            *by_target.entry(text(&t["target"])).or_default() += count(t, "pending");
        }
        for d in v["by_due"].as_array().into_iter().flatten() {
            *by_due.entry(text(&d["bucket"])).or_default() += count(d, "pending");
        }
        for h in v["held"].as_array().into_iter().flatten() {
            *held.entry(text(&h["target"])).or_default() += h["held"].as_f64().unwrap_or(0.0);
        }
    }
    let mut by_target: Vec<TargetPending> = by_target
        .into_iter()
        .map(|(target, pending)| TargetPending { target, pending })
        .collect();
    by_target.sort_by(|x, y| {
        y.pending
            .cmp(&x.pending)
            .then_with(|| x.target.cmp(&y.target))
    });
    GroupOverview {
        now_ms: here.now_ms,
        group: here.instance.group.clone(),
        asked: here.instance.http.clone(),
        partial: members.iter().any(|m| !m.answered),
        counts: Counts {
            pending: sum("pending"),
            by_target,
            by_due: BUCKETS
                .iter()
                .map(|bucket| DuePending {
                    bucket,
                    pending: by_due.get(*bucket).copied().unwrap_or(0),
                })
                .collect(),
            held: held
                .into_iter()
                .map(|(target, held)| Held { target, held })
                .collect(),
            oldest_overdue_ms: answers
                .iter()
                .map(|v| count(v, "oldest_overdue_ms"))
                .max()
                .unwrap_or(0),
            fired_total: sum("fired_total"),
            dead_lettered_total: sum("dead_lettered_total"),
        },
        members,
        wait_ms: u64::try_from(ASK_WAIT.as_millis()).unwrap_or(u64::MAX),
    }
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_owned()
}
