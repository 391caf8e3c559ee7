// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! What the device may and may not have written: the canaries put in
//! each request's writable buffers and around them, the guards after dst
//! and the status byte, the sampled re-reads of src and the header, and
//! the checks of each completion against the trace's expectation.

use vhost_user_crypto::wire::virtio_crypto::OP_DATA_REQ_SIZE;

use super::prepared::{Hot, Prepared};
use super::report::Outcome;
use super::run::{InFlight, Run};
use crate::frontend::{SlotLayout, Used, DIGEST_AREA};
use crate::guest_mem::{GuestMem, PREFETCH_MAX};
use crate::trace::{hex, AlgChainReq, ExpectStatus};

/// Canary written over every output buffer before a request is submitted.
pub const DST_CANARY: u8 = 0xA5;

/// The first this many requests of a run have their src and request header
/// compared with what this tool put there after they complete (so every
/// request of the shipped known-answer traces), and after them one in
/// [`SRC_CHECK_EVERY`].
pub const SRC_CHECK_ALL: u64 = 4096;

/// One request in this many has its src and header compared after it
/// completes, after the first [`SRC_CHECK_ALL`]. By then the src lines have
/// usually left this CPU's caches for the backend's, and reading them all
/// back for every request cost 10-40 % of the 256-byte throughput here (the
/// sampled ones are prefetched with the request's output); a
/// backend that writes device-readable buffers does so on a code path,
/// which a sample finds as surely (the soak checker compares src on every
/// request).
pub const SRC_CHECK_EVERY: u64 = 64;
const _: () = assert!(SRC_CHECK_EVERY.is_power_of_two());

/// Whether the request with sequence number `seq` in its run has its src
/// checked ([`SRC_CHECK_ALL`], [`SRC_CHECK_EVERY`]). The sample is a hash
/// of `seq`, not `seq % SRC_CHECK_EVERY`: requests go to the queues round
/// robin, so a multiple of the queue count would always pick queue 0 (and
/// a trace repeating with a period that divides it, the same requests).
pub(super) fn src_checked(seq: u64) -> bool {
    seq < SRC_CHECK_ALL || in_hash_sample(seq)
}

/// Whether `seq` is in the sample of one in [`SRC_CHECK_EVERY`] (64)
/// sequence numbers, chosen by a hash of it (not the multiples of
/// anything, see [`src_checked`]).
pub(super) fn in_hash_sample(seq: u64) -> bool {
    // Fibonacci hashing: the top bits of seq * 2^64 / phi.
    seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SRC_CHECK_EVERY.trailing_zeros()) == 0
}

/// Bytes of canary put right after a request's output where they are not
/// another field of the slot (see `dst_guard`), and checked afterwards.
pub const GUARD_LEN: usize = 16;

/// Where the guard after a request's output goes, if anywhere: after dst
/// when the request is shorter than the slot's data buffers (a
/// full-length dst is followed by the IV, which is checked anyway, or,
/// swapped, by src, see `check_untouched`), or after src for an in-place
/// request.
pub(super) fn dst_guard(l: SlotLayout, len: u32, in_place: bool) -> Option<u64> {
    let len = u64::from(len);
    if in_place {
        return Some(l.src + len);
    }
    let area = l.dst.abs_diff(l.src);
    (len + GUARD_LEN as u64 <= area).then_some(l.dst + len)
}

/// The status byte's canary and the bytes after it up to `STATUS_AREA`
/// (checked afterwards: the device writes one byte). Written as one piece
/// where the slot has room before its descriptor table.
const STATUS_AREA: usize = 8;
const STATUS_AREA_PUT: [u8; STATUS_AREA] = [STATUS_CANARY, 0x5A, 0x5A, 0x5A, 0x5A, 0x5A, 0x5A, 0x5A];

/// Whether slot `l` has room for the whole status area before its
/// descriptor tables ([`SlotLayout::first_table`]).
pub(super) fn status_area_fits(l: SlotLayout) -> bool {
    l.status + STATUS_AREA as u64 <= l.first_table()
}

/// Puts the status canary in slot `l`'s status byte and, where the slot
/// has room, the guard bytes after it ([`STATUS_AREA_PUT`]); see
/// [`status_and_guard`].
pub(crate) fn put_status_area(mem: &GuestMem, l: SlotLayout) {
    if status_area_fits(l) {
        mem.write(l.status, &STATUS_AREA_PUT);
    } else {
        mem.write(l.status, &[STATUS_CANARY]);
    }
}

