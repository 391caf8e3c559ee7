// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The independent reference: OpenSSL's AES-CBC and HMAC, which share no
//! code with the daemon's `aes`, `cbc`, `sha1`, `sha2` and `algorithms`.

use openssl::hash::MessageDigest;
use openssl::pkey::PKey;
use openssl::sign::Signer;
use openssl::symm::{Cipher, Crypter, Mode};
use vhost_user_crypto::wire::virtio_crypto::{VIRTIO_CRYPTO_MAC_HMAC_SHA1, VIRTIO_CRYPTO_MAC_HMAC_SHA_256};

/// AES-CBC without padding through OpenSSL (the independent oracle).
pub fn oracle(encrypt: bool, key: &[u8], iv: &[u8], data: &[u8]) -> Vec<u8> {
    let cipher = match key.len() {
        16 => Cipher::aes_128_cbc(),
        24 => Cipher::aes_192_cbc(),
        32 => Cipher::aes_256_cbc(),
        n => panic!("key of {n} bytes"),
    };
    let mode = if encrypt { Mode::Encrypt } else { Mode::Decrypt };
    let mut c = Crypter::new(cipher, mode, key, Some(iv)).expect("crypter");
    c.pad(false);
    let mut out = vec![0u8; data.len() + 16];
    let mut n = c.update(data, &mut out).expect("update");
    n += c.finalize(&mut out[n..]).expect("finalize");
    out.truncate(n);
    out
}

/// The MACs of AlgChain sessions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mac {
    Sha1,
    Sha256,
}

impl Mac {
    /// The session's `hash_alg` (VIRTIO 1.2 §5.9.4.3).
    pub fn virtio(self) -> u32 {
        match self {
            Mac::Sha1 => VIRTIO_CRYPTO_MAC_HMAC_SHA1,
            Mac::Sha256 => VIRTIO_CRYPTO_MAC_HMAC_SHA_256,
        }
    }

    /// The full digest length in bytes (FIPS 180-4).
    pub fn digest_len(self) -> usize {
        match self {
            Mac::Sha1 => 20,
            Mac::Sha256 => 32,
        }
    }
}

/// HMAC through OpenSSL.
pub fn hmac(mac: Mac, key: &[u8], data: &[u8]) -> Vec<u8> {
    let md = match mac {
        Mac::Sha1 => MessageDigest::sha1(),
        Mac::Sha256 => MessageDigest::sha256(),
    };
    // OpenSSL refuses an empty HMAC key; HMAC pads keys with zeros to the
    // 64-byte block (RFC 2104 §2), so 64 zero bytes are the same key.
    let zeros = [0u8; 64];
    let pkey = PKey::hmac(if key.is_empty() { &zeros } else { key }).unwrap();
    let mut s = Signer::new(md, &pkey).unwrap();
    s.update(data).unwrap();
    s.sign_to_vec().unwrap()
}
