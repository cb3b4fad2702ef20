//! Identity of a pending record: where it came from, packed into 8 bytes.
//!
//! A source partition gets a dense [`Pid`] when the store first sees it; a record is that pid
//! and its offset ([`RecordId`]). Big-endian bytes of a `RecordId` sort as the number does, so
//! keys built from it sort by partition, then offset.

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
