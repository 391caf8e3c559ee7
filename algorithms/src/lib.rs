// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Cipher engines for vhost-user-crypto.
//!
//! This crate knows nothing about virtio: it turns key bytes into expanded
//! key schedules and runs AES-CBC (NIST SP 800-38A §6.2) over byte buffers,
//! either in place or from one buffer into another, and as a stream, so a
//! caller can feed a message whose bytes live in several separate buffers
//! (descriptor segments) one piece at a time.
//!
//! For algorithm chaining, [`mac`] adds HMAC-SHA1 and HMAC-SHA-256 behind
//! the same build-once, stream-per-request interface, plus [`mac_multi`],
//! the tags of up to 16 messages at once (SHA-NI with the compressions of
//! several messages interleaved, or 16 messages in AVX-512 lanes), on the
//! engine of [`ShaEngine`] chosen at run time.
//!
//! Single-message AES-CBC ([`CbcStream`]) is RustCrypto's `aes` 0.8 /
//! `cbc` 0.1 / `cipher` 0.4 (AES-NI when the CPU has it, a constant-time
//! software fallback otherwise), except decryption when the process-wide
//! engine ([`aes_engine`]) is [`AesEngine::Vaes512`]: then 16 blocks at a
//! time go through this crate's VAES kernel. Multi-buffer CBC encryption
//! ([`cbc_encrypt_multi`]) runs on one of the engines of [`AesEngine`],
//! chosen at run time: VAES kernels of this crate on 512- or 256-bit
//! registers, or the `aes` crate.
//! Key schedules are zeroized when dropped (the `zeroize` features of `aes`
//! and `cbc`, and [`zeroize`] for this crate's own round keys), and no type
//! here prints key material in its `Debug` output.
//!
//! `unsafe` code (SIMD intrinsics) lives only in the modules
//! `key_schedule`, `cbc_lanes`, `cbc_decrypt`, `mac::sha_lanes` and
//! `mac::avx512_x16`.

#![deny(unsafe_code)]
#![deny(missing_docs)]

use aes::{Aes128, Aes192, Aes256};
use cipher::generic_array::typenum::U16;
use cipher::inout::InOutBuf;
use cipher::{BlockDecryptMut, BlockEncryptMut, KeyInit};
use std::fmt;

pub use cipher;

mod cbc_decrypt;
mod cbc_lanes;
mod engine;
mod key_schedule;
pub mod mac;
pub use engine::{
    aes_engine, aes_engine_choice, cbc_encrypt_multi_with, AesEngine, AesEngineChoice, EngineChoice,
    AES_ENGINE_ENV,
};
use key_schedule::RoundKeys;
pub use mac::{
    mac_multi, mac_multi_with, sha_engine, sha_engine_choice, MacAlg, MacError, MacJob, MacKey, MacStream,
    ShaEngine, MAX_MAC_LANES, MAX_MAC_LEN, SHA_ENGINE_ENV,
};

/// AES block size in bytes (FIPS 197).
pub const AES_BLOCK_SIZE: usize = 16;

/// AES-CBC IV size in bytes (NIST SP 800-38A §6.2).
pub const AES_CBC_IV_SIZE: usize = 16;

/// Errors from the engines. None of them is reachable from well-formed input.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// The key is not 16, 24 or 32 bytes long.
    #[error("AES key must be 16, 24 or 32 bytes, got {0}")]
    InvalidKeyLength(usize),
    /// A buffer handed to a block operation is not a whole number of blocks,
    /// or input and output lengths differ.
    #[error("buffer of {0} bytes is not a whole number of 16-byte blocks or lengths differ")]
    InvalidBufferLength(usize),
    /// [`cbc_encrypt_multi_with`] was asked for an engine this CPU cannot
    /// run (see [`AesEngine::is_supported`]); nothing is processed then.
    #[error("AES engine {0} is not supported by this CPU")]
    EngineUnavailable(&'static str),
}

/// Cipher direction of a CBC operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Plaintext to ciphertext.
    Encrypt,
    /// Ciphertext to plaintext.
    Decrypt,
}

