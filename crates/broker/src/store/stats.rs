//! Counts of pending records by target topic and by due minute, kept in memory next to the
//! store and updated with every write, so metrics never scan RocksDB. Pure.
//!
//! The counts are also persisted: every write batch of the store carries the new value of each
//! count it changes ([`PendingStats::persisted_after`]), so a restart reads a few thousand
//! counts ([`PendingStats::load`]) instead of scanning every pending record.
//!
//! A write batch's changes are summed first ([`Changes`], then [`Summed`]): the counts and
//! their persisted form are then touched once per target and minute in the batch, not once per
//! record.

use std::borrow::Cow;
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
        // The name is copied only for a target not counted yet (not once per record).
        match self.by_target.get_mut(target) {
            Some(n) => *n += 1,
            None => {
                self.by_target.insert(target.to_owned(), 1);
            }
        }
        *self.by_minute.entry(due_ms / 60_000).or_default() += 1;
    }

    /// Applies summed changes (a count that would go below zero stops at zero).
    pub fn apply(&mut self, changes: &Summed<'_>) {
        for (target, d) in &changes.0.by_target {
            match self.by_target.get_mut(target.as_ref()) {
                Some(n) => {
                    *n = after(Some(n), *d);
                    if *n == 0 {
                        self.by_target.remove(target.as_ref());
                    }
                }
                None if *d > 0 => {
                    self.by_target
                        .insert(target.clone().into_owned(), *d as u64);
                }
                None => {}
            }
        }
        for &(minute, d) in &changes.0.by_minute {
            let n = after(self.by_minute.get(&minute), d);
            if n == 0 {
                self.by_minute.remove(&minute);
            } else {
                self.by_minute.insert(minute, n);
            }
        }
    }

    /// The persisted form of every count these `changes` touch, once they are applied:
    /// `(key, count)`, a count of 0 meaning "delete the key".
    pub fn persisted_after(&self, changes: &Summed<'_>) -> Vec<(Vec<u8>, u64)> {
        let targets = changes.0.by_target.iter().map(|(t, d)| {
            let now = self.by_target.get(t.as_ref());
            (target_key(t), after(now, *d))
        });
        let minutes = changes
            .0
            .by_minute
            .iter()
            .map(|&(m, d)| (minute_key(m), after(self.by_minute.get(&m), d)));
        targets.chain(minutes).collect()
    }

    /// Every count in its persisted form (after a full recount).
    pub fn persisted(&self) -> Vec<(Vec<u8>, u64)> {
        let targets = self.by_target.iter().map(|(t, n)| (target_key(t), *n));
        let minutes = self.by_minute.iter().map(|(m, n)| (minute_key(*m), *n));
        targets.chain(minutes).collect()
    }

    /// Counts read back from their persisted form.
    ///
    /// # Errors
    /// A key or value that is not one this module writes, described.
    pub fn load<K: AsRef<[u8]>, V: AsRef<[u8]>>(
        entries: impl IntoIterator<Item = (K, V)>,
    ) -> Result<Self, String> {
        let mut stats = Self::default();
        for (k, v) in entries {
            let (k, v) = (k.as_ref(), v.as_ref());
            let n = <[u8; 8]>::try_from(v)
                .map(u64::from_be_bytes)
                .map_err(|_| format!("count of {} bytes", v.len()))?;
            match k.split_first() {
                Some((b't', t)) => {
                    let t = std::str::from_utf8(t).map_err(|e| format!("target name: {e}"))?;
                    stats.by_target.insert(t.to_owned(), n);
                }
                Some((b'm', m)) => {
                    let m = <[u8; 8]>::try_from(m)
                        .map(u64::from_be_bytes)
                        .map_err(|_| format!("minute key of {} bytes", m.len()))?;
                    stats.by_minute.insert(m, n);
                }
                _ => return Err(format!("unknown count key {k:?}")),
            }
        }
        Ok(stats)
    }

    /// Adds `other`'s counts to these.
    pub fn absorb(&mut self, other: &PendingStats) {
        for (t, n) in &other.by_target {
            *self.by_target.entry(t.clone()).or_default() += n;
        }
        for (m, n) in &other.by_minute {
            *self.by_minute.entry(*m).or_default() += n;
        }
    }

    /// These counts less `other`'s (a count stops at zero), for example the records of
    /// partitions this instance only keeps a copy of.
    pub fn minus(&self, other: &PendingStats) -> PendingStats {
        let mut out = self.clone();
        for (t, n) in &other.by_target {
            if let Some(c) = out.by_target.get_mut(t) {
                *c = c.saturating_sub(*n);
                if *c == 0 {
                    out.by_target.remove(t);
                }
            }
        }
        for (m, n) in &other.by_minute {
            if let Some(c) = out.by_minute.get_mut(m) {
                *c = c.saturating_sub(*n);
                if *c == 0 {
                    out.by_minute.remove(m);
                }
            }
        }
        out
    }

    /// Records counted.
    pub fn total(&self) -> u64 {
        self.by_target.values().sum()
    }

    /// The start (epoch ms) of the earliest minute with a pending record.
    pub fn first_minute_ms(&self) -> Option<u64> {
        self.by_minute.keys().next().map(|m| m * 60_000)
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

/// A count after a change of `d`, never below zero.
fn after(now: Option<&u64>, d: i64) -> u64 {
    (*now.unwrap_or(&0) as i64 + d).max(0) as u64
}

/// The changes one write batch makes to the counts, summed per target and per due minute.
/// Records of the same target and minute usually come one after another: each of those costs
/// a comparison, not a lookup.
#[derive(Debug, Default)]
pub struct Changes<'a> {
    by_target: Vec<(Cow<'a, str>, i64)>,
    by_minute: Vec<(u64, i64)>,
}

impl<'a> Changes<'a> {
    /// A record of `target` due at `due_ms` added (`true`) or removed (`false`).
    pub fn push(&mut self, target: Cow<'a, str>, due_ms: u64, added: bool) {
        let d = if added { 1 } else { -1 };
        match self.by_target.last_mut() {
            Some((t, n)) if *t == target => *n += d,
            _ => self.by_target.push((target, d)),
        }
        let minute = due_ms / 60_000;
        match self.by_minute.last_mut() {
            Some((m, n)) if *m == minute => *n += d,
            _ => self.by_minute.push((minute, d)),
        }
    }

    /// One entry per target and per minute (runs of one key that recur later are merged).
    pub fn sum(mut self) -> Summed<'a> {
        fn merge<K: Ord>(v: &mut Vec<(K, i64)>) {
            if v.len() < 2 {
                return;
            }
            v.sort_unstable_by(|a, b| a.0.cmp(&b.0));
            v.dedup_by(|later, kept| {
                let same = later.0 == kept.0;
                if same {
                    kept.1 += later.1;
                }
                same
            });
        }
        merge(&mut self.by_target);
        merge(&mut self.by_minute);
        Summed(self)
    }
}

