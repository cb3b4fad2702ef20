//! `kafka-delay-bench modes`: every durability mode against the same plain passthrough, on one
//! Kafka, in interleaved rounds. Each round moves the same number of records (due at once)
//! through the passthrough and then through the broker once per mode, each on topics and a
//! group of its own; the ratios are of the medians, with each round's own beside them.

use std::path::PathBuf;

use clap::Args;

use crate::harness::{median, Kafka};
use crate::BenchError;

/// Flags of `kafka-delay-bench modes`.
#[derive(Debug, Args)]
pub struct ModesArgs {
    /// Kafka bootstrap servers; without it an embedded cluster (librdkafka's mock), which
    /// keeps no compacted topics and runs no transactions: only `--modes local` runs there.
    #[arg(long)]
    pub brokers: Option<String>,
    /// Records per run.
    #[arg(long, default_value_t = 400_000)]
    pub records: u64,
    /// Value sizes to measure, bytes, comma-separated.
    #[arg(long, default_value = "100,1024")]
    pub value_bytes: String,
    /// Partitions of every topic.
    #[arg(long, default_value_t = 32)]
    pub partitions: i32,
    /// Rounds (medians are reported).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// The modes to run, in this order in every round, comma-separated: `local`
    /// (`--no-changelog`), `changelog` (the default on such a cluster), `changelog-unlingered`
    /// (`--changelog-linger 0s --no-fire-at-ingest`: every record stored and written to the
    /// changelog, as records due later than the linger are), `changelog-copied` (the same with
    /// `--changelog-copy-values`), `exactly-once`.
    #[arg(
        long,
        default_value = "local,changelog,changelog-unlingered,exactly-once"
    )]
    pub modes: String,
    /// Where to write the results as JSON.
    #[arg(long, default_value = "bench-modes.json")]
    pub json: PathBuf,
    /// Another flag for the broker in every mode (repeatable), e.g.
    /// `--broker-flag=--transaction-records=2048`.
    #[arg(long = "broker-flag", allow_hyphen_values = true)]
    pub broker_flags: Vec<String>,
}

/// A durability mode, as the flags that pick it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// `--no-changelog`: RocksDB on this disk only.
    Local,
    /// `--changelog`: RocksDB and the compacted changelog topic.
    Changelog,
    /// `--changelog --changelog-linger 0s --no-fire-at-ingest`: every record stored, its
    /// entry written before it can fire and its tombstone after (what a record due after the
    /// linger costs).
    ChangelogUnlingered,
    /// The same with `--changelog-copy-values`: every value copied into the changelog (no
    /// pointers to the source).
    ChangelogCopied,
    /// `--exactly-once`: the changelog, and firing in Kafka transactions.
    ExactlyOnce,
}

impl Mode {
    pub(super) fn parse(name: &str) -> Result<Self, BenchError> {
        match name.trim() {
            "local" => Ok(Self::Local),
            "changelog" => Ok(Self::Changelog),
            "changelog-unlingered" => Ok(Self::ChangelogUnlingered),
            "changelog-copied" => Ok(Self::ChangelogCopied),
            "exactly-once" => Ok(Self::ExactlyOnce),
            other => Err(format!(
                "--modes: unknown mode {other:?} (local, changelog, changelog-unlingered, \
                 changelog-copied, exactly-once)"
            )
            .into()),
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Self::Local => "local",
            Self::Changelog => "changelog",
            Self::ChangelogUnlingered => "changelog-unlingered",
            Self::ChangelogCopied => "changelog-copied",
            Self::ExactlyOnce => "exactly-once",
        }
    }

    /// The `run` flags of the mode. Exactly-once needs an instance id that stays the same
    /// across restarts; every run here is a group of its own, so one name serves.
    pub(super) fn flags(self) -> &'static [&'static str] {
        match self {
            Self::Local => &["--no-changelog"],
            Self::Changelog => &["--changelog"],
            Self::ChangelogUnlingered => &[
                "--changelog",
                "--changelog-linger",
                "0s",
                "--no-fire-at-ingest",
            ],
            Self::ChangelogCopied => &[
                "--changelog",
                "--changelog-linger",
                "0s",
                "--no-fire-at-ingest",
                "--changelog-copy-values",
            ],
            Self::ExactlyOnce => &["--exactly-once", "--instance-id", "bench"],
        }
    }
}

/// One mode's figures at one value size.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ModeFigures {
    /// The mode.
    pub mode: Mode,
    /// Records per second, median of the rounds.
    pub per_s: f64,
    /// `per_s` over the passthrough's median.
    pub of_passthrough: f64,
    /// Each round's rate over the same round's passthrough.
    pub rounds_of_passthrough: Vec<f64>,
    /// CPU time of this process per record moved, microseconds, median of the rounds.
    pub cpu_us_per_record: f64,
}

/// One value size: the passthrough and every mode.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ModesRow {
    /// Value size, bytes.
    pub value_bytes: usize,
    /// Records per run.
    pub records: u64,
    /// Rounds.
    pub rounds: usize,
    /// Passthrough records per second, median.
    pub passthrough_per_s: f64,
    /// Passthrough CPU time per record, microseconds, median.
    pub passthrough_cpu_us_per_record: f64,
    /// The modes, in the order run.
    pub modes: Vec<ModeFigures>,
}

