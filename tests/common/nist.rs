// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! NIST SP 800-38A F.2.1 / F.2.2 (CBC-AES128): key, IV, the four
//! plaintext blocks and their ciphertext, as printed in the publication;
//! and hex decoding for vectors written as text.

pub const NIST_KEY: [u8; 16] = hex16("2b7e151628aed2a6abf7158809cf4f3c");
pub const NIST_IV: [u8; 16] = hex16("000102030405060708090a0b0c0d0e0f");
pub const NIST_PT: [u8; 64] = hex64(concat!(
    "6bc1bee22e409f96e93d7e117393172a",
    "ae2d8a571e03ac9c9eb76fac45af8e51",
    "30c81c46a35ce411e5fbc1191a0a52ef",
    "f69f2445df4f9b17ad2b417be66c3710"
));
pub const NIST_CT: [u8; 64] = hex64(concat!(
    "7649abac8119b246cee98e9b12e9197d",
    "5086cb9b507219ee95db113a917678b2",
    "73bed6b8e3c1743b7116e69e22229516",
    "3ff1caa1681fac09120eca307586e1a7"
));

const fn nibble(c: u8) -> u8 {
    match c {
        b'0'..=b'9' => c - b'0',
        b'a'..=b'f' => c - b'a' + 10,
        _ => panic!("bad hex"),
    }
}

const fn hex_array<const N: usize>(s: &str) -> [u8; N] {
    let b = s.as_bytes();
    assert!(b.len() == 2 * N);
    let mut out = [0u8; N];
    let mut i = 0;
    while i < N {
        out[i] = (nibble(b[2 * i]) << 4) | nibble(b[2 * i + 1]);
        i += 1;
    }
    out
}

const fn hex16(s: &str) -> [u8; 16] {
    hex_array::<16>(s)
}

const fn hex64(s: &str) -> [u8; 64] {
    hex_array::<64>(s)
}

/// The bytes of a hex string (lower case, two digits a byte).
pub fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}
