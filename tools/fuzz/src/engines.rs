// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The `engines` target: the multi-buffer AES-CBC and HMAC engines of the
//! `algorithms` crate against RustCrypto's `aes` + `cbc` and `hmac` +
//! `sha1` / `sha2` used directly.
//!
//! Input layout (every field read with [`Reader`], so missing bytes are
//! zero):
//!
//! | field | bytes | meaning |
//! |---|---|---|
//! | key size | 1 | 16, 24 or 32 bytes (value mod 3) |
//! | AES key | 16/24/32 | |
//! | lanes | 1 | 1 + value mod 16 |
//! | per lane: flags | 1 | bit 0 out of place, bits 1-4 start offset of the buffers (0..=15 bytes past the front guard) |
//! | per lane: cut | 1 | decryption fed in pieces of this many blocks (0: one call) |
//! | per lane: length | 1-3 | blocks, see [`read_blocks`]; all lanes together at most [`MAX_TOTAL_BLOCKS`] |
//! | per lane: IV | 16 | |
//! | MAC jobs | 1 | value mod 17 (0..=16) |
//! | per job: alg | 1 | bit 0: HMAC-SHA-256, else HMAC-SHA1 |
//! | per job: key | 1 + n | n = value mod 201, then n bytes |
//! | per job: length | 1-3 | message bytes, see [`read_msg_len`], at most [`MAX_MSG`] |
//! | per job: digest length | 1 | 1 + value mod the full tag length |
//! | per job: cut | 1 | [`MacStream`](algorithms::MacStream) fed in pieces (0: one call), see [`piece_len`] |
//! | data | the rest | lane k's bytes, then lane k+1's; MAC messages likewise from the start again; past the end zero |
//!
//! Every engine of [`AesEngine::available`] encrypts the lanes
//! (`cbc_encrypt_multi_with`); [`AesCbcKey::start`] decrypts each lane
//! (on the process-wide engine: the VAES-512 kernel when
//! `algorithms::aes_engine()` is `vaes512`, else `aes` + `cbc` themselves,
//! so only the former is a differential check); every engine of
//! [`ShaEngine::available`] computes the MAC jobs' tags (`mac_multi_with`);
//! [`MacKey::start`] streams each job in pieces. Checked: every output byte
//! and each lane's returned chaining value against RustCrypto, out-of-place
//! inputs unchanged, guard bytes around every buffer unchanged, tags and
//! their zero tails, truncation and verification.

use aes::cipher::{BlockDecryptMut, BlockEncryptMut, KeyIvInit};
use algorithms::cipher::generic_array::GenericArray;
use algorithms::cipher::inout::InOutBuf;
use algorithms::{
    cbc_encrypt_multi_with, mac_multi_with, AesCbcKey, AesEngine, Direction, Lane, MacAlg, MacJob, MacKey,
    ShaEngine, MAX_LANES, MAX_MAC_LANES, MAX_MAC_LEN,
};
use hmac::{Hmac, Mac};

use super::reader::{Reader, Writer};

/// Most blocks of all lanes together: 64 KiB.
pub const MAX_TOTAL_BLOCKS: usize = 4096;
/// Longest MAC message in bytes.
pub const MAX_MSG: usize = 8192;
/// Longest HMAC key the decoder makes, in bytes.
pub const MAX_MAC_KEY: usize = 200;
/// Messages up to this long also go through the negative and one-shot
/// checks of [`MacStream`](algorithms::MacStream).
const SHORT_MSG: usize = 256;
/// Guard bytes before (plus the lane's offset) and after each buffer.
const GUARD: usize = 32;

/// One lane of the encryption and decryption runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneSpec {
    /// Length in 16-byte blocks.
    pub blocks: u16,
    /// Input and output in separate buffers.
    pub out_of_place: bool,
    /// Start of the buffers past the front guard, 0..=15 bytes.
    pub offset: u8,
    /// Decryption piece size in blocks (0: one call).
    pub cut: u8,
    /// The IV.
    pub iv: [u8; 16],
}

