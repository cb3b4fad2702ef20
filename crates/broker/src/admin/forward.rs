//! Requests for a record another instance owns, sent on to it.
//!
//! A record id (16 hex digits) names a record in one instance's store. With a changelog each
//! record also has a `ref`, `<topic>:<partition>:<offset>` of its source record, which every
//! instance understands: the instance asked answers for a partition it owns, and otherwise
//! looks the partition's owner up in the group's description and sends the request on to the
//! owner's advertised HTTP address, with the caller's token. The answer says which instance
//! gave it (`served_by`).

use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::Json;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde_json::Value;

use super::{internal, Admin, ApiError, ApiResult};
use kafka_delay_core::id::RecordId;

/// Set on a request one instance sends on to another: the receiver answers it or says why
/// not, and never sends it on again.
pub(super) const FORWARDED_BY: &str = "x-kafka-delay-forwarded-by";

/// How long the owner may take to answer.
const TIMEOUT: Duration = Duration::from_secs(30);

/// A record by its source: `<topic>:<partition>:<offset>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Ref {
    pub(super) topic: String,
    pub(super) partition: i32,
    pub(super) offset: i64,
}

impl Ref {
    /// Reads `topic:partition:offset` (a topic name has no colon).
    pub(super) fn parse(text: &str) -> Option<Ref> {
        let mut it = text.rsplitn(3, ':');
        let offset = it.next()?.parse().ok().filter(|o| *o >= 0)?;
        let partition = it.next()?.parse().ok().filter(|p| *p >= 0)?;
        let topic = it.next().filter(|t| !t.is_empty() && !t.contains(':'))?;
        Some(Ref {
            topic: topic.to_owned(),
            partition,
            offset,
        })
    }
}

/// Where a record named by the API is: here (its id in this store) or with its owner.
#[derive(Debug)]
pub(super) enum Located {
    Here(RecordId),
    Elsewhere(Ref),
}

/// Reads a record id (16 hex digits) or ref (`topic:partition:offset`).
pub(super) fn locate(a: &Admin, text: &str) -> Result<Located, ApiError> {
    if let Some(r) = Ref::parse(text) {
        let here = a
            .store
            .lookup_partition(&r.topic, r.partition)
            .filter(|pid| a.store.owns(*pid))
            .and_then(|pid| RecordId::new(pid, r.offset));
        return Ok(match here {
            Some(rid) => Located::Here(rid),
            None => Located::Elsewhere(r),
        });
    }
    u64::from_str_radix(text, 16)
        .ok()
        .filter(|_| text.len() == 16)
        .map(|id| Located::Here(RecordId(id)))
        .ok_or_else(|| {
            super::bad(format!(
                "'{text}' is not a record id (16 hex digits) or ref (topic:partition:offset)"
            ))
        })
}

/// Sends the request for `r` on to the instance that owns its partition and answers with
/// what that instance said.
pub(super) async fn forward(
    a: &Admin,
    r: &Ref,
    method: Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: Option<Value>,
) -> ApiResult {
    let not_pending = || {
        ApiError(
            StatusCode::NOT_FOUND,
            format!("no pending record {}:{}:{}", r.topic, r.partition, r.offset),
        )
    };
    let cluster = a.cluster.clone();
    if cluster.this().is_none() {
        return Err(not_pending());
    }
    if headers.contains_key(FORWARDED_BY) {
        return Err(ApiError(
            StatusCode::MISDIRECTED_REQUEST,
            format!(
                "{}/{} is not owned here either: it is moving between instances; try again",
                r.topic, r.partition
            ),
        ));
    }
    let owners = tokio::task::spawn_blocking(move || cluster.owners())
        .await
        .map_err(internal)?
        .ok_or_else(not_pending)?
        .map_err(|e| ApiError(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?;
    let part = (r.topic.clone(), r.partition);
    let Some(owner) = owners.iter().find(|o| o.partitions.contains(&part)) else {
        return Err(ApiError(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "no instance owns {}/{} now (the group is rebalancing, or no such partition is \
                 consumed); try again in a few seconds",
                r.topic, r.partition
            ),
        ));
    };
    let this = a.cluster.this();
    let Some(http) = owner.http.as_deref().filter(|h| Some(*h) != this) else {
        return Err(ApiError(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "{}/{} is being restored on this instance; try again in a few seconds",
                r.topic, r.partition
            ),
        ));
    };
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let sent = tokio::time::timeout(
        TIMEOUT,
        send(http, method, path, headers, this.unwrap_or("?"), body),
    )
    .await
    .unwrap_or_else(|_| Err(format!("no answer within {}s", TIMEOUT.as_secs())));
    let (status, answer) = sent.map_err(|e| {
        ApiError(
            StatusCode::BAD_GATEWAY,
            format!(
                "the owner of {}/{}, {http}, did not answer: {e}",
                r.topic, r.partition
            ),
        )
    })?;
    if status.is_success() {
        let mut v = answer;
        if let Value::Object(m) = &mut v {
            m.insert("served_by".into(), Value::String(http.to_owned()));
        }
        Ok(Json(v))
    } else {
        let said = answer["error"].as_str().unwrap_or("no reason given");
        Err(ApiError(status, format!("{said} (answered by {http})")))
    }
}

/// One HTTP/1.1 request to `addr`, with the caller's authorization; its status and JSON body.
pub(in crate::admin) async fn send(
    addr: &str,
    method: Method,
    path: &str,
    headers: &HeaderMap,
    by: &str,
    body: Option<Value>,
) -> Result<(StatusCode, Value), String> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let bytes = body.map(|b| b.to_string()).unwrap_or_default();
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr)
        .header("content-type", "application/json")
        .header(
            FORWARDED_BY,
            HeaderValue::from_str(by).map_err(|e| e.to_string())?,
        );
    if let Some(auth) = headers.get("authorization") {
        req = req.header("authorization", auth);
    }
    let req = req
        .body(Full::new(Bytes::from(bytes)))
        .map_err(|e| e.to_string())?;
    let res = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let status = res.status();
    let body = res
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    let v = serde_json::from_slice(&body).unwrap_or(Value::Null);
    Ok((status, v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ref_is_a_topic_a_partition_and_an_offset() {
        assert_eq!(
            Ref::parse("delay.orders:3:12345"),
            Some(Ref {
                topic: "delay.orders".into(),
                partition: 3,
                offset: 12345
            })
        );
        for bad in [
            "0000000000000001",
            "delay.orders:3",
            ":3:1",
            "a:b:3:1",
            "delay.orders:-1:5",
            "delay.orders:3:-5",
            "delay.orders:x:5",
        ] {
            assert_eq!(Ref::parse(bad), None, "{bad}");
        }
    }
}
