// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The payloads of the vhost-user crypto session messages:
//! `CREATE_CRYPTO_SESSION` (26) and `CLOSE_CRYPTO_SESSION` (27).
//!
//! QEMU's `docs/interop/vhost-user.rst` names the messages but leaves the
//! payload to QEMU's C struct `VhostUserCryptoSession`
//! (`hw/virtio/vhost-user.c`), which has had three byte layouts
//! (`docs/PROTOCOL.md` §3):
//!
//! | layout | frontends | size | `session_id` at | sym fields at |
//! |---|---|---|---|---|
//! | A | QEMU 2.12–7.0, DPDK ≤ 24.11 | 632 | 0 | 12 (`op_code` at 8) |
//! | B | QEMU 7.1–8.0 (Debian 12's 7.2) | 632 | 0 | 8 (no `op_code`) |
//! | C | QEMU ≥ 8.1, DPDK ≥ 25.03 | 1072 | 1064 | 8 (`op_code` u64 at 0) |
//!
//! The two host-pointer fields QEMU copies into the payload are QEMU's own
//! virtual addresses and are ignored; keys come from the inline arrays.
//! The daemon decodes CREATE and builds its reply; frontends (the replay
//! tool, the tests) encode CREATE and CLOSE with the same definitions,
//! which the tests below pin to byte offsets laid out by hand.

use std::fmt;
use zeroize::{Zeroize, Zeroizing};

use crate::wire::vhost_user::{self, FrontendReq, Header, HDR_SIZE, REPLY, VERSION_1};
use crate::wire::virtio_crypto::{
    VIRTIO_CRYPTO_CIPHER_AES_CBC, VIRTIO_CRYPTO_CIPHER_CREATE_SESSION, VIRTIO_CRYPTO_SYM_OP_CIPHER,
};

/// Payload size of layouts A and B.
pub const SESSION_SIZE_AB: usize = 632;
/// Payload size of layout C.
pub const SESSION_SIZE_C: usize = 1072;
/// Cipher key capacity of the payload (`VHOST_CRYPTO_SYM_CIPHER_MAX_KEY_LEN`).
pub const MAX_CIPHER_KEY_LEN: usize = 64;
/// Auth key capacity of the payload (`VHOST_CRYPTO_SYM_HMAC_MAX_KEY_LEN`).
pub const MAX_AUTH_KEY_LEN: usize = 512;

/// Which `VhostUserCryptoSession` layout a payload uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SessionAbi {
    /// 632 bytes, `op_code` u32 at 8, sym fields from 12.
    A,
    /// 632 bytes, no `op_code`, sym fields from 8.
    B,
    /// 1072 bytes, `op_code` u64 at 0, sym/asym union from 8, `session_id` at 1064.
    C,
}

impl SessionAbi {
    /// Payload size in bytes.
    pub const fn size(self) -> usize {
        match self {
            SessionAbi::A | SessionAbi::B => SESSION_SIZE_AB,
            SessionAbi::C => SESSION_SIZE_C,
        }
    }

    /// Offset of the int64 `session_id`.
    pub const fn session_id_offset(self) -> usize {
        match self {
            SessionAbi::A | SessionAbi::B => 0,
            SessionAbi::C => 1064,
        }
    }

    /// Offset of `cipher_alg`, the first field of the sym session info.
    const fn sym_offset(self) -> usize {
        match self {
            SessionAbi::A => 12,
            SessionAbi::B | SessionAbi::C => 8,
        }
    }

    /// Detects the layout of a CREATE payload from its size and content
    /// (`docs/PROTOCOL.md` §3.4): 1072 bytes is C; at 632 bytes, A holds
    /// `op_code` = CIPHER_CREATE_SESSION (2) at 8 and `cipher_alg` (≤ 14)
    /// at 12, where B holds `cipher_alg` at 8 and `key_len` (16/24/32 for
    /// AES) at 12. `None` for any other size.
    pub fn detect(payload: &[u8]) -> Option<SessionAbi> {
        match payload.len() {
            SESSION_SIZE_C => Some(SessionAbi::C),
            SESSION_SIZE_AB => {
                let w8 = le32(payload, 8);
                let w12 = le32(payload, 12);
                if w8 == VIRTIO_CRYPTO_CIPHER_CREATE_SESSION && w12 <= 14 {
                    Some(SessionAbi::A)
                } else {
                    Some(SessionAbi::B)
                }
            }
            _ => None,
        }
    }
}

