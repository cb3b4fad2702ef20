//! The admin LeaveGroup of KIP-345, which librdkafka has no call for: removes a member from a
//! classic consumer group on another member's behalf, so that the group rebalances now rather
//! than when the member's session runs out. Two requests on connections of their own
//! ([`crate::wire`], authenticated as the broker's clients are): FindCoordinator (version 3)
//! to a bootstrap broker, then LeaveGroup (version 4, which names a static member by its
//! `group.instance.id`) to the group's coordinator. Both versions are flexible, served by
//! every Kafka since 2.4 and still by 4.x.
//!
//! Encoding and decoding are pure ([`find_coordinator`], [`leave_group`], [`coordinator_of`],
//! [`left`]); [`coordinator`] connects, [`super::coordinator::Coordinator`] asks.

use std::time::Duration;

use crate::wire::{compact_str, framed, header, uvarint, Conn, Reader, Security, WireError};

/// FindCoordinator's API key.
const FIND_COORDINATOR: i16 = 10;
/// LeaveGroup's API key.
const LEAVE_GROUP: i16 = 13;
/// Kafka's error codes these requests meet.
pub mod code {
    /// The coordinator is still loading the group's metadata.
    pub const COORDINATOR_LOAD_IN_PROGRESS: i16 = 14;
    /// The group's coordinator is not available (it is moving).
    pub const COORDINATOR_NOT_AVAILABLE: i16 = 15;
    /// The broker asked is not the group's coordinator (any more).
    pub const NOT_COORDINATOR: i16 = 16;
    /// The member was not in the group (it left, or its session ran out, already).
    pub const UNKNOWN_MEMBER_ID: i16 = 25;
    /// The instance id belongs to a newer member now (the instance started again).
    pub const FENCED_INSTANCE_ID: i16 = 82;
}

