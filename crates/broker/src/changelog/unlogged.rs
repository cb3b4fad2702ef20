//! Records in the wheel whose group has not reached the changelog yet (`--changelog-linger`).
//!
//! A lingering group's records can fire before the group is written: one that does needs
//! neither a changelog entry nor a tombstone, since the group's source offsets are committed
//! only once it is written, and until then a crash reads the group again from the source
//! topic. Each record id takes exactly one of two ways, decided under one lock:
//! - its group is written first ([`Unlogged::take`] says yes): the entry is written, and the
//!   tombstone follows when it fires;
//! - it fires (or an operator changes it) first ([`Unlogged::take`] in the tombstone's or the
//!   operator's write says yes): no entry, and for a delivery no tombstone.
//!
//! Whoever takes an id writes what it decided while still holding [`Unlogged::ordered`], so an
//! entry never lands after the tombstone of the same record.

use std::collections::HashSet;
use std::sync::Mutex;

use kafka_delay_core::id::RecordId;

/// The ids of records in the wheel whose group is not written to the changelog yet.
#[derive(Debug, Default)]
pub struct Unlogged {
    ids: Mutex<HashSet<u64>>,
    order: tokio::sync::Mutex<()>,
}

impl Unlogged {
    /// Notes the records of a group that reach the wheel before the group is written.
    pub fn note(&self, ids: impl Iterator<Item = RecordId>) {
        let mut set = self.ids.lock().unwrap_or_else(|e| e.into_inner());
        set.extend(ids.map(|id| id.0));
    }

    /// Whether `id` was still unlogged; it no longer is. The caller holds
    /// [`Unlogged::ordered`] until it has handed what it decided to the changelog's producer.
    pub fn take(&self, id: RecordId) -> bool {
        self.ids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id.0)
    }

    /// Holds the order of the changelog's writes that take ids.
    pub async fn ordered(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.order.lock().await
    }

    /// How many records are unlogged.
    pub fn len(&self) -> usize {
        self.ids.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether no record is unlogged.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(offset: i64) -> RecordId {
        RecordId::new(3, offset).unwrap()
    }

    #[test]
    fn each_noted_record_is_taken_once_whichever_comes_first() {
        let u = Unlogged::default();
        u.note([id(1), id(2)].into_iter());
        // Record 1 fires before its group is written: its tombstone's write takes it (no
        // tombstone), and the group's write then finds it gone (no entry).
        assert!(u.take(id(1)));
        assert!(!u.take(id(1)));
        // Record 2's group is written first (an entry); its later tombstone is written.
        assert!(u.take(id(2)));
        assert!(!u.take(id(2)));
        // A record never noted (a group written before its records reach the wheel, or one
        // restored from the changelog) always gets its tombstone.
        assert!(!u.take(id(7)));
        assert!(u.is_empty());
    }
}