fn le32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// Symmetric session parameters (`CryptoDevBackendSymSessionInfo` plus the
/// inline key arrays). Key bytes are zeroized on drop and never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct SymSessionInfo {
    /// Control opcode: from the payload in layouts A and C; layout B has no
    /// such field and only CIPHER_CREATE_SESSION reaches a backend there.
    pub op_code: u32,
    /// `VIRTIO_CRYPTO_CIPHER_*`.
    pub cipher_alg: u32,
    /// Cipher key length in bytes as sent (may exceed 64 in a hostile message).
    pub key_len: u32,
    /// Hash or MAC algorithm for chaining.
    pub hash_alg: u32,
    /// Digest length for chaining.
    pub hash_result_len: u32,
    /// Auth key length as sent.
    pub auth_key_len: u32,
    /// AAD length for chaining.
    pub aad_len: u32,
    /// `VIRTIO_CRYPTO_SYM_OP_*`.
    pub op_type: u8,
    /// `VIRTIO_CRYPTO_OP_ENCRYPT` (1) or `_DECRYPT` (2).
    pub direction: u8,
    /// `VIRTIO_CRYPTO_SYM_HASH_MODE_*`.
    pub hash_mode: u8,
    /// `VIRTIO_CRYPTO_SYM_ALG_CHAIN_ORDER_*`.
    pub alg_chain_order: u8,
    /// The whole 64-byte cipher key array.
    pub cipher_key: Zeroizing<[u8; MAX_CIPHER_KEY_LEN]>,
    /// The whole 512-byte auth key array.
    pub auth_key: Zeroizing<Vec<u8>>,
}

impl fmt::Debug for SymSessionInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SymSessionInfo")
            .field("op_code", &self.op_code)
            .field("cipher_alg", &self.cipher_alg)
            .field("key_len", &self.key_len)
            .field("hash_alg", &self.hash_alg)
            .field("hash_result_len", &self.hash_result_len)
            .field("auth_key_len", &self.auth_key_len)
            .field("aad_len", &self.aad_len)
            .field("op_type", &self.op_type)
            .field("direction", &self.direction)
            .field("hash_mode", &self.hash_mode)
            .field("alg_chain_order", &self.alg_chain_order)
            .finish_non_exhaustive()
    }
}

impl Default for SymSessionInfo {
    fn default() -> Self {
        SymSessionInfo {
            op_code: VIRTIO_CRYPTO_CIPHER_CREATE_SESSION,
            cipher_alg: 0,
            key_len: 0,
            hash_alg: 0,
            hash_result_len: 0,
            auth_key_len: 0,
            aad_len: 0,
            op_type: 0,
            direction: 0,
            hash_mode: 0,
            alg_chain_order: 0,
            cipher_key: Zeroizing::new([0; MAX_CIPHER_KEY_LEN]),
            auth_key: Zeroizing::new(vec![0; MAX_AUTH_KEY_LEN]),
        }
    }
}

impl SymSessionInfo {
    /// A plain AES-CBC cipher session (`op_type` `VIRTIO_CRYPTO_SYM_OP_CIPHER`,
    /// `cipher_alg` `VIRTIO_CRYPTO_CIPHER_AES_CBC`, spec §5.9.7.2.1) in
    /// `direction` (`VIRTIO_CRYPTO_OP_ENCRYPT` 1 or `_DECRYPT` 2) with
    /// `key`: `key_len` is `key.len()`, and at most the array's 64 bytes
    /// are copied (a longer key is the backend's to refuse).
    pub fn aes_cbc(key: &[u8], direction: u8) -> Self {
        let mut info = SymSessionInfo {
            cipher_alg: VIRTIO_CRYPTO_CIPHER_AES_CBC,
            key_len: key.len() as u32,
            op_type: VIRTIO_CRYPTO_SYM_OP_CIPHER as u8,
            direction,
            ..Default::default()
        };
        let n = key.len().min(MAX_CIPHER_KEY_LEN);
        info.cipher_key[..n].copy_from_slice(&key[..n]);
        info
    }

    /// The cipher key bytes, or `None` when `key_len` exceeds the 64-byte array.
    pub fn cipher_key(&self) -> Option<&[u8]> {
        self.cipher_key.get(..self.key_len as usize)
    }
}

