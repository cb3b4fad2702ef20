//! Byte layouts of keys and values. Keys are big-endian so byte order equals numeric order.
//!
//! | column   | key                                   | value                              |
//! |----------|---------------------------------------|------------------------------------|
//! | records  | `RecordId` (8 B)                      | [`StoredRecord`] (versioned binary) |
//! | due      | `due_ms` (8 B) ++ `RecordId` (8 B)    | target topic (UTF-8)               |
//! | ids      | `pid` (2 B) ++ delay-id bytes         | `RecordId` (8 B) ++ `due_ms` (8 B) |
//! | offsets  | `pid` (2 B)                           | next offset to ingest (8 B)        |
//! | meta     | `p` ++ topic ++ `0x00` ++ partition   | `pid` (2 B)                        |

use crate::record::{Header, HeaderRef};

/// Dense id of a source partition (topic, partition) in this store; at most 65,536 of them.
pub type Pid = u16;

/// Identity of a pending record: its source partition and offset, packed big-endian into a u64
/// (`pid` in the top 16 bits, offset in the low 48).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RecordId(pub u64);

/// Offsets must be below 2^48 to fit a [`RecordId`].
pub const MAX_OFFSET: i64 = (1 << 48) - 1;

impl RecordId {
    /// The id of the record at `offset` of source partition `pid`; `None` if the offset does
    /// not fit in 48 bits or is negative.
    pub fn new(pid: Pid, offset: i64) -> Option<Self> {
        (0..=MAX_OFFSET)
            .contains(&offset)
            .then(|| RecordId((u64::from(pid) << 48) | offset as u64))
    }

    /// The source partition.
    pub fn pid(self) -> Pid {
        (self.0 >> 48) as Pid
    }

    /// The source offset.
    pub fn offset(self) -> i64 {
        (self.0 & ((1 << 48) - 1)) as i64
    }

    /// Big-endian bytes.
    pub fn to_bytes(self) -> [u8; 8] {
        self.0.to_be_bytes()
    }
}

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

/// A pending record as stored, kept as its encoded bytes and read in place: reading one back
/// costs one copy of the bytes rather than an allocation per field, and the publisher hands
/// the topic, key, value and headers to the producer straight from them.
#[derive(Clone, PartialEq, Eq)]
pub struct StoredRecord {
    /// The version 1 encoding (see [`encode_record`]).
    bytes: Vec<u8>,
    /// Due time, epoch ms (also in `bytes[1..9]`).
    due_ms: u64,
    /// Where each field lies in `bytes`.
    target: Span,
    id: Option<Span>,
    key: Option<Span>,
    value: Option<Span>,
    /// Where the headers start (after their count), and how many there are.
    headers_at: usize,
    header_count: usize,
}

/// A field's start and end in a record's bytes.
type Span = (usize, usize);

const VERSION: u8 = 1;

fn put_bytes(out: &mut Vec<u8>, b: Option<&[u8]>) {
    match b {
        None => out.extend_from_slice(&u32::MAX.to_be_bytes()),
        Some(b) => {
            out.extend_from_slice(&(b.len() as u32).to_be_bytes());
            out.extend_from_slice(b);
        }
    }
}

/// Encodes a record from its parts (version 1 layout) into `out` (cleared first), so that a
/// record to store can be encoded from what ingest holds without copying it into a
/// [`StoredRecord`] first, and a batch of them reuses one buffer.
pub fn encode_record(
    out: &mut Vec<u8>,
    due_ms: u64,
    target: &str,
    id: Option<&[u8]>,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    headers: &[Header],
) {
    out.clear();
    out.reserve(64 + target.len() + value.map_or(0, <[u8]>::len) + key.map_or(0, <[u8]>::len));
    out.push(VERSION);
    out.extend_from_slice(&due_ms.to_be_bytes());
    put_bytes(out, Some(target.as_bytes()));
    put_bytes(out, id);
    put_bytes(out, key);
    put_bytes(out, value);
    out.extend_from_slice(&(headers.len() as u32).to_be_bytes());
    for h in headers {
        put_bytes(out, Some(h.key.as_bytes()));
        put_bytes(out, h.value.as_deref());
    }
}

impl StoredRecord {
    /// A record from its parts.
    pub fn new(
        due_ms: u64,
        target: &str,
        id: Option<&[u8]>,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[Header],
    ) -> Self {
        let mut bytes = Vec::new();
        encode_record(&mut bytes, due_ms, target, id, key, value, headers);
        Self::from_bytes(bytes).expect("a record just encoded decodes")
    }

