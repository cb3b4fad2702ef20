//! Whether the changelog runs, decided once at start: on unless the operator said
//! `--no-changelog` or the cluster cannot keep compacted topics (the embedded cluster, a
//! cluster whose log cleaner is off, or one that does not answer DescribeConfigs, as
//! librdkafka's mock cluster), and the start log says which and why. [`decide`] is the rule;
//! [`choose`] asks the cluster only where the rule needs it.

use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

use super::DurabilityError;
use crate::config::{Changelog, Config};
use crate::kafka::base_config;

/// What the cluster said about compacting topics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Cleaner {
    /// Its brokers' `log.cleaner.enable`.
    Enabled(bool),
    /// It does not serve DescribeConfigs, so it cannot be asked (or checked for the
    /// changelog's topics either).
    Unsupported,
}

/// The mode chosen and why, for the start log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Choice {
    /// Whether the changelog runs.
    pub changelog: bool,
    /// Why, in a sentence.
    pub why: &'static str,
}

/// The changelog runs when the operator asked for it, or by default where the cluster
/// compacts topics. `cleaner` is `None` where the cluster was not asked.
///
/// # Errors
/// What stops the start, as a sentence: `--changelog` or `--exactly-once` on a cluster that
/// cannot keep the changelog, or a default whose cluster was not asked.
pub(super) fn decide(
    flag: Changelog,
    cleaner: Option<&Cleaner>,
    exactly_once: bool,
) -> Result<Choice, &'static str> {
    let local = |why| {
        if exactly_once {
            Err(
                "--exactly-once needs the changelog, and this cluster cannot keep it (it \
                 cannot compact topics): run on a Kafka cluster whose log cleaner is on",
            )
        } else {
            Ok(Choice {
                changelog: false,
                why,
            })
        }
    };
    match (flag, cleaner) {
        (Changelog::On, _) => Ok(Choice {
            changelog: true,
            why: "--changelog",
        }),
        (Changelog::Off, _) => Ok(Choice {
            changelog: false,
            why: "--no-changelog: RocksDB on this disk is the only copy of the pending records; \
                  run one instance per group, on a durable disk",
        }),
        (Changelog::Embedded, _) => Ok(Choice {
            changelog: false,
            why: "the embedded Kafka keeps no compacted topics: RocksDB on this disk is the only \
                  copy (give --brokers of a Kafka cluster for the changelog)",
        }),
        (Changelog::Default, Some(Cleaner::Enabled(true))) => Ok(Choice {
            changelog: true,
            why: "the default on a cluster that compacts topics: a lost disk loses nothing and \
                  instances of one group share the partitions (--no-changelog for one instance \
                  on a durable disk)",
        }),
        (Changelog::Default, Some(Cleaner::Enabled(false))) => local(
            "the cluster's log cleaner is off (log.cleaner.enable=false), so it cannot keep a \
             changelog: RocksDB on this disk is the only copy; run one instance per group",
        ),
        (Changelog::Default, Some(Cleaner::Unsupported)) => local(
            "the cluster does not answer DescribeConfigs (librdkafka's mock cluster, or a \
             Kafka-compatible service), so the changelog cannot be checked: RocksDB on this \
             disk is the only copy; run one instance per group",
        ),
        (Changelog::Default, None) => Err("the cluster was not asked whether it compacts topics"),
    }
}

