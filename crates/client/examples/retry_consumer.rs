//! An application consumer that retries through kafka-delay instead of blocking its partition.
//!
//! It consumes `--topic`, "processes" each record, and fails on purpose every record whose key
//! ends in a digit below `--fail-below` until its third retry (a flaky downstream). A failed
//! record is handed back through the retry topic with the client helper; kafka-delay brings it
//! back after `retry-after` (or the target's backoff), counting attempts, and dead-letters it
//! to `<topic>.dlt` when the attempts run out. The partition keeps flowing meanwhile.
//!
//! ```text
//! kafka-delay run --embedded-kafka &          # prints bootstrap.servers=127.0.0.1:PORT
//! cargo run --example retry_consumer -- --brokers 127.0.0.1:PORT --topic orders
//! printf 'order-1:hello\norder-2:world\n' | kcat -b 127.0.0.1:PORT -P -t orders -K:
//! ```

use std::time::Duration;

use clap::Parser;
use kafka_delay_client::{self as client, DelayedRecord};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::producer::FutureProducer;

#[derive(Debug, Parser)]
struct Args {
    /// Kafka bootstrap servers.
    #[arg(long)]
    brokers: String,
    /// Topic to process.
    #[arg(long)]
    topic: String,
    /// Retry topic kafka-delay consumes.
    #[arg(long, default_value = "delay.retry")]
    retry_topic: String,
    /// Keys ending in a digit below this fail until their third retry.
    #[arg(long, default_value_t = 5)]
    fail_below: u32,
    /// Wait before each retry; 0 leaves it to the target's backoff policy.
    #[arg(long, default_value_t = 2)]
    retry_after_secs: u64,
    /// Stop after this many seconds (0: run until killed).
    #[arg(long, default_value_t = 0)]
    run_for_secs: u64,
}

/// The "downstream call": fails for some keys until the record has been retried 3 times.
fn process(key: &str, attempt: u32, fail_below: u32) -> Result<(), &'static str> {
    let digit = key.chars().last().and_then(|c| c.to_digit(10)).unwrap_or(9);
    if digit < fail_below && attempt < 3 {
        Err("downstream unavailable")
    } else {
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", &args.brokers)
        .set("group.id", format!("{}-app", args.topic))
        .set("auto.offset.reset", "earliest")
        .create()?;
    consumer.subscribe(&[&args.topic])?;
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &args.brokers)
        .set("enable.idempotence", "true")
        .create()?;
    let deadline = (args.run_for_secs > 0)
        .then(|| tokio::time::Instant::now() + Duration::from_secs(args.run_for_secs));
    loop {
        let msg = match deadline {
            Some(d) => match tokio::time::timeout_at(d, consumer.recv()).await {
                Ok(m) => m?,
                Err(_) => return Ok(()),
            },
            None => consumer.recv().await?,
        };
        let key = String::from_utf8_lossy(msg.key().unwrap_or_default()).into_owned();
        let attempt = client::attempt(&msg);
        match process(&key, attempt, args.fail_below) {
            Ok(()) => println!("processed {key} (attempt {attempt})"),
            Err(why) => {
                let mut retry = DelayedRecord::retry(&msg, args.retry_topic.as_str()).reason(why);
                if args.retry_after_secs > 0 {
                    retry = retry.retry_after(Duration::from_secs(args.retry_after_secs));
                }
                producer
                    .send(retry.record(), Duration::from_secs(10))
                    .await
                    .map_err(|(e, _)| e)?;
                println!("failed {key} (attempt {attempt}): {why}; retry scheduled");
            }
        }
    }
}
