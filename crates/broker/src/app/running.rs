//! A started broker: what it runs, and how it stops (the reverse order of the start).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::durability::Durability;
use crate::http::Health;
use crate::ingest::Broken;
use crate::metrics::Metrics;
use crate::store::Store;

/// A started broker.
#[derive(Debug)]
pub struct Running {
    pub(super) stop_ingest: watch::Sender<bool>,
    pub(super) stop_rest: watch::Sender<bool>,
    pub(super) ingest: JoinHandle<()>,
    pub(super) broken: watch::Receiver<Option<Broken>>,
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

    /// Returns once the Kafka consumer has failed for good (never, while it works): ingest
    /// has ended, and only a [`Running::shutdown`] and a new start bring the instance back.
    pub async fn broken(&self) -> Broken {
        let mut rx = self.broken.clone();
        let broken = rx.wait_for(Option::is_some).await.map(|b| b.clone());
        match broken {
            Ok(Some(b)) => b,
            // The sender lives in the ingest task until it ends.
            _ => std::future::pending().await,
        }
    }

    /// Stops consuming (committing offsets), stops the scheduler, finishes the deliveries in
    /// flight, flushes the producer and closes RocksDB cleanly. Returns whether RocksDB was
    /// closed: false when a part still held it after 30 s (an HTTP request
    /// that does not end, say), in which case only the process's exit closes it.
    pub async fn shutdown(self) -> bool {
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
        let released = std::time::Instant::now() + STORE_RELEASE_WAIT;
        while Arc::strong_count(&store) > 1 && std::time::Instant::now() < released {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let closed = Arc::strong_count(&store) == 1;
        let flushed = tokio::task::spawn_blocking(move || {
            let r = store.flush();
            drop(store);
            r
        })
        .await;
        match flushed {
            Ok(Ok(())) if closed => info!("RocksDB closed; stopped"),
            Ok(Ok(())) => warn!("RocksDB flushed but still held by a part of the instance"),
            other => {
                warn!(result = ?other.map(|r| r.map_err(|e| e.to_string())), "RocksDB flush at shutdown failed")
            }
        }
        closed
    }
}

/// How long a shutdown waits for the parts that hold RocksDB (tasks that end on the stop
/// signal) to let it go.
const STORE_RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);