/// An expanded AES key schedule for one of the three AES key sizes.
///
/// Built once per session (`AesCbcKey::new`) and reused for every request:
/// starting an operation only copies the schedule, it never re-expands the key.
/// The schedule is zeroized on drop.
///
/// It holds the `aes` crate's schedule (single-message encryption and
/// decryption) and, on CPUs with AES-NI, this crate's encryption round keys
/// (FIPS 197 §5.2) for the VAES multi-buffer kernels.
#[derive(Clone)]
pub struct AesCbcKey {
    cipher: Cipher,
    round_keys: Option<RoundKeys>,
}

#[derive(Clone)]
enum Cipher {
    Aes128(Aes128),
    Aes192(Aes192),
    Aes256(Aes256),
}

impl fmt::Debug for AesCbcKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the key schedule.
        write!(f, "AesCbcKey {{ bits: {} }}", self.key_bits())
    }
}

impl AesCbcKey {
    /// Expands `key` (16, 24 or 32 bytes).
    ///
    /// # Errors
    /// [`Error::InvalidKeyLength`] for any other length.
    pub fn new(key: &[u8]) -> Result<Self, Error> {
        let bad = |_| Error::InvalidKeyLength(key.len());
        let cipher = match key.len() {
            16 => Cipher::Aes128(Aes128::new_from_slice(key).map_err(bad)?),
            24 => Cipher::Aes192(Aes192::new_from_slice(key).map_err(bad)?),
            32 => Cipher::Aes256(Aes256::new_from_slice(key).map_err(bad)?),
            n => return Err(Error::InvalidKeyLength(n)),
        };
        Ok(AesCbcKey {
            cipher,
            round_keys: RoundKeys::expand(key),
        })
    }

    /// Key size in bits: 128, 192 or 256.
    pub fn key_bits(&self) -> u32 {
        match self.cipher {
            Cipher::Aes128(_) => 128,
            Cipher::Aes192(_) => 192,
            Cipher::Aes256(_) => 256,
        }
    }

    /// Starts a CBC operation in `direction` with the 16-byte `iv`. The
    /// stream borrows the key schedule (nothing is copied but the IV).
    pub fn start(&self, direction: Direction, iv: &[u8; AES_CBC_IV_SIZE]) -> CbcStream<'_> {
        if let (Direction::Decrypt, AesEngine::Vaes512, Some(rk)) =
            (direction, aes_engine(), &self.round_keys)
        {
            return CbcStream {
                inner: Inner::DecVaes512(rk, &self.cipher, zeroize::Zeroizing::new(*iv)),
            };
        }
        let iv = iv.into();
        let inner = match (&self.cipher, direction) {
            (Cipher::Aes128(k), Direction::Encrypt) => Inner::Enc128(cbc::Encryptor::inner_iv_init(k, iv)),
            (Cipher::Aes192(k), Direction::Encrypt) => Inner::Enc192(cbc::Encryptor::inner_iv_init(k, iv)),
            (Cipher::Aes256(k), Direction::Encrypt) => Inner::Enc256(cbc::Encryptor::inner_iv_init(k, iv)),
            (Cipher::Aes128(k), Direction::Decrypt) => Inner::Dec128(cbc::Decryptor::inner_iv_init(k, iv)),
            (Cipher::Aes192(k), Direction::Decrypt) => Inner::Dec192(cbc::Decryptor::inner_iv_init(k, iv)),
            (Cipher::Aes256(k), Direction::Decrypt) => Inner::Dec256(cbc::Decryptor::inner_iv_init(k, iv)),
        };
        CbcStream { inner }
    }
}

use cipher::InnerIvInit;

