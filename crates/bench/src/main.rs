//! `kafka-delay-bench`: the figures of BENCHMARKS.md. Build it with the broker
//! (`cargo build --release -p kafka-delay -p kafka-delay-bench`): the benchmarks that time a
//! broker process start the `kafka-delay` binary found next to this one.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;
use kafka_delay_bench::BenchCommand;

/// The broker's allocator, so that the brokers a benchmark runs in this process allocate as
/// the `kafka-delay` binary does.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The benchmarks that need a whole broker, a store or a Kafka cluster (see BENCHMARKS.md).
#[derive(Debug, Parser)]
#[command(name = "kafka-delay-bench", version)]
struct Cli {
    #[command(subcommand)]
    what: BenchCommand,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("KAFKA_DELAY_LOG").unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new("info,librdkafka=warn,rdkafka=warn")
            }),
        )
        .with_writer(std::io::stderr)
        .init();
    match kafka_delay_bench::run(&cli.what) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kafka-delay-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