/// Errors decoding a session message.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SessionMsgError {
    /// The payload size does not match the layout.
    #[error("session payload of {got} bytes does not fit layout {abi:?} ({want} bytes)")]
    SizeMismatch {
        /// Layout asked for.
        abi: SessionAbi,
        /// Bytes received.
        got: usize,
        /// Bytes the layout has.
        want: usize,
    },
    /// The payload size is neither 632 nor 1072.
    #[error("session payload of {0} bytes matches no known layout")]
    UnknownSize(usize),
    /// A CLOSE payload is not 8 bytes.
    #[error("close-session payload of {0} bytes, expected 8")]
    BadCloseSize(usize),
}

/// Decodes a CREATE payload in layout `abi`.
///
/// # Errors
/// [`SessionMsgError::SizeMismatch`] if `payload.len() != abi.size()`.
pub fn decode_create(payload: &[u8], abi: SessionAbi) -> Result<SymSessionInfo, SessionMsgError> {
    if payload.len() != abi.size() {
        return Err(SessionMsgError::SizeMismatch {
            abi,
            got: payload.len(),
            want: abi.size(),
        });
    }
    let s = abi.sym_offset();
    let op_code = match abi {
        SessionAbi::A => le32(payload, 8),
        SessionAbi::B => VIRTIO_CRYPTO_CIPHER_CREATE_SESSION,
        // u64 in QEMU; a value that does not fit u32 is no known opcode.
        SessionAbi::C => {
            let mut b = [0u8; 8];
            b.copy_from_slice(&payload[0..8]);
            u32::try_from(u64::from_le_bytes(b)).unwrap_or(u32::MAX)
        }
    };
    let mut info = SymSessionInfo {
        op_code,
        cipher_alg: le32(payload, s),
        key_len: le32(payload, s + 4),
        hash_alg: le32(payload, s + 8),
        hash_result_len: le32(payload, s + 12),
        auth_key_len: le32(payload, s + 16),
        aad_len: le32(payload, s + 20),
        op_type: payload[s + 24],
        direction: payload[s + 25],
        hash_mode: payload[s + 26],
        alg_chain_order: payload[s + 27],
        ..Default::default()
    };
    // Both key arrays sit at the same offsets (56 and 120) in every layout.
    info.cipher_key
        .copy_from_slice(&payload[KEY_OFFSET..KEY_OFFSET + MAX_CIPHER_KEY_LEN]);
    info.auth_key
        .copy_from_slice(&payload[AUTH_KEY_OFFSET..AUTH_KEY_OFFSET + MAX_AUTH_KEY_LEN]);
    Ok(info)
}

const KEY_OFFSET: usize = 56;
const AUTH_KEY_OFFSET: usize = 120;

/// Encodes a CREATE payload (frontend side: replay tool and tests).
/// Host-pointer fields and padding are zero, `session_id` is 0.
pub fn encode_create(abi: SessionAbi, info: &SymSessionInfo) -> Vec<u8> {
    let mut p = vec![0u8; abi.size()];
    match abi {
        SessionAbi::A => p[8..12].copy_from_slice(&info.op_code.to_le_bytes()),
        SessionAbi::B => {}
        SessionAbi::C => p[0..8].copy_from_slice(&u64::from(info.op_code).to_le_bytes()),
    }
    let s = abi.sym_offset();
    for (i, v) in [
        info.cipher_alg,
        info.key_len,
        info.hash_alg,
        info.hash_result_len,
        info.auth_key_len,
        info.aad_len,
    ]
    .into_iter()
    .enumerate()
    {
        p[s + 4 * i..s + 4 * i + 4].copy_from_slice(&v.to_le_bytes());
    }
    p[s + 24] = info.op_type;
    p[s + 25] = info.direction;
    p[s + 26] = info.hash_mode;
    p[s + 27] = info.alg_chain_order;
    p[KEY_OFFSET..KEY_OFFSET + MAX_CIPHER_KEY_LEN].copy_from_slice(&info.cipher_key[..]);
    p[AUTH_KEY_OFFSET..AUTH_KEY_OFFSET + MAX_AUTH_KEY_LEN].copy_from_slice(&info.auth_key[..]);
    p
}

