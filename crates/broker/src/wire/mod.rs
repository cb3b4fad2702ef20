//! The few Kafka requests librdkafka has no call for, spoken on connections of their own: the
//! framing and the encodings of the Kafka wire protocol that they need (request header v1
//! and v2, compact strings and arrays, tagged fields), and a connection that authenticates as
//! the broker's own clients do ([`security`]: PLAINTEXT, SSL, SASL PLAIN and SCRAM).
//!
//! Encoding and decoding are pure; [`Conn::exchange`] does the I/O.

pub mod scram;
pub mod security;

use std::io::{Read, Write};

use thiserror::Error;

pub use security::{Conn, Security};

/// The `client.id` these requests carry.
const CLIENT_ID: &str = "kafka-delay-admin";
/// Largest answer read (the answers these requests get are under a kilobyte).
const MAX_ANSWER: usize = 1 << 20;

/// Why a request got no usable answer.
#[derive(Debug, Error)]
pub enum WireError {
    /// The connection failed.
    #[error("cannot reach {what}: {detail}")]
    Io {
        /// Whom.
        what: String,
        /// The error.
        detail: String,
    },
    /// An answer that does not parse.
    #[error("malformed {0} answer")]
    Malformed(&'static str),
    /// Kafka answered with an error code.
    #[error("{request} answered error code {code}{}", message.as_deref().map(|m| format!(": {m}")).unwrap_or_default())]
    Kafka {
        /// The request.
        request: &'static str,
        /// Kafka's error code.
        code: i16,
        /// Its message, if it gave one.
        message: Option<String>,
    },
    /// Authentication failed, or the settings ask for what is not spoken here.
    #[error("{0}")]
    Auth(String),
}

/// A request header: API key and version, correlation id, client id (a nullable string with an
/// int16 length in every version), and in flexible versions (header v2) no tagged fields.
pub(crate) fn header(api: i16, version: i16, correlation: i32, flexible: bool) -> Vec<u8> {
    let mut b = Vec::with_capacity(64);
    b.extend(api.to_be_bytes());
    b.extend(version.to_be_bytes());
    b.extend(correlation.to_be_bytes());
    string(&mut b, CLIENT_ID);
    if flexible {
        b.push(0);
    }
    b
}

/// `body` with its size before it.
pub(crate) fn framed(body: Vec<u8>) -> Vec<u8> {
    let mut b = Vec::with_capacity(body.len() + 4);
    b.extend(i32::try_from(body.len()).unwrap_or(i32::MAX).to_be_bytes());
    b.extend(body);
    b
}

/// A string with an int16 length.
pub(crate) fn string(b: &mut Vec<u8>, s: &str) {
    b.extend(i16::try_from(s.len()).unwrap_or(i16::MAX).to_be_bytes());
    b.extend(s.as_bytes());
}

/// Compact (nullable) bytes: the length plus one as an unsigned varint (0 for null).
pub(crate) fn compact_bytes(b: &mut Vec<u8>, s: Option<&[u8]>) {
    match s {
        None => b.push(0),
        Some(s) => {
            uvarint(b, s.len() as u64 + 1);
            b.extend(s);
        }
    }
}

/// A compact (nullable) string.
pub(crate) fn compact_str(b: &mut Vec<u8>, s: Option<&str>) {
    compact_bytes(b, s.map(str::as_bytes));
}

/// An unsigned varint.
pub(crate) fn uvarint(b: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        b.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    b.push(v as u8);
}

/// Writes a framed request and reads its framed answer (without its size).
pub(crate) fn exchange(s: &mut (impl Read + Write), request: &[u8]) -> std::io::Result<Vec<u8>> {
    s.write_all(request)?;
    s.flush()?;
    let mut size = [0u8; 4];
    s.read_exact(&mut size)?;
    let size = usize::try_from(i32::from_be_bytes(size))
        .ok()
        .filter(|n| *n <= MAX_ANSWER)
        .ok_or_else(|| std::io::Error::other("an answer's size out of bounds"))?;
    let mut answer = vec![0u8; size];
    s.read_exact(&mut answer)?;
    Ok(answer)
}

/// Reads an answer's fields in order; `None` for one that is not all there.
pub(crate) struct Reader<'a>(pub(crate) &'a [u8]);

impl<'a> Reader<'a> {
    pub(crate) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        (self.0.len() >= n).then(|| {
            let (head, rest) = self.0.split_at(n);
            self.0 = rest;
            head
        })
    }

    pub(crate) fn i16(&mut self) -> Option<i16> {
        Some(i16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }

    pub(crate) fn i32(&mut self) -> Option<i32> {
        Some(i32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }

    pub(crate) fn uvarint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self.take(1)?.first()?;
            v |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return Some(v);
            }
        }
        None
    }

    /// A compact array's length (null reads as empty).
    pub(crate) fn compact_len(&mut self) -> Option<usize> {
        usize::try_from(self.uvarint()?.saturating_sub(1)).ok()
    }

    /// Compact nullable bytes.
    pub(crate) fn compact_bytes(&mut self) -> Option<Option<&'a [u8]>> {
        match self.uvarint()? {
            0 => Some(None),
            n => Some(Some(self.take(usize::try_from(n - 1).ok()?)?)),
        }
    }

    /// A compact nullable string.
    pub(crate) fn compact_str(&mut self) -> Option<Option<String>> {
        Some(
            self.compact_bytes()?
                .map(|b| String::from_utf8_lossy(b).into_owned()),
        )
    }

    /// A string with an int16 length.
    pub(crate) fn string(&mut self) -> Option<String> {
        let n = usize::try_from(self.i16()?).ok()?;
        Some(String::from_utf8_lossy(self.take(n)?).into_owned())
    }

    /// Skips tagged fields.
    pub(crate) fn tagged(&mut self) -> Option<()> {
        for _ in 0..self.uvarint()? {
            self.uvarint()?;
            let size = usize::try_from(self.uvarint()?).ok()?;
            self.take(size)?;
        }
        Some(())
    }

    /// A response header: the correlation id, and in flexible versions (v1) tagged fields.
    pub(crate) fn response_header(&mut self, flexible: bool) -> Option<i32> {
        let correlation = self.i32()?;
        if flexible {
            self.tagged()?;
        }
        Some(correlation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_fields_and_varints_read_back_as_written() {
        let mut b = Vec::new();
        uvarint(&mut b, 300);
        assert_eq!(b, [0xac, 0x02]);
        compact_str(&mut b, Some("abc"));
        compact_str(&mut b, None);
        string(&mut b, "xy");
        let mut r = Reader(&b);
        assert_eq!(r.uvarint(), Some(300));
        assert_eq!(r.compact_str(), Some(Some("abc".to_owned())));
        assert_eq!(r.compact_str(), Some(None));
        assert_eq!(r.string(), Some("xy".to_owned()));
        assert_eq!(r.take(1), None);
    }

    #[test]
    fn a_header_carries_the_api_and_the_client_id() {
        let h = header(13, 4, 7, true);
        assert_eq!(&h[..8], &[0, 13, 0, 4, 0, 0, 0, 7]);
        assert_eq!(&h[10..h.len() - 1], CLIENT_ID.as_bytes());
        assert_eq!(h[h.len() - 1], 0);
        assert_eq!(header(17, 1, 7, false).len(), h.len() - 1);
    }
}
