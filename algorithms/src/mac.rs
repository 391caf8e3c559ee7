// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! HMAC engines (RFC 2104) for algorithm chaining: HMAC-SHA1 (FIPS 180-4
//! SHA-1) and HMAC-SHA-256.
//!
//! The interface mirrors the cipher's: a [`MacKey`] is built once per
//! session, and each request starts a [`MacStream`] from it, feeds the
//! message in as many pieces as its descriptors cut it into, and either
//! takes the tag ([`MacStream::finish_into`], generate) or compares it with
//! an expected one ([`MacStream::verify_truncated`], verify).
//!
//! HMAC(K, m) = H((K ^ opad) || H((K ^ ipad) || m)) (RFC 2104 §2). The key
//! blocks `K ^ ipad` and `K ^ opad` are each one 64-byte block, so a
//! [`MacKey`] keeps the hash's chaining state after each of them (the
//! "inner" and "outer" states) and never touches the key again: a request
//! costs the message's blocks plus one block for the outer hash. The
//! compression functions are this crate's SHA-NI kernels when the CPU
//! has SHA-NI (one stream for [`MacStream`]; for several messages at once
//! [`mac_multi`] interleaves them, or hashes in 16 AVX-512 lanes), and
//! RustCrypto's `sha1::compress` / `sha2::compress256` otherwise.
//!
//! Truncated MACs (RFC 2104 §5): a session may ask for the leftmost
//! `digest_len` bytes (1 up to the hash size) of the tag; verification
//! compares that prefix with `subtle`'s constant-time equality.
//!
//! Key material: the inner and outer states are each as good as the key.
//! They are plain arrays inside [`MacKey`] and [`MacStream`] (no heap) and
//! both types zeroize them when dropped; [`mac_multi`] zeroizes the copies
//! it keeps in its own variables before it returns. Copies the SIMD
//! kernels spill to the stack are left to the caller's stack wipe (the
//! daemon wipes its worker stacks after a CLOSE and when a worker goes
//! idle). The raw key bytes are not kept.

use std::fmt;

use sha2::digest::generic_array::GenericArray;
use subtle::ConstantTimeEq;
use zeroize::Zeroize;

mod multi;
mod avx512_x16;
mod sha_lanes;

pub use multi::{
    mac_multi, mac_multi_with, sha_engine, sha_engine_choice, MacJob, ShaEngine, MAX_MAC_LANES,
    SHA_ENGINE_ENV,
};

/// Largest tag any supported MAC produces (SHA-256: 32 bytes).
pub const MAX_MAC_LEN: usize = 32;

/// Block size of SHA-1 and SHA-256 in bytes (FIPS 180-4 §1).
const BLOCK: usize = 64;

/// A supported MAC algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MacAlg {
    /// HMAC-SHA1 (RFC 2104 with FIPS 180-4 SHA-1), 20-byte tags.
    /// HMAC-SHA1 is still sound as a MAC and is what IPsec guests using
    /// DPDK's PMD ask for.
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

    /// The hash's initial state (FIPS 180-4 §5.3.1, §5.3.3); SHA-1 uses
    /// the first five words.
    const fn iv(self) -> [u32; 8] {
        match self {
            MacAlg::HmacSha1 => [
                0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476, 0xc3d2e1f0, 0, 0, 0,
            ],
            MacAlg::HmacSha256 => [
                0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
                0x5be0cd19,
            ],
        }
    }
}

/// Runs the compression function of `alg`'s hash over the whole 64-byte
/// blocks of `blocks`: this crate's SHA-NI kernel when the CPU has SHA-NI
/// (5-15 % faster than RustCrypto's own SHA-NI code on one stream),
/// RustCrypto's `sha1::compress` / `sha2::compress256` otherwise.
fn compress(alg: MacAlg, state: &mut [u32; 8], blocks: &[u8]) {
    let n = blocks.len() / BLOCK;
    if let Some(ni) = sha_lanes::ShaNi::detect() {
        let one = std::array::from_mut(state);
        match alg {
            MacAlg::HmacSha1 => ni.sha1(one, [blocks], n),
            MacAlg::HmacSha256 => ni.sha256(one, [blocks], n),
        }
        return;
    }
    compress_portable(alg, state, blocks);
}

/// [`compress`] with RustCrypto's compression functions (which use SHA-NI
/// themselves when the CPU has it).
fn compress_portable(alg: MacAlg, state: &mut [u32; 8], blocks: &[u8]) {
    match alg {
        MacAlg::HmacSha1 => {
            let st: &mut [u32; 5] = state.first_chunk_mut().expect("8 > 5 words");
            for b in blocks.chunks_exact(BLOCK) {
                sha1::compress(st, std::slice::from_ref(GenericArray::from_slice(b)));
            }
        }
        MacAlg::HmacSha256 => {
            for b in blocks.chunks_exact(BLOCK) {
                sha2::compress256(state, std::slice::from_ref(GenericArray::from_slice(b)));
            }
        }
    }
}

