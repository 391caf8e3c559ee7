// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! virtio-crypto constants and the data-request header.
//!
//! Values are from the VIRTIO 1.2 specification §5.9 ("Crypto Device") and
//! Linux `include/uapi/linux/virtio_crypto.h`; the header layout is the
//! padded (non-REVISION_1) form that QEMU and Linux use
//! (`docs/PROTOCOL.md` §5.1). `virtio-bindings` has no virtio-crypto
//! module, so these are defined here, once, and pinned to the spec's
//! literal values by the tests below.

/// Builds an opcode from a service and an operation (spec §5.9.7.2,
/// `VIRTIO_CRYPTO_OPCODE(service, op)`).
pub const fn virtio_crypto_opcode(service: u32, op: u32) -> u32 {
    (service << 8) | op
}

/// Service number of the cipher service.
pub const VIRTIO_CRYPTO_SERVICE_CIPHER: u32 = 0;

/// Data opcode: symmetric cipher encrypt (0x0000).
pub const VIRTIO_CRYPTO_CIPHER_ENCRYPT: u32 = virtio_crypto_opcode(VIRTIO_CRYPTO_SERVICE_CIPHER, 0);
/// Data opcode: symmetric cipher decrypt (0x0001).
pub const VIRTIO_CRYPTO_CIPHER_DECRYPT: u32 = virtio_crypto_opcode(VIRTIO_CRYPTO_SERVICE_CIPHER, 1);
/// Control opcode: create a cipher session (0x0002).
pub const VIRTIO_CRYPTO_CIPHER_CREATE_SESSION: u32 = virtio_crypto_opcode(VIRTIO_CRYPTO_SERVICE_CIPHER, 2);
/// Control opcode: create an asymmetric-cipher session (0x0404).
pub const VIRTIO_CRYPTO_AKCIPHER_CREATE_SESSION: u32 = virtio_crypto_opcode(4, 4);

/// Cipher algorithm: AES-CBC (spec §5.9.4.1, `VIRTIO_CRYPTO_CIPHER_AES_CBC`).
pub const VIRTIO_CRYPTO_CIPHER_AES_CBC: u32 = 3;

/// Session direction: encrypt (`VIRTIO_CRYPTO_OP_ENCRYPT`).
pub const VIRTIO_CRYPTO_OP_ENCRYPT: u8 = 1;
/// Session direction: decrypt (`VIRTIO_CRYPTO_OP_DECRYPT`).
pub const VIRTIO_CRYPTO_OP_DECRYPT: u8 = 2;

/// Symmetric op_type: none (`VIRTIO_CRYPTO_SYM_OP_NONE`).
pub const VIRTIO_CRYPTO_SYM_OP_NONE: u32 = 0;
/// Symmetric op_type: plain cipher (`VIRTIO_CRYPTO_SYM_OP_CIPHER`).
pub const VIRTIO_CRYPTO_SYM_OP_CIPHER: u32 = 1;
/// Symmetric op_type: cipher + hash chaining (`VIRTIO_CRYPTO_SYM_OP_ALGORITHM_CHAINING`).
pub const VIRTIO_CRYPTO_SYM_OP_ALGORITHM_CHAINING: u32 = 2;

/// Hash mode of a chaining session: plain hash (`VIRTIO_CRYPTO_SYM_HASH_MODE_PLAIN`).
pub const VIRTIO_CRYPTO_SYM_HASH_MODE_PLAIN: u8 = 1;
/// Hash mode of a chaining session: MAC with an auth key (`VIRTIO_CRYPTO_SYM_HASH_MODE_AUTH`).
pub const VIRTIO_CRYPTO_SYM_HASH_MODE_AUTH: u8 = 2;
/// Hash mode of a chaining session: nested (`VIRTIO_CRYPTO_SYM_HASH_MODE_NESTED`).
pub const VIRTIO_CRYPTO_SYM_HASH_MODE_NESTED: u8 = 3;

/// Chaining order: MAC the input, then run the cipher
/// (`VIRTIO_CRYPTO_SYM_ALG_CHAIN_ORDER_HASH_THEN_CIPHER`).
pub const VIRTIO_CRYPTO_SYM_ALG_CHAIN_ORDER_HASH_THEN_CIPHER: u8 = 1;
/// Chaining order: run the cipher, then MAC its output
/// (`VIRTIO_CRYPTO_SYM_ALG_CHAIN_ORDER_CIPHER_THEN_HASH`).
pub const VIRTIO_CRYPTO_SYM_ALG_CHAIN_ORDER_CIPHER_THEN_HASH: u8 = 2;

