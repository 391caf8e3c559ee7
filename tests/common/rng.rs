// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Seeded PRNGs for test data, without a dependency: a test run is
//! repeatable from its seed.

/// Small deterministic PRNG (xorshift64*), no dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in lo..=hi.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

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

/// splitmix64 (Steele, Lea and Flood, "Fast splittable pseudorandom
/// number generators", 2014): the socket suite's request data.
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}