/// The hash value of `state`: its words big-endian (FIPS 180-4 §6.1.2
/// step 4, §6.2.2 step 4); bytes past `alg.output_len()` are zero.
fn digest_bytes(alg: MacAlg, state: &[u32; 8]) -> [u8; MAX_MAC_LEN] {
    let mut out = [0u8; MAX_MAC_LEN];
    digest_into(alg, state, &mut out);
    out
}

/// Writes the hash value of `state` to the start of `out` (at least
/// `alg.output_len()` bytes), word by word: no intermediate array, whose
/// 4-byte stores read back 16 bytes at a time would miss store forwarding.
fn digest_into(alg: MacAlg, state: &[u32; 8], out: &mut [u8]) {
    for (o, w) in out.chunks_exact_mut(4).zip(&state[..alg.output_len() / 4]) {
        o.copy_from_slice(&w.to_be_bytes());
    }
}

/// Builds the final padded block(s) of a message (FIPS 180-4 §5.1.1):
/// `rest` (under 64 bytes: the message bytes after its last whole block),
/// 0x80, zeros, and the message length `total` (in bytes, counting
/// everything hashed so far and `rest`) as a 64-bit big-endian bit count.
/// Returns the number of blocks written to `out`: 1, or 2 when `rest` is
/// 56 bytes or longer.
fn pad(rest: &[u8], total: u64, out: &mut [u8; 2 * BLOCK]) -> usize {
    let r = rest.len();
    debug_assert!(r < BLOCK);
    let blocks = if r + 9 <= BLOCK { 1 } else { 2 };
    let end = blocks * BLOCK;
    out[..r].copy_from_slice(rest);
    out[r] = 0x80;
    out[r + 1..end - 8].fill(0);
    out[end - 8..end].copy_from_slice(&total.wrapping_mul(8).to_be_bytes());
    blocks
}

