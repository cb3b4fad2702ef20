//! Fire limits: per-target rate limits, an optional global one, and wave spreading. Pure: time
//! is passed in, nothing is read or written.
//!
//! A rule names the targets it applies to with a regex and gives a rate (`500/s`), a burst (how
//! many may go at once after a quiet spell; 1 by default, which paces records evenly) and a
//! spread (records due at the same time go out at a time of their own within this window after
//! their due time; never before it). Each target gets a bucket of its own, with the rate of the
//! first rule that matches it; the global limit is one more bucket that every record passes.
//!
//! Buckets use the generic cell rate algorithm: a bucket remembers the theoretical time at which
//! its next record may go (`tat`), a record may go at `max(now, tat - tolerance)`, and going
//! moves `tat` one interval on. A record whose time is in the future is not waited for: the
//! publisher gets a release time for it, puts the record's id back in the timing wheel for that
//! time and lets it go when it comes back. Records are looked at in due order, so a target's
//! records keep their order in line and the fire path never waits for a throttled target.
//!
//! [`Limiter`] keeps the records it holds back (id, release time, target), so that a record
//! coming back is let through without being counted twice, and so that the held-back count by
//! target is known. Its buckets start full: after a restart the line forms again, in due order,
//! from the records still pending, and at most one burst goes out before the pace holds again.

#[cfg(test)]
mod tests;

use std::collections::HashMap;

use regex::Regex;

use crate::hashing::BuildMul;
use crate::id::RecordId;
use crate::time::parse_duration_ms;

/// Highest rate a rule may give, records per second.
pub const MAX_RATE: f64 = 1_000_000.0;
/// Longest spread a rule may give, ms (a day).
pub const MAX_SPREAD_MS: u64 = 86_400_000;

/// A pace: at most `rate` records per second, `burst` of them at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    /// Records per second.
    pub per_second: f64,
    /// Records that may go at once after a quiet spell (at least 1).
    pub burst: u32,
}

impl Rate {
    /// Microseconds between two records at this rate.
    fn interval_us(self) -> f64 {
        1e6 / self.per_second
    }
}

/// What applies to the targets a pattern matches.
#[derive(Debug, Clone)]
pub struct Rule {
    /// The targets it applies to.
    pub pattern: Regex,
    /// Their pace, if limited.
    pub rate: Option<Rate>,
    /// Records are spread over this window after their due time, ms (0: not spread).
    pub spread_ms: u64,
}

/// Every fire limit of the broker.
#[derive(Debug, Clone, Default)]
pub struct Limits {
    /// Per-target rules; the first match wins.
    pub rules: Vec<Rule>,
    /// One more pace that every record passes, whatever its target.
    pub global: Option<Rate>,
}

