// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Trace format: JSON Lines, one operation per line (see `tools/replay/README.md`).
//!
//! ```text
//! {"op":"create_session","name":"s1","algo":"aes-cbc","key":"<hex>","direction":"encrypt"}
//! {"op":"request","session":"s1","opcode":"encrypt","iv":"<hex>","src":"<hex>","expect":{"status":"ok","dst":"<hex>"}}
//! {"op":"close_session","name":"s1"}
//! ```
//!
//! Extensions: `"queue": N` on a request; `"session_id": N` on a request
//! instead of `"session"` (a raw id, e.g. one never created);
//! `"expect":{"status":"err"}` on `create_session` (a negative id is
//! expected); and `generate` lines, which stand for `count` requests with
//! pseudo-random IV and data from `seed`, whose expected outputs the tool
//! computes with the tool's reference cipher ([`crate::reference`]):
//!
//! ```text
//! {"op":"generate","session":"s1","opcode":"encrypt","size":256,"count":10000,"seed":1}
//! ```
//!
//! Algorithm chaining (AES-CBC + HMAC): `create_session` takes `"mac"`,
//! `"auth_key"`, `"digest_len"` and optionally `"chain_order"`; a request
//! on such a session takes `"cipher_offset"`, `"cipher_len"`,
//! `"hash_offset"`, `"hash_len"`, `"digest"` (the digest the driver
//! supplies on decrypt) and `"expect":{"digest":…}` (the digest expected
//! on encrypt), and optionally `"in_place": true`. Generated chained
//! requests get their expected digests from the RustCrypto `hmac` crate,
//! not from `ring`, which the daemon uses.

use std::collections::HashMap;
use std::io::BufRead;

use algorithms::Direction;

use crate::reference::aes_cbc;
use hmac::{Hmac, Mac as _};
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use vhost_user_crypto::wire::virtio_crypto::{
    Status, VIRTIO_CRYPTO_MAC_HMAC_SHA1, VIRTIO_CRYPTO_MAC_HMAC_SHA_256,
    VIRTIO_CRYPTO_SYM_ALG_CHAIN_ORDER_CIPHER_THEN_HASH, VIRTIO_CRYPTO_SYM_ALG_CHAIN_ORDER_HASH_THEN_CIPHER,
};

use crate::frontend::DIGEST_AREA;
use crate::raw::RawReq;
use crate::rng::{self, Rng as _, SplitMix64};

/// Expected request status (`VIRTIO_CRYPTO_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Hash, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum ExpectStatus {
    /// `VIRTIO_CRYPTO_OK` (0).
    Ok,
    /// `VIRTIO_CRYPTO_ERR` (1).
    Err,
    /// `VIRTIO_CRYPTO_BADMSG` (2).
    Badmsg,
    /// `VIRTIO_CRYPTO_NOTSUPP` (3).
    Notsupp,
    /// `VIRTIO_CRYPTO_INVSESS` (4).
    Invsess,
}

impl ExpectStatus {
    /// The status byte.
    pub fn byte(self) -> u8 {
        (match self {
            ExpectStatus::Ok => Status::Ok,
            ExpectStatus::Err => Status::Err,
            ExpectStatus::Badmsg => Status::BadMsg,
            ExpectStatus::Notsupp => Status::NotSupp,
            ExpectStatus::Invsess => Status::InvSess,
        }) as u8
    }

    /// Name of a status byte (`status N` for a value the spec does not
    /// define).
    pub fn name(b: u8) -> String {
        const NAMES: [(Status, &str); 6] = [
            (Status::Ok, "ok"),
            (Status::Err, "err"),
            (Status::BadMsg, "badmsg"),
            (Status::NotSupp, "notsupp"),
            (Status::InvSess, "invsess"),
            (Status::NoSpc, "nospc"),
        ];
        NAMES
            .iter()
            .find(|(s, _)| *s as u8 == b)
            .map_or_else(|| format!("status {b}"), |(_, name)| (*name).to_string())
    }
}

/// `direction` / `opcode` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dir {
    /// Encrypt.
    Encrypt,
    /// Decrypt.
    Decrypt,
}

