//! Fast maps from node ids to local ids for the sampler's hot path.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Global node id -> local id. Node ids are not adversarial, so the std SipHash's
/// flood resistance is not worth its cost on this hot path.
pub(super) type IdMap = HashMap<u32, u32, BuildHasherDefault<IdHasher>>;

/// (seed index, node) -> local id, for disjoint samples.
pub(super) type DisjointMap = HashMap<u64, u32, BuildHasherDefault<IdHasher>>;

/// FxHash-style multiplicative hashing for integer keys.
#[derive(Default)]
pub(super) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        // The product's high bits are its best mixed; the table indexes buckets by the low
        // bits, so rotate them down (as rustc-hash 2 does).
        self.0.rotate_left(26)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }

    fn write_u32(&mut self, x: u32) {
        self.write_u64(x as u64);
    }

    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0xF135_7AEA_2E62_A9C5);
    }
}
