//! The scheduler task: the only owner of the timing wheel.
//!
//! It waits on three things at once: new pending records (from ingest, from the admin API and
//! retries from publish), the wheel's next deadline, and shutdown. Due records go to the
//! publisher in batches through a bounded channel; when that channel is full the due entries
//! simply stay in the wheel and inserts keep being accepted, so firing never blocks ingest.
//!
//! Bounded memory: the wheel holds only records due before `loaded_until`, which is kept about
//! one horizon ahead of the clock. Records due later stay only in RocksDB's due index and are
//! loaded in order, a chunk per turn of the loop between firings, when the clock comes within
//! three quarters of a horizon of `loaded_until`. Memory then follows the arrival rate times the
//! horizon, not the number pending. `loaded_until` moves to the end of a range *before* the
//! range is read, so a record written while it is being read is either seen by the read (it was
//! written first) or arrives as an insert below `loaded_until` and is held: never neither (a
//! record seen both ways fires once; the publisher skips the second entry).
//!
//! Never early: an entry leaves only when the wall clock reads at least its due time. If the
//! clock went backwards after the wheel advanced, entries the wheel already found due are held
//! in a small heap until the clock catches up again. A clock that jumps forwards makes
//! everything that became due fire at once, bounded by the publisher's in-flight window.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tracing::warn;

use crate::metrics::Metrics;
use crate::store::{due_key_after, Store, StoreError};
use kafka_delay_core::clock::Clock;
use kafka_delay_core::id::RecordId;
use kafka_delay_core::wheel::{Elapsed, Wheel};

/// Most records handed to the publisher in one batch.
const MAX_BATCH: usize = 512;
/// Longest sleep, so that a wall clock jumping forwards is noticed within this time.
const MAX_SLEEP_MS: u64 = 250;
/// Due-index entries read per turn of the loop while loading (about a millisecond of reading).
const LOAD_CHUNK: usize = 4_096;
/// Wait before reading the due index again after a read error.
const LOAD_RETRY_MS: u64 = 1_000;

/// A record whose time has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Due {
    /// The record.
    pub id: RecordId,
    /// The time it was scheduled for in the wheel (its due time, or a retry time).
    pub at_ms: u64,
}

/// What the scheduler is sent: `(due_ms, id)` entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wake {
    /// Records whose `(due, id)` is in RocksDB's due index (new, moved or recovered): those due
    /// at or after the horizon are left there for the loader.
    Indexed(Vec<(u64, RecordId)>),
    /// Timers that exist only in memory (delivery retries): always held.
    Retry(Vec<(u64, RecordId)>),
}

/// Sends new pending records to the scheduler.
pub type Inserts = mpsc::Sender<Wake>;

/// Where the scheduler reads pending records from as its horizon advances: RocksDB's due index
/// in the broker, a model in tests.
pub trait DueIndex: Send + Sync + std::fmt::Debug + 'static {
    /// Entries with `from <= (due, id)` and `due < until`, in `(due, id)` order, at most `limit`.
    ///
    /// # Errors
    /// A read failure; the scheduler tries the same range again a second later.
    fn due_range(
        &self,
        from: (u64, RecordId),
        until: u64,
        limit: usize,
    ) -> Result<Vec<(u64, RecordId)>, StoreError>;
}

impl DueIndex for Store {
    fn due_range(
        &self,
        from: (u64, RecordId),
        until: u64,
        limit: usize,
    ) -> Result<Vec<(u64, RecordId)>, StoreError> {
        Store::due_range(self, from, until, limit)
    }
}

/// A range of the due index being read into the wheel.
#[derive(Debug, Clone, Copy)]
struct Loading {
    /// The next entry to read.
    next: (u64, RecordId),
    /// End of the range (exclusive), already published as `loaded_until`.
    until: u64,
    /// Do not read before this time (after a read error).
    not_before: u64,
}

