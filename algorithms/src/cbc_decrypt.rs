// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! AES-CBC decryption of one message with VAES on 512-bit registers.
//!
//! CBC decryption is parallel within a message (NIST SP 800-38A §6.2:
//! `P_j = CIPH⁻¹(C_j) ⊕ C_{j-1}`), so 16 blocks go through the rounds at
//! once: four registers of four consecutive blocks. The blocks each one is
//! XORed with (`C_{j-1}`) come from the same loaded ciphertext shifted by
//! one block (`VALIGNQ`), never from memory already overwritten, so the
//! same code runs in place. The tail of 1 to 15 blocks goes through the
//! same four registers with masked loads and stores. Decryption round keys
//! are the encryption ones in reverse order, `AESIMC` (InvMixColumns)
//! applied to all but the first and last (the Equivalent Inverse Cipher,
//! FIPS 197 §5.3.5).

#![allow(unsafe_code)]

use crate::key_schedule::{RoundKeys, MAX_ROUND_KEYS};
use crate::AES_BLOCK_SIZE;
use cipher::inout::InOutBuf;

/// [`decrypt_vaes512`] over `buf` (whole blocks: the caller checked).
pub(crate) fn decrypt_vaes512_inout(
    rk: &RoundKeys,
    iv: &mut [u8; AES_BLOCK_SIZE],
    buf: InOutBuf<'_, '_, u8>,
) -> bool {
    let blocks = buf.len() / AES_BLOCK_SIZE;
    let (src, dst) = buf.into_raw();
    // SAFETY: an `InOutBuf`'s input and output have its length and are
    // the same memory or disjoint (`inout` 0.1); `blocks` blocks fit in it.
    unsafe { decrypt_vaes512(rk, iv, src, dst, blocks) }
}

