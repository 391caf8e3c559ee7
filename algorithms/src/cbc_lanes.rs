// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Multi-buffer AES-CBC encryption with VAES (Intel SDM Vol. 2: `VAESENC`,
//! `VAESENCLAST` on 256- and 512-bit registers).
//!
//! Each register holds one block of several messages (4 per 512-bit
//! register, 2 per 256-bit one), one message per 128-bit slot; a step XORs
//! block *j* of every message into its chaining value, runs the AES rounds
//! on all registers interleaved, and stores the ciphertext blocks. Blocks
//! are loaded and stored one 16-byte unaligned access at a time at each
//! message's own address, so nothing outside a message's buffer is read or
//! written.
//!
//! Messages of different lengths run in segments: a segment lasts as many
//! steps as the shortest message left has blocks, uses as few registers as
//! the messages left fill, and the ended messages leave before the next.
//! Slots of the last register that no message fills repeat the first
//! message left, chaining value included, so they compute and store exactly
//! its ciphertext again (the same bytes to the same place).
//!
//! When the messages' buffers start at addresses that put block *j* of
//! many of them in one L1 cache set (page-aligned guest buffers), message
//! *k* starts *k* × 1, 2 or 4 steps late (`choose_skew`), so that the
//! messages spread over several sets; the segments then also begin where a
//! message starts.

#![allow(unsafe_code)]

use crate::key_schedule::{RoundKeys, MAX_ROUND_KEYS};
use crate::{Lane, AES_BLOCK_SIZE, MAX_LANES};
use zeroize::Zeroize;

/// Per-slot addresses and chaining values of one segment.
struct Slots {
    src: [*const u8; MAX_LANES],
    dst: [*mut u8; MAX_LANES],
    state: [[u8; AES_BLOCK_SIZE]; MAX_LANES],
}

/// A kernel: runs `steps` CBC steps on `regs` registers' worth of slots.
///
/// Safety contract: the CPU has the kernel's features; the first
/// `regs * per_reg` slots hold pointers with `steps` blocks left.
type Kernel = unsafe fn(&RoundKeys, &mut Slots, usize, usize);

/// CBC-encrypts `lanes` (at most [`MAX_LANES`], whole blocks each) with
/// 512-bit VAES. Returns false, having done nothing, if the CPU lacks
/// AES-NI, AVX-512F or VAES.
pub(crate) fn encrypt_vaes512(rk: &RoundKeys, lanes: &mut [Lane<'_>]) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("aes") && has!("avx512f") && has!("vaes") {
            // SAFETY: the CPU has what `kernel512` needs (checked above).
            unsafe { run(rk, lanes, 4, x86::kernel512) };
            return true;
        }
    }
    let _ = (rk, lanes);
    false
}

/// CBC-encrypts `lanes` (at most [`MAX_LANES`], whole blocks each) with
/// 256-bit VAES. Returns false, having done nothing, if the CPU lacks
/// AES-NI, AVX2 or VAES.
pub(crate) fn encrypt_vaes256(rk: &RoundKeys, lanes: &mut [Lane<'_>]) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("aes") && has!("avx2") && has!("vaes") {
            // SAFETY: the CPU has what `kernel256` needs (checked above).
            unsafe { run(rk, lanes, 2, x86::kernel256) };
            return true;
        }
    }
    let _ = (rk, lanes);
    false
}