impl Limits {
    /// Whether no limit is set (the publisher then skips the limiter entirely).
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty() && self.global.is_none()
    }

    /// Parses one `--fire-rate` value: `REGEX=ITEM,...`, where an item is a rate (`500/s`,
    /// `30000/min`, `100000/h`), `burst=N` or `spread=DURATION`. The regex ends at the first
    /// `=` (topic names have none).
    ///
    /// # Errors
    /// A sentence naming the part that is wrong and what to give instead.
    pub fn parse_rule(text: &str) -> Result<Rule, String> {
        let usage = "use REGEX=RATE[,burst=N][,spread=DURATION], e.g. '^orders$=500/s,burst=50'";
        let Some((pattern, spec)) = text.split_once('=') else {
            return Err(format!("'{text}': {usage}"));
        };
        if pattern.is_empty() {
            return Err(format!("'{text}' has no regex before '=': {usage}"));
        }
        let pattern =
            Regex::new(pattern).map_err(|e| format!("'{pattern}' is not a valid regex: {e}"))?;
        let mut per_second = None;
        let mut burst = None;
        let mut spread_ms = 0;
        for item in spec.split(',').map(str::trim) {
            match item.split_once('=') {
                Some(("burst", n)) => burst = Some(parse_burst(n)?),
                Some(("spread", d)) => spread_ms = parse_spread(d)?,
                Some((key, _)) => {
                    return Err(format!(
                        "unknown key '{key}' (use burst or spread): {usage}"
                    ))
                }
                None if item.is_empty() => {
                    return Err(format!("'{text}' has an empty item: {usage}"))
                }
                None => per_second = Some(parse_per_second(item)?),
            }
        }
        let rate = match (per_second, burst) {
            (Some(per_second), burst) => Some(Rate {
                per_second,
                burst: burst.unwrap_or(1),
            }),
            (None, Some(_)) => {
                return Err(format!("'{text}' gives a burst without a rate: {usage}"))
            }
            (None, None) if spread_ms == 0 => {
                return Err(format!(
                    "'{text}' gives neither a rate nor a spread: {usage}"
                ))
            }
            (None, None) => None,
        };
        Ok(Rule {
            pattern,
            rate,
            spread_ms,
        })
    }

    /// Parses `--fire-rate-global`: `RATE[,burst=N]`.
    ///
    /// # Errors
    /// A sentence naming the part that is wrong and what to give instead.
    pub fn parse_global(text: &str) -> Result<Rate, String> {
        let usage = "use RATE[,burst=N], e.g. '5000/s' or '5000/s,burst=500'";
        let mut items = text.split(',').map(str::trim);
        let per_second = parse_per_second(items.next().unwrap_or_default())
            .map_err(|e| format!("{e}; {usage}"))?;
        let mut burst = 1;
        for item in items {
            match item.split_once('=') {
                Some(("burst", n)) => burst = parse_burst(n)?,
                _ => return Err(format!("'{item}' is not burst=N: {usage}")),
            }
        }
        Ok(Rate { per_second, burst })
    }

    /// The rule of `target`, if any.
    fn rule_for(&self, target: &str) -> Option<usize> {
        self.rules.iter().position(|r| r.pattern.is_match(target))
    }
}

/// `500/s`, `30000/min`, `100000/h`, or a decimal count.
fn parse_per_second(text: &str) -> Result<f64, String> {
    let bad =
        || format!("rate '{text}': give records per time unit, e.g. 500/s, 30000/min or 1000/h");
    let (count, unit) = text.split_once('/').ok_or_else(bad)?;
    let count: f64 = count.trim().parse().map_err(|_| bad())?;
    let seconds = match unit.trim() {
        "s" => 1.0,
        "min" | "m" => 60.0,
        "h" => 3_600.0,
        _ => return Err(bad()),
    };
    let per_second = count / seconds;
    if !per_second.is_finite() || per_second <= 0.0 {
        return Err(format!("rate '{text}' must be more than 0"));
    }
    if per_second > MAX_RATE {
        return Err(format!(
            "rate '{text}' is above the highest rate, {MAX_RATE}/s"
        ));
    }
    // Below one a day the interval would not fit the line kept in microseconds.
    if per_second < 1.0 / 86_400.0 {
        return Err(format!("rate '{text}' is below the lowest rate, 1 a day"));
    }
    Ok(per_second)
}

fn parse_burst(text: &str) -> Result<u32, String> {
    text.trim()
        .parse::<u32>()
        .ok()
        .filter(|n| (1..=1_000_000).contains(n))
        .ok_or_else(|| format!("burst '{text}': a whole number from 1 to 1000000"))
}

fn parse_spread(text: &str) -> Result<u64, String> {
    let ms = parse_duration_ms(text.trim()).map_err(|e| format!("spread: {e}"))?;
    if ms == 0 || ms > MAX_SPREAD_MS {
        return Err(format!("spread '{text}': from 1ms to 1d"));
    }
    Ok(ms)
}

/// One pace's state: the generic cell rate algorithm over microseconds.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    rate: Rate,
    /// Theoretical arrival time of the next record, epoch microseconds.
    tat_us: f64,
    /// A target's records may not go before this (µs): set when the global pace made one go
    /// after its own slot, so that the next ones keep the target's pace from where it went.
    floor_us: f64,
}

impl Bucket {
    fn new(rate: Rate) -> Self {
        Self {
            rate,
            tat_us: 0.0,
            floor_us: 0.0,
        }
    }

