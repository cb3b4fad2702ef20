//! The changelog's format: the entries a source partition's changelog holds, and the checkpoint
//! a local store keeps of the changelog position it reflects.
//!
//! Source partition `p` writes to changelog partition `p`. Its entries are keyed so that
//! compaction keeps only the latest of each:
//!
//! | key                   | value                                   |
//! |-----------------------|-----------------------------------------|
//! | `r` ++ offset (8 B)   | the pending record (its stored bytes), or a tombstone once it is gone |
//! | `o`                   | the next source offset ingest will consume (8 B) |
//!
//! Offsets are big-endian, so a record and its tombstone share a key and compaction keeps only
//! the tombstone.

use crate::record::StoredRecord;

/// One change to a partition's pending state, to write.
#[derive(Debug, Clone, Copy)]
pub enum Entry<'a> {
    /// The record at this source offset is pending as given (new, or moved by an operator).
    Record(i64, &'a StoredRecord),
    /// The record at this source offset is gone (fired, cancelled, replaced).
    Gone(i64),
    /// Ingest consumed the source partition up to here (exclusive).
    SourceOffset(i64),
}

impl Entry<'_> {
    /// The entry's key.
    pub fn key(&self) -> Vec<u8> {
        match self {
            Entry::Record(offset, _) | Entry::Gone(offset) => {
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
                Some(v) => StoredRecord::from_bytes(v.to_vec())
                    .map(|record| Restored::Record { offset, record })
                    .map_err(DecodeError::Record),
            }
        }
        (k, _) => Err(DecodeError::UnknownKey(k.map(<[u8]>::to_vec))),
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
