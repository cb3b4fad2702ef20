//! clap value parsers: a flag's text becomes its type when the command line is read, so a bad
//! value fails at start with clap's message naming the flag.

use std::time::Duration;

use kafka_delay_core::time::parse_duration_ms;

use super::KafkaProp;

/// A duration such as `500ms`, `30s`, `5m`, `2h` or `365d`.
///
/// # Errors
/// The duration parser's sentence (a unit is missing or unknown).
pub fn duration(text: &str) -> Result<Duration, String> {
    parse_duration_ms(text)
        .map(Duration::from_millis)
        .map_err(|e| e.to_string())
}

/// A duration as the flags write it: the largest unit that divides it exactly.
pub fn human(d: Duration) -> String {
    let ms = millis(d);
    let units = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1_000, "s"),
    ];
    match units.iter().find(|(n, _)| ms > 0 && ms % n == 0) {
        Some((n, unit)) => format!("{}{unit}", ms / n),
        None => format!("{ms}ms"),
    }
}

/// Whole milliseconds, saturating.
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The CPU time slice the scheduler's thread asks Linux for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchedulerSlice {
    /// The kernel's own (`0`).
    Kernel,
    /// A slice of its own, within what the kernel grants a normal thread.
    Own(Duration),
}

impl SchedulerSlice {
    /// `0`, `<n>us`, or a duration in milliseconds and up.
    ///
    /// # Errors
    /// A sentence giving the accepted forms and range.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text == "0" {
            return Ok(Self::Kernel);
        }
        let slice = match text.strip_suffix("us") {
            Some(n) => n.parse().ok().map(Duration::from_micros),
            None => parse_duration_ms(text).ok().map(Duration::from_millis),
        };
        match slice {
            Some(s) if (crate::slice::SHORTEST..=crate::slice::LONGEST).contains(&s) => {
                Ok(Self::Own(s))
            }
            Some(_) => Err(format!(
                "Linux grants 100us to 100ms, or give 0 to keep the kernel's own (got {text})"
            )),
            None => Err(format!(
                "'{text}' is not a slice: give it like 1ms or 500us, or 0 to keep the kernel's own"
            )),
        }
    }

    /// The slice to ask for; `None` keeps the kernel's.
    pub fn own(self) -> Option<Duration> {
        match self {
            Self::Kernel => None,
            Self::Own(d) => Some(d),
        }
    }
}

/// One librdkafka property, `KEY=VALUE`.
///
/// # Errors
/// A sentence saying what the form is.
pub fn kafka_prop(item: &str) -> Result<KafkaProp, String> {
    let Some((k, v)) = item.split_once('=') else {
        return Err("expected KEY=VALUE (a librdkafka property)".into());
    };
    let key = k.trim();
    if key.is_empty() {
        return Err("empty KEY in KEY=VALUE".into());
    }
    Ok(KafkaProp {
        key: key.to_owned(),
        value: v.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_print_as_the_flags_write_them() {
        for (text, shown) in [
            ("1m", "1m"),
            ("90s", "90s"),
            ("1500ms", "1500ms"),
            ("2h", "2h"),
        ] {
            assert_eq!(human(duration(text).unwrap()), shown);
        }
        assert_eq!(human(Duration::ZERO), "0ms");
    }
}
