//! The `kafka-delay` binary: parse flags, set up logging, run until SIGTERM/SIGINT.

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use kafka_delay::backoff::Backoff;
use kafka_delay::config::{Config, RunArgs};
use kafka_delay::kafka::Embedded;
use prometheus::Registry;
use tokio::signal::unix::{signal, SignalKind};

/// Every allocation of the process, librdkafka's and RocksDB's included, goes to jemalloc: they
/// allocate on one thread and free on another (a produced record is freed by librdkafka's
/// broker thread, a write batch by RocksDB's), which glibc's per-arena locks serve slowly.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// kafka-delay: delayed delivery and retries for Apache Kafka.
#[derive(Debug, Parser)]
#[command(name = "kafka-delay", version, about)]
struct Cli {
    /// What to do.
    #[command(subcommand)]
    command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
enum Command {
    /// Run the delay broker.
    Run(Box<RunArgs>),
    /// Run only an embedded Kafka-protocol cluster (librdkafka's mock cluster) until stopped.
    Sandbox(SandboxArgs),
    /// Move dead-lettered records back to a topic, rate-limited, resetting their retry count.
    Replay(kafka_delay::replay::ReplayArgs),
    /// Produce a known set of delayed records and report lost, duplicated, early and late ones.
    Verify(kafka_delay::verify::VerifyArgs),
    /// Print the ACLs kafka-delay's principal needs with the `run` flags given (kafka-acls
    /// lines or JSON), on a cluster with an authorizer.
    Acls(kafka_delay::config::acls::AclsArgs),
}

/// Flags of `kafka-delay sandbox`.
#[derive(Debug, Args)]
struct SandboxArgs {
    /// Number of brokers in the embedded cluster.
    #[arg(long, env = "KAFKA_DELAY_SANDBOX_BROKERS", default_value_t = 1)]
    brokers: i32,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => {
            let config = match args.validate() {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("kafka-delay: {e}");
                    return ExitCode::from(2);
                }
            };
            init_logging(config.log_json);
            exit(runtime().and_then(|rt| rt.block_on(run(config))))
        }
        Command::Replay(args) => {
            let replay = match args.validate() {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("kafka-delay: {e}");
                    return ExitCode::from(2);
                }
            };
            init_logging(false);
            match runtime().and_then(|rt| rt.block_on(replay_cmd(replay))) {
                Ok(s) if s.failed == 0 => ExitCode::SUCCESS,
                Ok(_) => ExitCode::FAILURE,
                Err(e) => {
                    eprintln!("kafka-delay: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Verify(args) => {
            init_logging(false);
            let result = runtime().and_then(|rt| {
                rt.block_on(kafka_delay::verify::run(&args))
                    .map_err(anyhow::Error::from)
            });
            match result {
                Ok(report) => {
                    if args.json {
                        println!("{}", serde_json::to_string(&report).unwrap_or_default());
                    } else {
                        println!("{report}");
                    }
                    if report.passed(args.max_duplicates) {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::FAILURE
                    }
                }
                Err(e) => {
                    eprintln!("kafka-delay: {e:#}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Acls(args) => acls_cmd(&args),
        Command::Sandbox(args) => {
            init_logging(false);
            exit(runtime().and_then(|rt| rt.block_on(sandbox(args.brokers))))
        }
    }
}

/// Prints the ACLs of `kafka-delay acls`; a configuration no ACL can state fails saying why.
fn acls_cmd(args: &kafka_delay::config::acls::AclsArgs) -> ExitCode {
    use kafka_delay::config::acls::{acls, kafka_acls_lines, Format};
    let rules = match args
        .run
        .validate()
        .map_err(|e| e.to_string())
        .and_then(|config| {
            acls(&config)
                .map(|rules| (config.kafka.brokers.clone(), rules))
                .map_err(|e| e.to_string())
        }) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("kafka-delay: {e}");
            return ExitCode::from(2);
        }
    };
    let (brokers, rules) = rules;
    match args.format {
        Format::KafkaAcls => print!(
            "{}",
            kafka_acls_lines(&rules, &args.principal, &brokers, &args.command_config)
        ),
        Format::Json => println!(
            "{}",
            serde_json::to_string_pretty(&rules).unwrap_or_default()
        ),
    }
    ExitCode::SUCCESS
}

fn exit(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("kafka-delay: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs a replay with a progress line on stderr each second and the summary on stdout.
async fn replay_cmd(
    replay: kafka_delay::replay::Replay,
) -> anyhow::Result<kafka_delay::replay::Summary> {
    let started = Instant::now();
    let verb = if replay.dry_run {
        "would move"
    } else {
        "moved"
    };
    let summary = kafka_delay::replay::run(&replay, |s| {
        eprintln!(
            "replay {} -> {}: read {}/{}, {verb} {}, skipped {}, failed {}",
            replay.from, replay.to, s.read, s.total, s.moved, s.skipped, s.failed
        );
    })
    .await?;
    println!(
        "{}{verb} {}, skipped {}, failed {} (read {} of {} in '{}') in {:.1}s",
        if replay.dry_run { "dry run: " } else { "" },
        summary.moved,
        summary.skipped,
        summary.failed,
        summary.read,
        summary.total,
        replay.from,
        started.elapsed().as_secs_f64()
    );
    Ok(summary)
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

fn init_logging(json: bool) {
    let filter =
        tracing_subscriber::EnvFilter::try_from_env("KAFKA_DELAY_LOG").unwrap_or_else(|_| {
            tracing_subscriber::EnvFilter::new("info,librdkafka=warn,rdkafka=warn")
        });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// Prints the one line tools wait for, and flushes it.
fn announce(bootstrap: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "bootstrap.servers={bootstrap}")?;
    out.flush()?;
    Ok(())
}

/// A future that ends at the first SIGTERM or SIGINT; the handlers are installed at once, so
/// a signal that comes while the instance starts (again) is not missed.
fn stop_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = int.recv() => tracing::info!("SIGINT received"),
        }
    })
}

fn start_embedded(config: &mut Config) -> anyhow::Result<Embedded> {
    let embedded = Embedded::start(1)?;
    embedded.create_topic(&config.topics.dead_letter, config.topics.partitions)?;
    if let Some(retry) = &config.topics.retry {
        embedded.create_topic(retry, config.topics.partitions)?;
    }
    config.kafka.brokers = embedded.bootstrap_servers();
    Ok(embedded)
}

/// How long an instance restarting in place tries to start again before it exits with the
/// last error (for a supervisor to restart it).
const RESTART_FOR: Duration = Duration::from_secs(300);

/// Runs the broker until SIGTERM or SIGINT. When its Kafka consumer fails for good (a fatal
/// librdkafka error, such as a static member fenced after a long coordinator outage), the
/// instance stops as for a SIGTERM and starts again with the same data directory: the same
/// as a supervisor restarting it, without waiting for one. Such a restart meets the trouble
/// that broke the consumer (a broker cut off, a coordinator moving): a start that fails then
/// is tried again, with pauses from 1 s up to 30 s, for [`RESTART_FOR`]. A first start that
/// fails exits at once, with what to fix.
async fn run(mut config: Config) -> anyhow::Result<()> {
    let embedded = if config.kafka.embedded {
        Some(start_embedded(&mut config)?)
    } else {
        None
    };
    let mut stop = std::pin::pin!(stop_signal()?);
    let mut announced = false;
    let clock = kafka_delay::failpoint::wall_clock();
    // After a restart in place: when it began, and the pauses between its attempts.
    let mut restarting: Option<(Instant, Backoff)> = None;
    loop {
        let started = if restarting.is_some() && kafka_delay::failpoint::fail_restart() {
            Err(anyhow::anyhow!("failpoint: this start in place fails"))
        } else {
            let start = kafka_delay::app::start(config.clone(), clock.clone(), Registry::new());
            tokio::select! {
                r = start => r.map_err(anyhow::Error::from),
                () = &mut stop => return Ok(()),
            }
        };
        let running = match (started, &mut restarting) {
            (Ok(running), _) => running,
            (Err(e), Some((began, pauses))) if began.elapsed() < RESTART_FOR => {
                let pause = pauses.next_pause();
                tracing::warn!(
                    error = format!("{e:#}"),
                    retry_in_ms = u64::try_from(pause.as_millis()).unwrap_or(u64::MAX),
                    "the instance did not start again in place; trying again"
                );
                tokio::select! {
                    () = tokio::time::sleep(pause) => continue,
                    () = &mut stop => return Ok(()),
                }
            }
            (Err(e), _) => return Err(e),
        };
        if let (Some(e), false) = (&embedded, announced) {
            announce(&e.bootstrap_servers())?;
            announced = true;
        }
        tokio::select! {
            () = &mut stop => {
                running.shutdown().await;
                break;
            }
            broken = running.broken() => {
                tracing::error!(reason = %broken,
                    "the Kafka consumer cannot go on; stopping and starting this instance again");
                let pauses = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
                restarting = Some((Instant::now(), pauses));
                if !running.shutdown().await {
                    anyhow::bail!(
                        "the Kafka consumer failed ({broken}) and RocksDB could not be closed \
                         for a restart in place; exiting so that a supervisor starts the \
                         instance again"
                    );
                }
            }
        }
    }
    drop(embedded);
    Ok(())
}

async fn sandbox(brokers: i32) -> anyhow::Result<()> {
    if brokers < 1 {
        anyhow::bail!("--brokers must be at least 1");
    }
    let embedded = Embedded::start(brokers)?;
    embedded.create_topic("delay-dead-letter", 1)?;
    tracing::info!(bootstrap = %embedded.bootstrap_servers(), "sandbox cluster running");
    announce(&embedded.bootstrap_servers())?;
    stop_signal()?.await;
    drop(embedded);
    Ok(())
}