/// The outer hash's one block: the inner digest and its padding (the
/// outer message is the opad block plus the digest).
fn outer_block(alg: MacAlg, inner: &[u32; 8], out: &mut [u8; 2 * BLOCK]) {
    let n = alg.output_len();
    digest_into(alg, inner, out);
    out[n] = 0x80;
    out[n + 1..BLOCK - 8].fill(0);
    out[BLOCK - 8..BLOCK].copy_from_slice(&(((BLOCK + n) * 8) as u64).to_be_bytes());
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

/// A session's HMAC key: algorithm, the hash states after the inner and
/// outer key blocks, and the tag length the session uses. Zeroized on drop.
#[derive(Clone)]
pub struct MacKey {
    alg: MacAlg,
    inner: [u32; 8],
    outer: [u32; 8],
    digest_len: usize,
}

impl Drop for MacKey {
    fn drop(&mut self) {
        self.inner.zeroize();
        self.outer.zeroize();
    }
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
    /// Builds the key states from `key` (any length; keys longer than the
    /// hash's 64-byte block are hashed first, RFC 2104 §2) for tags
    /// truncated to `digest_len` bytes.
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
        let mut block = [0u8; BLOCK];
        if key.len() > BLOCK {
            let mut st = alg.iv();
            let whole = key.len() / BLOCK * BLOCK;
            compress(alg, &mut st, &key[..whole]);
            let mut tail = [0u8; 2 * BLOCK];
            let n = pad(&key[whole..], key.len() as u64, &mut tail);
            compress(alg, &mut st, &tail[..n * BLOCK]);
            let mut d = digest_bytes(alg, &st);
            block[..alg.output_len()].copy_from_slice(&d[..alg.output_len()]);
            d.zeroize();
            st.zeroize();
            tail.zeroize();
        } else {
            block[..key.len()].copy_from_slice(key);
        }
        let mut inner = alg.iv();
        let mut outer = alg.iv();
        block.iter_mut().for_each(|b| *b ^= 0x36);
        compress(alg, &mut inner, &block);
        block.iter_mut().for_each(|b| *b ^= 0x36 ^ 0x5c);
        compress(alg, &mut outer, &block);
        block.zeroize();
        Ok(MacKey {
            alg,
            inner,
            outer,
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

    /// Whether a full-length `tag` (from [`mac_multi`]), truncated to the
    /// session's digest length, equals `expected`, in constant time (for a
    /// given length). False when `expected` is not exactly `digest_len`
    /// bytes long.
    pub fn verify_tag(&self, tag: &[u8; MAX_MAC_LEN], expected: &[u8]) -> bool {
        let n = self.digest_len;
        expected.len() == n && bool::from(tag[..n].ct_eq(expected))
    }

    /// Starts a MAC computation (copies the two key states; no allocation).
    pub fn start(&self) -> MacStream {
        MacStream {
            alg: self.alg,
            state: self.inner,
            outer: self.outer,
            buf: [0; BLOCK],
            buf_len: 0,
            total: BLOCK as u64,
            digest_len: self.digest_len,
        }
    }

    /// The full-length tag of `data` computed with RustCrypto's
    /// compression functions only (the portable engine of `mac_multi`).
    fn tag_portable(&self, data: &[u8]) -> [u8; MAX_MAC_LEN] {
        let alg = self.alg;
        let mut state = self.inner;
        let whole = data.len() / BLOCK * BLOCK;
        compress_portable(alg, &mut state, &data[..whole]);
        let mut tail = [0u8; 2 * BLOCK];
        let n = pad(&data[whole..], (BLOCK + data.len()) as u64, &mut tail);
        compress_portable(alg, &mut state, &tail[..n * BLOCK]);
        outer_block(alg, &state, &mut tail);
        let mut outer = self.outer;
        compress_portable(alg, &mut outer, &tail[..BLOCK]);
        let tag = digest_bytes(alg, &outer);
        state.zeroize();
        outer.zeroize();
        tail[..MAX_MAC_LEN].zeroize();
        tag
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

/// One MAC computation in progress: the inner hash's state, the outer key
/// state, and up to one block of message bytes not yet hashed. Zeroized on
/// drop.
pub struct MacStream {
    alg: MacAlg,
    state: [u32; 8],
    outer: [u32; 8],
    buf: [u8; BLOCK],
    buf_len: usize,
    /// Bytes hashed by the inner hash, the ipad block included.
    total: u64,
    digest_len: usize,
}

impl Drop for MacStream {
    fn drop(&mut self) {
        self.state.zeroize();
        self.outer.zeroize();
        self.buf.zeroize();
    }
}

impl fmt::Debug for MacStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MacStream { .. }")
    }
}

impl MacStream {
    /// Feeds the next piece of the message.
    pub fn update(&mut self, mut data: &[u8]) {
        self.total = self.total.wrapping_add(data.len() as u64);
        if self.buf_len > 0 {
            let n = (BLOCK - self.buf_len).min(data.len());
            self.buf[self.buf_len..self.buf_len + n].copy_from_slice(&data[..n]);
            self.buf_len += n;
            data = &data[n..];
            if self.buf_len < BLOCK {
                return;
            }
            compress(self.alg, &mut self.state, &self.buf);
            self.buf_len = 0;
        }
        let whole = data.len() / BLOCK * BLOCK;
        compress(self.alg, &mut self.state, &data[..whole]);
        let rest = &data[whole..];
        self.buf[..rest.len()].copy_from_slice(rest);
        self.buf_len = rest.len();
    }

    /// Finishes and returns the full-length tag (bytes past the
    /// algorithm's output length are zero).
    fn finish_full(&mut self) -> [u8; MAX_MAC_LEN] {
        let mut tail = [0u8; 2 * BLOCK];
        let n = pad(&self.buf[..self.buf_len], self.total, &mut tail);
        compress(self.alg, &mut self.state, &tail[..n * BLOCK]);
        outer_block(self.alg, &self.state, &mut tail);
        compress(self.alg, &mut self.outer, &tail[..BLOCK]);
        tail.zeroize();
        digest_bytes(self.alg, &self.outer)
    }

    /// Finishes and writes the truncated tag (`digest_len` bytes) to the
    /// start of `out`. Returns the bytes written: `digest_len`, or 0 when
    /// `out` is shorter than that (nothing is written then).
    pub fn finish_into(mut self, out: &mut [u8]) -> usize {
        let n = self.digest_len;
        let Some(o) = out.get_mut(..n) else {
            return 0;
        };
        let mut tag = self.finish_full();
        o.copy_from_slice(&tag[..n]);
        tag.zeroize();
        n
    }

    /// Finishes and compares the truncated tag with `expected` in constant
    /// time (for a given length). False when `expected` is not exactly
    /// `digest_len` bytes long.
    pub fn verify_truncated(mut self, expected: &[u8]) -> bool {
        let n = self.digest_len;
        let mut tag = self.finish_full();
        let ok = expected.len() == n && bool::from(tag[..n].ct_eq(expected));
        tag.zeroize();
        ok
    }
}
