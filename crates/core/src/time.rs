//! Parsing of durations (`250ms`, `30s`, `1h30m`, `1d`) and absolute times (epoch ms, RFC 3339).

use std::fmt;

/// Why a duration or a time could not be parsed. The message is shown to users as is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimeError(pub String);

impl fmt::Display for TimeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TimeError {}

fn err(msg: impl Into<String>) -> TimeError {
    TimeError(msg.into())
}

/// Units a duration may use, largest first, with their size in milliseconds.
const UNITS: [(&str, u64); 5] = [
    ("d", 86_400_000),
    ("h", 3_600_000),
    ("m", 60_000),
    ("s", 1_000),
    ("ms", 1),
];

/// Parses a duration with units into milliseconds: one or more `<digits><unit>` parts with units
/// `d`, `h`, `m`, `s`, `ms`, each used at most once, largest first (`1h30m`, `90s`, `250ms`).
///
/// # Errors
/// Empty input, a number without a unit, an unknown unit, units out of order, signs, fractions
/// or a total that overflows 64 bits.
pub fn parse_duration_ms(text: &str) -> Result<u64, TimeError> {
    if text.is_empty() {
        return Err(err("empty duration"));
    }
    let bytes = text.as_bytes();
    let mut total: u64 = 0;
    let mut i = 0;
    let mut last_unit = None::<usize>;
    while i < bytes.len() {
        let start = i;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        if start == i {
            return Err(err(format!(
                "'{text}' is not a duration: expected digits at position {start} (like 30s, 5m, 1h30m, 250ms)"
            )));
        }
        let number: u64 = text[start..i]
            .parse()
            .map_err(|_| err(format!("'{text}' is out of range")))?;
        let unit_start = i;
        while i < bytes.len() && bytes[i].is_ascii_alphabetic() {
            i += 1;
        }
        let unit = &text[unit_start..i];
        if unit.is_empty() {
            return Err(err(format!(
                "'{text}' has a number without a unit (use d, h, m, s or ms)"
            )));
        }
        let Some(rank) = UNITS.iter().position(|(u, _)| *u == unit) else {
            return Err(err(format!(
                "'{text}' has unknown unit '{unit}' (use d, h, m, s or ms)"
            )));
        };
        if last_unit.is_some_and(|last| rank <= last) {
            return Err(err(format!(
                "'{text}' repeats a unit or puts a smaller unit before a larger one"
            )));
        }
        last_unit = Some(rank);
        total = number
            .checked_mul(UNITS[rank].1)
            .and_then(|ms| total.checked_add(ms))
            .ok_or_else(|| err(format!("'{text}' is out of range")))?;
    }
    Ok(total)
}

/// Parses an unsigned decimal integer, with a message naming what was expected.
///
/// # Errors
/// Anything but ASCII digits (signs, fractions, exponents, spaces) or a value over 2^63-1.
pub fn parse_integer(text: &str, what: &str) -> Result<u64, TimeError> {
    if text.is_empty() {
        return Err(err(format!("empty {what}")));
    }
    if text.starts_with('-') && text[1..].bytes().all(|b| b.is_ascii_digit()) && text.len() > 1 {
        return Err(err(format!("{what} '{text}' is negative")));
    }
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(err(format!(
            "{what} '{text}' is not a whole number of digits"
        )));
    }
    match text.parse::<u64>() {
        Ok(v) if v <= i64::MAX as u64 => Ok(v),
        _ => Err(err(format!("{what} '{text}' is out of range"))),
    }
}

/// Epoch milliseconds below this (March 1973) are almost certainly epoch seconds sent by mistake.
pub const MIN_PLAUSIBLE_EPOCH_MS: u64 = 100_000_000_000;

/// Parses an absolute time: integer epoch milliseconds or an RFC 3339 timestamp.
///
/// # Errors
/// Unparsable text, a time before the epoch, or an integer small enough to be epoch seconds.
pub fn parse_epoch_ms_or_rfc3339(text: &str) -> Result<u64, TimeError> {
    if text.bytes().all(|b| b.is_ascii_digit()) || text.starts_with('-') && !text.contains('T') {
        let ms = parse_integer(text, "epoch milliseconds")?;
        if ms < MIN_PLAUSIBLE_EPOCH_MS {
            return Err(err(format!(
                "'{text}' is before 1973 as epoch milliseconds; it looks like epoch seconds (multiply by 1000)"
            )));
        }
        return Ok(ms);
    }
    let parsed = chrono::DateTime::parse_from_rfc3339(text).map_err(|e| {
        err(format!(
            "'{text}' is neither epoch milliseconds nor an RFC 3339 timestamp ({e})"
        ))
    })?;
    u64::try_from(parsed.timestamp_millis())
        .map_err(|_| err(format!("'{text}' is before the Unix epoch")))
}

