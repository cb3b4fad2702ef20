//! Consumer callbacks: librdkafka's statistics to the lag metric, and each rebalance handed to
//! the durability mode ([`Rebalance`]), which decides where assigned partitions start and what
//! happens before revoked ones go.

use std::sync::Arc;

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::topic_partition_list::TopicPartitionList;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::ClientContext;
use tracing::{error, info};

use super::Rebalance;

/// Context of the ingest consumer.
#[derive(Debug, Clone)]
pub struct IngestContext {
    /// Consumer lag goes here, from librdkafka's statistics.
    pub metrics: crate::metrics::Metrics,
    /// What the durability mode does when partitions change owner.
    pub rebalance: Arc<dyn Rebalance>,
}

impl ClientContext for IngestContext {
    fn stats(&self, statistics: rdkafka::Statistics) {
        for (topic, t) in &statistics.topics {
            for (partition, p) in &t.partitions {
                // -1 is librdkafka's "unassigned" partition; lag -1 means not known yet.
                if *partition < 0 || p.consumer_lag < 0 {
                    continue;
                }
                self.metrics
                    .ingest
                    .consumer_lag
                    .with_label_values(&[topic.as_str(), &partition.to_string()])
                    .set(p.consumer_lag);
            }
        }
    }
}

/// The topics of a partition list, sorted and comma-separated, for the rebalance log lines.
fn topics_of(tpl: &TopicPartitionList) -> String {
    let topics: std::collections::BTreeSet<String> = tpl
        .elements()
        .iter()
        .map(|e| e.topic().to_owned())
        .collect();
    topics.into_iter().collect::<Vec<_>>().join(",")
}

impl ConsumerContext for IngestContext {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        let cooperative = matches!(
            consumer.rebalance_protocol(),
            RebalanceProtocol::Cooperative
        );
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                self.rebalance.assigning(tpl);
                let result = if cooperative {
                    consumer.incremental_assign(tpl)
                } else {
                    consumer.assign(tpl)
                };
                match result {
                    Ok(()) => {
                        info!(partitions = tpl.count(), topics = %topics_of(tpl),
                              "source partitions assigned");
                        self.rebalance.assigned(consumer, tpl);
                    }
                    Err(e) => error!(error = %e, "assigning source partitions failed"),
                }
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                self.rebalance.revoking(tpl);
                let result = if cooperative {
                    consumer.incremental_unassign(tpl)
                } else {
                    consumer.unassign()
                };
                match result {
                    Ok(()) => info!(
                        partitions = tpl.count(),
                        topics = %topics_of(tpl),
                        "source partitions revoked"
                    ),
                    Err(e) => error!(error = %e, "revoking source partitions failed"),
                }
            }
            other => {
                error!(error = ?other, "rebalance error; unassigning");
                if let Ok(assigned) = consumer.assignment() {
                    self.rebalance.revoking(&assigned);
                }
                if let Err(e) = consumer.unassign() {
                    error!(error = %e, "unassign after a rebalance error failed");
                }
            }
        }
    }
}
