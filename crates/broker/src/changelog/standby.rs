//! Standby replicas: warm copies of partitions owned by other instances, kept by tailing their
//! changelogs, so that a takeover after a crash reads only the last changes instead of the
//! whole changelog.
//!
//! **Who keeps a copy.** librdkafka has no pluggable assignor, so the group cannot be asked to
//! hand a lost partition to an instance that is warm for it. Every instance instead reads the
//! assignment in force from the group coordinator (what `GET /api/v1/owners` shows) and applies
//! one rule they all agree on: a partition's standbys are the `--standby-replicas` members
//! other than its owner that rank highest by a rendezvous hash of (member, topic, partition).
//! A member joining or leaving moves only its own share of the copies. With
//! `--standby-replicas` = instances - 1, every survivor is warm for every partition, so the
//! assignor's choice is always warm; with fewer, a takeover lands on a warm instance about
//! `N / (instances - 1)` of the time and otherwise restores from the beginning.
//!
//! **How.** Once a second, while the group is stable, a pass catches every copy up to the end
//! its changelog has, with the restore an assignment uses (the checkpoint is written with the
//! data), and drops the local state of partitions this instance neither owns nor keeps a copy
//! of. Copies never fire: the store fires only the partitions it owns. An assignment stops a
//! pass under way, so a takeover never waits for it; taking over a copy reads the changelog
//! from its checkpoint, about a second of changes.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::{info, warn};

use super::moving::{lock, Moving};
use super::owners::{self, Owner};
use super::restore::{self, Outcome, Part};
use super::GroupError;
use kafka_delay_core::id::Pid;

/// How often the copies catch up.
const EVERY: Duration = Duration::from_secs(1);

/// The source partitions `me` keeps a copy of: those owned by another member whose
/// `replicas` highest-ranked other members include `me`. Members that are not kafka-delay
/// (no advertised address) keep no copies. Sorted.
pub fn standbys(owners: &[Owner], me: &str, replicas: usize) -> Vec<(String, i32)> {
    let keepers: Vec<&str> = owners
        .iter()
        .filter(|o| o.http.is_some())
        .map(|o| o.client_id.as_str())
        .collect();
    let mut out = Vec::new();
    for owner in owners.iter().filter(|o| o.client_id != me) {
        for (topic, partition) in &owner.partitions {
            let mut ranked: Vec<(u64, &str)> = keepers
                .iter()
                .filter(|k| **k != owner.client_id)
                .map(|k| (rank(k, topic, *partition), *k))
                .collect();
            ranked.sort_unstable_by(|a, b| b.cmp(a));
            if ranked.iter().take(replicas).any(|(_, k)| *k == me) {
                out.push((topic.clone(), *partition));
            }
        }
    }
    out.sort();
    out
}

/// The rendezvous weight of `member` for a partition: FNV-1a of the three, then mixed (the
/// SplitMix64 finalizer) so that names differing in one character spread over all 64 bits.
fn rank(member: &str, topic: &str, partition: i32) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let number = partition.to_be_bytes();
    let bytes = member
        .as_bytes()
        .iter()
        .chain(&[0xff])
        .chain(topic.as_bytes())
        .chain(&[0xff])
        .chain(&number);
    for b in bytes {
        h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
    }
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// The standby pass's side of partitions changing owner: the copies this instance keeps.
#[derive(Debug)]
pub struct Standbys {
    moving: Arc<Moving>,
    /// This instance's consumer `client.id`, as the group shows it.
    me: String,
    /// Records in each warm copy.
    warm: Mutex<HashMap<Pid, u64>>,
}

impl Standbys {
    /// The copies kept by the instance whose ingest consumer's `client.id` is `me`
    /// ([`owners::client_id`]).
    pub fn new(moving: Arc<Moving>, me: String) -> Self {
        Self {
            moving,
            me,
            warm: Mutex::default(),
        }
    }

