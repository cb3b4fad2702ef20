//! The group's listing: each member's page asked with its own place, merged in due order,
//! and the cursor that holds every member's place for the next page.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{answered, ask_all, key, members, remote, Asked};
use crate::admin::answers::{value, Answered, GroupListing};
use crate::admin::records::{list, time_bound, Filter};
use crate::admin::{bad, Admin, ApiError, ApiResult, MAX_PAGE};

/// How long a member may take to give a page of its records.
const LIST_WAIT: Duration = Duration::from_secs(5);

/// Where each member's listing goes on from, between pages.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct GroupCursor {
    /// The due time of the last record listed: a member that joined since is listed from it.
    after: u64,
    /// By member (its address): its own cursor, or `None` once it has listed everything.
    members: BTreeMap<String, Option<String>>,
    /// Members that did not answer a page: not asked again by this listing (each page would
    /// wait for them), and named on every page as missing.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    skipped: BTreeSet<String>,
}

impl GroupCursor {
    fn encode(&self) -> String {
        let json = serde_json::to_string(self).unwrap_or_default();
        json.bytes().map(|b| format!("{b:02x}")).collect()
    }

    fn decode(text: &str) -> Result<Self, ApiError> {
        let wrong = || bad(format!("cursor '{text}' is not one this API returned"));
        if text.len() % 2 != 0 {
            return Err(wrong());
        }
        let bytes: Option<Vec<u8>> = (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
            .collect();
        serde_json::from_slice(&bytes.ok_or_else(wrong)?).map_err(|_| wrong())
    }
}

/// One member's page: its records (summaries, in its due order) and its next cursor.
#[derive(Debug, Clone, PartialEq)]
struct MemberPage {
    records: Vec<Value>,
    next: Option<String>,
}

/// The first `limit` records of the members' pages in due order (ties kept in member order,
/// then each member's own order), each with the member it came from, and where each member
/// goes on from: the first record of its page not taken, or its own next cursor once all
/// were taken (`None` when it has no more).
fn merge(
    pages: &[(String, MemberPage)],
    limit: usize,
) -> (Vec<(usize, Value)>, Vec<Option<String>>) {
    let mut order: Vec<(u64, usize, usize)> = pages
        .iter()
        .enumerate()
        .flat_map(|(m, (_, p))| {
            p.records
                .iter()
                .enumerate()
                .map(move |(k, r)| (r["due_ms"].as_u64().unwrap_or(0), m, k))
        })
        .collect();
    order.sort_unstable();
    order.truncate(limit);
    let mut taken = vec![0usize; pages.len()];
    let records = order
        .iter()
        .map(|(_, m, k)| {
            taken[*m] += 1;
            (*m, pages[*m].1.records[*k].clone())
        })
        .collect();
    let next = pages
        .iter()
        .zip(&taken)
        .map(|((_, p), t)| match p.records.get(*t) {
            Some(r) => Some(format!(
                "{}-{}",
                r["due_ms"].as_u64().unwrap_or(0),
                r["id"].as_str().unwrap_or_default()
            )),
            None => p.next.clone(),
        })
        .collect();
    (records, next)
}

/// The query of a member's listing: the filter, its place and the page size.
fn member_filter(f: &Filter, place: Place, limit: usize) -> Filter {
    let mut mine = Filter {
        target: f.target.clone(),
        due_from: f.due_from.clone(),
        due_to: f.due_to.clone(),
        delay_id: f.delay_id.clone(),
        key: f.key.clone(),
        limit: Some(limit),
        cursor: None,
        all: false,
    };
    match place {
        Place::Start => {}
        Place::From(after) => {
            let from = time_bound("due_from", &f.due_from)
                .ok()
                .flatten()
                .unwrap_or(0);
            mine.due_from = Some(from.max(after).to_string());
        }
        Place::At(cursor) => mine.cursor = Some(cursor),
    }
    mine
}

/// Where a member's listing starts.
#[derive(Debug, Clone)]
enum Place {
    /// Where the filter says (the first page).
    Start,
    /// At this due time (a member new since the last page).
    From(u64),
    /// At its own cursor.
    At(String),
}

fn query(f: &Filter) -> String {
    let pairs = [
        ("target", &f.target),
        ("due_from", &f.due_from),
        ("due_to", &f.due_to),
        ("delay_id", &f.delay_id),
        ("key", &f.key),
        ("cursor", &f.cursor),
    ];
    let mut q: Vec<String> = pairs
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={}", encode(v))))
        .collect();
    if let Some(limit) = f.limit {
        q.push(format!("limit={limit}"));
    }
    q.join("&")
}

/// Percent-encodes a query value (all but RFC 3986's unreserved characters).
fn encode(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `GET /api/v1/group/pending`: every member's records in due order, a page at a time.
pub(in crate::admin) async fn pending(
    State(a): State<Admin>,
    headers: HeaderMap,
    Query(f): Query<Filter>,
) -> ApiResult {
    a.authorize(&headers)?;
    let limit = f.limit.unwrap_or(100).clamp(1, MAX_PAGE);
    let cursor = f.cursor.as_deref().map(GroupCursor::decode).transpose()?;
    // Checked here, so that a bad filter is one clear error rather than one per member.
    time_bound("due_from", &f.due_from)?;
    time_bound("due_to", &f.due_to)?;
    let (asked, mut shown) = places(members(&a).await?, cursor.as_ref());
    let by = a.cluster.this().unwrap_or("?").to_owned();
    let answers = ask_all(&asked, LIST_WAIT, |(m, place)| {
        let mine = member_filter(&f, place, limit);
        let (a, headers, by) = (a.clone(), headers.clone(), by.clone());
        async move {
            if m.here {
                return list(State(a), headers, Query(mine))
                    .await
                    .map(|Json(v)| v)
                    .map_err(|e| e.1);
            }
            let path = format!("/api/v1/pending?{}", query(&mine));
            remote(m.http, m.client_id, (Method::GET, path, headers, by), None).await
        }
    })
    .await;
    shown.extend(
        asked
            .iter()
            .zip(&answers)
            .map(|((m, _), r)| answered(m, r, None)),
    );
    let (records, next) = page(cursor.unwrap_or_default(), &asked, &answers, limit);
    Ok(Json(value(&GroupListing {
        records,
        next_cursor: next,
        partial: shown.iter().any(|m| !m.answered),
        members: shown,
    })))
}

/// The members to ask for this page and where each starts, and those not asked because they
/// did not answer an earlier page (shown as missing). Members that listed everything on an
/// earlier page are not asked again.
fn places(
    members: Vec<Asked>,
    cursor: Option<&GroupCursor>,
) -> (Vec<(Asked, Place)>, Vec<Answered>) {
    let mut asked = Vec::new();
    let mut missing = Vec::new();
    for m in members {
        let Some(c) = cursor else {
            asked.push((m, Place::Start));
            continue;
        };
        if c.skipped.contains(&key(&m)) {
            let why = Err(
                "did not answer an earlier page of this listing: its records are not \
                           listed (start the listing again)"
                    .to_owned(),
            );
            missing.push(answered(&m, &why, None));
            continue;
        }
        match c.members.get(&key(&m)) {
            Some(Some(at)) => asked.push((m, Place::At(at.clone()))),
            Some(None) => {}
            None => asked.push((m, Place::From(c.after))),
        }
    }
    (asked, missing)
}

/// The page from the members' answers (each record with `served_by`), and the cursor of the
/// next one (`None` when no member has more).
fn page(
    mut next: GroupCursor,
    asked: &[(Asked, Place)],
    answers: &[Result<Value, String>],
    limit: usize,
) -> (Vec<Value>, Option<String>) {
    let mut pages = Vec::new();
    let mut from = Vec::new();
    for ((m, _), answer) in asked.iter().zip(answers) {
        match answer {
            Ok(v) => {
                pages.push((
                    key(m),
                    MemberPage {
                        records: v["records"].as_array().cloned().unwrap_or_default(),
                        next: v["next_cursor"].as_str().map(str::to_owned),
                    },
                ));
                from.push(m.http.clone());
            }
            Err(_) => {
                next.members.remove(&key(m));
                next.skipped.insert(key(m));
            }
        }
    }
    let (records, places) = merge(&pages, limit);
    for ((k, _), place) in pages.iter().zip(places) {
        next.members.insert(k.clone(), place);
    }
    if let Some((_, last)) = records.last() {
        next.after = next.after.max(last["due_ms"].as_u64().unwrap_or(0));
    }
    let records = records
        .into_iter()
        .map(|(m, mut r)| {
            if let (Value::Object(o), Some(http)) = (&mut r, &from[m]) {
                o.insert("served_by".into(), Value::String(http.clone()));
            }
            r
        })
        .collect();
    let more = next.members.values().any(Option::is_some);
    (records, more.then(|| next.encode()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn page(records: &[(u64, &str)], next: Option<&str>) -> MemberPage {
        MemberPage {
            records: records
                .iter()
                .map(|(due, id)| json!({"due_ms": due, "id": id}))
                .collect(),
            next: next.map(str::to_owned),
        }
    }

    #[test]
    fn pages_merge_in_due_order_and_each_member_goes_on_from_its_first_record_not_taken() {
        let pages = vec![
            (
                "a".to_owned(),
                page(&[(1, "a1"), (5, "a5"), (9, "a9")], Some("12-a12")),
            ),
            ("b".to_owned(), page(&[(2, "b2"), (5, "b5")], None)),
            ("c".to_owned(), page(&[], None)),
        ];
        let (records, next) = merge(&pages, 4);
        let ids: Vec<&str> = records
            .iter()
            .map(|(_, r)| r["id"].as_str().unwrap())
            .collect();
        // Equal due times keep the members' order.
        assert_eq!(ids, ["a1", "b2", "a5", "b5"]);
        assert_eq!(
            records.iter().map(|(m, _)| *m).collect::<Vec<_>>(),
            [0, 1, 0, 1]
        );
        assert_eq!(
            next,
            [Some("9-a9".to_owned()), None, None],
            "a goes on at its record not taken; b and c are done"
        );
        // Everything fits: each member's own cursor.
        let (records, next) = merge(&pages, 100);
        assert_eq!(records.len(), 5);
        assert_eq!(next, [Some("12-a12".to_owned()), None, None]);
    }

    #[test]
    fn paging_through_the_merge_lists_every_record_once_in_due_order() {
        // Three members, many records due at the same times: pages of 7 through a model of
        // each member's listing (its own cursor "due-index", inclusive).
        let held: Vec<Vec<u64>> = vec![
            (0..40).map(|i| 1_000 + i % 4).collect(),
            (0..25).map(|i| 1_000 + i % 3).collect(),
            vec![],
        ];
        let sorted: Vec<Vec<(u64, usize)>> = held
            .iter()
            .map(|h| {
                let mut v: Vec<(u64, usize)> = h.iter().copied().zip(0..).collect();
                v.sort_unstable();
                v
            })
            .collect();
        let list = |m: usize, from: Option<&str>, limit: usize| -> MemberPage {
            let start = from.map_or(0, |c| {
                let (due, i) = c.split_once('-').unwrap();
                let at = (due.parse::<u64>().unwrap(), i.parse::<usize>().unwrap());
                sorted[m]
                    .iter()
                    .position(|x| *x >= at)
                    .unwrap_or(sorted[m].len())
            });
            let rows = &sorted[m][start..];
            let shown: Vec<Value> = rows
                .iter()
                .take(limit)
                .map(|(due, i)| json!({"due_ms": due, "id": i.to_string()}))
                .collect();
            let next = rows.get(limit).map(|(due, i)| format!("{due}-{i}"));
            MemberPage {
                records: shown,
                next,
            }
        };
        let mut places: Vec<Option<Option<String>>> = vec![None; 3];
        let mut seen = Vec::new();
        for _ in 0..100 {
            let asked: Vec<usize> = (0..3).filter(|m| places[*m] != Some(None)).collect();
            if asked.is_empty() {
                break;
            }
            let pages: Vec<(String, MemberPage)> = asked
                .iter()
                .map(|m| {
                    let from = places[*m].clone().flatten();
                    (m.to_string(), list(*m, from.as_deref(), 7))
                })
                .collect();
            let (records, next) = merge(&pages, 7);
            for (k, r) in records {
                seen.push((
                    r["due_ms"].as_u64().unwrap(),
                    asked[k],
                    r["id"].as_str().unwrap().to_owned(),
                ));
            }
            for (k, n) in next.into_iter().enumerate() {
                places[asked[k]] = Some(n);
            }
        }
        assert_eq!(seen.len(), 65, "every record once");
        let mut distinct = seen.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 65);
        assert!(
            seen.windows(2).all(|w| w[0].0 <= w[1].0),
            "due order: {seen:?}"
        );
    }

    #[test]
    fn a_cursor_reads_back_what_it_wrote_and_refuses_anything_else() {
        let c = GroupCursor {
            after: 42,
            members: BTreeMap::from([
                (
                    "127.0.0.1:1".to_owned(),
                    Some("42-00000000000000ff".to_owned()),
                ),
                ("127.0.0.1:2".to_owned(), None),
            ]),
            skipped: BTreeSet::from(["127.0.0.1:3".to_owned()]),
        };
        assert_eq!(GroupCursor::decode(&c.encode()).unwrap(), c);
        for wrong in ["", "zz", "123", "7b7d7"] {
            assert!(GroupCursor::decode(wrong).is_err(), "{wrong}");
        }
    }

    #[test]
    fn a_member_query_encodes_what_a_url_cannot_carry() {
        let f = Filter {
            target: Some("orders &co=1".into()),
            key: Some("k/1?".into()),
            limit: Some(7),
            ..Filter::default()
        };
        assert_eq!(query(&f), "target=orders%20%26co%3D1&key=k%2F1%3F&limit=7");
    }
}
