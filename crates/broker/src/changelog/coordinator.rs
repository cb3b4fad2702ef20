//! The group's coordinator, asked directly ([`crate::wire`]) for the group's members
//! (DescribeGroups version 5, flexible, served by every Kafka since 2.4 and still by 4.x) and
//! to remove one ([`super::leave`]), on one connection kept between requests.
//!
//! librdkafka's group listing asks every broker of the cluster and waits for each one's
//! answer: with one broker cut off from this instance (its packets dropped), every listing
//! waits out its whole timeout and fails, although the coordinator alone holds the group and
//! answers at once. A member killed meanwhile would wait for its session after all.
//!
//! Encoding and decoding are pure ([`describe_groups`], [`members_of`]); [`Coordinator`] does
//! the I/O.

use std::time::Duration;

use super::leave;
use super::owners::Peer;
use crate::wire::{compact_str, framed, header, uvarint, Conn, Reader, Security, WireError};

/// DescribeGroups' API key.
const DESCRIBE_GROUPS: i16 = 15;

/// A DescribeGroups (v5) request for `group`, framed.
pub(crate) fn describe_groups(correlation: i32, group: &str) -> Vec<u8> {
    let mut b = header(DESCRIBE_GROUPS, 5, correlation, true);
    uvarint(&mut b, 2); // one group
    compact_str(&mut b, Some(group));
    b.push(0); // no authorized operations
    b.push(0); // no tagged fields
    framed(b)
}

/// The members of the first group of a DescribeGroups (v5) answer (without its size); none for
/// a group the coordinator does not know (state `Dead`).
pub(crate) fn members_of(answer: &[u8]) -> Result<Vec<Peer>, WireError> {
    let bad = || WireError::Malformed("DescribeGroups");
    let mut r = Reader(answer);
    r.response_header(true).ok_or_else(bad)?;
    r.i32().ok_or_else(bad)?; // throttle
    if r.compact_len().ok_or_else(bad)? == 0 {
        return Err(bad());
    }
    let code = r.i16().ok_or_else(bad)?;
    if code != 0 {
        return Err(WireError::Kafka {
            request: "DescribeGroups",
            code,
            message: None,
        });
    }
    for _ in 0..4 {
        r.compact_str().ok_or_else(bad)?; // group id, state, protocol type and protocol
    }
    let mut members = Vec::new();
    for _ in 0..r.compact_len().ok_or_else(bad)? {
        let member_id = r.compact_str().ok_or_else(bad)?.ok_or_else(bad)?;
        r.compact_str().ok_or_else(bad)?; // instance id
        let client_id = r.compact_str().ok_or_else(bad)?.unwrap_or_default();
        let host = r.compact_str().ok_or_else(bad)?.unwrap_or_default();
        r.compact_bytes().ok_or_else(bad)?; // metadata
        r.compact_bytes().ok_or_else(bad)?; // assignment
        r.tagged().ok_or_else(bad)?;
        members.push(Peer {
            member_id,
            client_id,
            host,
        });
    }
    Ok(members)
}

/// A group's coordinator, found through the bootstrap servers and kept connected until a
/// request on the connection fails.
#[derive(Debug)]
pub struct Coordinator {
    security: Security,
    brokers: String,
    group: String,
    /// Longest each step (connecting, TLS, SASL, an answer) is waited for.
    timeout: Duration,
    conn: Option<Conn>,
}

impl Coordinator {
    /// The coordinator of `group`, found through `brokers` (`--brokers`).
    pub fn new(security: Security, brokers: &str, group: &str, timeout: Duration) -> Self {
        Self {
            security,
            brokers: brokers.to_owned(),
            group: group.to_owned(),
            timeout,
            conn: None,
        }
    }

    /// The group's members, as the coordinator names them. Blocking.
    ///
    /// # Errors
    /// The coordinator could not be found or reached, or refused.
    pub fn members(&mut self) -> Result<Vec<Peer>, WireError> {
        let group = self.group.clone();
        self.ask(|n| describe_groups(n, &group), members_of)
    }

