//! Durability: how pending records are kept safe and how they fire, decided once at start.
//!
//! | mode | flags | a group of records is safe once | a due record fires by |
//! |------|-------|---------------------------------|-----------------------|
//! | [`Local`] | `--no-changelog` (and the embedded Kafka) | in RocksDB on this disk | produce, then delete here |
//! | [`Logged`] | the default (`--changelog`) | also in the changelog, acknowledged | produce, delete here, tombstone |
//! | [`exactly::Exactly`] | `--exactly-once` | its ingest transaction committed | one transaction: the record, its tombstone, the group's offsets |
//!
//! [`Prepared::new`] picks the mode from the configuration and what the cluster can keep
//! ([`choice`]); [`Prepared::check_cluster`] makes sure the group has no member of another mode
//! (nor any other member, for [`Local`]: [`peers`]); [`Prepared::start`] starts what it
//! runs (the restore and standby tasks with a changelog, the transaction loop with
//! exactly-once) and only then hands out the [`Durability`], whose parts ingest
//! ([`ingest::Durable`], [`ingest::Rebalance`]), the publisher ([`publish::Delivery`]) and the
//! admin API ([`admin::Cluster`]) call. None of them asks which mode it runs in, and nothing
//! fires before the mode runs. Outside this module only the mechanisms (`changelog/`, `txn/`)
//! and the flags (`config/`) know the modes exist: `scripts/mode.py` checks it.

mod choice;
mod due;
mod exactly;
mod grouped;
mod local;
mod logged;
mod peers;

use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::StreamConsumer;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::changelog::adopt::{self, AdoptError};
use crate::changelog::departed::Departed;
use crate::changelog::handoff::Handoff;
use crate::changelog::moving::Moving;
use crate::changelog::operate::Operators;
use crate::changelog::standby::Standbys;
use crate::changelog::takeover::{OnRestored, Resumes, Takeover};
use crate::changelog::topics::TopicError;
use crate::changelog::Changelog;
use crate::config::{millis, Config};
use crate::ingest::{Durable, IngestContext, Rebalance};
use crate::kafka::KafkaSetupError;
use crate::kafka_clock::KafkaClock;
use crate::metrics::Metrics;
use crate::publish::history::History;
use crate::publish::Delivery;
use crate::scheduler::Inserts;
use crate::store::Store;
use crate::{admin, changelog};
use kafka_delay_core::clock::Clock;

pub use grouped::Grouped;
pub use local::Local;
pub use logged::Logged;

/// Most records in one ingest group where each group waits (an fsync with `--sync`, the
/// changelog's acknowledgement, a transaction): larger groups mean fewer waits. A group only
/// fills when the consumer has a backlog.
pub const WAITING_GROUP: usize = 2_048;

/// Most records in one ingest group where nothing waits: a large group keeps a runtime worker
/// from the publisher for longer and delivery lateness grows (docs/decisions.md has the
/// figures).
pub const FREE_GROUP: usize = 512;

