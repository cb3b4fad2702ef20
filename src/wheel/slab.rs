//! Node storage for the wheel: a chunked slab of fixed-size nodes addressed by `u32` indices.
//!
//! Chunks are allocated one at a time and never moved, so growing the slab never copies the
//! entries already stored (no doubling spike) and untouched capacity is never resident.
//! A node's `gen` is odd while it holds a live entry and even once it is cancelled or free, so a
//! stale [`super::Handle`] can never cancel an entry that reused its node.

/// Index value meaning "no node".
pub(crate) const NIL: u32 = u32::MAX;

const CHUNK_BITS: u32 = 16;
const CHUNK_LEN: usize = 1 << CHUNK_BITS;
const CHUNK_MASK: u32 = (1 << CHUNK_BITS) - 1;

/// One wheel entry. 24 bytes when `T` is a `u64`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Node<T> {
    /// Due time, epoch milliseconds.
    pub(crate) due: u64,
    /// The caller's value (for the broker: a record id).
    pub(crate) value: T,
    /// Next node in the same slot list, or in the free list.
    pub(crate) next: u32,
    /// Odd: live. Even: cancelled (still linked in a slot) or free.
    pub(crate) gen: u32,
}

/// A singly linked FIFO list of nodes (head and tail indices).
#[derive(Debug)]
pub(crate) struct Slab<T> {
    chunks: Vec<Vec<Node<T>>>,
    free: u32,
    allocated: usize,
}

impl<T: Copy> Slab<T> {
    pub(crate) fn new() -> Self {
        Self {
            chunks: Vec::new(),
            free: NIL,
            allocated: 0,
        }
    }

    /// Number of nodes currently holding an entry (live or cancelled but not yet reclaimed).
    pub(crate) fn allocated(&self) -> usize {
        self.allocated
    }

    pub(crate) fn get(&self, index: u32) -> &Node<T> {
        &self.chunks[(index >> CHUNK_BITS) as usize][(index & CHUNK_MASK) as usize]
    }

    pub(crate) fn get_mut(&mut self, index: u32) -> &mut Node<T> {
        &mut self.chunks[(index >> CHUNK_BITS) as usize][(index & CHUNK_MASK) as usize]
    }

    /// Whether `index` names a node that exists (it may be free).
    pub(crate) fn contains(&self, index: u32) -> bool {
        let chunk = (index >> CHUNK_BITS) as usize;
        chunk < self.chunks.len() && ((index & CHUNK_MASK) as usize) < self.chunks[chunk].len()
    }

    /// Stores a live entry and returns its index and (odd) generation.
    pub(crate) fn alloc(&mut self, due: u64, value: T) -> (u32, u32) {
        self.allocated += 1;
        if self.free != NIL {
            let index = self.free;
            let node = self.get_mut(index);
            debug_assert!(
                node.gen % 2 == 0,
                "free node {index} is live: gen {}",
                node.gen
            );
            let next_free = node.next;
            node.gen = node.gen.wrapping_add(1);
            node.due = due;
            node.value = value;
            node.next = NIL;
            let gen = node.gen;
            self.free = next_free;
            return (index, gen);
        }
        if self.chunks.last().is_none_or(|c| c.len() == CHUNK_LEN) {
            assert!(
                self.chunks.len() < (NIL as usize >> CHUNK_BITS),
                "timing wheel is full ({} entries)",
                self.allocated
            );
            self.chunks.push(Vec::with_capacity(CHUNK_LEN));
        }
        let chunk_index = self.chunks.len() - 1;
        let chunk = &mut self.chunks[chunk_index];
        let index = ((chunk_index as u32) << CHUNK_BITS) | chunk.len() as u32;
        chunk.push(Node {
            due,
            value,
            next: NIL,
            gen: 1,
        });
        (index, 1)
    }

    /// Returns a node to the free list. Its generation becomes even if it was not already.
    pub(crate) fn free(&mut self, index: u32) {
        let free_head = self.free;
        let node = self.get_mut(index);
        if node.gen % 2 == 1 {
            node.gen = node.gen.wrapping_add(1);
        }
        node.next = free_head;
        self.free = index;
        self.allocated -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_of_u64_is_24_bytes() {
        assert_eq!(std::mem::size_of::<Node<u64>>(), 24);
    }

    #[test]
    fn freed_nodes_are_reused_with_a_new_generation() {
        let mut slab = Slab::new();
        let (a, gen_a) = slab.alloc(10, 1u64);
        slab.free(a);
        let (b, gen_b) = slab.alloc(20, 2u64);
        assert_eq!(a, b);
        assert_ne!(gen_a, gen_b);
        assert_eq!(gen_b % 2, 1);
        assert_eq!(slab.allocated(), 1);
    }
}
