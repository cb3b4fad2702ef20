//! How far a restore is: each partition's progress, and what the restore shows (the entries
//! left, on a gauge) and logs while it reads.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use prometheus::IntGauge;
use tracing::{debug, info, warn};

use super::restore::Part;
use kafka_delay_core::changelog::Restored;

/// How often a long restore logs its progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);
/// How often the entries left are shown.
const SHOWN_EVERY: Duration = Duration::from_secs(1);
/// Messages polled between two looks at the clock: a restore reads up to a million entries a
/// second, where a look per entry shows in its CPU. A poll that finds nothing looks at once.
const CLOCK_EVERY: u32 = 1_024;
/// A transaction open this long in a changelog outlived every kafka-delay transaction (10 s,
/// aborted by the coordinator within another 10 s): the restore waiting on it says so, naming
/// what an operator can look at.
const OPEN_TOO_LONG: Duration = Duration::from_secs(60);

/// One partition being restored.
pub(super) struct Progress {
    pub(super) part: Part,
    /// Its place among the partitions read together.
    pub(super) index: usize,
    /// Next changelog offset to apply; the restore is done when it reaches `end`.
    pub(super) next: i64,
    pub(super) end: i64,
    pub(super) source_next: Option<i64>,
    pub(super) buffer: Vec<Restored>,
    pub(super) entries: u64,
    pub(super) delta: i64,
    pub(super) from_checkpoint: bool,
    /// See [`crate::store::Store::restore`]: `Some` when the restore began on an empty
    /// partition (the writer keeps it up to date).
    pub(super) absent_above: Option<i64>,
    /// The last stable offset the read stopped at, short of `end`, and since when.
    pub(super) held_at: Option<(i64, Instant)>,
}

impl Progress {
    /// Whether the partition is read to its end, or revoked.
    pub(super) fn done(&self) -> bool {
        self.next >= self.end || self.part.cancelled.load(Ordering::Relaxed)
    }

    /// The read reached the last stable offset `stable`, short of the end: a transaction is
    /// open in the changelog there.
    pub(super) fn held(&mut self, stable: i64) {
        if self.held_at.is_none_or(|(at, _)| at != stable) {
            self.held_at = Some((stable, Instant::now()));
        }
        debug!(topic = %self.part.topic, partition = self.part.partition, stable, end = self.end,
               "restore waits for a transaction still open in the changelog");
    }

    /// Says how far the restore is, or, when it has waited on a transaction open in the
    /// changelog for longer than any kafka-delay transaction lasts, that it does.
    fn log(&self, started: Instant) {
        match self.held_at {
            Some((stable, since)) if since.elapsed() >= OPEN_TOO_LONG => {
                warn!(topic = %self.part.topic, partition = self.part.partition,
                      stable_offset = stable, end = self.end,
                      open_seconds = since.elapsed().as_secs(),
                      "the restore waits on a transaction open in the changelog for longer \
                       than any kafka-delay transaction lasts: a transaction the broker never \
                       ended (`kafka-transactions describe-producers --topic TOPIC \
                       --partition PARTITION` names its producer; docs/decisions.md, \
                       \"Testing against Kafka\")");
            }
            _ => {
                info!(topic = %self.part.topic, partition = self.part.partition,
                      entries = self.entries, at = self.next, end = self.end,
                      seconds = started.elapsed().as_secs(),
                      "restoring from the changelog");
            }
        }
    }
}

/// Shows the entries left on a gauge every second and logs each partition's progress every
/// 5 s, looking at the clock once every [`CLOCK_EVERY`] messages.
pub(super) struct Report<'g> {
    remaining: Option<&'g IntGauge>,
    started: Instant,
    shown: Instant,
    logged: Instant,
    unclocked: u32,
}

impl<'g> Report<'g> {
    pub(super) fn new(remaining: Option<&'g IntGauge>) -> Self {
        let now = Instant::now();
        Self {
            remaining,
            started: now,
            shown: now,
            logged: now,
            unclocked: 0,
        }
    }

    /// After each poll (`idle`: it found nothing).
    pub(super) fn after(&mut self, idle: bool, progress: &[Progress]) {
        self.unclocked = if idle {
            CLOCK_EVERY
        } else {
            self.unclocked + 1
        };
        if self.unclocked < CLOCK_EVERY {
            return;
        }
        self.unclocked = 0;
        let now = Instant::now();
        if let Some(g) = self.remaining.filter(|_| now - self.shown >= SHOWN_EVERY) {
            self.shown = now;
            g.set(
                progress
                    .iter()
                    .filter(|p| !p.done())
                    .map(|p| p.end - p.next)
                    .sum(),
            );
        }
        if now - self.logged >= PROGRESS_EVERY {
            self.logged = now;
            for p in progress.iter().filter(|p| !p.done()) {
                p.log(self.started);
            }
        }
    }
}