/// Slot `l`'s status byte, and whether the bytes after it are as
/// [`put_status_area`] put them (true where it put none): one 8-byte load.
pub(crate) fn status_and_guard(mem: &GuestMem, l: SlotLayout) -> (u8, bool) {
    let area = if status_area_fits(l) {
        mem.view(l.status, STATUS_AREA)
    } else {
        &[]
    };
    match <[u8; STATUS_AREA]>::try_from(area) {
        Ok(w) => {
            let w = u64::from_le_bytes(w);
            (w as u8, w >> 8 == u64::from_le_bytes(STATUS_AREA_PUT) >> 8)
        }
        Err(_) => (mem.read_u8(l.status), true),
    }
}

/// Status byte value before completion.
pub const STATUS_CANARY: u8 = 0xFF;

impl<'a> Run<'a> {
    pub(super) fn check(&mut self, q: usize, u: Used) {
        let Some(f) = self.inflight[q]
            .get_mut(usize::from(u.slot))
            .and_then(Option::take)
        else {
            self.mismatch(
                0,
                "used id",
                "the head of a request in flight".into(),
                format!("{} (used length {})", u.id, u.len),
            );
            return;
        };
        // (A request in flight is one of the current run's.)
        let Some(p) = self.cur else {
            return;
        };
        if f.timed {
            let t0 = self.started[q][usize::from(u.slot)];
            self.latencies
                .push(t0.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
        }
        let h = &p.hot[f.idx as usize];
        self.report.requests += 1;
        self.report.bytes += u64::from(h.len);
        if let Some(b) = &self.bar {
            b.inc(1);
        }
        let b = self.queues[q].buf(u.slot);
        let l = self.queues[q].set_layout(b).swapped_if(f.swapped);
        // The output is compared where the backend wrote it (no copy).
        let mem: &'a GuestMem = &self.mems[q];
        let dst = mem.view(if h.in_place() { l.src } else { l.dst }, h.len as usize);
        let alg_chain = p.alg_chain(f.idx as usize, h);
        let digest_len = alg_chain.map_or(0, |c| c.digest_len as usize);
        // The hash result is compared where the backend wrote it too
        // (plain cipher requests have none: no bytes, no bounds check).
        let digest: &[u8] = if digest_len == 0 {
            &[]
        } else {
            mem.view(l.digest, digest_len.min(DIGEST_AREA))
        };
        // The status byte and, where the slot has room, the bytes after it
        // that must stay as this tool put them.
        let (status, after_status_ok) = status_and_guard(mem, l);
        let before = self.report.mismatches;
        self.check_outcome(p, f, h, alg_chain, u, status, dst, digest);
        self.check_untouched(p, f, h, alg_chain, (q, b), mem, l, after_status_ok);
        let clean = self.report.mismatches == before;
        let known = &mut self.dst_known[q][b];
        if h.in_place() {
            // The output is over src; the set's other buffer is not
            // compared.
            *known = [None; 2];
        } else {
            let (src_buf, dst_buf) = data_buffers(l);
            known[dst_buf] = (clean && status == 0).then(|| p.known_after(h)).flatten();
            known[src_buf] = clean.then(|| p.src_known_after(h)).flatten();
        }
    }

    /// The device may write only the dst and hash result bytes and the
    /// status byte; everything else of the slot that this tool put there
    /// must be as it was. On every request: the IV (whose line follows a
    /// full-length dst, so a write past dst's end lands there; a swapped
    /// dst is followed by src, whose first 16 bytes are compared too
    /// unless all of src is), the guard after a shorter dst or an
    /// in-place src ([`dst_guard`]), the bytes after the status byte
    /// (`after_status_ok`, read with the status) and the hash result area
    /// past `hash_result_len`. On each of the run's first
    /// [`SRC_CHECK_ALL`] requests and then on one in [`SRC_CHECK_EVERY`]
    /// ([`src_checked`]): the request header and src (unless the request
    /// is in place, where src is dst).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn check_untouched(
        &mut self,
        p: &Prepared<'_>,
        f: InFlight,
        h: &Hot,
        alg_chain: Option<&AlgChainReq>,
        (q, b): (usize, usize),
        mem: &GuestMem,
        l: SlotLayout,
        after_status_ok: bool,
    ) {
        if src_checked(f.seq) {
            if !h.in_place() && mem.view(l.src, h.len as usize) != p.src(h) {
                self.mismatch(
                    p.line(f.idx),
                    "src (device-readable)",
                    "unchanged".into(),
                    "written".into(),
                );
            }
            // The header as it was put there.
            let want = self.hdr_put[q][b];
            if mem.view(l.hdr, OP_DATA_REQ_SIZE) != want.as_slice() {
                self.mismatch(
                    p.line(f.idx),
                    "request header (device-readable)",
                    hex(&want),
                    hex(mem.view(l.hdr, OP_DATA_REQ_SIZE)),
                );
            }
        }
        let guard = dst_guard(l, h.len, h.in_place());
        if l.swapped && guard.is_none() && !src_checked(f.seq) {
            let n = GUARD_LEN.min(h.len as usize);
            if mem.view(l.src, n) != &p.src(h)[..n] {
                self.mismatch(
                    p.line(f.idx),
                    &format!("src[0..{n}] (device-readable, right after dst)"),
                    "unchanged".into(),
                    "written".into(),
                );
            }
        }
        if let Some(g) = guard {
            if mem.view(g, GUARD_LEN).iter().any(|&x| x != DST_CANARY) {
                self.mismatch(
                    p.line(f.idx),
                    &format!("the {GUARD_LEN} bytes after dst (not the request's)"),
                    "untouched".into(),
                    "written".into(),
                );
            }
        }
        let put_iv = p.iv(h);
        let iv = mem.view(l.iv, put_iv.len());
        // (16 bytes compared inline, not through a call to memcmp.)
        let same = match (<&[u8; 16]>::try_from(iv), <&[u8; 16]>::try_from(put_iv)) {
            (Ok(a), Ok(b)) => u128::from_ne_bytes(*a) == u128::from_ne_bytes(*b),
            _ => iv == put_iv,
        };
        if !same {
            self.mismatch(p.line(f.idx), "IV (device-readable)", hex(put_iv), hex(iv));
        }
        if !after_status_ok {
            self.mismatch(
                p.line(f.idx),
                &format!("the {} bytes after the status byte", STATUS_AREA - 1),
                "untouched".into(),
                "written".into(),
            );
        }
        if let Some(c) = alg_chain {
            let digest_len = c.digest_len as usize;
            let area = mem.view(l.digest, DIGEST_AREA);
            let past = digest_len.min(DIGEST_AREA);
            let put = |i: usize| c.digest_in.get(i).copied().unwrap_or(DST_CANARY);
            if (past..DIGEST_AREA).any(|i| area[i] != put(i)) {
                self.mismatch(
                    p.line(f.idx),
                    &format!("hash result area past hash_result_len {digest_len}"),
                    "untouched".into(),
                    "written".into(),
                );
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn check_outcome(
        &mut self,
        p: &Prepared<'_>,
        f: InFlight,
        h: &Hot,
        alg_chain: Option<&AlgChainReq>,
        u: Used,
        status: u8,
        dst: &[u8],
        digest: &[u8],
    ) {
        let digest_len = digest.len();
        if self.opts.record {
            self.outcomes.push((
                f.seq,
                Outcome {
                    line: p.line(f.idx),
                    status,
                    used_len: u.len,
                    dst: dst.to_vec(),
                    digest: digest.to_vec(),
                },
            ));
        }
        self.status_counts[usize::from(status)] += 1;
        if status != h.status {
            self.mismatch(
                p.line(f.idx),
                "status",
                ExpectStatus::name(h.status),
                ExpectStatus::name(status),
            );
            return;
        }
        let ok = h.status == ExpectStatus::Ok.byte();
        let want_len = if ok {
            (h.len as usize + digest_len) as u32 + 1
        } else {
            1
        };
        if u.len != want_len {
            self.mismatch(
                p.line(f.idx),
                "used length",
                want_len.to_string(),
                u.len.to_string(),
            );
        }
        if let Some(c) = alg_chain {
            // Encrypt: the expected MAC; otherwise (decrypt, errors) the
            // hash result keeps what the driver put there.
            let expect_mac = c.expect_digest.as_ref().filter(|_| ok);
            let good = match expect_mac {
                Some(d) => digest == d.as_slice(),
                None => holds_digest_in(digest, &c.digest_in),
            };
            if !good {
                let want = match expect_mac {
                    Some(d) => d.clone(),
                    None => digest_in_area(&c.digest_in, digest_len),
                };
                self.mismatch(p.line(f.idx), "hash result", hex(&want), hex(digest));
            }
        }
        if ok {
            if h.has_dst() {
                let want = p.want(h);
                let same = if f.alternating {
                    output_matches(dst, want)
                } else {
                    dst == want
                };
                if !same {
                    let at = dst.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
                    let end = (at + 16).min(dst.len());
                    self.mismatch(
                        p.line(f.idx),
                        &format!("dst[{at}..{end}]"),
                        hex(&want[at..end.min(want.len())]),
                        hex(&dst[at..end]),
                    );
                }
            }
        } else if (h.in_place() && dst != p.src(h)) || (!h.in_place() && dst.iter().any(|&b| b != DST_CANARY))
        {
            self.mismatch(
                p.line(f.idx),
                "dst (must be untouched on error)",
                "unchanged".into(),
                "written".into(),
            );
        }
    }

    /// Starts loading what checking completion `u` reads: its output and
    /// status (written by the backend's CPU) and the expected output.
    #[inline(always)]
    pub(super) fn prefetch(&self, q: usize, u: Used) {
        let (Some(p), Some(Some(f))) = (self.cur, self.inflight[q].get(usize::from(u.slot))) else {
            return;
        };
        let h = &p.hot[f.idx as usize];
        let dq = &self.queues[q];
        let l = dq.layout(u.slot).swapped_if(f.swapped);
        let mem = &self.mems[q];
        if h.in_place() {
            mem.prefetch(l.src, h.len as usize);
        } else if f.alternating {
            // For writing: the next src of this buffer set goes there
            // (`output_matches`).
            mem.prefetch_write(l.dst, h.len as usize);
        } else {
            mem.prefetch(l.dst, h.len as usize);
        }
        mem.prefetch_byte(l.status);
        if src_checked(f.seq) {
            mem.prefetch(l.hdr, OP_DATA_REQ_SIZE);
            if !h.in_place() {
                mem.prefetch(l.src, h.len as usize);
                crate::guest_mem::prefetch(p.src(h));
            }
        }
        crate::guest_mem::prefetch(p.want(h));
    }
}

/// Which of its buffer set's two data buffers (0, 1: an index into a set's
/// `Run::dst_known`) a request laid out at `l` reads src from and which it
/// writes its output to (unless in place: then src is both): 0 and 1
/// unless `l` is swapped (`frontend::Placement::Swapped`).
pub(super) fn data_buffers(l: SlotLayout) -> (usize, usize) {
    let k = usize::from(l.swapped);
    (k, 1 - k)
}

/// Whether the output `dst` (in guest memory) of a request that
/// alternates is `want`, compared a [`PREFETCH_MAX`] piece at a time, the
/// lines of each piece taken for writing (`PREFETCHW`) while the one
/// before is compared (the first piece's with the completion's prefetch):
/// the next request of the buffer set writes its src there
/// (`DriverQueue::placement`), into lines this CPU then holds, where it
/// would otherwise take each line from the backend's CPU again.
fn output_matches(dst: &[u8], want: &[u8]) -> bool {
    if dst.len() <= PREFETCH_MAX || dst.len() != want.len() {
        return dst == want;
    }
    let mut at = 0;
    while at < dst.len() {
        let end = (at + PREFETCH_MAX).min(dst.len());
        crate::guest_mem::prefetch_for_write(&dst[end..]);
        if dst[at..end] != want[at..end] {
            return false;
        }
        at = end;
    }
    true
}

/// The block signature of an expected output: the first 4 bytes of each
/// of its 16-byte blocks as one word (fewer, zero-padded, in a shorter
/// last block). Two outputs whose signatures differ at block j differ in
/// block j, where both hold at least 4 bytes there (not so for the
/// zero-padded word of a last block of 1 to 3 bytes); unrelated blocks
/// have equal words once in 2^32.
pub fn block_signature(out: &[u8]) -> Vec<u32> {
    out.chunks(16)
        .map(|b| {
            let mut w = [0u8; 4];
            let n = b.len().min(4);
            w[..n].copy_from_slice(&b[..n]);
            u32::from_le_bytes(w)
        })
        .collect()
}

/// Whether an output of `len` bytes ends in a block of 1 to 3 bytes,
/// whose signature word is zero-padded ([`block_signature`]) and so does
/// not tell whether the bytes there are equal.
pub(super) fn short_last_block(len: usize) -> bool {
    (1..4).contains(&(len % 16))
}

/// What a buffer is known to hold after an output of `len` bytes with
/// signature `sig` was found in it: the words of the blocks that hold at
/// least 4 of its bytes (a last block of 1 to 3 bytes counts as unknown,
/// [`short_last_block`]).
pub(super) fn known_sig(sig: &[u32], len: usize) -> &[u32] {
    &sig[..sig.len() - usize::from(short_last_block(len))]
}

/// Puts the canary in every 16-byte block of the `want_len` bytes at `dst`
/// (the last block may be shorter) that may already hold its bytes of the
/// expected output (whose signature is `want_sig`), going by `known`, the
/// signature of what the buffer is known to hold ([`known_sig`]): the
/// blocks whose signature words are equal, those past `known`'s end, a last
/// block of 1 to 3 bytes, or all of them when nothing is known. A backend
/// that left such a block alone would look right; the other blocks differ
/// from the expected output already and are not written (writing them
/// would pull their lines over to this CPU just before the backend writes
/// them). Only the two signatures are read, not the outputs.
pub(super) fn canary_where_same(
    mem: &crate::guest_mem::GuestMem,
    dst: u64,
    known: Option<&[u32]>,
    want_sig: &[u32],
    want_len: usize,
) {
    let Some(known) = known else {
        mem.fill(dst, want_len, DST_CANARY);
        return;
    };
    // The usual case, checked without a branch per block (vectorised): the
    // known output covers the expected one and no block signature is
    // equal.
    let any_equal = known
        .iter()
        .zip(want_sig)
        .fold(false, |acc, (k, w)| acc | (k == w));
    let short = short_last_block(want_len);
    if !any_equal && known.len() >= want_sig.len() && !short {
        return;
    }
    let blocks = want_len.div_ceil(16);
    for j in 0..blocks {
        if known.get(j).is_none_or(|k| want_sig.get(j) == Some(k)) || (short && j + 1 == blocks) {
            mem.fill(dst + 16 * j as u64, (want_len - 16 * j).min(16), DST_CANARY);
        }
    }
}

/// Whether a hash-result area still holds what the driver put there: its
/// digest, then the canary (no allocation: called per completion).
pub(super) fn holds_digest_in(area: &[u8], digest_in: &[u8]) -> bool {
    let n = digest_in.len().min(area.len());
    area[..n] == digest_in[..n] && area[n..].iter().all(|&b| b == DST_CANARY)
}

/// The hash-result area a driver hands over: its digest, then the canary
/// (for reporting a mismatch).
pub(super) fn digest_in_area(digest_in: &[u8], len: usize) -> Vec<u8> {
    let mut v = vec![DST_CANARY; len];
    let n = digest_in.len().min(len);
    v[..n].copy_from_slice(&digest_in[..n]);
    v
}

#[cfg(test)]
mod tests {
    use super::{block_signature, canary_where_same, known_sig, status_area_fits, DST_CANARY};
    use crate::frontend::SlotLayout;
    use crate::guest_mem::GuestMem;

    #[test]
    fn the_status_area_fits_only_in_the_status_bytes_line_swapped_or_not() {
        // A set whose tables start at the line after the status byte's
        // (0x1040): an 8-byte area from byte 56 of the line fits, from
        // byte 57 it would reach the first table. The swapped layout
        // points at the second table, 128 bytes on, and fits no more.
        for (status, fits) in [(0x1038, true), (0x1039, false)] {
            let l = SlotLayout {
                hdr: 0,
                iv: 0x1000,
                src: 0x80,
                dst: 0x800,
                status,
                table: 0x1040,
                digest: 0x1140,
                swapped: false,
            };
            assert_eq!(status_area_fits(l), fits, "{status:#x}");
            assert_eq!(status_area_fits(l.swapped_if(true)), fits, "{status:#x} swapped");
        }
    }

    #[test]
    fn canary_goes_where_dst_may_already_hold_the_expected_bytes() {
        let mem = GuestMem::new(1 << 20).unwrap();
        let want: Vec<u8> = (0..40).collect();
        let want_sig = block_signature(&want);
        let word = |b: [u8; 4]| u32::from_le_bytes(b);
        assert_eq!(
            want_sig,
            vec![word([0, 1, 2, 3]), word([16, 17, 18, 19]), word([32, 33, 34, 35])]
        );
        // What the canaries leave in a buffer that held 0xEE everywhere,
        // when it is known to hold an output with signature `known`.
        let run = |known: Option<&[u32]>| {
            mem.fill(0x100, 48, 0xEE);
            canary_where_same(&mem, 0x100, known, &want_sig, want.len());
            let mut got = vec![0u8; 48];
            mem.read(0x100, &mut got);
            got
        };
        // The buffer with the canary in the (start, end) byte ranges.
        let blocks = |canaried: &[(usize, usize)]| {
            let mut v = vec![0xEE; 48];
            for &(a, b) in canaried {
                v[a..b].fill(DST_CANARY);
            }
            v
        };
        // Nothing known: the whole output, nothing past it.
        assert_eq!(run(None), blocks(&[(0, 40)]));
        // Different in every block: nothing.
        assert_eq!(run(Some(&[1, 2, 3])), blocks(&[]));
        // The same output: every block, the short last one too.
        assert_eq!(run(Some(&want_sig)), blocks(&[(0, 16), (16, 32), (32, 40)]));
        // Equal in the middle block only.
        assert_eq!(run(Some(&[1, want_sig[1], 3])), blocks(&[(16, 32)]));
        // A shorter known output: the blocks past its end are unknown.
        assert_eq!(run(Some(&[1])), blocks(&[(16, 32), (32, 40)]));
        // The signature tells blocks apart by their first 4 bytes; a short
        // last block is zero-padded.
        let mut other = want.clone();
        other[19] ^= 1;
        assert_ne!(block_signature(&other)[1], want_sig[1]);
        assert_eq!(block_signature(&[9, 8]), vec![word([9, 8, 0, 0])]);
    }

    #[test]
    fn a_last_block_of_under_4_bytes_counts_as_unknown() {
        let mem = GuestMem::new(1 << 20).unwrap();
        // The buffer holds a 32-byte output X; the expected output is 18
        // bytes: its first block unlike X's, its last 2 bytes X's bytes 16
        // and 17. The zero-padded word of those 2 bytes differs from X's
        // word, yet a backend that left them alone would look right: they
        // get the canary.
        let x: Vec<u8> = (100..132).collect();
        let mut want: Vec<u8> = (0..18).collect();
        want[16..].copy_from_slice(&x[16..18]);
        let (xs, ws) = (block_signature(&x), block_signature(&want));
        assert_ne!(xs[1], ws[1]);
        mem.write(0x100, &x);
        canary_where_same(&mem, 0x100, Some(known_sig(&xs, x.len())), &ws, want.len());
        let mut got = vec![0u8; 32];
        mem.read(0x100, &mut got);
        let mut expect = x.clone();
        expect[16..18].fill(DST_CANARY);
        assert_eq!(got, expect);
        // A buffer that held an 18-byte output Y and, after it, the tool's
        // guard (canary bytes): the expected 32-byte output's block 1 is
        // Y's last 2 bytes and the guard's 14. Y's padded word for that
        // block differs from the expected one; known_sig leaves it out, so
        // the block counts as unknown and gets the canary.
        let y: Vec<u8> = (200..218).collect();
        let mut want: Vec<u8> = (50..82).collect();
        want[16..18].copy_from_slice(&y[16..]);
        want[18..].fill(DST_CANARY);
        let (ys, ws) = (block_signature(&y), block_signature(&want));
        assert_ne!(ys[1], ws[1]);
        mem.write(0x100, &y);
        mem.fill(0x100 + 18, 16, DST_CANARY);
        canary_where_same(&mem, 0x100, Some(known_sig(&ys, y.len())), &ws, want.len());
        let mut got = vec![0u8; 32];
        mem.read(0x100, &mut got);
        assert_eq!(got[..16], y[..16]);
        assert_eq!(got[16..], [DST_CANARY; 16]);
        // A known output whose last block has under 4 bytes: that block is
        // unknown (the buffer's bytes past the output are not in the word).
        assert_eq!(known_sig(&[1, 2], 17), &[1]);
        assert_eq!(known_sig(&[1, 2], 18), &[1]);
        assert_eq!(known_sig(&[1, 2], 19), &[1]);
        assert_eq!(known_sig(&[1, 2], 20), &[1, 2]);
        assert_eq!(known_sig(&[1, 2], 32), &[1, 2]);
        assert_eq!(known_sig(&[], 0), &[] as &[u32]);
    }
}
