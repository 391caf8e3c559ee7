// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Seeded test data: `rand_xoshiro`'s SplitMix64, the generator the replay
//! tool and the fuzz harness use too (`vhost_crypto_replay::rng`). A test
//! run is repeatable from its seed.

use vhost_crypto_replay::rng::{below, Rng as _, SeedableRng, SplitMix64};

/// SplitMix64 started at state `seed` (`SplitMix64::seed_from_u64`), with
/// the pickers the tests use.
pub struct Rng(SplitMix64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(SplitMix64::seed_from_u64(seed))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in lo..=hi (modulo bias aside).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + below(&mut self.0, hi - lo + 1)
    }

    /// `n` bytes, each the low byte of one output.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }

    /// Cuts `len` into 1..=max_pieces pieces of at least one byte each.
    pub fn cuts(&mut self, len: usize, max_pieces: usize) -> Vec<usize> {
        let pieces = self.range(1, max_pieces.min(len) as u64) as usize;
        let mut points: Vec<usize> = (0..pieces - 1)
            .map(|_| self.range(1, len as u64 - 1) as usize)
            .collect();
        points.push(0);
        points.push(len);
        points.sort_unstable();
        points.dedup();
        points.windows(2).map(|p| p[1] - p[0]).collect()
    }
}
