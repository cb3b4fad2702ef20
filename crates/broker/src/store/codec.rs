//! Byte layouts of keys and values, each behind a type that can only be built from what it
//! encodes. Keys are big-endian so byte order equals numeric order.
//!
//! | column   | key                                   | value                              |
//! |----------|---------------------------------------|------------------------------------|
//! | records  | [`RecordKey`]: `RecordId` (8 B)       | `StoredRecord` (versioned binary) |
//! | due      | [`DueKey`]: `due_ms` (8 B) ++ `RecordId` (8 B) | target topic (UTF-8)      |
//! | ids      | [`IdKey`]: `pid` (2 B) ++ delay-id bytes | [`IdValue`]: `RecordId` (8 B) ++ `due_ms` (8 B) |
//! | offsets  | [`PidKey`]: `pid` (2 B)               | [`NextOffset`] (8 B)               |
//! | meta     | [`MetaKey`]: `p` ++ topic ++ `0x00` ++ partition, `k` ++ `pid` (a changelog checkpoint), or a flag | `pid` (2 B), the checkpoint (16 B), or `1` |
//! | counts   | [`CountKey`]: `t` ++ target, or `m` ++ minute (8 B) | [`Count`] (8 B)       |

use kafka_delay_core::id::{Pid, RecordId};

/// Key of the `records` column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct RecordKey([u8; 8]);

impl RecordKey {
    /// The key of a record.
    pub fn new(id: RecordId) -> Self {
        Self(id.to_bytes())
    }
}

/// Key of the due index: ordered by due time, then record id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DueKey([u8; 16]);

impl DueKey {
    /// The index entry of `id` due at `due_ms`.
    pub fn new(due_ms: u64, id: RecordId) -> Self {
        let mut k = [0u8; 16];
        k[..8].copy_from_slice(&due_ms.to_be_bytes());
        k[8..].copy_from_slice(&id.to_bytes());
        Self(k)
    }

    /// The due time and id of a stored key; `None` if it is not 16 bytes.
    pub fn split(key: &[u8]) -> Option<(u64, RecordId)> {
        let due = u64::from_be_bytes(key.get(..8)?.try_into().ok()?);
        let id = u64::from_be_bytes(key.get(8..16)?.try_into().ok()?);
        (key.len() == 16).then_some((due, RecordId(id)))
    }

    /// The first possible key at due time `due_ms`: where a seek for that time starts.
    pub fn first_at(due_ms: u64) -> [u8; 8] {
        due_ms.to_be_bytes()
    }
}

/// The due-index position right after the entry `(due_ms, id)`: where a paged read goes on.
pub fn due_key_after(due_ms: u64, id: RecordId) -> (u64, RecordId) {
    match id.0.checked_add(1) {
        Some(next) => (due_ms, RecordId(next)),
        None => (due_ms.saturating_add(1), RecordId(0)),
    }
}

/// Key of the `ids` column: a delay-id within its source partition.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdKey(Vec<u8>);

impl IdKey {
    /// The key of delay-id `id` in source partition `pid`.
    pub fn new(pid: Pid, id: &[u8]) -> Self {
        let mut k = Vec::with_capacity(2 + id.len());
        k.extend_from_slice(&pid.to_be_bytes());
        k.extend_from_slice(id);
        Self(k)
    }
}

/// Value of the `ids` column: the pending record an id maps to, and its due time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdValue([u8; 16]);

impl IdValue {
    /// `rid`, due at `due_ms`.
    pub fn new(rid: RecordId, due_ms: u64) -> Self {
        let mut v = [0u8; 16];
        v[..8].copy_from_slice(&rid.to_bytes());
        v[8..].copy_from_slice(&due_ms.to_be_bytes());
        Self(v)
    }

    /// The record and due time of a stored value; `None` if it is shorter than 16 bytes.
    pub fn split(value: &[u8]) -> Option<(RecordId, u64)> {
        let rid = u64::from_be_bytes(value.get(..8)?.try_into().ok()?);
        let due = u64::from_be_bytes(value.get(8..16)?.try_into().ok()?);
        Some((RecordId(rid), due))
    }
}

/// Key of the `offsets` column: a source partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PidKey([u8; 2]);

impl PidKey {
    /// The key of source partition `pid`.
    pub fn new(pid: Pid) -> Self {
        Self(pid.to_be_bytes())
    }

    /// The partition of a stored key; `None` if it is not 2 bytes.
    pub fn split(key: &[u8]) -> Option<Pid> {
        Some(Pid::from_be_bytes(key.try_into().ok()?))
    }
}

/// Value of the `offsets` column: the next offset to ingest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NextOffset([u8; 8]);

impl NextOffset {
    /// Offset `next`.
    pub fn new(next: i64) -> Self {
        Self(next.to_be_bytes())
    }

    /// The offset of a stored value; `None` if it is not 8 bytes.
    pub fn split(value: &[u8]) -> Option<i64> {
        Some(i64::from_be_bytes(value.try_into().ok()?))
    }
}

