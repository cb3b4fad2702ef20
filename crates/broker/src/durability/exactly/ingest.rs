//! Ingest in the exactly-once mode: what a group changed (its changelog entries), its dead
//! letters and its source offsets commit in one Kafka transaction, sent with the consumer's
//! group metadata. A crash before the commit leaves nothing visible: the group is consumed
//! again, and the records RocksDB took meanwhile are dropped when the partition is restored
//! ([`Consumed::forget_uncommitted`](super::Consumed::forget_uncommitted)).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use tracing::{error, warn};

use super::Exactly;
use crate::backoff::Backoff;
use crate::changelog::group_entries;
use crate::dead_letter::{self, DeadLetter, DeadLetters};
use crate::durability::due::Firing;
use crate::ingest::{Durable, Guard, Last, OffsetCommit, Stored};
use crate::store::StoreError;
use crate::txn::{TxnError, Work};
use crate::BoxFuture;
use kafka_delay_core::changelog::{Checkpoint, Entry};
use kafka_delay_core::id::Pid;

impl Durable for Exactly {
    /// Nothing at start: each partition resumes as its restore says ([`Durable::resumed`]).
    fn start_offsets(&self) -> Result<HashMap<Pid, i64>, StoreError> {
        Ok(HashMap::new())
    }

    fn resumed(&self) -> HashMap<Pid, i64> {
        self.grouped.take_resumed()
    }

