//! The changelog's format: the entries a source partition's changelog holds, and the checkpoint
//! a local store keeps of the changelog position it reflects.
//!
//! Source partition `p` writes to changelog partition `p`. Its entries are keyed so that
//! compaction keeps only the latest of each:
//!
//! | key                   | value                                   |
//! |-----------------------|-----------------------------------------|
//! | `r` ++ offset (8 B)   | the pending record (its stored bytes), a pointer to it, or a tombstone once it is gone |
//! | `o`                   | the next source offset ingest will consume (8 B) |
//!
//! Offsets are big-endian, so a record and its tombstone share a key and compaction keeps only
//! the tombstone.
//!
//! A **pointer** leaves the record's value in the source topic, at the offset its key names:
//! its value is [`POINTER`], the value's length (4 B, big-endian), then the record's stored
//! bytes without the value (its envelope: due time, target, id, key, headers). Ingest writes a
//! pointer only where the source topic keeps the record until after it is due
//! ([`Retention::keeps`]); the restore reads the value back from the source
//! ([`resolve`]).

use crate::record::StoredRecord;

/// The first byte of a pointer's value (a stored record's is its version, 1).
pub const POINTER: u8 = 0x80;

/// One change to a partition's pending state, to write.
#[derive(Debug, Clone, Copy)]
pub enum Entry<'a> {
    /// The record at this source offset is pending as given (new, or moved by an operator).
    Record(i64, &'a StoredRecord),
    /// The record at this source offset is pending as given, and the source topic keeps its
    /// value until it is due: only the rest is written.
    Pointer(i64, &'a StoredRecord),
    /// The record at this source offset is gone (fired, cancelled, replaced).
    Gone(i64),
    /// Ingest consumed the source partition up to here (exclusive).
    SourceOffset(i64),
}

impl Entry<'_> {
    /// The entry's key.
    pub fn key(&self) -> Vec<u8> {
        match self {
            Entry::Record(offset, _) | Entry::Pointer(offset, _) | Entry::Gone(offset) => {
                let mut k = Vec::with_capacity(9);
                k.push(b'r');
                k.extend_from_slice(&offset.to_be_bytes());
                k
            }
            Entry::SourceOffset(_) => b"o".to_vec(),
        }
    }

    /// The entry's value; `None` is a tombstone.
    pub fn payload(&self) -> Option<Vec<u8>> {
        match self {
            Entry::Record(_, record) => Some(record.encoded().to_vec()),
            Entry::Pointer(_, record) => {
                let envelope = StoredRecord::new(
                    record.due_ms(),
                    record.target(),
                    record.id(),
                    record.key(),
                    None,
                    record.headers(),
                );
                let len = record.value().map_or(u32::MAX, |v| v.len() as u32);
                let mut v = Vec::with_capacity(5 + envelope.encoded().len());
                v.push(POINTER);
                v.extend_from_slice(&len.to_be_bytes());
                v.extend_from_slice(envelope.encoded());
                Some(v)
            }
            Entry::Gone(_) => None,
            Entry::SourceOffset(next) => Some(next.to_be_bytes().to_vec()),
        }
    }
}

/// One changelog entry, as restored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Restored {
    /// The record at this source offset is pending, as given.
    Record {
        /// Source offset.
        offset: i64,
        /// The record.
        record: StoredRecord,
    },
    /// The record at this source offset is pending; its value is the source record's
    /// ([`resolve`]).
    Pointer {
        /// Source offset.
        offset: i64,
        /// The record without its value.
        envelope: StoredRecord,
        /// The value's length (`u32::MAX`: no value).
        value_len: u32,
    },
    /// The record at this source offset is not pending (fired, cancelled or replaced).
    Gone {
        /// Source offset.
        offset: i64,
    },
    /// Ingest had consumed the source partition up to here (exclusive).
    SourceOffset(i64),
}

/// Why a changelog entry cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// A key that is not one of the entries'.
    #[error("unknown key {0:?}")]
    UnknownKey(Option<Vec<u8>>),
    /// A source offset whose value is not 8 bytes.
    #[error("source offset of {0} bytes")]
    SourceOffset(usize),
    /// A record key whose offset is not 8 bytes.
    #[error("record key of {0} bytes")]
    RecordKey(usize),
    /// A record value that does not decode.
    #[error("record: {0}")]
    Record(String),
}

