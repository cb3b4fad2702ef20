//! Every partition the subscription matches has an owner in the group.
//!
//! A static member (`--instance-id`) that comes back within its session gets its old assignment
//! without a rebalance (KIP-345). librdkafka joins with JoinGroup v5, so the coordinator never
//! asks it, as the group's leader, to look again (KIP-814 needs v9): a delay topic created while
//! the instance was down matches its subscription from the start, no later metadata refresh
//! shows a change, and the topic's partitions stay with no one, their records never consumed.
//! Checked here from the outside: every few refresh periods the topics the source pattern
//! matches are compared with what the group's members own; partitions with no owner in two
//! checks in a row, with the group stable both times, make this instance subscribe again
//! (unsubscribe, subscribe), a join with changed metadata that the coordinator answers with a
//! rebalance.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{Consumer, StreamConsumer};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use super::consumer::subscribe;
use super::context::IngestContext;
use crate::changelog::owners::{self, Owner};
use crate::config::Config;

/// A partition: topic and number.
type Partition = (String, i32);

/// The least time between two checks (with the default 5 s topic refresh they are 30 s apart).
const LEAST_EVERY: Duration = Duration::from_secs(5);

/// The partitions of `matched` (each topic with its partition count) that no member of the
/// group owns.
pub fn unowned(matched: &[(String, i32)], members: &[Owner]) -> BTreeSet<Partition> {
    let owned: BTreeSet<&Partition> = members.iter().flat_map(|m| &m.partitions).collect();
    matched
        .iter()
        .flat_map(|(topic, count)| (0..*count).map(move |p| (topic.clone(), p)))
        .filter(|p| !owned.contains(p))
        .collect()
}

/// What a check saw.
enum Seen {
    /// The group is rebalancing, or could not be read: nothing to conclude.
    Unknown,
    /// The group is stable; these partitions have no owner.
    Unowned(BTreeSet<Partition>),
}

/// The check, running.
#[derive(Debug)]
pub struct Coverage(JoinHandle<()>);

/// Starts the check, which runs until `stop`, subscribing again when matched partitions stay
/// without an owner.
pub fn watch(
    config: &Config,
    consumer: &Arc<StreamConsumer<IngestContext>>,
    stop: &watch::Receiver<bool>,
) -> Coverage {
    let run = run(Arc::new(config.clone()), consumer.clone(), stop.clone());
    Coverage(tokio::spawn(run))
}

impl Coverage {
    /// Runs `ingest`, then waits for the check (both stop on the same signal).
    pub async fn alongside(self, ingest: impl std::future::Future<Output = ()>) {
        ingest.await;
        let _ = self.0.await;
    }
}

async fn run(
    config: Arc<Config>,
    consumer: Arc<StreamConsumer<IngestContext>>,
    mut stop: watch::Receiver<bool>,
) {
    let every = (config.kafka.topic_refresh * 6).max(LEAST_EVERY);
    let mut before: BTreeSet<Partition> = BTreeSet::new();
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            () = tokio::time::sleep(every) => {}
        }
        let (c, k) = (consumer.clone(), config.clone());
        let Ok(seen) = tokio::task::spawn_blocking(move || check(&k, &c)).await else {
            return;
        };
        let now = match seen {
            Seen::Unknown => {
                before.clear();
                continue;
            }
            Seen::Unowned(now) => now,
        };
        let still: Vec<&Partition> = now.intersection(&before).collect();
        if !still.is_empty() {
            warn!(partitions = ?still, checks_apart_ms = every.as_millis() as u64,
                  "partitions the source pattern matches have no owner in the group (a static member got its old assignment back); subscribing again");
            consumer.unsubscribe();
            if let Err(e) = subscribe(&config, &consumer) {
                warn!(error = %e, "cannot subscribe again; trying at the next check");
            }
            before.clear();
            continue;
        }
        before = now;
    }
}

/// One look at the topics and the group. Blocking.
fn check(config: &Config, consumer: &StreamConsumer<IngestContext>) -> Seen {
    let group = match owners::describe(consumer.client(), &config.kafka.group_id) {
        Ok(g) if g.stable => g,
        Ok(_) => return Seen::Unknown,
        Err(e) => {
            debug!(error = %e, "cannot describe the group for the coverage check");
            return Seen::Unknown;
        }
    };
    let metadata = match consumer.fetch_metadata(None, Duration::from_secs(10)) {
        Ok(m) => m,
        Err(e) => {
            debug!(error = %e, "cannot read the topics for the coverage check");
            return Seen::Unknown;
        }
    };
    let matched: Vec<(String, i32)> = metadata
        .topics()
        .iter()
        .filter(|t| t.error().is_none() && config.contract.source_pattern.is_match(t.name()))
        .map(|t| (t.name().to_owned(), t.partitions().len() as i32))
        .collect();
    Seen::Unowned(unowned(&matched, &group.owners))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(partitions: &[(&str, i32)]) -> Owner {
        Owner {
            http: None,
            mode: None,
            client_id: "kafka-delay".into(),
            host: "/127.0.0.1".into(),
            partitions: partitions
                .iter()
                .map(|(t, p)| ((*t).to_owned(), *p))
                .collect(),
        }
    }

    #[test]
    fn a_matched_partition_no_member_owns_is_unowned() {
        let matched = vec![("delay.a".to_owned(), 2), ("delay.b".to_owned(), 2)];
        let members = [
            member(&[("delay.a", 0), ("delay.a", 1)]),
            member(&[("delay.b", 1)]),
        ];
        let left: Vec<Partition> = unowned(&matched, &members).into_iter().collect();
        assert_eq!(left, vec![("delay.b".to_owned(), 0)]);
        let all = [member(&[
            ("delay.a", 0),
            ("delay.a", 1),
            ("delay.b", 0),
            ("delay.b", 1),
        ])];
        assert!(unowned(&matched, &all).is_empty());
        // Partitions added to a topic count too; owned partitions of topics no longer matched
        // do not matter.
        let grown = vec![("delay.a".to_owned(), 3)];
        let left: Vec<Partition> = unowned(&grown, &members).into_iter().collect();
        assert_eq!(left, vec![("delay.a".to_owned(), 2)]);
        assert_eq!(unowned(&matched, &[]).len(), 4);
    }
}