/// Parses a `retry-after` value into a due time, with HTTP `Retry-After` semantics: an integer
/// number of seconds after `base_ms`, or an HTTP-date (`Sun, 06 Nov 1994 08:49:37 GMT`); a
/// duration with units (`500ms`, `30s`) after `base_ms` is also accepted.
///
/// # Errors
/// Negative or fractional numbers, overflow, dates before the epoch, anything else.
pub fn parse_retry_after(text: &str, base_ms: u64) -> Result<u64, TimeError> {
    let overflow = || err(format!("'{text}' is out of range"));
    let digits = text.strip_prefix('-').unwrap_or(text);
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        let secs = parse_integer(text, "seconds")?;
        return secs
            .checked_mul(1_000)
            .and_then(|ms| base_ms.checked_add(ms))
            .ok_or_else(overflow);
    }
    if text.contains(',') || text.ends_with("GMT") {
        let parsed = chrono::DateTime::parse_from_rfc2822(text).map_err(|e| {
            err(format!(
                "'{text}' is not an HTTP-date like 'Sun, 06 Nov 1994 08:49:37 GMT' ({e})"
            ))
        })?;
        return u64::try_from(parsed.timestamp_millis())
            .map_err(|_| err(format!("'{text}' is before the Unix epoch")));
    }
    let ms = parse_duration_ms(text).map_err(|e| {
        err(format!(
            "{e}; retry-after takes whole seconds, an HTTP-date or a duration like 500ms or 30s"
        ))
    })?;
    base_ms.checked_add(ms).ok_or_else(overflow)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn durations_with_units() {
        assert_eq!(parse_duration_ms("250ms"), Ok(250));
        assert_eq!(parse_duration_ms("30s"), Ok(30_000));
        assert_eq!(parse_duration_ms("5m"), Ok(300_000));
        assert_eq!(parse_duration_ms("2h"), Ok(7_200_000));
        assert_eq!(parse_duration_ms("1d"), Ok(86_400_000));
        assert_eq!(parse_duration_ms("1h30m"), Ok(5_400_000));
        assert_eq!(parse_duration_ms("1d2h3m4s5ms"), Ok(93_784_005));
        assert_eq!(parse_duration_ms("0s"), Ok(0));
    }

    #[test]
    fn bad_durations_say_why() {
        for bad in [
            "", "30", "s", "1.5s", "-5s", "5 s", "5x", "1m1h", "1s1s", "30sec", "1h-5m",
        ] {
            let e = parse_duration_ms(bad).unwrap_err();
            assert!(!e.0.is_empty(), "{bad}");
        }
        assert!(parse_duration_ms("99999999999999999999d")
            .unwrap_err()
            .0
            .contains("out of range"));
        assert!(parse_duration_ms("999999999999999d")
            .unwrap_err()
            .0
            .contains("out of range"));
    }

    #[test]
    fn integers() {
        assert_eq!(parse_integer("0", "x"), Ok(0));
        assert_eq!(parse_integer("1700000000000", "x"), Ok(1_700_000_000_000));
        assert!(parse_integer("-1", "x").unwrap_err().0.contains("negative"));
        assert!(parse_integer("1.5", "x").unwrap_err().0.contains("whole"));
        assert!(parse_integer("1e12", "x").unwrap_err().0.contains("whole"));
        assert!(parse_integer(" 1", "x").is_err());
        assert!(parse_integer("9223372036854775808", "x")
            .unwrap_err()
            .0
            .contains("range"));
    }

    #[test]
    fn absolute_times() {
        assert_eq!(
            parse_epoch_ms_or_rfc3339("1763700000000"),
            Ok(1_763_700_000_000)
        );
        assert_eq!(
            parse_epoch_ms_or_rfc3339("2025-11-21T04:40:00Z"),
            Ok(1_763_700_000_000)
        );
        assert_eq!(
            parse_epoch_ms_or_rfc3339("2025-11-21T05:40:00.5+01:00"),
            Ok(1_763_700_000_500)
        );
        assert!(parse_epoch_ms_or_rfc3339("1763700000")
            .unwrap_err()
            .0
            .contains("epoch seconds"));
        assert!(parse_epoch_ms_or_rfc3339("1969-12-31T00:00:00Z")
            .unwrap_err()
            .0
            .contains("before the Unix epoch"));
        assert!(parse_epoch_ms_or_rfc3339("tomorrow").is_err());
        assert!(parse_epoch_ms_or_rfc3339("-1763700000000")
            .unwrap_err()
            .0
            .contains("negative"));
    }

    #[test]
    fn retry_after_has_http_semantics() {
        let base = 1_763_700_000_000;
        assert_eq!(parse_retry_after("0", base), Ok(base));
        assert_eq!(parse_retry_after("120", base), Ok(base + 120_000));
        assert_eq!(parse_retry_after("500ms", base), Ok(base + 500));
        assert_eq!(parse_retry_after("1m30s", base), Ok(base + 90_000));
        assert_eq!(
            parse_retry_after("Fri, 21 Nov 2025 04:40:00 GMT", 0),
            Ok(1_763_700_000_000)
        );
        assert!(parse_retry_after("-5", base)
            .unwrap_err()
            .0
            .contains("negative"));
        assert!(parse_retry_after("1.5", base).is_err());
        assert!(parse_retry_after("soon", base)
            .unwrap_err()
            .0
            .contains("HTTP-date"));
        assert!(parse_retry_after("Fri, 32 Nov 2025 04:40:00 GMT", base)
            .unwrap_err()
            .0
            .contains("HTTP-date"));
        assert!(parse_retry_after("9223372036854775", u64::MAX - 5)
            .unwrap_err()
            .0
            .contains("range"));
        assert!(parse_retry_after("", base).is_err());
    }

    proptest! {
        #[test]
        fn retry_after_never_panics_and_never_goes_back(s in "\\PC{0,32}", base in 0u64..(1u64 << 62)) {
            if let Ok(due) = parse_retry_after(&s, base) {
                if !s.contains(',') && !s.ends_with("GMT") {
                    prop_assert!(due >= base);
                }
            }
        }
    }

    proptest! {
        #[test]
        fn duration_parser_never_panics(s in "\\PC{0,24}") {
            let _ = parse_duration_ms(&s);
            let _ = parse_epoch_ms_or_rfc3339(&s);
        }

        #[test]
        fn durations_round_trip(d in 0u64..1_000, h in 0u64..24, m in 0u64..60, s in 0u64..60, ms in 0u64..1000) {
            let text = format!("{d}d{h}h{m}m{s}s{ms}ms");
            prop_assert_eq!(parse_duration_ms(&text), Ok(((d * 24 + h) * 60 + m) * 60_000 + s * 1000 + ms));
        }
    }
}
