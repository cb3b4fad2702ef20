//! HTTP: `/healthz` (the process runs), `/readyz` (recovery done, consuming, RocksDB writable),
//! `/metrics` (Prometheus text format), and the admin API under `/api/` ([`crate::admin`]).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use prometheus::Registry;
use tokio::sync::watch;

/// What the probes report.
#[derive(Debug, Clone, Default)]
pub struct Health {
    /// Recovery finished and the consumer runs.
    pub ready: Arc<AtomicBool>,
    /// RocksDB accepts writes.
    pub store_healthy: Arc<AtomicBool>,
}

/// Called before each scrape, to set gauges that are read rather than counted.
pub type OnScrape = Arc<dyn Fn() + Send + Sync>;

#[derive(Clone)]
struct AppState {
    health: Health,
    registry: Registry,
    on_scrape: OnScrape,
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(s): State<AppState>) -> impl IntoResponse {
    if !s.health.ready.load(Ordering::Relaxed) {
        (StatusCode::SERVICE_UNAVAILABLE, "recovering\n")
    } else if !s.health.store_healthy.load(Ordering::Relaxed) {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "store not writable: RocksDB refused a write (disk full?); free space and restart\n",
        )
    } else {
        (StatusCode::OK, "ready\n")
    }
}

async fn metrics(State(s): State<AppState>) -> impl IntoResponse {
    (s.on_scrape)();
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        crate::metrics::render(&s.registry),
    )
}

/// Binds `addr` and serves until `shutdown` turns true. Returns the bound address (useful with
/// port 0) and the server task.
///
/// # Errors
/// The bind error, when the address is taken or not allowed.
pub async fn serve(
    addr: SocketAddr,
    health: Health,
    registry: Registry,
    on_scrape: OnScrape,
    api: Router,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(AppState {
            health,
            registry,
            on_scrape,
        })
        .merge(api);
    let task = tokio::spawn(async move {
        let stop = async move {
            let _ = shutdown.wait_for(|s| *s).await;
        };
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(stop)
            .await
        {
            tracing::error!(error = %e, "HTTP server failed");
        }
    });
    Ok((bound, task))
}
