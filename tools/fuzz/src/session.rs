// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Fuzz target `session`: session messages against the decoder, the
//! frontend proxy's CREATE handler and a `SessionRegistry`.
//!
//! The input decodes into a [`SessionProgram`]: a session limit and a list
//! of CREATE payloads (laid out field by field in layout A, B or C, with
//! any bytes patched over them, or raw payloads of any size up to 4096,
//! answered with the layout detected or forced) and CLOSE payloads (8-byte
//! ids, or raw bytes of any length).
//!
//! Each message goes through `SessionAbi::detect`, `decode_create` /
//! `decode_close` and `proxy::handle_create` /
//! `SessionRegistry::close`, and is checked against a model written from
//! `docs/PROTOCOL.md` (§3.1–§3.3 offsets, §3.4 layout detection) and the
//! documented registry policy: the whole reply message byte for byte (id
//! or negative status at 1064 in a 1072-byte payload, else at 0; key
//! arrays zeroed), the
//! registry's live count, and the worker table after `sync` (direction and
//! key size of every live session, closed ones gone).

use std::collections::BTreeMap;

use algorithms::Direction;
use vhost_user_crypto::proxy::{handle_create, AbiChoice};
use vhost_user_crypto::sessions::session_set;
use vhost_user_crypto::wire::session::{decode_close, decode_create, encode_create, SessionAbi};
use vhost_user_crypto::wire::vhost_user::{FrontendReq, Header, REPLY, VERSION_1};

use super::reader::{Reader, Writer};

/// Most operations decoded from one input.
pub const MAX_OPS: usize = 48;
/// Largest payload (rust-vmm `vhost`'s limit).
pub use vhost_user_crypto::wire::vhost_user::MAX_PAYLOAD;

/// A CREATE payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    /// Laid out field by field in a layout, then patched.
    Layout {
        /// 0 A, 1 B, 2 C.
        layout: u8,
        /// op_code (u32 in A, u64 in C, absent in B).
        op_code: u64,
        /// cipher_alg.
        cipher_alg: u32,
        /// key_len.
        key_len: u32,
        /// op_type.
        op_type: u8,
        /// direction.
        direction: u8,
        /// Key bytes are `key_byte ^ i`.
        key_byte: u8,
        /// Where `patch` goes (modulo the size).
        patch_at: u16,
        /// Bytes written over the layout.
        patch: Vec<u8>,
    },
    /// `len` bytes of `fill` with `patch` at the start.
    Raw {
        /// Size (modulo 4097).
        len: u16,
        /// Filler.
        fill: u8,
        /// Leading bytes.
        patch: Vec<u8>,
    },
}

/// A session message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SOp {
    /// CREATE_CRYPTO_SESSION; `abi` 0 detects, 1..=3 force A, B, C.
    Create {
        /// Layout choice.
        abi: u8,
        /// The payload.
        payload: Payload,
    },
    /// CLOSE_CRYPTO_SESSION with an 8-byte id.
    Close(u64),
    /// CLOSE_CRYPTO_SESSION with any payload.
    CloseRaw(Vec<u8>),
}

/// A decoded `session` input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionProgram {
    /// The registry's session limit (1..=8).
    pub max_sessions: u8,
    /// The messages.
    pub ops: Vec<SOp>,
}

impl SessionProgram {
    /// Decodes any byte string.
    pub fn decode(data: &[u8]) -> SessionProgram {
        let mut r = Reader::new(data);
        let max_sessions = 1 + r.u8() % 8;
        let mut ops = Vec::new();
        while !r.is_empty() && ops.len() < MAX_OPS {
            ops.push(match r.u8() % 3 {
                0 => {
                    let abi = r.u8() % 4;
                    let payload = if r.u8() & 1 == 0 {
                        Payload::Layout {
                            layout: r.u8() % 3,
                            op_code: r.compact(),
                            cipher_alg: r.compact32(),
                            key_len: r.compact32(),
                            op_type: r.u8(),
                            direction: r.u8(),
                            key_byte: r.u8(),
                            patch_at: r.u16(),
                            patch: r.blob(),
                        }
                    } else {
                        Payload::Raw {
                            len: r.u16() % (MAX_PAYLOAD as u16 + 1),
                            fill: r.u8(),
                            patch: r.blob(),
                        }
                    };
                    SOp::Create { abi, payload }
                }
                1 => SOp::Close(r.compact()),
                _ => SOp::CloseRaw(r.blob()),
            });
        }
        SessionProgram { max_sessions, ops }
    }

