// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Validation of a request against its session and the bytes its
//! descriptor chain holds, in the order of the status policy
//! (`docs/PROTOCOL.md` §6).

use algorithms::{AesCbcKey, Direction};

use crate::sessions::Sessions;
use crate::virtq::descriptor::ChainWalker;
use crate::virtq::segments::{gather_array, Cursor};
use crate::wire::virtio_crypto::{
    AlgChainPara, OpDataReq, Status, AES_CBC_IV_LEN, OP_DATA_REQ_SIZE, VIRTIO_CRYPTO_CIPHER_AES_CBC,
    VIRTIO_CRYPTO_CIPHER_DECRYPT, VIRTIO_CRYPTO_CIPHER_ENCRYPT, VIRTIO_CRYPTO_SYM_OP_ALGORITHM_CHAINING,
    VIRTIO_CRYPTO_SYM_OP_CIPHER,
};

use super::alg_chain::{check_alg_chain, AlgChain};
use super::RequestLimits;

/// A request that passed every check.
pub(super) struct Valid<'w, 's> {
    pub(super) key: &'s AesCbcKey,
    pub(super) direction: Direction,
    pub(super) iv: [u8; 16],
    /// `src_data_len` = `dst_data_len`.
    pub(super) len: usize,
    pub(super) alg_chain: Option<AlgChain<'s>>,
    /// Where src starts in the readable stream (after header and IV).
    pub(super) src: Cursor<'w>,
}

/// Checks the request whose chain `w` walked, in the order of the status
/// policy, and returns what the cipher needs.
///
/// # Errors
/// The status the request completes with (`docs/PROTOCOL.md` §6).
pub(super) fn validate<'w, 's>(
    w: &'w ChainWalker,
    sessions: &'s Sessions,
    limits: RequestLimits,
) -> Result<Valid<'w, 's>, Status> {
    // 1. Header readable (docs/PROTOCOL.md §6, steps 1 and 2): copied
    // out once, everything below uses the copy.
    if w.status.is_none() {
        return Err(Status::Err);
    }
    let mut raw = [0u8; OP_DATA_REQ_SIZE];
    let mut at = Cursor::start(&w.readable);
    if !gather_array(at, &mut raw) {
        return Err(Status::Err);
    }
    let h = OpDataReq::from_bytes(&raw);

    // 2. Opcode, op_type and algorithm supported (step 3).
    let direction = match h.opcode {
        VIRTIO_CRYPTO_CIPHER_ENCRYPT => Direction::Encrypt,
        VIRTIO_CRYPTO_CIPHER_DECRYPT => Direction::Decrypt,
        _ => return Err(Status::NotSupp),
    };
    let alg_chain_para = match h.op_type {
        VIRTIO_CRYPTO_SYM_OP_CIPHER => None,
        VIRTIO_CRYPTO_SYM_OP_ALGORITHM_CHAINING => Some(AlgChainPara::from_bytes(&raw)),
        _ => return Err(Status::NotSupp),
    };
    // AAD is not supported (QEMU and DPDK's guest driver put it before src,
    // the spec after it; no driver of this device's users sends any).
    if alg_chain_para.is_some_and(|p| p.aad_len != 0) {
        return Err(Status::NotSupp);
    }
    // Linux leaves header.algo 0 for skcipher requests; the session decides
    // the algorithm. Any other value names an algorithm this device lacks.
    if h.algo != 0 && h.algo != VIRTIO_CRYPTO_CIPHER_AES_CBC {
        return Err(Status::NotSupp);
    }

    // 3. Session known (step 4).
    let session = sessions.get(h.session_id).ok_or(Status::InvSess)?;

    // 4. Everything else (steps 5 to 8; step 9, the digest, is checked
    // by `run_alg_chain`).
    if w.fault.is_some() || !w.readable_ok || !w.writable_ok {
        return Err(Status::Err);
    }
    if session.direction != direction
        || session.mac.is_some() != alg_chain_para.is_some()
        || h.iv_len != AES_CBC_IV_LEN
        || h.src_data_len != h.dst_data_len
        || h.src_data_len > limits.max_request_bytes
    {
        return Err(Status::Err);
    }
    let len = u64::from(h.src_data_len);
    let (alg_chain, digest_len) = match (alg_chain_para, &session.mac) {
        (Some(p), Some(mac)) => {
            let c = check_alg_chain(&p, mac, len)?;
            let d = c.digest_len as u64;
            (Some(c), d)
        }
        _ => {
            if len == 0 || len % 16 != 0 {
                return Err(Status::Err);
            }
            (None, 0)
        }
    };
    let src_off = OP_DATA_REQ_SIZE as u64 + u64::from(AES_CBC_IV_LEN);
    if w.readable_len < src_off + len || w.writable_len < len + digest_len + 1 {
        return Err(Status::Err);
    }
    let mut iv = [0u8; 16];
    at.advance(OP_DATA_REQ_SIZE);
    if !gather_array(at, &mut iv) {
        return Err(Status::Err);
    }
    at.advance(AES_CBC_IV_LEN as usize);
    Ok(Valid {
        key: &session.key,
        direction,
        iv,
        len: len as usize,
        alg_chain,
        src: at,
    })
}
