// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! HMAC engines (RFC 2104) for algorithm chaining: HMAC-SHA1 and
//! HMAC-SHA-256, computed by `ring::hmac`.
//!
//! The interface mirrors the cipher's: a [`MacKey`] is built once per
//! session (the inner and outer padded key states are precomputed there),
//! and each request starts a [`MacStream`] from it, feeds the message in as
//! many pieces as its descriptors cut it into, and either takes the tag
//! ([`MacStream::finish_into`], generate) or compares it with an expected
//! one ([`MacStream::verify_truncated`], verify).
//!
//! Truncated MACs (RFC 2104 §5): a session may ask for the leftmost
//! `digest_len` bytes (1 up to the hash size) of the tag. `ring::hmac::verify`
//! only accepts full-length tags, so verification computes the full tag and
//! compares its prefix with `subtle`'s constant-time equality.
//!
//! Key material: `ring::hmac::Key` keeps the inner and outer states (after
//! the padded key block; each as good as the key) inside its own value and
//! has no zeroizing drop (it offers no way to wipe them), and neither do
//! [`MacKey`] and [`MacStream`]: dropped on their own they leave the states
//! where they were. The daemon keeps each `MacKey` in a session box that is
//! zeroized whole when the session closes, and wipes the copies left on
//! its threads' stacks (`src/sessions.rs`; the daemon's `security` test suite finds
//! neither state anywhere in the daemon's memory after CLOSE). The raw auth
//! key bytes are only ever held in zeroizing storage by the callers and are
//! not kept here.

use std::fmt;

use ring::hmac;
use subtle::ConstantTimeEq;

/// Largest tag any supported MAC produces (SHA-256: 32 bytes).
pub const MAX_MAC_LEN: usize = 32;

/// A supported MAC algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MacAlg {
    /// HMAC-SHA1 (RFC 2104 with FIPS 180-4 SHA-1), 20-byte tags.
    /// `ring` calls it `HMAC_SHA1_FOR_LEGACY_USE_ONLY`: HMAC-SHA1 is still
    /// sound as a MAC and is what IPsec guests using DPDK's PMD ask for.
    HmacSha1,
    /// HMAC-SHA-256, 32-byte tags.
    HmacSha256,
}

impl MacAlg {
    /// Full tag length in bytes: 20 or 32.
    pub const fn output_len(self) -> usize {
        match self {
            MacAlg::HmacSha1 => 20,
            MacAlg::HmacSha256 => 32,
        }
    }

    fn ring(self) -> hmac::Algorithm {
        match self {
            MacAlg::HmacSha1 => hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY,
            MacAlg::HmacSha256 => hmac::HMAC_SHA256,
        }
    }
}

/// Errors building a MAC key.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MacError {
    /// The truncated tag length is 0 or longer than the hash output.
    #[error("digest length {got} not in 1..={max}")]
    InvalidDigestLength {
        /// Requested length in bytes.
        got: usize,
        /// The algorithm's full tag length.
        max: usize,
    },
}

/// A session's HMAC key: algorithm, precomputed key state and the tag
/// length the session uses.
#[derive(Clone)]
pub struct MacKey {
    alg: MacAlg,
    key: hmac::Key,
    digest_len: usize,
}

impl fmt::Debug for MacKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print key material.
        write!(
            f,
            "MacKey {{ alg: {:?}, digest_len: {} }}",
            self.alg, self.digest_len
        )
    }
}

impl MacKey {
    /// Builds the key state from `key` (any length; keys longer than the
    /// hash's block size are hashed first, RFC 2104 §2 — `ring` does this)
    /// for tags truncated to `digest_len` bytes.
    ///
    /// # Errors
    /// [`MacError::InvalidDigestLength`] unless `1 <= digest_len <= alg.output_len()`.
    pub fn new(alg: MacAlg, key: &[u8], digest_len: usize) -> Result<Self, MacError> {
        if digest_len == 0 || digest_len > alg.output_len() {
            return Err(MacError::InvalidDigestLength {
                got: digest_len,
                max: alg.output_len(),
            });
        }
        Ok(MacKey {
            alg,
            key: hmac::Key::new(alg.ring(), key),
            digest_len,
        })
    }

    /// The algorithm.
    pub fn alg(&self) -> MacAlg {
        self.alg
    }

    /// Tag length the session uses, in bytes.
    pub fn digest_len(&self) -> usize {
        self.digest_len
    }

    /// Starts a MAC computation (copies the precomputed state; no allocation).
    pub fn start(&self) -> MacStream {
        MacStream {
            ctx: hmac::Context::with_key(&self.key),
            digest_len: self.digest_len,
        }
    }

    /// One-shot MAC of `data`, truncated to the session's digest length,
    /// written to the start of `out` (which must hold at least `digest_len`
    /// bytes; returns the number of bytes written, 0 if `out` is too short).
    pub fn sign_into(&self, data: &[u8], out: &mut [u8]) -> usize {
        let mut s = self.start();
        s.update(data);
        s.finish_into(out)
    }
}

/// One MAC computation in progress.
pub struct MacStream {
    ctx: hmac::Context,
    digest_len: usize,
}

impl fmt::Debug for MacStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MacStream { .. }")
    }
}

impl MacStream {
    /// Feeds the next piece of the message.
    pub fn update(&mut self, data: &[u8]) {
        self.ctx.update(data);
    }

    /// Finishes and writes the truncated tag (`digest_len` bytes) to the
    /// start of `out`. Returns the bytes written: `digest_len`, or 0 when
    /// `out` is shorter than that (nothing is written then).
    pub fn finish_into(self, out: &mut [u8]) -> usize {
        let n = self.digest_len;
        let tag = self.ctx.sign();
        match out.get_mut(..n) {
            Some(o) => {
                o.copy_from_slice(&tag.as_ref()[..n]);
                n
            }
            None => 0,
        }
    }

    /// Finishes and compares the truncated tag with `expected` in constant
    /// time (for a given length). False when `expected` is not exactly
    /// `digest_len` bytes long.
    pub fn verify_truncated(self, expected: &[u8]) -> bool {
        let n = self.digest_len;
        let tag = self.ctx.sign();
        expected.len() == n && bool::from(tag.as_ref()[..n].ct_eq(expected))
    }
}
