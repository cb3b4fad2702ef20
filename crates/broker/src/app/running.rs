//! A started broker: what it runs, and how it stops (the reverse order of the start).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::durability::Durability;
use crate::http::Health;
use crate::metrics::Metrics;
use crate::store::Store;

/// A started broker.
#[derive(Debug)]
pub struct Running {
    pub(super) stop_ingest: watch::Sender<bool>,
    pub(super) stop_rest: watch::Sender<bool>,
    pub(super) ingest: JoinHandle<()>,
    pub(super) scheduler: std::thread::JoinHandle<()>,
    pub(super) publisher: JoinHandle<()>,
    pub(super) http: JoinHandle<()>,
    pub(super) http_addr: SocketAddr,
    pub(super) store: Arc<Store>,
    pub(super) metrics: Metrics,
    pub(super) health: Health,
    pub(super) durability: Durability,
}

impl Running {
    /// The bound HTTP address.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The store.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// Stops consuming (committing offsets), stops the scheduler, finishes the deliveries in
    /// flight, flushes the producer and closes RocksDB cleanly.
    pub async fn shutdown(self) {
        info!("shutting down: stopping ingest");
        self.health.ready.store(false, Ordering::Relaxed);
        self.durability.stopping();
        let _ = self.stop_ingest.send(true);
        let _ = self.ingest.await;
        info!("ingest stopped; finishing deliveries in flight");
        let _ = self.stop_rest.send(true);
        let scheduler = self.scheduler;
        let _ = tokio::task::spawn_blocking(move || scheduler.join()).await;
        let _ = self.publisher.await;
        self.durability
            .close(std::time::Duration::from_secs(10))
            .await;
        let _ = self.http.await;
        let store = self.store;
        let flushed = tokio::task::spawn_blocking(move || {
            let r = store.flush();
            drop(store);
            r
        })
        .await;
        match flushed {
            Ok(Ok(())) => info!("RocksDB closed; stopped"),
            other => {
                warn!(result = ?other.map(|r| r.map_err(|e| e.to_string())), "RocksDB flush at shutdown failed")
            }
        }
    }
}