    /// Nothing yet: the dead letters commit with the group.
    fn before_store<'a>(
        &'a self,
        _dead_letters: &'a DeadLetters,
        _dead: &'a [DeadLetter],
    ) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }

    fn after_store<'a, 'm: 'a>(&'a self, group: Stored<'a, 'm>) -> BoxFuture<'a, bool> {
        Box::pin(self.commit_group(group))
    }

    fn offset_commit(&self) -> OffsetCommit {
        OffsetCommit::WithGroup
    }

    /// A group commits while the next is read, stored and its transaction made ready; a
    /// revoke waits for the groups in flight.
    fn in_flight(&self) -> Option<Guard> {
        Some(Box::new(self.grouped.handoff().owing()))
    }

    /// A transaction's worth of records: every group commits in a transaction of its own,
    /// one after another, so the group is what a transaction holds.
    fn max_group(&self) -> usize {
        self.max_group
    }

    fn fires_due(&self) -> bool {
        self.at_ingest.on
    }

    fn broken(&self) -> Option<String> {
        self.broken
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// How long a group's commit may keep failing because the consumer group moved on before the
/// consumer is taken as unable to rejoin. A rebalance gives the member a new generation in the
/// background; but a member the coordinator no longer knows (its session ended while the
/// coordinator was down) must first give up its partitions in a rebalance callback, which only
/// polling the consumer runs, and ingest does not poll while a group waits to commit.
const STALE_FOR: Duration = Duration::from_secs(30);

/// The same, once the coordinator has said it does not know this member
/// ([`TxnError::Stale`]'s `forgotten`): a few seconds, in case librdkafka's own rejoin mends
/// it, not the half minute that a Kafka back from a long outage would add to every record's
/// lateness.
const FORGOTTEN_FOR: Duration = Duration::from_secs(5);

impl Exactly {
    /// Commits what a group changed in one transaction, tried again until it commits; then
    /// checkpoints each partition. Partitions revoked meanwhile are left out (their new
    /// owner consumes them again). `false` when stopping first, or when none is left.
    pub(super) async fn commit_group(&self, group: Stored<'_, '_>) -> bool {
        let store = self.grouped.store();
        let owned_at = group.owned_at;
        let mut mending = Mending::default();
        let mut backoff = Backoff::standard();
        let mut stale_since: Option<Instant> = None;
        // The first transaction's work is made while the group before this one commits. A
        // partition revoked meanwhile leaves the group, for good: handed here again, it was
        // restored, and what this group read of it dropped and consumed again.
        let owned = |last: &mut Last<'_>| {
            let before = last.len();
            last.retain(|pid, _| store.owned_since(*pid).is_some_and(|s| s <= owned_at));
            last.len() == before
        };
        owned(group.last);
        let mut ready = (!group.last.is_empty()).then(|| self.group_work(&group, &mending));
        group.turn.come().await;
        loop {
            // A group before this one that gave up (the instance starts again) left records
            // uncommitted that this group's offsets would pass: nothing after it commits.
            if group.stopping.is_some_and(|s| *s.borrow()) || self.broken().is_some() {
                return false;
            }
            let unchanged = owned(group.last);
            if group.last.is_empty() {
                return false;
            }
            let (mut work, layout, sent_ms) = match ready.take().filter(|_| unchanged) {
                Some(ready) => ready,
                None => self.group_work(&group, &mending),
            };
            work.owned_at = Some(owned_at);
            let refused = match self.transactions.commit(work).await {
                Ok(written) => {
                    self.committed(group, &layout, &written, mending.firing, sent_ms);
                    return true;
                }
                Err(TxnError::Rejected(refused)) => {
                    if self
                        .mend(&refused, &layout, &group, &mut mending, sent_ms)
                        .await
                    {
                        continue;
                    }
                    TxnError::Rejected(refused)
                }
                Err(e) => e,
            };
            error!(error = %refused, "cannot commit an ingested group; consumption paused, retrying");
            if self.gives_up(&refused, &mut stale_since) {
                return false;
            }
            backoff.wait().await;
        }
    }

    /// After a group's transaction committed: each partition's checkpoint, the dead letters
    /// counted, the records due at ingest fired and the ones stored after all in the group.
    fn committed(
        &self,
        group: Stored<'_, '_>,
        layout: &Layout,
        written: &[i64],
        firing: Firing,
        sent_ms: u64,
    ) {
        self.checkpoint(group.last, &layout.changelog, written);
        for (dl, _) in dead_of(group.dead, group.last) {
            group.dead_letters.count(dl);
        }
        let fired = firing.firing(group.ops, group.last);
        self.at_ingest
            .fired(fired.map(|(_, id, record)| (id, record)), sent_ms);
        firing.into_group(group.applied);
    }

    /// Mends a group some of whose records Kafka refused: dead letters too large go again
    /// without their values, records due at ingest that their target refused are stored to
    /// fire through the wheel. Whether the group can go again.
    async fn mend(
        &self,
        refused: &[(usize, rdkafka::error::KafkaError)],
        layout: &Layout,
        group: &Stored<'_, '_>,
        mending: &mut Mending,
        sent_ms: u64,
    ) -> bool {
        let (to_store, shortened) = sort_refused(
            refused,
            layout,
            (group.dead, group.last),
            &mending.valueless,
        );
        let mut again = !shortened.is_empty();
        mending.valueless.extend(shortened);
        if !to_store.is_empty() {
            let store = self.grouped.store();
            let ops = (group.ops, group.stamps);
            match mending.firing.store(store, ops, &to_store, sent_ms).await {
                Ok(()) => again = true,
                Err(e) => error!(error = %e,
                    "cannot store records their target refused at ingest; retrying"),
            }
        }
        again
    }

    /// Whether ingest gives up on a group that did not commit because the consumer group
    /// moved on (for [`STALE_FOR`], or [`FORGOTTEN_FOR`] once the coordinator forgot this
    /// member, since `stale_since`): the instance must start again ([`Durable::broken`]).
    fn gives_up(&self, refused: &TxnError, stale_since: &mut Option<Instant>) -> bool {
        let TxnError::Stale { forgotten, .. } = refused else {
            *stale_since = None;
            return false;
        };
        let since = *stale_since.get_or_insert_with(Instant::now);
        let limit = if *forgotten { FORGOTTEN_FOR } else { STALE_FOR };
        if since.elapsed() < limit {
            return false;
        }
        error!(secs = since.elapsed().as_secs(), forgotten, "this member's consumer group moved on and it cannot rejoin while ingest waits on a commit; starting the instance again");
        *self.broken.lock().unwrap_or_else(|e| e.into_inner()) = Some(format!(
            "the consumer group moved on for {} s: {refused}",
            since.elapsed().as_secs()
        ));
        true
    }

    /// The transaction of a group: each partition's changelog entries (records, what they
    /// removed, the next source offset), then the dead letters, then the target records of
    /// the records due at ingest, and the source offsets; with the time they are fired at (now).
    fn group_work(&self, group: &Stored<'_, '_>, mending: &Mending) -> (Work, Layout, u64) {
        let (ops, stamps, applied, last) = (group.ops, group.stamps, &*group.applied, &*group.last);
        let (dead, dead_letters) = (group.dead, group.dead_letters);
        let (valueless, firing) = (&mending.valueless, &mending.firing);
        let sent_ms = self.at_ingest.now_ms();
        let changelog = self.grouped.changelog();
        let topic_of = |pid| last.get(&pid).map(|&(topic, ..)| topic);
        let mut by_pid = group_entries(changelog, (ops, stamps), applied, topic_of, |_, _| true);
        let stored = group_entries(
            changelog,
            (&firing.ops, &firing.stamps),
            &firing.applied,
            topic_of,
            |_, _| true,
        );
        for (pid, entries) in stored {
            by_pid.entry(pid).or_default().extend(entries);
        }
        let mut work = Work::default();
        let mut layout = Layout::default();
        for (pid, &(topic, partition, offset)) in last {
            let entries = by_pid.entry(*pid).or_default();
            entries.push(Entry::SourceOffset(offset + 1));
            for e in entries.iter() {
                work.records.push(changelog.out(topic, partition, e));
                layout.changelog.push(*pid);
            }
            work.offsets.push((topic.to_owned(), partition, offset + 1));
            work.partitions.push(*pid);
        }
        for (dl, at) in dead_of(dead, last) {
            work.records
                .push(dead_letters.out(dl, !valueless.contains(&at)));
            layout.dead += 1;
        }
        let store = self.grouped.store();
        for (place, id, record) in firing.firing(ops, last) {
            work.records
                .push(self.at_ingest.out(store, id, record, sent_ms));
            layout.fires.push(place);
        }
        (work, layout, sent_ms)
    }

    /// After the commit: each partition's checkpoint (the changelog offset after its last
    /// entry) and the source offset firing transactions commit for it.
    fn checkpoint(&self, last: &Last<'_>, changelog: &[Pid], written: &[i64]) {
        let store = self.grouped.store();
        let mut next: HashMap<Pid, i64> = HashMap::new();
        for (pid, offset) in changelog.iter().zip(written) {
            let n = next.entry(*pid).or_insert(0);
            *n = (*n).max(offset + 1);
        }
        for (pid, &(topic, partition, offset)) in last {
            self.consumed.set(*pid, offset + 1);
            let Some(&changelog_next) = next.get(pid) else {
                continue;
            };
            let at = Checkpoint {
                changelog_next,
                source_next: Some(offset + 1),
            };
            if let Err(e) = store.set_checkpoint(*pid, at) {
                warn!(%topic, partition, error = %e, "cannot write the changelog checkpoint");
            }
        }
    }
}

