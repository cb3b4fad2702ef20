//! Records already due when they are ingested fire with their group, never stored here: it
//! costs Kafka one record, where a record that waits costs three (its changelog entry, then
//! its target record and its tombstone), and RocksDB and the wheel nothing.
//!
//! - Exactly once: each fires in the transaction that commits its ingest group, its target
//!   record beside the group's changelog entries and source offsets. The transaction that
//!   publishes it is the one that consumes it, so a crash before the commit leaves nothing
//!   visible and the record is consumed again, and after it nothing is left to fire.
//! - At least once, with the changelog: each is handed to the producer at once
//!   ([`AtIngest::send`]), and the group's source offsets reach the changelog only once every
//!   one of them is acknowledged. A crash before that consumes the group again: a record may
//!   fire twice, never not at all.
//!
//! A record its target refuses (an unknown topic, a record too large, a topic the authorizer
//! refuses) is stored after all and fires through the wheel, where a failure is retried and
//! dead-lettered as for any record. With fire limits set, nothing fires at ingest (every
//! record passes the limiter).

mod reports;

pub(in crate::durability) use reports::FireProducer;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::{BaseRecord, Producer};
use tracing::warn;

use super::{Context, DurabilityError};
use crate::config::Config;
use crate::ingest::{Last, Sending};
use crate::kafka::KafkaSetupError;
use crate::metrics::Metrics;
use crate::publish::history::History;
use crate::publish::{observe_delivery, provenance};
use crate::store::{Applied, IngestOp, Store};
use crate::txn::Out;
use kafka_delay_core::clock::Clock;
use kafka_delay_core::id::RecordId;
use kafka_delay_core::record::StoredRecord;
use reports::{Counted, Place, Reports};

/// What firing at ingest needs: whether it is on, and where a fire is counted.
#[derive(Clone)]
pub(in crate::durability) struct AtIngest {
    /// Off with fire limits, or `--no-fire-at-ingest`.
    pub(in crate::durability) on: bool,
    pub(in crate::durability) clock: Arc<dyn Clock>,
    pub(in crate::durability) metrics: Metrics,
    pub(in crate::durability) history: History,
}

impl std::fmt::Debug for AtIngest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AtIngest")
            .field("on", &self.on)
            .finish_non_exhaustive()
    }
}

/// A group's records that fire with it: the ones its target refused are stored after all.
#[derive(Debug, Default)]
pub(in crate::durability) struct Firing {
    /// The places in the group's operations of the records stored after all.
    stored: HashSet<usize>,
    /// Their store operations, their source timestamps, and what storing them did.
    pub(in crate::durability) ops: Vec<IngestOp>,
    pub(in crate::durability) stamps: Vec<Option<u64>>,
    pub(in crate::durability) applied: Applied,
}

impl Firing {
    /// The records of `ops` that fire with the group: their place in `ops`, their id and the
    /// record, in the partitions of `last` only.
    pub(in crate::durability) fn firing<'o>(
        &'o self,
        ops: &'o [IngestOp],
        last: &'o Last<'_>,
    ) -> impl Iterator<Item = (usize, RecordId, &'o StoredRecord)> + 'o {
        due_at_ingest(ops)
            .filter(move |(i, id, _)| !self.stored.contains(i) && last.contains_key(&id.pid()))
    }

    /// Adds the records stored after all, and what storing them did, to the group's.
    pub(in crate::durability) fn into_group(self, applied: &mut Applied) {
        applied.inserted.extend(self.applied.inserted);
        applied.replaced += self.applied.replaced;
    }

    /// Stores the records at `places` in `ops` after all (their target refused them), to fire
    /// through the wheel.
    ///
    /// # Errors
    /// RocksDB refused the write (why); nothing was stored.
    pub(in crate::durability) async fn store(
        &mut self,
        store: &Arc<Store>,
        (ops, stamps): (&[IngestOp], &[Option<u64>]),
        places: &[usize],
        now_ms: u64,
    ) -> Result<(), String> {
        let mut scheduled = Vec::with_capacity(places.len());
        for &i in places {
            if let Some(IngestOp::Fire {
                pid,
                offset,
                record,
            }) = ops.get(i)
            {
                scheduled.push(IngestOp::Schedule {
                    pid: *pid,
                    offset: *offset,
                    schedule: record.clone(),
                });
            }
        }
        let batch = Arc::new(scheduled);
        let (s, b) = (store.clone(), batch.clone());
        let applied = match tokio::task::spawn_blocking(move || s.apply(&b, now_ms)).await {
            Ok(r) => r.map_err(|e| e.to_string())?,
            Err(e) => return Err(format!("store write task: {e}")),
        };
        self.stored.extend(places);
        self.stamps
            .extend(places.iter().map(|&i| stamps.get(i).copied().flatten()));
        self.ops.extend(batch.iter().cloned());
        self.applied.inserted.extend(applied.inserted);
        self.applied.replaced += applied.replaced;
        self.applied.removed.extend(applied.removed);
        Ok(())
    }
}

impl AtIngest {
    /// On unless `config` sets fire limits or `--no-fire-at-ingest`; fires counted in
    /// `metrics` and the console's history.
    pub(in crate::durability) fn new(config: &Config, cx: &Context, metrics: &Metrics) -> Self {
        Self {
            on: config.fire.at_ingest && config.fire.limits.is_empty(),
            clock: cx.clock.clone(),
            metrics: metrics.clone(),
            history: cx.history.clone(),
        }
    }