/// One MAC job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MacSpec {
    /// HMAC-SHA-256 (else HMAC-SHA1).
    pub sha256: bool,
    /// The HMAC key, 0..=200 bytes.
    pub key: Vec<u8>,
    /// Message length in bytes.
    pub len: u16,
    /// Truncated tag length, 1..=the full tag length.
    pub digest_len: u8,
    /// How [`MacStream`](algorithms::MacStream) is fed ([`piece_len`]).
    pub cut: u8,
}

/// A decoded input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnginesProgram {
    /// The AES key: 16, 24 or 32 bytes.
    pub key: Vec<u8>,
    /// 1..=16 lanes.
    pub lanes: Vec<LaneSpec>,
    /// 0..=16 MAC jobs.
    pub macs: Vec<MacSpec>,
    /// The data pool.
    pub data: Vec<u8>,
}

/// What a run checked (for the corpus replay's "not vacuous" asserts).
#[derive(Debug, Default, Clone, Copy)]
pub struct Outcome {
    /// Lane encryptions checked (lanes × AES engines).
    pub lanes_encrypted: u64,
    /// Lane decryptions checked.
    pub lanes_decrypted: u64,
    /// Bytes encrypted and checked.
    pub bytes: u64,
    /// Tags checked (jobs × SHA engines, plus the streamed ones).
    pub tags: u64,
    /// Decryptions that ran on the crate's VAES-512 kernel.
    pub vaes_decrypts: u64,
}

/// Lane length: a byte below 0xC0 is its value mod 16 blocks, 0xC0..0xF0
/// is 16..=63 blocks, 0xF0..0xFF is 64 + the next byte, 0xFF a u16 mod
/// 4097 (long lanes are rare: they cost time and find little more).
fn read_blocks(r: &mut Reader<'_>) -> usize {
    match r.u8() {
        b if b < 0xC0 => usize::from(b % 16),
        b if b < 0xF0 => 16 + usize::from(b - 0xC0),
        0xFF => usize::from(r.u16()) % (MAX_TOTAL_BLOCKS + 1),
        _ => 64 + usize::from(r.u8()),
    }
}

fn write_blocks(w: &mut Writer, v: usize) {
    match v {
        0..16 => w.u8(v as u8),
        16..64 => w.u8(0xC0 + (v - 16) as u8),
        64..320 => {
            w.u8(0xF0);
            w.u8((v - 64) as u8);
        }
        _ => {
            w.u8(0xFF);
            w.u16(v as u16);
        }
    }
}

/// MAC message length: a byte below 0xF0 is its value mod 160 (every
/// padding case of one and two blocks), 0xF0 and above is followed by a
/// u16 mod [`MAX_MSG`] + 1.
fn read_msg_len(r: &mut Reader<'_>) -> usize {
    match r.u8() {
        b if b < 0xF0 => usize::from(b % 160),
        _ => usize::from(r.u16()) % (MAX_MSG + 1),
    }
}

fn write_msg_len(w: &mut Writer, v: usize) {
    if v < 160 {
        w.u8(v as u8);
    } else {
        w.u8(0xF0);
        w.u16(v as u16);
    }
}

/// Size of piece `k` when a message is streamed with `cut` (nonzero):
/// 1 to 130 bytes, varying from piece to piece around the 64-byte block.
pub fn piece_len(cut: u8, k: usize) -> usize {
    1 + (usize::from(cut) * (2 * k + 1)) % 130
}

fn alg(sha256: bool) -> MacAlg {
    if sha256 {
        MacAlg::HmacSha256
    } else {
        MacAlg::HmacSha1
    }
}

