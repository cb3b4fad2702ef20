//! `kafka-delay-bench instances`: 1, 2 and 3 broker processes of one group (`--changelog`)
//! sharing twelve partitions on the same Kafka, each count in a run of its own: records
//! produced due 20 s later (ingested meanwhile), timed from the first due time to the last
//! record on the target: firing through the group.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use serde::Serialize;

use super::harness::{config, Kafka};
use super::recovery::Broker;
use super::BenchError;

/// Flags of `kafka-delay-bench instances`.
#[derive(Debug, clap::Args)]
pub struct InstancesArgs {
    /// Apache Kafka's bootstrap servers.
    #[arg(long)]
    pub brokers: String,
    /// Records per run, each due 20 s after it is produced.
    #[arg(long, default_value_t = 600_000)]
    pub records: u64,
    /// Instance counts to run, in order.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3,1")]
    pub counts: Vec<usize>,
    /// Where to write the results as JSON.
    #[arg(long, default_value = "bench-instances.json")]
    pub json: PathBuf,
}

/// One run's figures.
#[derive(Debug, Serialize)]
pub struct Run {
    /// Broker processes in the group.
    pub instances: usize,
    /// Seconds from the first due time to the last record on the target.
    pub seconds: f64,
    /// Records per second through the group.
    pub records_per_s: f64,
}

const PARTITIONS: i32 = 12;
/// How long after it is produced each record is due.
const LEAD: Duration = Duration::from_secs(20);

/// Runs each count and prints the table.
///
/// # Errors
/// Kafka, or a broker that does not start.
pub async fn run_instances(args: &InstancesArgs) -> Result<Vec<Run>, BenchError> {
    let kafka = Kafka::connect(Some(&args.brokers), PARTITIONS, &[])?;
    let work = tempfile::TempDir::new()?;
    let mut runs = Vec::new();
    for (i, &n) in args.counts.iter().enumerate() {
        let (name, source, target) = topics(&kafka, work.path(), "inst", i).await?;
        let group = format!("bench-inst-{name}");
        let pattern = format!("^{}$", source.replace('.', "\\."));
        let mut brokers = Vec::new();
        for k in 0..n {
            let dir = work.path().join(format!("{name}-{k}"));
            let id = format!("{name}-{k}");
            let flags = [
                "--changelog",
                "--changelog-replication",
                "1",
                "--instance-id",
                &id,
            ];
            let b = Broker::spawn(&args.brokers, &dir, work.path(), (&group, &pattern), &flags)?;
            b.ready(Duration::from_secs(120)).await?;
            brokers.push(b);
        }
        wait_shared(&brokers).await?;
        let first_due = Instant::now() + LEAD;
        let after = format!("{}s", LEAD.as_secs());
        kafka
            .fill_topic_due(&source, args.records, 100, Some(&target), &after)
            .await?;
        if Instant::now() > first_due {
            return Err("producing took longer than the lead; give fewer --records".into());
        }
        wait_delivered(&args.brokers, &target, args.records).await?;
        let seconds = first_due.elapsed().as_secs_f64();
        drop(brokers);
        runs.push(Run {
            instances: n,
            seconds,
            records_per_s: args.records as f64 / seconds,
        });
    }
    println!("| instances | seconds | records/s |");
    println!("|---|---|---|");
    for r in &runs {
        println!(
            "| {} | {:.2} | {:.0} |",
            r.instances, r.seconds, r.records_per_s
        );
    }
    Ok(runs)
}

/// The run's name and its source and target topics (`kind` names the benchmark), created.
pub(super) async fn topics(
    kafka: &Kafka,
    work: &std::path::Path,
    kind: &str,
    i: usize,
) -> Result<(String, String, String), BenchError> {
    let name = format!("{}_{i}", kafka.run.replace('-', "_"));
    let (source, target) = (
        format!("delay.bench.{kind}.{name}"),
        format!("bench.{kind}.out.{name}"),
    );
    let probe = config(&kafka.brokers, work, &[])?;
    let producer = kafka_delay::kafka::producer(&probe)?;
    for t in [&source, &target, &"bench.dlt".to_owned()] {
        kafka.create(t, &producer, &probe).await;
    }
    Ok((name, source, target))
}

/// Waits until every broker owns some partitions and all twelve are owned.
async fn wait_shared(brokers: &[Broker]) -> Result<(), BenchError> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let owned: Vec<u64> = brokers
            .iter()
            .map(|b| b.gauge("kafka_delay_partitions_owned"))
            .collect();
        if owned.iter().all(|o| *o > 0) && owned.iter().sum::<u64>() == PARTITIONS as u64 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("partitions owned {owned:?} after 120 s").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until `target` holds `n` records (its high watermarks).
async fn wait_delivered(brokers: &str, target: &str, n: u64) -> Result<(), BenchError> {
    let watcher: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()?;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let written: i64 = (0..PARTITIONS)
            .filter_map(|p| {
                watcher
                    .fetch_watermarks(target, p, Duration::from_secs(5))
                    .ok()
            })
            .map(|(_, high)| high)
            .sum();
        if written as u64 >= n {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("{written} of {n} delivered after 600 s").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