impl From<Dir> for Direction {
    fn from(d: Dir) -> Self {
        match d {
            Dir::Encrypt => Direction::Encrypt,
            Dir::Decrypt => Direction::Decrypt,
        }
    }
}

/// `expect` object.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    /// Expected status.
    pub status: Option<ExpectStatus>,
    /// Expected output bytes, hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dst: Option<String>,
    /// Expected hash result of a chained encrypt request, hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

/// `mac` values of a chaining session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MacName {
    /// HMAC-SHA1 (`VIRTIO_CRYPTO_MAC_HMAC_SHA1`).
    #[serde(rename = "hmac-sha1")]
    HmacSha1,
    /// HMAC-SHA-256 (`VIRTIO_CRYPTO_MAC_HMAC_SHA_256`).
    #[serde(rename = "hmac-sha256")]
    HmacSha256,
}

impl MacName {
    /// The `VIRTIO_CRYPTO_MAC_*` value.
    pub fn virtio(self) -> u32 {
        match self {
            MacName::HmacSha1 => VIRTIO_CRYPTO_MAC_HMAC_SHA1,
            MacName::HmacSha256 => VIRTIO_CRYPTO_MAC_HMAC_SHA_256,
        }
    }

    /// Full tag length in bytes.
    pub fn output_len(self) -> usize {
        match self {
            MacName::HmacSha1 => 20,
            MacName::HmacSha256 => 32,
        }
    }

    /// HMAC of `data` under `key` by the RustCrypto `hmac`/`sha1`/`sha2`
    /// crates (independent of the daemon's `ring`), full length.
    pub fn hmac(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        match self {
            MacName::HmacSha1 => {
                let mut m = <Hmac<sha1::Sha1>>::new_from_slice(key).expect("HMAC takes any key length");
                m.update(data);
                m.finalize().into_bytes().to_vec()
            }
            MacName::HmacSha256 => {
                let mut m = <Hmac<sha2::Sha256>>::new_from_slice(key).expect("HMAC takes any key length");
                m.update(data);
                m.finalize().into_bytes().to_vec()
            }
        }
    }
}

/// `chain_order` values (`VIRTIO_CRYPTO_SYM_ALG_CHAIN_ORDER_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AlgChainOrder {
    /// HASH_THEN_CIPHER (1).
    HashThenCipher,
    /// CIPHER_THEN_HASH (2).
    CipherThenHash,
}

impl AlgChainOrder {
    /// The wire value.
    pub fn virtio(self) -> u8 {
        match self {
            AlgChainOrder::HashThenCipher => VIRTIO_CRYPTO_SYM_ALG_CHAIN_ORDER_HASH_THEN_CIPHER,
            AlgChainOrder::CipherThenHash => VIRTIO_CRYPTO_SYM_ALG_CHAIN_ORDER_CIPHER_THEN_HASH,
        }
    }
}

/// The chaining part of a session.
#[derive(Debug, Clone)]
pub struct AlgChainSession {
    /// MAC algorithm.
    pub mac: MacName,
    /// Auth key bytes.
    pub auth_key: Zeroizing<Vec<u8>>,
    /// Digest (hash result) length in bytes.
    pub digest_len: u32,
    /// Chaining order.
    pub order: AlgChainOrder,
}

/// The chaining part of a request (offsets relative to src, bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlgChainReq {
    /// `cipher_start_src_offset`.
    pub cipher_offset: u32,
    /// `len_to_cipher`.
    pub cipher_len: u32,
    /// `hash_start_src_offset`.
    pub hash_offset: u32,
    /// `len_to_hash`.
    pub hash_len: u32,
    /// `hash_result_len`, and the size of the hash-result buffer.
    pub digest_len: u32,
    /// What the hash-result buffer holds before submission (the driver's
    /// digest on decrypt).
    pub digest_in: Vec<u8>,
    /// Expected hash result after an OK completion (encrypt).
    pub expect_digest: Option<Vec<u8>>,
}

