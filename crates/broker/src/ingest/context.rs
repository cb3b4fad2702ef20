//! Consumer callbacks: on assignment, each partition resumes from the offset stored in RocksDB
//! (the durable checkpoint), not from Kafka's committed offset, which may lag behind it.

use std::sync::Arc;

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::ClientContext;
use tracing::{error, info};

use crate::changelog::handoff::Handoff;
use crate::store::Store;

/// Context of the ingest consumer.
#[derive(Debug, Clone)]
pub struct IngestContext {
    /// Where stored offsets are read from.
    pub store: Arc<Store>,
    /// Consumer lag goes here, from librdkafka's statistics.
    pub metrics: crate::metrics::Metrics,
    /// With a changelog: restores assigned partitions and lets revoked ones go.
    pub handoff: Option<Arc<Handoff>>,
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

impl IngestContext {
    /// Sets every partition of `tpl` that has an offset in the store to start there; returns
    /// how many did.
    fn seed_offsets(&self, tpl: &mut TopicPartitionList) -> usize {
        let parts: Vec<(String, i32)> = tpl
            .elements()
            .iter()
            .map(|e| (e.topic().to_owned(), e.partition()))
            .collect();
        let mut seeded = 0;
        for (topic, partition) in parts {
            let Some(pid) = self.store.lookup_partition(&topic, partition) else {
                continue;
            };
            match self.store.next_offset(pid) {
                Ok(Some(offset)) => {
                    if tpl
                        .set_partition_offset(&topic, partition, Offset::Offset(offset))
                        .is_ok()
                    {
                        seeded += 1;
                    }
                }
                Ok(None) => {}
                Err(e) => error!(%topic, partition, error = %e, "cannot read the stored offset"),
            }
        }
        seeded
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
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS if self.handoff.is_some() => {
                let result = if cooperative {
                    consumer.incremental_assign(tpl)
                } else {
                    consumer.assign(tpl)
                };
                match result {
                    Ok(()) => {
                        info!(partitions = tpl.count(), topics = %topics_of(tpl),
                              "source partitions assigned; restoring them from the changelog");
                        if let Some(h) = &self.handoff {
                            h.on_assign(consumer, tpl);
                        }
                    }
                    Err(e) => error!(error = %e, "assigning source partitions failed"),
                }
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                let seeded = self.seed_offsets(tpl);
                let result = if cooperative {
                    consumer.incremental_assign(tpl)
                } else {
                    consumer.assign(tpl)
                };
                match result {
                    Ok(()) => info!(
                        partitions = tpl.count(),
                        resumed_from_store = seeded,
                        topics = %topics_of(tpl),
                        "source partitions assigned"
                    ),
                    Err(e) => error!(error = %e, "assigning source partitions failed"),
                }
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                if let Some(h) = &self.handoff {
                    h.on_revoke(tpl);
                }
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
                if let (Some(h), Ok(assigned)) = (&self.handoff, consumer.assignment()) {
                    h.on_revoke(&assigned);
                }
                if let Err(e) = consumer.unassign() {
                    error!(error = %e, "unassign after a rebalance error failed");
                }
            }
        }
    }
}