/// A connection to `group`'s coordinator, found by asking the bootstrap servers `brokers`
/// (comma-separated `host:port`, a `SCHEME://` before each allowed) in turn; `timeout` bounds
/// each step. Blocking.
///
/// # Errors
/// No bootstrap server named the coordinator, or the coordinator could not be reached.
pub fn coordinator(
    security: &Security,
    brokers: &str,
    group: &str,
    timeout: Duration,
) -> Result<Conn, WireError> {
    let mut last = None;
    for broker in brokers.split(',').map(bootstrap_address) {
        let coordinator = security.connect(broker, timeout).and_then(|mut c| {
            let answer = c.exchange(|n| find_coordinator(n, group))?;
            coordinator_of(&answer)
        });
        match coordinator {
            Ok((host, port)) => return security.connect(&format!("{host}:{port}"), timeout),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or(WireError::Io {
        what: "the bootstrap servers".to_owned(),
        detail: "none given".to_owned(),
    }))
}

/// `host:port` of one bootstrap server as librdkafka takes it (a `SCHEME://` before it).
fn bootstrap_address(s: &str) -> &str {
    let s = s.trim();
    s.split_once("://").map_or(s, |(_, rest)| rest)
}

/// A FindCoordinator (v3) request for `group`, framed.
pub(crate) fn find_coordinator(correlation: i32, group: &str) -> Vec<u8> {
    let mut b = header(FIND_COORDINATOR, 3, correlation, true);
    compact_str(&mut b, Some(group));
    b.push(0); // key type: group
    b.push(0); // no tagged fields
    framed(b)
}

/// A LeaveGroup (v4) request removing one member, framed.
pub(crate) fn leave_group(
    correlation: i32,
    group: &str,
    member_id: &str,
    instance_id: Option<&str>,
) -> Vec<u8> {
    let mut b = header(LEAVE_GROUP, 4, correlation, true);
    compact_str(&mut b, Some(group));
    uvarint(&mut b, 2); // one member
    compact_str(&mut b, Some(member_id));
    compact_str(&mut b, instance_id);
    b.push(0); // the member's tagged fields
    b.push(0); // the request's
    framed(b)
}

/// The coordinator's host and port from a FindCoordinator (v3) answer (without its size).
pub(crate) fn coordinator_of(answer: &[u8]) -> Result<(String, u16), WireError> {
    let bad = || WireError::Malformed("FindCoordinator");
    let mut r = Reader(answer);
    r.response_header(true).ok_or_else(bad)?;
    r.i32().ok_or_else(bad)?; // throttle
    let code = r.i16().ok_or_else(bad)?;
    let message = r.compact_str().ok_or_else(bad)?;
    if code != 0 {
        return Err(WireError::Kafka {
            request: "FindCoordinator",
            code,
            message,
        });
    }
    r.i32().ok_or_else(bad)?; // node id
    let host = r.compact_str().ok_or_else(bad)?.ok_or_else(bad)?;
    let port = u16::try_from(r.i32().ok_or_else(bad)?).map_err(|_| bad())?;
    Ok((host, port))
}

/// Whether a LeaveGroup (v4) answer (without its size) says the member left: the request's
/// error code, then the member's.
pub(crate) fn left(answer: &[u8]) -> Result<(), WireError> {
    let bad = || WireError::Malformed("LeaveGroup");
    let kafka = |code| WireError::Kafka {
        request: "LeaveGroup",
        code,
        message: None,
    };
    let mut r = Reader(answer);
    r.response_header(true).ok_or_else(bad)?;
    r.i32().ok_or_else(bad)?; // throttle
    let code = r.i16().ok_or_else(bad)?;
    if code != 0 {
        return Err(kafka(code));
    }
    for _ in 0..r.compact_len().ok_or_else(bad)? {
        r.compact_str().ok_or_else(bad)?; // member id
        r.compact_str().ok_or_else(bad)?; // instance id
        let code = r.i16().ok_or_else(bad)?;
        if code != 0 {
            return Err(kafka(code));
        }
        r.tagged().ok_or_else(bad)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The body after the request header (which `wire`'s tests cover).
    fn body(b: &[u8]) -> &[u8] {
        assert_eq!(
            i32::from_be_bytes(b[..4].try_into().unwrap()) as usize,
            b.len() - 4
        );
        let id_len = usize::from(u16::from_be_bytes([b[12], b[13]]));
        &b[4 + 10 + id_len + 1..]
    }

    #[test]
    fn a_leave_group_request_names_the_member_and_its_instance() {
        let b = leave_group(7, "g", "i-1", Some("i"));
        assert_eq!(&b[4..12], &[0, 13, 0, 4, 0, 0, 0, 7]);
        assert_eq!(
            body(&b),
            &[2, b'g', 2, 4, b'i', b'-', b'1', 2, b'i', 0, 0],
            "group, one member: its id, its instance id, tagged; tagged"
        );
        // A dynamic member has no instance id: a null compact string.
        let b = leave_group(7, "g", "m", None);
        assert_eq!(body(&b), &[2, b'g', 2, 2, b'm', 0, 0, 0]);
    }

    #[test]
    fn a_find_coordinator_request_asks_for_the_group() {
        let b = find_coordinator(1, "grp");
        assert_eq!(&b[4..12], &[0, 10, 0, 3, 0, 0, 0, 1]);
        assert_eq!(body(&b), &[4, b'g', b'r', b'p', 0, 0]);
    }

    /// A response header (correlation 1, one tagged field to skip), throttle 0, `code`.
    fn answer_start(code: i16) -> Vec<u8> {
        let mut a = vec![0, 0, 0, 1, 1, 5, 2, 0xaa, 0xbb, 0, 0, 0, 0];
        a.extend(code.to_be_bytes());
        a
    }

    #[test]
    fn a_coordinator_answer_reads_as_its_address_or_its_error() {
        let mut a = answer_start(0);
        a.push(0); // no message
        a.extend(3i32.to_be_bytes());
        a.extend([10, b'1', b'2', b'7', b'.', b'0', b'.', b'0', b'.', b'1']);
        a.extend(9092i32.to_be_bytes());
        a.push(0);
        assert_eq!(coordinator_of(&a).unwrap(), ("127.0.0.1".to_owned(), 9092));
        let mut a = answer_start(15);
        a.extend([4, b'n', b'o', b'!']);
        let e = coordinator_of(&a).unwrap_err();
        assert!(
            matches!(e, WireError::Kafka { code: 15, message: Some(ref m), .. } if m == "no!"),
            "{e}"
        );
        assert!(matches!(
            coordinator_of(&a[..5]),
            Err(WireError::Malformed(_))
        ));
    }

    #[test]
    fn a_leave_answer_fails_on_the_requests_error_or_the_members() {
        let member = |code: i16| {
            let mut a = answer_start(0);
            a.extend([2, 4, b'i', b'-', b'1', 2, b'i']);
            a.extend(code.to_be_bytes());
            a.extend([0, 0]);
            a
        };
        assert!(left(&member(0)).is_ok());
        let e = left(&member(code::FENCED_INSTANCE_ID)).unwrap_err();
        assert!(matches!(e, WireError::Kafka { code: 82, .. }), "{e}");
        let e = left(&answer_start(16)).unwrap_err();
        assert!(matches!(e, WireError::Kafka { code: 16, .. }), "{e}");
        assert!(matches!(
            left(&member(0)[..12]),
            Err(WireError::Malformed(_))
        ));
    }

    #[test]
    fn a_bootstrap_address_loses_its_scheme() {
        assert_eq!(bootstrap_address(" SASL_SSL://k:9092"), "k:9092");
        assert_eq!(bootstrap_address("k:9092"), "k:9092");
    }
}