/// MAC algorithm: HMAC-SHA1 (spec §5.9.4.3, `VIRTIO_CRYPTO_MAC_HMAC_SHA1`).
pub const VIRTIO_CRYPTO_MAC_HMAC_SHA1: u32 = 2;
/// MAC algorithm: HMAC-SHA-256 (`VIRTIO_CRYPTO_MAC_HMAC_SHA_256`).
pub const VIRTIO_CRYPTO_MAC_HMAC_SHA_256: u32 = 4;

/// Request status (spec §5.9.7.1, `virtio_crypto_inhdr.status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Status {
    /// `VIRTIO_CRYPTO_OK` (0).
    Ok = 0,
    /// `VIRTIO_CRYPTO_ERR` (1): malformed request or failed operation.
    Err = 1,
    /// `VIRTIO_CRYPTO_BADMSG` (2): authentication failed.
    BadMsg = 2,
    /// `VIRTIO_CRYPTO_NOTSUPP` (3): unsupported opcode, algorithm or op_type.
    NotSupp = 3,
    /// `VIRTIO_CRYPTO_INVSESS` (4): unknown or closed session.
    InvSess = 4,
    /// `VIRTIO_CRYPTO_NOSPC` (5): no free session slot.
    NoSpc = 5,
}

/// The IV length of AES-CBC in bytes, the only `iv_len` a request of this
/// device may give: the AES block size (FIPS 197; NIST SP 800-38A §6.2).
pub const AES_CBC_IV_LEN: u32 = 16;

/// Size of `virtio_crypto_op_data_req` in bytes (spec §5.9.7.3).
pub const OP_DATA_REQ_SIZE: usize = 72;

/// Byte offsets inside `virtio_crypto_op_data_req` (`docs/PROTOCOL.md` §5.1, §5.2).
pub mod offsets {
    /// `header.opcode` (le32).
    pub const OPCODE: usize = 0;
    /// `header.algo` (le32).
    pub const ALGO: usize = 4;
    /// `header.session_id` (le64).
    pub const SESSION_ID: usize = 8;
    /// `cipher_para.iv_len` (le32).
    pub const IV_LEN: usize = 24;
    /// `cipher_para.src_data_len` (le32).
    pub const SRC_DATA_LEN: usize = 28;
    /// `cipher_para.dst_data_len` (le32).
    pub const DST_DATA_LEN: usize = 32;
    /// `alg_chain_data_para.cipher_start_src_offset` (le32).
    pub const CIPHER_START_SRC_OFFSET: usize = 36;
    /// `alg_chain_data_para.len_to_cipher` (le32).
    pub const LEN_TO_CIPHER: usize = 40;
    /// `alg_chain_data_para.hash_start_src_offset` (le32).
    pub const HASH_START_SRC_OFFSET: usize = 44;
    /// `alg_chain_data_para.len_to_hash` (le32).
    pub const LEN_TO_HASH: usize = 48;
    /// `alg_chain_data_para.aad_len` (le32).
    pub const AAD_LEN: usize = 52;
    /// `alg_chain_data_para.hash_result_len` (le32).
    pub const HASH_RESULT_LEN: usize = 56;
    /// `sym_req.op_type` (le32).
    pub const OP_TYPE: usize = 64;
}

/// The fields of a data request header this device uses, decoded from a
/// local 72-byte copy (never from guest memory directly).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpDataReq {
    /// `header.opcode`.
    pub opcode: u32,
    /// `header.algo` (Linux leaves it 0 for skcipher requests).
    pub algo: u32,
    /// `header.session_id`.
    pub session_id: u64,
    /// `sym_req.op_type`.
    pub op_type: u32,
    /// `cipher_para.iv_len` in bytes.
    pub iv_len: u32,
    /// `cipher_para.src_data_len` in bytes.
    pub src_data_len: u32,
    /// `cipher_para.dst_data_len` in bytes.
    pub dst_data_len: u32,
}