enum Inner<'k> {
    Enc128(cbc::Encryptor<&'k Aes128>),
    Enc192(cbc::Encryptor<&'k Aes192>),
    Enc256(cbc::Encryptor<&'k Aes256>),
    Dec128(cbc::Decryptor<&'k Aes128>),
    Dec192(cbc::Decryptor<&'k Aes192>),
    Dec256(cbc::Decryptor<&'k Aes256>),
    /// Decryption on 512-bit VAES ([`AesEngine::Vaes512`]): round keys,
    /// the `aes` key for pieces shorter than [`VAES512_DECRYPT_MIN`], and
    /// the chaining value.
    DecVaes512(
        &'k RoundKeys,
        &'k Cipher,
        zeroize::Zeroizing<[u8; AES_CBC_IV_SIZE]>,
    ),
}

/// Shortest piece, in bytes, that [`CbcStream`] decrypts with the VAES-512
/// kernel; shorter ones take the `aes` crate. The kernel makes its
/// decryption round keys on each call, about 30 ns: one 64-byte piece took
/// 39 ns against the `aes` crate's 14, 256 bytes 35 against 33, 512 bytes
/// 43 against 65 (best of 30 runs of 2,000, Sapphire Rapids class VM).
const VAES512_DECRYPT_MIN: usize = 512;

/// One CBC operation in progress: a borrowed key schedule plus the chaining
/// value (zeroized on drop).
///
/// Feed the message in order, in pieces of whole blocks; the chaining value
/// carries over from one call to the next, so the result is the same however
/// the message is cut.
pub struct CbcStream<'k> {
    inner: Inner<'k>,
}

impl fmt::Debug for CbcStream<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CbcStream { .. }")
    }
}

impl CbcStream<'_> {
    /// Processes whole blocks from `buf`'s input into its output (the two may
    /// be the same memory, see [`InOutBuf`]).
    ///
    /// # Errors
    /// [`Error::InvalidBufferLength`] if the length is not a multiple of 16;
    /// nothing is processed then.
    pub fn process_inout(&mut self, buf: InOutBuf<'_, '_, u8>) -> Result<(), Error> {
        let len = buf.len();
        if !len.is_multiple_of(AES_BLOCK_SIZE) {
            return Err(Error::InvalidBufferLength(len));
        }
        if let Inner::DecVaes512(rk, cipher, iv) = &mut self.inner {
            if len >= VAES512_DECRYPT_MIN {
                // `aes_engine()` is Vaes512 only on a CPU that runs it, so
                // the error is not reached.
                return match cbc_decrypt::decrypt_vaes512_inout(rk, iv, buf) {
                    true => Ok(()),
                    false => Err(Error::EngineUnavailable(AesEngine::Vaes512.name())),
                };
            }
            // Short: the `aes` crate, its decryption keys made once per
            // session; the chaining value is the piece's last ciphertext
            // block, taken before an in-place decryption overwrites it.
            let next = buf.get_in().last_chunk::<AES_BLOCK_SIZE>().copied();
            let (blocks, _) = buf.into_chunks::<U16>();
            let at = (&**iv).into();
            match cipher {
                Cipher::Aes128(k) => cbc::Decryptor::inner_iv_init(k, at).decrypt_blocks_inout_mut(blocks),
                Cipher::Aes192(k) => cbc::Decryptor::inner_iv_init(k, at).decrypt_blocks_inout_mut(blocks),
                Cipher::Aes256(k) => cbc::Decryptor::inner_iv_init(k, at).decrypt_blocks_inout_mut(blocks),
            }
            if let Some(next) = next {
                **iv = next;
            }
            return Ok(());
        }
        let (blocks, _) = buf.into_chunks::<U16>();
        match &mut self.inner {
            Inner::Enc128(c) => c.encrypt_blocks_inout_mut(blocks),
            Inner::Enc192(c) => c.encrypt_blocks_inout_mut(blocks),
            Inner::Enc256(c) => c.encrypt_blocks_inout_mut(blocks),
            Inner::Dec128(c) => c.decrypt_blocks_inout_mut(blocks),
            Inner::Dec192(c) => c.decrypt_blocks_inout_mut(blocks),
            Inner::Dec256(c) => c.decrypt_blocks_inout_mut(blocks),
            Inner::DecVaes512(..) => {}
        }
        Ok(())
    }

    /// Processes whole blocks of `data` in place.
    ///
    /// # Errors
    /// [`Error::InvalidBufferLength`] if the length is not a multiple of 16.
    pub fn process_in_place(&mut self, data: &mut [u8]) -> Result<(), Error> {
        self.process_inout(data.into())
    }

    /// Processes whole blocks from `input` into `output` (same length).
    ///
    /// # Errors
    /// [`Error::InvalidBufferLength`] if the lengths differ or are not a
    /// multiple of 16.
    pub fn process_b2b(&mut self, input: &[u8], output: &mut [u8]) -> Result<(), Error> {
        let len = input.len();
        let buf = InOutBuf::new(input, output).map_err(|_| Error::InvalidBufferLength(len))?;
        self.process_inout(buf)
    }

    /// Processes one block in place.
    pub fn process_block(&mut self, block: &mut [u8; AES_BLOCK_SIZE]) {
        // A 16-byte array is always exactly one block.
        let _ = self.process_in_place(block);
    }
}

/// Most messages [`cbc_encrypt_multi`] takes in one call: 16, the lanes of
/// four 512-bit VAES registers ([`AesEngine::Vaes512`]).
pub const MAX_LANES: usize = 16;

/// Most messages the `aes` crate's AES-NI backend interleaves: it encrypts
/// 8 blocks per call in its pipelined path ([`AesEngine::AesNi`] runs
/// larger batches as two groups).
const GROUP_LANES: usize = 8;

/// Steps by which each lane of [`cbc_encrypt_multi`] starts later than the
/// previous one on long messages (4 blocks = one 64-byte cache line).
const SKEW_BLOCKS: usize = 4;

/// One message of a multi-buffer encryption: its IV and its data (whole
/// blocks, in place or from one buffer into another, see [`InOutBuf`]).
pub struct Lane<'a> {
    /// The IV; holds the chaining value (last ciphertext block) afterwards.
    pub iv: [u8; AES_CBC_IV_SIZE],
    /// The message.
    pub buf: InOutBuf<'a, 'a, u8>,
}