    /// Encodes the program in the form [`SessionProgram::decode`] reads back.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.u8(self.max_sessions - 1);
        for op in &self.ops {
            match op {
                SOp::Create { abi, payload } => {
                    w.u8(0);
                    w.u8(*abi);
                    match payload {
                        Payload::Layout {
                            layout,
                            op_code,
                            cipher_alg,
                            key_len,
                            op_type,
                            direction,
                            key_byte,
                            patch_at,
                            patch,
                        } => {
                            w.u8(0);
                            w.u8(*layout);
                            w.compact(*op_code);
                            w.compact((*cipher_alg).into());
                            w.compact((*key_len).into());
                            w.u8(*op_type);
                            w.u8(*direction);
                            w.u8(*key_byte);
                            w.u16(*patch_at);
                            w.blob(patch);
                        }
                        Payload::Raw { len, fill, patch } => {
                            w.u8(1);
                            w.u16(*len);
                            w.u8(*fill);
                            w.blob(patch);
                        }
                    }
                }
                SOp::Close(id) => {
                    w.u8(1);
                    w.compact(*id);
                }
                SOp::CloseRaw(b) => {
                    w.u8(2);
                    w.blob(b);
                }
            }
        }
        w.buf
    }
}

/// Layout sizes and field offsets from `docs/PROTOCOL.md` §3.1–§3.3 (not
/// from the code under test).
fn layout_size(abi: SessionAbi) -> usize {
    match abi {
        SessionAbi::A | SessionAbi::B => 632,
        SessionAbi::C => 1072,
    }
}

fn sym_offset(abi: SessionAbi) -> usize {
    match abi {
        SessionAbi::A => 12,
        SessionAbi::B | SessionAbi::C => 8,
    }
}

fn id_offset(abi: SessionAbi) -> usize {
    match abi {
        SessionAbi::A | SessionAbi::B => 0,
        SessionAbi::C => 1064,
    }
}

const KEY_AT: usize = 56;
const AUTH_KEY_END: usize = 632;

fn le32(p: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([p[at], p[at + 1], p[at + 2], p[at + 3]])
}