/// One trace line.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Line {
    /// CREATE_CRYPTO_SESSION.
    CreateSession {
        /// Name used by later lines.
        name: String,
        /// Only `aes-cbc`.
        algo: String,
        /// Key, hex.
        key: String,
        /// Session direction.
        direction: Dir,
        /// `{"status":"err"}` when a negative id is expected.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expect: Option<Expect>,
        /// MAC of a chaining session.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mac: Option<MacName>,
        /// Auth key of a chaining session, hex.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        auth_key: Option<String>,
        /// Digest length of a chaining session (default: the full hash).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        digest_len: Option<u32>,
        /// Chaining order (default: cipher_then_hash for encrypt,
        /// hash_then_cipher for decrypt).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        chain_order: Option<AlgChainOrder>,
    },
    /// A data request.
    Request {
        /// Session name.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session: Option<String>,
        /// Raw session id instead of a name.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session_id: Option<u64>,
        /// Request opcode.
        opcode: Dir,
        /// IV, hex (16 bytes for AES-CBC; other lengths are sent as they are).
        iv: String,
        /// Source data, hex.
        src: String,
        /// Data queue (default: spread round robin).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        queue: Option<u16>,
        /// Chaining: first src byte the cipher covers (default 0).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cipher_offset: Option<u32>,
        /// Chaining: bytes the cipher covers (default: the rest of src).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cipher_len: Option<u32>,
        /// Chaining: first src byte the MAC covers (default 0).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        hash_offset: Option<u32>,
        /// Chaining: bytes the MAC covers (default: the rest of src).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        hash_len: Option<u32>,
        /// Chaining: the digest the driver supplies (decrypt), hex.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        digest: Option<String>,
        /// Chaining: `hash_result_len` (default: the session's digest length).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        digest_len: Option<u32>,
        /// The dst descriptor points at src (DPDK's guest driver does this).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        in_place: Option<bool>,
        /// Expected result.
        expect: Expect,
    },
    /// CLOSE_CRYPTO_SESSION.
    CloseSession {
        /// Session name.
        name: String,
    },
    /// A raw descriptor-level request (see [`crate::raw`]).
    Raw(Box<RawReq>),
    /// `count` generated requests.
    Generate {
        /// Session name.
        session: String,
        /// Request opcode.
        opcode: Dir,
        /// Bytes per request (multiple of 16).
        size: usize,
        /// Number of requests.
        count: u64,
        /// PRNG seed.
        #[serde(default)]
        seed: u64,
        /// Chained sessions: first src byte the cipher covers (default:
        /// `size % 16`, so the rest is whole blocks).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cipher_offset: Option<u32>,
        /// Chained sessions: dst at the src address.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        in_place: Option<bool>,
    },
}

/// A request ready to run.
#[derive(Debug, Clone)]
pub struct Req {
    /// 1-based trace line.
    pub line: usize,
    /// Session name, or None for a raw id.
    pub session: Option<String>,
    /// Raw id.
    pub session_id: Option<u64>,
    /// Opcode.
    pub opcode: Dir,
    /// IV bytes (may be any length; the header's iv_len is this length).
    pub iv: Vec<u8>,
    /// Source bytes.
    pub src: Vec<u8>,
    /// Queue, if fixed.
    pub queue: Option<u16>,
    /// Expected status.
    pub status: ExpectStatus,
    /// Expected output.
    pub dst: Option<Vec<u8>>,
    /// Algorithm chaining fields (op_type ALGORITHM_CHAINING).
    pub alg_chain: Option<AlgChainReq>,
    /// dst descriptor at the src address.
    pub in_place: bool,
}

/// A step of a trace.
#[derive(Debug, Clone)]
pub enum Step {
    /// Create a session.
    Create {
        /// Trace line.
        line: usize,
        /// Name.
        name: String,
        /// Key bytes.
        key: Zeroizing<Vec<u8>>,
        /// Direction.
        direction: Dir,
        /// Whether a negative id is expected.
        expect_err: bool,
        /// Chaining session parameters.
        alg_chain: Option<AlgChainSession>,
    },
    /// Run requests (pipelined).
    Requests(Vec<Req>),
    /// One raw request, run on its own.
    Raw(Box<RawReq>),
    /// Close a session.
    Close {
        /// Trace line.
        line: usize,
        /// Name.
        name: String,
    },
}

/// A parsed trace.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    /// Steps in order.
    pub steps: Vec<Step>,
}