/// The scheduler task's state.
#[derive(Debug)]
pub struct Scheduler {
    wheel: Wheel<u64>,
    /// Already due when inserted, in arrival order.
    ready: VecDeque<(u64, RecordId)>,
    /// Found due by the wheel but after the current (backwards-jumped) clock.
    held: BinaryHeap<Reverse<(u64, RecordId)>>,
    clock: Arc<dyn Clock>,
    metrics: Metrics,
    index: Arc<dyn DueIndex>,
    /// How far ahead of the clock the wheel holds records.
    horizon_ms: u64,
    /// Every pending record due before this time is in the wheel (or being read into it).
    loaded_until: u64,
    loading: Option<Loading>,
    /// Turns true when the first load (recovery up to the horizon) is complete.
    armed: watch::Sender<bool>,
}

impl Scheduler {
    /// A scheduler whose wheel starts at the clock's current time, holding records due within
    /// `horizon_ms` of the clock and reading the rest from `index` as time goes on. Its first
    /// turn starts loading everything due before `now + horizon` (recovery).
    pub fn new(
        clock: Arc<dyn Clock>,
        metrics: Metrics,
        index: Arc<dyn DueIndex>,
        horizon_ms: u64,
    ) -> Self {
        Self {
            wheel: Wheel::new(clock.now_ms()),
            ready: VecDeque::new(),
            held: BinaryHeap::new(),
            clock,
            metrics,
            index,
            horizon_ms: horizon_ms.max(4),
            loaded_until: 0,
            loading: None,
            armed: watch::channel(false).0,
        }
    }

    /// Turns true once everything due within the horizon at start has been read into the wheel.
    pub fn armed(&self) -> watch::Receiver<bool> {
        self.armed.subscribe()
    }

    /// Entries the scheduler is told about: indexed ones beyond `loaded_until` are left to the
    /// loader (they are in RocksDB), everything else is held.
    fn wake(&mut self, wake: Wake) {
        match wake {
            Wake::Indexed(entries) => {
                let until = self.loaded_until;
                self.hold(entries.into_iter().filter(|&(due, _)| due < until));
            }
            Wake::Retry(entries) => self.hold(entries.into_iter()),
        }
    }

    fn hold(&mut self, entries: impl Iterator<Item = (u64, RecordId)>) {
        let now = self.clock.now_ms();
        for (due, id) in entries {
            match self.wheel.insert(due, id.0) {
                Ok(_) => {}
                Err(Elapsed { due, .. }) if due <= now => self.ready.push_back((due, id)),
                Err(Elapsed { due, .. }) => self.held.push(Reverse((due, id))),
            }
        }
    }

    /// Whether the clock has come within three quarters of a horizon of `loaded_until` (and no
    /// range is being read).
    fn load_needed(&self, now: u64) -> bool {
        self.loading.is_none()
            && self.loaded_until.saturating_add(self.horizon_ms / 4)
                <= now.saturating_add(self.horizon_ms)
    }

    /// Starts reading `[loaded_until, now + horizon)`, publishing the new `loaded_until` first.
    fn start_load(&mut self, now: u64) {
        let target = now.saturating_add(self.horizon_ms);
        self.loading = Some(Loading {
            next: (self.loaded_until, RecordId(0)),
            until: target,
            not_before: 0,
        });
        self.loaded_until = target;
        self.metrics
            .wheel
            .loaded_until
            .set((target / 1_000).min(i64::MAX as u64) as i64);
    }

    /// Reads one chunk of the range being loaded into the wheel.
    fn load_chunk(&mut self, now: u64) {
        let Some(mut l) = self.loading else { return };
        if now < l.not_before {
            return;
        }
        match self.index.due_range(l.next, l.until, LOAD_CHUNK) {
            Ok(entries) => {
                let done = entries.len() < LOAD_CHUNK;
                if let Some(&(due, id)) = entries.last() {
                    l.next = due_key_after(due, id);
                }
                self.metrics.wheel.loaded.inc_by(entries.len() as u64);
                self.hold(entries.into_iter());
                if done {
                    self.loading = None;
                    self.armed.send_replace(true);
                } else {
                    self.loading = Some(l);
                }
            }
            Err(e) => {
                warn!(error = %e, from = l.next.0, until = l.until,
                      "cannot read pending records from RocksDB; trying again");
                l.not_before = now + LOAD_RETRY_MS;
                self.loading = Some(l);
            }
        }
    }

