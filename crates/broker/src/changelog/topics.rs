//! Changelog topics: created with the right partition count and configuration, and checked
//! when they exist already.

use std::time::Duration;

use rdkafka::admin::{
    AdminClient, AdminOptions, NewTopic, OwnedResourceSpecifier, ResourceSpecifier,
    TopicReplication,
};
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaErrorCode;

use crate::config::Config;
use crate::kafka::{base_config, partitions_of};

/// What is wrong with a changelog topic, or why it could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopicError {
    /// It has fewer partitions than its source topic.
    #[error("changelog topic '{topic}' has {has} partitions but source topic '{source_topic}' has {needs}; add partitions to the changelog (kafka-topics --alter --partitions {needs}) or delete it so that kafka-delay creates it")]
    TooFewPartitions {
        /// The changelog topic.
        topic: String,
        /// Its source topic.
        source_topic: String,
        /// Partitions it has.
        has: usize,
        /// Partitions it needs.
        needs: usize,
    },
    /// Its cleanup policy would delete pending records.
    #[error("changelog topic '{topic}' has cleanup.policy={policy}; it must be 'compact' (a pending record must stay until it fires): kafka-configs --alter --entity-type topics --entity-name {topic} --add-config cleanup.policy=compact")]
    NotCompacted {
        /// The changelog topic.
        topic: String,
        /// Its policy.
        policy: String,
    },
    /// Kafka did not answer or refused.
    #[error("changelog topic '{topic}': {detail}")]
    Kafka {
        /// The changelog topic.
        topic: String,
        /// What failed.
        detail: String,
    },
}

/// Makes sure `changelog` can hold the state of every partition of `source`: creates it
/// (compacted, as many partitions as the source, replication factor `replication`, -1 for the
/// cluster's default) when it does not exist, and checks it otherwise. Blocking. Returns the
/// partitions of `source` it was checked for.
///
/// # Errors
/// A [`TopicError`] saying what is wrong and how to fix it.
pub fn ensure(
    config: &Config,
    source: &str,
    changelog: &str,
    replication: i32,
) -> Result<usize, TopicError> {
    let kafka = |detail: String| TopicError::Kafka {
        topic: changelog.to_owned(),
        detail,
    };
    // Never by a metadata request: that would create the topic with the cluster's defaults.
    let admin: AdminClient<DefaultClientContext> = base_config(config)
        .set("allow.auto.create.topics", "false")
        .create()
        .map_err(|e| kafka(e.to_string()))?;
    let needs = partitions_of(admin.inner(), source)
        .map_err(|e| kafka(e.to_string()))?
        .len();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| kafka(e.to_string()))?;
    let opts = AdminOptions::new()
        .operation_timeout(Some(Duration::from_secs(10)))
        .request_timeout(Some(Duration::from_secs(10)));
    let mut has = partitions_of(admin.inner(), changelog)
        .map_err(|e| kafka(e.to_string()))?
        .len();
    if has == 0 {
        let new = NewTopic::new(
            changelog,
            needs.max(1) as i32,
            TopicReplication::Fixed(replication),
        )
        .set("cleanup.policy", "compact")
        // Each acknowledgement then says what the cluster's clock read (`kafka_clock`).
        .set("message.timestamp.type", "LogAppendTime");
        let created = runtime
            .block_on(admin.create_topics([&new], &opts))
            .map_err(|e| kafka(e.to_string()))?;
        match created.into_iter().next() {
            Some(Ok(_)) | Some(Err((_, RDKafkaErrorCode::TopicAlreadyExists))) => {}
            Some(Err((_, code))) => return Err(kafka(format!("cannot create it: {code}"))),
            None => return Err(kafka("no answer to CreateTopics".into())),
        }
        has = wait_for_partitions(&admin, changelog)?;
    }
    if has < needs {
        return Err(TopicError::TooFewPartitions {
            topic: changelog.to_owned(),
            source_topic: source.to_owned(),
            has,
            needs,
        });
    }
    // Asked again for a while before it counts: another instance starting at the same time
    // may have just created the topic, and a broker that has not yet applied that creation
    // answers with the cluster's default policy.
    let mut policy = cleanup_policy(&runtime, &admin, changelog)?;
    for _ in 0..POLICY_ASKS {
        if policy == "compact" {
            return Ok(needs);
        }
        std::thread::sleep(Duration::from_millis(250));
        policy = cleanup_policy(&runtime, &admin, changelog)?;
    }
    if policy != "compact" {
        return Err(TopicError::NotCompacted {
            topic: changelog.to_owned(),
            policy,
        });
    }
    Ok(needs)
}

