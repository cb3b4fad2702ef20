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

/// Binds `addr`: the listener and the bound address (useful with port 0), known before the
/// rest of the broker is built (the other instances are told it).
///
/// # Errors
/// The bind error, when the address is taken or not allowed.
pub async fn bind(addr: SocketAddr) -> std::io::Result<(tokio::net::TcpListener, SocketAddr)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    Ok((listener, bound))
}

/// Where the other instances reach this one's HTTP server: the configured address
/// (`--advertised-http-addr`), else the address it listens on (this host's name for every
/// interface).
pub fn advertised(configured: Option<&str>, bound: SocketAddr) -> String {
    configured.map(str::to_owned).unwrap_or_else(|| {
        if bound.ip().is_unspecified() {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_owned())
                .unwrap_or_else(|_| "localhost".into());
            format!("{host}:{}", bound.port())
        } else {
            bound.to_string()
        }
    })
}

/// Serves on `listener` until `shutdown` turns true; returns the server task.
pub fn serve(
    listener: tokio::net::TcpListener,
    health: Health,
    registry: Registry,
    on_scrape: OnScrape,
    api: Router,
    mut shutdown: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
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
    tokio::spawn(async move {
        let stop = async move {
            let _ = shutdown.wait_for(|s| *s).await;
        };
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(stop)
            .await
        {
            tracing::error!(error = %e, "HTTP server failed");
        }
    })
}