    /// The encoded record (version 1 layout), as stored.
    pub fn encoded(&self) -> &[u8] {
        &self.bytes
    }

    /// Due time, epoch ms.
    pub fn due_ms(&self) -> u64 {
        self.due_ms
    }

    /// The same record due at `due_ms`.
    pub fn set_due_ms(&mut self, due_ms: u64) {
        self.due_ms = due_ms;
        self.bytes[1..9].copy_from_slice(&due_ms.to_be_bytes());
    }

    /// Target topic.
    pub fn target(&self) -> &str {
        // Checked to be UTF-8 when the record was decoded.
        std::str::from_utf8(self.slice(self.target)).unwrap_or_default()
    }

    /// Identity for reschedule and cancel.
    pub fn id(&self) -> Option<&[u8]> {
        self.id.map(|s| self.slice(s))
    }

    /// Key to publish with.
    pub fn key(&self) -> Option<&[u8]> {
        self.key.map(|s| self.slice(s))
    }

    /// Value to publish.
    pub fn value(&self) -> Option<&[u8]> {
        self.value.map(|s| self.slice(s))
    }

    /// How many headers the record carries.
    pub fn header_count(&self) -> usize {
        self.header_count
    }

    /// Headers to publish, in order, read in place.
    pub fn headers(&self) -> impl Iterator<Item = HeaderRef<'_>> + '_ {
        let mut r = Reader {
            bytes: &self.bytes,
            pos: self.headers_at,
        };
        // Every header was checked when the record was decoded, so none of these fails.
        (0..self.header_count).map_while(move |_| {
            let key = std::str::from_utf8(r.bytes().ok()??).ok()?;
            let value = r.bytes().ok()?;
            Some(HeaderRef { key, value })
        })
    }

    fn slice(&self, (start, end): Span) -> &[u8] {
        &self.bytes[start..end]
    }

    /// The due time of an encoded record, read from its header alone; `None` when the bytes
    /// are not a version 1 record.
    pub fn due_of(bytes: &[u8]) -> Option<u64> {
        match bytes {
            [VERSION, due @ ..] if due.len() >= 8 => {
                Some(u64::from_be_bytes(due[..8].try_into().ok()?))
            }
            _ => None,
        }
    }

    /// Decodes a record from a copy of `bytes`.
    ///
    /// # Errors
    /// A message naming what is wrong when the bytes are not a version 1 record.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        Self::from_bytes(bytes.to_vec())
    }

    /// Decodes a record, keeping `bytes` as its storage.
    ///
    /// # Errors
    /// A message naming what is wrong when the bytes are not a version 1 record.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, String> {
        let mut r = Reader {
            bytes: &bytes,
            pos: 0,
        };
        let version = r.take(1)?[0];
        if version != VERSION {
            return Err(format!("unknown record version {version}"));
        }
        let due_ms = u64::from_be_bytes(r.take(8)?.try_into().map_err(|_| "due")?);
        let target = r.span()?.ok_or("record without a target")?;
        utf8(&bytes, target)?;
        let id = r.span()?;
        let key = r.span()?;
        let value = r.span()?;
        let count = u32::from_be_bytes(r.take(4)?.try_into().map_err(|_| "count")?) as usize;
        let headers_at = r.pos;
        for _ in 0..count {
            let name = r.span()?.ok_or("header without a name")?;
            utf8(&bytes, name)?;
            r.span()?;
        }
        if r.pos != bytes.len() {
            return Err(format!("{} trailing bytes", bytes.len() - r.pos));
        }
        Ok(Self {
            due_ms,
            target,
            id,
            key,
            value,
            headers_at,
            header_count: count,
            bytes,
        })
    }
}

fn utf8(bytes: &[u8], (start, end): Span) -> Result<(), String> {
    std::str::from_utf8(&bytes[start..end])
        .map(drop)
        .map_err(|_| "string is not UTF-8".to_owned())
}