impl EnginesProgram {
    /// Decodes any byte string.
    pub fn decode(data: &[u8]) -> Self {
        let mut r = Reader::new(data);
        let ks = [16, 24, 32][usize::from(r.u8() % 3)];
        let mut key = r.bytes(ks).to_vec();
        key.resize(ks, 0);
        let n = 1 + usize::from(r.u8()) % MAX_LANES;
        let mut total = 0;
        let mut lanes = Vec::with_capacity(n);
        for _ in 0..n {
            let flags = r.u8();
            let cut = r.u8();
            let blocks = read_blocks(&mut r).min(MAX_TOTAL_BLOCKS - total);
            total += blocks;
            let mut iv = [0u8; 16];
            let b = r.bytes(16);
            iv[..b.len()].copy_from_slice(b);
            lanes.push(LaneSpec {
                blocks: blocks as u16,
                out_of_place: flags & 1 != 0,
                offset: (flags >> 1) & 15,
                cut,
                iv,
            });
        }
        let m = usize::from(r.u8()) % (MAX_MAC_LANES + 1);
        let mut macs = Vec::with_capacity(m);
        for _ in 0..m {
            let sha256 = r.u8() & 1 != 0;
            let kl = usize::from(r.u8()) % (MAX_MAC_KEY + 1);
            let mut key = r.bytes(kl).to_vec();
            key.resize(kl, 0);
            let len = read_msg_len(&mut r) as u16;
            let out = alg(sha256).output_len() as u8;
            let digest_len = 1 + r.u8() % out;
            let cut = r.u8();
            macs.push(MacSpec {
                sha256,
                key,
                len,
                digest_len,
                cut,
            });
        }
        let data = r.bytes(usize::MAX).to_vec();
        EnginesProgram {
            key,
            lanes,
            macs,
            data,
        }
    }

    /// The canonical bytes that [`EnginesProgram::decode`] reads back as
    /// `self` (for seeds; fields in their decoded ranges).
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.u8(((self.key.len() - 16) / 8) as u8);
        w.buf.extend_from_slice(&self.key);
        w.u8((self.lanes.len() - 1) as u8);
        for l in &self.lanes {
            w.u8(u8::from(l.out_of_place) | (l.offset << 1));
            w.u8(l.cut);
            write_blocks(&mut w, usize::from(l.blocks));
            w.buf.extend_from_slice(&l.iv);
        }
        w.u8(self.macs.len() as u8);
        for m in &self.macs {
            w.u8(u8::from(m.sha256));
            w.u8(m.key.len() as u8);
            w.buf.extend_from_slice(&m.key);
            write_msg_len(&mut w, usize::from(m.len));
            w.u8(m.digest_len - 1);
            w.u8(m.cut);
        }
        w.buf.extend_from_slice(&self.data);
        w.buf
    }
}

/// `n` bytes of the pool from `*at` on (zero past its end); advances `*at`.
fn take(pool: &[u8], at: &mut usize, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    let start = (*at).min(pool.len());
    let end = (*at + n).min(pool.len());
    v[..end - start].copy_from_slice(&pool[start..end]);
    *at += n;
    v
}

/// A buffer of `len` bytes at `offset` past the front guard, guards
/// around it.
struct Guarded {
    mem: Vec<u8>,
    start: usize,
    len: usize,
}

/// Guard contents: byte `i` of each guard is `PATTERN[i]`.
const PATTERN: [u8; 64] = {
    let mut p = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        p[i] = 0xA5 ^ (i as u8).wrapping_mul(29);
        i += 1;
    }
    p
};

impl Guarded {
    fn new(content: &[u8], offset: usize) -> Self {
        let start = GUARD + offset;
        let mut mem = Vec::with_capacity(start + content.len() + GUARD);
        mem.extend_from_slice(&PATTERN[..start]);
        mem.extend_from_slice(content);
        mem.extend_from_slice(&PATTERN[..GUARD]);
        Guarded {
            mem,
            start,
            len: content.len(),
        }
    }

    fn body(&self) -> &[u8] {
        &self.mem[self.start..self.start + self.len]
    }