/// [`Changes`] with one entry per target and per minute: what the counts and their persisted
/// form take.
#[derive(Debug)]
pub struct Summed<'a>(Changes<'a>);

fn target_key(target: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + target.len());
    k.push(b't');
    k.extend_from_slice(target.as_bytes());
    k
}

fn minute_key(minute: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(9);
    k.push(b'm');
    k.extend_from_slice(&minute.to_be_bytes());
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    fn changes<'a>(list: &[(&'a str, u64, bool)]) -> Summed<'a> {
        let mut c = Changes::default();
        for &(t, due, added) in list {
            c.push(Cow::Borrowed(t), due, added);
        }
        c.sum()
    }

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
        s.apply(&changes(&[
            ("c", now + 3 * 86_400_000, false),
            ("a", now - 120_000, false),
        ]));
        let snap = s.snapshot(now);
        assert_eq!(snap.by_due, [0, 1, 1, 1, 0]);
        assert_eq!(snap.by_target, vec![("a".into(), 1), ("b".into(), 2)]);
    }

    #[test]
    fn persisted_changes_reload_to_the_same_counts() {
        let now = 1_000 * 60_000;
        let mut live = PendingStats::default();
        let mut disk: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
        let batches: [&[(&str, u64, bool)]; 3] = [
            &[
                ("a", now, true),
                ("a", now + 1, true),
                ("b", now + 90_000, true),
            ],
            &[("a", now, false), ("c", now + 86_400_000, true)],
            &[
                ("b", now + 90_000, false),
                ("a", now + 1, false),
                ("a", now + 5, true),
            ],
        ];
        for batch in batches {
            let batch = changes(batch);
            for (k, n) in live.persisted_after(&batch) {
                if n == 0 {
                    disk.remove(&k);
                } else {
                    disk.insert(k, n);
                }
            }
            live.apply(&batch);
            let loaded =
                PendingStats::load(disk.iter().map(|(k, n)| (k, n.to_be_bytes()))).unwrap();
            assert_eq!(loaded.snapshot(now), live.snapshot(now));
            assert_eq!(loaded.total(), live.total());
        }
        assert_eq!(live.total(), 2);
        assert_eq!(live.first_minute_ms(), Some(now));
        let all: BTreeMap<Vec<u8>, u64> = live.persisted().into_iter().collect();
        assert_eq!(all, disk, "a full rewrite equals the incremental one");
        assert!(PendingStats::load([(b"x".to_vec(), [0u8; 8].to_vec())]).is_err());
    }

    #[test]
    fn a_batch_is_summed_per_target_and_minute_whatever_its_order() {
        let m = 60_000;
        let now = 1_000 * m;
        let mut s = PendingStats::default();
        s.add("a", now);
        s.add("b", now + m);
        // "a" comes back after "b", minutes interleave, and a record moved within its minute
        // (removed and added) nets to nothing.
        let batch = changes(&[
            ("a", now, true),
            ("b", now + m, false),
            ("a", now + m, true),
            ("a", now, false),
            ("a", now + 2 * m, true),
            ("a", now + 2 * m + 1, false),
            ("a", now + 2 * m + 2, true),
        ]);
        let persisted: BTreeMap<Vec<u8>, u64> = s.persisted_after(&batch).into_iter().collect();
        assert_eq!(
            persisted,
            BTreeMap::from([
                (target_key("a"), 3),
                (target_key("b"), 0),
                (minute_key(1_000), 1),
                (minute_key(1_001), 1),
                (minute_key(1_002), 1),
            ]),
            "one entry per key, each the count after the whole batch"
        );
        s.apply(&batch);
        let mut want = PendingStats::default();
        for due in [now, now + m, now + 2 * m] {
            want.add("a", due);
        }
        assert_eq!(s.snapshot(now), want.snapshot(now));
        assert_eq!(
            s.by_target.len(),
            1,
            "a target counted down to zero is forgotten"
        );
        // Removing more than is counted leaves zero, not a wrapped-around count, and no
        // count for a target that has none.
        s.apply(&changes(&[("c", now, false), ("c", now + 1, false)]));
        assert_eq!(s.total(), 3);
        assert!(!s.by_target.contains_key("c"));
        assert_eq!(s.snapshot(now).by_due, [0, 0, 2, 0, 0]);
    }
}
