//! Counts of pending records by target topic and by due minute, kept in memory next to the
//! store and updated with every write, so metrics never scan RocksDB. Pure.

use std::collections::{BTreeMap, HashMap};

/// Due-time buckets of the `pending by due` metric, by how far ahead of now.
pub const BUCKETS: [&str; 5] = ["overdue", "1m", "1h", "1d", "later"];

/// Pending counts.
#[derive(Debug, Default, Clone)]
pub struct PendingStats {
    by_target: HashMap<String, u64>,
    by_minute: BTreeMap<u64, u64>,
}

/// A copy of the counts at one moment.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// Pending records per target topic.
    pub by_target: Vec<(String, u64)>,
    /// Pending records per bucket of [`BUCKETS`]: due before now, within a minute, an hour,
    /// a day, later. Minute resolution: a record at most a minute from a boundary may be
    /// counted on either side of it.
    pub by_due: [u64; 5],
}

impl PendingStats {
    /// Counts a new pending record.
    pub fn add(&mut self, target: &str, due_ms: u64) {
        *self.by_target.entry(target.to_owned()).or_default() += 1;
        *self.by_minute.entry(due_ms / 60_000).or_default() += 1;
    }

    /// Uncounts a record that fired, was cancelled or replaced.
    pub fn remove(&mut self, target: &str, due_ms: u64) {
        if let Some(n) = self.by_target.get_mut(target) {
            *n -= 1;
            if *n == 0 {
                self.by_target.remove(target);
            }
        }
        let minute = due_ms / 60_000;
        if let Some(n) = self.by_minute.get_mut(&minute) {
            *n -= 1;
            if *n == 0 {
                self.by_minute.remove(&minute);
            }
        }
    }

    /// Forgets everything (before a rebuild).
    pub fn clear(&mut self) {
        self.by_target.clear();
        self.by_minute.clear();
    }

    /// The counts as seen at `now_ms`.
    pub fn snapshot(&self, now_ms: u64) -> Snapshot {
        let now = now_ms / 60_000;
        let bounds = [now, now + 1, now + 60, now + 1_440];
        let mut by_due = [0u64; 5];
        for (minute, n) in &self.by_minute {
            let bucket = bounds.iter().position(|b| minute < b).unwrap_or(4);
            by_due[bucket] += n;
        }
        let mut by_target: Vec<(String, u64)> = self
            .by_target
            .iter()
            .map(|(t, n)| (t.clone(), *n))
            .collect();
        by_target.sort();
        Snapshot { by_target, by_due }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_follow_the_clock_and_removals_undo_adds() {
        let now = 1_000 * 60_000;
        let mut s = PendingStats::default();
        s.add("a", now - 120_000); // overdue
        s.add("a", now + 30_000); // this minute: within 1m
        s.add("b", now + 30 * 60_000); // 1h
        s.add("b", now + 5 * 3_600_000); // 1d
        s.add("c", now + 3 * 86_400_000); // later
        let snap = s.snapshot(now);
        assert_eq!(snap.by_due, [1, 1, 1, 1, 1]);
        assert_eq!(
            snap.by_target,
            vec![("a".into(), 2), ("b".into(), 2), ("c".into(), 1)]
        );
        // An hour later the 30-minute one is overdue too.
        assert_eq!(s.snapshot(now + 3_600_000).by_due, [3, 0, 0, 1, 1]);
        s.remove("c", now + 3 * 86_400_000);
        s.remove("a", now - 120_000);
        let snap = s.snapshot(now);
        assert_eq!(snap.by_due, [0, 1, 1, 1, 0]);
        assert_eq!(snap.by_target, vec![("a".into(), 1), ("b".into(), 2)]);
    }
}