/// Trace errors.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// Reading failed.
    #[error("cannot read trace {0}: {1}")]
    Io(String, std::io::Error),
    /// A line does not parse.
    #[error("trace line {0}: {1}")]
    Line(usize, String),
    /// The file holds nothing to do (only blank and comment lines).
    #[error("trace {0} is empty: no sessions and no requests")]
    Empty(String),
}

/// Decodes hex.
pub fn unhex(s: &str) -> Result<Vec<u8>, String> {
    if !s.len().is_multiple_of(2) {
        return Err("odd number of hex digits".into());
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2).ok_or("bad hex")?, 16).map_err(|e| e.to_string()))
        .collect()
}

/// Encodes hex.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// One generated chained request: random IV and message; the cipher
/// covers `[cipher_offset, size)`, the MAC all of src (encrypt: of the
/// output). Expected values come from the tool's reference cipher
/// ([`crate::reference`], pinned by the NIST vectors) and RustCrypto's
/// `hmac`.
#[allow(clippy::too_many_arguments)]
fn generate_chained(
    line: usize,
    session: &str,
    key: &[u8],
    session_dir: Dir,
    c: &AlgChainSession,
    opcode: Dir,
    size: usize,
    cipher_offset: usize,
    in_place: bool,
    rng: &mut SplitMix64,
) -> Req {
    let mut iv = [0u8; 16];
    let mut msg = vec![0u8; size];
    rng.fill_bytes(&mut iv);
    rng.fill_bytes(&mut msg);
    let dl = c.digest_len as usize;
    let cipher = |dir: Direction, data: &mut [u8]| aes_cbc(dir, key, &iv, &mut data[cipher_offset..]).is_ok();
    let ok = session_dir == opcode && dl <= c.mac.output_len();
    let (src, dst, digest_in, expect_digest) = match opcode {
        // dst = E(src); the MAC of dst is expected back.
        Dir::Encrypt => {
            let mut dst = msg.clone();
            let ok = ok && cipher(Direction::Encrypt, &mut dst);
            let tag = c.mac.hmac(&c.auth_key, &dst);
            (
                msg,
                ok.then_some(dst),
                Vec::new(),
                ok.then(|| tag[..dl.min(tag.len())].to_vec()),
            )
        }
        // src = E(msg) with the MAC of src supplied; msg is expected back.
        Dir::Decrypt => {
            let mut ct = msg.clone();
            cipher(Direction::Encrypt, &mut ct);
            let tag = c.mac.hmac(&c.auth_key, &ct);
            (ct, ok.then_some(msg), tag[..dl.min(tag.len())].to_vec(), None)
        }
    };
    Req {
        line,
        session: Some(session.to_string()),
        session_id: None,
        opcode,
        iv: iv.to_vec(),
        alg_chain: Some(AlgChainReq {
            cipher_offset: cipher_offset as u32,
            cipher_len: (size - cipher_offset) as u32,
            hash_offset: 0,
            hash_len: size as u32,
            digest_len: c.digest_len,
            digest_in,
            expect_digest,
        }),
        src,
        queue: None,
        status: if dst.is_some() {
            ExpectStatus::Ok
        } else {
            ExpectStatus::Err
        },
        dst,
        in_place,
    }
}

/// What the parser remembers of a created session: key, direction, chaining.
type SessionKeys = (Zeroizing<Vec<u8>>, Dir, Option<AlgChainSession>);

