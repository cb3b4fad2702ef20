//! A hierarchical timing wheel over epoch milliseconds. Pure: no clock, no I/O, no async.
//!
//! Time only moves when the caller passes `now` to [`Wheel::poll`]. The wheel has six levels of
//! 64 slots; a slot at level `L` spans `64^L` ms:
//!
//! | level | slot span  | level range |
//! |-------|------------|-------------|
//! | 0     | 1 ms       | 64 ms       |
//! | 1     | 64 ms      | ~4.1 s      |
//! | 2     | ~4.1 s     | ~4.4 min    |
//! | 3     | ~4.4 min   | ~4.7 h      |
//! | 4     | ~4.7 h     | ~12.4 days  |
//! | 5     | ~12.4 days | ~795 days   |
//!
//! An entry is placed at the level of the highest bit in which its due time differs from
//! `elapsed` (the time the wheel has been advanced to), in the slot given by its due time's bits
//! at that level. Anything past the top level's range waits in one overflow list that is
//! re-sorted when `elapsed` crosses into the next 2^36 ms block. When a slot above level 0
//! comes due its entries cascade to lower levels; a level-0 slot holds entries due in exactly
//! that millisecond.
//!
//! Invariants (checked with `debug_assert!`):
//! - every occupied slot at level `L` lies strictly after `elapsed`'s own slot at `L`, so the
//!   lowest occupied level holds the earliest deadline and "next deadline" is a few bit operations;
//! - an entry is handed out by [`Wheel::poll`] only when its due time is `<= now`: never early;
//! - insert and cancel are O(1); a cancelled entry stays in its slot until the wheel reaches it
//!   (lazy cancellation) and is then dropped without being handed out.
//!
//! Memory layout: a slot is a vector of whole entries (due time, value and handle index; 24
//! bytes for a `u64` value), so a cascade reads one vector front to back and appends to the
//! vectors below, never following a pointer per entry. Cancellation lives apart, a set of the
//! cancelled handle indices (`handles.rs`) sized by the cancelled entries still in the wheel,
//! looked at when an entry comes due only while it is not empty.

mod handles;

use std::collections::VecDeque;

use handles::Handles;

const LEVEL_BITS: u32 = 6;
const SLOTS: u64 = 1 << LEVEL_BITS;
const SLOT_MASK: u64 = SLOTS - 1;
const NUM_LEVELS: usize = 6;
/// Largest capacity (entries) an emptied slot keeps for reuse: bounds what idle slots hold to
/// 384 x 2,048 x 24 bytes.
const KEEP_CAPACITY: usize = 2_048;
/// Span of the whole wheel: due times up to this far past `elapsed` are placed in a level.
pub const RANGE_MS: u64 = 1 << (LEVEL_BITS as u64 * NUM_LEVELS as u64);

/// Identifies an inserted entry so that it can be cancelled in O(1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Handle {
    /// The entry's index for cancellation (`handles.rs`).
    index: u32,
    /// Its due time: once the wheel's time has reached it, the handle is stale.
    due: u64,
}

/// An insert whose due time is not after the wheel's current time: the caller should fire it now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elapsed<T> {
    /// The due time that was asked for.
    pub due: u64,
    /// The value handed back.
    pub value: T,
}

/// One entry as it is held in a slot.
#[derive(Debug, Clone, Copy)]
struct Entry<T> {
    /// Due time, epoch milliseconds.
    due: u64,
    /// The caller's value (for the broker: a record id).
    value: T,
    /// The entry's index for cancellation (`handles.rs`).
    index: u32,
}

/// One level: 64 slots and a bitmask of the slots that are not empty.
#[derive(Debug, Clone)]
struct Level<T> {
    occupied: u64,
    slots: [Vec<Entry<T>>; SLOTS as usize],
}

