//! A hasher for maps keyed by the library's own ids ([`crate::core::JobId`],
//! [`crate::client::machine::ClaimId`]): the worker loop's store thread
//! looks such a key up several times per job, and the standard library's
//! SipHash (built to resist keys an attacker chooses) was a few per cent
//! of that thread. These keys are integers the store hands out, not
//! input, so a few multiplies are enough: each word is folded in and
//! spread by an odd constant, and `finish` mixes the high half into the
//! low one, multiplies, and does it again (a product's low bits depend
//! only on the key's low bits, and hashbrown picks a bucket by the low
//! bits: without the mix, ids a power of two apart would share one).
//! Every step is invertible, so one word in gives a bijection out:
//! distinct ids never collide in their full hash.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// A map keyed by ids ([`IdHasher`]).
pub(crate) type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;
/// A set of ids ([`IdHasher`]).
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
pub(crate) type IdSet<K> = HashSet<K, BuildHasherDefault<IdHasher>>;

/// 2^64 divided by the golden ratio, odd: multiplying by it spreads a
/// word's low bits into its high ones.
const SPREAD: u64 = 0x9e37_79b9_7f4a_7c15;

/// An odd constant for `finish`'s multiply (any odd one is invertible;
/// this one has its bits spread evenly).
const MIX: u64 = 0xd6e8_feb8_6659_fd93;

/// See the module docs.
#[derive(Default, Clone, Copy)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        let mut x = self.0;
        x ^= x >> 32;
        x = x.wrapping_mul(MIX);
        x ^ (x >> 32)
    }

    fn write_u64(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(23) ^ word).wrapping_mul(SPREAD);
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{BuildHasher, Hash};

    fn hash(key: impl Hash) -> u64 {
        BuildHasherDefault::<IdHasher>::default().hash_one(key)
    }

    #[test]
    fn neighbouring_ids_spread_over_the_high_bits_and_never_collide() {
        let hashes: HashSet<u64> = (0..100_000u64).map(hash).collect();
        assert_eq!(hashes.len(), 100_000);
        // hashbrown's control byte is the top 7 bits: consecutive ids
        // must not share one.
        let tops: HashSet<u64> = (0..128u64).map(|id| hash(id) >> 57).collect();
        assert!(tops.len() > 64, "{} distinct of 128", tops.len());
    }

    #[test]
    fn ids_a_stride_apart_spread_over_the_low_bits() {
        // hashbrown picks a bucket by the low bits: 1,024 ids a power of
        // two (or any stride) apart in 1,024 buckets fill about as many
        // as random keys would (1 - 1/e of them, 647), not a few.
        for stride in [1u64, 8, 1000, 1 << 10, 1 << 20, 1 << 32] {
            let buckets: HashSet<u64> = (0..1024u64).map(|i| hash(i * stride) & 1023).collect();
            assert!(
                buckets.len() > 560,
                "stride {stride}: {} buckets",
                buckets.len()
            );
        }
    }

    #[test]
    fn a_pair_depends_on_both_words_and_their_order() {
        assert_ne!(hash((1u64, 2u64)), hash((2u64, 1u64)));
        assert_ne!(hash((1u64, 2u64)), hash((1u64, 3u64)));
        assert_ne!(hash(&b"abc"[..]), hash(&b"abd"[..]));
    }
}