impl Trace {
    /// Parses a trace from a reader.
    ///
    /// # Errors
    /// [`TraceError::Line`] with the 1-based line number for a bad line.
    pub fn parse(r: impl BufRead) -> Result<Trace, TraceError> {
        let mut t = Trace::default();
        let mut keys: HashMap<String, SessionKeys> = HashMap::new();
        for (i, line) in r.lines().enumerate() {
            let n = i + 1;
            let line = line.map_err(|e| TraceError::Line(n, e.to_string()))?;
            let trimmed = line.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let parsed: Line =
                serde_json::from_str(trimmed).map_err(|e| TraceError::Line(n, e.to_string()))?;
            let bad = |m: String| TraceError::Line(n, m);
            match parsed {
                Line::CreateSession {
                    name,
                    algo,
                    key,
                    direction,
                    expect,
                    mac,
                    auth_key,
                    digest_len,
                    chain_order,
                } => {
                    if algo != "aes-cbc" {
                        return Err(bad(format!("unknown algo {algo:?} (only aes-cbc)")));
                    }
                    let key = Zeroizing::new(unhex(&key).map_err(bad)?);
                    let alg_chain = match mac {
                        Some(mac) => Some(AlgChainSession {
                            mac,
                            auth_key: Zeroizing::new(unhex(auth_key.as_deref().unwrap_or("")).map_err(bad)?),
                            digest_len: digest_len.unwrap_or(mac.output_len() as u32),
                            order: chain_order.unwrap_or(match direction {
                                Dir::Encrypt => AlgChainOrder::CipherThenHash,
                                Dir::Decrypt => AlgChainOrder::HashThenCipher,
                            }),
                        }),
                        None if auth_key.is_some() || digest_len.is_some() || chain_order.is_some() => {
                            return Err(bad("auth_key, digest_len and chain_order need a mac".into()));
                        }
                        None => None,
                    };
                    let expect_err = matches!(
                        expect,
                        Some(Expect {
                            status: Some(ExpectStatus::Err),
                            ..
                        })
                    );
                    keys.insert(name.clone(), (key.clone(), direction, alg_chain.clone()));
                    t.steps.push(Step::Create {
                        line: n,
                        name,
                        key,
                        direction,
                        expect_err,
                        alg_chain,
                    });
                }
                Line::CloseSession { name } => t.steps.push(Step::Close { line: n, name }),
                Line::Raw(mut r) => {
                    r.validate().map_err(bad)?;
                    r.line = n;
                    t.steps.push(Step::Raw(r));
                }
                Line::Request {
                    session,
                    session_id,
                    opcode,
                    iv,
                    src,
                    queue,
                    cipher_offset,
                    cipher_len,
                    hash_offset,
                    hash_len,
                    digest,
                    digest_len,
                    in_place,
                    expect,
                } => {
                    if session.is_none() == session_id.is_none() {
                        return Err(bad("a request needs exactly one of session and session_id".into()));
                    }
                    let session_alg_chain = session
                        .as_ref()
                        .and_then(|s| keys.get(s))
                        .and_then(|k| k.2.as_ref());
                    let alg_chain_fields = [cipher_offset, cipher_len, hash_offset, hash_len, digest_len]
                        .iter()
                        .any(Option::is_some)
                        || digest.is_some()
                        || expect.digest.is_some();
                    let src = unhex(&src).map_err(bad)?;
                    let alg_chain = if session_alg_chain.is_some() || alg_chain_fields {
                        let len = src.len() as u32;
                        let co = cipher_offset.unwrap_or(0);
                        let ho = hash_offset.unwrap_or(0);
                        let digest_in = digest
                            .as_deref()
                            .map(unhex)
                            .transpose()
                            .map_err(bad)?
                            .unwrap_or_default();
                        let dl = digest_len
                            .or(session_alg_chain.map(|c| c.digest_len))
                            .unwrap_or(digest_in.len() as u32);
                        if dl as usize > DIGEST_AREA || digest_in.len() > dl as usize {
                            return Err(bad(format!(
                                "digest of {} bytes in a hash result of {dl} (at most {DIGEST_AREA})",
                                digest_in.len()
                            )));
                        }
                        Some(AlgChainReq {
                            cipher_offset: co,
                            cipher_len: cipher_len.unwrap_or(len.saturating_sub(co)),
                            hash_offset: ho,
                            hash_len: hash_len.unwrap_or(len.saturating_sub(ho)),
                            digest_len: dl,
                            digest_in,
                            expect_digest: expect.digest.as_deref().map(unhex).transpose().map_err(bad)?,
                        })
                    } else {
                        None
                    };
                    let req = Req {
                        line: n,
                        session,
                        session_id,
                        opcode,
                        iv: unhex(&iv).map_err(bad)?,
                        src,
                        queue,
                        status: expect.status.unwrap_or(ExpectStatus::Ok),
                        dst: expect.dst.as_deref().map(unhex).transpose().map_err(bad)?,
                        alg_chain,
                        in_place: in_place.unwrap_or(false),
                    };
                    t.push_request(req);
                }
                Line::Generate {
                    session,
                    opcode,
                    size,
                    count,
                    seed,
                    cipher_offset,
                    in_place,
                } => {
                    let (key, dir, alg_chain) = keys
                        .get(&session)
                        .ok_or_else(|| bad(format!("generate for unknown session {session:?}")))?;
                    if size > crate::gen::MAX_GENERATED_SIZE {
                        return Err(bad(format!(
                            "generate size {size} is above the daemon's default limit of 1 MiB"
                        )));
                    }
                    if let Some(c) = alg_chain {
                        let co = cipher_offset.map_or(size % 16, |o| o as usize);
                        if size == 0 || co > size || (size - co) % 16 != 0 {
                            return Err(bad(format!(
                                "generate size {size} with cipher_offset {co}: the cipher range is not whole blocks"
                            )));
                        }
                        let mut rng = rng::seeded(seed);
                        for _ in 0..count {
                            t.push_request(generate_chained(
                                n,
                                &session,
                                key,
                                *dir,
                                c,
                                opcode,
                                size,
                                co,
                                in_place.unwrap_or(false),
                                &mut rng,
                            ));
                        }
                        continue;
                    }
                    if size == 0 || size % 16 != 0 {
                        return Err(bad(format!(
                            "generate size {size} is not a positive multiple of 16"
                        )));
                    }
                    let mut rng = rng::seeded(seed);
                    for _ in 0..count {
                        let mut iv = vec![0u8; 16];
                        let mut src = vec![0u8; size];
                        rng.fill_bytes(&mut iv);
                        rng.fill_bytes(&mut src);
                        let mut dst = src.clone();
                        let ivb: [u8; 16] = iv.clone().try_into().unwrap_or([0; 16]);
                        let ok = *dir == opcode && aes_cbc(opcode.into(), key, &ivb, &mut dst).is_ok();
                        t.push_request(Req {
                            line: n,
                            session: Some(session.clone()),
                            session_id: None,
                            opcode,
                            iv,
                            src,
                            queue: None,
                            status: if ok { ExpectStatus::Ok } else { ExpectStatus::Err },
                            dst: ok.then_some(dst),
                            alg_chain: None,
                            in_place: in_place.unwrap_or(false),
                        });
                    }
                }
            }
        }
        Ok(t)
    }