/// Reads a changelog entry back.
///
/// # Errors
/// A [`DecodeError`] naming what is wrong with a key or value of the wrong shape.
pub fn decode(key: Option<&[u8]>, payload: Option<&[u8]>) -> Result<Restored, DecodeError> {
    match (key, payload) {
        (Some([b'o']), Some(v)) => v
            .try_into()
            .map(|b| Restored::SourceOffset(i64::from_be_bytes(b)))
            .map_err(|_| DecodeError::SourceOffset(v.len())),
        (Some([b'r', rest @ ..]), value) => {
            let offset = i64::from_be_bytes(
                rest.try_into()
                    .map_err(|_| DecodeError::RecordKey(rest.len() + 1))?,
            );
            match value {
                None => Ok(Restored::Gone { offset }),
                Some([POINTER, rest @ ..]) => {
                    let (len, envelope) = rest
                        .split_first_chunk::<4>()
                        .ok_or(DecodeError::Record("pointer of under 5 bytes".into()))?;
                    StoredRecord::from_bytes(envelope.to_vec())
                        .map(|envelope| Restored::Pointer {
                            offset,
                            envelope,
                            value_len: u32::from_be_bytes(*len),
                        })
                        .map_err(DecodeError::Record)
                }
                Some(v) => StoredRecord::from_bytes(v.to_vec())
                    .map(|record| Restored::Record { offset, record })
                    .map_err(DecodeError::Record),
            }
        }
        (k, _) => Err(DecodeError::UnknownKey(k.map(<[u8]>::to_vec))),
    }
}

/// A pointer's value as the source topic gave it back is not the one it was written for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the source record's value is {found} bytes, the pointer says {expected}")]
pub struct Mismatch {
    /// The length the pointer recorded (`u32::MAX`: no value).
    pub expected: u32,
    /// The source record's.
    pub found: u32,
}

/// The record a pointer stands for, given the value of the source record it points at.
///
/// # Errors
/// A [`Mismatch`] when the value is not the one the pointer was written for (the source topic
/// was deleted and created again since).
pub fn resolve(
    envelope: &StoredRecord,
    value_len: u32,
    value: Option<&[u8]>,
) -> Result<StoredRecord, Mismatch> {
    let found = value.map_or(u32::MAX, |v| v.len() as u32);
    if found != value_len {
        return Err(Mismatch {
            expected: value_len,
            found,
        });
    }
    Ok(envelope.with_value(value))
}

/// How long a source topic keeps its records, as far as the changelog needs to know: whether a
/// record can be read back from it at a later time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// `cleanup.policy` is `delete` alone (compaction may drop a record for a later one of
    /// its key).
    pub delete_only: bool,
    /// `retention.ms`; `None` keeps records forever.
    pub ms: Option<u64>,
    /// `retention.bytes` is set: records may go whatever their age.
    pub bytes_bounded: bool,
}

impl Retention {
    /// From a topic's effective configuration values (`-1` for unbounded, as Kafka has it).
    pub fn from_config(cleanup_policy: &str, retention_ms: i64, retention_bytes: i64) -> Self {
        Self {
            delete_only: cleanup_policy.trim() == "delete",
            ms: u64::try_from(retention_ms).ok(),
            bytes_bounded: retention_bytes >= 0,
        }
    }

    /// Whether a record with timestamp `timestamp_ms` is still in the topic at `until_ms`.
    /// Kafka deletes by segment, once the newest timestamp in the segment is older than the
    /// retention, so a record lasts at least its own timestamp plus the retention.
    pub fn keeps(&self, timestamp_ms: u64, until_ms: u64) -> bool {
        self.delete_only
            && !self.bytes_bounded
            && self
                .ms
                .is_none_or(|ms| timestamp_ms.saturating_add(ms) > until_ms)
    }

    /// Whether some record `before` kept until a time, `self` may delete sooner: pointers
    /// written under `before` may then point at records that will be gone.
    pub fn shorter_than(&self, before: &Retention) -> bool {
        (before.delete_only && !self.delete_only)
            || (!before.bytes_bounded && self.bytes_bounded)
            || match (before.ms, self.ms) {
                (None, Some(_)) => true,
                (Some(was), Some(now)) => now < was,
                (_, None) => false,
            }
    }
}

/// The changelog position the local state of a partition reflects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checkpoint {
    /// Every changelog entry below this offset is reflected in the local state.
    pub changelog_next: i64,
    /// The next source offset to consume, as the changelog confirms it (`None`: nothing
    /// consumed yet).
    pub source_next: Option<i64>,
}

impl Checkpoint {
    /// The checkpoint's 16 bytes: the changelog offset, then the source offset (`-1` for
    /// none), big-endian.
    pub fn encode(self) -> [u8; 16] {
        let mut v = [0u8; 16];
        v[..8].copy_from_slice(&self.changelog_next.to_be_bytes());
        v[8..].copy_from_slice(&self.source_next.unwrap_or(-1).to_be_bytes());
        v
    }

