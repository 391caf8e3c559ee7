// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Multi-buffer lanes: valid requests of one batch under the same
//! session, run together. Encrypt requests, plain or with algorithm
//! chaining, take the multi-buffer AES-CBC lanes
//! (`algorithms::cbc_encrypt_multi`) and then, when chained, the
//! multi-buffer MAC (`algorithms::mac_multi`); chained decrypt requests
//! have their digests computed together, then each is decrypted. Plain
//! decrypt requests of up to [`LaneReq::DECRYPT_GATHER_MAX`] bytes are
//! decrypted one after the other: gathered, they have their lines
//! prefetched ([`LaneReq::prefetch`]) while the requests before them run.

use std::ptr;

use algorithms::cipher::inout::InOutBuf;
use algorithms::{
    cbc_encrypt_multi, mac_multi, AesCbcKey, Direction, Lane, MacJob, MacKey, MAX_LANES, MAX_MAC_LEN,
};

use crate::wire::virtio_crypto::Status;

use super::Completion;

/// A validated request whose source and destination each lie in one
/// contiguous mapped piece (the same memory, or not overlapping), ready to
/// run together with others of the same session ([`run_lanes`]). Holds
/// host pointers into guest memory: only valid while the guest-memory
/// guard of the batch is held.
#[derive(Debug)]
pub struct LaneReq<'s> {
    /// The session's key schedule.
    pub key: &'s AesCbcKey,
    pub(super) direction: Direction,
    pub(super) iv: [u8; 16],
    /// src: `len` bytes.
    pub(super) src: *const u8,
    /// dst: `len` bytes.
    pub(super) dst: *mut u8,
    /// `src_data_len` = `dst_data_len`, in bytes.
    pub(super) len: usize,
    /// The bytes ciphered: `cipher_len` from `cipher_off` (relative to
    /// src and dst); all of them for a plain request.
    pub(super) cipher_off: usize,
    pub(super) cipher_len: usize,
    /// The MAC of a chained request.
    pub(super) mac: Option<LaneMac<'s>>,
    pub(super) status: *mut u8,
    /// Set by [`run_lanes`]: false when a chained decrypt request's digest
    /// did not match.
    pub(super) verified: bool,
}

/// The MAC part of a chained [`LaneReq`]: the hashed range, relative to
/// dst (encrypt: computed after the cipher ran) or src (decrypt: checked
/// before it runs), and the hash result.
#[derive(Debug)]
pub(super) struct LaneMac<'s> {
    pub(super) key: &'s MacKey,
    /// The hash result: `key.digest_len()` mapped device-writable bytes.
    pub(super) digest: *mut u8,
    pub(super) hash_off: usize,
    pub(super) hash_len: usize,
}

impl LaneReq<'_> {
    /// Most cache lines of each buffer [`LaneReq::prefetch`] asks for
    /// (longer buffers are sequential streams the hardware prefetches).
    pub const PREFETCH_LINES: usize = 16;

    /// Longest plain decrypt request gathered as a lane, in bytes: the
    /// [`LaneReq::PREFETCH_LINES`] lines [`LaneReq::prefetch`] asks for
    /// (all of a buffer that starts on a line). Gathering 2 KiB requests
    /// measured 0.97–1.0 against running them inline (10 pairs), and
    /// inline they end a batch of large requests on its byte cap as each
    /// completes, not when a group of 16 has run.
    pub const DECRYPT_GATHER_MAX: usize = Self::PREFETCH_LINES * 64;

    /// Digest bytes after dst: 0 for a plain request.
    fn digest_len(&self) -> usize {
        self.mac.as_ref().map_or(0, |m| m.key.digest_len())
    }

    /// Starts loading the request's src lines and taking ownership of its
    /// dst and status lines, so that by the time its group of lanes runs
    /// the lines the driver's CPU just wrote or read are on their way: the
    /// AES loop would otherwise stall on each of them in turn.
    pub fn prefetch(&self) {
        // Lines touched, counted from each buffer's first line (the
        // buffers need not be line aligned).
        let lines = |p: usize, len: usize| ((p % 64) + len).div_ceil(64).min(Self::PREFETCH_LINES);
        let src = self.src.wrapping_sub(self.src as usize % 64);
        for i in 0..lines(self.src as usize, self.len) {
            prefetch_read(src.wrapping_add(64 * i));
        }
        let dst = self.dst.wrapping_sub(self.dst as usize % 64);
        for i in 0..lines(self.dst as usize, self.len) {
            prefetch_write(dst.wrapping_add(64 * i));
        }
        if let Some(m) = &self.mac {
            prefetch_write(m.digest);
        }
        prefetch_write(self.status);
    }

    /// The request's validated `src_data_len` ([`Completion::src_len`]).
    pub fn src_len(&self) -> u64 {
        self.len as u64
    }

    /// The completion once [`run_lanes`] has run it: used length
    /// `dst_data_len + hash_result_len + 1` and OK, or 1 and ERR on a
    /// digest mismatch (as `run_alg_chain` gives).
    pub fn completion(&self) -> Completion {
        let hashed = self.mac.as_ref().map_or(0, |m| m.hash_len) as u64;
        if self.verified {
            Completion {
                used_len: (self.len + self.digest_len()) as u32 + 1,
                status: Some(Status::Ok),
                work: self.len as u64 + hashed,
                src_len: self.len as u64,
            }
        } else {
            Completion {
                used_len: 1,
                status: Some(Status::Err),
                work: hashed,
                src_len: self.len as u64,
            }
        }
    }
}