    fn push_request(&mut self, r: Req) {
        if let Some(Step::Requests(v)) = self.steps.last_mut() {
            v.push(r);
        } else {
            self.steps.push(Step::Requests(vec![r]));
        }
    }

    /// Reads and parses a trace file.
    ///
    /// # Errors
    /// [`TraceError`]; [`TraceError::Empty`] for a file with no steps.
    pub fn load(path: &std::path::Path) -> Result<Trace, TraceError> {
        let io = |e| TraceError::Io(path.display().to_string(), e);
        let f = std::fs::File::open(path).map_err(io)?;
        if f.metadata().map_err(io)?.is_dir() {
            return Err(io(std::io::ErrorKind::IsADirectory.into()));
        }
        let t = Self::parse(std::io::BufReader::new(f))?;
        if t.steps.is_empty() {
            return Err(TraceError::Empty(path.display().to_string()));
        }
        Ok(t)
    }

    /// Number of requests.
    pub fn requests(&self) -> usize {
        self.steps
            .iter()
            .map(|s| if let Step::Requests(v) = s { v.len() } else { 0 })
            .sum()
    }

    /// Largest src.
    pub fn max_payload(&self) -> usize {
        self.steps
            .iter()
            .flat_map(|s| match s {
                Step::Requests(v) => v.iter().map(|r| r.src.len()).max(),
                // Room for the raw request's scratch area (see raw.rs).
                Step::Raw(r) => Some(r.scratch_bytes() as usize / 2 + 1),
                _ => None,
            })
            .max()
            .unwrap_or(16)
    }

