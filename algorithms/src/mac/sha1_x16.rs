// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! SHA-1 compression of 16 independent streams at once, one stream per
//! 32-bit element of AVX-512 registers (FIPS 180-4 §6.1.2 computed
//! element-wise; the layout of intel-ipsec-mb's `sha1_x16_avx512`).
//!
//! Each of the 80 rounds is a handful of 512-bit instructions for all 16
//! streams (`vpternlogd` computes Ch, Parity and Maj in one instruction,
//! `vprold` the rotations); the message words of the 16 blocks are
//! gathered from the 16 streams' memory and byte-swapped.

#![allow(unsafe_code)]

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Lanes of the kernel.
pub(crate) const LANES: usize = 16;

/// Proof that the CPU runs AVX-512F and AVX-512BW: the only way to call
/// the kernel. `Copy`, zero-sized.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Avx512(());

impl Avx512 {
    /// `Some` when the CPU has AVX-512F and AVX-512BW (CPUID, cached by std).
    pub(crate) fn detect() -> Option<Avx512> {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
            {
                return Some(Avx512(()));
            }
        }
        None
    }

    /// SHA-1 compression of `blocks` blocks from each lane's data into its
    /// state: `states[w][l]` is word `w` (h0..h4) of lane `l`. Panics if a
    /// lane's data is shorter than `blocks * 64` bytes.
    pub(crate) fn sha1(self, states: &mut [[u32; LANES]; 5], data: [&[u8]; LANES], blocks: usize) {
        assert!(data.iter().all(|d| d.len() >= blocks * 64));
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Avx512` exists only when the CPU has the features the
        // kernel is compiled for, and every lane holds `blocks` whole blocks
        // (checked above), which is all the kernel reads.
        unsafe {
            kernel(states, data, blocks)
        }
    }
}

/// # Safety
/// The CPU has AVX-512F and AVX-512BW; each `data[l]` holds at least
/// `blocks * 64` bytes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn kernel(states: &mut [[u32; LANES]; 5], data: [&[u8]; LANES], blocks: usize) {
    let mut h = [_mm512_setzero_si512(); 5];
    for (hk, row) in h.iter_mut().zip(states.iter()) {
        // SAFETY: `row` is 64 bytes.
        *hk = unsafe { _mm512_loadu_si512(row.as_ptr() as *const _) };
    }
    // Each lane's address as an offset from lane 0's (the gathers' base).
    let base = data[0].as_ptr();
    let off: [i64; LANES] = std::array::from_fn(|l| (data[l].as_ptr() as i64).wrapping_sub(base as i64));
    // SAFETY: `off` is 128 bytes.
    let (off_lo, off_hi) = unsafe {
        (
            _mm512_loadu_si512(off.as_ptr() as *const _),
            _mm512_loadu_si512(off.as_ptr().add(8) as *const _),
        )
    };
    let bswap = _mm512_broadcast_i32x4(_mm_set_epi8(12, 13, 14, 15, 8, 9, 10, 11, 4, 5, 6, 7, 0, 1, 2, 3));
    let mut w = [_mm512_setzero_si512(); 16];
    for j in 0..blocks {
        for (t, wt) in w.iter_mut().enumerate() {
            let at = _mm512_set1_epi64((j * 64 + t * 4) as i64);
            // SAFETY: lane l reads the 4 bytes at data[l] + 64j + 4t, inside
            // its `blocks` blocks (caller); base + off[l] is data[l].
            let (lo, hi) = unsafe {
                (
                    _mm512_i64gather_epi32::<1>(_mm512_add_epi64(off_lo, at), base as *const _),
                    _mm512_i64gather_epi32::<1>(_mm512_add_epi64(off_hi, at), base as *const _),
                )
            };
            let v = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
            *wt = _mm512_shuffle_epi8(v, bswap);
        }
        let [mut a, mut b, mut c, mut d, mut e] = h;
        // One round: e += rotl5(a) + f(b, c, d) + K + W[t]; b = rotl30(b).
        // Rounds 16.. first extend the schedule (FIPS 180-4 §6.1.2 step 1).
        macro_rules! round {
            ($a:ident, $b:ident, $c:ident, $d:ident, $e:ident, $t:expr, $f:literal, $k:expr) => {
                let t = $t;
                if t >= 16 {
                    let x =
                        _mm512_ternarylogic_epi32::<0x96>(w[(t - 3) & 15], w[(t - 8) & 15], w[(t - 14) & 15]);
                    w[t & 15] = _mm512_rol_epi32::<1>(_mm512_xor_si512(x, w[t & 15]));
                }
                let f = _mm512_ternarylogic_epi32::<$f>($b, $c, $d);
                $e = _mm512_add_epi32(
                    _mm512_add_epi32($e, _mm512_rol_epi32::<5>($a)),
                    _mm512_add_epi32(_mm512_add_epi32(f, $k), w[t & 15]),
                );
                $b = _mm512_rol_epi32::<30>($b);
            };
        }
        // Twenty rounds with function `$f` (vpternlogd truth table: 0xca
        // Ch, 0x96 Parity, 0xe8 Maj) and constant `$k` (§4.2.1).
        macro_rules! twenty {
            ($from:literal, $f:literal, $k:literal) => {
                let k = _mm512_set1_epi32($k as i32);
                for i in 0..4 {
                    let t = $from + i * 5;
                    round!(a, b, c, d, e, t, $f, k);
                    round!(e, a, b, c, d, t + 1, $f, k);
                    round!(d, e, a, b, c, t + 2, $f, k);
                    round!(c, d, e, a, b, t + 3, $f, k);
                    round!(b, c, d, e, a, t + 4, $f, k);
                }
            };
        }
        twenty!(0, 0xca, 0x5a827999u32);
        twenty!(20, 0x96, 0x6ed9eba1u32);
        twenty!(40, 0xe8, 0x8f1bbcdcu32);
        twenty!(60, 0x96, 0xca62c1d6u32);
        for (hk, x) in h.iter_mut().zip([a, b, c, d, e]) {
            *hk = _mm512_add_epi32(*hk, x);
        }
    }
    for (hk, row) in h.iter().zip(states.iter_mut()) {
        // SAFETY: `row` is 64 bytes.
        unsafe { _mm512_storeu_si512(row.as_mut_ptr() as *mut _, *hk) };
    }
}
