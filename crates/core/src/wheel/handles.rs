//! Cancellation for the wheel: a set of the cancelled handle indices still in the wheel.
//!
//! The wheel's entries carry their due time and value inline in the slot vectors, so a cascade
//! never leaves the vector it is reading. Cancelling must still be O(1) without finding the
//! entry: a handle names an index here (and the entry's due time). Cancelling puts the index in
//! a set; the entry stays in its slot until the wheel reaches it (lazy cancellation), is dropped
//! then, its index leaves the set and is freed.
//!
//! The set holds only cancelled entries that the wheel has not reached yet, so its size (and
//! what a cancel touches) follows the cancellations waiting, not the entries held. A bit per
//! index did the same work in 1-2 ns while its bitmap stayed in cache, but it grows with the
//! entries held (1.25 MB at 10M, past this machine's L2) and a cancel then cost 8.7 ns.
//!
//! An index is only reused after the wheel has reached its entry, and by then the wheel's time
//! has passed that entry's due time, which is how the wheel rejects a stale handle
//! (`handle.due <= elapsed`) before it gets here. So an index has at most one entry in the
//! wheel, and an index in the set always belongs to that entry. While nothing cancelled is
//! waiting in the wheel, reaching an entry does not look at the set at all.

use std::collections::HashSet;

use crate::hashing::BuildMul;

/// Capacity the cancelled set keeps once it is empty again (a few KB), so that a burst of
/// cancellations does not hold its memory for good and a trickle does not reallocate.
const KEEP_CANCELLED: usize = 1_024;

/// Cancelled indices still in the wheel, and the indices free for reuse.
#[derive(Debug, Default)]
pub(crate) struct Handles {
    /// Indices whose entry is cancelled and still in the wheel.
    cancelled: HashSet<u32, BuildMul>,
    /// Indices handed out so far (every index below this one exists).
    issued: u32,
    /// Indices whose entry the wheel has reached; reused last-in first-out.
    free: Vec<u32>,
}

impl Handles {
    /// Indices in use: live entries and cancelled ones the wheel has not reached yet.
    pub(crate) fn allocated(&self) -> usize {
        self.issued as usize - self.free.len()
    }

    /// Takes an index for a new entry.
    pub(crate) fn alloc(&mut self) -> u32 {
        if let Some(index) = self.free.pop() {
            return index;
        }
        let index = self.issued;
        self.issued = index
            .checked_add(1)
            .expect("timing wheel is full (2^32 entries)");
        index
    }

    /// Marks the entry at `index` cancelled; the caller has checked that the entry is still in
    /// the wheel (its due time is ahead of the wheel's time). False if it already was, or if
    /// the index was never handed out.
    pub(crate) fn cancel(&mut self, index: u32) -> bool {
        index < self.issued && self.cancelled.insert(index)
    }

    /// The wheel has reached the entry at `index`: frees the index and says whether the entry
    /// is live (to be handed out) rather than cancelled.
    pub(crate) fn release(&mut self, index: u32) -> bool {
        self.free.push(index);
        if self.cancelled.is_empty() || !self.cancelled.remove(&index) {
            return true;
        }
        // The last cancelled entry of a burst is gone: give back what the burst grew the set to.
        if self.cancelled.is_empty() && self.cancelled.capacity() > KEEP_CANCELLED {
            self.cancelled.shrink_to(KEEP_CANCELLED);
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_index_is_reused_only_after_release_and_starts_uncancelled() {
        let mut h = Handles::default();
        let a = h.alloc();
        assert!(h.cancel(a));
        assert!(!h.cancel(a), "cancelled twice");
        let b = h.alloc();
        assert_ne!(a, b, "a cancelled entry still in the wheel keeps its index");
        assert!(!h.release(a), "a cancelled entry is not handed out");
        let c = h.alloc();
        assert_eq!(c, a);
        assert!(h.release(c), "the reused index is not cancelled");
        assert!(h.release(b));
        assert_eq!(h.allocated(), 0);
        assert!(!h.cancel(1_000), "an index never issued");
    }

    #[test]
    fn the_cancelled_set_gives_its_memory_back_once_a_burst_has_come_due() {
        let mut h = Handles::default();
        let indices: Vec<u32> = (0..100_000).map(|_| h.alloc()).collect();
        for &i in &indices {
            assert!(h.cancel(i));
        }
        assert!(h.cancelled.capacity() >= 100_000);
        for &i in &indices[..99_999] {
            assert!(!h.release(i));
        }
        assert!(
            h.cancelled.capacity() >= 100_000,
            "kept while one is still waiting"
        );
        assert!(!h.release(indices[99_999]));
        assert!(
            h.cancelled.capacity() <= 2 * KEEP_CANCELLED,
            "capacity {} after the burst",
            h.cancelled.capacity()
        );
    }
}
