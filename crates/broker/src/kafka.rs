//! librdkafka client settings, topics, and the embedded Kafka-protocol cluster. Header
//! conversion is the client crate's (`kafka_delay_client::headers`), re-exported here.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{DefaultProducerContext, FutureProducer, Producer};

use crate::config::{Config, KafkaProp};
pub use kafka_delay_client::headers::{header_refs, headers_from, headers_to};

/// Errors talking to Kafka at start-up.
#[derive(Debug, thiserror::Error)]
pub enum KafkaSetupError {
    /// A client could not be created (bad property, bad value).
    #[error("cannot create the Kafka {client}: {source} (check --kafka-config)")]
    Client {
        /// Which client.
        client: &'static str,
        /// librdkafka's error.
        source: KafkaError,
    },
    /// The dead-letter topic does not exist and cannot be created.
    #[error("dead-letter topic '{topic}' does not exist and could not be created: {detail}; create it, or name an existing one with --dead-letter-topic")]
    DeadLetterTopic {
        /// The topic.
        topic: String,
        /// What failed.
        detail: String,
    },
    /// The cluster did not answer.
    #[error("Kafka at {brokers} did not answer a metadata request: {source}")]
    Unreachable {
        /// Bootstrap servers.
        brokers: String,
        /// librdkafka's error.
        source: KafkaError,
    },
    /// The embedded cluster could not start.
    #[error("cannot start the embedded Kafka cluster: {0}")]
    Embedded(KafkaError),
}

/// Properties shared by every client: bootstrap servers and the user's `--kafka-config`.
pub fn base_config(config: &Config) -> ClientConfig {
    client_config(
        &config.kafka.brokers,
        "kafka-delay",
        &config.kafka.properties,
    )
}

/// A client configuration: bootstrap servers, client id and the user's librdkafka properties
/// (for the broker and for the `replay` and `verify` commands).
pub fn client_config(brokers: &str, client_id: &str, props: &[KafkaProp]) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers);
    c.set("client.id", client_id);
    for prop in props {
        c.set(&prop.key, &prop.value);
    }
    c
}

/// The producer that publishes due records and dead letters.
///
/// Idempotent (no duplicates or reordering from librdkafka's own retries), Java-compatible
/// partitioning (murmur2 of the key), never auto-creates a topic, and reports an unknown
/// target within seconds instead of after the default 30 s.
///
/// # Errors
/// [`KafkaSetupError::Client`] for an invalid property.
pub fn producer(config: &Config) -> Result<FutureProducer, KafkaSetupError> {
    producer_config(config)
        .create()
        .map_err(|source| KafkaSetupError::Client {
            client: "producer",
            source,
        })
}

/// The publishing producer's librdkafka settings (also what `kafka-delay-bench` gives its plain
/// producers, so that they produce as the broker does).
pub fn producer_config(config: &Config) -> ClientConfig {
    let mut c = base_config(config);
    c.set("enable.idempotence", "true")
        .set("partitioner", "murmur2_random")
        .set("allow.auto.create.topics", "false")
        .set("topic.metadata.propagation.max.ms", "3000")
        .set("message.timeout.ms", "30000");
    set_default(&mut c, config, "linger.ms", "5");
    set_default(&mut c, config, "compression.type", "lz4");
    // The user's properties win over our defaults but never over the rules above.
    for prop in &config.kafka.properties {
        if !matches!(
            prop.key.as_str(),
            "enable.idempotence" | "allow.auto.create.topics"
        ) {
            c.set(&prop.key, &prop.value);
        }
    }
    c
}

/// Kafka Streams' transaction timeout for exactly-once: an instance that stopped in the
/// middle of a transaction holds up its partitions' new owner (whose restore reads
/// read_committed) at most this long, before the coordinator aborts it.
pub const TRANSACTION_TIMEOUT_MS: &str = "10000";