/// Builds the whole reply message (header + payload) to a CREATE whose
/// payload was `request`: request 26, flags `0x5` (REPLY | version 1), the
/// same size, the request payload echoed with both key arrays zeroed, and
/// `session_id` (the id, or a negative value) at the layout's offset. The
/// message is zeroized when dropped (a payload of another kind, e.g. an
/// asymmetric session's, keeps its key bytes where they were).
///
/// QEMU accepts the reply only with exactly these flags, request and size
/// (`vhost_user_crypto_create_session`). For a payload of unknown size
/// (`abi` = `None`) the id goes at offset 0 when it fits.
pub fn create_reply(request: &[u8], abi: Option<SessionAbi>, session_id: i64) -> Zeroizing<Vec<u8>> {
    let mut msg = Zeroizing::new(Vec::with_capacity(HDR_SIZE + request.len()));
    msg.extend_from_slice(
        &Header::new(
            FrontendReq::CREATE_CRYPTO_SESSION,
            VERSION_1 | REPLY,
            request.len() as u32,
        )
        .to_bytes(),
    );
    msg.extend_from_slice(request);
    let p = &mut msg[HDR_SIZE..];
    let len = p.len();
    for range in [
        KEY_OFFSET..KEY_OFFSET + MAX_CIPHER_KEY_LEN,
        AUTH_KEY_OFFSET..AUTH_KEY_OFFSET + MAX_AUTH_KEY_LEN,
    ] {
        // The part the payload holds (a short payload of no known layout
        // may end inside a key array).
        p[range.start.min(len)..range.end.min(len)].zeroize();
    }
    let off = abi.map_or(0, SessionAbi::session_id_offset);
    if let Some(slot) = p.get_mut(off..off + 8) {
        slot.copy_from_slice(&session_id.to_le_bytes());
    }
    msg
}

/// Reads the int64 `session_id` of a CREATE reply payload in layout `abi`.
pub fn reply_session_id(payload: &[u8], abi: SessionAbi) -> Option<i64> {
    let off = abi.session_id_offset();
    let b: [u8; 8] = payload.get(off..off + 8)?.try_into().ok()?;
    Some(i64::from_le_bytes(b))
}

/// Decodes a CLOSE payload: the u64 session id.
///
/// # Errors
/// [`SessionMsgError::BadCloseSize`] unless the payload is 8 bytes.
pub fn decode_close(payload: &[u8]) -> Result<u64, SessionMsgError> {
    let b: [u8; 8] = payload
        .try_into()
        .map_err(|_| SessionMsgError::BadCloseSize(payload.len()))?;
    Ok(u64::from_le_bytes(b))
}

/// Builds a whole frontend CREATE message (header flags = version 1, no
/// NEED_REPLY, as QEMU sends it).
pub fn create_request(abi: SessionAbi, info: &SymSessionInfo) -> Zeroizing<Vec<u8>> {
    let payload = Zeroizing::new(encode_create(abi, info));
    Zeroizing::new(vhost_user::message(
        FrontendReq::CREATE_CRYPTO_SESSION,
        VERSION_1,
        &payload,
    ))
}

/// Builds a whole frontend CLOSE message (flags = version 1, size 8).
pub fn close_request(session_id: u64) -> [u8; HDR_SIZE + 8] {
    vhost_user::u64_message(FrontendReq::CLOSE_CRYPTO_SESSION, VERSION_1, session_id)
}

#[cfg(test)]
mod tests {
    //! Fixtures are laid out byte by byte from the tables of
    //! `docs/PROTOCOL.md` §3 (QEMU's `VhostUserCryptoSession` as each QEMU
    //! version lays it out), not produced by `encode_create`.
    use super::*;

    #[test]
    fn aes_cbc_session_fields_are_the_spec_values() {
        // cipher_alg VIRTIO_CRYPTO_CIPHER_AES_CBC = 3, op_type
        // VIRTIO_CRYPTO_SYM_OP_CIPHER = 1 (VIRTIO 1.2 §5.9.4.1, §5.9.7.2.1).
        let i = SymSessionInfo::aes_cbc(&[7; 16], 2);
        assert_eq!((i.cipher_alg, i.op_type, i.direction, i.key_len), (3, 1, 2, 16));
        assert_eq!(i.cipher_key(), Some(&[7u8; 16][..]));
        // A key longer than the array: its length as given, 64 bytes copied.
        let i = SymSessionInfo::aes_cbc(&[9; 70], 1);
        assert_eq!(i.key_len, 70);
        assert_eq!(i.cipher_key(), None);
        assert!(i.cipher_key.iter().all(|&b| b == 9));
    }

    const KEY: [u8; 16] = *b"0123456789abcdef";

    fn put32(p: &mut [u8], off: usize, v: u32) {
        p[off..off + 4].copy_from_slice(&v.to_le_bytes());
    }

