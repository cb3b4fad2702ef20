//! What a run cost the machine: wall time, this process's CPU time and page faults, and the
//! share of the machine's CPU that was busy or stolen by the hypervisor meanwhile.

use std::time::{Duration, Instant};

/// Wall and process CPU time of one run.
#[derive(Debug, Clone, Copy)]
pub(super) struct Span {
    pub(super) wall: Duration,
    pub(super) cpu: Duration,
    pub(super) faults: u64,
    /// The machine's CPU time stolen meanwhile, percent.
    pub(super) steal_percent: f64,
    /// The share of the CPU time the machine had meanwhile that it spent busy (this process,
    /// Kafka and anything else), percent: near 100, the machine's CPU bounds the rate.
    pub(super) busy_percent: f64,
}

/// Started when a run's first record is consumed.
#[derive(Debug, Clone, Copy)]
pub(super) struct Stopwatch {
    wall: Instant,
    cpu: Duration,
    faults: u64,
    machine: MachineTicks,
}

impl Stopwatch {
    pub(super) fn start() -> Self {
        let (cpu, faults) = process_usage();
        Self {
            wall: Instant::now(),
            cpu,
            faults,
            machine: MachineTicks::now(),
        }
    }

    pub(super) fn stop(self) -> Span {
        let (cpu, faults) = process_usage();
        let machine = MachineTicks::now();
        Span {
            wall: self.wall.elapsed(),
            cpu: cpu.saturating_sub(self.cpu),
            faults: faults.saturating_sub(self.faults),
            steal_percent: self.machine.steal_percent_until(machine),
            busy_percent: self.machine.busy_percent_until(machine),
        }
    }
}

/// User plus system CPU time of this process, all threads (10 ms ticks), and its minor page
/// faults so far, from `/proc/self/stat`; zero where that cannot be read.
fn process_usage() -> (Duration, u64) {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return (Duration::ZERO, 0);
    };
    // Fields after the command name, which is in parentheses and may hold spaces: state is
    // field 3, minflt 10, utime 14, stime 15.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let field = |n: usize| {
        fields
            .get(n - 3)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (
        Duration::from_millis((field(14) + field(15)) * 10),
        field(10),
    )
}

/// The machine's CPU time so far, from the first line of `/proc/stat` (all CPUs, in clock
/// ticks): the time the hypervisor gave to other guests while this one wanted to run (steal),
/// and all of it. On a shared virtual machine a run's rates and lateness move with steal, so
/// every run reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct MachineTicks {
    steal: u64,
    /// Idle and waiting for I/O.
    idle: u64,
    total: u64,
}

impl MachineTicks {
    /// Now; zero where `/proc/stat` cannot be read.
    pub(super) fn now() -> Self {
        std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| s.lines().next().and_then(Self::parse))
            .unwrap_or_default()
    }

    /// From the `cpu` line: user, nice, system, idle, iowait, irq, softirq, steal (guest time
    /// is already inside user and nice). `None` for any other line.
    fn parse(line: &str) -> Option<Self> {
        let mut fields = line.split_whitespace();
        if fields.next()? != "cpu" {
            return None;
        }
        let ticks: Vec<u64> = fields
            .take(8)
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        (ticks.len() == 8).then(|| Self {
            steal: ticks[7],
            idle: ticks[3] + ticks[4],
            total: ticks.iter().sum(),
        })
    }

    /// Steal between `self` and `later`, percent of all CPU time then (0 when none passed).
    pub(super) fn steal_percent_until(self, later: Self) -> f64 {
        let total = later.total.saturating_sub(self.total);
        if total == 0 {
            return 0.0;
        }
        100.0 * later.steal.saturating_sub(self.steal) as f64 / total as f64
    }

    /// Busy time between `self` and `later`, percent of the CPU time the machine had then (all
    /// of it but steal; 0 when none passed).
    pub(super) fn busy_percent_until(self, later: Self) -> f64 {
        let idle = later.idle.saturating_sub(self.idle);
        let had = later
            .total
            .saturating_sub(self.total)
            .saturating_sub(later.steal.saturating_sub(self.steal));
        if had == 0 {
            return 0.0;
        }
        100.0 * had.saturating_sub(idle) as f64 / had as f64
    }
}

#[cfg(test)]
mod tests {
    use super::MachineTicks;

    #[test]
    fn steal_is_read_from_the_cpu_line_as_a_share_of_all_cpu_time() {
        // /proc/stat's first line: user nice system idle iowait irq softirq steal guest
        // guest_nice.
        let before = MachineTicks::parse("cpu  100 10 50 800 5 0 5 30 7 0").unwrap();
        assert_eq!(
            before,
            MachineTicks {
                steal: 30,
                idle: 805,
                total: 1_000
            }
        );
        let after = MachineTicks::parse("cpu  200 10 100 950 5 0 5 130 9 0").unwrap();
        // 400 ticks passed, 100 of them stolen; of the 300 the machine had, 150 idle.
        assert_eq!(before.steal_percent_until(after), 25.0);
        assert_eq!(before.busy_percent_until(after), 50.0);
        assert_eq!(after.steal_percent_until(after), 0.0);
        assert_eq!(after.busy_percent_until(after), 0.0);
        // Per-CPU lines and short or garbled lines are not the machine's line.
        assert_eq!(MachineTicks::parse("cpu0 1 2 3 4 5 6 7 8 9 10"), None);
        assert_eq!(MachineTicks::parse("cpu  1 2 3"), None);
        assert_eq!(MachineTicks::parse("cpu  1 2 3 4 5 6 7 x"), None);
        // This machine's own line parses.
        assert!(MachineTicks::now().total > 0);
    }
}