/// A hierarchical timing wheel holding values of type `T` (the broker stores record ids).
#[derive(Debug)]
pub struct Wheel<T> {
    /// Time the wheel has been advanced to (epoch ms). Entries due at or before it were handed out.
    elapsed: u64,
    /// The six levels, finest first.
    levels: Vec<Level<T>>,
    /// Entries due beyond the top level's range, re-placed when the next 2^36 ms block begins.
    overflow: Vec<Entry<T>>,
    /// Live entries whose due time has been reached, as `(due, value)`, waiting to be handed
    /// out by `poll`. They no longer count as held: [`Wheel::cancel`] returns false for them.
    expired: VecDeque<(u64, T)>,
    /// Which entries are cancelled, by handle index.
    handles: Handles,
    /// Live entries in the levels and the overflow (not cancelled, not yet found due).
    len: usize,
}

impl<T: Copy> Wheel<T> {
    /// An empty wheel whose time starts at `now` (epoch ms).
    pub fn new(now: u64) -> Self {
        Self {
            elapsed: now,
            levels: (0..NUM_LEVELS)
                .map(|_| Level {
                    occupied: 0,
                    slots: std::array::from_fn(|_| Vec::new()),
                })
                .collect(),
            overflow: Vec::new(),
            expired: VecDeque::new(),
            handles: Handles::default(),
            len: 0,
        }
    }

    /// Number of live entries not yet handed out (including those found due and queued).
    pub fn len(&self) -> usize {
        self.len + self.expired.len()
    }

    /// Whether no live entry is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Handle indices in use: live entries and cancelled ones the wheel has not reached yet.
    pub fn allocated(&self) -> usize {
        self.handles.allocated()
    }

    /// The time the wheel has been advanced to.
    pub fn elapsed(&self) -> u64 {
        self.elapsed
    }

    /// Adds `value`, due at `due` (epoch ms). O(1).
    ///
    /// # Errors
    /// [`Elapsed`] (with the value) when `due` is not after the wheel's current time: such an
    /// entry is already due and the caller fires it itself.
    pub fn insert(&mut self, due: u64, value: T) -> Result<Handle, Elapsed<T>> {
        if due <= self.elapsed {
            return Err(Elapsed { due, value });
        }
        let index = self.handles.alloc();
        self.place(Entry { due, value, index });
        self.len += 1;
        Ok(Handle { index, due })
    }

    /// Cancels the entry behind `handle` in O(1). False if it was already cancelled or found
    /// due (handed out, or queued by [`Wheel::poll`] to be handed out next).
    pub fn cancel(&mut self, handle: Handle) -> bool {
        // Every entry still in the levels or the overflow is due after `elapsed`.
        if handle.due <= self.elapsed {
            return false;
        }
        let cancelled = self.handles.cancel(handle.index);
        if cancelled {
            self.len -= 1;
        }
        cancelled
    }

    /// The earliest time at which [`Wheel::poll`] may have something to do: a due entry or a
    /// cascade. `None` when the wheel holds nothing. Never later than the earliest due entry.
    pub fn next_deadline(&self) -> Option<u64> {
        if !self.expired.is_empty() {
            return Some(self.elapsed);
        }
        self.next_expiration().map(|(_, _, deadline)| deadline)
    }

    /// Advances the wheel to `now` and hands out one entry due at or before `now`, as
    /// `(due, value)`. Call until it returns `None`. A `now` earlier than the wheel's time (a
    /// clock that went backwards) does not move the wheel back; it only hands out entries that
    /// were already found due by an earlier call and not yet taken.
    pub fn poll(&mut self, now: u64) -> Option<(u64, T)> {
        loop {
            if let Some((due, value)) = self.expired.pop_front() {
                debug_assert!(
                    due <= self.elapsed,
                    "early fire: due {due} elapsed {} now {now}",
                    self.elapsed
                );
                return Some((due, value));
            }
            match self.next_expiration() {
                Some((level, slot, deadline)) if deadline <= now => {
                    self.process(level, slot, deadline)
                }
                _ => {
                    self.elapsed = self.elapsed.max(now);
                    return None;
                }
            }
        }
    }