/// CBC-decrypts `blocks` blocks from `src` to `dst` with the encryption
/// round keys `rk`; `iv` holds the last ciphertext block afterwards.
/// Returns false, having done nothing, if the CPU lacks AES-NI, AVX-512F
/// or VAES.
///
/// # Safety
/// `src` is valid for reads and `dst` for writes of `16 * blocks` bytes,
/// and the two are equal or do not overlap.
pub(crate) unsafe fn decrypt_vaes512(
    rk: &RoundKeys,
    iv: &mut [u8; AES_BLOCK_SIZE],
    src: *const u8,
    dst: *mut u8,
    blocks: usize,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("aes") && has!("avx512f") && has!("vaes") {
            // SAFETY: the CPU has the features (checked above); the
            // buffers are the caller's contract.
            unsafe {
                match rk.rounds {
                    10 => x86::decrypt::<10>(rk, iv, src, dst, blocks),
                    12 => x86::decrypt::<12>(rk, iv, src, dst, blocks),
                    _ => x86::decrypt::<14>(rk, iv, src, dst, blocks),
                }
            }
            return true;
        }
    }
    let _ = (rk, iv, src, dst, blocks);
    false
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{RoundKeys, AES_BLOCK_SIZE, MAX_ROUND_KEYS};
    use std::arch::x86_64::*;

    /// See [`super::decrypt_vaes512`].
    ///
    /// # Safety
    /// The CPU has AES-NI, AVX-512F and VAES; the buffers are as for
    /// [`super::decrypt_vaes512`].
    #[target_feature(enable = "aes,avx512f,vaes")]
    pub(super) unsafe fn decrypt<const NR: usize>(
        rk: &RoundKeys,
        iv: &mut [u8; AES_BLOCK_SIZE],
        src: *const u8,
        dst: *mut u8,
        blocks: usize,
    ) {
        let ek = |i: usize| {
            // SAFETY: a round key is 16 bytes; unaligned load.
            unsafe { _mm_loadu_si128(rk.keys[i].as_ptr().cast()) }
        };
        let mut dk1 = [_mm_setzero_si128(); MAX_ROUND_KEYS];
        dk1[0] = ek(NR);
        for (i, k) in dk1.iter_mut().enumerate().take(NR).skip(1) {
            *k = _mm_aesimc_si128(ek(NR - i));
        }
        dk1[NR] = ek(0);
        let mut dk = [_mm512_setzero_si512(); MAX_ROUND_KEYS];
        for (d, k) in dk.iter_mut().zip(&dk1).take(NR + 1) {
            *d = _mm512_broadcast_i32x4(*k);
        }
        // SAFETY: `iv` is 16 bytes.
        let mut prev = _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(iv.as_ptr().cast()) });
        let mut i = 0;
        while i + 16 <= blocks {
            let off = i * AES_BLOCK_SIZE;
            // SAFETY: blocks i..i+16 are within the `16 * blocks` bytes
            // at `src` (the contract).
            let c: [__m512i; 4] =
                std::array::from_fn(|r| unsafe { _mm512_loadu_si512(src.add(off + 64 * r).cast()) });
            let mut x = c.map(|c| _mm512_xor_si512(c, dk[0]));
            for k in &dk[1..NR] {
                for x in x.iter_mut() {
                    *x = _mm512_aesdec_epi128(*x, *k);
                }
            }
            let before = [prev, c[0], c[1], c[2]];
            for r in 0..4 {
                // C_{j-1} for the four blocks of c[r]: the last block of
                // the register before, then c[r]'s first three.
                let chain = _mm512_alignr_epi64::<6>(c[r], before[r]);
                let p = _mm512_xor_si512(_mm512_aesdeclast_epi128(x[r], dk[NR]), chain);
                // SAFETY: as for the loads; all 16 blocks were loaded
                // before this first store.
                unsafe { _mm512_storeu_si512(dst.add(off + 64 * r).cast(), p) };
            }
            prev = c[3];
            i += 16;
        }
        let mut prev = _mm512_extracti32x4_epi32::<3>(prev);
        if i < blocks {
            // The tail, 1 to 15 blocks, in the same four registers with
            // masked loads and stores (a masked-out element is neither
            // read nor written, and does not fault).
            let left = blocks - i;
            let off = i * AES_BLOCK_SIZE;
            let masks: [__mmask8; 4] = std::array::from_fn(|r| {
                let n = left.saturating_sub(4 * r).min(4);
                ((1u16 << (2 * n)) - 1) as __mmask8
            });
            // SAFETY: the masks select only blocks i..blocks, which are
            // within the `16 * blocks` bytes at `src` (the contract); the
            // pointers are only formed with `wrapping_add`.
            let c: [__m512i; 4] = std::array::from_fn(|r| unsafe {
                _mm512_maskz_loadu_epi64(masks[r], src.wrapping_add(off + 64 * r).cast())
            });
            let mut x = c.map(|c| _mm512_xor_si512(c, dk[0]));
            for k in &dk[1..NR] {
                for x in x.iter_mut() {
                    *x = _mm512_aesdec_epi128(*x, *k);
                }
            }
            let before = [_mm512_broadcast_i32x4(prev), c[0], c[1], c[2]];
            for r in 0..4 {
                let chain = _mm512_alignr_epi64::<6>(c[r], before[r]);
                let p = _mm512_xor_si512(_mm512_aesdeclast_epi128(x[r], dk[NR]), chain);
                // SAFETY: as for the loads, for `dst`; all the tail's
                // blocks were loaded before this first store.
                unsafe { _mm512_mask_storeu_epi64(dst.wrapping_add(off + 64 * r).cast(), masks[r], p) };
            }
            // The chaining value: the tail's last ciphertext block.
            let last = c[(left - 1) / 4];
            prev = match (left - 1) % 4 {
                0 => _mm512_extracti32x4_epi32::<0>(last),
                1 => _mm512_extracti32x4_epi32::<1>(last),
                2 => _mm512_extracti32x4_epi32::<2>(last),
                _ => _mm512_extracti32x4_epi32::<3>(last),
            };
        }
        // SAFETY: `iv` is 16 bytes.
        unsafe { _mm_storeu_si128(iv.as_mut_ptr().cast(), prev) };
    }
}