/// Key of the `meta` column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaKey(Vec<u8>);

impl MetaKey {
    /// Prefix of every partition key.
    pub const PARTITIONS: &'static [u8] = b"p";

    /// The key of source partition `topic`/`partition` (its value is its [`Pid`]).
    pub fn partition(topic: &str, partition: i32) -> Self {
        let mut k = Vec::with_capacity(topic.len() + 6);
        k.extend_from_slice(Self::PARTITIONS);
        k.extend_from_slice(topic.as_bytes());
        k.push(0);
        k.extend_from_slice(&partition.to_be_bytes());
        Self(k)
    }

    /// The key of source partition `pid`'s changelog checkpoint.
    pub fn checkpoint(pid: Pid) -> Self {
        let mut k = b"k".to_vec();
        k.extend_from_slice(&pid.to_be_bytes());
        Self(k)
    }

    /// Present once `counts` has been written by a full recount and kept since.
    pub fn counts_kept() -> Self {
        Self(b"counts-kept".to_vec())
    }

    /// The topic and partition of a stored partition key.
    pub fn split_partition(key: &[u8]) -> Option<(String, i32)> {
        let rest = key.strip_prefix(Self::PARTITIONS)?;
        let (topic, part) = rest.split_at(rest.len().checked_sub(5)?);
        if part.first() != Some(&0) {
            return None;
        }
        let partition = i32::from_be_bytes(part[1..].try_into().ok()?);
        Some((String::from_utf8(topic.to_vec()).ok()?, partition))
    }
}

/// Key of the `counts` column, as [`stats`](super::stats) lays it out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CountKey(Vec<u8>);

impl CountKey {
    /// A key from [`PendingStats::persisted`](super::stats::PendingStats::persisted) or
    /// [`PendingStats::persisted_after`](super::stats::PendingStats::persisted_after).
    pub fn from_stats(key: Vec<u8>) -> Self {
        Self(key)
    }
}

/// Value of the `counts` column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Count([u8; 8]);

impl Count {
    /// Count `n`.
    pub fn new(n: u64) -> Self {
        Self(n.to_be_bytes())
    }
}

macro_rules! bytes {
    ($($t:ty),*) => {$(
        impl AsRef<[u8]> for $t {
            fn as_ref(&self) -> &[u8] {
                &self.0
            }
        }
    )*};
}
bytes!(RecordKey, DueKey, IdKey, IdValue, PidKey, NextOffset, MetaKey, CountKey, Count);

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_delay_core::id::MAX_OFFSET;

    #[test]
    fn record_ids_pack_and_order() {
        let a = RecordId::new(1, 5).unwrap();
        let b = RecordId::new(1, 6).unwrap();
        let c = RecordId::new(2, 0).unwrap();
        assert!(a < b && b < c);
        assert!(RecordKey::new(a) < RecordKey::new(b));
        assert_eq!((a.pid(), a.offset()), (1, 5));
        assert_eq!(RecordId::new(3, MAX_OFFSET).unwrap().offset(), MAX_OFFSET);
        assert!(RecordId::new(0, MAX_OFFSET + 1).is_none());
        assert!(RecordId::new(0, -1).is_none());
    }

    #[test]
    fn the_position_after_an_entry_is_the_next_key_in_order() {
        assert_eq!(due_key_after(5, RecordId(7)), (5, RecordId(8)));
        assert_eq!(due_key_after(5, RecordId(u64::MAX)), (6, RecordId(0)));
        let (d, r) = due_key_after(5, RecordId(7));
        assert!(DueKey::new(d, r) > DueKey::new(5, RecordId(7)));
    }

    #[test]
    fn due_keys_sort_by_due_time_then_id() {
        let k1 = DueKey::new(5, RecordId(900));
        let k2 = DueKey::new(6, RecordId(1));
        let k3 = DueKey::new(256, RecordId(0));
        assert!(k1 < k2 && k2 < k3);
        assert!(k1.as_ref() < k2.as_ref() && k2.as_ref() < k3.as_ref());
        assert_eq!(DueKey::split(k3.as_ref()), Some((256, RecordId(0))));
        assert_eq!(DueKey::split(&k3.as_ref()[..15]), None);
        assert!(DueKey::first_at(256).as_slice() <= k3.as_ref());
    }

    #[test]
    fn values_and_partition_keys_round_trip() {
        assert_eq!(
            IdValue::split(IdValue::new(RecordId(77), 1_234).as_ref()),
            Some((RecordId(77), 1_234))
        );
        assert_eq!(
            MetaKey::split_partition(MetaKey::partition("delay.30s", 7).as_ref()),
            Some(("delay.30s".to_owned(), 7))
        );
        assert_eq!(PidKey::split(PidKey::new(513).as_ref()), Some(513));
        assert_eq!(NextOffset::split(NextOffset::new(-3).as_ref()), Some(-3));
        assert_eq!(IdKey::new(1, b"x").as_ref(), &[0, 1, b'x']);
    }
}
