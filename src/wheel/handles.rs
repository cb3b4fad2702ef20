//! Cancellation for the wheel: one generation number per handle index.
//!
//! The wheel's entries carry their due time and value inline in the slot vectors, so a cascade
//! never leaves the vector it is reading. Cancelling must still be O(1) without finding the
//! entry: a handle names an index in this table and the generation it was given. An index's
//! generation is odd while its entry is live and even once that entry is cancelled or handed
//! out; the entry itself stays in its slot until the wheel reaches it (lazy cancellation) and
//! is then dropped if its generation no longer matches.
//!
//! An index is only reused after the wheel has reached its entry ([`Handles::release`]), so at
//! any time an index has at most one entry in the wheel and a stale handle (or a stale entry)
//! can never match a newer one: 4 bytes per pending entry, plus the free list.

/// Generation numbers by index, and the indices free for reuse.
#[derive(Debug, Default)]
pub(crate) struct Handles {
    /// Odd: the index's entry is live. Even: cancelled (entry still in the wheel) or free.
    gens: Vec<u32>,
    /// Indices whose entry the wheel has reached; reused last-in first-out.
    free: Vec<u32>,
}

impl Handles {
    /// Indices in use: live entries and cancelled ones the wheel has not reached yet.
    pub(crate) fn allocated(&self) -> usize {
        self.gens.len() - self.free.len()
    }

    /// Takes an index for a new live entry: returns it with its (odd) generation.
    pub(crate) fn alloc(&mut self) -> (u32, u32) {
        if let Some(index) = self.free.pop() {
            let gen = &mut self.gens[index as usize];
            debug_assert!(*gen % 2 == 0, "free index {index} is live: gen {gen}");
            *gen = gen.wrapping_add(1);
            return (index, *gen);
        }
        let index = u32::try_from(self.gens.len()).expect("timing wheel is full (2^32 entries)");
        self.gens.push(1);
        (index, 1)
    }

    /// Marks the entry `(index, gen)` cancelled. False if it is not live (already cancelled,
    /// handed out, or a stale handle).
    pub(crate) fn cancel(&mut self, index: u32, gen: u32) -> bool {
        match self.gens.get_mut(index as usize) {
            Some(g) if *g == gen && gen % 2 == 1 => {
                *g = g.wrapping_add(1);
                true
            }
            _ => false,
        }
    }

    /// The wheel has reached the entry `(index, gen)`: frees the index and says whether the
    /// entry is live (to be handed out) rather than cancelled.
    pub(crate) fn release(&mut self, index: u32, gen: u32) -> bool {
        let g = &mut self.gens[index as usize];
        let live = *g == gen;
        debug_assert!(
            live || *g == gen.wrapping_add(1),
            "index {index} reused while its entry (gen {gen}) was in the wheel: gen {g}"
        );
        if live {
            *g = g.wrapping_add(1);
        }
        self.free.push(index);
        live
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_index_is_reused_only_after_release_and_with_a_new_generation() {
        let mut h = Handles::default();
        let (a, gen_a) = h.alloc();
        assert!(h.cancel(a, gen_a));
        assert!(!h.cancel(a, gen_a), "cancelled twice");
        let (b, _) = h.alloc();
        assert_ne!(a, b, "a cancelled entry still in the wheel keeps its index");
        assert!(!h.release(a, gen_a), "a cancelled entry is not handed out");
        let (c, gen_c) = h.alloc();
        assert_eq!(c, a);
        assert_ne!(gen_c, gen_a);
        assert!(
            !h.cancel(a, gen_a),
            "a stale handle does not cancel the new entry"
        );
        assert!(h.release(c, gen_c));
        assert_eq!(h.allocated(), 1);
    }
}