    /// Records that a record of this target goes at `at_us` (its slot, or later if the global
    /// pace held it).
    fn went(&mut self, at_us: f64) {
        let tolerance = f64::from(self.rate.burst - 1) * self.rate.interval_us();
        self.floor_us = self
            .floor_us
            .max(at_us + self.rate.interval_us() - tolerance);
        self.tat_us = self.tat_us.max(at_us + self.rate.interval_us());
    }

    /// The earliest time (µs) a record looked at `now_us` may go.
    fn earliest(&self, now_us: f64) -> f64 {
        let tolerance = f64::from(self.rate.burst - 1) * self.rate.interval_us();
        now_us.max(self.tat_us - tolerance)
    }

    /// Counts a record going at `at_us`.
    fn take(&mut self, at_us: f64) {
        self.tat_us = self.tat_us.max(at_us) + self.rate.interval_us();
    }

    /// Reserves the earliest time (µs) a record looked at `now_us` may go, and returns it.
    fn pass(&mut self, now_us: f64) -> f64 {
        let at = self.earliest(now_us);
        self.take(at);
        at
    }
}

/// Why a record is held back, which is also the stage it comes back after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// Spread over its target's window: comes back to be paced.
    Spread,
    /// Paced by its target's rate: comes back to pass the global pace.
    Rate,
    /// Paced by the global rate: goes out when it comes back.
    Global,
}

/// A record held back, until it comes back from the wheel.
#[derive(Debug, Clone)]
struct Held {
    release_ms: u64,
    cause: Cause,
    /// Index into the limiter's targets (u32 keeps the note at 16 bytes).
    target: u32,
}

/// What to do with a due record now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Publish it. `released_ms` is when the limits let it go (its due time when none held it).
    Go {
        /// When the limits let it go, epoch ms.
        released_ms: u64,
    },
    /// Put it back in the wheel for this time; it is held until then.
    Hold {
        /// When to look at it again, epoch ms.
        until_ms: u64,
    },
    /// Another timer of the same record came first; the record is held until a later time:
    /// drop this one.
    Early,
}

/// The limits' state: buckets by target and the records held back.
#[derive(Debug)]
pub struct Limiter {
    limits: Limits,
    /// Targets seen so far, by index: (name, rule index, bucket).
    targets: Vec<(String, Option<usize>, Option<Bucket>)>,
    by_name: HashMap<String, usize>,
    global: Option<Bucket>,
    held: HashMap<RecordId, Held, BuildMul>,
    /// Records held back now, by target index.
    held_count: Vec<u64>,
}

impl Limiter {
    /// A limiter with full buckets and nothing held.
    pub fn new(limits: Limits) -> Self {
        Self {
            global: limits.global.map(Bucket::new),
            limits,
            targets: Vec::new(),
            by_name: HashMap::new(),
            held: HashMap::default(),
            held_count: Vec::new(),
        }
    }

    /// Whether no limit is set.
    pub fn is_empty(&self) -> bool {
        self.limits.is_empty()
    }

    fn target(&mut self, name: &str) -> usize {
        if let Some(&i) = self.by_name.get(name) {
            return i;
        }
        let rule = self.limits.rule_for(name);
        let bucket = rule
            .and_then(|r| self.limits.rules[r].rate)
            .map(Bucket::new);
        self.targets.push((name.to_owned(), rule, bucket));
        self.held_count.push(0);
        self.by_name.insert(name.to_owned(), self.targets.len() - 1);
        self.targets.len() - 1
    }

