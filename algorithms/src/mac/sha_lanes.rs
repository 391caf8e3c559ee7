// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! SHA-1 and SHA-256 compression of 1 to 4 independent streams at once
//! with the x86 SHA extensions (`sha1rnds4`, `sha1nexte`, `sha1msg1/2`,
//! `sha256rnds2`, `sha256msg1/2`; Intel SDM vol. 2, "SHA Extensions").
//!
//! One SHA round instruction depends on the previous one, so a single
//! stream waits on each instruction's latency. With `N` streams the rounds
//! of different streams are issued side by side (every step below loops
//! over the lanes), and the core overlaps `N` dependency chains.
//!
//! Each lane's state is `[u32; 8]`: SHA-256 uses all eight words (a..h),
//! SHA-1 the first five (h0..h4). The block data of a lane is a byte slice
//! of whole 64-byte blocks; every lane processes the same number of blocks.

#![allow(unsafe_code)]

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Proof that the CPU runs the SHA extensions and SSE4.1: the only way to
/// call the kernels. `Copy`, zero-sized.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ShaNi(());

impl ShaNi {
    /// `Some` when the CPU has SHA, SSSE3 and SSE4.1 (CPUID, cached by std).
    pub(crate) fn detect() -> Option<ShaNi> {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("sha")
                && std::arch::is_x86_feature_detected!("ssse3")
                && std::arch::is_x86_feature_detected!("sse4.1")
            {
                return Some(ShaNi(()));
            }
        }
        None
    }

    /// SHA-1 compression of `blocks` blocks from each lane's data into its
    /// state. Panics if a lane's data is shorter than `blocks * 64` bytes.
    pub(crate) fn sha1<const N: usize>(self, states: &mut [[u32; 8]; N], data: [&[u8]; N], blocks: usize) {
        assert!(data.iter().all(|d| blocks <= d.len() / 64));
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `ShaNi` exists only when the CPU has the features the
        // kernel is compiled for, and every lane holds `blocks` whole blocks
        // (checked above), which is all the kernel reads.
        unsafe {
            sha1_kernel(states, data, blocks)
        }
    }

    /// SHA-256 compression, as [`ShaNi::sha1`].
    pub(crate) fn sha256<const N: usize>(self, states: &mut [[u32; 8]; N], data: [&[u8]; N], blocks: usize) {
        assert!(data.iter().all(|d| blocks <= d.len() / 64));
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `sha1`.
        unsafe {
            sha256_kernel(states, data, blocks)
        }
    }
}

/// Loads the 16-byte word `i` of block `j` of `d`, byte-swapped by `mask`.
#[cfg(target_arch = "x86_64")]
macro_rules! load {
    ($d:expr, $j:expr, $i:expr, $mask:expr) => {
        _mm_shuffle_epi8(
            _mm_loadu_si128($d.as_ptr().add($j * 64 + $i * 16) as *const __m128i),
            $mask,
        )
    };
}

/// SHA-1: four rounds with function/constant `$f` (0..=3).
#[cfg(target_arch = "x86_64")]
macro_rules! sha1_r4 {
    ($a:expr, $b:expr, $w:expr, $f:literal) => {
        _mm_sha1rnds4_epu32($a, _mm_sha1nexte_epu32($b, $w), $f)
    };
}

/// SHA-1: message schedule of the next four words.
#[cfg(target_arch = "x86_64")]
macro_rules! sha1_sched {
    ($v0:expr, $v1:expr, $v2:expr, $v3:expr) => {
        _mm_sha1msg2_epu32(_mm_xor_si128(_mm_sha1msg1_epu32($v0, $v1), $v2), $v3)
    };
}