/// What to do with the records of a group's transaction that Kafka refused: the records due
/// at ingest to store after all (their places in the group's operations), and the dead letters
/// too large to send again without their values (their places in `dead`). The records after
/// the changelog entries are the dead letters, then the records due at ingest.
fn sort_refused(
    refused: &[(usize, rdkafka::error::KafkaError)],
    layout: &Layout,
    (dead, last): (&[DeadLetter], &Last<'_>),
    valueless: &HashSet<usize>,
) -> (Vec<usize>, Vec<usize>) {
    let (mut to_store, mut shortened) = (Vec::new(), Vec::new());
    for (index, error) in refused {
        let Some(at) = index.checked_sub(layout.changelog.len()) else {
            continue;
        };
        if let Some(&place) = at
            .checked_sub(layout.dead)
            .and_then(|i| layout.fires.get(i))
        {
            warn!(error = %error, "a record due at ingest was refused by its target; it fires \
                  through the wheel, retried and dead-lettered as any record");
            to_store.push(place);
        } else if let Some((dl, at)) = dead_of(dead, last)
            .nth(at)
            .filter(|(_, at)| dead_letter::too_large(error) && !valueless.contains(at))
        {
            warn!(origin = %dl.origin.topic, partition = dl.origin.partition,
                  offset = dl.origin.offset, "dead letter too large; sending it without its value");
            shortened.push(at);
        }
    }
    (to_store, shortened)
}

/// What a group's transaction changes when Kafka refused some of its records.
#[derive(Default)]
struct Mending {
    /// Dead letters the topic refused as too large: they go again without their values.
    valueless: HashSet<usize>,
    /// Records due at ingest whose target refused them: stored after all.
    firing: Firing,
}

/// Where a group's records are in its transaction.
#[derive(Debug, Default)]
struct Layout {
    /// The partition of each changelog entry, in order (they come first).
    changelog: Vec<Pid>,
    /// How many dead letters follow them.
    dead: usize,
    /// The place in the group's operations of each target record after those.
    fires: Vec<usize>,
}

/// The dead letters of the partitions in `last`, with their place in `dead`.
fn dead_of<'d>(
    dead: &'d [DeadLetter],
    last: &'d Last<'_>,
) -> impl Iterator<Item = (&'d DeadLetter, usize)> + 'd {
    dead.iter().enumerate().filter_map(move |(i, dl)| {
        last.values()
            .any(|(t, p, _)| *t == dl.origin.topic && *p == dl.origin.partition)
            .then_some((dl, i))
    })
}