    /// Whether a load is waiting to read its next chunk now.
    fn loading_now(&self, now: u64) -> bool {
        self.loading.is_some_and(|l| now >= l.not_before)
    }

    /// Moves due entries into `batch`, at most up to [`MAX_BATCH`]: held entries the clock has
    /// reached, then records that were already due on insert, then the wheel.
    fn collect(&mut self, now: u64, batch: &mut Vec<Due>) {
        while batch.len() < MAX_BATCH {
            let (due, id) = match self.held.peek() {
                Some(&Reverse((due, id))) if due <= now => {
                    self.held.pop();
                    (due, id)
                }
                _ => match self.ready.pop_front() {
                    Some(entry) => entry,
                    None => match self.wheel.poll(now) {
                        Some((due, raw)) => (due, RecordId(raw)),
                        None => break,
                    },
                },
            };
            if due > now {
                // The clock went backwards after this entry was found due: wait for it.
                self.held.push(Reverse((due, id)));
                continue;
            }
            self.metrics
                .fire
                .lateness
                .observe(now.saturating_sub(due) as f64 / 1000.0);
            batch.push(Due { id, at_ms: due });
        }
    }

    fn next_wake(&self) -> Option<u64> {
        let held = self.held.peek().map(|r| r.0 .0);
        let ready = self.ready.front().map(|e| e.0);
        [self.wheel.next_deadline(), held, ready]
            .into_iter()
            .flatten()
            .min()
    }

    /// Number of entries waiting to fire.
    pub fn len(&self) -> usize {
        self.wheel.len() + self.ready.len() + self.held.len()
    }

    /// Whether nothing waits to fire.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs until `shutdown` turns true or a channel closes.
    pub async fn run(
        mut self,
        mut inserts: mpsc::Receiver<Wake>,
        out: mpsc::Sender<Vec<Due>>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut batch: Vec<Due> = Vec::new();
        loop {
            let now = self.clock.now_ms();
            if self.load_needed(now) {
                // Inserts sent before the range is read are taken under the old bound (the
                // read finds the ones beyond it), so that a record is not held twice.
                while let Ok(wake) = inserts.try_recv() {
                    self.wake(wake);
                }
                self.start_load(now);
            }
            if batch.len() < MAX_BATCH {
                self.collect(now, &mut batch);
            }
            self.metrics.wheel.entries.set(self.len() as i64);
            if !batch.is_empty() {
                match out.try_send(std::mem::take(&mut batch)) {
                    Ok(()) => continue,
                    Err(mpsc::error::TrySendError::Full(b)) => batch = b,
                    Err(mpsc::error::TrySendError::Closed(_)) => return,
                }
            }
            // One chunk of loading per turn, after firing what is due.
            self.load_chunk(now);
            let sleep = if self.loading_now(now) {
                Duration::ZERO
            } else {
                wait_for(self.next_wake(), self.clock.now_us())
            };
            tokio::select! {
                biased;
                _ = shutdown.changed() => return,
                msg = inserts.recv() => match msg {
                    Some(wake) => self.wake(wake),
                    None => return,
                },
                permit = out.reserve(), if !batch.is_empty() => match permit {
                    Ok(permit) => permit.send(std::mem::take(&mut batch)),
                    Err(_) => return,
                },
                _ = tokio::time::sleep(sleep), if batch.is_empty() => {}
            }
        }
    }
}

/// How long to sleep for the wall clock to reach `next_ms` (at most [`MAX_SLEEP_MS`]), from
/// `now_us`: to the due millisecond's start, not a whole number of milliseconds from somewhere
/// inside the current one, which would add up to a millisecond to every firing.
fn wait_for(next_ms: Option<u64>, now_us: u64) -> Duration {
    let max = MAX_SLEEP_MS * 1_000;
    let us = next_ms.map_or(max, |next| {
        next.saturating_mul(1_000)
            .saturating_sub(now_us)
            .clamp(1, max)
    });
    Duration::from_micros(us)
}

#[cfg(test)]
mod tests;
