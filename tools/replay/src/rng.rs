// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The seeded generator behind `generate` trace lines, `gen` and `soak`:
//! `rand_xoshiro`'s [`SplitMix64`] (Vigna's splitmix64), driven through
//! `rand_core`'s [`Rng`] (`next_u64`; `fill_bytes` takes each 8 bytes
//! from one output, little-endian, the last bytes from the first bytes of
//! one more).
//!
//! A seed `s` starts the generator at state `s ^ 0x9e37_79b9_7f4a_7c15`
//! ([`seeded`]), so a seed names the same bytes and requests on every
//! run: the shipped traces' `"seed"` values and `soak --seed` depend on it.

pub use rand_core::{Rng, SeedableRng};
pub use rand_xoshiro::SplitMix64;

/// What a seed is XORed with before it becomes the generator's state
/// (splitmix64's own increment, 2^64 / φ).
const SEED_MIX: u64 = 0x9e37_79b9_7f4a_7c15;

/// The generator for `seed`.
pub fn seeded(seed: u64) -> SplitMix64 {
    SplitMix64::seed_from_u64(seed ^ SEED_MIX)
}

/// The next output modulo `n` (`n` > 0; the modulo bias is irrelevant
/// for picking sizes and layouts).
pub fn below(rng: &mut impl Rng, n: u64) -> u64 {
    rng.next_u64() % n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_generator_is_the_reference_splitmix64() {
        // splitmix64.c (Vigna) from state 1 ^ 0x9e3779b97f4a7c15:
        // x += 0x9e3779b97f4a7c15, then the two xor-shift-multiply rounds.
        let mut r = seeded(1);
        assert_eq!(r.next_u64(), 0xe99f_f867_dbf6_82c9);
        assert_eq!(r.next_u64(), 0x382f_f84c_b272_81e9);
        let mut b = [0u8; 11];
        seeded(1).fill_bytes(&mut b);
        assert_eq!(
            b,
            [0xc9, 0x82, 0xf6, 0xdb, 0x67, 0xf8, 0x9f, 0xe9, 0xe9, 0x81, 0x72]
        );
    }
}