/// Runs the lanes (all of one session, at most [`algorithms::MAX_LANES`])
/// and writes their status bytes; [`LaneReq::completion`] then tells
/// each one's used length.
///
/// Lanes whose buffers overlap one another where one of them writes (a
/// guest that gives two requests of a batch the same or overlapping
/// bytes) are not run side by side: their slices would alias. They run one
/// at a time in avail order instead, each status written after its
/// request. (Only among the lanes: a request of the batch completed on its
/// own in [`super::prepare`] runs when it is reached, before earlier lanes
/// are flushed.)
pub fn run_lanes(lanes: &mut [Option<LaneReq<'_>>]) {
    if lanes_overlap(lanes) {
        for l in lanes.iter_mut() {
            run_group(std::slice::from_mut(l));
        }
    } else {
        run_group(lanes);
    }
}

/// Runs lanes that do not overlap where one of them writes.
fn run_group(lanes: &mut [Option<LaneReq<'_>>]) {
    let Some(first) = lanes.iter().flatten().next() else {
        return;
    };
    let (key, direction) = (first.key, first.direction);
    // Only the first `used` entries are handed over: a group of fewer
    // than MAX_LANES (the end of a batch, a lone request at queue depth
    // 1) runs as that many lanes, and one request as a single stream.
    // The MAC key of the group (one session); plain lanes have none.
    let mac_key = first.mac.as_ref().map(|m| m.key);
    if direction == Direction::Encrypt {
        for l in lanes.iter().flatten() {
            copy_outside_cipher(l);
        }
        let encrypted = {
            let mut multi: [Lane<'_>; MAX_LANES] = std::array::from_fn(|_| Lane {
                iv: [0; 16],
                buf: InOutBuf::from(<&mut [u8]>::default()),
            });
            let mut used = 0;
            for (m, l) in multi.iter_mut().zip(lanes.iter().flatten()) {
                used += 1;
                *m = lane(l);
            }
            // Lengths are whole blocks and there are at most MAX_LANES
            // lanes, so it does not fail; if it did, the requests would
            // complete with ERR, not OK.
            cbc_encrypt_multi(key, &mut multi[..used]).is_ok()
        };
        for l in lanes.iter_mut().flatten() {
            l.verified = encrypted;
        }
        if let (Some(mac_key), true) = (mac_key, encrypted) {
            let mut jobs = mac_jobs(mac_key);
            let n = fill_mac_jobs(lanes, &mut jobs, |l| l.dst);
            mac_multi(&mut jobs[..n]);
            let with_mac = lanes.iter().flatten().filter_map(|l| l.mac.as_ref());
            for (m, j) in with_mac.zip(&jobs[..n]) {
                // SAFETY: the hash result is mapped for digest_len bytes of
                // device-writable memory (checked in `prepare`), and no
                // mutable slice of guest memory is alive (the jobs' data
                // slices are not read any more).
                unsafe { ptr::copy_nonoverlapping(j.tag.as_ptr(), m.digest, m.key.digest_len()) };
            }
        }
    } else if let Some(mac_key) = mac_key {
        // Chained decrypt requests: the digests first, all together, then
        // each request that matched.
        let mut jobs = mac_jobs(mac_key);
        let n = fill_mac_jobs(lanes, &mut jobs, |l| l.src);
        mac_multi(&mut jobs[..n]);
        // The tags move out of the jobs (which borrow the lanes); both
        // copies are zeroized.
        let mut tags = [[0u8; MAX_MAC_LEN]; MAX_LANES];
        for (t, j) in tags.iter_mut().zip(jobs[..n].iter_mut()) {
            *t = j.tag;
            zeroize::Zeroize::zeroize(&mut j.tag);
        }
        for (l, t) in lanes
            .iter_mut()
            .flatten()
            .filter(|l| l.mac.is_some())
            .zip(&tags[..n])
        {
            let (d, at) = (
                l.digest_len(),
                l.mac.as_ref().map_or(ptr::null_mut(), |m| m.digest),
            );
            // The expected digest, read once into a local copy.
            let mut expected = [0u8; MAX_MAC_LEN];
            // SAFETY: the hash result is mapped for d bytes (checked in
            // `prepare`); no slice of it is alive.
            unsafe { ptr::copy_nonoverlapping(at, expected.as_mut_ptr(), d) };
            l.verified = mac_key.verify_tag(t, &expected[..d]);
            if l.verified {
                copy_outside_cipher(l);
                let mut one = lane(l);
                // Whole blocks: it does not fail (ERR if it did).
                l.verified = key
                    .start(Direction::Decrypt, &one.iv)
                    .process_inout(one.buf.reborrow())
                    .is_ok();
            }
        }
        zeroize::Zeroize::zeroize(&mut tags);
    } else {
        // Plain decrypt requests: one after the other (CBC decryption is
        // parallel within a request), their lines prefetched as they were
        // gathered.
        for l in lanes.iter_mut().flatten() {
            let mut one = lane(l);
            // Whole blocks: it does not fail (ERR if it did).
            l.verified = key
                .start(Direction::Decrypt, &one.iv)
                .process_inout(one.buf.reborrow())
                .is_ok();
        }
    }
    for l in lanes.iter().flatten() {
        let s = if l.verified { Status::Ok } else { Status::Err };
        // SAFETY: the status pointer is the mapped last writable byte of
        // this request's chain, written through a raw pointer after every
        // lane's slices are gone (a status byte that a guest made alias
        // some request's buffers only changes that request's output).
        unsafe { ptr::write_volatile(l.status, s as u8) };
    }
}

// Every lane of a group can be chained.
const _: () = assert!(algorithms::MAX_MAC_LANES >= MAX_LANES);

/// MAC jobs for up to [`MAX_LANES`] lanes under `key`, empty.
fn mac_jobs(key: &MacKey) -> [MacJob<'_>; MAX_LANES] {
    std::array::from_fn(|_| MacJob {
        key,
        data: &[],
        tag: [0; MAX_MAC_LEN],
    })
}

/// Fills the first jobs with the MAC of each chained lane over its hash
/// range of the buffer `base` picks (src or dst), in lane order; returns
/// how many.
fn fill_mac_jobs<'a>(
    lanes: &'a [Option<LaneReq<'_>>],
    jobs: &mut [MacJob<'a>; MAX_LANES],
    base: impl Fn(&LaneReq<'_>) -> *const u8,
) -> usize {
    let mut n = 0;
    let with_mac = lanes.iter().flatten().filter_map(|l| Some((l, l.mac.as_ref()?)));
    for (j, (l, m)) in jobs.iter_mut().zip(with_mac) {
        // SAFETY: the hash range lies inside src and dst (checked by
        // `check_alg_chain`), both mapped while the memory guard is held;
        // no mutable slice of them is alive while the jobs run. The guest
        // may change them concurrently, which only changes its own digest.
        let data = unsafe { std::slice::from_raw_parts(base(l).add(m.hash_off), m.hash_len) };
        *j = MacJob {
            key: m.key,
            data,
            tag: [0; MAX_MAC_LEN],
        };
        n += 1;
    }
    n
}

/// Copies src to dst outside the cipher range (nothing when in place).
fn copy_outside_cipher(l: &LaneReq<'_>) {
    if ptr::eq(l.src, l.dst) {
        return;
    }
    let end = l.cipher_off + l.cipher_len;
    // SAFETY: src and dst are mapped for len bytes each and do not overlap
    // (checked in `prepare`); no slice of them is alive.
    unsafe {
        ptr::copy_nonoverlapping(l.src, l.dst, l.cipher_off);
        ptr::copy_nonoverlapping(l.src.add(end), l.dst.add(end), l.len - end);
    }
}

/// The multi-buffer lane of one request's cipher range: in dst, from src
/// unless the request is in place.
fn lane<'a>(l: &'a LaneReq<'_>) -> Lane<'a> {
    // (Offsets inside len, checked by `check_alg_chain`.)
    let (src, dst) = (l.src.wrapping_add(l.cipher_off), l.dst.wrapping_add(l.cipher_off));
    let buf = if std::ptr::eq(src, dst) {
        // SAFETY: dst is mapped for len bytes of device-writable guest
        // memory that the batch's memory guard keeps mapped, and no other
        // Rust reference to it exists while the lane runs: the lanes run
        // side by side only when none overlaps another where one writes
        // (`lanes_overlap`). The guest may write it concurrently, which
        // can only change its own output bytes.
        InOutBuf::from(unsafe { std::slice::from_raw_parts_mut(dst, l.cipher_len) })
    } else {
        // SAFETY: as above; src is mapped for len bytes and does not
        // overlap dst (checked in `prepare`).
        let (i, o) = unsafe {
            (
                std::slice::from_raw_parts(src, l.cipher_len),
                std::slice::from_raw_parts_mut(dst, l.cipher_len),
            )
        };
        // Same lengths by construction.
        InOutBuf::new(i, o).unwrap_or_else(|_| InOutBuf::from(<&mut [u8]>::default()))
    };
    Lane { iv: l.iv, buf }
}

/// Whether two of the lanes overlap where one of them writes: a dst or
/// hash result with the other's src, dst or hash result (srcs are only
/// read, and may be shared).
fn lanes_overlap(lanes: &[Option<LaneReq<'_>>]) -> bool {
    // Per lane: src (read), dst and hash result (written); an empty range
    // for a plain request's hash result.
    let mut src = [(0usize, 0usize); MAX_LANES];
    let mut dst = [(0usize, 0usize); MAX_LANES];
    let mut digest = [(0usize, 0usize); MAX_LANES];
    let mut n = 0;
    // The usual case first: each lane's buffers (from its lowest start to
    // its highest end) lie after the previous lane's, as a driver that
    // fills its buffers in ring order lays them out; then no two lanes can
    // meet, at one compare per lane.
    let mut ascending = true;
    let mut prev_end = 0usize;
    let span = |p: usize, len: usize| (p, p.saturating_add(len));
    for l in lanes.iter().flatten().take(MAX_LANES) {
        let s = span(l.src as usize, l.len);
        let d = span(l.dst as usize, l.len);
        let g = l
            .mac
            .as_ref()
            .map_or((d.1, d.1), |m| span(m.digest as usize, m.key.digest_len()));
        ascending &= prev_end <= s.0.min(d.0).min(g.0);
        prev_end = s.1.max(d.1).max(g.1);
        (src[n], dst[n], digest[n]) = (s, d, g);
        n += 1;
    }
    if ascending {
        return false;
    }
    let meet = |a: (usize, usize), b: (usize, usize)| a.0 < b.1 && b.0 < a.1;
    let mut hit = false;
    for i in 0..n {
        for j in i + 1..n {
            // (`|` rather than `||`: no branch per check.)
            for (a, b) in [(i, j), (j, i)] {
                hit |= meet(dst[a], dst[b]) | meet(dst[a], src[b]) | meet(digest[a], src[b]);
                hit |= meet(digest[a], dst[b]) | meet(digest[a], digest[b]);
            }
        }
    }
    hit
}

/// A hint to load the line holding `p` (`PREFETCHT0`); never faults, so
/// any address may be given (nothing is read architecturally).
#[inline(always)]
pub fn prefetch_read(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 only hints the cache; it reads nothing and does
    // not fault, whatever the address (Intel SDM vol. 2, PREFETCHh).
    unsafe {
        std::arch::asm!("prefetcht0 byte ptr [{0}]", in(reg) p, options(nostack, preserves_flags, readonly));
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// A hint to take the line holding `p` for writing (`PREFETCHW`, a NOP on
/// CPUs without it); never faults.
#[inline(always)]
pub fn prefetch_write(p: *mut u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHW only hints the cache; it writes nothing and does
    // not fault, whatever the address (Intel SDM vol. 2, PREFETCHW).
    unsafe {
        std::arch::asm!("prefetchw byte ptr [{0}]", in(reg) p, options(nostack, preserves_flags, readonly));
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lanes at fake addresses (never dereferenced): (src, dst) pairs of
    /// 64-byte buffers.
    fn lanes<'k>(key: &'k AesCbcKey, bufs: &[(usize, usize)]) -> Vec<Option<LaneReq<'k>>> {
        bufs.iter()
            .map(|&(s, d)| {
                Some(LaneReq {
                    key,
                    direction: Direction::Encrypt,
                    iv: [0; 16],
                    src: s as *const u8,
                    dst: d as *mut u8,
                    len: 64,
                    cipher_off: 0,
                    cipher_len: 64,
                    mac: None,
                    status: (d + 4096) as *mut u8,
                    verified: false,
                })
            })
            .collect()
    }

    #[test]
    fn lanes_overlap_only_where_one_of_them_writes() {
        let key = AesCbcKey::new(&[7; 16]).unwrap();
        let k = 0x10000;
        // (what, (src, dst) of each lane, whether they overlap)
        type Case = (&'static str, Vec<(usize, usize)>, bool);
        let cases: [Case; 8] = [
            (
                "ascending, apart",
                vec![(k, k + 64), (k + 128, k + 192), (k + 256, k + 320)],
                false,
            ),
            (
                "descending, apart",
                vec![(k + 256, k + 320), (k + 128, k + 192), (k, k + 64)],
                false,
            ),
            (
                "src far from dst, interleaved, apart",
                vec![(k, k + 4096), (k + 64, k + 4160)],
                false,
            ),
            ("one src read by two", vec![(k, k + 4096), (k, k + 8192)], false),
            (
                "dst is the other's src",
                vec![(k, k + 4096), (k + 4096, k + 8192)],
                true,
            ),
            (
                "dsts meet by one byte",
                vec![(k, k + 4096), (k + 128, k + 4096 + 63)],
                true,
            ),
            (
                "in place, the same bytes",
                vec![(k, k), (k + 4096, k + 4096), (k, k)],
                true,
            ),
            (
                "src meets a later dst",
                vec![(k, k + 4096), (k + 8192, k + 32)],
                true,
            ),
        ];
        for (what, bufs, want) in cases {
            assert_eq!(lanes_overlap(&lanes(&key, &bufs)), want, "{what}");
        }
        // Empty slots in the group are skipped.
        let mut l = lanes(&key, &[(k, k + 4096), (k + 4096, k + 8192)]);
        l.insert(1, None);
        assert!(lanes_overlap(&l));
        assert!(!lanes_overlap(&[None, None]));
    }

    /// AlgChain lanes at fake addresses: (src, dst, hash result) of
    /// 64-byte buffers with a 12-byte digest.
    fn alg_chain_lanes<'k>(
        key: &'k AesCbcKey,
        mac: &'k MacKey,
        bufs: &[(usize, usize, usize)],
    ) -> Vec<Option<LaneReq<'k>>> {
        let plain = lanes(key, &bufs.iter().map(|&(s, d, _)| (s, d)).collect::<Vec<_>>());
        plain
            .into_iter()
            .zip(bufs)
            .map(|(l, &(_, _, g))| {
                let mut l = l.expect("a lane");
                l.mac = Some(LaneMac {
                    key: mac,
                    digest: g as *mut u8,
                    hash_off: 0,
                    hash_len: 64,
                });
                Some(l)
            })
            .collect()
    }

    #[test]
    fn lanes_overlap_where_a_hash_result_meets_another_lane() {
        let key = AesCbcKey::new(&[7; 16]).unwrap();
        let mac = MacKey::new(algorithms::MacAlg::HmacSha1, &[9; 20], 12).unwrap();
        let k = 0x10000;
        // (what, (src, dst, hash result) of each lane, whether they overlap)
        type Case = (&'static str, Vec<(usize, usize, usize)>, bool);
        let cases: [Case; 7] = [
            (
                "ascending, each digest after its dst",
                vec![(k, k, k + 64), (k + 128, k + 128, k + 192)],
                false,
            ),
            (
                "descending, apart",
                vec![(k + 128, k + 128, k + 192), (k, k, k + 64)],
                false,
            ),
            (
                "a digest is the other lane's src",
                vec![(k + 4096, k + 8192, k), (k, k + 128, k + 200)],
                true,
            ),
            (
                "the same digest twice",
                vec![(k + 4096, k + 4096, k), (k + 8192, k + 8192, k)],
                true,
            ),
            (
                "a digest inside the other lane's dst",
                vec![(k + 4096, k + 4096, k + 8192 + 20), (k, k + 8192, k + 300)],
                true,
            ),
            (
                "a digest meets the other digest by one byte",
                vec![(k + 4096, k + 4096, k + 11), (k + 8192, k + 8192, k)],
                true,
            ),
            (
                "a digest just after the other lane's dst",
                vec![(k + 4096, k + 4096, k + 8192 + 64), (k, k + 8192, k + 300)],
                false,
            ),
        ];
        for (what, bufs, want) in cases {
            assert_eq!(lanes_overlap(&alg_chain_lanes(&key, &mac, &bufs)), want, "{what}");
        }
    }
}