/// The segment loop (module docs). `per_reg` slots per register.
///
/// # Safety
/// The CPU has the target features `kernel` needs.
unsafe fn run(rk: &RoundKeys, lanes: &mut [Lane<'_>], per_reg: usize, kernel: Kernel) {
    let n = lanes.len().min(MAX_LANES);
    let skew = choose_skew(&mut lanes[..n]);
    let mut src = [std::ptr::null::<u8>(); MAX_LANES];
    let mut dst = [std::ptr::null_mut::<u8>(); MAX_LANES];
    // Lane i runs from step start[i] to step end[i] (exclusive).
    let mut start = [0usize; MAX_LANES];
    let mut end = [0usize; MAX_LANES];
    let mut state = [[0u8; AES_BLOCK_SIZE]; MAX_LANES];
    let mut nonempty = 0;
    for (i, l) in lanes[..n].iter_mut().enumerate() {
        let blocks = l.buf.len() / AES_BLOCK_SIZE;
        state[i] = l.iv;
        (src[i], dst[i]) = l.buf.reborrow().into_raw();
        if blocks > 0 {
            start[i] = nonempty * skew;
            end[i] = start[i] + blocks;
            nonempty += 1;
        }
    }
    let mut slots = Slots {
        src: [std::ptr::null(); MAX_LANES],
        dst: [std::ptr::null_mut(); MAX_LANES],
        state: [[0; AES_BLOCK_SIZE]; MAX_LANES],
    };
    let mut active = [0usize; MAX_LANES];
    let mut t = 0;
    loop {
        // The lanes running at step t, and the next step at which one
        // starts or ends.
        let mut na = 0;
        let mut next = usize::MAX;
        for i in 0..n {
            if start[i] <= t && t < end[i] {
                active[na] = i;
                na += 1;
                next = next.min(end[i]);
            } else if start[i] > t {
                next = next.min(start[i]);
            }
        }
        if next == usize::MAX {
            break;
        }
        let steps = next - t;
        if na > 0 {
            let regs = na.div_ceil(per_reg);
            for s in 0..regs * per_reg {
                let i = active[if s < na { s } else { 0 }];
                slots.src[s] = src[i];
                slots.dst[s] = dst[i];
                slots.state[s] = state[i];
            }
            // SAFETY: every slot's lane runs to at least step `next`, so
            // it has `steps` blocks or more left at its pointers
            // (InOutBuf's in and out are equal or disjoint), and the CPU
            // runs `kernel` (the contract of `run`).
            unsafe { kernel(rk, &mut slots, regs, steps) };
            for (s, &i) in active[..na].iter().enumerate() {
                state[i] = slots.state[s];
                // In bounds (or one past the end) of lane i's buffers.
                src[i] = src[i].wrapping_add(steps * AES_BLOCK_SIZE);
                dst[i] = dst[i].wrapping_add(steps * AES_BLOCK_SIZE);
            }
        }
        t = next;
    }
    for (l, s) in lanes[..n].iter_mut().zip(&state) {
        l.iv = *s;
    }
    // Chaining values are ciphertext, which the lanes hold anyway; clear
    // them all the same so no message bytes stay on the stack.
    state.zeroize();
    slots.state.zeroize();
}

/// Steps by which each nonempty lane starts after the one before: 0 when
/// the lanes are short (under 32 blocks: the ramp would cost more than it
/// saves) or their streams already spread over the L1 sets; otherwise the
/// smallest of 1, 2 and 4 blocks that leaves at most
/// [`MAX_STREAMS_PER_SET`] input and output streams in any set (64-byte
/// lines, 64 sets), or failing that the one with the fewest.
fn choose_skew(lanes: &mut [Lane<'_>]) -> usize {
    if lanes.iter().all(|l| l.buf.len() < 32 * AES_BLOCK_SIZE) {
        return 0;
    }
    let mut streams = [(0usize, 0usize); MAX_LANES];
    let mut m = 0;
    for l in lanes.iter_mut().filter(|l| !l.buf.is_empty()) {
        let (i, o) = l.buf.reborrow().into_raw();
        streams[m] = (i as usize, o as usize);
        m += 1;
    }
    // Most streams in one set if lane k starts k * skew blocks late (its
    // block j then sits where block j + k * skew would without skew).
    let crowd = |skew: usize| {
        let mut per_set = [0u8; 64];
        for (k, &(i, o)) in streams[..m].iter().enumerate() {
            let back = k * skew * AES_BLOCK_SIZE;
            per_set[(i.wrapping_sub(back) >> 6) & 63] += 1;
            if o != i {
                per_set[(o.wrapping_sub(back) >> 6) & 63] += 1;
            }
        }
        usize::from(per_set.into_iter().max().unwrap_or(0))
    };
    let mut best = (crowd(0), 0);
    for skew in [1, 2, 4] {
        if best.0 <= MAX_STREAMS_PER_SET {
            break;
        }
        let c = crowd(skew);
        if c < best.0 {
            best = (c, skew);
        }
    }
    best.1
}

/// Streams per L1 set above which [`choose_skew`] looks for a skew: half
/// the ways of an 8-way L1 data cache.
const MAX_STREAMS_PER_SET: usize = 4;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{RoundKeys, Slots, AES_BLOCK_SIZE, MAX_ROUND_KEYS};
    use std::arch::x86_64::*;

    /// [`super::Kernel`] for 512-bit registers: picks the monomorphized
    /// loop for `regs` (1 to 4) and the key's round count.
    ///
    /// # Safety
    /// As for [`super::Kernel`]: AVX-512F, VAES and AES-NI.
    pub(super) unsafe fn kernel512(rk: &RoundKeys, slots: &mut Slots, regs: usize, steps: usize) {
        macro_rules! go {
            ($r:literal, $nr:literal) => {
                // SAFETY: the CPU has AVX-512F and VAES, and the first
                // `4 * regs` slots have `steps` blocks left (the contract).
                unsafe { steps512::<$r, $nr>(rk, slots, steps) }
            };
        }
        match (regs, rk.rounds) {
            (1, 10) => go!(1, 10),
            (2, 10) => go!(2, 10),
            (3, 10) => go!(3, 10),
            (_, 10) => go!(4, 10),
            (1, 12) => go!(1, 12),
            (2, 12) => go!(2, 12),
            (3, 12) => go!(3, 12),
            (_, 12) => go!(4, 12),
            (1, _) => go!(1, 14),
            (2, _) => go!(2, 14),
            (3, _) => go!(3, 14),
            (_, _) => go!(4, 14),
        }
    }

    /// [`super::Kernel`] for 256-bit registers: picks the monomorphized
    /// loop for `regs` (1 to 8) and the key's round count.
    ///
    /// # Safety
    /// As for [`super::Kernel`]: AVX2, VAES and AES-NI.
    pub(super) unsafe fn kernel256(rk: &RoundKeys, slots: &mut Slots, regs: usize, steps: usize) {
        macro_rules! go {
            ($nr:literal) => {
                // SAFETY: the CPU has AVX2 and VAES, and the first
                // `2 * regs` slots have `steps` blocks left (the contract).
                unsafe {
                    match regs {
                        1 => steps256::<1, $nr>(rk, slots, steps),
                        2 => steps256::<2, $nr>(rk, slots, steps),
                        3 => steps256::<3, $nr>(rk, slots, steps),
                        4 => steps256::<4, $nr>(rk, slots, steps),
                        5 => steps256::<5, $nr>(rk, slots, steps),
                        6 => steps256::<6, $nr>(rk, slots, steps),
                        7 => steps256::<7, $nr>(rk, slots, steps),
                        _ => steps256::<8, $nr>(rk, slots, steps),
                    }
                }
            };
        }
        match rk.rounds {
            10 => go!(10),
            12 => go!(12),
            _ => go!(14),
        }
    }

    /// `steps` CBC steps on `R` 512-bit registers (slots 0..4R), AES with
    /// `NR` rounds. Advances nothing but `slots.state`.
    ///
    /// # Safety
    /// The CPU has AVX-512F and VAES; for every slot `s < 4 * R`,
    /// `slots.src[s]` is valid for reads and `slots.dst[s]` for writes of
    /// `16 * steps` bytes, each pair either equal or not overlapping.
    #[target_feature(enable = "avx512f,vaes")]
    unsafe fn steps512<const R: usize, const NR: usize>(rk: &RoundKeys, slots: &mut Slots, steps: usize) {
        let mut k = [_mm512_setzero_si512(); MAX_ROUND_KEYS];
        for (k, r) in k.iter_mut().zip(&rk.keys).take(NR + 1) {
            // SAFETY: `r` is 16 bytes; unaligned load.
            *k = _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(r.as_ptr().cast()) });
        }
        let mut s = [_mm512_setzero_si512(); R];
        for (r, s) in s.iter_mut().enumerate() {
            // SAFETY: slots 4r..4r+4 are 64 contiguous bytes of
            // `slots.state` (R <= 4).
            *s = unsafe { _mm512_loadu_si512(slots.state[4 * r..].as_ptr().cast()) };
        }
        for j in 0..steps {
            let off = j * AES_BLOCK_SIZE;
            for (r, s) in s.iter_mut().enumerate() {
                // SAFETY: block j of slots 4r..4r+4 is within the `16 *
                // steps` readable bytes at their `src` (the contract).
                let x = unsafe {
                    let p = |q: usize| _mm_loadu_si128(slots.src[4 * r + q].add(off).cast());
                    let x = _mm512_castsi128_si512(p(0));
                    let x = _mm512_inserti32x4::<1>(x, p(1));
                    let x = _mm512_inserti32x4::<2>(x, p(2));
                    _mm512_inserti32x4::<3>(x, p(3))
                };
                // Chaining value XOR plaintext XOR round key 0.
                *s = _mm512_ternarylogic_epi64::<0x96>(*s, x, k[0]);
            }
            for k in &k[1..NR] {
                for s in s.iter_mut() {
                    *s = _mm512_aesenc_epi128(*s, *k);
                }
            }
            for s in s.iter_mut() {
                *s = _mm512_aesenclast_epi128(*s, k[NR]);
            }
            for (r, s) in s.iter().enumerate() {
                let d = |q: usize| slots.dst[4 * r + q].wrapping_add(off).cast::<__m128i>();
                // SAFETY: block j of slots 4r..4r+4 is within the `16 *
                // steps` writable bytes at their `dst` (the contract).
                unsafe {
                    _mm_storeu_si128(d(0), _mm512_castsi512_si128(*s));
                    _mm_storeu_si128(d(1), _mm512_extracti32x4_epi32::<1>(*s));
                    _mm_storeu_si128(d(2), _mm512_extracti32x4_epi32::<2>(*s));
                    _mm_storeu_si128(d(3), _mm512_extracti32x4_epi32::<3>(*s));
                }
            }
        }
        for (r, s) in s.iter().enumerate() {
            // SAFETY: as for the load above.
            unsafe { _mm512_storeu_si512(slots.state[4 * r..].as_mut_ptr().cast(), *s) };
        }
    }

    /// `steps` CBC steps on `R` 256-bit registers (slots 0..2R), AES with
    /// `NR` rounds. Advances nothing but `slots.state`.
    ///
    /// # Safety
    /// The CPU has AVX2 and VAES; for every slot `s < 2 * R`,
    /// `slots.src[s]` is valid for reads and `slots.dst[s]` for writes of
    /// `16 * steps` bytes, each pair either equal or not overlapping.
    #[target_feature(enable = "avx2,vaes")]
    unsafe fn steps256<const R: usize, const NR: usize>(rk: &RoundKeys, slots: &mut Slots, steps: usize) {
        let mut k = [_mm256_setzero_si256(); MAX_ROUND_KEYS];
        for (k, r) in k.iter_mut().zip(&rk.keys).take(NR + 1) {
            // SAFETY: `r` is 16 bytes; unaligned load.
            *k = _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(r.as_ptr().cast()) });
        }
        let mut s = [_mm256_setzero_si256(); R];
        for (r, s) in s.iter_mut().enumerate() {
            // SAFETY: slots 2r..2r+2 are 32 contiguous bytes of
            // `slots.state` (R <= 8).
            *s = unsafe { _mm256_loadu_si256(slots.state[2 * r..].as_ptr().cast()) };
        }
        for j in 0..steps {
            let off = j * AES_BLOCK_SIZE;
            for (r, s) in s.iter_mut().enumerate() {
                // SAFETY: block j of slots 2r, 2r+1 is within the `16 *
                // steps` readable bytes at their `src` (the contract).
                let x = unsafe {
                    let p = |q: usize| _mm_loadu_si128(slots.src[2 * r + q].add(off).cast());
                    _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(p(0)), p(1))
                };
                *s = _mm256_xor_si256(_mm256_xor_si256(*s, x), k[0]);
            }
            for k in &k[1..NR] {
                for s in s.iter_mut() {
                    *s = _mm256_aesenc_epi128(*s, *k);
                }
            }
            for s in s.iter_mut() {
                *s = _mm256_aesenclast_epi128(*s, k[NR]);
            }
            for (r, s) in s.iter().enumerate() {
                let d = |q: usize| slots.dst[2 * r + q].wrapping_add(off).cast::<__m128i>();
                // SAFETY: block j of slots 2r, 2r+1 is within the `16 *
                // steps` writable bytes at their `dst` (the contract).
                unsafe {
                    _mm_storeu_si128(d(0), _mm256_castsi256_si128(*s));
                    _mm_storeu_si128(d(1), _mm256_extracti128_si256::<1>(*s));
                }
            }
        }
        for (r, s) in s.iter().enumerate() {
            // SAFETY: as for the load above.
            unsafe { _mm256_storeu_si256(slots.state[2 * r..].as_mut_ptr().cast(), *s) };
        }
    }
}