/// Why the mode could not start.
#[derive(Debug, thiserror::Error)]
pub enum DurabilityError {
    /// A client could not be made.
    #[error(transparent)]
    Kafka(#[from] KafkaSetupError),
    /// A changelog topic that cannot hold the pending state.
    #[error(transparent)]
    Changelog(#[from] TopicError),
    /// Exactly-once was asked for and the cluster cannot run transactions.
    #[error("{0}")]
    Transactions(String),
    /// The mode the flags ask for cannot run on this cluster, or the cluster was not asked.
    #[error("{why}")]
    Mode {
        /// What is wrong and what to do.
        why: String,
    },
    /// The data directory could not be taken into the changelog.
    #[error(transparent)]
    Adopt(#[from] AdoptError),
    /// The group has a member this instance cannot run beside.
    #[error(transparent)]
    Group(#[from] peers::CheckError),
    /// A start-up task could not finish (it panicked, or the runtime is stopping).
    #[error("{what} task failed: {detail}")]
    Task {
        /// What the task did.
        what: &'static str,
        /// The join error.
        detail: String,
    },
}

/// The mode chosen from the flags, before it runs: what the consumer and the admin API need
/// from it already.
#[derive(Debug)]
pub struct Prepared {
    kind: Kind,
    /// Where the other instances reach this one's HTTP server.
    advertised: String,
    config: Arc<Config>,
    store: Arc<Store>,
    metrics: Metrics,
}

#[derive(Debug)]
enum Kind {
    Local(Arc<Local>),
    Logged(Arc<Grouped>, Movers),
    Exactly(Arc<Grouped>, Movers, Arc<exactly::Consumed>, String),
}

/// With a changelog, the tasks that move partitions here, not yet started.
#[derive(Debug)]
struct Movers {
    takeover: Takeover,
    standbys: Standbys,
    departed: Departed,
}

/// What the running broker and its shutdown need of the chosen mode.
#[derive(Debug)]
pub struct Durability {
    /// What ingest calls.
    pub ingest: Arc<dyn Durable>,
    /// What the publisher calls.
    pub delivery: Arc<dyn Delivery>,
    /// The partitions moving between instances (with a changelog).
    grouped: Option<Arc<Grouped>>,
    /// Every task the mode started, waited for at shutdown.
    tasks: Vec<(&'static str, JoinHandle<()>)>,
}

/// What a started mode runs alongside ingest.
pub struct Context {
    /// The ingest consumer, not yet subscribed.
    pub consumer: Arc<StreamConsumer<IngestContext>>,
    /// New timers for the scheduler (restored partitions).
    pub inserts: Inserts,
    /// Wall clock.
    pub clock: Arc<dyn Clock>,
    /// Turns true when the broker stops.
    pub stop: watch::Receiver<bool>,
    /// The most recently fired records, for the console (records that fire with their ingest
    /// group are added here).
    pub history: History,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").finish_non_exhaustive()
    }
}

impl Prepared {
    /// Picks the mode: the changelog writes each change to a compacted topic too (the default
    /// where the cluster compacts topics); `--no-changelog` keeps every record on this disk
    /// only; `--exactly-once` adds transactions. `advertised` is where the other instances
    /// reach this one's HTTP server.
    ///
    /// # Errors
    /// The mode cannot run on this cluster, or the changelog's producer cannot be made.
    pub async fn new(
        config: &Config,
        (store, metrics, kafka_clock): (Arc<Store>, Metrics, Arc<KafkaClock>),
        advertised: String,
    ) -> Result<Self, DurabilityError> {
        let chosen = choice::choose(config).await?;
        let config = Arc::new(config.clone());
        let kind = if !chosen.changelog {
            Kind::Local(Arc::new(Local::new(
                store.clone(),
                if config.store.sync {
                    WAITING_GROUP
                } else {
                    FREE_GROUP
                },
            )))
        } else {
            let consumed = config
                .cluster
                .transactional_id
                .is_some()
                .then(|| Arc::new(exactly::Consumed::new(store.clone())));
            let on_restored = consumed.clone().map(|c| {
                OnRestored(Arc::new(move |pid, source_next| {
                    let c = c.clone();
                    Box::pin(async move { c.forget_uncommitted(pid, source_next).await })
                }))
            });
            let changelog = Changelog::new(&config, kafka_clock)?;
            let moving = Moving::new(
                store.clone(),
                changelog.clone(),
                config.clone(),
                metrics.clone(),
            );
            let (handoff, events) = Handoff::new(moving.clone());
            let resumes = Arc::new(Resumes::default());
            let mode = if consumed.is_some() { EXACTLY } else { LOGGED };
            let me = changelog::owners::client_id(mode, &advertised);
            let movers = Movers {
                takeover: Takeover::new(moving.clone(), events, resumes.clone(), on_restored),
                standbys: Standbys::new(moving.clone(), me.clone()),
                departed: Departed::new(moving, me),
            };
            let operators = Operators::new(
                store.clone(),
                changelog.clone(),
                config.kafka.group_id.clone(),
                advertised.clone(),
            );
            let grouped = Arc::new(Grouped::new(
                (store.clone(), changelog),
                Arc::new(handoff),
                resumes,
                operators,
            ));
            match (consumed, config.cluster.transactional_id.clone()) {
                (Some(c), Some(id)) => Kind::Exactly(grouped, movers, c, id),
                _ => Kind::Logged(grouped, movers),
            }
        };
        let prepared = Self {
            kind,
            advertised,
            config,
            store,
            metrics,
        };
        let name = prepared.name();
        prepared
            .metrics
            .broker
            .mode
            .with_label_values(&[name])
            .set(1);
        info!(mode = name, why = chosen.why, "durability mode chosen");
        Ok(prepared)
    }

    /// The mode's name, for the start-up log, the metrics and the other members of the group.
    pub fn name(&self) -> &'static str {
        match self.kind {
            Kind::Local(_) => LOCAL,
            Kind::Logged(..) => LOGGED,
            Kind::Exactly(..) => EXACTLY,
        }
    }

    /// What the admin API asks of the group.
    pub fn cluster(&self) -> Arc<dyn admin::Cluster> {
        match &self.kind {
            Kind::Local(l) => l.clone(),
            Kind::Logged(g, _) | Kind::Exactly(g, ..) => g.clone(),
        }
    }

    /// What the consumer's rebalance callback calls.
    pub fn rebalance(&self) -> Arc<dyn Rebalance> {
        match &self.kind {
            Kind::Local(l) => l.clone(),
            Kind::Logged(g, _) | Kind::Exactly(g, ..) => g.clone(),
        }
    }

    /// The ingest consumer's `client.id`: it carries this one's mode and HTTP address, so that
    /// any instance can name a partition's owner and a starting one the modes of its group.
    pub fn client_id(&self) -> Option<String> {
        Some(changelog::owners::client_id(self.name(), &self.advertised))
    }

    /// Consumer settings the mode needs (where the operator set none): with a changelog a
    /// rebalance moves only the partitions that change owner; with exactly-once the offsets
    /// commit in ingest's transactions, never by the consumer.
    pub fn consumer_defaults(&self) -> &'static [(&'static str, &'static str)] {
        match self.kind {
            Kind::Local(_) => &[("partition.assignment.strategy", "range,roundrobin")],
            Kind::Logged(..) => &[
                ("partition.assignment.strategy", "cooperative-sticky"),
                HEARTBEAT,
            ],
            Kind::Exactly(..) => &[
                ("partition.assignment.strategy", "cooperative-sticky"),
                HEARTBEAT,
                ("enable.auto.commit", "false"),
            ],
        }
    }

    /// Before the ingest consumer joins its group. With a changelog: creates the missing
    /// changelog topics of the source topics there are (refusing one that is misconfigured)
    /// and takes into the changelog what this data directory holds without it. In every mode
    /// but the embedded Kafka's: refuses a group with a member of another mode, or, without the
    /// changelog, any other member.
    ///
    /// # Errors
    /// A [`TopicError`], [`AdoptError`] or [`peers::CheckError`] saying what to fix.
    pub async fn check_cluster(&self) -> Result<(), DurabilityError> {
        let (c, store, mode) = (self.config.clone(), self.store.clone(), self.name());
        let grouped = match &self.kind {
            Kind::Local(_) => None,
            Kind::Logged(g, _) | Kind::Exactly(g, ..) => Some(g.changelog().clone()),
        };
        blocking("cluster check", move || -> Result<(), DurabilityError> {
            if grouped.is_none() {
                let forgotten = store
                    .forget_checkpoints()
                    .map_err(|e| DurabilityError::Task {
                        what: "forgetting the changelog checkpoints",
                        detail: e.to_string(),
                    })?;
                if forgotten > 0 {
                    warn!(
                        partitions = forgotten,
                        "running without the changelog: the changelog \
                          positions of this data directory are forgotten; a start with the \
                          changelog again needs its changelog topics deleted first"
                    );
                }
            }
            if let Some(changelog) = grouped {
                let checked = changelog::topics::ensure_all(&c, c.cluster.changelog_replication)?;
                info!(source_topics = checked, "changelog topics checked");
                adopt::adopt(&store, &changelog, Duration::from_secs(30))?;
            }
            if !c.kafka.embedded {
                peers::check(&c, mode)?;
            }
            Ok(())
        })
        .await
    }

    /// Starts what the mode runs and hands out its parts.
    ///
    /// # Errors
    /// With exactly-once: the cluster cannot run transactions.
    pub async fn start(self, cx: Context) -> Result<Durability, DurabilityError> {
        let name = self.name();
        let Prepared {
            kind,
            config,
            store,
            metrics,
            ..
        } = self;
        let durability = match kind {
            Kind::Local(l) => Durability {
                ingest: l.clone(),
                delivery: l,
                grouped: None,
                tasks: Vec::new(),
            },
            Kind::Logged(g, movers) => {
                let at_ingest = due::AtIngest::new(&config, &cx, &metrics);
                let logged = Arc::new(Logged::new(
                    g.clone(),
                    (
                        config.cluster.changelog_linger,
                        metrics.broker.changelog_lingering.clone(),
                    ),
                    (at_ingest, due::producer(&config).await?),
                ));
                let mut tasks = movers.start(&cx, &config);
                tasks.push(watch_values(&g, &store, &config, &cx));
                Durability {
                    ingest: logged.clone(),
                    delivery: logged,
                    grouped: Some(g),
                    tasks,
                }
            }
            Kind::Exactly(g, movers, consumed, id) => {
                let (exactly, task) =
                    exactly::start(&config, &id, &store, (g.clone(), consumed), &cx, &metrics)
                        .await?;
                let mut tasks = vec![("transactions", task)];
                tasks.extend(movers.start(&cx, &config));
                tasks.push(watch_values(&g, &store, &config, &cx));
                Durability {
                    ingest: exactly.clone(),
                    delivery: exactly,
                    grouped: Some(g),
                    tasks,
                }
            }
        };
        info!(mode = name, "durability mode running");
        Ok(durability)
    }
}

/// With a changelog a member learns of a rebalance (a gone member removed, a partition to
/// take over) at its next heartbeat: librdkafka's default is 3 s.
const HEARTBEAT: (&str, &str) = ("heartbeat.interval.ms", "500");

/// The modes' names.
const LOCAL: &str = "local";
const LOGGED: &str = "changelog";
const EXACTLY: &str = "exactly-once";

/// The task that reads the source topics' retention for the changelog's pointers.
fn watch_values(
    g: &grouped::Grouped,
    store: &Arc<Store>,
    config: &Arc<Config>,
    cx: &Context,
) -> (&'static str, JoinHandle<()>) {
    let changelog = g.changelog();
    (
        "source retention",
        tokio::spawn(changelog::values::watch(
            changelog.values().clone(),
            (store.clone(), changelog.clone()),
            config.clone(),
            cx.stop.clone(),
        )),
    )
}

/// Runs `f` on a blocking thread.
async fn blocking<T: Send + 'static>(
    what: &'static str,
    f: impl FnOnce() -> Result<T, DurabilityError> + Send + 'static,
) -> Result<T, DurabilityError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| DurabilityError::Task {
            what,
            detail: e.to_string(),
        })?
}