/// Runs the rounds for every value size and prints the table on stdout.
///
/// # Errors
/// A bad flag, Kafka or RocksDB.
pub async fn run_modes(args: &ModesArgs) -> Result<Vec<ModesRow>, BenchError> {
    let sizes = super::value_sizes(&args.value_bytes)?;
    let modes: Vec<Mode> = args
        .modes
        .split(',')
        .map(Mode::parse)
        .collect::<Result<_, _>>()?;
    let kafka = Kafka::connect(args.brokers.as_deref(), args.partitions, &args.broker_flags)?;
    let rounds = args.rounds.max(1);
    let mut rows = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        if i == 0 {
            // Unmeasured: the first run against a freshly started Kafka is the slowest.
            kafka
                .passthrough("modes.warm", args.records.min(100_000), size)
                .await?;
        }
        rows.push(row(&kafka, &modes, size, args.records, rounds).await?);
    }
    print(&rows);
    Ok(rows)
}

/// The rounds at one value size.
async fn row(
    kafka: &Kafka,
    modes: &[Mode],
    size: usize,
    n: u64,
    rounds: usize,
) -> Result<ModesRow, BenchError> {
    let per_s = |wall: std::time::Duration| n as f64 / wall.as_secs_f64();
    let cpu_us = |cpu: std::time::Duration| cpu.as_secs_f64() * 1e6 / n as f64;
    let mut passthrough = (Vec::new(), Vec::new());
    let mut each: Vec<(Vec<f64>, Vec<f64>, Vec<f64>)> = vec![Default::default(); modes.len()];
    for r in 0..rounds {
        let (pt, _) = kafka
            .passthrough(&format!("modes.{size}.{r}"), n, size)
            .await?;
        let pt_rate = per_s(pt.wall);
        let mut line = format!("round {r}, {size} B: passthrough {pt_rate:.0}/s");
        passthrough.0.push(pt_rate);
        passthrough.1.push(cpu_us(pt.cpu));
        for (m, (rates, ratios, cpus)) in modes.iter().zip(each.iter_mut()) {
            let tag = format!("{size}.{r}.{}", m.name());
            let span = kafka.through_broker(&tag, n, size, m.flags()).await?;
            let rate = per_s(span.wall);
            line += &format!(
                ", {} {rate:.0}/s ({:.2}, {:.2} us/record)",
                m.name(),
                rate / pt_rate,
                cpu_us(span.cpu)
            );
            rates.push(rate);
            ratios.push(rate / pt_rate);
            cpus.push(cpu_us(span.cpu));
        }
        eprintln!("{line}");
    }
    let passthrough_per_s = median(passthrough.0);
    let modes = modes
        .iter()
        .zip(each)
        .map(|(&mode, (rates, ratios, cpus))| {
            let per_s = median(rates);
            ModeFigures {
                mode,
                per_s,
                of_passthrough: per_s / passthrough_per_s,
                rounds_of_passthrough: ratios,
                cpu_us_per_record: median(cpus),
            }
        })
        .collect();
    Ok(ModesRow {
        value_bytes: size,
        records: n,
        rounds,
        passthrough_per_s,
        passthrough_cpu_us_per_record: median(passthrough.1),
        modes,
    })
}

/// The table: one line per value size and mode.
fn print(rows: &[ModesRow]) {
    println!("| value | records x rounds | mode | rec/s | of the passthrough (rounds) | CPU us/record (passthrough) | of the first mode: rate / CPU |");
    println!("|---|---|---|---|---|---|---|");
    for row in rows {
        println!(
            "| {} B | {} x {} | passthrough | {:.0} | 1 | {:.2} | |",
            row.value_bytes,
            row.records,
            row.rounds,
            row.passthrough_per_s,
            row.passthrough_cpu_us_per_record
        );
        let first = row.modes.first();
        for m in &row.modes {
            let rounds: Vec<String> = m
                .rounds_of_passthrough
                .iter()
                .map(|r| format!("{r:.2}"))
                .collect();
            let against_first = first.map_or(String::new(), |f| {
                format!(
                    "{:.2} / {:.2}",
                    m.per_s / f.per_s,
                    m.cpu_us_per_record / f.cpu_us_per_record
                )
            });
            println!(
                "| {} B | {} x {} | {} | {:.0} | **{:.2}** ({}) | {:.2} ({:.2}) | {} |",
                row.value_bytes,
                row.records,
                row.rounds,
                m.mode.name(),
                m.per_s,
                m.of_passthrough,
                rounds.join(", "),
                m.cpu_us_per_record,
                row.passthrough_cpu_us_per_record,
                against_first
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Mode;

    #[test]
    fn modes_are_named_as_the_flag_says_and_an_unknown_one_is_refused() {
        assert_eq!(Mode::parse(" changelog").unwrap(), Mode::Changelog);
        assert_eq!(
            Mode::parse("exactly-once").unwrap().flags()[0],
            "--exactly-once"
        );
        let e = Mode::parse("eos").unwrap_err().to_string();
        assert!(e.contains("eos") && e.contains("exactly-once"), "{e}");
    }
}
