// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The tool's reference cipher for expected outputs (`gen`, the trace's
//! `generate` step and its chained requests): AES-CBC straight from
//! RustCrypto's `cbc` and `aes` crates.
//!
//! It does not go through the daemon's `algorithms` crate (its key
//! handling, CBC streams and multi-buffer lanes), so a fault there shows as
//! a mismatch instead of being built into the expectation. It does use the
//! same `aes` and `cbc` crates as `algorithms`' single-stream path: a fault
//! in those is caught by the tests that take OpenSSL or the NIST and
//! Wycheproof vectors as the oracle, not by this. Pinned here by NIST SP
//! 800-38A F.2.1–F.2.6.

use algorithms::Direction;
use cbc::cipher::block_padding::NoPadding;
use cbc::cipher::{BlockDecryptMut, BlockEncryptMut, KeyIvInit};

/// Why the reference refused an input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReferenceError {
    /// The key is not 16, 24 or 32 bytes (AES-128/192/256).
    #[error("AES key of {0} bytes (16, 24 or 32 expected)")]
    KeyLength(usize),
    /// The data is not whole 16-byte blocks (CBC without padding).
    #[error("{0} bytes of data are not whole 16-byte blocks")]
    DataLength(usize),
}

/// AES-CBC of `data` in place, without padding: `key` 16, 24 or 32
/// bytes, `iv` one block, `data` whole blocks (may be empty).
///
/// # Errors
/// [`ReferenceError`] for other key or data lengths; `data` is then
/// unchanged.
pub fn aes_cbc(
    direction: Direction,
    key: &[u8],
    iv: &[u8; 16],
    data: &mut [u8],
) -> Result<(), ReferenceError> {
    if !data.len().is_multiple_of(16) {
        return Err(ReferenceError::DataLength(data.len()));
    }
    fn run<E: KeyIvInit + BlockEncryptMut, D: KeyIvInit + BlockDecryptMut>(
        direction: Direction,
        key: &[u8],
        iv: &[u8; 16],
        data: &mut [u8],
    ) -> Result<(), ReferenceError> {
        let n = data.len();
        let bad_key = |_| ReferenceError::KeyLength(key.len());
        // NoPadding over whole blocks cannot fail.
        let done = match direction {
            Direction::Encrypt => E::new_from_slices(key, iv)
                .map_err(bad_key)?
                .encrypt_padded_mut::<NoPadding>(data, n)
                .is_ok(),
            Direction::Decrypt => D::new_from_slices(key, iv)
                .map_err(bad_key)?
                .decrypt_padded_mut::<NoPadding>(data)
                .is_ok(),
        };
        if done {
            Ok(())
        } else {
            Err(ReferenceError::DataLength(n))
        }
    }
    match key.len() {
        16 => run::<cbc::Encryptor<aes::Aes128>, cbc::Decryptor<aes::Aes128>>(direction, key, iv, data),
        24 => run::<cbc::Encryptor<aes::Aes192>, cbc::Decryptor<aes::Aes192>>(direction, key, iv, data),
        32 => run::<cbc::Encryptor<aes::Aes256>, cbc::Decryptor<aes::Aes256>>(direction, key, iv, data),
        n => Err(ReferenceError::KeyLength(n)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// NIST SP 800-38A F.2.1–F.2.6 (CBC-AES128/192/256, encrypt and
    /// decrypt): the same IV and plaintext under the three keys.
    #[test]
    fn nist_sp800_38a_f2() {
        let iv: [u8; 16] = unhex("000102030405060708090a0b0c0d0e0f").try_into().unwrap();
        let pt = unhex(concat!(
            "6bc1bee22e409f96e93d7e117393172a",
            "ae2d8a571e03ac9c9eb76fac45af8e51",
            "30c81c46a35ce411e5fbc1191a0a52ef",
            "f69f2445df4f9b17ad2b417be66c3710"
        ));
        for (key, ct) in [
            (
                "2b7e151628aed2a6abf7158809cf4f3c",
                concat!(
                    "7649abac8119b246cee98e9b12e9197d",
                    "5086cb9b507219ee95db113a917678b2",
                    "73bed6b8e3c1743b7116e69e22229516",
                    "3ff1caa1681fac09120eca307586e1a7"
                ),
            ),
            (
                "8e73b0f7da0e6452c810f32b809079e562f8ead2522c6b7b",
                concat!(
                    "4f021db243bc633d7178183a9fa071e8",
                    "b4d9ada9ad7dedf4e5e738763f69145a",
                    "571b242012fb7ae07fa9baac3df102e0",
                    "08b0e27988598881d920a9e64f5615cd"
                ),
            ),
            (
                "603deb1015ca71be2b73aef0857d77811f352c073b6108d72d9810a30914dff4",
                concat!(
                    "f58c4c04d6e5f1ba779eabfb5f7bfbd6",
                    "9cfc4e967edb808d679f777bc6702c7d",
                    "39f23369a9d9bacfa530e26304231461",
                    "b2eb05e2c39be9fcda6c19078c6a9d1b"
                ),
            ),
        ] {
            let (key, ct) = (unhex(key), unhex(ct));
            let mut buf = pt.clone();
            aes_cbc(Direction::Encrypt, &key, &iv, &mut buf).unwrap();
            assert_eq!(buf, ct, "encrypt, {}-byte key", key.len());
            aes_cbc(Direction::Decrypt, &key, &iv, &mut buf).unwrap();
            assert_eq!(buf, pt, "decrypt, {}-byte key", key.len());
        }
    }

    #[test]
    fn bad_lengths_are_refused_and_leave_the_data() {
        let iv = [0u8; 16];
        let mut data = [7u8; 32];
        assert_eq!(
            aes_cbc(Direction::Encrypt, &[0; 17], &iv, &mut data),
            Err(ReferenceError::KeyLength(17))
        );
        assert_eq!(
            aes_cbc(Direction::Decrypt, &[0; 16], &iv, &mut data[..17]),
            Err(ReferenceError::DataLength(17))
        );
        assert_eq!(data, [7u8; 32]);
        assert_eq!(aes_cbc(Direction::Encrypt, &[0; 16], &iv, &mut []), Ok(()));
    }
}