/// The transactional producer of exactly-once firing: [`producer_config`]'s settings with
/// `id` as its `transactional.id`, a transaction timeout (default [`TRANSACTION_TIMEOUT_MS`]), and records
/// given up within it. It does not linger (unless `--kafka-config` says `linger.ms`): a
/// transaction waits for every record's acknowledgement before it commits, and a linger held
/// its last records back for nothing (BENCHMARKS.md, section 10).
pub fn transactional_producer_config(config: &Config, id: &str) -> ClientConfig {
    let mut c = producer_config(config);
    set_default(&mut c, config, "linger.ms", "0");
    set_default(
        &mut c,
        config,
        "transaction.timeout.ms",
        TRANSACTION_TIMEOUT_MS,
    );
    let timeout = c
        .get("transaction.timeout.ms")
        .unwrap_or(TRANSACTION_TIMEOUT_MS)
        .to_owned();
    c.set("transactional.id", id)
        .set("message.timeout.ms", timeout);
    c
}

fn set_default(c: &mut ClientConfig, config: &Config, key: &str, value: &str) {
    if !config.kafka.properties.iter().any(|p| p.key == key) {
        c.set(key, value);
    }
}

/// Has an idempotent producer ask for its producer id now rather than up to a second later.
/// Blocking: two metadata requests.
///
/// librdkafka asks for the id when the producer is created, before its connection to a broker
/// is up, and after that only on a 500 ms timer or when a metadata response comes in; until it
/// has the id it sends nothing. A broker started with a backlog of due records therefore
/// delivered nothing for its first 0.5-1 s (docs/decisions.md). The
/// response to the second request comes in over the connection the first one opened, and the
/// producer asks for its id at once. Errors are left to the producer's first real request.
pub fn request_producer_id<C: rdkafka::ClientContext>(
    client: &rdkafka::client::Client<C>,
    topic: &str,
) {
    for _ in 0..2 {
        let _ = client.fetch_metadata(Some(topic), Duration::from_secs(5));
    }
}

/// Makes sure the dead-letter topic exists, creating it when missing.
///
/// # Errors
/// [`KafkaSetupError::DeadLetterTopic`] when it is missing and cannot be created.
pub async fn ensure_dead_letter_topic(
    config: &Config,
    producer: &FutureProducer,
) -> Result<(), KafkaSetupError> {
    if topic_exists(producer, &config.topics.dead_letter, &config.kafka.brokers).await? {
        return Ok(());
    }
    ensure_topic(
        config,
        producer,
        &config.topics.dead_letter,
        config.topics.partitions,
    )
    .await
    .map_err(|detail| KafkaSetupError::DeadLetterTopic {
        topic: config.topics.dead_letter.clone(),
        detail,
    })
}

/// Makes sure `topic` exists: a metadata request, then CreateTopics, then (for clusters without
/// CreateTopics, such as librdkafka's mock cluster) a metadata request that allows auto-creation,
/// as a broker with `auto.create.topics.enable` does.
///
/// # Errors
/// What failed, as a sentence.
pub async fn ensure_topic(
    config: &Config,
    producer: &FutureProducer,
    topic: &str,
    partitions: i32,
) -> Result<(), String> {
    if topic_exists(producer, topic, &config.kafka.brokers)
        .await
        .map_err(|e| e.to_string())?
    {
        return Ok(());
    }
    let admin: AdminClient<DefaultClientContext> =
        base_config(config).create().map_err(|e| e.to_string())?;
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(-1));
    let opts = AdminOptions::new()
        .operation_timeout(Some(Duration::from_secs(10)))
        .request_timeout(Some(Duration::from_secs(5)));
    let created = match admin.create_topics([&new], &opts).await {
        Ok(results) => match results.into_iter().next() {
            Some(Ok(_)) | Some(Err((_, RDKafkaErrorCode::TopicAlreadyExists))) => return Ok(()),
            Some(Err((_, code))) => code.to_string(),
            None => "no answer to CreateTopics".into(),
        },
        Err(e) => e.to_string(),
    };
    auto_create_via_metadata(config, topic).await;
    if topic_exists(producer, topic, &config.kafka.brokers)
        .await
        .map_err(|e| e.to_string())?
    {
        return Ok(());
    }
    Err(created)
}

