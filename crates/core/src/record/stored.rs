//! The byte layout of a delayed record, as RocksDB stores it and as it travels from ingest to
//! the producer: encoded once when it is consumed, read in place when it is published.

use super::{Header, HeaderRef};

/// A record to publish later: its target, due time, id, key, value and the headers it carries
/// on. The contract builds it from a consumed record in one allocation, the store writes its
/// bytes as they are and reads them back as one copy, and the publisher hands the topic, key,
/// value and headers to the producer straight from them: no field is ever copied out on its
/// own.
#[derive(Clone, PartialEq, Eq)]
pub struct StoredRecord {
    /// The version 1 encoding (see [`StoredRecord::new`]).
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

/// Appends a length-prefixed field (`u32::MAX` for an absent one) and returns where its bytes
/// lie.
fn put_bytes(out: &mut Vec<u8>, b: Option<&[u8]>) -> Option<Span> {
    match b {
        None => {
            out.extend_from_slice(&u32::MAX.to_be_bytes());
            None
        }
        Some(b) => {
            out.extend_from_slice(&(b.len() as u32).to_be_bytes());
            let start = out.len();
            out.extend_from_slice(b);
            Some((start, out.len()))
        }
    }
}

impl StoredRecord {
    /// Encodes a record from its parts (version 1 layout: the version byte, the due time, then
    /// the target, id, key and value each as a big-endian `u32` length and the bytes, `u32::MAX`
    /// for an absent one, then the header count and each header's name and value the same way).
    /// One allocation, whatever the record holds.
    pub fn new<'h>(
        due_ms: u64,
        target: &str,
        id: Option<&[u8]>,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: impl IntoIterator<Item = HeaderRef<'h>>,
    ) -> Self {
        let fields = [Some(target.as_bytes()), id, key, value];
        let size: usize = fields.iter().map(|f| 4 + f.map_or(0, <[u8]>::len)).sum();
        let mut bytes = Vec::with_capacity(1 + 8 + size + 4 + 64);
        bytes.push(VERSION);
        bytes.extend_from_slice(&due_ms.to_be_bytes());
        let [target, id, key, value] = fields.map(|f| put_bytes(&mut bytes, f));
        let headers_at = bytes.len() + 4;
        bytes.extend_from_slice(&[0; 4]);
        let mut header_count = 0usize;
        for h in headers {
            put_bytes(&mut bytes, Some(h.key.as_bytes()));
            put_bytes(&mut bytes, h.value);
            header_count += 1;
        }
        bytes[headers_at - 4..headers_at].copy_from_slice(&(header_count as u32).to_be_bytes());
        Self {
            bytes,
            due_ms,
            target: target.unwrap_or_default(),
            id,
            key,
            value,
            headers_at,
            header_count,
        }
    }

    /// The encoded record, as stored.
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
        // UTF-8: built from a `&str`, or checked when the record was decoded.
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
        // Every header was written from a `&str` or checked when the record was decoded, so
        // none of these fails.
        (0..self.header_count).map_while(move |_| {
            let key = std::str::from_utf8(r.bytes().ok()??).ok()?;
            let value = r.bytes().ok()?;
            Some(HeaderRef { key, value })
        })
    }

    /// The same record with `value` as its value: the bytes around the value copied as they
    /// are, the headers not read again (a restored pointer takes its value this way).
    pub fn with_value(&self, value: Option<&[u8]>) -> Self {
        let value_end = self.headers_at - 4;
        let value_at = value_end - 4 - self.value.map_or(0, |(start, end)| end - start);
        let tail = &self.bytes[value_end..];
        let mut bytes =
            Vec::with_capacity(value_at + 4 + value.map_or(0, <[u8]>::len) + tail.len());
        bytes.extend_from_slice(&self.bytes[..value_at]);
        let value = put_bytes(&mut bytes, value);
        let headers_at = bytes.len() + 4;
        bytes.extend_from_slice(tail);
        Self {
            bytes,
            value,
            headers_at,
            ..*self
        }
    }

    /// Owned copies of the headers.
    pub fn to_headers(&self) -> Vec<Header> {
        self.headers().map(HeaderRef::to_header).collect()
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
        let bytes = self.bytes;
        Ok(self.span()?.map(|(start, end)| &bytes[start..end]))
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
    fn the_due_time_is_read_from_the_first_bytes_of_a_record() {
        let rec = StoredRecord::new(1_234_567, "t", None, None, Some(&[1; 50]), []);
        let bytes = rec.encoded();
        assert_eq!(StoredRecord::due_of(bytes), Some(1_234_567));
        assert_eq!(StoredRecord::due_of(&bytes[..8]), None);
        assert_eq!(StoredRecord::due_of(&[9, 0, 0, 0, 0, 0, 0, 0, 1]), None);
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
            p.5.iter().map(Header::borrowed),
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
        let mut rec = StoredRecord::new(
            5,
            "orders",
            Some(b"id"),
            Some(b"k"),
            Some(b"v"),
            headers.iter().map(Header::borrowed),
        );
        rec.set_due_ms(9_000);
        let back = StoredRecord::from_bytes(rec.encoded().to_vec()).unwrap();
        assert_eq!(back.due_ms(), 9_000);
        assert_eq!(back, rec);
        assert_eq!(back.target(), "orders");
        assert_eq!(
            (back.id(), back.key(), back.value()),
            (Some(&b"id"[..]), Some(&b"k"[..]), Some(&b"v"[..]))
        );
        assert_eq!(back.to_headers(), headers);
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
            prop_assert_eq!(&r.to_headers(), &p.5);
            prop_assert_eq!(StoredRecord::from_bytes(r.encoded().to_vec()), Ok(r));
        }

        #[test]
        fn a_record_given_another_value_is_the_one_built_with_it(
            p in parts(),
            value in prop::option::of(prop::collection::vec(any::<u8>(), 0..300)),
        ) {
            let mut q = p.clone();
            q.4 = value.clone();
            let replaced = build(&p).with_value(value.as_deref());
            prop_assert_eq!(replaced.value(), value.as_deref());
            prop_assert_eq!(&replaced, &build(&q));
            prop_assert_eq!(StoredRecord::from_bytes(replaced.encoded().to_vec()), Ok(replaced));
        }

        #[test]
        fn decode_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            let _ = StoredRecord::from_bytes(bytes);
        }

        #[test]
        fn truncated_records_are_errors(r in record(), cut in 1usize..8) {
            let bytes = r.encoded();
            let cut = cut.min(bytes.len());
            prop_assert!(StoredRecord::from_bytes(bytes[..bytes.len() - cut].to_vec()).is_err());
        }
    }
}