/// # Safety
/// The CPU has SHA, SSSE3 and SSE4.1; each `data[l]` holds at least
/// `blocks * 64` bytes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
unsafe fn sha1_kernel<const N: usize>(states: &mut [[u32; 8]; N], data: [&[u8]; N], blocks: usize) {
    let mask = _mm_set_epi64x(0x0001_0203_0405_0607, 0x0809_0A0B_0C0D_0E0F);
    let z = _mm_setzero_si128();
    let mut abcd = [z; N];
    let mut e = [z; N];
    for l in 0..N {
        let s = &states[l];
        abcd[l] = _mm_set_epi32(s[0] as i32, s[1] as i32, s[2] as i32, s[3] as i32);
        e[l] = _mm_set_epi32(s[4] as i32, 0, 0, 0);
    }
    let mut w = [[z; 5]; N];
    let mut h0 = [z; N];
    let mut h1 = [z; N];
    // One schedule-and-rounds step for every lane: w[k4] from w[k0..k3],
    // then four rounds into `$hy` from `$hx`.
    macro_rules! step {
        ($hx:ident, $hy:ident, $k0:literal, $k1:literal, $k2:literal, $k3:literal, $k4:literal, $f:literal) => {
            for l in 0..N {
                w[l][$k4] = sha1_sched!(w[l][$k0], w[l][$k1], w[l][$k2], w[l][$k3]);
                $hy[l] = sha1_r4!($hx[l], $hy[l], w[l][$k4], $f);
            }
        };
    }
    for j in 0..blocks {
        for l in 0..N {
            // SAFETY: block j < blocks lies inside data[l] (caller).
            unsafe {
                w[l][0] = load!(data[l], j, 0, mask);
                w[l][1] = load!(data[l], j, 1, mask);
                w[l][2] = load!(data[l], j, 2, mask);
                w[l][3] = load!(data[l], j, 3, mask);
            }
            h0[l] = abcd[l];
            h1[l] = _mm_add_epi32(e[l], w[l][0]);
        }
        for l in 0..N {
            h1[l] = _mm_sha1rnds4_epu32(h0[l], h1[l], 0);
        }
        for l in 0..N {
            h0[l] = sha1_r4!(h1[l], h0[l], w[l][1], 0);
        }
        for l in 0..N {
            h1[l] = sha1_r4!(h0[l], h1[l], w[l][2], 0);
        }
        for l in 0..N {
            h0[l] = sha1_r4!(h1[l], h0[l], w[l][3], 0);
        }
        step!(h0, h1, 0, 1, 2, 3, 4, 0);
        step!(h1, h0, 1, 2, 3, 4, 0, 1);
        step!(h0, h1, 2, 3, 4, 0, 1, 1);
        step!(h1, h0, 3, 4, 0, 1, 2, 1);
        step!(h0, h1, 4, 0, 1, 2, 3, 1);
        step!(h1, h0, 0, 1, 2, 3, 4, 1);
        step!(h0, h1, 1, 2, 3, 4, 0, 2);
        step!(h1, h0, 2, 3, 4, 0, 1, 2);
        step!(h0, h1, 3, 4, 0, 1, 2, 2);
        step!(h1, h0, 4, 0, 1, 2, 3, 2);
        step!(h0, h1, 0, 1, 2, 3, 4, 2);
        step!(h1, h0, 1, 2, 3, 4, 0, 3);
        step!(h0, h1, 2, 3, 4, 0, 1, 3);
        step!(h1, h0, 3, 4, 0, 1, 2, 3);
        step!(h0, h1, 4, 0, 1, 2, 3, 3);
        step!(h1, h0, 0, 1, 2, 3, 4, 3);
        for l in 0..N {
            abcd[l] = _mm_add_epi32(abcd[l], h0[l]);
            e[l] = _mm_sha1nexte_epu32(h1[l], e[l]);
        }
    }
    for l in 0..N {
        let s = &mut states[l];
        s[0] = _mm_extract_epi32(abcd[l], 3) as u32;
        s[1] = _mm_extract_epi32(abcd[l], 2) as u32;
        s[2] = _mm_extract_epi32(abcd[l], 1) as u32;
        s[3] = _mm_extract_epi32(abcd[l], 0) as u32;
        s[4] = _mm_extract_epi32(e[l], 3) as u32;
    }
}

/// SHA-256 round constants (FIPS 180-4 §4.2.2).
#[cfg(target_arch = "x86_64")]
pub(super) static K256: [u32; 64] = [
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
];