/// How many more times a changelog topic that does not read as compacted is asked (every
/// 250 ms) before the start fails.
const POLICY_ASKS: usize = 20;

/// At start: [`ensure`] for every existing source topic (those `--source-pattern` matches,
/// but not the changelog topics themselves), so that a misconfigured changelog stops the
/// start with a message that says how to fix it. Blocking; returns how many were checked.
///
/// # Errors
/// The first [`TopicError`].
pub fn ensure_all(config: &Config, replication: i32) -> Result<usize, TopicError> {
    let client: rdkafka::consumer::BaseConsumer = base_config(config)
        .set("allow.auto.create.topics", "false")
        .create()
        .map_err(|e| TopicError::Kafka {
            topic: "(all)".into(),
            detail: e.to_string(),
        })?;
    let md = rdkafka::consumer::Consumer::fetch_metadata(&client, None, Duration::from_secs(10))
        .map_err(|e| TopicError::Kafka {
            topic: "(all)".into(),
            detail: format!("cannot list topics: {e}"),
        })?;
    let group = &config.kafka.group_id;
    let mut checked = 0;
    for t in md.topics() {
        let name = t.name();
        if super::is_changelog_of(group, name)
            || name.starts_with("__")
            || !config.contract.source_pattern.is_match(name)
        {
            continue;
        }
        ensure(config, name, &super::topic_name(group, name), replication)?;
        checked += 1;
    }
    Ok(checked)
}

/// The partitions of a topic just created, once its metadata shows them.
fn wait_for_partitions(
    admin: &AdminClient<DefaultClientContext>,
    topic: &str,
) -> Result<usize, TopicError> {
    for _ in 0..100 {
        let n = partitions_of(admin.inner(), topic)
            .map(|p| p.len())
            .unwrap_or(0);
        if n > 0 {
            return Ok(n);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(TopicError::Kafka {
        topic: topic.to_owned(),
        detail: "created, but its partitions did not appear in the metadata within 10 s".into(),
    })
}

fn cleanup_policy(
    runtime: &tokio::runtime::Runtime,
    admin: &AdminClient<DefaultClientContext>,
    topic: &str,
) -> Result<String, TopicError> {
    let kafka = |detail: String| TopicError::Kafka {
        topic: topic.to_owned(),
        detail,
    };
    // Any broker describes a topic: librdkafka's pick first, then each broker in turn while
    // the one asked does not answer (`crate::brokers`). The brokers are listed only then.
    let others = std::iter::once_with(|| crate::brokers::ids(admin.inner()).unwrap_or_default());
    let targets = std::iter::once(None).chain(others.flatten().map(Some));
    let described = crate::brokers::in_turn(targets, |broker| {
        let opts = AdminOptions::new()
            .request_timeout(Some(crate::brokers::EACH))
            .broker_id(broker);
        runtime.block_on(admin.describe_configs([&ResourceSpecifier::Topic(topic)], &opts))
    })
    .map_err(|e| kafka(format!("cannot describe its configuration: {e}")))?;
    let resource = described
        .into_iter()
        .next()
        .ok_or_else(|| kafka("no answer to DescribeConfigs".into()))?
        .map_err(|e| kafka(format!("cannot describe its configuration: {e}")))?;
    debug_assert!(matches!(
        resource.specifier,
        OwnedResourceSpecifier::Topic(_)
    ));
    Ok(resource
        .get("cleanup.policy")
        .and_then(|e| e.value.clone())
        .unwrap_or_else(|| "delete".into()))
}
