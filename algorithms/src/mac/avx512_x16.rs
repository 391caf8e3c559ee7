// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! SHA-1 and SHA-256 compression of 16 independent streams at once, one
//! stream per 32-bit element of AVX-512 registers (FIPS 180-4 §6.1.2 and
//! §6.2.2 computed element-wise; the layout of intel-ipsec-mb's
//! `sha1_x16_avx512` and `sha256_x16_avx512`).
//!
//! Each round is a handful of 512-bit instructions for all 16 streams
//! (`vpternlogd` computes Ch, Parity, Maj and three-way XORs in one
//! instruction, `vprold`/`vprord` the rotations); the 16 blocks are loaded
//! one per register, byte-swapped and transposed so that register `t`
//! holds word `t` of every block.

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
    /// state: `states[w][l]` is word `w` (h0..h4) of lane `l`. A lane's
    /// data is two pieces hashed one after the other (the message's whole
    /// blocks and its padded final blocks). With `outer`, the lanes are
    /// HMAC-SHA1 (RFC 2104) messages whose inner hash is those blocks from
    /// the inner key states in `states`: the outer block is then hashed
    /// from the outer key states in `outer`, and `states` ends with the
    /// tags' words. Panics if a first piece is not whole blocks or a lane's
    /// pieces hold fewer than `blocks` blocks.
    pub(crate) fn sha1(
        self,
        states: &mut [[u32; LANES]; 5],
        outer: Option<&[[u32; LANES]; 5]>,
        data: [[&[u8]; 2]; LANES],
        blocks: usize,
    ) {
        assert_pieces(&data, blocks);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Avx512` exists only when the CPU has the features the
        // kernel is compiled for, and every lane holds `blocks` whole blocks
        // (checked above), which is all the kernel reads.
        unsafe {
            kernel(states, outer, data, blocks)
        }
    }

    /// SHA-256 compression, or HMAC-SHA-256 with `outer`, as
    /// [`Avx512::sha1`] with eight state words (a..h).
    pub(crate) fn sha256(
        self,
        states: &mut [[u32; LANES]; 8],
        outer: Option<&[[u32; LANES]; 8]>,
        data: [[&[u8]; 2]; LANES],
        blocks: usize,
    ) {
        assert_pieces(&data, blocks);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `sha1`.
        unsafe {
            kernel256(states, outer, data, blocks)
        }
    }
}

/// Panics unless every lane's first piece is whole blocks and its two
/// pieces hold at least `blocks` blocks (all the kernels read).
fn assert_pieces(data: &[[&[u8]; 2]; LANES], blocks: usize) {
    assert!(data
        .iter()
        .all(|[a, b]| a.len() % 64 == 0 && a.len() / 64 + b.len() / 64 >= blocks));
}

/// Loads block `j` of every lane (the lane's two pieces hashed one after
/// the other), byte-swapped, into `w` word-major: `w[t]` element `l` is
/// word `t` of lane `l`'s block.
///
/// # Safety
/// The CPU has AVX-512F and AVX-512BW; block `j` lies inside every lane's
/// two pieces, and each first piece is whole blocks.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn load_block(data: &[[&[u8]; 2]; LANES], j: usize, w: &mut [__m512i; 16]) {
    let bswap = _mm512_broadcast_i32x4(_mm_set_epi8(12, 13, 14, 15, 8, 9, 10, 11, 4, 5, 6, 7, 0, 1, 2, 3));
    let mut r = [_mm512_setzero_si512(); LANES];
    for (rl, [a, b]) in r.iter_mut().zip(data) {
        let na = a.len() / 64;
        let p = if j < na {
            a.as_ptr().wrapping_add(j * 64)
        } else {
            b.as_ptr().wrapping_add((j - na) * 64)
        };
        // SAFETY: block j lies inside the lane's two pieces (caller): in
        // the first if j < na, else in the second.
        *rl = _mm512_shuffle_epi8(unsafe { _mm512_loadu_si512(p as *const _) }, bswap);
    }
    transpose(&r, w);
}

/// Transposes 16 x 16 32-bit words: `w[t]` element `l` is `r[l]` element
/// `t`. First within 128-bit chunks (32-bit, then 64-bit interleaves:
/// afterwards chunk `c` of `u[4i+k]` holds word `4c+k` of rows `4i` to
/// `4i+3`), then whole chunks across registers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn transpose(r: &[__m512i; LANES], w: &mut [__m512i; 16]) {
    let z = _mm512_setzero_si512();
    let mut t = [z; 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    let mut u = [z; 16];
    for i in 0..4 {
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for k in 0..4 {
        let ab_lo = _mm512_shuffle_i32x4::<0x44>(u[k], u[4 + k]);
        let ab_hi = _mm512_shuffle_i32x4::<0xee>(u[k], u[4 + k]);
        let cd_lo = _mm512_shuffle_i32x4::<0x44>(u[8 + k], u[12 + k]);
        let cd_hi = _mm512_shuffle_i32x4::<0xee>(u[8 + k], u[12 + k]);
        w[k] = _mm512_shuffle_i32x4::<0x88>(ab_lo, cd_lo);
        w[4 + k] = _mm512_shuffle_i32x4::<0xdd>(ab_lo, cd_lo);
        w[8 + k] = _mm512_shuffle_i32x4::<0x88>(ab_hi, cd_hi);
        w[12 + k] = _mm512_shuffle_i32x4::<0xdd>(ab_hi, cd_hi);
    }
}

/// Loads the state rows (`rows[w][l]`: word `w` of lane `l`) into
/// registers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn load_rows<const W: usize>(rows: &[[u32; LANES]; W]) -> [__m512i; W] {
    // SAFETY: each row is 64 bytes.
    std::array::from_fn(|w| unsafe { _mm512_loadu_si512(rows[w].as_ptr() as *const _) })
}

/// Stores registers into state rows (the inverse of [`load_rows`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn store_rows<const W: usize>(h: &[__m512i; W], rows: &mut [[u32; LANES]; W]) {
    for (hk, row) in h.iter().zip(rows.iter_mut()) {
        // SAFETY: `row` is 64 bytes.
        unsafe { _mm512_storeu_si512(row.as_mut_ptr() as *mut _, *hk) };
    }
}

/// The HMAC outer hash's one block in every lane (RFC 2104 §2): the inner
/// digest (its state words: SHA loads a block's words big-endian, as the
/// digest is written), 0x80, zeros, and the bit length of the 64-byte
/// key block and the digest (FIPS 180-4 §5.1.1).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn outer_words(digest: &[__m512i], w: &mut [__m512i; 16]) {
    let n = digest.len();
    w[..n].copy_from_slice(digest);
    w[n] = _mm512_set1_epi32(0x8000_0000u32 as i32);
    for x in &mut w[n + 1..15] {
        *x = _mm512_setzero_si512();
    }
    w[15] = _mm512_set1_epi32(((64 + 4 * n) * 8) as i32);
}

/// Hashes `blocks` blocks of every lane's two pieces into `states`; with
/// `outer`, then the HMAC outer block of the result ([`outer_words`])
/// from the states in `outer`, so that `states` ends with the tags' words.
/// (One loop for both: a second copy of the rounds would not be inlined.)
///
/// # Safety
/// The CPU has AVX-512F and AVX-512BW; each lane's first piece is whole
/// blocks, and its two pieces hold at least `blocks` blocks.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn kernel(
    states: &mut [[u32; LANES]; 5],
    outer: Option<&[[u32; LANES]; 5]>,
    data: [[&[u8]; 2]; LANES],
    blocks: usize,
) {
    let mut h = load_rows(states);
    let mut w = [_mm512_setzero_si512(); 16];
    for j in 0..blocks + usize::from(outer.is_some()) {
        if j < blocks {
            // SAFETY: j < blocks (caller's guarantee covers every such block).
            unsafe { load_block(&data, j, &mut w) };
        } else if let Some(outer) = outer {
            outer_words(&h, &mut w);
            h = load_rows(outer);
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
    store_rows(&h, states);
}

/// # Safety
/// As [`kernel`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn kernel256(
    states: &mut [[u32; LANES]; 8],
    outer: Option<&[[u32; LANES]; 8]>,
    data: [[&[u8]; 2]; LANES],
    blocks: usize,
) {
    use super::sha_lanes::K256;
    let mut h = load_rows(states);
    let mut w = [_mm512_setzero_si512(); 16];
    for j in 0..blocks + usize::from(outer.is_some()) {
        if j < blocks {
            // SAFETY: j < blocks (caller's guarantee covers every such block).
            unsafe { load_block(&data, j, &mut w) };
        } else if let Some(outer) = outer {
            outer_words(&h, &mut w);
            h = load_rows(outer);
        }
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut hh] = h;
        // One round (FIPS 180-4 §6.2.2 step 3): T1 = h + Σ1(e) + Ch(e, f, g)
        // + K + W[t], T2 = Σ0(a) + Maj(a, b, c); d += T1, h = T1 + T2 (the
        // caller renames the eight variables). Rounds 16.. first extend the
        // schedule (§6.2.2 step 1, σ0 and σ1 of §4.1.2).
        macro_rules! round {
            ($a:ident, $b:ident, $c:ident, $d:ident, $e:ident, $f:ident, $g:ident, $h:ident, $t:expr) => {
                let t = $t;
                if t >= 16 {
                    let w15 = w[(t - 15) & 15];
                    let w2 = w[(t - 2) & 15];
                    let s0 = _mm512_ternarylogic_epi32::<0x96>(
                        _mm512_ror_epi32::<7>(w15),
                        _mm512_ror_epi32::<18>(w15),
                        _mm512_srli_epi32::<3>(w15),
                    );
                    let s1 = _mm512_ternarylogic_epi32::<0x96>(
                        _mm512_ror_epi32::<17>(w2),
                        _mm512_ror_epi32::<19>(w2),
                        _mm512_srli_epi32::<10>(w2),
                    );
                    w[t & 15] = _mm512_add_epi32(
                        _mm512_add_epi32(w[t & 15], s0),
                        _mm512_add_epi32(w[(t - 7) & 15], s1),
                    );
                }
                let kw = _mm512_add_epi32(_mm512_set1_epi32(K256[t] as i32), w[t & 15]);
                let s1 = _mm512_ternarylogic_epi32::<0x96>(
                    _mm512_ror_epi32::<6>($e),
                    _mm512_ror_epi32::<11>($e),
                    _mm512_ror_epi32::<25>($e),
                );
                let ch = _mm512_ternarylogic_epi32::<0xca>($e, $f, $g);
                let t1 = _mm512_add_epi32(_mm512_add_epi32($h, s1), _mm512_add_epi32(ch, kw));
                let s0 = _mm512_ternarylogic_epi32::<0x96>(
                    _mm512_ror_epi32::<2>($a),
                    _mm512_ror_epi32::<13>($a),
                    _mm512_ror_epi32::<22>($a),
                );
                let maj = _mm512_ternarylogic_epi32::<0xe8>($a, $b, $c);
                $d = _mm512_add_epi32($d, t1);
                $h = _mm512_add_epi32(t1, _mm512_add_epi32(s0, maj));
            };
        }
        // Eight rounds from round `$t`, the variables renamed in turn.
        // Written out for all 64 rounds, not looped over: LLVM does not
        // unroll such a loop, and then indexes the schedule `w` at run
        // time, in memory, with a branch per round for `t >= 16`.
        macro_rules! eight {
            ($t:literal) => {
                round!(a, b, c, d, e, f, g, hh, $t);
                round!(hh, a, b, c, d, e, f, g, $t + 1);
                round!(g, hh, a, b, c, d, e, f, $t + 2);
                round!(f, g, hh, a, b, c, d, e, $t + 3);
                round!(e, f, g, hh, a, b, c, d, $t + 4);
                round!(d, e, f, g, hh, a, b, c, $t + 5);
                round!(c, d, e, f, g, hh, a, b, $t + 6);
                round!(b, c, d, e, f, g, hh, a, $t + 7);
            };
        }
        eight!(0);
        eight!(8);
        eight!(16);
        eight!(24);
        eight!(32);
        eight!(40);
        eight!(48);
        eight!(56);
        for (hk, x) in h.iter_mut().zip([a, b, c, d, e, f, g, hh]) {
            *hk = _mm512_add_epi32(*hk, x);
        }
    }
    store_rows(&h, states);
}
