//! Retry-after for consumers: backoff policies and the retry headers. Pure, no I/O.
//!
//! A consumer that cannot process a record produces it, unchanged, to a retry topic (default
//! `delay.retry`) with `delay-target` naming the topic it wants it back on, and optionally a
//! `retry-after`. The contract ([`crate::record::Contract`]) turns that into a schedule using
//! the [`Policy`] of the target: the attempt count goes up by one, the delay comes from
//! `retry-after` or from the backoff, and once the attempts are used up the record goes to the
//! target's dead-letter topic instead. Header names are in [`names`] and
//! `schemas/headers.schema.json`.

use regex::Regex;

use crate::time::parse_duration_ms;

/// Header names of the retry contract.
pub mod names {
    /// When to retry: integer seconds, an HTTP-date, or a duration with units.
    pub const AFTER: &str = "retry-after";
    /// Set by the broker: 1 on the first retry, incremented on each pass.
    pub const ATTEMPT: &str = "retry-attempt";
    /// Set by the broker: epoch ms of the first failure.
    pub const FIRST_FAILED_AT: &str = "retry-first-failed-at";
    /// From the consumer, optional: lowers the policy's maximum attempts for this record.
    pub const MAX_ATTEMPTS: &str = "retry-max-attempts";
    /// From the consumer, optional: why it failed; carried to the dead-letter record.
    pub const REASON: &str = "retry-reason";
    /// Headers the broker sets itself on every pass (any incoming value is replaced).
    pub const MANAGED: [&str; 3] = [AFTER, ATTEMPT, FIRST_FAILED_AT];
}

/// How the wait grows from one attempt to the next.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Backoff {
    /// Every retry waits `delay`.
    Fixed,
    /// Retry n waits `delay * factor^(n-1)`, at most `max_delay`.
    Exponential,
}

/// The retry rules of a target topic.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// Fixed or exponential.
    pub backoff: Backoff,
    /// The first wait (and every wait when fixed), ms.
    pub delay_ms: u64,
    /// Growth per attempt (exponential).
    pub factor: f64,
    /// Longest wait (exponential), ms.
    pub max_delay_ms: u64,
    /// Each wait is spread uniformly over +-`jitter` of itself (0 = exact).
    pub jitter: f64,
    /// Retries before the record goes to the dead-letter topic.
    pub max_attempts: u32,
    /// Dead-letter topic; `{target}` is replaced by the target topic.
    pub dead_letter: String,
}

/// The default policy, as a spec string (the `--retry-default` default).
pub const DEFAULT_SPEC: &str =
    "backoff=exponential,delay=1s,factor=2,max-delay=5m,jitter=0.1,max-attempts=5,dead-letter={target}.dlt";

impl Default for Policy {
    fn default() -> Self {
        Policy {
            backoff: Backoff::Exponential,
            delay_ms: 1_000,
            factor: 2.0,
            max_delay_ms: 300_000,
            jitter: 0.1,
            max_attempts: 5,
            dead_letter: "{target}.dlt".into(),
        }
    }
}

/// Most attempts a policy or header may allow.
pub const MAX_ATTEMPTS_LIMIT: u32 = 1_000_000;