    /// The lowest occupied slot as `(level, slot, deadline)`; level `NUM_LEVELS` is the overflow.
    fn next_expiration(&self) -> Option<(usize, usize, u64)> {
        for (level, lvl) in self.levels.iter().enumerate() {
            if lvl.occupied == 0 {
                continue;
            }
            let shift = LEVEL_BITS * level as u32;
            let pos = (self.elapsed >> shift) & SLOT_MASK;
            let at_or_before_pos = if pos == SLOT_MASK {
                u64::MAX
            } else {
                (1u64 << (pos + 1)) - 1
            };
            debug_assert!(
                lvl.occupied & at_or_before_pos == 0,
                "level {level} has occupied slots {:#066b} at or before position {pos} (elapsed {})",
                lvl.occupied,
                self.elapsed
            );
            let slot = lvl.occupied.trailing_zeros() as u64;
            let block_bits = shift + LEVEL_BITS;
            let block_start = (self.elapsed >> block_bits) << block_bits;
            return Some((level, slot as usize, block_start + (slot << shift)));
        }
        if self.overflow.is_empty() {
            return None;
        }
        let top_bits = LEVEL_BITS * NUM_LEVELS as u32;
        let next_block = ((self.elapsed >> top_bits) + 1) << top_bits;
        Some((NUM_LEVELS, 0, next_block))
    }

    /// Empties the slot due at `deadline`: due entries move to `expired`, the rest cascade down.
    fn process(&mut self, level: usize, slot: usize, deadline: u64) {
        debug_assert!(
            deadline > self.elapsed,
            "slot deadline {deadline} not after elapsed {}",
            self.elapsed
        );
        self.elapsed = deadline;
        if level == NUM_LEVELS {
            for entry in std::mem::take(&mut self.overflow) {
                if entry.due <= self.elapsed {
                    self.expire(entry);
                } else {
                    self.place(entry); // back into the overflow when still beyond the range
                }
            }
            return;
        }
        let lvl = &mut self.levels[level];
        lvl.occupied &= !(1u64 << slot);
        let mut list = std::mem::take(&mut lvl.slots[slot]);
        if level == 0 {
            // Every entry of a level-0 slot is due in exactly this millisecond.
            for entry in list.drain(..) {
                self.expire(entry);
            }
        } else {
            // Cancelled entries cascade too: they are dropped when they come due.
            for entry in list.drain(..) {
                if entry.due <= self.elapsed {
                    self.expire(entry);
                } else {
                    self.place(entry); // always to a lower level: this slot stays empty
                }
            }
        }
        // The emptied vector goes back into its slot with its capacity, so a slot that fills
        // again does not allocate again (one allocation per occupied millisecond otherwise).
        let emptied = &mut self.levels[level].slots[slot];
        debug_assert!(
            emptied.is_empty(),
            "level {level} slot {slot} refilled while being processed"
        );
        if list.capacity() <= KEEP_CAPACITY && emptied.is_empty() {
            *emptied = list;
        }
    }

    /// An entry whose due time has been reached: frees its handle index and, unless it was
    /// cancelled, queues it to be handed out.
    fn expire(&mut self, entry: Entry<T>) {
        if self.handles.release(entry.index) {
            self.len -= 1;
            self.expired.push_back((entry.due, entry.value));
        }
    }

    /// Puts `entry`, due after `elapsed`, into its level and slot, or the overflow.
    fn place(&mut self, entry: Entry<T>) {
        let due = entry.due;
        debug_assert!(
            due > self.elapsed,
            "placing due {due} at elapsed {}",
            self.elapsed
        );
        let differing = (self.elapsed ^ due) | SLOT_MASK;
        let level = ((63 - differing.leading_zeros()) / LEVEL_BITS) as usize;
        if level >= NUM_LEVELS {
            self.overflow.push(entry);
            return;
        }
        let slot = ((due >> (LEVEL_BITS * level as u32)) & SLOT_MASK) as usize;
        let lvl = &mut self.levels[level];
        lvl.slots[slot].push(entry);
        lvl.occupied |= 1u64 << slot;
    }
}

#[cfg(test)]
mod tests;
