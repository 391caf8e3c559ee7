// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Multi-buffer lanes: valid encrypt requests of one batch under the same
//! key, encrypted together (`algorithms::cbc_encrypt_multi`).

use std::ptr;

use algorithms::cipher::inout::InOutBuf;
use algorithms::{cbc_encrypt_multi, AesCbcKey, Lane, MAX_LANES};

use crate::wire::virtio_crypto::Status;

use super::Completion;

/// A validated encrypt request whose source and destination each lie in
/// one contiguous mapped piece (the same memory, or not overlapping), ready
/// to be encrypted together with others under the same key
/// ([`run_lanes`]). Holds host pointers into guest memory: only valid while
/// the guest-memory guard of the batch is held.
#[derive(Debug)]
pub struct LaneReq<'s> {
    /// The session's key schedule.
    pub key: &'s AesCbcKey,
    pub(super) iv: [u8; 16],
    pub(super) src: *const u8,
    pub(super) dst: *mut u8,
    pub(super) len: usize,
    pub(super) status: *mut u8,
}

impl LaneReq<'_> {
    /// Most cache lines of each buffer [`LaneReq::prefetch`] asks for
    /// (longer buffers are sequential streams the hardware prefetches).
    pub const PREFETCH_LINES: usize = 16;

    /// Starts loading the request's src lines and taking ownership of its
    /// dst and status lines, so that by the time its group of lanes runs
    /// the lines the driver's CPU just wrote or read are on their way: the
    /// AES loop would otherwise stall on each of them in turn.
    pub fn prefetch(&self) {
        // Lines touched, counted from each buffer's first line (the
        // buffers need not be line aligned).
        let lines = |p: usize| ((p % 64) + self.len).div_ceil(64).min(Self::PREFETCH_LINES);
        let src = self.src.wrapping_sub(self.src as usize % 64);
        for i in 0..lines(self.src as usize) {
            prefetch_read(src.wrapping_add(64 * i));
        }
        let dst = self.dst.wrapping_sub(self.dst as usize % 64);
        for i in 0..lines(self.dst as usize) {
            prefetch_write(dst.wrapping_add(64 * i));
        }
        prefetch_write(self.status);
    }

    /// The completion once [`run_lanes`] has run it.
    pub fn completion(&self) -> Completion {
        Completion {
            used_len: self.len as u32 + 1,
            status: Some(Status::Ok),
            work: self.len as u64,
        }
    }
}

/// Encrypts the lanes (all under the same key, at most
/// [`algorithms::MAX_LANES`]) with multi-buffer AES-CBC and writes their OK
/// status bytes.
///
/// Lanes whose buffers overlap one another where one of them writes (a
/// guest that gives two requests of a batch the same or overlapping
/// bytes) are not run side by side: their slices would alias. They run one
/// at a time in avail order instead, each status written after its
/// request. (Only among the lanes: a request of the batch completed on its
/// own in [`super::prepare`], such as a decrypt, runs when it is reached, before
/// earlier lanes are flushed.)
pub fn run_lanes(lanes: &[Option<LaneReq<'_>>]) {
    let Some(key) = lanes.iter().flatten().next().map(|l| l.key) else {
        return;
    };
    if lanes_overlap(lanes) {
        for l in lanes.iter().flatten() {
            let mut one = [lane(l)];
            let _ = cbc_encrypt_multi(key, &mut one);
            // SAFETY: as below; the lane's slices are gone.
            unsafe { ptr::write_volatile(l.status, Status::Ok as u8) };
        }
        return;
    }
    // Only the first `used` entries are handed over: a group of fewer
    // than MAX_LANES (the end of a batch, a lone request at queue depth
    // 1) runs as that many lanes, and one request as a single stream.
    let mut multi: [Lane<'_>; MAX_LANES] = std::array::from_fn(|_| Lane {
        iv: [0; 16],
        buf: InOutBuf::from(<&mut [u8]>::default()),
    });
    let mut used = 0;
    for (m, l) in multi.iter_mut().zip(lanes.iter().flatten()) {
        used += 1;
        *m = lane(l);
    }
    // Lengths are whole blocks and there are at most MAX_LANES lanes.
    let _ = cbc_encrypt_multi(key, &mut multi[..used]);
    for l in lanes.iter().flatten() {
        // SAFETY: the status pointer is the mapped last writable byte of
        // this request's chain, outside its dst bytes; the lanes' slices
        // are gone (a status byte inside another request's buffers only
        // changes that request's output bytes).
        unsafe { ptr::write_volatile(l.status, Status::Ok as u8) };
    }
}

/// The multi-buffer lane of one request: its dst, and its src unless the
/// request is in place.
fn lane<'a>(l: &'a LaneReq<'_>) -> Lane<'a> {
    let buf = if std::ptr::eq(l.src, l.dst) {
        // SAFETY: dst is mapped for len bytes of device-writable guest
        // memory that the batch's memory guard keeps mapped, and no other
        // Rust reference to it exists while the lane runs: the lanes run
        // side by side only when none overlaps another where one writes
        // (`lanes_overlap`). The guest may write it concurrently, which
        // can only change its own output bytes.
        InOutBuf::from(unsafe { std::slice::from_raw_parts_mut(l.dst, l.len) })
    } else {
        // SAFETY: as above; src is mapped for len bytes and does not
        // overlap dst (checked in `prepare`).
        let (i, o) = unsafe {
            (
                std::slice::from_raw_parts(l.src, l.len),
                std::slice::from_raw_parts_mut(l.dst, l.len),
            )
        };
        // Same lengths by construction.
        InOutBuf::new(i, o).unwrap_or_else(|_| InOutBuf::from(<&mut [u8]>::default()))
    };
    Lane { iv: l.iv, buf }
}

/// Whether two of the lanes overlap where one of them writes: a dst with
/// the other's dst or src (srcs are only read, and may be shared).
fn lanes_overlap(lanes: &[Option<LaneReq<'_>>]) -> bool {
    let mut dst = [(0usize, 0usize); MAX_LANES];
    let mut src = [(0usize, 0usize); MAX_LANES];
    let mut n = 0;
    // The usual case first: each lane's buffers (from its lower start to
    // its higher end) lie after the previous lane's, as a driver that
    // fills its buffers in ring order lays them out; then no two lanes can
    // meet, at one compare per lane.
    let mut ascending = true;
    let mut prev_end = 0usize;
    for l in lanes.iter().flatten().take(MAX_LANES) {
        let d = (l.dst as usize, (l.dst as usize).saturating_add(l.len));
        let s = (l.src as usize, (l.src as usize).saturating_add(l.len));
        ascending &= prev_end <= d.0.min(s.0);
        prev_end = d.1.max(s.1);
        dst[n] = d;
        src[n] = s;
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
            hit |= meet(dst[i], dst[j]) | meet(dst[i], src[j]) | meet(src[i], dst[j]);
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
                    iv: [0; 16],
                    src: s as *const u8,
                    dst: d as *mut u8,
                    len: 64,
                    status: (d + 4096) as *mut u8,
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
}