    /// Layout A as QEMU ≤ 7.0 / DPDK ≤ 24.11 sends it.
    fn fixture_a() -> Vec<u8> {
        let mut p = vec![0u8; 632];
        put32(&mut p, 8, 0x0002); // op_code
        put32(&mut p, 12, 3); // cipher_alg AES_CBC
        put32(&mut p, 16, 16); // key_len
        p[36] = 1; // op_type CIPHER
        p[37] = 2; // direction DECRYPT
        p[40..48].copy_from_slice(&0x7f00_dead_beefu64.to_le_bytes()); // host ptr
        p[56..72].copy_from_slice(&KEY);
        p
    }

    /// Layout B as QEMU 7.2 sends it.
    fn fixture_b() -> Vec<u8> {
        let mut p = vec![0u8; 632];
        put32(&mut p, 8, 3); // cipher_alg
        put32(&mut p, 12, 16); // key_len
        p[32] = 1; // op_type
        p[33] = 1; // direction ENCRYPT
        p[40..48].copy_from_slice(&0x7f00_dead_beefu64.to_le_bytes());
        p[56..72].copy_from_slice(&KEY);
        p
    }

    /// Layout C as QEMU ≥ 8.1 sends it.
    fn fixture_c() -> Vec<u8> {
        let mut p = vec![0u8; 1072];
        p[0..8].copy_from_slice(&2u64.to_le_bytes()); // op_code
        put32(&mut p, 8, 3);
        put32(&mut p, 12, 16);
        p[32] = 1;
        p[33] = 2;
        p[56..72].copy_from_slice(&KEY);
        p
    }

    #[test]
    fn layout_sizes_and_offsets_match_qemu() {
        // `sizeof(VhostUserCryptoSession)` and the offset of its int64
        // session_id in QEMU's hw/virtio/vhost-user.c, for each layout
        // (docs/PROTOCOL.md §3.1-§3.3); the key arrays at 56 and 120 in all.
        let got: Vec<(usize, usize)> = [SessionAbi::A, SessionAbi::B, SessionAbi::C]
            .iter()
            .map(|a| (a.size(), a.session_id_offset()))
            .collect();
        assert_eq!(got, [(632, 0), (632, 0), (1072, 1064)]);
        assert_eq!((KEY_OFFSET, AUTH_KEY_OFFSET), (56, 120));
        assert_eq!((MAX_CIPHER_KEY_LEN, MAX_AUTH_KEY_LEN), (64, 512));
    }

    #[test]
    fn detects_all_three_layouts() {
        assert_eq!(SessionAbi::detect(&fixture_a()), Some(SessionAbi::A));
        assert_eq!(SessionAbi::detect(&fixture_b()), Some(SessionAbi::B));
        assert_eq!(SessionAbi::detect(&fixture_c()), Some(SessionAbi::C));
        assert_eq!(SessionAbi::detect(&[0u8; 631]), None);
        assert_eq!(SessionAbi::detect(&[]), None);
    }

    #[test]
    fn decodes_fields_at_reference_offsets() {
        for (fx, abi, dir) in [
            (fixture_a(), SessionAbi::A, 2),
            (fixture_b(), SessionAbi::B, 1),
            (fixture_c(), SessionAbi::C, 2),
        ] {
            let i = decode_create(&fx, abi).unwrap();
            assert_eq!(i.op_code, 2, "{abi:?}");
            assert_eq!(i.cipher_alg, 3, "{abi:?}");
            assert_eq!(i.key_len, 16, "{abi:?}");
            assert_eq!(i.op_type, 1, "{abi:?}");
            assert_eq!(i.direction, dir, "{abi:?}");
            assert_eq!(i.cipher_key(), Some(&KEY[..]), "{abi:?}");
        }
    }