/// [`decide`] for `config`, asking the cluster where the default needs it.
///
/// # Errors
/// [`DurabilityError::Mode`] for what [`decide`] refuses, or a cluster that did not answer.
pub(super) async fn choose(config: &Config) -> Result<Choice, DurabilityError> {
    let flag = config.cluster.changelog;
    let cleaner = if flag == Changelog::Default {
        let c = config.clone();
        let asked = tokio::task::spawn_blocking(move || cleaner(&c))
            .await
            .map_err(|e| DurabilityError::Task {
                what: "asking the cluster whether it compacts topics",
                detail: e.to_string(),
            })?;
        Some(asked.map_err(|e| DurabilityError::Mode {
            why: format!(
                "could not ask the cluster whether it compacts topics ({e}); start again once it \
                 answers (with an authorizer, grant DescribeConfigs on the cluster: `kafka-delay \
                 acls`), or choose with --changelog or --no-changelog"
            ),
        })?)
    } else {
        None
    };
    let exactly_once = config.cluster.transactional_id.is_some();
    decide(flag, cleaner.as_ref(), exactly_once).map_err(|why| DurabilityError::Mode {
        why: why.to_owned(),
    })
}

/// Asks a broker of the cluster for `log.cleaner.enable`: the first the metadata names, and the
/// next while one does not answer ([`crate::brokers::in_turn`]). Blocking.
fn cleaner(config: &Config) -> Result<Cleaner, KafkaError> {
    let admin: AdminClient<DefaultClientContext> = base_config(config)
        .set("allow.auto.create.topics", "false")
        .create()?;
    let brokers = crate::brokers::ids(admin.inner())?;
    if brokers.is_empty() {
        return Err(KafkaError::MetadataFetch(
            RDKafkaErrorCode::BrokerNotAvailable,
        ));
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|_| KafkaError::Canceled)?;
    let opts = AdminOptions::new().request_timeout(Some(crate::brokers::EACH));
    // librdkafka sends a broker's own resource to that broker.
    let answer = crate::brokers::in_turn(brokers.into_iter().map(Some), |broker| {
        let broker = broker.unwrap_or_default();
        runtime.block_on(admin.describe_configs([&ResourceSpecifier::Broker(broker)], &opts))
    });
    let resource = match answer {
        Ok(mut rs) if !rs.is_empty() => rs.swap_remove(0),
        Ok(_) => return Err(KafkaError::AdminOp(RDKafkaErrorCode::Fail)),
        Err(KafkaError::AdminOp(RDKafkaErrorCode::UnsupportedFeature)) => {
            return Ok(Cleaner::Unsupported)
        }
        Err(e) => return Err(e),
    };
    match resource {
        // rdkafka reads a refused resource as one without entries (it drops the resource's
        // error), and a broker always has some: none means the cluster refused to say.
        Ok(r) if r.entries.is_empty() => Err(KafkaError::AdminOp(
            RDKafkaErrorCode::ClusterAuthorizationFailed,
        )),
        Ok(r) => Ok(Cleaner::Enabled(
            r.get("log.cleaner.enable")
                .and_then(|e| e.value.as_deref())
                .is_none_or(|v| v.eq_ignore_ascii_case("true")),
        )),
        Err(RDKafkaErrorCode::UnsupportedFeature) => Ok(Cleaner::Unsupported),
        Err(code) => Err(KafkaError::AdminOp(code)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_changelog_runs_by_default_where_the_cluster_compacts_and_flags_decide_otherwise() {
        let on = decide(Changelog::Default, Some(&Cleaner::Enabled(true)), false).unwrap();
        assert!(on.changelog && on.why.contains("default"), "{on:?}");
        for cleaner in [Cleaner::Enabled(false), Cleaner::Unsupported] {
            let off = decide(Changelog::Default, Some(&cleaner), false).unwrap();
            assert!(!off.changelog && off.why.contains("only copy"), "{off:?}");
            let refused = decide(Changelog::Default, Some(&cleaner), true).unwrap_err();
            assert!(refused.contains("--exactly-once"), "{refused}");
        }
        assert!(decide(Changelog::On, None, true).unwrap().changelog);
        let off = decide(Changelog::Off, None, false).unwrap();
        assert!(!off.changelog && off.why.contains("--no-changelog"));
        let embedded = decide(Changelog::Embedded, None, false).unwrap();
        assert!(!embedded.changelog && embedded.why.contains("embedded"));
        assert!(decide(Changelog::Default, None, false).is_err());
    }
}
