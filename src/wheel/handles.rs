//! Cancellation for the wheel: one bit per handle index.
//!
//! The wheel's entries carry their due time and value inline in the slot vectors, so a cascade
//! never leaves the vector it is reading. Cancelling must still be O(1) without finding the
//! entry: a handle names an index here (and the entry's due time). Cancelling sets the index's
//! bit; the entry stays in its slot until the wheel reaches it (lazy cancellation), is dropped
//! then, and its index is freed.
//!
//! An index is only reused after the wheel has reached its entry, and by then the wheel's time
//! has passed that entry's due time, which is how the wheel rejects a stale handle
//! (`handle.due <= elapsed`) before it gets here. So an index has at most one entry in the
//! wheel, and a set bit always belongs to that entry. While nothing cancelled is waiting in the
//! wheel, reaching an entry does not read the bits at all.

/// Cancelled bits by index, and the indices free for reuse.
#[derive(Debug, Default)]
pub(crate) struct Handles {
    /// Bit `i`: index `i`'s entry is cancelled and still in the wheel.
    cancelled: Vec<u64>,
    /// Indices handed out so far (every index below this one exists).
    issued: u32,
    /// Indices whose entry the wheel has reached; reused last-in first-out.
    free: Vec<u32>,
    /// Cancelled entries still in the wheel (set bits).
    outstanding: usize,
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
        if index as usize / 64 >= self.cancelled.len() {
            self.cancelled.push(0);
        }
        index
    }

    /// Marks the entry at `index` cancelled; the caller has checked that the entry is still in
    /// the wheel (its due time is ahead of the wheel's time). False if it already was.
    pub(crate) fn cancel(&mut self, index: u32) -> bool {
        let Some(word) = self.cancelled.get_mut(index as usize / 64) else {
            return false;
        };
        let bit = 1u64 << (index % 64);
        if *word & bit != 0 {
            return false;
        }
        *word |= bit;
        self.outstanding += 1;
        true
    }

    /// The wheel has reached the entry at `index`: frees the index and says whether the entry
    /// is live (to be handed out) rather than cancelled.
    pub(crate) fn release(&mut self, index: u32) -> bool {
        self.free.push(index);
        if self.outstanding == 0 {
            return true;
        }
        let word = &mut self.cancelled[index as usize / 64];
        let bit = 1u64 << (index % 64);
        if *word & bit == 0 {
            return true;
        }
        *word &= !bit;
        self.outstanding -= 1;
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
}