    /// The target record of a record that fires now.
    pub(in crate::durability) fn out(
        &self,
        store: &Store,
        id: RecordId,
        record: &StoredRecord,
        at: u64,
    ) -> Out {
        Out {
            topic: record.target().to_owned(),
            partition: None,
            key: record.key().map(<[u8]>::to_vec),
            value: record.value().map(<[u8]>::to_vec),
            headers: Some(provenance(store, id, record, at)),
        }
    }

    /// Counts records that reached their target (acknowledged, or in a transaction that
    /// committed): handed to Kafka at `sent_ms`.
    pub(in crate::durability) fn fired<'r>(
        &self,
        fired: impl IntoIterator<Item = (RecordId, &'r StoredRecord)>,
        sent_ms: u64,
    ) {
        let now = self.clock.now_ms();
        let mut targets = Vec::new();
        let mut shown = Vec::new();
        for (id, record) in fired {
            targets.push(record.target());
            shown.push(observe_delivery(
                &self.metrics,
                (id, record),
                (record.due_ms(), sent_ms, now),
            ));
        }
        crate::metrics::count_each(&self.metrics.fire.records, targets);
        self.history.extend(shown);
    }

    /// The wall clock, epoch ms.
    pub(in crate::durability) fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }
}

/// The records of `ops` that fire with their group: their place in `ops`, their id and the
/// record.
fn due_at_ingest(ops: &[IngestOp]) -> impl Iterator<Item = (usize, RecordId, &StoredRecord)> {
    ops.iter().enumerate().filter_map(|(i, op)| match op {
        IngestOp::Fire {
            pid,
            offset,
            record,
        } => Some((i, RecordId::new(*pid, *offset)?, record)),
        _ => None,
    })
}

impl AtIngest {
    /// Hands the target records of the group's records due at ingest (`ops`, in the
    /// partitions of `last`) to `producer` at once, for a mode that fires them at least once:
    /// the task that waits for their acknowledgements, counts the records delivered, and ends
    /// with the places in `ops` of those their target refused. `None`: none is due.
    pub(in crate::durability) async fn send(
        &self,
        (producer, store): (&FireProducer, &Store),
        ops: &Arc<Vec<IngestOp>>,
        last: &Last<'_>,
    ) -> Option<Sending> {
        let sent_ms = self.clock.now_ms();
        let reports = Reports::new();
        let mut handed = Vec::new();
        let mut refused = Vec::new();
        for (place, id, record) in due_at_ingest(ops) {
            if !last.contains_key(&id.pid()) {
                continue;
            }
            reports.handing();
            let headers = provenance(store, id, record, sent_ms);
            match produce(producer, record, headers, Place::new(&reports, place)).await {
                Ok(()) => handed.push((place, id)),
                Err(e) => {
                    reports.not_taken();
                    refused_at_ingest(&e);
                    refused.push(place);
                }
            }
        }
        if handed.is_empty() && refused.is_empty() {
            return None;
        }
        reports.all_handed();
        let (at, ops) = (self.clone(), ops.clone());
        Some(tokio::spawn(async move {
            let not_delivered = reports.settled().await;
            let delivered = handed
                .iter()
                .filter(|(place, _)| !not_delivered.contains(place))
                .filter_map(|&(place, id)| match ops.get(place) {
                    Some(IngestOp::Fire { record, .. }) => Some((id, record)),
                    _ => None,
                });
            at.fired(delivered, sent_ms);
            refused.extend(not_delivered);
            refused
        }))
    }
}

/// Says why a record due at ingest was not delivered.
pub(in crate::durability) fn refused_at_ingest(e: &KafkaError) {
    warn!(error = %e, "a record due at ingest was refused by its target; it fires through the \
          wheel, retried and dead-lettered as any record");
}

/// Hands `record`'s target record, with `headers`, to `producer` (borrowing its key and
/// value), waiting while the producer's queue is full; its report goes to `place`.
async fn produce(
    producer: &FireProducer,
    record: &StoredRecord,
    headers: OwnedHeaders,
    place: Box<Place>,
) -> Result<(), KafkaError> {
    let mut held = Some((headers, place));
    loop {
        let Some((headers, place)) = held.take() else {
            return Err(KafkaError::Canceled);
        };
        let mut r = BaseRecord::<[u8], [u8], Box<Place>>::with_opaque_to(record.target(), place)
            .headers(headers);
        if let Some(k) = record.key() {
            r = r.key(k);
        }
        if let Some(v) = record.value() {
            r = r.payload(v);
        }
        match producer.send(r) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                held = r.headers.map(|h| (h, r.delivery_opaque));
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err((e, _)) => return Err(e),
        }
    }
}

/// The producer of the records that fire at ingest, with its producer id: a backlog of
/// records due at start fires through it at once.
pub(in crate::durability) async fn producer(
    config: &Config,
) -> Result<Arc<FireProducer>, DurabilityError> {
    let producer: FireProducer = crate::kafka::producer_config(config)
        .create_with_context(Counted)
        .map_err(|source| KafkaSetupError::Client {
            client: "producer",
            source,
        })?;
    let (producer, topic) = (Arc::new(producer), config.topics.dead_letter.clone());
    let p = producer.clone();
    let _ = tokio::task::spawn_blocking(move || {
        crate::kafka::request_producer_id(p.client(), &topic);
    })
    .await;
    Ok(producer)
}