impl Movers {
    /// The tasks that restore assigned partitions, keep standby copies warm and remove gone
    /// members from the group.
    fn start(self, cx: &Context, config: &Config) -> Vec<(&'static str, JoinHandle<()>)> {
        let horizon = millis(config.wheel.horizon);
        let restore = self.takeover.run(
            cx.consumer.clone(),
            cx.inserts.clone(),
            (horizon, cx.clock.clone()),
            cx.stop.clone(),
        );
        vec![
            ("restore", tokio::spawn(restore)),
            ("standby", tokio::spawn(self.standbys.run(cx.stop.clone()))),
            (
                "departed members",
                tokio::spawn(self.departed.run(cx.stop.clone())),
            ),
        ]
    }
}

impl Durability {
    /// The broker is stopping: from now on a revoke keeps the local state (the checkpoint
    /// makes the next start read only the changelog's tail).
    pub fn stopping(&self) {
        if let Some(g) = &self.grouped {
            g.handoff().stopping();
        }
    }

    /// After ingest and the publisher stopped: waits for every changelog write owed and for
    /// the mode's tasks (each at most `wait`).
    pub async fn close(self, wait: Duration) {
        let Durability {
            ingest,
            delivery,
            grouped,
            tasks,
        } = self;
        // The transaction loop ends once no one can hand it work.
        drop((ingest, delivery));
        if let Some(g) = grouped {
            let flushed = tokio::task::spawn_blocking(move || g.changelog().flush(wait)).await;
            info!(result = ?flushed.map(|r| r.map_err(|e| e.to_string())), "changelog flushed");
        }
        for (name, task) in tasks {
            if tokio::time::timeout(wait, task).await.is_err() {
                warn!(
                    task = name,
                    "a task of the durability mode did not stop in time"
                );
            }
        }
    }
}
