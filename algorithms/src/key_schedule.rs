// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! AES key expansion (FIPS 197 §5.2) into encryption round keys, for the
//! multi-buffer kernels in [`crate::cbc_lanes`].
//!
//! `SubWord` comes from the AES-NI instruction `AESKEYGENASSIST` (Intel SDM
//! Vol. 2A), so the expansion takes the same time whatever the key. Without
//! AES-NI there is no expansion here: those CPUs run only the `aes` crate's
//! own code, which keeps its own schedule.

#![allow(unsafe_code)]

use zeroize::{Zeroize, ZeroizeOnDrop};

/// Most round keys: AES-256 has 14 rounds, so 15 round keys (FIPS 197 §5.1).
pub(crate) const MAX_ROUND_KEYS: usize = 15;

/// Encryption round keys `w[0..4*(Nr+1)]` of FIPS 197 §5.2, four words per
/// 16-byte round key, each round key in the byte order of the standard
/// (the order AES-NI loads them in). Zeroized on drop.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub(crate) struct RoundKeys {
    /// Round keys 0..=rounds; the rest are zero.
    pub(crate) keys: [[u8; 16]; MAX_ROUND_KEYS],
    /// Nr: 10, 12 or 14.
    pub(crate) rounds: usize,
}

/// `Rcon[i]` of FIPS 197 §5.2 (its first byte; the other three are zero).
const RCON: [u8; 10] = [0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80, 0x1b, 0x36];

impl RoundKeys {
    /// Expands a 16-, 24- or 32-byte key; `None` for any other length or
    /// when the CPU has no AES-NI.
    pub(crate) fn expand(key: &[u8]) -> Option<Self> {
        #[cfg(target_arch = "x86_64")]
        {
            if !matches!(key.len(), 16 | 24 | 32) || !std::arch::is_x86_feature_detected!("aes") {
                return None;
            }
            // SAFETY: the CPU has AES-NI (checked just above), the one
            // target feature `expand_aesni` needs.
            Some(unsafe { expand_aesni(key) })
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = key;
            None
        }
    }
}

