// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! One virtio-crypto data request: validation, the status policy, and the
//! cipher (and MAC, for algorithm chaining) run on the guest's buffers.
//!
//! A request (VIRTIO 1.2 §5.9.7.3, `docs/PROTOCOL.md` §5.3) is two byte
//! streams, whatever the descriptor layout:
//!
//! * device-readable: header (72 bytes) | IV (`iv_len`) | src (`src_data_len`) | …
//! * device-writable: dst (`dst_data_len`) | … | status (the **last** writable byte)
//!
//! An algorithm-chaining request (cipher + HMAC, spec §5.9.7.6
//! `virtio_crypto_alg_chain_data_vlf`) has the same readable stream (with
//! `aad_len` = 0, the only value accepted) and the digest after dst:
//!
//! * device-writable: dst (`dst_data_len`) | hash result (`hash_result_len`) | … | status
//!
//! [`crate::virtq::descriptor::ChainWalker::walk`] has turned the
//! descriptor chain into those streams. [`prepare`] validates the request
//! against the bytes actually present ([`mod@validate`]) and runs the cipher
//! directly on the mapped guest memory ([`cipher`], [`alg_chain`]), or
//! hands a valid request back as a [`LaneReq`] for [`run_lanes`] to run
//! together with others of the same session ([`lanes`]).
//!
//! Status policy (`docs/PROTOCOL.md` §6): the first failing check decides,
//! in this order — header readable (else ERR if a status byte exists, else
//! the chain is consumed with used length 0) → opcode and op_type supported
//! (else NOTSUPP) → session known (else INVSESS) → everything else (ERR).

pub mod alg_chain;
pub mod cipher;
pub mod lanes;
pub mod validate;

use std::ptr;

use algorithms::Direction;

use crate::sessions::Sessions;
use crate::virtq::descriptor::ChainWalker;
use crate::virtq::segments::Cursor;
use crate::wire::virtio_crypto::{Status, AES_CBC_IV_LEN, OP_DATA_REQ_SIZE};
use alg_chain::run_alg_chain;
use cipher::run_cipher;
use validate::validate;

use lanes::LaneMac;
pub use lanes::{prefetch_read, prefetch_write, run_lanes, LaneReq};

/// Outcome of one request: what to put on the used ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// Used length: bytes written including the status byte (0 when the
    /// chain had no status byte and was only consumed).
    pub used_len: u32,
    /// The status written, if any.
    pub status: Option<Status>,
    /// Bytes of guest data the request went through:
    /// `src_data_len` once its cipher ran (plus the bytes hashed, for a
    /// chained request), the bytes hashed when its digest check failed, 0
    /// when it was refused before either. What it cost the device, counted
    /// towards the batch byte cap ([`crate::worker::MAX_BATCH_BYTES`]): the
    /// used length alone would count a failed digest check over a large
    /// src as 1 byte.
    pub work: u64,
    /// `src_data_len` of a request that passed validation, 0 for one
    /// refused before its cipher ran: what the rate limit charges
    /// ([`crate::throttle`]) and, for requests completed OK, the stats'
    /// `bytes_in` ([`crate::stats`]), the length QEMU's cryptodev counts
    /// per symmetric operation (`sym_op_info->src_len`,
    /// `backends/cryptodev.c`).
    pub src_len: u64,
}

/// Limits applied to each request.
#[derive(Debug, Clone, Copy)]
pub struct RequestLimits {
    /// Largest `src_data_len` (= `dst_data_len`) accepted, in bytes.
    pub max_request_bytes: u32,
}

/// What [`prepare`] made of a request.
#[derive(Debug)]
pub enum Prepared<'s> {
    /// Completed (status written): an error, or a request run on its own.
    Done(Completion),
    /// A valid request to run with others of the same session.
    Lane(LaneReq<'s>),
}

/// Validates the request whose chain `w` has just walked. Errors and
/// requests that cannot be batched are executed and completed here; with
/// `allow_lane`, a valid request that can take the lanes ([`lanes`]) and
/// whose buffers are contiguous is returned as a [`LaneReq`] instead.
pub fn prepare<'s>(
    w: &ChainWalker,
    sessions: &'s Sessions,
    limits: RequestLimits,
    allow_lane: bool,
) -> Prepared<'s> {
    let v = match validate(w, sessions, limits) {
        Ok(v) => v,
        Err(status) => return Prepared::Done(complete(w, status, 0, 0, 0)),
    };
    let src_off = OP_DATA_REQ_SIZE + AES_CBC_IV_LEN as usize;
    // Lanes: valid requests whose src, dst and hash result each lie in one
    // mapped piece. Encrypt requests run in the CBC lanes; chained decrypt
    // requests have their digests computed together; plain decrypt
    // requests of up to 1 KiB are only gathered, so that their buffers are
    // prefetched while the ones before them run.
    let gathered =
        v.direction == Direction::Encrypt || v.alg_chain.is_some() || v.len <= LaneReq::DECRYPT_GATHER_MAX;
    if allow_lane && v.len > 0 && gathered {
        let digest_len = v.alg_chain.as_ref().map_or(0, |c| c.digest_len);
        let (sp, sl) = v.src.chunk();
        let (dp, dl) = Cursor::start(&w.writable).chunk();
        let (gp, gl) = match v.alg_chain {
            Some(_) => Cursor::new(&w.writable, v.len).chunk(),
            None => (ptr::null_mut(), 0),
        };
        let disjoint = (sp as usize).saturating_add(v.len) <= dp as usize
            || (dp as usize).saturating_add(v.len) <= sp as usize;
        let contiguous = sl >= v.len && dl >= v.len && gl >= digest_len;
        if let (true, Some(status)) = (contiguous && (sp == dp || disjoint), w.status) {
            let (cipher_off, cipher_len, mac) = match &v.alg_chain {
                Some(c) => (
                    c.cipher_off,
                    c.cipher_len,
                    Some(LaneMac {
                        key: c.mac,
                        digest: gp,
                        hash_off: c.hash_off,
                        hash_len: c.hash_len,
                    }),
                ),
                None => (0, v.len, None),
            };
            return Prepared::Lane(LaneReq {
                key: v.key,
                direction: v.direction,
                iv: v.iv,
                src: sp,
                dst: dp,
                len: v.len,
                cipher_off,
                cipher_len,
                mac,
                status,
                verified: false,
            });
        }
    }
    if let Some(alg_chain) = &v.alg_chain {
        return Prepared::Done(run_alg_chain(w, &v, alg_chain));
    }
    let mut stream = v.key.start(v.direction, &v.iv);
    run_cipher(&mut stream, &w.readable, src_off, &w.writable, 0, v.len);
    Prepared::Done(complete(w, Status::Ok, v.len as u32, v.len as u64, v.len as u64))
}

/// Writes `status` (when the chain has a status byte) and says what was
/// done: `written` bytes before the status byte, `work` bytes processed
/// ([`Completion::work`]), `src_len` the validated `src_data_len`
/// ([`Completion::src_len`]).
pub(crate) fn complete(w: &ChainWalker, status: Status, written: u32, work: u64, src_len: u64) -> Completion {
    match w.status {
        Some(p) => {
            // SAFETY: p points to the mapped last byte of a device-writable
            // buffer of this chain.
            unsafe { ptr::write_volatile(p, status as u8) };
            Completion {
                used_len: written + 1,
                status: Some(status),
                work,
                src_len,
            }
        }
        None => Completion {
            used_len: 0,
            status: None,
            work,
            src_len,
        },
    }
}
