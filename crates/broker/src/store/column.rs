//! The column families as types: each names its key and value type, so that a key of one
//! column cannot be written into another ([`Batch::put`] takes the column's own key type), and
//! says how its entries are cleaned up, so that none grows without bound.

use rocksdb::{ColumnFamily, WriteBatch};

use super::codec::{
    Count, CountKey, DueKey, IdKey, IdValue, MetaKey, NextOffset, PidKey, RecordKey,
};
use kafka_delay_core::record::StoredRecord;

/// A column family of the store.
pub(super) trait Column {
    /// Its name in RocksDB.
    const NAME: &'static str;
    /// Its place in [`ALL`] (and in a [`Batch`]'s handles).
    const INDEX: usize;
    /// What it is keyed by.
    type Key: AsRef<[u8]>;
    /// What it holds.
    type Value: ?Sized;
    /// The stored bytes of a value.
    fn value_bytes(value: &Self::Value) -> &[u8];
}

macro_rules! column {
    ($(#[$doc:meta])* $name:ident, $cf:literal, $index:literal, $key:ty, $value:ty, |$v:ident| $bytes:expr) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub(super) struct $name;

        impl Column for $name {
            const NAME: &'static str = $cf;
            const INDEX: usize = $index;
            type Key = $key;
            type Value = $value;
            fn value_bytes($v: &Self::Value) -> &[u8] {
                $bytes
            }
        }
    };
}

column!(
    /// `records`: [`RecordKey`] -> [`StoredRecord`]. Every pending record. Deleted when the record
    /// fires, is cancelled or is replaced.
    Records, "records", 0, RecordKey, StoredRecord, |v| v.encoded()
);
column!(
    /// `due`: [`DueKey`] (due time, id) -> target topic. One entry per pending record, in due
    /// order: recovery is one ordered scan. Deleted with its record when it is cancelled,
    /// replaced or moved; after it fires, gathered and deleted with the next ones (see
    /// `Store::due_garbage`).
    Due, "due", 1, DueKey, str, |v| v.as_bytes()
);
column!(
    /// `ids`: [`IdKey`] (source partition, delay-id) -> [`IdValue`] (the pending record with that
    /// id, its due time). Deleted with the record it points at.
    Ids, "ids", 2, IdKey, IdValue, |v| v.as_ref()
);
column!(
    /// `offsets`: [`PidKey`] -> [`NextOffset`]: the next offset to ingest of each source
    /// partition, written with every ingest batch. One entry per source partition.
    Offsets, "offsets", 3, PidKey, NextOffset, |v| v.as_ref()
);
column!(
    /// `meta`: [`MetaKey`] -> bytes: the id of each source partition, and flags. One entry per
    /// source partition and flag.
    Meta, "meta", 4, MetaKey, [u8], |v| v
);
column!(
    /// `counts`: [`CountKey`] -> [`Count`]: pending records per target and per due minute (see
    /// [`stats`](super::stats)). A count that reaches zero is deleted in the batch that zeroes it.
    Counts, "counts", 5, CountKey, Count, |v| v.as_ref()
);

/// Every column family's name, in [`Column::INDEX`] order.
pub(super) const ALL: [&str; 6] = [
    Records::NAME,
    Due::NAME,
    Ids::NAME,
    Offsets::NAME,
    Meta::NAME,
    Counts::NAME,
];

/// A write batch whose puts and deletes each take the key type of their column. The column
/// handles are looked up once, when the batch is made.
pub(super) struct Batch<'db> {
    inner: WriteBatch,
    handles: [&'db ColumnFamily; 6],
}

impl std::fmt::Debug for Batch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("len", &self.inner.len())
            .finish_non_exhaustive()
    }
}

impl<'db> Batch<'db> {
    pub(super) fn new(handles: [&'db ColumnFamily; 6]) -> Self {
        Self {
            inner: WriteBatch::default(),
            handles,
        }
    }

    /// Writes `value` under `key` in column `C`.
    pub(super) fn put<C: Column>(&mut self, key: &C::Key, value: &C::Value) {
        self.inner
            .put_cf(self.handles[C::INDEX], key, C::value_bytes(value));
    }

    /// Deletes `key` from column `C`.
    pub(super) fn delete<C: Column>(&mut self, key: &C::Key) {
        self.inner.delete_cf(self.handles[C::INDEX], key);
    }

    /// Deletes every key of column `C` from `first` to `last`, both included: one range
    /// tombstone.
    pub(super) fn delete_range<C: Column>(&mut self, first: &C::Key, last: &C::Key) {
        let end = key_after(last.as_ref());
        self.inner
            .delete_range_cf(self.handles[C::INDEX], first.as_ref(), end.as_slice());
    }

    /// Deletes every key of the `counts` column (all begin with a letter).
    pub(super) fn clear_counts(&mut self) {
        self.inner.delete_range_cf(
            self.handles[Counts::INDEX],
            [0u8].as_slice(),
            [0xffu8; 9].as_slice(),
        );
    }

    pub(super) fn into_inner(self) -> WriteBatch {
        self.inner
    }
}

/// The smallest key after `key` (bytewise order): the exclusive end of a range that ends at it.
pub(super) fn key_after(key: &[u8]) -> Vec<u8> {
    let mut after = Vec::with_capacity(key.len() + 1);
    after.extend_from_slice(key);
    after.push(0);
    after
}
