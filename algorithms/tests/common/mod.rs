// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Helpers the algorithms crate's test files share (each includes this
//! folder with `mod common;`): hex literals, the seeded byte source, and
//! RustCrypto's `hmac` used directly as the independent HMAC reference.

// Each test file uses some of these, none all.
#![allow(dead_code)]

use algorithms::MacAlg;
use hmac::{Hmac, Mac};
use rand_core::Rng as _;
use rand_xoshiro::SplitMix64;

/// The bytes of a hex literal (blanks ignored).
pub fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// A number below `n` from the seeded generator.
pub fn below(rng: &mut SplitMix64, n: usize) -> usize {
    (rng.next_u64() % n as u64) as usize
}

/// `n` bytes from the seeded generator.
pub fn bytes(rng: &mut SplitMix64, n: usize) -> Vec<u8> {
    let mut v = vec![0; n];
    rng.fill_bytes(&mut v);
    v
}

/// The full HMAC tag of `data` under `key`, from RustCrypto's `hmac` with
/// `sha1` / `sha2` (none of this crate's code).
pub fn hmac_oracle(alg: MacAlg, key: &[u8], data: &[u8]) -> Vec<u8> {
    match alg {
        MacAlg::HmacSha1 => {
            let mut m = Hmac::<sha1::Sha1>::new_from_slice(key).unwrap();
            m.update(data);
            m.finalize().into_bytes().to_vec()
        }
        MacAlg::HmacSha256 => {
            let mut m = Hmac::<sha2::Sha256>::new_from_slice(key).unwrap();
            m.update(data);
            m.finalize().into_bytes().to_vec()
        }
    }
}