    /// Keeps the standby copies warm until `stop` (returns at once without standby replicas).
    pub async fn run(self, mut stop: tokio::sync::watch::Receiver<bool>) {
        if self.moving.config.cluster.standby_replicas == 0 {
            return;
        }
        let this = Arc::new(self);
        let mut failures = 0u32;
        loop {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                () = tokio::time::sleep(EVERY) => {}
            }
            let s = this.clone();
            match tokio::task::spawn_blocking(move || s.pass()).await {
                Ok(Ok(())) => failures = 0,
                Ok(Err(e)) => {
                    // Said once, then once a minute while it lasts.
                    if failures % 60 == 0 {
                        warn!(error = %e, "standby copies cannot catch up; trying again every second");
                    }
                    failures += 1;
                }
                Err(_) => return,
            }
        }
    }

    /// One pass: which copies to keep, catching them up, dropping the rest. Blocking.
    fn pass(&self) -> Result<(), GroupError> {
        let m = &self.moving;
        let client = rdkafka::producer::Producer::client(m.changelog.producer());
        let group = owners::describe(client, &m.config.kafka.group_id)?;
        if !group.stable || !group.owners.iter().any(|o| o.client_id == self.me) {
            return Ok(()); // a rebalance is under way: what is kept is decided after it
        }
        let wanted = standbys(&group.owners, &self.me, m.config.cluster.standby_replicas);
        let _turn = m.writer_turn();
        let parts = self.register(&wanted)?;
        self.drop_others(&parts);
        let mut by_topic: HashMap<String, Vec<Part>> = HashMap::new();
        for p in &parts {
            by_topic.entry(p.topic.clone()).or_default().push(p.clone());
        }
        let mut outcomes = HashMap::new();
        let mut failed = None;
        for (topic, parts) in by_topic {
            let wait = Duration::from_secs(10);
            match restore::restore(&m.config, &m.store, parts, wait, None) {
                Ok(o) => outcomes.extend(o),
                Err(e) => failed = Some(format!("{topic}: {e}")),
            }
        }
        self.tally(&parts, &outcomes);
        m.catching_up().clear();
        failed.map_or(Ok(()), |f| Err(GroupError::Topics(f)))
    }

    /// The copies this pass catches up: `wanted` less what is owned or being restored here,
    /// each with the flag an assignment sets to stop it.
    fn register(&self, wanted: &[(String, i32)]) -> Result<Vec<Part>, GroupError> {
        let m = &self.moving;
        let restoring = m.restoring();
        let mut flags = m.catching_up();
        flags.clear();
        let mut parts = Vec::new();
        for (topic, partition) in wanted {
            if m.changelog.is_changelog(topic) {
                continue;
            }
            let pid = m.store.partition_id(topic, *partition)?;
            if restoring.contains_key(&pid) || m.store.owns(pid) {
                continue;
            }
            let cancelled = Arc::new(AtomicBool::new(false));
            flags.insert(pid, cancelled.clone());
            parts.push(Part {
                pid,
                topic: m.changelog.topic_of(topic),
                partition: *partition,
                cancelled,
            });
        }
        Ok(parts)
    }

    /// Drops the local state of partitions neither owned, being restored, nor kept as copies,
    /// and stops counting as copies those this instance owns now.
    fn drop_others(&self, kept: &[Part]) {
        let keep: HashSet<Pid> = kept.iter().map(|p| p.pid).collect();
        let stale = self
            .moving
            .store
            .partitions_with_state()
            .into_iter()
            .filter(|p| !keep.contains(p));
        self.moving.drop_owned_elsewhere(stale);
        lock(&self.warm).retain(|pid, _| keep.contains(pid));
    }

    /// Counts the copies' records and how far behind they were, for the metrics.
    fn tally(&self, parts: &[Part], outcomes: &HashMap<Pid, Outcome>) {
        let mut warm = lock(&self.warm);
        let mut lag = 0u64;
        for part in parts {
            let Some(o) = outcomes.get(&part.pid) else {
                continue; // stopped by an assignment
            };
            lag += o.entries;
            match warm.get_mut(&part.pid) {
                Some(n) => *n = n.saturating_add_signed(o.delta),
                None => {
                    let n = self.moving.store.count_copy(part.pid).unwrap_or(0);
                    warm.insert(part.pid, n);
                    info!(topic = %part.topic, partition = part.partition, records = n,
                          entries = o.entries, "standby copy of a partition owned elsewhere is warm");
                }
            }
        }
        let b = &self.moving.metrics.broker;
        b.partitions_standby.set(warm.len() as i64);
        b.standby_records.set(warm.values().sum::<u64>() as i64);
        b.standby_lag.set(lag as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::changelog::owners::client_id;

    fn member(name: &str, partitions: std::ops::Range<i32>) -> Owner {
        Owner {
            http: Some(name.to_owned()),
            mode: Some("changelog".to_owned()),
            client_id: client_id("changelog", name),
            host: "/127.0.0.1".into(),
            partitions: partitions.map(|p| ("delay.a".to_owned(), p)).collect(),
        }
    }

    fn id(name: &str) -> String {
        client_id("changelog", name)
    }

    /// How many copies each partition has, over every member's view.
    fn copies(owners: &[Owner], replicas: usize) -> HashMap<(String, i32), Vec<String>> {
        let mut out: HashMap<(String, i32), Vec<String>> = HashMap::new();
        for m in owners {
            for p in standbys(owners, &m.client_id, replicas) {
                out.entry(p).or_default().push(m.client_id.clone());
            }
        }
        out
    }

    #[test]
    fn each_partition_has_its_replicas_on_members_other_than_its_owner() {
        let owners = [
            member("a:1", 0..4),
            member("b:1", 4..8),
            member("c:1", 8..12),
        ];
        for replicas in [1, 2] {
            let copies = copies(&owners, replicas);
            assert_eq!(copies.len(), 12, "{copies:?}");
            for ((_, p), keepers) in &copies {
                assert_eq!(keepers.len(), replicas, "partition {p}: {keepers:?}");
                let owner = &owners[(*p / 4) as usize].client_id;
                assert!(!keepers.contains(owner), "partition {p}: {keepers:?}");
            }
        }
        // One copy each: spread over both other members, not all on one.
        let on_a = standbys(&owners, &id("a:1"), 1).len();
        assert!(
            (2..=6).contains(&on_a),
            "a keeps {on_a} of the 8 it does not own"
        );
        // More replicas than other members: every other member keeps a copy.
        assert_eq!(standbys(&owners, &id("a:1"), 5).len(), 8);
        assert!(standbys(&owners, &id("a:1"), 0).is_empty());
    }

    #[test]
    fn a_member_leaving_moves_only_the_copies_it_kept_and_order_does_not_matter() {
        let four = [
            member("a:1", 0..3),
            member("b:1", 3..6),
            member("c:1", 6..9),
            member("d:1", 9..12),
        ];
        let before = copies(&four, 1);
        // d's partitions move to a; the copies of the others stay where they were unless d
        // kept them.
        let mut three = vec![
            member("a:1", 0..3),
            member("b:1", 3..6),
            member("c:1", 6..9),
        ];
        three[0]
            .partitions
            .extend((9..12).map(|p| ("delay.a".to_owned(), p)));
        let after = copies(&three, 1);
        for (p, keepers) in &before {
            if p.1 < 9 && !keepers.contains(&id("d:1")) {
                assert_eq!(after.get(p), Some(keepers), "partition {p:?} moved");
            }
        }
        three.reverse();
        assert_eq!(copies(&three, 1), after);
    }

    #[test]
    fn members_that_are_not_kafka_delay_keep_no_copies() {
        let mut other = member("x:1", 4..6);
        other.http = None;
        let owners = [member("a:1", 0..4), other.clone(), member("b:1", 6..8)];
        assert!(standbys(&owners, &other.client_id, 2).is_empty());
        let on_a = standbys(&owners, &id("a:1"), 2);
        assert_eq!(on_a.len(), 4, "b's and x's partitions: {on_a:?}");
    }
}