fn put32(p: &mut [u8], at: usize, v: u32) {
    p[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// Builds the payload bytes.
pub fn payload_bytes(p: &Payload) -> Vec<u8> {
    match p {
        Payload::Layout {
            layout,
            op_code,
            cipher_alg,
            key_len,
            op_type,
            direction,
            key_byte,
            patch_at,
            patch,
        } => {
            let abi = [SessionAbi::A, SessionAbi::B, SessionAbi::C][usize::from(*layout % 3)];
            let mut b = vec![0u8; layout_size(abi)];
            match abi {
                SessionAbi::A => put32(&mut b, 8, *op_code as u32),
                SessionAbi::B => {}
                SessionAbi::C => b[0..8].copy_from_slice(&op_code.to_le_bytes()),
            }
            let s = sym_offset(abi);
            put32(&mut b, s, *cipher_alg);
            put32(&mut b, s + 4, *key_len);
            b[s + 24] = *op_type;
            b[s + 25] = *direction;
            for (i, k) in b[KEY_AT..KEY_AT + 64].iter_mut().enumerate() {
                *k = key_byte ^ i as u8;
            }
            let at = usize::from(*patch_at) % b.len();
            let n = patch.len().min(b.len() - at);
            b[at..at + n].copy_from_slice(&patch[..n]);
            b
        }
        Payload::Raw { len, fill, patch } => {
            let mut b = vec![*fill; usize::from(*len).min(MAX_PAYLOAD)];
            let n = patch.len().min(b.len());
            b[..n].copy_from_slice(&patch[..n]);
            b
        }
    }
}

/// The model's reading of a CREATE payload.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Fields {
    op_code: u32,
    cipher_alg: u32,
    key_len: u32,
    op_type: u8,
    direction: u8,
    key: Vec<u8>,
    hash_alg: u32,
    hash_result_len: u32,
    auth_key_len: u32,
    aad_len: u32,
    hash_mode: u8,
    alg_chain_order: u8,
}

fn model_layout(p: &[u8], choice: AbiChoice) -> Option<SessionAbi> {
    match choice {
        AbiChoice::Fixed(a) => Some(a),
        // PROTOCOL.md §3.4: 1072 bytes is C; at 632, A has op_code 2 at 8 and a
        // cipher_alg <= 14 at 12.
        AbiChoice::Auto => match p.len() {
            1072 => Some(SessionAbi::C),
            632 if le32(p, 8) == 2 && le32(p, 12) <= 14 => Some(SessionAbi::A),
            632 => Some(SessionAbi::B),
            _ => None,
        },
    }
}

fn model_fields(p: &[u8], abi: SessionAbi) -> Fields {
    let s = sym_offset(abi);
    let op_code = match abi {
        SessionAbi::A => le32(p, 8),
        SessionAbi::B => 2,
        SessionAbi::C => {
            let v = u64::from_le_bytes(p[0..8].try_into().unwrap_or_default());
            u32::try_from(v).unwrap_or(u32::MAX)
        }
    };
    Fields {
        op_code,
        cipher_alg: le32(p, s),
        key_len: le32(p, s + 4),
        op_type: p[s + 24],
        direction: p[s + 25],
        key: p[KEY_AT..KEY_AT + 64].to_vec(),
        hash_alg: le32(p, s + 8),
        hash_result_len: le32(p, s + 12),
        auth_key_len: le32(p, s + 16),
        aad_len: le32(p, s + 20),
        hash_mode: p[s + 26],
        alg_chain_order: p[s + 27],
    }
}

/// The model of the registry: live sessions (id → direction, key bits).
struct Model {
    max: usize,
    next_id: i64,
    live: BTreeMap<u64, (Direction, u32)>,
}

impl Model {
    /// The id (or negative status) a CREATE must get, per the registry's
    /// documented policy.
    fn create(&mut self, f: &Fields) -> i64 {
        if f.op_code != 2 || !matches!(f.op_type, 1 | 2) || f.cipher_alg != 3 {
            return -3;
        }
        let direction = match f.direction {
            1 => Direction::Encrypt,
            2 => Direction::Decrypt,
            _ => return -1,
        };
        if f.op_type == 2 {
            // Chaining: HMAC-SHA1 (2) / HMAC-SHA-256 (4), hash_mode AUTH,
            // encrypt + CIPHER_THEN_HASH (2) or decrypt + HASH_THEN_CIPHER (1), no AAD.
            let full = match f.hash_alg {
                2 => 20,
                4 => 32,
                _ => return -3,
            };
            let order = if direction == Direction::Encrypt { 2 } else { 1 };
            if f.hash_mode != 2 || f.alg_chain_order != order || f.aad_len != 0 {
                return -3;
            }
            if f.auth_key_len > 512 || f.hash_result_len == 0 || f.hash_result_len > full {
                return -1;
            }
        }
        if !matches!(f.key_len, 16 | 24 | 32) {
            return -1;
        }
        if self.live.len() >= self.max {
            return -5;
        }
        let id = self.next_id;
        self.next_id += 1;
        self.live.insert(id as u64, (direction, f.key_len * 8));
        id
    }
}

/// What `run` observed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// CREATE messages.
    pub creates: u32,
    /// Of those, sessions created.
    pub created: u32,
    /// CLOSE messages.
    pub closes: u32,
    /// Of those, sessions closed.
    pub closed: u32,
}

/// Decodes `data` and runs it; panics when a check fails.
pub fn run(data: &[u8]) -> Outcome {
    run_program(&SessionProgram::decode(data))
}