    fn body_mut(&mut self) -> &mut [u8] {
        &mut self.mem[self.start..self.start + self.len]
    }

    // Slice comparisons (memcmp) here and below: byte loops in the harness
    // would cost more than the engines under the fuzzer's instrumentation.
    fn check_guards(&self, what: &dyn Fn() -> String) {
        let front = &self.mem[..self.start];
        let back = &self.mem[self.start + self.len..];
        assert!(
            front == &PATTERN[..self.start] && back == &PATTERN[..GUARD],
            "{}: guard bytes changed (buffer at {}, {} bytes): front {front:02x?}, back {back:02x?}",
            what(),
            self.start,
            self.len
        );
    }
}

/// RustCrypto's AES-CBC over whole blocks of `data`, in place.
fn reference_cbc(direction: Direction, key: &[u8], iv: &[u8; 16], data: &mut [u8]) {
    macro_rules! run {
        ($aes:ty) => {{
            match direction {
                Direction::Encrypt => {
                    let mut c = cbc::Encryptor::<$aes>::new_from_slices(key, iv).expect("key size");
                    for b in data.chunks_exact_mut(16) {
                        c.encrypt_block_mut(GenericArray::from_mut_slice(b));
                    }
                }
                Direction::Decrypt => {
                    let mut c = cbc::Decryptor::<$aes>::new_from_slices(key, iv).expect("key size");
                    for b in data.chunks_exact_mut(16) {
                        c.decrypt_block_mut(GenericArray::from_mut_slice(b));
                    }
                }
            }
        }};
    }
    match key.len() {
        16 => run!(aes::Aes128),
        24 => run!(aes::Aes192),
        _ => run!(aes::Aes256),
    }
}

/// RustCrypto's HMAC (full tag).
fn reference_hmac(sha256: bool, key: &[u8], msg: &[u8]) -> Vec<u8> {
    if sha256 {
        let mut m = Hmac::<sha2::Sha256>::new_from_slice(key).expect("any key length");
        m.update(msg);
        m.finalize().into_bytes().to_vec()
    } else {
        let mut m = Hmac::<sha1::Sha1>::new_from_slice(key).expect("any key length");
        m.update(msg);
        m.finalize().into_bytes().to_vec()
    }
}

/// A lane's buffers for one run: the input (and, out of place, the output).
struct LaneBufs {
    input: Guarded,
    output: Option<Guarded>,
}

impl LaneBufs {
    fn new(spec: &LaneSpec, data: &[u8]) -> Self {
        let off = usize::from(spec.offset);
        LaneBufs {
            input: Guarded::new(data, off),
            output: spec
                .out_of_place
                .then(|| Guarded::new(&vec![0x5C; data.len()], (off * 5 + 3) % 16)),
        }
    }

    fn inout(&mut self) -> InOutBuf<'_, '_, u8> {
        match &mut self.output {
            Some(o) => InOutBuf::new(self.input.body(), o.body_mut()).expect("same length"),
            None => self.input.body_mut().into(),
        }
    }

    /// Checks guards and an unchanged out-of-place input; returns the output.
    fn finish(&self, data: &[u8], what: &dyn Fn() -> String) -> &[u8] {
        self.input.check_guards(what);
        match &self.output {
            Some(o) => {
                o.check_guards(what);
                assert!(
                    self.input.body() == data,
                    "{w}: out-of-place input modified",
                    w = what()
                );
                o.body()
            }
            None => self.input.body(),
        }
    }
}

/// Panics, naming `what()` and the first byte where they differ, unless
/// `got` (an engine's output) equals `want` (RustCrypto's).
fn assert_same_as_rustcrypto(got: &[u8], want: &[u8], what: impl Fn() -> String) {
    if got != want {
        let i = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
        panic!(
            "{}: first differing byte {i}: {:#04x} != {:#04x} (RustCrypto)",
            what(),
            got[i],
            want[i]
        );
    }
}

