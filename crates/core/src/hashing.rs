//! A hasher for keys this process hands out itself: the wheel's handle indices, and record ids
//! made of a source partition number and a Kafka offset. One multiplication (Fibonacci
//! hashing) instead of the standard library's SipHash, which these sets pay on every record
//! in flight. None of these keys is chosen by an outside party, so no keyed hash is needed: the
//! multiplication maps distinct low bits to distinct low bits (the bucket) and spreads every
//! bit into the high ones (the table's tag byte).

use std::hash::{BuildHasherDefault, Hasher};

/// The multiplier: 2^64 divided by the golden ratio, odd.
const FIBONACCI: u64 = 0x9E37_79B9_7F4A_7C15;

/// See the module doc.
#[derive(Debug, Default, Clone, Copy)]
pub struct MulHasher(u64);

impl Hasher for MulHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(FIBONACCI);
        }
    }

    fn write_u32(&mut self, i: u32) {
        self.write_u64(u64::from(i));
    }

    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(8) ^ i).wrapping_mul(FIBONACCI);
    }
}

/// Builds [`MulHasher`]s, for `HashMap::with_hasher` and `HashSet::default`.
pub type BuildMul = BuildHasherDefault<MulHasher>;

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::hash::BuildHasher;

    use super::BuildMul;

    #[test]
    fn consecutive_ids_land_in_distinct_buckets_and_distinct_tags() {
        let build = BuildMul::default();
        // Record ids of one partition: partition 7 in the top 16 bits, consecutive offsets.
        let ids = (0..4_096u64).map(|o| (7u64 << 48) | o);
        let hashes: Vec<u64> = ids.map(|id| build.hash_one(id)).collect();
        let buckets: HashSet<u64> = hashes.iter().map(|h| h & 4_095).collect();
        assert_eq!(buckets.len(), 4_096, "low bits collide");
        let tags: HashSet<u64> = hashes.iter().map(|h| h >> 57).collect();
        assert_eq!(tags.len(), 128, "the top 7 bits do not spread");
    }
}