    #[test]
    fn decodes_chaining_fields_at_reference_offsets() {
        // AES-CBC + HMAC-SHA1 (2), digest 12, 20-byte auth key, hash_mode
        // AUTH (2), CIPHER_THEN_HASH (2): offsets from the §3 tables.
        let auth: Vec<u8> = (1..=20).collect();
        let mut a = fixture_a();
        put32(&mut a, 20, 2); // hash_alg
        put32(&mut a, 24, 12); // hash_result_len
        put32(&mut a, 28, 20); // auth_key_len
        a[36] = 2; // op_type ALGORITHM_CHAINING
        a[37] = 1; // direction ENCRYPT
        a[38] = 2; // hash_mode
        a[39] = 2; // alg_chain_order
        a[120..140].copy_from_slice(&auth);
        let mut b = fixture_b();
        let mut c = fixture_c();
        for p in [&mut b, &mut c] {
            put32(p, 16, 2);
            put32(p, 20, 12);
            put32(p, 24, 20);
            p[32] = 2;
            p[33] = 1;
            p[34] = 2;
            p[35] = 2;
            p[120..140].copy_from_slice(&auth);
        }
        for (fx, abi) in [(a, SessionAbi::A), (b, SessionAbi::B), (c, SessionAbi::C)] {
            let i = decode_create(&fx, abi).unwrap();
            assert_eq!(
                (i.hash_alg, i.hash_result_len, i.auth_key_len, i.aad_len),
                (2, 12, 20, 0),
                "{abi:?}"
            );
            assert_eq!(
                (i.op_type, i.direction, i.hash_mode, i.alg_chain_order),
                (2, 1, 2, 2),
                "{abi:?}"
            );
            assert_eq!(&i.auth_key[..20], &auth[..], "{abi:?}");
            assert!(i.auth_key[20..].iter().all(|&x| x == 0), "{abi:?}");
            // The reply zeroes the auth key array too.
            let reply = create_reply(&fx, Some(abi), 7);
            assert!(reply[HDR_SIZE + 120..HDR_SIZE + 632].iter().all(|&x| x == 0));
        }
    }

    #[test]
    fn encoder_reproduces_the_fixtures() {
        for (fx, abi) in [
            (fixture_a(), SessionAbi::A),
            (fixture_b(), SessionAbi::B),
            (fixture_c(), SessionAbi::C),
        ] {
            let mut expect = fx.clone();
            expect[40..48].fill(0); // the encoder writes no host pointer
            let info = decode_create(&fx, abi).unwrap();
            assert_eq!(encode_create(abi, &info), expect, "{abi:?}");
        }
    }

    #[test]
    fn size_mismatch_is_an_error() {
        assert!(matches!(
            decode_create(&fixture_c(), SessionAbi::B),
            Err(SessionMsgError::SizeMismatch {
                got: 1072,
                want: 632,
                ..
            })
        ));
    }

    #[test]
    fn reply_is_byte_exact() {
        for (fx, abi, off) in [
            (fixture_a(), SessionAbi::A, 0usize),
            (fixture_b(), SessionAbi::B, 0),
            (fixture_c(), SessionAbi::C, 1064),
        ] {
            let r = create_reply(&fx, Some(abi), 7);
            assert_eq!(r.len(), 12 + fx.len());
            assert_eq!(&r[0..4], &[26, 0, 0, 0]);
            assert_eq!(&r[4..8], &[5, 0, 0, 0]);
            assert_eq!(&r[8..12], &(fx.len() as u32).to_le_bytes());
            let p = &r[12..];
            assert_eq!(&p[off..off + 8], &[7, 0, 0, 0, 0, 0, 0, 0], "{abi:?}");
            assert!(p[56..120].iter().all(|&b| b == 0), "key not echoed");
            assert_eq!(reply_session_id(p, abi), Some(7));
            let r = create_reply(&fx, Some(abi), -3);
            assert_eq!(
                &r[12 + off..12 + off + 8],
                &[0xfd, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]
            );
        }
    }

    /// A payload of no known layout that ends inside a key array: the
    /// part of the array it holds is zeroed too.
    #[test]
    fn reply_to_a_short_payload_echoes_no_key_bytes() {
        for len in [60usize, 100, 121, 200, 631] {
            let fx = vec![0x5au8; len];
            let r = create_reply(&fx, None, -1);
            let p = &r[12..];
            assert_eq!(p.len(), len);
            assert_eq!(&p[..8], &(-1i64).to_le_bytes());
            assert!(p[8..56].iter().all(|&b| b == 0x5a), "{len}: not a key byte");
            assert!(p[56..].iter().all(|&b| b == 0), "{len}: key bytes echoed");
        }
    }

    #[test]
    fn close_framing() {
        let m = close_request(0x0102_0304_0506_0708);
        assert_eq!(m, [27, 0, 0, 0, 1, 0, 0, 0, 8, 0, 0, 0, 8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(decode_close(&m[12..]), Ok(0x0102_0304_0506_0708));
        assert_eq!(decode_close(&[0; 7]), Err(SessionMsgError::BadCloseSize(7)));
    }

    #[test]
    fn debug_hides_keys() {
        let i = decode_create(&fixture_b(), SessionAbi::B).unwrap();
        let s = format!("{i:?}");
        assert!(!s.contains("48"), "{s}"); // '0' = 0x30 = 48 would show in a key dump
        assert!(s.contains("key_len: 16"));
    }
}