fn le32(b: &[u8; OP_DATA_REQ_SIZE], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

impl OpDataReq {
    /// Decodes the header from its 72 little-endian bytes.
    pub fn from_bytes(b: &[u8; OP_DATA_REQ_SIZE]) -> Self {
        let mut sid = [0u8; 8];
        sid.copy_from_slice(&b[offsets::SESSION_ID..offsets::SESSION_ID + 8]);
        OpDataReq {
            opcode: le32(b, offsets::OPCODE),
            algo: le32(b, offsets::ALGO),
            session_id: u64::from_le_bytes(sid),
            op_type: le32(b, offsets::OP_TYPE),
            iv_len: le32(b, offsets::IV_LEN),
            src_data_len: le32(b, offsets::SRC_DATA_LEN),
            dst_data_len: le32(b, offsets::DST_DATA_LEN),
        }
    }

    /// Encodes a plain-cipher request header (used by tests and the replay
    /// tool; unused fields are zero).
    pub fn to_bytes(&self) -> [u8; OP_DATA_REQ_SIZE] {
        let mut b = [0u8; OP_DATA_REQ_SIZE];
        b[offsets::OPCODE..][..4].copy_from_slice(&self.opcode.to_le_bytes());
        b[offsets::ALGO..][..4].copy_from_slice(&self.algo.to_le_bytes());
        b[offsets::SESSION_ID..][..8].copy_from_slice(&self.session_id.to_le_bytes());
        b[offsets::IV_LEN..][..4].copy_from_slice(&self.iv_len.to_le_bytes());
        b[offsets::SRC_DATA_LEN..][..4].copy_from_slice(&self.src_data_len.to_le_bytes());
        b[offsets::DST_DATA_LEN..][..4].copy_from_slice(&self.dst_data_len.to_le_bytes());
        b[offsets::OP_TYPE..][..4].copy_from_slice(&self.op_type.to_le_bytes());
        b
    }
}

/// The algorithm-chaining fields of a data request header
/// (`virtio_crypto_alg_chain_data_para`, spec §5.9.7.6,
/// `docs/PROTOCOL.md` §5.2), decoded from a local 72-byte copy. They sit where a
/// plain cipher request has zero padding; `iv_len`, `src_data_len` and
/// `dst_data_len` are shared with [`OpDataReq`]. All offsets and lengths
/// are in bytes, offsets relative to the start of src.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AlgChainPara {
    /// First src byte the cipher covers.
    pub cipher_start_src_offset: u32,
    /// Bytes the cipher covers.
    pub len_to_cipher: u32,
    /// First src byte the MAC covers.
    pub hash_start_src_offset: u32,
    /// Bytes the MAC covers.
    pub len_to_hash: u32,
    /// Additional authenticated data length (this device accepts 0 only).
    pub aad_len: u32,
    /// Digest bytes in the hash-result buffer.
    pub hash_result_len: u32,
}

impl AlgChainPara {
    /// Decodes the chaining fields from the 72 header bytes.
    pub fn from_bytes(b: &[u8; OP_DATA_REQ_SIZE]) -> Self {
        AlgChainPara {
            cipher_start_src_offset: le32(b, offsets::CIPHER_START_SRC_OFFSET),
            len_to_cipher: le32(b, offsets::LEN_TO_CIPHER),
            hash_start_src_offset: le32(b, offsets::HASH_START_SRC_OFFSET),
            len_to_hash: le32(b, offsets::LEN_TO_HASH),
            aad_len: le32(b, offsets::AAD_LEN),
            hash_result_len: le32(b, offsets::HASH_RESULT_LEN),
        }
    }