fn run_aes(p: &EnginesProgram, out: &mut Outcome) {
    let key = AesCbcKey::new(&p.key).expect("16, 24 or 32 bytes");
    let mut at = 0;
    let datas: Vec<Vec<u8>> = p
        .lanes
        .iter()
        .map(|l| take(&p.data, &mut at, usize::from(l.blocks) * 16))
        .collect();
    let expected: Vec<(Vec<u8>, Vec<u8>)> = p
        .lanes
        .iter()
        .zip(&datas)
        .map(|(l, d)| {
            let mut e = d.clone();
            reference_cbc(Direction::Encrypt, &p.key, &l.iv, &mut e);
            let mut dd = d.clone();
            reference_cbc(Direction::Decrypt, &p.key, &l.iv, &mut dd);
            (e, dd)
        })
        .collect();

    for engine in AesEngine::available() {
        let mut bufs: Vec<LaneBufs> = p
            .lanes
            .iter()
            .zip(&datas)
            .map(|(l, d)| LaneBufs::new(l, d))
            .collect();
        let mut lanes: Vec<Lane<'_>> = p
            .lanes
            .iter()
            .zip(bufs.iter_mut())
            .map(|(l, b)| Lane {
                iv: l.iv,
                buf: b.inout(),
            })
            .collect();
        cbc_encrypt_multi_with(engine, &key, &mut lanes).unwrap_or_else(|e| panic!("{engine}: {e}"));
        let ivs: Vec<[u8; 16]> = lanes.iter().map(|l| l.iv).collect();
        drop(lanes);
        for (k, (((l, b), d), (e, _))) in p.lanes.iter().zip(&bufs).zip(&datas).zip(&expected).enumerate() {
            let what = || {
                format!(
                    "encrypt {engine} lane {k}/{} ({} blocks)",
                    p.lanes.len(),
                    l.blocks
                )
            };
            let got = b.finish(d, &what);
            assert_same_as_rustcrypto(got, e, what);
            let chain = e.last_chunk::<16>().copied().unwrap_or(l.iv);
            assert_eq!(ivs[k], chain, "{w}: returned chaining value", w = what());
            out.lanes_encrypted += 1;
            out.bytes += e.len() as u64;
        }
    }

    // Decryption: one stream per lane, in pieces of `cut` blocks.
    let vaes = algorithms::aes_engine() == AesEngine::Vaes512;
    for (k, ((l, d), (_, dd))) in p.lanes.iter().zip(&datas).zip(&expected).enumerate() {
        let what = || format!("decrypt lane {k} ({} blocks, cut {})", l.blocks, l.cut);
        let mut b = LaneBufs::new(l, d);
        let mut s = key.start(Direction::Decrypt, &l.iv);
        let step = if l.cut == 0 {
            d.len().max(16)
        } else {
            usize::from(l.cut) * 16
        };
        let mut buf = b.inout();
        let mut pos = 0;
        while pos < d.len() {
            let n = step.min(d.len() - pos);
            let (piece, rest) = buf.split_at(n);
            s.process_inout(piece).expect("whole blocks");
            buf = rest;
            pos += n;
        }
        drop(s);
        let got = b.finish(d, &what);
        assert_same_as_rustcrypto(got, dd, || format!("{} (vaes512: {vaes})", what()));
        out.lanes_decrypted += 1;
        out.vaes_decrypts += u64::from(vaes);
    }
}