    /// Removes `member_id` (the static member of `instance_id`, if it is one) from the group.
    /// Blocking.
    ///
    /// # Errors
    /// As [`Coordinator::members`], including [`leave::code::UNKNOWN_MEMBER_ID`] and
    /// [`leave::code::FENCED_INSTANCE_ID`] for a member that is already gone or replaced.
    pub fn remove(&mut self, member_id: &str, instance_id: Option<&str>) -> Result<(), WireError> {
        let group = self.group.clone();
        self.ask(
            |n| leave::leave_group(n, &group, member_id, instance_id),
            leave::left,
        )
    }

    /// One request and its answer read: on the kept connection, or on a new one to the
    /// coordinator found again when the kept one fails. Any error drops the connection (a
    /// coordinator that moved answers NOT_COORDINATOR; the next request finds the new one).
    fn ask<T>(
        &mut self,
        build: impl Fn(i32) -> Vec<u8>,
        read: impl Fn(&[u8]) -> Result<T, WireError>,
    ) -> Result<T, WireError> {
        let answer = match self.conn.take().map(|mut c| (c.exchange(&build), c)) {
            Some((Ok(answer), c)) => {
                self.conn = Some(c);
                answer
            }
            // Never connected, or the kept connection failed (closed by the broker): once more
            // on a new connection.
            _ => {
                let mut c =
                    leave::coordinator(&self.security, &self.brokers, &self.group, self.timeout)?;
                let answer = c.exchange(&build)?;
                self.conn = Some(c);
                answer
            }
        };
        let read = read(&answer);
        if read.is_err() {
            self.conn = None;
        }
        read
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_describe_request_names_the_one_group() {
        let b = describe_groups(3, "g1");
        assert_eq!(&b[4..12], &[0, 15, 0, 5, 0, 0, 0, 3]);
        let id_len = usize::from(u16::from_be_bytes([b[12], b[13]]));
        assert_eq!(
            &b[4 + 10 + id_len + 1..],
            &[2, 3, b'g', b'1', 0, 0],
            "one group, its id; no authorized operations; tagged"
        );
    }

    /// A compact string.
    fn s(out: &mut Vec<u8>, v: &str) {
        compact_str(out, Some(v));
    }

    /// An answer: correlation 1, no tagged fields, throttle 0; one group with `code`.
    fn answer(code: i16, members: &[(&str, Option<&str>, &str, &str)]) -> Vec<u8> {
        let mut a = vec![0, 0, 0, 1, 0, 0, 0, 0, 0, 2];
        a.extend(code.to_be_bytes());
        for v in ["g", "Stable", "consumer", "range"] {
            s(&mut a, v);
        }
        uvarint(&mut a, members.len() as u64 + 1);
        for (member, instance, client, host) in members {
            s(&mut a, member);
            compact_str(&mut a, *instance);
            s(&mut a, client);
            s(&mut a, host);
            a.extend([3, 0xaa, 0xbb, 1]); // metadata (2 bytes), no assignment
            a.extend([1, 7, 1, 0xcc]); // one tagged field, skipped
        }
        a.extend(0i32.to_be_bytes()); // authorized operations
        a.extend([0, 0]); // the group's tagged fields, the answer's
        a
    }

    #[test]
    fn a_describe_answer_reads_as_the_members_or_the_error() {
        let a = answer(
            0,
            &[
                (
                    "a-1",
                    Some("a"),
                    "kafka-delay/changelog@127.0.0.1:1",
                    "/127.0.0.1",
                ),
                ("rdkafka-2", None, "rdkafka", "/10.0.0.2"),
            ],
        );
        let members = members_of(&a).unwrap();
        assert_eq!(
            members,
            vec![
                Peer {
                    member_id: "a-1".into(),
                    client_id: "kafka-delay/changelog@127.0.0.1:1".into(),
                    host: "/127.0.0.1".into(),
                },
                Peer {
                    member_id: "rdkafka-2".into(),
                    client_id: "rdkafka".into(),
                    host: "/10.0.0.2".into(),
                },
            ]
        );
        assert_eq!(members_of(&answer(0, &[])).unwrap(), vec![]);
        // NOT_COORDINATOR: the coordinator moved.
        let e = members_of(&answer(16, &[])).unwrap_err();
        assert!(matches!(e, WireError::Kafka { code: 16, .. }), "{e}");
        assert!(matches!(
            members_of(&a[..a.len() - 12]),
            Err(WireError::Malformed(_))
        ));
    }
}