    /// Largest IV.
    pub fn max_iv(&self) -> usize {
        self.steps
            .iter()
            .flat_map(|s| {
                if let Step::Requests(v) = s {
                    v.iter().map(|r| r.iv.len()).max()
                } else {
                    None
                }
            })
            .max()
            .unwrap_or(16)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_is_not_a_trace() {
        let dir = tempfile::tempdir().unwrap();
        let e = Trace::load(dir.path()).err().unwrap().to_string();
        assert_eq!(
            e,
            format!("cannot read trace {}: is a directory", dir.path().display())
        );
    }

    #[test]
    fn a_trace_with_nothing_to_do_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        std::fs::write(&path, "# only a comment\n\n").unwrap();
        let e = Trace::load(&path).err().unwrap().to_string();
        assert_eq!(
            e,
            format!("trace {} is empty: no sessions and no requests", path.display())
        );
        // One session and no requests is a trace (it checks CREATE).
        std::fs::write(
            &path,
            "{\"op\":\"create_session\",\"name\":\"s\",\"algo\":\"aes-cbc\",\"key\":\"00000000000000000000000000000000\",\"direction\":\"encrypt\"}\n",
        )
        .unwrap();
        assert_eq!(Trace::load(&path).unwrap().steps.len(), 1);
    }

    #[test]
    fn parses_the_three_documented_kinds() {
        let t = Trace::parse(
            r#"{"op":"create_session","name":"s1","algo":"aes-cbc","key":"2b7e151628aed2a6abf7158809cf4f3c","direction":"encrypt"}
{"op":"request","session":"s1","opcode":"encrypt","iv":"000102030405060708090a0b0c0d0e0f","src":"6bc1bee22e409f96e93d7e117393172a","expect":{"status":"ok","dst":"7649abac8119b246cee98e9b12e9197d"}}
{"op":"close_session","name":"s1"}
"#
            .as_bytes(),
        )
        .unwrap();
        assert_eq!(t.steps.len(), 3);
        assert_eq!(t.requests(), 1);
        let Step::Requests(r) = &t.steps[1] else { panic!() };
        assert_eq!(
            r[0].dst.as_deref(),
            Some(&unhex("7649abac8119b246cee98e9b12e9197d").unwrap()[..])
        );
    }

    #[test]
    fn bad_lines_name_their_number() {
        let e = Trace::parse("\n{\"op\":\"nope\"}\n".as_bytes()).unwrap_err();
        assert!(e.to_string().starts_with("trace line 2:"), "{e}");
        let e = Trace::parse(
            r#"{"op":"request","session":"s","opcode":"encrypt","iv":"0","src":"","expect":{}}"#.as_bytes(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("odd number"), "{e}");
    }

    #[test]
    fn generate_expands_with_reference_outputs() {
        // Generated count and data, and the expected output of the first
        // request as OpenSSL computes it (`openssl enc -aes-128-cbc -nopad
        // -K 000102030405060708090a0b0c0d0e0f -iv <iv>` over its src).
        let t = Trace::parse(
            r#"{"op":"create_session","name":"s","algo":"aes-cbc","key":"000102030405060708090a0b0c0d0e0f","direction":"encrypt"}
{"op":"generate","session":"s","opcode":"encrypt","size":64,"count":3,"seed":7}"#
                .as_bytes(),
        )
        .unwrap();
        let Step::Requests(r) = &t.steps[1] else { panic!() };
        assert_eq!(r.len(), 3);
        assert_ne!(r[0].src, r[1].src);
        assert_eq!(hex(&r[0].iv), "0185f893369c77ec9de36d93b4eed9fe");
        assert_eq!(
            hex(&r[0].src),
            concat!(
                "0ad32b094bb09f6f5fbebb6002fb0f2666c3fa6688fe2c083f7e998ee3675f7a",
                "afa28f381770c0d720e22234276a6d4f7be5ec6e8a45a756a9fd0cbc618cda71"
            )
        );
        assert_eq!(
            hex(r[0].dst.as_ref().unwrap()),
            concat!(
                "7667fb6547755ac966c742d4aee4dc48279ec1ebe901e68592acd3c03ab07c66",
                "f458acf3396fde55a89a8382872db032035659aa18f2685c86cb91b476094d98"
            )
        );
    }
}
