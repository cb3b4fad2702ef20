//! The partitions in motion on this instance, which the three roles of a changelog mode
//! coordinate through: the rebalance callback ([`super::handoff::Handoff`]) registers what is
//! assigned and cancels what is revoked, the restore task ([`super::takeover::Takeover`])
//! restores what is registered, and the standby pass ([`super::standby::Standbys`]) catches up
//! the copies of partitions owned elsewhere and never touches one being restored.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tracing::{info, warn};

use super::Changelog;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::store::Store;
use kafka_delay_core::id::Pid;

/// The flag that stops the restore or catch-up of each partition.
pub(super) type Cancels = HashMap<Pid, Arc<AtomicBool>>;

/// What the roles share: the store, the changelog, and which partitions are being restored or
/// caught up here.
#[derive(Debug)]
pub struct Moving {
    pub(super) store: Arc<Store>,
    pub(super) changelog: Changelog,
    pub(super) config: Arc<Config>,
    pub(super) metrics: Metrics,
    /// Assigned partitions being restored. Locked before `catching_up`.
    restoring: Mutex<Cancels>,
    /// The copies a standby pass is catching up (an assignment stops them).
    catching_up: Mutex<Cancels>,
    /// Held by every restore and standby pass: one at a time writes a partition's state.
    one_writer: Mutex<()>,
}

impl Moving {
    /// Nothing in motion yet; from now on the store fires only the partitions it owns.
    pub fn new(
        store: Arc<Store>,
        changelog: Changelog,
        config: Arc<Config>,
        metrics: Metrics,
    ) -> Arc<Self> {
        store.track_ownership();
        Arc::new(Self {
            store,
            changelog,
            config,
            metrics,
            restoring: Mutex::default(),
            catching_up: Mutex::default(),
            one_writer: Mutex::default(),
        })
    }

    pub(super) fn restoring(&self) -> MutexGuard<'_, Cancels> {
        lock(&self.restoring)
    }

    pub(super) fn catching_up(&self) -> MutexGuard<'_, Cancels> {
        lock(&self.catching_up)
    }

    /// The turn to write partitions' state (a restore or a standby pass; blocking).
    pub(super) fn writer_turn(&self) -> MutexGuard<'_, ()> {
        lock(&self.one_writer)
    }

    /// Stops the catch-up of every copy (at its next chunk), so that the restore of what was
    /// just assigned need not wait for the standby pass.
    pub(super) fn stop_catching_up(&self) {
        let _restoring = self.restoring();
        for flag in self.catching_up().values() {
            flag.store(true, Ordering::Relaxed);
        }
    }

    pub(super) fn count_restoring(&self) {
        let n = self.restoring().len();
        self.metrics.broker.partitions_restoring.set(n as i64);
    }

    /// Drops the local state of those of `pids` neither owned nor being restored here, and
    /// says how many records went. Blocking.
    pub(super) fn drop_owned_elsewhere(&self, pids: impl IntoIterator<Item = Pid>) -> u64 {
        let mut dropped = 0;
        for pid in pids {
            if self.store.owns(pid) || self.restoring().contains_key(&pid) {
                continue;
            }
            match self.store.drop_partition(pid) {
                Ok(n) => dropped += n,
                Err(e) => {
                    warn!(error = %e, "cannot drop the local state of a partition owned elsewhere")
                }
            }
        }
        if dropped > 0 {
            info!(
                records = dropped,
                "local state of partitions owned elsewhere dropped"
            );
        }
        dropped
    }
}

/// `m` locked, even if a thread panicked holding it.
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `f`, which blocks, letting the runtime move its other tasks off this worker first.
pub(super) fn blocking<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}