    /// Writes the chaining fields into a header built by
    /// [`OpDataReq::to_bytes`] (tests and the replay tool).
    pub fn write_to(&self, b: &mut [u8; OP_DATA_REQ_SIZE]) {
        for (off, v) in [
            (offsets::CIPHER_START_SRC_OFFSET, self.cipher_start_src_offset),
            (offsets::LEN_TO_CIPHER, self.len_to_cipher),
            (offsets::HASH_START_SRC_OFFSET, self.hash_start_src_offset),
            (offsets::LEN_TO_HASH, self.len_to_hash),
            (offsets::AAD_LEN, self.aad_len),
            (offsets::HASH_RESULT_LEN, self.hash_result_len),
        ] {
            b[off..off + 4].copy_from_slice(&v.to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opcodes_match_the_spec_table() {
        assert_eq!(VIRTIO_CRYPTO_CIPHER_ENCRYPT, 0x0000);
        assert_eq!(VIRTIO_CRYPTO_CIPHER_DECRYPT, 0x0001);
        assert_eq!(VIRTIO_CRYPTO_CIPHER_CREATE_SESSION, 0x0002);
        assert_eq!(VIRTIO_CRYPTO_AKCIPHER_CREATE_SESSION, 0x0404);
    }

    #[test]
    fn status_values_match_the_spec_table() {
        // VIRTIO 1.2 §5.9.7.1, `VIRTIO_CRYPTO_OK` .. `VIRTIO_CRYPTO_NOSPC`.
        let pairs = [
            (Status::Ok, 0u8),
            (Status::Err, 1),
            (Status::BadMsg, 2),
            (Status::NotSupp, 3),
            (Status::InvSess, 4),
            (Status::NoSpc, 5),
        ];
        for (status, literal) in pairs {
            assert_eq!(status as u8, literal, "{status:?}");
        }
    }

    #[test]
    fn algorithm_and_session_values_match_the_spec() {
        // VIRTIO 1.2 §5.9.4.1, §5.9.4.3 (cipher and MAC algorithms) and §5.9.7.2.1
        // (op_type, direction, hash mode, chaining order).
        assert_eq!(VIRTIO_CRYPTO_CIPHER_AES_CBC, 3);
        assert_eq!(VIRTIO_CRYPTO_MAC_HMAC_SHA1, 2);
        assert_eq!(VIRTIO_CRYPTO_MAC_HMAC_SHA_256, 4);
        assert_eq!((VIRTIO_CRYPTO_SYM_OP_NONE, VIRTIO_CRYPTO_SYM_OP_CIPHER), (0, 1));
        assert_eq!((VIRTIO_CRYPTO_OP_ENCRYPT, VIRTIO_CRYPTO_OP_DECRYPT), (1, 2));
        assert_eq!(
            (
                VIRTIO_CRYPTO_SYM_HASH_MODE_PLAIN,
                VIRTIO_CRYPTO_SYM_HASH_MODE_AUTH,
                VIRTIO_CRYPTO_SYM_HASH_MODE_NESTED
            ),
            (1, 2, 3)
        );
        assert_eq!(
            (
                VIRTIO_CRYPTO_SYM_ALG_CHAIN_ORDER_HASH_THEN_CIPHER,
                VIRTIO_CRYPTO_SYM_ALG_CHAIN_ORDER_CIPHER_THEN_HASH
            ),
            (1, 2)
        );
        assert_eq!(OP_DATA_REQ_SIZE, 72);
        assert_eq!(AES_CBC_IV_LEN, 16);
    }

    #[test]
    fn header_fields_at_reference_offsets() {
        // Fixture laid out by hand from the table of VIRTIO 1.2 §5.9.7.3
        // (`docs/PROTOCOL.md` §5.1).
        let mut b = [0u8; 72];
        b[0] = 0x01; // opcode = DECRYPT
        b[4] = 0x03; // algo
        b[8..16].copy_from_slice(&[0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11]);
        b[24] = 16; // iv_len
        b[28..32].copy_from_slice(&[0x00, 0x01, 0x00, 0x00]); // src 256
        b[32..36].copy_from_slice(&[0x00, 0x02, 0x00, 0x00]); // dst 512
        b[64] = 1; // op_type
        let h = OpDataReq::from_bytes(&b);
        assert_eq!(
            h,
            OpDataReq {
                opcode: 1,
                algo: 3,
                session_id: 0x1122_3344_5566_7788,
                op_type: 1,
                iv_len: 16,
                src_data_len: 256,
                dst_data_len: 512
            }
        );
        assert_eq!(h.to_bytes(), b);
    }

    #[test]
    fn alg_chain_fields_at_spec_offsets() {
        // Offsets 36..60 of `virtio_crypto_alg_chain_data_para` after the
        // 24-byte header (`docs/PROTOCOL.md` §5.2).
        let mut b = [0u8; 72];
        for (i, off) in [36, 40, 44, 48, 52, 56].into_iter().enumerate() {
            b[off] = 0x10 + i as u8;
            b[off + 3] = 0xa0 + i as u8;
        }
        let p = AlgChainPara::from_bytes(&b);
        assert_eq!(
            p,
            AlgChainPara {
                cipher_start_src_offset: 0xa000_0010,
                len_to_cipher: 0xa100_0011,
                hash_start_src_offset: 0xa200_0012,
                len_to_hash: 0xa300_0013,
                aad_len: 0xa400_0014,
                hash_result_len: 0xa500_0015,
            }
        );
        let mut c = [0u8; 72];
        p.write_to(&mut c);
        assert_eq!(c, b);
        assert_eq!(VIRTIO_CRYPTO_SYM_OP_ALGORITHM_CHAINING, 2);
    }
}