/// Runs a decoded program.
pub fn run_program(prog: &SessionProgram) -> Outcome {
    let mut out = Outcome::default();
    let max = usize::from(prog.max_sessions);
    let (mut reg, tables) = session_set(max, 1);
    let mut model = Model {
        max,
        next_id: 1,
        live: BTreeMap::new(),
    };
    for op in &prog.ops {
        match op {
            SOp::Create { abi, payload } => {
                out.creates += 1;
                let p = payload_bytes(payload);
                let choice = match abi % 4 {
                    0 => AbiChoice::Auto,
                    1 => AbiChoice::Fixed(SessionAbi::A),
                    2 => AbiChoice::Fixed(SessionAbi::B),
                    _ => AbiChoice::Fixed(SessionAbi::C),
                };
                let layout = model_layout(&p, choice);
                if choice == AbiChoice::Auto {
                    assert_eq!(SessionAbi::detect(&p), layout, "detect on {} bytes", p.len());
                }
                let matched = layout.filter(|&l| layout_size(l) == p.len());
                let want_id = match matched {
                    Some(l) => {
                        let f = model_fields(&p, l);
                        // The decoder agrees with the reference offsets and
                        // its encoder round-trips what it decoded.
                        let info = decode_create(&p, l).expect("decode of a payload of the layout's size");
                        assert_eq!(
                            (
                                info.op_code,
                                info.cipher_alg,
                                info.key_len,
                                info.op_type,
                                info.direction
                            ),
                            (f.op_code, f.cipher_alg, f.key_len, f.op_type, f.direction),
                            "decoded fields ({l:?})"
                        );
                        assert_eq!(&info.cipher_key[..], &f.key[..], "cipher key array");
                        assert_eq!(
                            (
                                info.hash_alg,
                                info.hash_result_len,
                                info.auth_key_len,
                                info.aad_len,
                                info.hash_mode,
                                info.alg_chain_order
                            ),
                            (
                                f.hash_alg,
                                f.hash_result_len,
                                f.auth_key_len,
                                f.aad_len,
                                f.hash_mode,
                                f.alg_chain_order
                            ),
                            "decoded chaining fields ({l:?})"
                        );
                        let again = decode_create(&encode_create(l, &info), l).expect("re-decode");
                        assert!(again == info, "encode/decode round trip ({l:?})");
                        model.create(&f)
                    }
                    None => {
                        if let Some(l) = layout {
                            assert!(decode_create(&p, l).is_err(), "size mismatch accepted");
                        }
                        -1
                    }
                };
                let reply = handle_create(&mut reg, &p, choice);
                // The reply, byte for byte.
                let mut want = Vec::with_capacity(12 + p.len());
                let hdr = Header::new(
                    FrontendReq::CREATE_CRYPTO_SESSION,
                    VERSION_1 | REPLY,
                    p.len() as u32,
                );
                want.extend_from_slice(&hdr.to_bytes());
                want.extend_from_slice(&p);
                let body = &mut want[12..];
                // Both key arrays zeroed, as far as the payload holds them.
                let len = body.len();
                body[KEY_AT.min(len)..AUTH_KEY_END.min(len)].fill(0);
                // The id goes where a frontend sending this size reads it:
                // at 1064 in a 1072-byte payload (layout C), else at 0.
                let off = if p.len() == layout_size(SessionAbi::C) {
                    id_offset(SessionAbi::C)
                } else {
                    id_offset(SessionAbi::A)
                };
                if off + 8 <= body.len() {
                    body[off..off + 8].copy_from_slice(&want_id.to_le_bytes());
                }
                if *reply != want {
                    let i = reply.iter().zip(&want).position(|(a, b)| a != b);
                    panic!(
                        "CREATE reply differs ({} vs {} bytes, first difference at {i:?}); \
                         expected id {want_id} at {off}, layout {matched:?}",
                        reply.len(),
                        want.len()
                    );
                }
                out.created += u32::from(want_id > 0);
            }
            SOp::Close(id) => {
                out.closes += 1;
                let p = id.to_le_bytes();
                assert_eq!(decode_close(&p), Ok(*id));
                let was = model.live.remove(id).is_some();
                assert_eq!(reg.close(*id), was, "close {id}");
                out.closed += u32::from(was);
            }
            SOp::CloseRaw(p) => {
                out.closes += 1;
                match decode_close(p) {
                    Ok(id) => {
                        assert_eq!(p.len(), 8);
                        assert_eq!(id.to_le_bytes(), p[..]);
                        let was = model.live.remove(&id).is_some();
                        assert_eq!(reg.close(id), was, "close {id}");
                        out.closed += u32::from(was);
                    }
                    Err(_) => assert_ne!(p.len(), 8, "8-byte close refused"),
                }
            }
        }
        // Registry and the worker's table agree with the model.
        assert_eq!(reg.len(), model.live.len(), "live sessions");
        let t = tables[0].lock();
        assert_eq!(t.len(), model.live.len(), "worker table size");
        for (id, &(dir, bits)) in &model.live {
            let s = t.get(*id).expect("live session in the worker table");
            assert_eq!((s.direction, s.key.key_bits()), (dir, bits), "session {id}");
        }
    }
    out
}