    /// Reads [`Checkpoint::encode`]'s bytes back; `None` for bytes of another shape.
    pub fn decode(v: &[u8]) -> Option<Self> {
        let changelog_next = i64::from_be_bytes(v.get(..8)?.try_into().ok()?);
        let source = i64::from_be_bytes(v.get(8..16)?.try_into().ok()?);
        Some(Self {
            changelog_next,
            source_next: (source >= 0).then_some(source),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(due: u64) -> StoredRecord {
        StoredRecord::new(due, "out", Some(b"id-1"), Some(b"k"), Some(b"v"), [])
    }

    #[test]
    fn entries_read_back_as_what_they_wrote() {
        let r = record(1_234);
        for (e, want) in [
            (
                Entry::Record(7, &r),
                Restored::Record {
                    offset: 7,
                    record: r.clone(),
                },
            ),
            (Entry::Gone(7), Restored::Gone { offset: 7 }),
            (Entry::SourceOffset(99), Restored::SourceOffset(99)),
        ] {
            assert_eq!(decode(Some(&e.key()), e.payload().as_deref()), Ok(want));
        }
        // A record and its tombstone share a key, so compaction keeps only the tombstone.
        assert_eq!(Entry::Record(7, &r).key(), Entry::Gone(7).key());
        assert_ne!(Entry::Gone(7).key(), Entry::Gone(8).key());
    }

    #[test]
    fn a_pointer_leaves_the_value_out_and_resolves_with_the_source_value() {
        let r = StoredRecord::new(
            1_234,
            "out",
            Some(b"id-1"),
            Some(b"k"),
            Some(&[7u8; 1_000]),
            [crate::record::HeaderRef {
                key: "h",
                value: Some(b"v"),
            }],
        );
        let e = Entry::Pointer(9, &r);
        assert_eq!(e.key(), Entry::Gone(9).key());
        let payload = e.payload().unwrap();
        assert!(payload.len() < 100, "{} bytes", payload.len());
        let Ok(Restored::Pointer {
            offset: 9,
            envelope,
            value_len: 1_000,
        }) = decode(Some(&e.key()), Some(&payload))
        else {
            panic!("not a pointer");
        };
        assert_eq!(envelope.value(), None);
        assert_eq!(
            resolve(&envelope, 1_000, Some(&[7u8; 1_000])),
            Ok(r.clone())
        );
        assert_eq!(
            resolve(&envelope, 1_000, Some(b"other")),
            Err(Mismatch {
                expected: 1_000,
                found: 5
            })
        );
        // A record without a value points at one without a value.
        let none = StoredRecord::new(5, "out", None, Some(b"k"), None, []);
        let Ok(Restored::Pointer {
            envelope,
            value_len,
            ..
        }) = decode(
            Some(&Entry::Pointer(1, &none).key()),
            Entry::Pointer(1, &none).payload().as_deref(),
        )
        else {
            panic!("not a pointer");
        };
        assert_eq!(resolve(&envelope, value_len, None), Ok(none));
        assert!(decode(Some(&e.key()), Some(&[POINTER, 0, 0])).is_err());
    }

    #[test]
    fn a_record_is_pointed_at_only_while_its_topic_keeps_it() {
        let week: i64 = 7 * 24 * 3_600_000;
        let w = week as u64;
        let kept = Retention::from_config("delete", week, -1);
        assert!(kept.keeps(1_000, 1_000 + w - 1));
        assert!(!kept.keeps(1_000, 1_000 + w));
        assert!(Retention::from_config("delete", -1, -1).keeps(0, u64::MAX));
        for other in [
            Retention::from_config("compact", -1, -1),
            Retention::from_config("compact,delete", week, -1),
            Retention::from_config("delete", week, 1 << 30),
        ] {
            assert!(!other.keeps(1_000, 1_001), "{other:?}");
            assert!(other.shorter_than(&kept), "{other:?}");
        }
        assert!(Retention::from_config("delete", 1_000, -1).shorter_than(&kept));
        assert!(kept.shorter_than(&Retention::from_config("delete", -1, -1)));
        assert!(!kept.shorter_than(&kept));
        assert!(!Retention::from_config("delete", -1, -1).shorter_than(&kept));
        assert!(!Retention::from_config("delete", week * 2, -1).shorter_than(&kept));
    }

    #[test]
    fn entries_of_the_wrong_shape_are_named() {
        assert_eq!(
            decode(Some(b"x"), Some(b"1")),
            Err(DecodeError::UnknownKey(Some(b"x".to_vec())))
        );
        assert_eq!(
            decode(Some(b"o"), Some(b"123")),
            Err(DecodeError::SourceOffset(3))
        );
        assert_eq!(decode(Some(b"r12"), None), Err(DecodeError::RecordKey(3)));
        assert_eq!(decode(None, None), Err(DecodeError::UnknownKey(None)));
        assert!(decode(None, None)
            .unwrap_err()
            .to_string()
            .contains("unknown key"));
    }

    #[test]
    fn a_checkpoint_reads_back_as_written() {
        for c in [
            Checkpoint {
                changelog_next: 42,
                source_next: Some(7),
            },
            Checkpoint {
                changelog_next: 0,
                source_next: None,
            },
        ] {
            assert_eq!(Checkpoint::decode(&c.encode()), Some(c));
        }
        assert_eq!(Checkpoint::decode(&[0u8; 15]), None);
    }
}