impl Policy {
    /// Parses `key=value,...` on top of `base`: keys `backoff` (fixed|exponential), `delay`,
    /// `factor`, `max-delay`, `jitter`, `max-attempts`, `dead-letter`. Keys not given keep the
    /// value from `base`.
    ///
    /// # Errors
    /// A sentence naming the key and what is wrong with it.
    pub fn parse(spec: &str, base: &Policy) -> Result<Policy, String> {
        let mut p = base.clone();
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let Some((key, value)) = item.split_once('=') else {
                return Err(format!("'{item}' is not KEY=VALUE"));
            };
            let (key, value) = (key.trim(), value.trim());
            match key {
                "backoff" => {
                    p.backoff = match value {
                        "fixed" => Backoff::Fixed,
                        "exponential" => Backoff::Exponential,
                        _ => return Err(format!("backoff '{value}': use fixed or exponential")),
                    }
                }
                "delay" => p.delay_ms = parse_duration_ms(value).map_err(|e| format!("delay: {e}"))?,
                "max-delay" => {
                    p.max_delay_ms =
                        parse_duration_ms(value).map_err(|e| format!("max-delay: {e}"))?;
                }
                "factor" => {
                    p.factor = value
                        .parse::<f64>()
                        .ok()
                        .filter(|f| f.is_finite() && (1.0..=100.0).contains(f))
                        .ok_or_else(|| format!("factor '{value}': a number from 1 to 100"))?;
                }
                "jitter" => {
                    p.jitter = value
                        .parse::<f64>()
                        .ok()
                        .filter(|j| (0.0..1.0).contains(j))
                        .ok_or_else(|| {
                            format!("jitter '{value}': a fraction from 0 up to (not including) 1")
                        })?;
                }
                "max-attempts" => {
                    p.max_attempts = value
                        .parse::<u32>()
                        .ok()
                        .filter(|n| *n <= MAX_ATTEMPTS_LIMIT)
                        .ok_or_else(|| {
                            format!("max-attempts '{value}': a whole number from 0 to {MAX_ATTEMPTS_LIMIT}")
                        })?;
                }
                "dead-letter" => {
                    if value.is_empty() {
                        return Err("dead-letter is empty: give a topic, e.g. {target}.dlt".into());
                    }
                    value.clone_into(&mut p.dead_letter);
                }
                _ => {
                    return Err(format!(
                        "unknown key '{key}' (use backoff, delay, factor, max-delay, jitter, max-attempts, dead-letter)"
                    ))
                }
            }
        }
        if p.backoff == Backoff::Exponential && p.delay_ms == 0 {
            return Err("delay must be more than 0 for exponential backoff".into());
        }
        Ok(p)
    }

    /// The wait before retry `attempt` (1-based), given `u` uniform in [0, 1) for the jitter.
    pub fn delay_for(&self, attempt: u32, u: f64) -> u64 {
        let n = attempt.max(1) - 1;
        let raw = match self.backoff {
            Backoff::Fixed => self.delay_ms as f64,
            Backoff::Exponential => (self.delay_ms as f64 * self.factor.powi(n.min(1_000) as i32))
                .min(self.max_delay_ms as f64),
        };
        let jittered = raw * (1.0 + self.jitter * (2.0 * u.clamp(0.0, 1.0) - 1.0));
        let ms = match self.backoff {
            Backoff::Fixed => jittered,
            Backoff::Exponential => jittered.min(self.max_delay_ms as f64),
        };
        // f64 -> u64 saturates; the cap keeps it far below that anyway.
        ms.round().max(0.0) as u64
    }

    /// The dead-letter topic for `target`.
    pub fn dead_letter_topic(&self, target: &str) -> String {
        self.dead_letter.replace("{target}", target)
    }
}

/// Which records are retries, and the policy of each target.
#[derive(Debug, Clone)]
pub struct Retries {
    /// Source topics whose records are retries (they must also match the source pattern).
    pub topics: Regex,
    /// Policy of targets no pattern matches.
    pub default: Policy,
    /// Per target-topic pattern; the first match wins.
    pub by_target: Vec<(Regex, Policy)>,
}

impl Default for Retries {
    fn default() -> Self {
        Retries {
            topics: Regex::new(r"^delay\.retry$").expect("valid regex"),
            default: Policy::default(),
            by_target: Vec::new(),
        }
    }
}

impl Retries {
    /// The policy of `target`.
    pub fn policy_for(&self, target: &str) -> &Policy {
        self.by_target
            .iter()
            .find(|(re, _)| re.is_match(target))
            .map_or(&self.default, |(_, p)| p)
    }
}

/// A number in [0, 1) from `seed`: SplitMix64, so jitter needs no random source and a test can
/// reproduce it.
pub fn unit_interval(seed: u64) -> f64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests;