/// FIPS 197 §5.2 `KeyExpansion`, one 32-bit word at a time. A word is
/// read little-endian from its four bytes, so `RotWord` is a right rotation
/// by 8 bits and `Rcon` sits in the low byte.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "aes,sse2")]
fn expand_aesni(key: &[u8]) -> RoundKeys {
    let nk = key.len() / 4;
    let rounds = nk + 6;
    let total = 4 * (rounds + 1);
    let mut w = [0u32; 4 * MAX_ROUND_KEYS];
    for (i, c) in key.chunks_exact(4).enumerate() {
        w[i] = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
    for i in nk..total {
        let mut t = w[i - 1];
        if i % nk == 0 {
            t = sub_word(t).rotate_right(8) ^ u32::from(RCON[i / nk - 1]);
        } else if nk > 6 && i % nk == 4 {
            t = sub_word(t);
        }
        w[i] = w[i - nk] ^ t;
    }
    let mut keys = [[0u8; 16]; MAX_ROUND_KEYS];
    for (k, words) in keys.iter_mut().zip(w[..total].chunks_exact(4)) {
        for (b, word) in k.chunks_exact_mut(4).zip(words) {
            b.copy_from_slice(&word.to_le_bytes());
        }
    }
    w.zeroize();
    RoundKeys { keys, rounds }
}

/// `SubWord` (FIPS 197 §5.2): the S-box on each byte of `x`.
/// `AESKEYGENASSIST` puts `SubWord` of its source's dword 1 into dword 0 of
/// its result.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "aes,sse2")]
fn sub_word(x: u32) -> u32 {
    use std::arch::x86_64::{_mm_aeskeygenassist_si128, _mm_cvtsi128_si32, _mm_set_epi32};
    let v = _mm_set_epi32(0, 0, x as i32, 0);
    _mm_cvtsi128_si32(_mm_aeskeygenassist_si128::<0>(v)) as u32
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::RoundKeys;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// Round keys `(index, w[4i..4i+4])` from FIPS 197 Appendix A.
    fn check(key: &str, rounds: usize, expect: &[(usize, &str)]) {
        if !std::arch::is_x86_feature_detected!("aes") {
            return;
        }
        let rk = RoundKeys::expand(&hex(key)).unwrap();
        assert_eq!(rk.rounds, rounds);
        assert_eq!(rk.keys[0][..], hex(key)[..16]);
        for &(i, words) in expect {
            assert_eq!(rk.keys[i][..], hex(words)[..], "round key {i} of {key}");
        }
        for k in &rk.keys[rounds + 1..] {
            assert_eq!(k, &[0; 16]);
        }
    }

    #[test]
    fn expands_the_fips_197_a1_aes_128_key() {
        check(
            "2b7e151628aed2a6abf7158809cf4f3c",
            10,
            &[
                (1, "a0fafe17 88542cb1 23a33939 2a6c7605"),
                (2, "f2c295f2 7a96b943 5935807a 7359f67f"),
                (3, "3d80477d 4716fe3e 1e237e44 6d7a883b"),
                (4, "ef44a541 a8525b7f b671253b db0bad00"),
                (5, "d4d1c6f8 7c839d87 caf2b8bc 11f915bc"),
                (6, "6d88a37a 110b3efd dbf98641 ca0093fd"),
                (7, "4e54f70e 5f5fc9f3 84a64fb2 4ea6dc4f"),
                (8, "ead27321 b58dbad2 312bf560 7f8d292f"),
                (9, "ac7766f3 19fadc21 28d12941 575c006e"),
                (10, "d014f9a8 c9ee2589 e13f0cc8 b6630ca6"),
            ],
        );
    }

    #[test]
    fn expands_the_fips_197_a2_aes_192_key() {
        check(
            "8e73b0f7da0e6452c810f32b809079e562f8ead2522c6b7b",
            12,
            &[
                (1, "62f8ead2 522c6b7b fe0c91f7 2402f5a5"),
                (2, "ec12068e 6c827f6b 0e7a95b9 5c56fec2"),
                (3, "4db7b4bd 69b54118 85a74796 e92538fd"),
                (4, "e75fad44 bb095386 485af057 21efb14f"),
                (5, "a448f6d9 4d6dce24 aa326360 113b30e6"),
                (6, "a25e7ed5 83b1cf9a 27f93943 6a94f767"),
                (7, "c0a69407 d19da4e1 ec1786eb 6fa64971"),
                (8, "485f7032 22cb8755 e26d1352 33f0b7b3"),
                (9, "40beeb28 2f18a259 6747d26b 458c553e"),
                (10, "a7e1466c 9411f1df 821f750a ad07d753"),
                (11, "ca400538 8fcc5006 282d166a bc3ce7b5"),
                (12, "e98ba06f 448c773c 8ecc7204 01002202"),
            ],
        );
    }

    #[test]
    fn expands_the_fips_197_a3_aes_256_key() {
        check(
            "603deb1015ca71be2b73aef0857d77811f352c073b6108d72d9810a30914dff4",
            14,
            &[
                (1, "1f352c07 3b6108d7 2d9810a3 0914dff4"),
                (2, "9ba35411 8e6925af a51a8b5f 2067fcde"),
                (3, "a8b09c1a 93d194cd be49846e b75d5b9a"),
                (4, "d59aecb8 5bf3c917 fee94248 de8ebe96"),
                (5, "b5a9328a 2678a647 98312229 2f6c79b3"),
                (6, "812c81ad dadf48ba 24360af2 fab8b464"),
                (7, "98c5bfc9 bebd198e 268c3ba7 09e04214"),
                (8, "68007bac b2df3316 96e939e4 6c518d80"),
                (9, "c814e204 76a9fb8a 5025c02d 59c58239"),
                (10, "de136967 6ccc5a71 fa256395 9674ee15"),
                (11, "5886ca5d 2e2f31d7 7e0af1fa 27cf73c3"),
                (12, "749c47ab 18501dda e2757e4f 7401905a"),
                (13, "cafaaae3 e4d59b34 9adf6ace bd10190d"),
                (14, "fe4890d1 e6188d0b 046df344 706c631e"),
            ],
        );
    }

    #[test]
    fn rejects_other_key_lengths() {
        assert!(RoundKeys::expand(&[0; 20]).is_none());
        assert!(RoundKeys::expand(&[]).is_none());
    }
}
