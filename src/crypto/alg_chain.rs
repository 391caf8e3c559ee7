// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Algorithm chaining: AES-CBC with HMAC over the same request
//! (VIRTIO 1.2 §5.9.7.6, `docs/PROTOCOL.md` §5.2).

use algorithms::{Direction, MacKey, MacStream, MAX_MAC_LEN};

use crate::virtq::descriptor::ChainWalker;
use crate::virtq::segments::{gather, scatter, Cursor, Segment};
use crate::wire::virtio_crypto::{AlgChainPara, Status, AES_CBC_IV_LEN, OP_DATA_REQ_SIZE};

use super::cipher::run_cipher;
use super::validate::Valid;
use super::{complete, Completion};

/// The validated chaining part of a request: every range lies inside src
/// (offsets relative to src, in bytes).
pub(super) struct AlgChain<'s> {
    pub(super) mac: &'s MacKey,
    pub(super) cipher_off: usize,
    pub(super) cipher_len: usize,
    pub(super) hash_off: usize,
    pub(super) hash_len: usize,
    pub(super) digest_len: usize,
}

/// Checks the chaining fields against src (`src_len` bytes) and the
/// session (an empty src, or empty cipher and hash ranges, are valid: a
/// MAC over an empty message is well defined, RFC 2104; unlike a plain
/// cipher request of 0 bytes, which has no output and gets ERR): both ranges inside src (sums in 64 bits, so no field can wrap
/// them), the cipher range whole AES blocks, and the request's
/// `hash_result_len` equal to the session's digest length (so never longer
/// than the hash). Any failure is ERR (DPDK's `vhost_crypto_check_chain_request`
/// class of checks, CVE-2020-14376; `docs/PROTOCOL.md` §9).
pub(super) fn check_alg_chain<'s>(
    p: &AlgChainPara,
    mac: &'s MacKey,
    src_len: u64,
) -> Result<AlgChain<'s>, Status> {
    let cipher_end = u64::from(p.cipher_start_src_offset) + u64::from(p.len_to_cipher);
    let hash_end = u64::from(p.hash_start_src_offset) + u64::from(p.len_to_hash);
    if cipher_end > src_len
        || hash_end > src_len
        || !p.len_to_cipher.is_multiple_of(16)
        || p.hash_result_len as usize != mac.digest_len()
    {
        return Err(Status::Err);
    }
    Ok(AlgChain {
        mac,
        cipher_off: p.cipher_start_src_offset as usize,
        cipher_len: p.len_to_cipher as usize,
        hash_off: p.hash_start_src_offset as usize,
        hash_len: p.len_to_hash as usize,
        digest_len: p.hash_result_len as usize,
    })
}

/// Runs a validated chaining request on guest memory and writes its status.
///
/// * Encrypt (CIPHER_THEN_HASH): dst = src with the cipher range
///   encrypted, then the MAC of dst's hash range is written to the hash
///   result (generate).
/// * Decrypt (HASH_THEN_CIPHER): the MAC of src's hash range is compared,
///   in constant time, with the digest the driver put in the hash result
///   (the device-writable buffer after dst, read once into a local copy;
///   verify, as DPDK's vhost-crypto does); on a mismatch the request
///   completes with ERR and dst is not touched. Otherwise dst = src with
///   the cipher range decrypted.
///
/// dst bytes outside the cipher range carry the src bytes. Used length on
/// success is `dst_data_len + hash_result_len + 1` in both directions
/// (DPDK's convention); 1 on a digest mismatch.
pub(super) fn run_alg_chain(w: &ChainWalker, v: &Valid<'_, '_>, c: &AlgChain<'_>) -> Completion {
    let src_off = OP_DATA_REQ_SIZE + AES_CBC_IV_LEN as usize;
    let mut digest = [0u8; MAX_MAC_LEN];
    let digest = &mut digest[..c.digest_len];
    if v.direction == Direction::Decrypt {
        let mut mac = c.mac.start();
        feed_mac(&mut mac, &w.readable, src_off + c.hash_off, c.hash_len);
        // The expected digest is read once into a local copy.
        if !gather(&w.writable, v.len, digest) || !mac.verify_truncated(digest) {
            return complete(w, Status::Err, 0, c.hash_len as u64, v.len as u64);
        }
    }
    // dst outside the cipher range: the src bytes (a no-op when in place).
    let cipher_end = c.cipher_off + c.cipher_len;
    copy_streams(&w.readable, src_off, &w.writable, 0, c.cipher_off);
    copy_streams(
        &w.readable,
        src_off + cipher_end,
        &w.writable,
        cipher_end,
        v.len - cipher_end,
    );
    let mut stream = v.key.start(v.direction, &v.iv);
    run_cipher(
        &mut stream,
        &w.readable,
        src_off + c.cipher_off,
        &w.writable,
        c.cipher_off,
        c.cipher_len,
    );
    if v.direction == Direction::Encrypt {
        let mut mac = c.mac.start();
        feed_mac(&mut mac, &w.writable, c.hash_off, c.hash_len);
        mac.finish_into(digest);
        scatter(&w.writable, v.len, digest);
    }
    complete(
        w,
        Status::Ok,
        (v.len + c.digest_len) as u32,
        (v.len + c.hash_len) as u64,
        v.len as u64,
    )
}

/// Feeds `len` bytes of a segment stream from `off` to a MAC.
fn feed_mac(mac: &mut MacStream, segs: &[Segment], off: usize, len: usize) {
    let mut cur = Cursor::new(segs, off);
    let mut left = len;
    while left > 0 {
        let (p, n) = cur.chunk();
        let n = n.min(left);
        if n == 0 {
            return;
        }
        // SAFETY: p is mapped for n bytes while the memory guard is held; the
        // guest may change them concurrently, which only changes its own MAC.
        mac.update(unsafe { std::slice::from_raw_parts(p as *const u8, n) });
        cur.advance(n);
        left -= n;
    }
}

/// Copies `len` bytes from the readable stream at `src_off` to the
/// writable stream at `dst_off`, piece by piece (`memmove`, so a piece
/// copied onto itself — in-place requests — is harmless).
fn copy_streams(readable: &[Segment], src_off: usize, writable: &[Segment], dst_off: usize, len: usize) {
    let mut src = Cursor::new(readable, src_off);
    let mut dst = Cursor::new(writable, dst_off);
    let mut left = len;
    while left > 0 {
        let (sp, sl) = src.chunk();
        let (dp, dl) = dst.chunk();
        let n = sl.min(dl).min(left);
        if n == 0 {
            return;
        }
        // SAFETY: sp is mapped for n (≤ sl) bytes and dp for n (≤ dl) bytes
        // of a device-writable buffer, both while the memory guard is held;
        // `ptr::copy` allows them to overlap.
        unsafe { std::ptr::copy(sp, dp, n) };
        src.advance(n);
        dst.advance(n);
        left -= n;
    }
}
