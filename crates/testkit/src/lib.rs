//! What kafka-delay's system suites (`tests/`) and benchmarks (`crates/bench`) share to reach
//! a Kafka: the cluster (librdkafka's mock cluster in this process, or an external one such as
//! the Apache Kafka of `make test`), topics made and deleted, a producer, and names no other
//! test or run uses. Never published.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kafka_delay::kafka::Embedded;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, Producer};

/// The wall clock in epoch milliseconds.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A name no other test (or earlier run against the same external broker) uses.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}-{}-{}-{}",
        std::process::id(),
        now_ms() % 100_000_000,
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The Kafka a test or a benchmark talks to.
#[derive(Debug)]
pub enum Kafka {
    /// librdkafka's mock cluster, in this process.
    Mock(Embedded),
    /// A cluster at these bootstrap servers.
    External(String),
}

impl Kafka {
    /// The cluster `KAFKA_DELAY_TEST_BROKERS` names, else a mock cluster of one broker.
    pub fn start() -> Self {
        match std::env::var("KAFKA_DELAY_TEST_BROKERS") {
            Ok(b) if !b.is_empty() => Kafka::External(b),
            _ => Kafka::Mock(Embedded::start(1).expect("mock cluster")),
        }
    }

    /// Always the in-process mock cluster: for the tests that inject faults through it (a
    /// broker down inside the process, per-topic request errors).
    pub fn embedded() -> Self {
        Kafka::Mock(Embedded::start(1).expect("mock cluster"))
    }

    /// The cluster at `brokers`, else a mock cluster of `mock_brokers` brokers started now.
    ///
    /// # Errors
    /// The mock cluster could not start.
    pub fn connect(
        brokers: Option<&str>,
        mock_brokers: i32,
    ) -> Result<Self, kafka_delay::kafka::KafkaSetupError> {
        Ok(match brokers {
            Some(b) => Kafka::External(b.to_owned()),
            None => Kafka::Mock(Embedded::start(mock_brokers)?),
        })
    }

    /// Its bootstrap servers.
    pub fn brokers(&self) -> String {
        match self {
            Kafka::Mock(e) => e.bootstrap_servers(),
            Kafka::External(b) => b.clone(),
        }
    }

    /// Whether it is the in-process mock cluster.
    pub fn is_mock(&self) -> bool {
        matches!(self, Kafka::Mock(_))
    }

    /// The mock cluster, to inject faults through.
    pub fn mock(&self) -> Option<&Embedded> {
        match self {
            Kafka::Mock(e) => Some(e),
            Kafka::External(_) => None,
        }
    }

    /// Creates a topic and returns its partition count (a broker without CreateTopics, such as
    /// the mock cluster in another process, auto-creates it with its own default count).
    pub async fn create_topic(&self, name: &str, partitions: i32) -> i32 {
        self.create_topic_with(name, partitions, &[]).await
    }

    /// A target whose records carry the time Kafka appended them
    /// (`message.timestamp.type=LogAppendTime`): a checker judges arrivals by Kafka's clock,
    /// not by anything the writer says (the mock cluster ignores the setting).
    pub async fn create_target_topic(&self, name: &str, partitions: i32) -> i32 {
        let config = [("message.timestamp.type", "LogAppendTime")];
        self.create_topic_with(name, partitions, &config).await
    }

    /// [`Kafka::create_topic`] with topic `config` (on Apache Kafka).
    pub async fn create_topic_with(
        &self,
        name: &str,
        partitions: i32,
        config: &[(&str, &str)],
    ) -> i32 {
        match self {
            Kafka::Mock(e) => {
                e.create_topic(name, partitions).expect("create topic");
                partitions
            }
            Kafka::External(b) => {
                let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
                    .set("bootstrap.servers", b)
                    .create()
                    .expect("admin");
                let mut t = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
                for (k, v) in config {
                    t = t.set(k, v);
                }
                let opts = AdminOptions::new()
                    .operation_timeout(Some(Duration::from_secs(10)))
                    .request_timeout(Some(Duration::from_secs(5)));
                // Without CreateTopics (an error here), the metadata request below creates it.
                if let Ok(r) = admin.create_topics([&t], &opts).await {
                    for res in r {
                        if let Err((t, e)) = res {
                            assert_eq!(
                                e,
                                rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists,
                                "create {t}"
                            );
                        }
                    }
                }
                let client: rdkafka::producer::BaseProducer = ClientConfig::new()
                    .set("bootstrap.servers", b)
                    .set("allow.auto.create.topics", "true")
                    .create()
                    .expect("client");
                let deadline = Instant::now() + Duration::from_secs(20);
                loop {
                    let md = client
                        .client()
                        .fetch_metadata(Some(name), Duration::from_secs(5))
                        .expect("metadata");
                    let n = md
                        .topics()
                        .iter()
                        .find(|t| t.name() == name && t.error().is_none())
                        .map_or(0, |t| t.partitions().len());
                    if n > 0 {
                        return n as i32;
                    }
                    assert!(Instant::now() < deadline, "topic {name} not created");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }

    /// Deletes a topic with DeleteTopics and waits until the broker no longer knows it.
    pub async fn delete_topic(&self, name: &str) {
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", self.brokers())
            .create()
            .expect("admin");
        let opts = AdminOptions::new()
            .operation_timeout(Some(Duration::from_secs(10)))
            .request_timeout(Some(Duration::from_secs(10)));
        let res = admin
            .delete_topics(&[name], &opts)
            .await
            .expect("DeleteTopics");
        for r in res {
            r.unwrap_or_else(|(t, e)| panic!("delete {t}: {e}"));
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while topic_exists(self, name) {
            assert!(Instant::now() < deadline, "topic {name} still there");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A producer that sends at once and waits at most 20 s for an acknowledgement.
    pub fn producer(&self) -> FutureProducer {
        ClientConfig::new()
            .set("bootstrap.servers", self.brokers())
            .set("linger.ms", "0")
            .set("allow.auto.create.topics", "false")
            .set("message.timeout.ms", "20000")
            .create()
            .expect("producer")
    }
}

/// Whether `topic` exists with at least one partition.
pub fn topic_exists(kafka: &Kafka, topic: &str) -> bool {
    let client: rdkafka::producer::BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", kafka.brokers())
        .set("allow.auto.create.topics", "false")
        .create()
        .expect("client");
    let md = client
        .client()
        .fetch_metadata(Some(topic), Duration::from_secs(5))
        .expect("metadata");
    md.topics()
        .iter()
        .any(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty())
}
