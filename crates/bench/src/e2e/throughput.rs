//! Throughput: the same records moved from one topic to another by a plain passthrough, by a
//! stored passthrough (the least any design that keeps every record durably adds) and by the
//! broker with `--sync` off and on, in interleaved rounds.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus::Registry;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::producer::{FutureProducer, FutureRecord};

use super::Throughput;
use crate::harness::{config, median, Kafka};
use crate::machine::{Span, Stopwatch};
use crate::BenchError;
use kafka_delay::app;
use kafka_delay::config::Config;
use kafka_delay::kafka;
use kafka_delay_core::clock::SystemClock;

/// The header of the table whose rows [`Kafka::throughput`] prints.
pub(super) fn print_header() {
    println!("| value | records x rounds | passthrough rec/s | stored passthrough rec/s (ratio) | kafka-delay rec/s | ratio | of the stored | kafka-delay --sync rec/s | sync / no sync | consume only rec/s | CPU us per record: passthrough / stored / kafka-delay | CPU steal %: passthrough / kafka-delay | machine busy %: passthrough / stored / kafka-delay |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
}

impl Kafka {
    /// `rounds` rounds of the four runs with `n` records of `size`-byte values (after an
    /// unmeasured warm-up passthrough when `warm_up`); prints each round on stderr and the row
    /// of medians on stdout.
    pub(super) async fn throughput(
        &self,
        size: usize,
        n: u64,
        rounds: usize,
        base_partitions: i32,
        warm_up: bool,
    ) -> Result<Throughput, BenchError> {
        // The embedded cluster keeps about 5 MB per partition: enough partitions for 2 MB each.
        let needed = (n * size.max(1) as u64).div_ceil(2_000_000);
        let partitions = base_partitions
            .max(1)
            .max(i32::try_from(needed).unwrap_or(i32::MAX));
        self.partitions.store(partitions, Ordering::Relaxed);
        // Rounds of the three runs, interleaved, so that a disturbance of the shared machine
        // hits one round rather than one side; the medians are reported.
        let mut rates: [Vec<f64>; 5] = Default::default();
        let mut stored_cpu = Vec::new();
        let mut cpu: [Vec<f64>; 2] = Default::default();
        let mut faults: [Vec<f64>; 2] = Default::default();
        let mut steal: [Vec<f64>; 2] = Default::default();
        let mut busy: [Vec<f64>; 3] = Default::default();
        if warm_up {
            // Unmeasured: the first run against a freshly started Kafka in its own process was
            // about 12% slower than the same run after it, and the passthrough runs first.
            let (warm, _) = self.passthrough("warm", n.min(100_000), size).await?;
            eprintln!(
                "warm-up passthrough: {:.0}/s (not counted)",
                n.min(100_000) as f64 / warm.wall.as_secs_f64()
            );
        }
        for r in 0..rounds.max(1) {
            let (pt, consume) = self.passthrough(&format!("{size}.{r}"), n, size).await?;
            let stored = self
                .stored_passthrough(&format!("{size}.{r}"), n, size)
                .await?;
            let off = self
                .through_broker(&format!("{size}.{r}a"), n, size, &[])
                .await?;
            let on = self
                .through_broker(&format!("{size}.{r}b"), n, size, &["--sync"])
                .await?;
            let round = [pt.wall, off.wall, on.wall, consume, stored.wall]
                .map(|d| n as f64 / d.as_secs_f64());
            let stored_us = stored.cpu.as_secs_f64() * 1e6 / n as f64;
            let us = [pt.cpu, off.cpu].map(|d| d.as_secs_f64() * 1e6 / n as f64);
            let per = [pt.faults, off.faults].map(|f| f as f64 / n as f64);
            let stolen = [pt.steal_percent, off.steal_percent];
            let busied = [pt.busy_percent, stored.busy_percent, off.busy_percent];
            eprintln!(
                "round {r}: passthrough {:.0}/s, stored passthrough {:.0}/s ({:.2}), \
                 kafka-delay {:.0}/s ({:.2}; {:.2} of the stored), --sync {:.0}/s; \
                 CPU per record {:.2} us / {:.2} us / {:.2} us; \
                 page faults per record {:.3} / {:.3}; CPU steal {:.1}% / {:.1}%; \
                 machine busy {:.0}% / {:.0}% / {:.0}%",
                round[0],
                round[4],
                round[4] / round[0],
                round[1],
                round[1] / round[0],
                round[1] / round[4],
                round[2],
                us[0],
                stored_us,
                us[1],
                per[0],
                per[1],
                stolen[0],
                stolen[1],
                busied[0],
                busied[1],
                busied[2]
            );
            for (all, rate) in rates.iter_mut().zip(round) {
                all.push(rate);
            }
            for (all, us) in cpu.iter_mut().zip(us) {
                all.push(us);
            }
            stored_cpu.push(stored_us);
            for (all, f) in faults.iter_mut().zip(per) {
                all.push(f);
            }
            for (all, f) in steal.iter_mut().zip(stolen) {
                all.push(f);
            }
            for (all, b) in busy.iter_mut().zip(busied) {
                all.push(b);
            }
        }
        let [pt, off, on, consume, stored] = rates.map(median);
        let cpu_us_per_record = cpu.map(median);
        let row = Throughput {
            value_bytes: size,
            records: n,
            rounds: rounds.max(1),
            passthrough_per_s: pt,
            stored_passthrough_per_s: stored,
            stored_passthrough_cpu_us_per_record: median(stored_cpu),
            broker_per_s: off,
            broker_sync_per_s: on,
            consume_only_per_s: consume,
            cpu_us_per_record,
            page_faults_per_record: faults.map(median),
            steal_percent: steal.map(median),
            machine_busy_percent: busy.map(median),
        };
        println!(
            "| {size} B | {n} x {} | {:.0} | {:.0} ({:.2}) | {:.0} | {:.2} | {:.2} | {:.0} | {:.2} | {:.0} | {:.2} / {:.2} / {:.2} | {:.1} / {:.1} | {:.0} / {:.0} / {:.0} |",
            row.rounds,
            row.passthrough_per_s,
            row.stored_passthrough_per_s,
            row.stored_passthrough_per_s / row.passthrough_per_s,
            row.broker_per_s,
            row.broker_per_s / row.passthrough_per_s,
            row.broker_per_s / row.stored_passthrough_per_s,
            row.broker_sync_per_s,
            row.broker_sync_per_s / row.broker_per_s,
            row.consume_only_per_s,
            cpu_us_per_record[0],
            row.stored_passthrough_cpu_us_per_record,
            cpu_us_per_record[1],
            row.steal_percent[0],
            row.steal_percent[1],
            row.machine_busy_percent[0],
            row.machine_busy_percent[1],
            row.machine_busy_percent[2]
        );
        Ok(row)
    }

    /// A source topic filled with `n` of the broker's input records (headers and all, carried
    /// through as they are), an empty target, and a consumer (ingest's settings, subscribed)
    /// and a producer (the broker's settings) to copy one to the other.
    async fn copying(&self, tag: &str, n: u64, size: usize) -> Result<Copying, BenchError> {
        let dir = tempfile::TempDir::new()?;
        let tag = format!("{tag}.{}", self.run);
        let (src, dst) = (format!("bench.{tag}"), format!("bench.{tag}.out"));
        let config = config(&self.brokers, dir.path(), &["--group-id", &tag])?;
        let producer = kafka::producer(&config)?;
        self.create(&src, &producer, &config).await;
        self.create(&dst, &producer, &config).await;
        self.fill_topic(&src, n, size, Some(&dst)).await?;
        let consumer: StreamConsumer = kafka_delay::ingest::consumer_config(&config).create()?;
        consumer.subscribe(&[&src])?;
        Ok(Copying {
            dir,
            src,
            dst,
            config,
            producer,
            consumer,
        })
    }

    /// Consume-and-produce of `n` records with the broker's client settings, each re-produced
    /// with its key, value and headers: the time from the first record consumed to the last one
    /// acknowledged.
    pub(super) async fn passthrough(
        &self,
        tag: &str,
        n: u64,
        size: usize,
    ) -> Result<(Span, Duration), BenchError> {
        let Copying {
            dir: _dir,
            src,
            dst,
            config,
            producer,
            consumer,
        } = self.copying(&format!("pt.{tag}"), n, size).await?;
        let window = config.fire.in_flight;
        let mut acks = std::collections::VecDeque::new();
        let mut started = None;
        for _ in 0..n {
            let m = consumer.recv().await?;
            started.get_or_insert_with(Stopwatch::start);
            let ack = producer
                .send_result(copy_to(&dst, &m))
                .map_err(|(e, _)| e)?;
            acks.push_back((ack, m.topic().to_owned(), m.partition(), m.offset()));
            if acks.len() >= window {
                let (ack, t, p, o) = acks.pop_front().expect("not empty");
                ack.await?.map_err(|(e, _)| e)?;
                consumer.store_offset(&t, p, o)?;
            }
        }
        for (ack, t, p, o) in acks {
            ack.await?.map_err(|(e, _)| e)?;
            consumer.store_offset(&t, p, o)?;
        }
        let took = started.unwrap_or_else(Stopwatch::start).stop();
        // Re-consuming the same records, nothing else: what rebuilding state from Kafka costs.
        let mut again_config = kafka_delay::ingest::consumer_config(&config);
        again_config.set("group.id", format!("pt-{tag}-again"));
        let again: StreamConsumer = again_config.create()?;
        again.subscribe(&[&src])?;
        let mut started = None;
        for _ in 0..n {
            again.recv().await?;
            started.get_or_insert_with(Instant::now);
        }
        let consume = started.map(|s| s.elapsed()).unwrap_or_default();
        Ok((took, consume))
    }

    /// The passthrough with the least a design that keeps every record durably until it is
    /// delivered must add: each group of records the consumer holds (as ingest takes them) is
    /// written to a plain RocksDB (the store's options for its records, the write-ahead log on,
    /// no fsync) before it is produced, and each record is deleted once acknowledged. The
    /// writes run on a blocking thread, one batch at a time, while the loop produces the group
    /// written before: a batch holds one group's records and the deletes of all those
    /// acknowledged since the batch before, so a delete never precedes its record. No read (the
    /// records are produced from the consumed copies), no index, no timer: the CPU any such
    /// design adds per record, and the rate it could reach where the machine's CPU is the bound.
    async fn stored_passthrough(&self, tag: &str, n: u64, size: usize) -> Result<Span, BenchError> {
        let Copying {
            dir,
            src: _,
            dst,
            config,
            producer,
            consumer,
        } = self.copying(&format!("spt.{tag}"), n, size).await?;
        let mut opts = rocksdb::Options::default();
        opts.create_if_missing(true);
        opts.set_max_background_jobs(2);
        opts.set_compression_type(rocksdb::DBCompressionType::Lz4);
        let db = Arc::new(rocksdb::DB::open(&opts, dir.path().join("floor"))?);
        let group_size = kafka_delay::durability::FREE_GROUP;
        let window = config.fire.in_flight;
        let mut acks = std::collections::VecDeque::new();
        let mut acked = rocksdb::WriteBatch::default();
        let mut started = None;
        let mut moved = 0u64;
        let mut value = Vec::new();
        let write = |db: &Arc<rocksdb::DB>, batch: rocksdb::WriteBatch| {
            let db = Arc::clone(db);
            tokio::task::spawn_blocking(move || db.write(batch))
        };
        // The group whose write is in flight: produced once it is stored (as the broker stores
        // a record before it fires it), while the next group's write runs.
        let mut writing = write(&db, rocksdb::WriteBatch::default());
        let mut stored_next = Vec::new();
        while moved < n || !stored_next.is_empty() {
            let mut group = Vec::new();
            if moved < n {
                group.push(consumer.recv().await?);
                started.get_or_insert_with(Stopwatch::start);
                while group.len() < group_size && moved + (group.len() as u64) < n {
                    match kafka_delay::ingest::ready_now(consumer.recv()) {
                        Some(m) => group.push(m?),
                        None => break,
                    }
                }
                moved += group.len() as u64;
            }
            writing.await??;
            let mut batch = std::mem::take(&mut acked);
            for m in &group {
                encode_floor_record(&mut value, &dst, m);
                batch.put(floor_key(m), &value);
            }
            writing = write(&db, batch);
            for m in std::mem::replace(&mut stored_next, group) {
                let ack = producer
                    .send_result(copy_to(&dst, &m))
                    .map_err(|(e, _)| e)?;
                acks.push_back((ack, m.topic().to_owned(), m.partition(), m.offset()));
                while acks.len() >= window {
                    let (ack, t, p, o) = acks.pop_front().expect("not empty");
                    ack.await?.map_err(|(e, _)| e)?;
                    consumer.store_offset(&t, p, o)?;
                    acked.delete(floor_key_of(p, o));
                }
            }
        }
        for (ack, t, p, o) in acks {
            ack.await?.map_err(|(e, _)| e)?;
            consumer.store_offset(&t, p, o)?;
            acked.delete(floor_key_of(p, o));
        }
        writing.await??;
        db.write(acked)?;
        let took = started.unwrap_or_else(Stopwatch::start).stop();
        let left = db.iterator(rocksdb::IteratorMode::Start).count();
        if left != 0 {
            return Err(format!("the stored passthrough left {left} records in RocksDB").into());
        }
        Ok(took)
    }

    /// The same through the broker, started with the flags `extra` besides the benchmark's:
    /// from the first record ingested to the last one delivered and deleted from RocksDB.
    /// A broker run's data directory, its source and target topics (named after `tag` and
    /// this run), and its config: a group of its own consuming that source, with `extra` and
    /// the benchmark's broker flags. Nothing is created yet.
    pub(super) fn broker_run(&self, tag: &str, extra: &[&str]) -> Result<BrokerRun, BenchError> {
        let dir = tempfile::TempDir::new()?;
        let tag = format!("{tag}.{}", self.run).replace('-', "_");
        let (src, dst) = (format!("delay.bench.{tag}"), format!("bench.out.{tag}"));
        let pattern = format!("^delay\\.bench\\.{tag}$");
        let group = format!("kd-{tag}");
        let mut flags = vec!["--source-pattern", &pattern, "--group-id", &group];
        flags.extend_from_slice(extra);
        flags.extend(self.broker_flags.iter().map(String::as_str));
        let config = config(&self.brokers, dir.path(), &flags)?;
        Ok(BrokerRun {
            dir,
            src,
            dst,
            config,
        })
    }

    pub(super) async fn through_broker(
        &self,
        tag: &str,
        n: u64,
        size: usize,
        extra: &[&str],
    ) -> Result<Span, BenchError> {
        let BrokerRun {
            dir: _dir,
            src,
            dst,
            config,
        } = self.broker_run(tag, extra)?;
        let producer = kafka::producer(&config)?;
        self.create(&src, &producer, &config).await;
        self.create(&dst, &producer, &config).await;
        self.create("bench.dlt", &producer, &config).await;
        self.fill_topic(&src, n, size, Some(&dst)).await?;
        let running = app::start(config, Arc::new(SystemClock), Registry::new()).await?;
        let ingested = running
            .metrics()
            .ingest
            .records
            .with_label_values(&[src.as_str()]);
        let fired = running
            .metrics()
            .fire
            .records
            .with_label_values(&[dst.as_str()]);
        let deadline = Instant::now() + Duration::from_secs(600);
        let mut started = None;
        loop {
            if started.is_none() && ingested.get() > 0 {
                started = Some(Stopwatch::start());
            }
            if fired.get() >= n && running.store().pending() == 0 {
                break;
            }

            if Instant::now() > deadline {
                return Err(format!("only {} of {n} delivered in 10 minutes", fired.get()).into());
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let took = started.unwrap_or_else(Stopwatch::start).stop();
        running.shutdown().await;
        Ok(took)
    }
}

/// What [`Kafka::broker_run`] sets up; the data directory lives as long as the run.
pub(super) struct BrokerRun {
    pub(super) dir: tempfile::TempDir,
    pub(super) src: String,
    pub(super) dst: String,
    pub(super) config: Config,
}

/// What a passthrough run copies with (`Kafka::copying`); the data directory lives as long as
/// the run.
struct Copying {
    dir: tempfile::TempDir,
    src: String,
    dst: String,
    config: Config,
    producer: FutureProducer,
    consumer: StreamConsumer,
}

/// `m` as a record for `dst`: its key, value and headers.
fn copy_to<'a>(dst: &'a str, m: &'a BorrowedMessage<'_>) -> FutureRecord<'a, [u8], [u8]> {
    let mut rec = FutureRecord::to(dst).payload(m.payload().unwrap_or_default());
    if let Some(k) = m.key() {
        rec = rec.key(k);
    }
    if let Some(h) = m.headers() {
        rec = rec.headers(h.detach());
    }
    rec
}

/// The stored passthrough's key of a record: its partition and offset, as the store's record
/// ids (one source topic per run).
fn floor_key_of(partition: i32, offset: i64) -> [u8; 8] {
    (((partition as u64) << 48) | (offset as u64 & ((1 << 48) - 1))).to_be_bytes()
}

fn floor_key<M: Message>(m: &M) -> [u8; 8] {
    floor_key_of(m.partition(), m.offset())
}

/// What the stored passthrough keeps of a record: everything needed to publish it again after
/// a restart (target, key, value, headers), each length-prefixed.
fn encode_floor_record<M: Message>(out: &mut Vec<u8>, target: &str, m: &M) {
    fn field(out: &mut Vec<u8>, bytes: &[u8]) {
        out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(bytes);
    }
    out.clear();
    field(out, target.as_bytes());
    field(out, m.key().unwrap_or_default());
    field(out, m.payload().unwrap_or_default());
    if let Some(headers) = m.headers() {
        for h in headers.iter() {
            field(out, h.key.as_bytes());
            field(out, h.value.unwrap_or_default());
        }
    }
}

#[cfg(test)]
mod tests {
    use rdkafka::message::{Header, OwnedHeaders, OwnedMessage, Timestamp};

    use super::{encode_floor_record, floor_key, floor_key_of};

    #[test]
    fn the_stored_passthrough_keeps_what_a_restart_needs_under_one_key_per_record() {
        let headers = OwnedHeaders::new().insert(Header {
            key: "delay-target",
            value: Some("out"),
        });
        let m = OwnedMessage::new(
            Some(b"value".to_vec()),
            Some(b"k".to_vec()),
            "src".into(),
            Timestamp::NotAvailable,
            3,
            42,
            Some(headers),
        );
        let mut out = vec![9; 4];
        encode_floor_record(&mut out, "dst", &m);
        let mut want = Vec::new();
        for field in [&b"dst"[..], b"k", b"value", b"delay-target", b"out"] {
            want.extend_from_slice(&(field.len() as u32).to_le_bytes());
            want.extend_from_slice(field);
        }
        assert_eq!(out, want);
        // Keys are distinct per partition and offset, and sort by them.
        assert_eq!(floor_key(&m), floor_key_of(3, 42));
        assert!(floor_key_of(3, 42) < floor_key_of(3, 43));
        assert!(floor_key_of(3, (1 << 48) - 1) < floor_key_of(4, 0));
        assert_ne!(floor_key_of(0, 42), floor_key_of(3, 42));
    }
}
