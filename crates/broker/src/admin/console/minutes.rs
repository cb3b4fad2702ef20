//! Records fired and dead-lettered per minute over the last hour, for the console's overview:
//! the counters' totals sampled at the first look in each minute (a look every 10 s, and each
//! overview request), so a minute's figure is the difference to the next minute's sample.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use serde::Serialize;

/// Minutes kept.
const KEPT: usize = 61;
const MINUTE_MS: u64 = 60_000;

/// One minute's counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Minute {
    /// Its start, epoch ms.
    pub minute_ms: u64,
    /// Records fired in it (so far, for the current minute).
    pub fired: u64,
    /// Records dead-lettered in it.
    pub dead_lettered: u64,
}

/// The samples: (minute start, fired total, dead-lettered total) at the first look in it.
#[derive(Debug, Clone, Default)]
pub struct Minutes(Arc<Mutex<VecDeque<(u64, u64, u64)>>>);

impl Minutes {
    /// Takes a sample if `now_ms` is in a minute without one.
    pub fn sample(&self, now_ms: u64, fired: u64, dead: u64) {
        let minute = now_ms / MINUTE_MS * MINUTE_MS;
        let mut s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if s.back().is_none_or(|&(m, _, _)| m < minute) {
            if s.len() == KEPT {
                s.pop_front();
            }
            s.push_back((minute, fired, dead));
        }
    }

    /// The counts of each minute sampled, oldest first, the current one up to `now_ms`.
    pub fn per_minute(&self, now_ms: u64, fired: u64, dead: u64) -> Vec<Minute> {
        self.sample(now_ms, fired, dead);
        let s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let ends = s
            .iter()
            .skip(1)
            .map(|&(_, f, d)| (f, d))
            .chain([(fired, dead)]);
        s.iter()
            .zip(ends)
            .map(|(&(minute_ms, f0, d0), (f1, d1))| Minute {
                minute_ms,
                fired: f1.saturating_sub(f0),
                dead_lettered: d1.saturating_sub(d0),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_minute_from_the_samples() {
        let m = Minutes::default();
        m.sample(60_000, 0, 0);
        m.sample(90_000, 5, 0);
        m.sample(120_500, 12, 1);
        let got = m.per_minute(150_000, 20, 1);
        assert_eq!(
            got,
            vec![
                Minute {
                    minute_ms: 60_000,
                    fired: 12,
                    dead_lettered: 1
                },
                Minute {
                    minute_ms: 120_000,
                    fired: 8,
                    dead_lettered: 0
                },
            ]
        );
        for i in 0..100u64 {
            m.sample(180_000 + i * MINUTE_MS, i, i);
        }
        assert_eq!(
            m.per_minute(180_000 + 100 * MINUTE_MS, 100, 100).len(),
            KEPT
        );
    }
}