impl fmt::Debug for Lane<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Lane {{ len: {} }}", self.buf.len())
    }
}

/// CBC-encrypts up to [`MAX_LANES`] independent messages with one key, on
/// the process-wide engine [`aes_engine`].
///
/// CBC encryption is serial within a message (each block needs the
/// previous ciphertext), so one message leaves the cipher's parallel lanes
/// idle. Here block *j* of every message is encrypted together, so the
/// AES units pipeline them; messages of different lengths drop out as they
/// end (a single message takes the [`CbcStream`] path). The output is
/// exactly that of [`CbcStream`] run on each message alone (tested
/// differentially against RustCrypto's `cbc`), and each lane's `iv` ends
/// up holding its last ciphertext block (unchanged when empty).
///
/// # Errors
/// [`Error::InvalidBufferLength`] if more than [`MAX_LANES`] lanes are
/// given or a lane is not a whole number of blocks; nothing is processed then.
pub fn cbc_encrypt_multi(key: &AesCbcKey, lanes: &mut [Lane<'_>]) -> Result<(), Error> {
    cbc_encrypt_multi_with(aes_engine(), key, lanes)
}

/// One message through the single-stream path; `iv` ends up holding the
/// last ciphertext block.
fn encrypt_one(key: &AesCbcKey, one: &mut Lane<'_>) {
    // A whole number of blocks (checked by the callers).
    let _ = key
        .start(Direction::Encrypt, &one.iv)
        .process_inout(one.buf.reborrow());
    if let Some(last) = one.buf.get_out().last_chunk::<AES_BLOCK_SIZE>() {
        one.iv = *last;
    }
}

/// The `aes` crate's multi-lane path: up to [`GROUP_LANES`] lanes per
/// backend call, larger batches split in two.
fn encrypt_aes_crate(key: &AesCbcKey, lanes: &mut [Lane<'_>]) {
    if lanes.len() > GROUP_LANES {
        let (a, b) = lanes.split_at_mut(lanes.len().div_ceil(2));
        encrypt_aes_crate(key, a);
        encrypt_aes_crate(key, b);
        return;
    }
    if let [one] = lanes {
        encrypt_one(key, one);
        return;
    }
    match &key.cipher {
        Cipher::Aes128(k) => encrypt_lanes(k, lanes),
        Cipher::Aes192(k) => encrypt_lanes(k, lanes),
        Cipher::Aes256(k) => encrypt_lanes(k, lanes),
    }
}

fn encrypt_lanes<C: cipher::BlockEncrypt + cipher::BlockSizeUser<BlockSize = U16>>(
    key: &C,
    lanes: &mut [Lane<'_>],
) {
    // One backend dispatch for the whole batch: the closure runs inside the
    // AES-NI (or software) backend and feeds it a parallel block per step.
    key.encrypt_with_backend(MultiLane { lanes });
}

struct MultiLane<'l, 'a> {
    lanes: &'l mut [Lane<'a>],
}

impl cipher::BlockSizeUser for MultiLane<'_, '_> {
    type BlockSize = U16;
}

impl cipher::BlockClosure for MultiLane<'_, '_> {
    fn call<B: cipher::BlockBackend<BlockSize = U16>>(self, backend: &mut B) {
        use cipher::typenum::Unsigned;
        let par = B::ParBlocksSize::USIZE;
        let lanes = self.lanes;
        let nl = lanes.len().min(GROUP_LANES);
        // Chaining values and lengths in locals: the hot loop below works
        // on 128-bit words, not byte by byte.
        let mut state = [0u128; GROUP_LANES];
        let mut blocks = [0usize; GROUP_LANES];
        for (i, l) in lanes.iter().enumerate().take(nl) {
            state[i] = u128::from_le_bytes(l.iv);
            blocks[i] = l.buf.len() / AES_BLOCK_SIZE;
        }
        let longest = blocks.iter().copied().max().unwrap_or(0);
        // Lane k starts `k * skew` steps late. Guest buffers are often page
        // aligned: without the skew, block j of all lanes (and of their
        // outputs) sits at the same page offset, in the same L1 cache set,
        // and the lanes evict each other. Short messages gain nothing from
        // it, and buffers that do not collide only lose (the first and last
        // steps run with lanes missing).
        let skew = if longest >= 32 && sets_collide(&mut lanes[..nl]) {
            SKEW_BLOCKS
        } else {
            0
        };
        let steps = longest + skew * nl.saturating_sub(1);
        let mut work = cipher::ParBlocks::<B>::default();
        let equal = blocks[..nl].iter().all(|&b| b == longest);
        // The usual batch: eight same-size messages (lanes_full), or
        // fewer (lanes_equal).
        let full = if skew == 0 && par >= GROUP_LANES && equal {
            <&mut [Lane<'_>; GROUP_LANES]>::try_from(&mut lanes[..]).ok()
        } else {
            None
        };
        let done = full.is_some_and(|full| lanes_full(backend, full, &mut state, &mut work));
        if !done && skew == 0 && nl >= 2 && par >= GROUP_LANES && equal {
            lanes_equal(backend, &mut lanes[..nl], &mut state, longest, &mut work);
        } else if !done {
            self::lanes_ragged(backend, lanes, &mut state, &blocks, nl, skew, steps, &mut work);
        }
        for (l, s) in lanes.iter_mut().zip(&state) {
            l.iv = s.to_le_bytes();
        }
        // The work blocks hold ciphertext, which the lanes have anyway; clear
        // them all the same so no message bytes stay on the stack.
        for b in work.iter_mut() {
            zeroize::Zeroize::zeroize(b.as_mut_slice());
        }
    }
}

/// [`MultiLane`]'s loop for its usual case: [`GROUP_LANES`] messages of equal
/// length, no skew, a backend with at least [`GROUP_LANES`] parallel blocks.
/// The work blocks carry the chaining values from step to step. `state`
/// holds the IVs on entry and the last ciphertext blocks on return.
/// Returns false, having done nothing, if the lanes' lengths differ (the
/// caller checked that they do not).
///
/// Unlike [`lanes_equal`], the lanes' buffers are reached through a local
/// array of fixed size: the loop over lanes unrolls, and their addresses
/// and lengths are not reloaded through `lanes` after every 16-byte store.
/// 387 instead of 538 instructions per 256-byte message (callgrind), and
/// 15-20 % less time in the engines bench; the same code for 2 to 7 lanes
/// (a slice of that array) measured no faster than [`lanes_equal`].
fn lanes_full<B: cipher::BlockBackend<BlockSize = U16>>(
    backend: &mut B,
    lanes: &mut [Lane<'_>; GROUP_LANES],
    state: &mut [u128; GROUP_LANES],
    work: &mut cipher::ParBlocks<B>,
) -> bool {
    let mut bufs = lanes.each_mut().map(|l| l.buf.reborrow().into_chunks::<U16>().0);
    let n = bufs[0].len();
    if bufs.iter().any(|b| b.len() != n) {
        return false;
    }
    for (w, s) in work.iter_mut().zip(state.iter()) {
        w.copy_from_slice(&s.to_le_bytes());
    }
    for j in 0..n {
        for (w, b) in work.iter_mut().zip(bufs.iter_mut()) {
            let p = u128::from_le_bytes((*b.get(j).get_in()).into());
            let mut c = [0u8; AES_BLOCK_SIZE];
            c.copy_from_slice(w);
            w.copy_from_slice(&(p ^ u128::from_le_bytes(c)).to_le_bytes());
        }
        backend.proc_par_blocks_inplace(work);
        for (w, b) in work.iter().zip(bufs.iter_mut()) {
            b.get(j).get_out().copy_from_slice(w);
        }
    }
    for (w, s) in work.iter().zip(state.iter_mut()) {
        let mut c = [0u8; AES_BLOCK_SIZE];
        c.copy_from_slice(w);
        *s = u128::from_le_bytes(c);
    }
    true
}

/// [`MultiLane`]'s loop for fewer than [`GROUP_LANES`] messages of equal
/// length (`blocks` blocks each), no skew, a backend with at least
/// [`GROUP_LANES`] parallel blocks: every lane has a block at every step, so
/// there are no per-lane checks. The work blocks carry the chaining values
/// from step to step (one store-to-load round trip per block less than
/// keeping them apart).
fn lanes_equal<B: cipher::BlockBackend<BlockSize = U16>>(
    backend: &mut B,
    lanes: &mut [Lane<'_>],
    state: &mut [u128; GROUP_LANES],
    blocks: usize,
    work: &mut cipher::ParBlocks<B>,
) {
    let nl = lanes.len();
    for (w, s) in work.iter_mut().zip(&state[..nl]) {
        w.copy_from_slice(&s.to_le_bytes());
    }
    for step in 0..blocks {
        let off = step * AES_BLOCK_SIZE;
        for (i, w) in work.iter_mut().enumerate().take(nl) {
            let mut p = [0u8; AES_BLOCK_SIZE];
            p.copy_from_slice(&lanes[i].buf.get_in()[off..off + AES_BLOCK_SIZE]);
            let mut c = [0u8; AES_BLOCK_SIZE];
            c.copy_from_slice(w);
            w.copy_from_slice(&(u128::from_le_bytes(p) ^ u128::from_le_bytes(c)).to_le_bytes());
        }
        backend.proc_par_blocks_inplace(work);
        for (i, w) in work.iter().enumerate().take(nl) {
            lanes[i].buf.get_out()[off..off + AES_BLOCK_SIZE].copy_from_slice(w);
        }
    }
    for (w, s) in work.iter().zip(&mut state[..nl]) {
        let mut c = [0u8; AES_BLOCK_SIZE];
        c.copy_from_slice(w);
        *s = u128::from_le_bytes(c);
    }
}

/// Whether the lanes' inputs and outputs start at addresses that would put
/// more than [`MAX_STREAMS_PER_SET`] of them in one L1 cache set at every
/// step (64-byte lines, 64 sets: 4 KiB apart, as page-aligned buffers are).
/// The lanes advance in step, so the starting addresses decide it.
fn sets_collide(lanes: &mut [Lane<'_>]) -> bool {
    let mut per_set = [0u8; 64];
    for l in lanes {
        for a in [
            l.buf.get_in().as_ptr() as usize,
            l.buf.get_out().as_ptr() as usize,
        ] {
            let n = &mut per_set[(a >> 6) & 63];
            *n += 1;
            if usize::from(*n) > MAX_STREAMS_PER_SET {
                return true;
            }
        }
    }
    false
}

/// See [`sets_collide`]: half the ways of an 8-way L1 data cache.
const MAX_STREAMS_PER_SET: usize = 4;

/// The general multi-lane loop: lanes of different lengths, skewed starts,
/// or a backend with fewer parallel blocks than lanes.
#[allow(clippy::too_many_arguments)]
fn lanes_ragged<B: cipher::BlockBackend<BlockSize = U16>>(
    backend: &mut B,
    lanes: &mut [Lane<'_>],
    state: &mut [u128; GROUP_LANES],
    blocks: &[usize; GROUP_LANES],
    nl: usize,
    skew: usize,
    steps: usize,
    work: &mut cipher::ParBlocks<B>,
) {
    {
        use cipher::typenum::Unsigned;
        let par = B::ParBlocksSize::USIZE;
        let mut which = [(0usize, 0usize); GROUP_LANES];
        for step in 0..steps {
            let mut n = 0;
            for i in 0..nl {
                let Some(block) = step.checked_sub(i * skew) else {
                    continue;
                };
                if block < blocks[i] {
                    let off = block * AES_BLOCK_SIZE;
                    let mut p = [0u8; AES_BLOCK_SIZE];
                    p.copy_from_slice(&lanes[i].buf.get_in()[off..off + AES_BLOCK_SIZE]);
                    let x = (u128::from_le_bytes(p) ^ state[i]).to_le_bytes();
                    if par >= GROUP_LANES {
                        work[n].copy_from_slice(&x);
                    } else {
                        // A backend with fewer parallel blocks than lanes
                        // (the software fallback): one block at a time.
                        let mut b = cipher::Block::<B>::clone_from_slice(&x);
                        backend.proc_block_inplace(&mut b);
                        lanes[i].buf.get_out()[off..off + AES_BLOCK_SIZE].copy_from_slice(&b);
                        p.copy_from_slice(&b);
                        state[i] = u128::from_le_bytes(p);
                        continue;
                    }
                    which[n] = (i, off);
                    n += 1;
                }
            }
            match n {
                0 => continue,
                1 => backend.proc_block_inplace(&mut work[0]),
                // Two lanes or more: the pipelined call costs about the same
                // as one block alone, whatever the unused blocks hold (their
                // results are dropped).
                _ => backend.proc_par_blocks_inplace(work),
            }
            for (b, &(i, off)) in work[..n].iter().zip(&which[..n]) {
                lanes[i].buf.get_out()[off..off + AES_BLOCK_SIZE].copy_from_slice(b);
                let mut c = [0u8; AES_BLOCK_SIZE];
                c.copy_from_slice(b);
                state[i] = u128::from_le_bytes(c);
            }
        }
    }
}

/// Single-stream reference path: AES-CBC over `data` in place, one call.
///
/// This is the path pinned by the NIST SP 800-38A vectors in `tests/`; other
/// tools (trace generators, differential tests) take expected outputs from it.
///
/// # Errors
/// [`Error::InvalidKeyLength`] or [`Error::InvalidBufferLength`].
pub fn aes_cbc(
    direction: Direction,
    key: &[u8],
    iv: &[u8; AES_CBC_IV_SIZE],
    data: &mut [u8],
) -> Result<(), Error> {
    AesCbcKey::new(key)?.start(direction, iv).process_in_place(data)
}