impl std::fmt::Debug for StoredRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredRecord")
            .field("due_ms", &self.due_ms)
            .field("target", &self.target())
            .field("id", &self.id())
            .field("key", &self.key())
            .field("value", &self.value())
            .field("headers", &self.headers().collect::<Vec<_>>())
            .finish()
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.pos.checked_add(n).filter(|e| *e <= self.bytes.len());
        let end = end.ok_or_else(|| format!("truncated at byte {}", self.pos))?;
        let out = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    fn bytes(&mut self) -> Result<Option<&'a [u8]>, String> {
        let len = u32::from_be_bytes(self.take(4)?.try_into().map_err(|_| "len")?);
        if len == u32::MAX {
            return Ok(None);
        }
        self.take(len as usize).map(Some)
    }

    /// Where the next length-prefixed field lies; `None` for an absent one.
    fn span(&mut self) -> Result<Option<Span>, String> {
        let len = u32::from_be_bytes(self.take(4)?.try_into().map_err(|_| "len")?);
        if len == u32::MAX {
            return Ok(None);
        }
        let start = self.pos;
        self.take(len as usize)?;
        Ok(Some((start, self.pos)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
    fn the_due_time_is_read_from_the_first_bytes_of_a_record() {
        let rec = StoredRecord::new(1_234_567, "t", None, None, Some(&[1; 50]), &[]);
        let bytes = rec.encoded();
        assert_eq!(StoredRecord::due_of(bytes), Some(1_234_567));
        assert_eq!(StoredRecord::due_of(&bytes[..8]), None);
        assert_eq!(StoredRecord::due_of(&[9, 0, 0, 0, 0, 0, 0, 0, 1]), None);
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

    /// A record's parts: due time, target, id, key, value, headers.
    type Parts = (
        u64,
        String,
        Option<Vec<u8>>,
        Option<Vec<u8>>,
        Option<Vec<u8>>,
        Vec<Header>,
    );

    fn parts() -> impl Strategy<Value = Parts> {
        let bytes = || prop::option::of(prop::collection::vec(any::<u8>(), 0..40));
        let header = ("[a-z-]{0,10}", bytes()).prop_map(|(key, value)| Header { key, value });
        (
            any::<u64>(),
            "[a-zA-Z0-9._-]{1,20}",
            bytes(),
            bytes(),
            bytes(),
            prop::collection::vec(header, 0..5),
        )
    }

    fn build(p: &Parts) -> StoredRecord {
        StoredRecord::new(
            p.0,
            &p.1,
            p.2.as_deref(),
            p.3.as_deref(),
            p.4.as_deref(),
            &p.5,
        )
    }

    fn record() -> impl Strategy<Value = StoredRecord> {
        parts().prop_map(|p| build(&p))
    }

    #[test]
    fn a_record_moved_to_another_due_time_keeps_everything_else() {
        let headers = [
            Header::new("trace", "t-1"),
            Header {
                key: "n".into(),
                value: None,
            },
        ];
        let mut rec = StoredRecord::new(5, "orders", Some(b"id"), Some(b"k"), Some(b"v"), &headers);
        rec.set_due_ms(9_000);
        let back = StoredRecord::decode(rec.encoded()).unwrap();
        assert_eq!(back.due_ms(), 9_000);
        assert_eq!(back, rec);
        assert_eq!(back.target(), "orders");
        assert_eq!(
            (back.id(), back.key(), back.value()),
            (Some(&b"id"[..]), Some(&b"k"[..]), Some(&b"v"[..]))
        );
        let read: Vec<Header> = back.headers().map(HeaderRef::to_header).collect();
        assert_eq!(read, headers);
    }

    proptest! {
        #[test]
        fn records_round_trip(p in parts()) {
            let r = build(&p);
            prop_assert_eq!(r.due_ms(), p.0);
            prop_assert_eq!(r.target(), p.1.as_str());
            prop_assert_eq!(r.id(), p.2.as_deref());
            prop_assert_eq!(r.key(), p.3.as_deref());
            prop_assert_eq!(r.value(), p.4.as_deref());
            prop_assert_eq!(r.header_count(), p.5.len());
            let headers: Vec<Header> = r.headers().map(HeaderRef::to_header).collect();
            prop_assert_eq!(&headers, &p.5);
            prop_assert_eq!(StoredRecord::decode(r.encoded()), Ok(r));
        }

        #[test]
        fn decode_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            let _ = StoredRecord::decode(&bytes);
        }

        #[test]
        fn truncated_records_are_errors(r in record(), cut in 1usize..8) {
            let bytes = r.encoded();
            let cut = cut.min(bytes.len());
            prop_assert!(StoredRecord::decode(&bytes[..bytes.len() - cut]).is_err());
        }
    }
}