    /// Decides for record `id` of `target`, due at `due_ms`, whose timer came up at `now_ms`.
    /// Records must be looked at in due order for their line to keep it.
    ///
    /// A record passes up to three stages, each of which may hold it: its target's spread, its
    /// target's pace, then the global pace. A held record comes back to the stage after the
    /// one that held it, so the global bucket is only charged for records whose target lets
    /// them go now: a long line on one target never reserves global capacity ahead of time.
    pub fn decide(&mut self, id: RecordId, target: &str, due_ms: u64, now_ms: u64) -> Decision {
        let t = self.target(target);
        let mut stage = Cause::Spread;
        let mut released_ms = due_ms;
        if let Some(h) = self.held.get(&id) {
            if h.release_ms > now_ms {
                return Decision::Early;
            }
            let h = self.held.remove(&id).expect("present");
            self.held_count[h.target as usize] -= 1;
            released_ms = h.release_ms;
            stage = match h.cause {
                Cause::Spread => Cause::Rate,
                Cause::Rate => Cause::Global,
                Cause::Global => return Decision::Go { released_ms },
            };
        }
        if stage == Cause::Spread {
            let rule = self.targets[t].1.map(|r| &self.limits.rules[r]);
            if let Some(rule) = rule.filter(|r| r.spread_ms > 0) {
                let at = due_ms.saturating_add(spread_offset(id, rule.spread_ms));
                if at > now_ms {
                    return self.hold(id, t, at, Cause::Spread);
                }
            }
            stage = Cause::Rate;
        }
        let now_us = now_ms as f64 * 1_000.0;
        // The time the global stage starts from: the record's own slot on its target's pace
        // (not the later time a loaded machine looked at it, which would slow the pace down).
        let mut base_us = now_us;
        if stage == Cause::Rate {
            if let Some(b) = self.targets[t].2.as_mut() {
                let at_us = b.pass(now_us);
                if let Some(until_ms) = later_millisecond(at_us, now_ms) {
                    return self.hold(id, t, until_ms, Cause::Rate);
                }
                base_us = at_us;
            }
        } else if self.targets[t].2.is_some() {
            // Back from its target's pace: its slot was the release time.
            base_us = (released_ms as f64 * 1_000.0).min(now_us);
        }
        // The global pace, and no earlier than the target's floor: the global bucket is only
        // charged for records whose target lets them go now.
        let floor = self.targets[t]
            .2
            .map_or(base_us, |b| b.floor_us.max(base_us));
        let at_us = self.global.map_or(floor, |g| g.earliest(floor));
        if let Some(g) = self.global.as_mut() {
            g.take(at_us);
        }
        if let Some(b) = self.targets[t].2.as_mut() {
            b.went(at_us);
        }
        if let Some(until_ms) = later_millisecond(at_us, now_ms) {
            return self.hold(id, t, until_ms, Cause::Global);
        }
        if at_us > now_us {
            // Paced to a later point of this millisecond.
            released_ms = released_ms.max(at_us as u64 / 1_000);
        }
        Decision::Go { released_ms }
    }

    fn hold(&mut self, id: RecordId, target: usize, until_ms: u64, cause: Cause) -> Decision {
        let previous = self.held.insert(
            id,
            Held {
                release_ms: until_ms,
                cause,
                target: target as u32,
            },
        );
        debug_assert!(previous.is_none(), "{id:?} held twice");
        self.held_count[target] += 1;
        Decision::Hold { until_ms }
    }

    /// Forgets a record that will not come back through its hold (cancelled, replaced or moved
    /// by an operator); returns its target if it was held.
    pub fn forget(&mut self, id: RecordId) -> Option<&str> {
        let h = self.held.remove(&id)?;
        self.held_count[h.target as usize] -= 1;
        Some(&self.targets[h.target as usize].0)
    }

    /// Records held back now, by target (targets that never had one are left out).
    pub fn held_by_target(&self) -> impl Iterator<Item = (&str, u64)> + '_ {
        self.targets
            .iter()
            .zip(&self.held_count)
            .filter(|((_, rule, _), _)| rule.is_some() || self.global.is_some())
            .map(|((name, _, _), &n)| (name.as_str(), n))
    }

    /// Records held back now.
    pub fn held(&self) -> usize {
        self.held.len()
    }
}

/// The millisecond that contains `at_us`, if it is after `now_ms`. A record allowed at 10.4 ms
/// goes at 10 ms, so a pace above 1,000/s puts several records in one millisecond rather than
/// lagging.
fn later_millisecond(at_us: f64, now_ms: u64) -> Option<u64> {
    let at_ms = (at_us / 1_000.0) as u64;
    (at_ms > now_ms).then_some(at_ms)
}

/// Where in a spread window of `spread_ms` record `id` goes: the same place every time (after a
/// restart too), uniform over the window.
fn spread_offset(id: RecordId, spread_ms: u64) -> u64 {
    (crate::retry::unit_interval(id.0) * spread_ms as f64) as u64
}
