//! Byte layouts of keys and values. Keys are big-endian so byte order equals numeric order.
//!
//! | column   | key                                   | value                              |
//! |----------|---------------------------------------|------------------------------------|
//! | records  | `RecordId` (8 B)                      | [`StoredRecord`] (versioned binary) |
//! | due      | `due_ms` (8 B) ++ `RecordId` (8 B)    | target topic (UTF-8)               |
//! | ids      | `pid` (2 B) ++ delay-id bytes         | `RecordId` (8 B) ++ `due_ms` (8 B) |
//! | offsets  | `pid` (2 B)                           | next offset to ingest (8 B)        |
//! | meta     | `p` ++ topic ++ `0x00` ++ partition   | `pid` (2 B)                        |

pub use crate::record::StoredRecord;

pub use kafka_delay_core::id::{Pid, RecordId, MAX_OFFSET};

/// Key of the due index.
pub fn due_key(due_ms: u64, id: RecordId) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&due_ms.to_be_bytes());
    k[8..].copy_from_slice(&id.to_bytes());
    k
}

/// The due-index position right after the entry `(due_ms, id)`: where a paged read goes on.
pub fn due_key_after(due_ms: u64, id: RecordId) -> (u64, RecordId) {
    match id.0.checked_add(1) {
        Some(next) => (due_ms, RecordId(next)),
        None => (due_ms.saturating_add(1), RecordId(0)),
    }
}

/// Splits a due-index key; `None` if it is not 16 bytes.
pub fn split_due_key(key: &[u8]) -> Option<(u64, RecordId)> {
    let due = u64::from_be_bytes(key.get(..8)?.try_into().ok()?);
    let id = u64::from_be_bytes(key.get(8..16)?.try_into().ok()?);
    (key.len() == 16).then_some((due, RecordId(id)))
}

/// Key of the ids column.
pub fn id_key(pid: Pid, id: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(2 + id.len());
    k.extend_from_slice(&pid.to_be_bytes());
    k.extend_from_slice(id);
    k
}

/// Value of the ids column.
pub fn id_value(rid: RecordId, due_ms: u64) -> [u8; 16] {
    let mut v = [0u8; 16];
    v[..8].copy_from_slice(&rid.to_bytes());
    v[8..].copy_from_slice(&due_ms.to_be_bytes());
    v
}

/// Splits a value of the ids column.
pub fn split_id_value(value: &[u8]) -> Option<(RecordId, u64)> {
    let rid = u64::from_be_bytes(value.get(..8)?.try_into().ok()?);
    let due = u64::from_be_bytes(value.get(8..16)?.try_into().ok()?);
    Some((RecordId(rid), due))
}

/// Key of a partition in the meta column.
pub fn partition_key(topic: &str, partition: i32) -> Vec<u8> {
    let mut k = Vec::with_capacity(topic.len() + 6);
    k.push(b'p');
    k.extend_from_slice(topic.as_bytes());
    k.push(0);
    k.extend_from_slice(&partition.to_be_bytes());
    k
}

/// Splits a partition key of the meta column.
pub fn split_partition_key(key: &[u8]) -> Option<(String, i32)> {
    let rest = key.strip_prefix(b"p")?;
    let (topic, part) = rest.split_at(rest.len().checked_sub(5)?);
    if part.first() != Some(&0) {
        return None;
    }
    let partition = i32::from_be_bytes(part[1..].try_into().ok()?);
    Some((String::from_utf8(topic.to_vec()).ok()?, partition))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_ids_pack_and_order() {
        let a = RecordId::new(1, 5).unwrap();
        let b = RecordId::new(1, 6).unwrap();
        let c = RecordId::new(2, 0).unwrap();
        assert!(a < b && b < c);
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
        assert!(due_key(d, r) > due_key(5, RecordId(7)));
    }

    #[test]
    fn due_keys_sort_by_due_time_then_id() {
        let k1 = due_key(5, RecordId(900));
        let k2 = due_key(6, RecordId(1));
        let k3 = due_key(256, RecordId(0));
        assert!(k1 < k2 && k2 < k3);
        assert_eq!(split_due_key(&k3), Some((256, RecordId(0))));
        assert_eq!(split_due_key(&k3[..15]), None);
    }

    #[test]
    fn id_values_and_partition_keys_round_trip() {
        assert_eq!(
            split_id_value(&id_value(RecordId(77), 1_234)),
            Some((RecordId(77), 1_234))
        );
        assert_eq!(
            split_partition_key(&partition_key("delay.30s", 7)),
            Some(("delay.30s".to_owned(), 7))
        );
    }
}
