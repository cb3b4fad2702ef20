//! A consumer's retry (a record on a retry topic, or one with `retry-after`): count the attempt,
//! then schedule it back on its target at the policy's backoff, or send it to the target's
//! dead-letter topic once its attempts are used up.

use super::{
    control, names, user_headers, Command, Contract, Header, HeaderRef, Incoming, Reason, Reject,
    StoredRecord,
};
use crate::retry::{self, names as rn, Policy};
use crate::time;

/// What a retry's headers say about the attempts before this one.
struct Attempts {
    /// Attempts already made (the `retry-attempt` header; 0 on the first retry).
    previous: u32,
    /// When the first attempt failed, epoch ms.
    first_failed: u64,
    /// The attempts allowed: the policy's, or fewer when the record asks for fewer.
    max: u32,
}

fn bad(detail: String) -> Reject {
    Reject::new(Reason::InvalidRetryHeader, detail)
}

fn number(rec: &Incoming<'_>, name: &str) -> Result<Option<u64>, Reject> {
    control(rec.headers, name)?
        .map(|v| time::parse_integer(v, name).map_err(|e| bad(e.to_string())))
        .transpose()
}

impl Attempts {
    /// Reads and checks the retry headers; `base` stands for the first failure when none is
    /// named.
    fn read(rec: &Incoming<'_>, policy: &Policy, base: u64) -> Result<Self, Reject> {
        let previous = match number(rec, rn::ATTEMPT)? {
            None => 0,
            Some(n) if n <= u64::from(retry::MAX_ATTEMPTS_LIMIT) => n as u32,
            Some(n) => {
                return Err(bad(format!(
                    "{} {n} is over {}",
                    rn::ATTEMPT,
                    retry::MAX_ATTEMPTS_LIMIT
                )))
            }
        };
        let first_failed = number(rec, rn::FIRST_FAILED_AT)?;
        if first_failed.is_some_and(|f| f < time::MIN_PLAUSIBLE_EPOCH_MS) {
            return Err(bad(format!(
                "{} must be epoch milliseconds; it is before 1973",
                rn::FIRST_FAILED_AT
            )));
        }
        let max = number(rec, rn::MAX_ATTEMPTS)?.map_or(policy.max_attempts, |m| {
            m.min(u64::from(policy.max_attempts)) as u32
        });
        Ok(Self {
            previous,
            first_failed: first_failed.unwrap_or(base),
            max,
        })
    }
}

impl Contract {
    /// A consumer's retry: count the attempt, then schedule it back or dead-letter it.
    pub(super) fn interpret_retry(
        &self,
        rec: &Incoming<'_>,
        target: &str,
        id: Option<&[u8]>,
        now_ms: u64,
    ) -> Result<Command, Reject> {
        let base = rec.timestamp_ms.unwrap_or(now_ms);
        let policy = self.retry.policy_for(target);
        let attempts = Attempts::read(rec, policy, base)?;
        // Read (and checked for repetition and encoding) before the attempts are counted, so a
        // malformed `retry-after` is rejected whether or not the attempts are used up.
        let retry_after = control(rec.headers, rn::AFTER)?;
        let mut headers: Vec<Header> = user_headers(rec.headers)
            .filter(|h| !rn::MANAGED.contains(&h.key))
            .map(HeaderRef::to_header)
            .collect();
        let attempt = attempts.previous + 1;
        if attempt > attempts.max {
            return self.exhausted(rec, target, id, &attempts, headers, now_ms);
        }
        let due_ms = self.retry_due(rec, retry_after, policy, (attempt, base), now_ms)?;
        headers.extend([
            Header::new(rn::ATTEMPT, attempt.to_string()),
            Header::new(rn::FIRST_FAILED_AT, attempts.first_failed.to_string()),
        ]);
        Ok(Command::Retry {
            schedule: StoredRecord::new(
                due_ms,
                target,
                id,
                rec.key,
                rec.value,
                headers.iter().map(Header::borrowed),
            ),
            attempt,
        })
    }

    /// A retry whose attempts are used up: to the target's dead-letter topic now, with the
    /// attempts made and why.
    fn exhausted(
        &self,
        rec: &Incoming<'_>,
        target: &str,
        id: Option<&[u8]>,
        attempts: &Attempts,
        mut headers: Vec<Header>,
        now_ms: u64,
    ) -> Result<Command, Reject> {
        let (previous, max) = (attempts.previous, attempts.max);
        let dead_letter = self.retry.policy_for(target).dead_letter_topic(target);
        let detail = format!("{previous} retries of {max} used for target '{target}'");
        if let Err(rej) = self.check_dead_letter_topic(&dead_letter) {
            return Err(Reject::new(
                Reason::RetriesExhausted,
                format!(
                    "{detail}; its dead-letter topic is not usable: {}",
                    rej.detail
                ),
            ));
        }
        headers.extend([
            Header::new(names::TARGET, target),
            Header::new(rn::ATTEMPT, previous.to_string()),
            Header::new(rn::FIRST_FAILED_AT, attempts.first_failed.to_string()),
            Header::new(names::ERROR, Reason::RetriesExhausted.code()),
            Header::new(names::ERROR_DETAIL, detail),
        ]);
        Ok(Command::Exhausted {
            schedule: StoredRecord::new(
                now_ms,
                &dead_letter,
                id,
                rec.key,
                rec.value,
                headers.iter().map(Header::borrowed),
            ),
            target: target.to_owned(),
        })
    }

    /// When a retry is due: its `retry-after`, or its explicit `delay-*` time, or the policy's
    /// backoff for this attempt (with jitter seeded by the key, so a redelivery gets the same).
    fn retry_due(
        &self,
        rec: &Incoming<'_>,
        retry_after: Option<&str>,
        policy: &Policy,
        (attempt, base): (u32, u64),
        now_ms: u64,
    ) -> Result<u64, Reject> {
        let explicit = control(rec.headers, names::UNTIL)?.is_some()
            || control(rec.headers, names::AFTER)?.is_some();
        match retry_after {
            Some(_) if explicit => Err(Reject::new(
                Reason::ConflictingDueTime,
                "retry-after together with delay-until or delay-after: give one",
            )),
            Some(text) => self.within_max_delay(
                time::parse_retry_after(text, base)
                    .map_err(|e| bad(format!("{}: {e}", rn::AFTER)))?,
                now_ms,
            ),
            None if explicit => self.due_time(rec, now_ms),
            None => {
                let seed = rec
                    .key
                    .unwrap_or_default()
                    .iter()
                    .fold(base ^ u64::from(attempt) << 48, |h, b| {
                        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
                    });
                let wait = policy.delay_for(attempt, retry::unit_interval(seed));
                self.within_max_delay(base.saturating_add(wait), now_ms)
            }
        }
    }
}