fn run_mac(p: &EnginesProgram, out: &mut Outcome) {
    let mut at = 0;
    let msgs: Vec<Vec<u8>> = p
        .macs
        .iter()
        .map(|m| take(&p.data, &mut at, usize::from(m.len)))
        .collect();
    let keys: Vec<MacKey> = p
        .macs
        .iter()
        .map(|m| {
            let a = alg(m.sha256);
            assert!(MacKey::new(a, &m.key, 0).is_err());
            assert!(MacKey::new(a, &m.key, a.output_len() + 1).is_err());
            MacKey::new(a, &m.key, usize::from(m.digest_len)).expect("digest length in range")
        })
        .collect();
    let expected: Vec<Vec<u8>> = p
        .macs
        .iter()
        .zip(&msgs)
        .map(|(m, d)| reference_hmac(m.sha256, &m.key, d))
        .collect();

    for engine in ShaEngine::available() {
        let mut jobs: Vec<MacJob<'_>> = keys.iter().zip(&msgs).map(|(k, d)| MacJob::new(k, d)).collect();
        mac_multi_with(engine, &mut jobs);
        for (k, (j, e)) in jobs.iter().zip(&expected).enumerate() {
            let m = &p.macs[k];
            let what = || {
                format!(
                    "mac {} job {k}/{} ({:?}, key {} bytes, message {} bytes)",
                    engine.name(),
                    jobs.len(),
                    alg(m.sha256),
                    m.key.len(),
                    m.len
                )
            };
            assert_eq!(&j.tag[..e.len()], &e[..], "{w}: tag", w = what());
            assert!(
                j.tag[e.len()..].iter().all(|&b| b == 0),
                "{w}: tag tail not zero",
                w = what()
            );
            let dl = usize::from(m.digest_len);
            assert!(
                keys[k].verify_tag(&j.tag, &e[..dl]),
                "{w}: verify_tag",
                w = what()
            );
            out.tags += 1;
        }
    }

    for (k, ((m, d), e)) in p.macs.iter().zip(&msgs).zip(&expected).enumerate() {
        let what = || {
            format!(
                "MacStream job {k} ({:?}, message {} bytes, cut {})",
                alg(m.sha256),
                m.len,
                m.cut
            )
        };
        let dl = usize::from(m.digest_len);
        let feed = |s: &mut algorithms::MacStream| {
            if m.cut == 0 {
                s.update(d);
                return;
            }
            let mut pos = 0;
            let mut i = 0;
            while pos < d.len() {
                let n = piece_len(m.cut, i).min(d.len() - pos);
                s.update(&d[pos..pos + n]);
                pos += n;
                i += 1;
            }
        };
        let mut s = keys[k].start();
        feed(&mut s);
        let mut tag = [0xEEu8; MAX_MAC_LEN + 1];
        assert_eq!(s.finish_into(&mut tag), dl, "{w}: finish_into length", w = what());
        assert_eq!(&tag[..dl], &e[..dl], "{w}: truncated tag", w = what());
        assert!(
            tag[dl..].iter().all(|&b| b == 0xEE),
            "{w}: wrote past digest_len",
            w = what()
        );
        let mut s = keys[k].start();
        feed(&mut s);
        assert!(s.verify_truncated(&e[..dl]), "{w}: verify_truncated", w = what());
        if d.len() <= SHORT_MSG {
            // Cheap only on short messages: each hashes the message again.
            let mut bad = e[..dl].to_vec();
            bad[dl - 1] ^= 1;
            let mut s = keys[k].start();
            feed(&mut s);
            assert!(
                !s.verify_truncated(&bad),
                "{w}: verify_truncated accepts a wrong tag",
                w = what()
            );
            let mut short = [0u8; MAX_MAC_LEN];
            assert_eq!(
                keys[k].sign_into(d, &mut short[..dl - 1]),
                0,
                "{w}: sign_into short",
                w = what()
            );
            assert_eq!(keys[k].sign_into(d, &mut short), dl, "{w}: sign_into", w = what());
            assert_eq!(&short[..dl], &e[..dl], "{w}: sign_into tag", w = what());
        }
        out.tags += 1;
    }
}

/// Decodes `data` and runs every check; panics on a difference.
pub fn run(data: &[u8]) -> Outcome {
    let p = EnginesProgram::decode(data);
    let mut out = Outcome::default();
    run_aes(&p, &mut out);
    run_mac(&p, &mut out);
    out
}