/// Asks for `topic`'s metadata with automatic topic creation allowed.
async fn auto_create_via_metadata(config: &Config, topic: &str) {
    let mut c = base_config(config);
    c.set("allow.auto.create.topics", "true");
    let Ok(client) = c.create::<rdkafka::producer::BaseProducer>() else {
        return;
    };
    let name = topic.to_owned();
    let _ = tokio::task::spawn_blocking(move || {
        client
            .client()
            .fetch_metadata(Some(&name), Duration::from_secs(5))
    })
    .await;
}

/// The partitions of `topic` from a metadata request (none when it does not exist). Blocking.
///
/// # Errors
/// librdkafka's error when the cluster does not answer.
pub fn partitions_of<C: rdkafka::ClientContext>(
    client: &rdkafka::client::Client<C>,
    topic: &str,
) -> rdkafka::error::KafkaResult<Vec<i32>> {
    let md = client.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    Ok(md
        .topics()
        .iter()
        .filter(|t| t.name() == topic && t.error().is_none())
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect())
}

/// Whether `topic` exists, by a metadata request that does not create it.
///
/// # Errors
/// [`KafkaSetupError::Unreachable`] when the cluster does not answer.
pub async fn topic_exists(
    producer: &FutureProducer,
    topic: &str,
    brokers: &str,
) -> Result<bool, KafkaSetupError> {
    let client = producer.clone();
    let name = topic.to_owned();
    let md = tokio::task::spawn_blocking(move || {
        client
            .client()
            .fetch_metadata(Some(&name), Duration::from_secs(10))
    })
    .await
    .map_err(|_| KafkaSetupError::Unreachable {
        brokers: brokers.to_owned(),
        source: KafkaError::Canceled,
    })
    .and_then(|r| {
        r.map_err(|source| KafkaSetupError::Unreachable {
            brokers: brokers.to_owned(),
            source,
        })
    })?;
    Ok(md
        .topics()
        .iter()
        .any(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty()))
}

/// An in-process Kafka-protocol cluster (librdkafka's mock cluster) on 127.0.0.1.
pub struct Embedded {
    cluster: MockCluster<'static, DefaultProducerContext>,
}

impl std::fmt::Debug for Embedded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Embedded({})", self.cluster.bootstrap_servers())
    }
}

impl Embedded {
    /// Starts a cluster of `brokers` brokers.
    ///
    /// # Errors
    /// [`KafkaSetupError::Embedded`] when librdkafka cannot start it.
    pub fn start(brokers: i32) -> Result<Self, KafkaSetupError> {
        let cluster = MockCluster::new(brokers).map_err(KafkaSetupError::Embedded)?;
        Ok(Self { cluster })
    }

    /// `HOST:PORT[,...]` of the brokers.
    pub fn bootstrap_servers(&self) -> String {
        self.cluster.bootstrap_servers()
    }

    /// Creates a topic (the mock cluster has no CreateTopics API; it also auto-creates topics
    /// with 4 partitions when a client asks for them).
    ///
    /// # Errors
    /// [`KafkaSetupError::Embedded`] when librdkafka refuses.
    pub fn create_topic(&self, topic: &str, partitions: i32) -> Result<(), KafkaSetupError> {
        self.cluster
            .create_topic(topic, partitions, 1)
            .map_err(KafkaSetupError::Embedded)
    }

    /// The mock cluster itself, for fault injection in tests.
    pub fn cluster(&self) -> &MockCluster<'static, DefaultProducerContext> {
        &self.cluster
    }
}