/// # Safety
/// As [`sha1_kernel`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
unsafe fn sha256_kernel<const N: usize>(states: &mut [[u32; 8]; N], data: [&[u8]; N], blocks: usize) {
    let mask = _mm_set_epi64x(0x0C0D_0E0F_0809_0A0Bu64 as i64, 0x0405_0607_0001_0203u64 as i64);
    let z = _mm_setzero_si128();
    let mut abef = [z; N];
    let mut cdgh = [z; N];
    for l in 0..N {
        let s = &states[l];
        let dcba = _mm_set_epi32(s[3] as i32, s[2] as i32, s[1] as i32, s[0] as i32);
        let efgh = _mm_set_epi32(s[7] as i32, s[6] as i32, s[5] as i32, s[4] as i32);
        let cdab = _mm_shuffle_epi32(dcba, 0xB1);
        let efgh = _mm_shuffle_epi32(efgh, 0x1B);
        abef[l] = _mm_alignr_epi8(cdab, efgh, 8);
        cdgh[l] = _mm_blend_epi16(efgh, cdab, 0xF0);
    }
    let mut w = [[z; 5]; N];
    let mut save = [[z; 2]; N];
    // Four rounds for every lane with message words w[k] and constants
    // K256[4i..4i + 4].
    macro_rules! rounds {
        ($k:literal, $i:literal) => {
            // SAFETY: 4i + 4 <= 64 words of K256.
            let kv = unsafe { _mm_loadu_si128(K256.as_ptr().add($i * 4) as *const __m128i) };
            let mut t = [z; N];
            for l in 0..N {
                t[l] = _mm_add_epi32(w[l][$k], kv);
            }
            for l in 0..N {
                cdgh[l] = _mm_sha256rnds2_epu32(cdgh[l], abef[l], t[l]);
            }
            for l in 0..N {
                abef[l] = _mm_sha256rnds2_epu32(abef[l], cdgh[l], _mm_shuffle_epi32(t[l], 0x0E));
            }
        };
    }
    macro_rules! sched_rounds {
        ($k0:literal, $k1:literal, $k2:literal, $k3:literal, $k4:literal, $i:literal) => {
            for l in 0..N {
                let t1 = _mm_sha256msg1_epu32(w[l][$k0], w[l][$k1]);
                let t2 = _mm_alignr_epi8(w[l][$k3], w[l][$k2], 4);
                w[l][$k4] = _mm_sha256msg2_epu32(_mm_add_epi32(t1, t2), w[l][$k3]);
            }
            rounds!($k4, $i);
        };
    }
    for j in 0..blocks {
        for l in 0..N {
            save[l] = [abef[l], cdgh[l]];
            // SAFETY: block j < blocks lies inside data[l] (caller).
            unsafe {
                w[l][0] = load!(data[l], j, 0, mask);
                w[l][1] = load!(data[l], j, 1, mask);
                w[l][2] = load!(data[l], j, 2, mask);
                w[l][3] = load!(data[l], j, 3, mask);
            }
        }
        rounds!(0, 0);
        rounds!(1, 1);
        rounds!(2, 2);
        rounds!(3, 3);
        sched_rounds!(0, 1, 2, 3, 4, 4);
        sched_rounds!(1, 2, 3, 4, 0, 5);
        sched_rounds!(2, 3, 4, 0, 1, 6);
        sched_rounds!(3, 4, 0, 1, 2, 7);
        sched_rounds!(4, 0, 1, 2, 3, 8);
        sched_rounds!(0, 1, 2, 3, 4, 9);
        sched_rounds!(1, 2, 3, 4, 0, 10);
        sched_rounds!(2, 3, 4, 0, 1, 11);
        sched_rounds!(3, 4, 0, 1, 2, 12);
        sched_rounds!(4, 0, 1, 2, 3, 13);
        sched_rounds!(0, 1, 2, 3, 4, 14);
        sched_rounds!(1, 2, 3, 4, 0, 15);
        for l in 0..N {
            abef[l] = _mm_add_epi32(abef[l], save[l][0]);
            cdgh[l] = _mm_add_epi32(cdgh[l], save[l][1]);
        }
    }
    for l in 0..N {
        let feba = _mm_shuffle_epi32(abef[l], 0x1B);
        let dchg = _mm_shuffle_epi32(cdgh[l], 0xB1);
        let dcba = _mm_blend_epi16(feba, dchg, 0xF0);
        let hgef = _mm_alignr_epi8(dchg, feba, 8);
        let s = &mut states[l];
        s[0] = _mm_extract_epi32(dcba, 0) as u32;
        s[1] = _mm_extract_epi32(dcba, 1) as u32;
        s[2] = _mm_extract_epi32(dcba, 2) as u32;
        s[3] = _mm_extract_epi32(dcba, 3) as u32;
        s[4] = _mm_extract_epi32(hgef, 0) as u32;
        s[5] = _mm_extract_epi32(hgef, 1) as u32;
        s[6] = _mm_extract_epi32(hgef, 2) as u32;
        s[7] = _mm_extract_epi32(hgef, 3) as u32;
    }
}
