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

pub mod answers;
mod bulk;
pub mod console;
mod forward;
mod group;
mod guard;
mod records;

use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::Value;
use tracing::info;

use bulk::{bulk_cancel, bulk_fire, bulk_reschedule};
use records::{cancel, fire, list, owners, reschedule, show};

use crate::changelog::owners::Owner;
use crate::changelog::GroupError;
use crate::metrics::Metrics;
use crate::scheduler::{Inserts, Wake};
use crate::store::Store;
use kafka_delay_core::clock::Clock;
use kafka_delay_core::id::RecordId;

/// Routes of the API, as (method, path) in the OpenAPI document's notation.
pub const ROUTES: [(&str, &str); 13] = [
    ("get", "/api/v1/owners"),
    ("get", "/api/v1/pending"),
    ("get", "/api/v1/pending/{id}"),
    ("delete", "/api/v1/pending/{id}"),
    ("post", "/api/v1/pending/{id}/reschedule"),
    ("post", "/api/v1/pending/{id}/fire"),
    ("post", "/api/v1/bulk/cancel"),
    ("post", "/api/v1/bulk/reschedule"),
    ("post", "/api/v1/bulk/fire"),
    ("get", "/api/v1/group/pending"),
    ("post", "/api/v1/group/bulk/cancel"),
    ("post", "/api/v1/group/bulk/reschedule"),
    ("post", "/api/v1/group/bulk/fire"),
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
    pub console: console::Console,
    /// The rest of the group, as the durability mode sees it.
    pub cluster: Arc<dyn Cluster>,
}

/// The rest of the group and what operators' changes owe it, as the durability mode sees it.
/// Built once at start (see `crate::durability`).
pub trait Cluster: Send + Sync + std::fmt::Debug {
    /// Where this instance's HTTP server is reached by the others (with several instances).
    fn this(&self) -> Option<&str>;
    /// Every member of the group with its HTTP address and partitions, as the group
    /// coordinator says (blocking); `None` where this instance holds every record of its
    /// group.
    fn owners(&self) -> Option<Result<Vec<Owner>, GroupError>>;
    /// Makes operators' changes safe beyond this instance (blocking; called after `store`
    /// made them): records `moved` (as they are now) and `cancelled`.
    ///
    /// # Errors
    /// What refused them; the change stands here.
    fn log_changes(
        &self,
        store: &Store,
        moved: &[RecordId],
        cancelled: &[RecordId],
    ) -> Result<(), GroupError>;
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
        (self.0, Json(answers::Problem { error: self.1 })).into_response()
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
        .route("/api/v1/owners", get(owners))
        .route("/api/v1/pending", get(list))
        .route("/api/v1/pending/{id}", get(show).delete(cancel))
        .route("/api/v1/pending/{id}/reschedule", post(reschedule))
        .route("/api/v1/pending/{id}/fire", post(fire))
        .route("/api/v1/bulk/cancel", post(bulk_cancel))
        .route("/api/v1/bulk/reschedule", post(bulk_reschedule))
        .route("/api/v1/bulk/fire", post(bulk_fire))
        .route("/api/v1/group/pending", get(group::pending))
        .route("/api/v1/group/bulk/{action}", post(group::bulk))
        .with_state(admin.clone())
        .merge(console::router(admin))
}

impl Admin {
    /// Lets a request through if it comes from this server's own pages or from outside a
    /// browser, and carries the token when one is set (see [`same_origin`]).
    pub(crate) fn authorize(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        guard::same_origin(headers, self.token.is_none())?;
        match &self.token {
            Some(token) => {
                let given = headers
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("Bearer "))
                    .unwrap_or_default();
                if guard::constant_time_eq(given.as_bytes(), token.as_bytes()) {
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
            .operating
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

    /// Makes changes the store made safe beyond this instance: records moved, as they are
    /// now, and records cancelled.
    fn log_changes(&self, moved: &[RecordId], cancelled: &[RecordId]) -> Result<(), ApiError> {
        self.cluster
            .log_changes(&self.store, moved, cancelled)
            .map_err(|e| {
                ApiError(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("changed here, but not confirmed by the changelog ({e}); try again"),
                )
            })
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

#[cfg(test)]
mod schema_tests;
#[cfg(test)]
mod tests;