/// Kafka's murmur2 hash as the Java client computes it (`Utils.murmur2`).
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let len = data.len();
    let mut h: u32 = SEED ^ (len as u32);
    let chunks = data.chunks_exact(4);
    let tail = chunks.remainder();
    for chunk in chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    if tail.len() >= 3 {
        h ^= u32::from(tail[2]) << 16;
    }
    if tail.len() >= 2 {
        h ^= u32::from(tail[1]) << 8;
    }
    if !tail.is_empty() {
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition the Java client's default partitioner picks for a key.
pub fn java_partition(key: &[u8], partitions: i32) -> i32 {
    (murmur2(key) & 0x7fff_ffff) % partitions
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_transactional_producer_does_not_linger_unless_told_to() {
        let parse = |extra: &[&str]| {
            let mut args = vec!["--brokers", "a:1", "--exactly-once"];
            args.extend(extra);
            crate::config::RunArgs::try_parse_flags(args)
                .unwrap()
                .validate()
                .unwrap()
        };
        let linger = |c: &ClientConfig| c.get("linger.ms").map(str::to_owned);
        let config = parse(&[]);
        assert_eq!(
            linger(&transactional_producer_config(&config, "t")).as_deref(),
            Some("0")
        );
        assert_eq!(linger(&producer_config(&config)).as_deref(), Some("5"));
        let config = parse(&["--kafka-config", "linger.ms=7"]);
        assert_eq!(
            linger(&transactional_producer_config(&config, "t")).as_deref(),
            Some("7")
        );
    }

    #[test]
    fn murmur2_matches_the_java_client() {
        // Test vectors from Kafka's own UtilsTest.testMurmur2.
        let cases: [(&str, i32); 6] = [
            ("21", -973_932_308),
            ("foobar", -790_332_482),
            ("a-little-bit-long-string", -985_981_536),
            ("a-little-bit-longer-string", -1_486_304_829),
            (
                "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            ("abc", 479_470_107),
        ];
        for (input, want) in cases {
            assert_eq!(murmur2(input.as_bytes()), want, "{input}");
        }
    }

    /// Records, from each statistics event, the idempotent producer's state and when (ms since
    /// the producer was created, on librdkafka's own clock) it entered that state.
    struct IdempotenceStates(std::sync::Mutex<Vec<(String, i64)>>);

    impl rdkafka::ClientContext for IdempotenceStates {
        fn stats(&self, statistics: rdkafka::Statistics) {
            if let Some(eos) = statistics.eos {
                let since_ms = statistics.age / 1_000 - eos.idemp_stateage;
                self.0.lock().unwrap().push((eos.idemp_state, since_ms));
            }
        }
    }

    impl rdkafka::producer::ProducerContext for IdempotenceStates {
        type DeliveryOpaque = ();
        fn delivery(&self, _: &rdkafka::message::DeliveryResult<'_>, _: ()) {}
    }

    #[test]
    fn a_new_idempotent_producer_asks_for_its_id_without_waiting_for_librdkafkas_retry_timer() {
        let kafka = Embedded::start(1).unwrap();
        kafka.create_topic("dead-letters", 1).unwrap();
        let producer: rdkafka::producer::ThreadedProducer<IdempotenceStates> = ClientConfig::new()
            .set("bootstrap.servers", kafka.bootstrap_servers())
            .set("enable.idempotence", "true")
            .set("statistics.interval.ms", "50")
            .create_with_context(IdempotenceStates(std::sync::Mutex::default()))
            .unwrap();
        request_producer_id(producer.client(), "dead-letters");
        // When the producer got its id, by librdkafka's clock (not by when a statistics event
        // happened to be taken or seen): without the requests it asks only on its own retry
        // timer, 500 ms after it was created (502 ms measured with them removed).
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let assigned_ms = loop {
            let states = producer.context().0.lock().unwrap().clone();
            if let Some((_, at)) = states.iter().find(|(state, _)| state == "Assigned") {
                break *at;
            }
            assert!(std::time::Instant::now() < deadline, "no id: {states:?}");
            std::thread::sleep(Duration::from_millis(5));
        };
        assert!(
            assigned_ms < 500,
            "the producer got its id {assigned_ms} ms after it was created"
        );
    }
}
