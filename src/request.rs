// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Descriptor-chain walking and request parsing.
//!
//! A virtio-crypto data request (VIRTIO 1.2 §5.9.7.2, protocol reference
//! §3.3) is two byte streams, whatever the descriptor layout:
//!
//! * device-readable: header (72 bytes) | IV (`iv_len`) | src (`src_data_len`) | …
//! * device-writable: dst (`dst_data_len`) | … | status (the **last** writable byte)
//!
//! An algorithm-chaining request (cipher + HMAC, spec §5.9.7.2.1
//! `virtio_crypto_alg_chain_data_vlf`) has the same readable stream (with
//! `aad_len` = 0, the only value accepted) and the digest after dst:
//!
//! * device-writable: dst (`dst_data_len`) | hash result (`hash_result_len`) | … | status
//!
//! [`ChainWalker::walk`] follows one descriptor chain (direct, or ending in
//! an indirect table), copying each descriptor out of guest memory once and
//! translating each non-empty buffer into host segments before anything is
//! written. [`prepare`] then validates the request against the bytes
//! actually present and runs the cipher directly on the mapped guest memory,
//! or hands a valid encrypt request back as a [`LaneReq`] for
//! [`run_lanes`] to encrypt together with others of the same key.
//!
//! Status policy (`hostile-guest-cases.md`): the first failing check decides,
//! in this order — header readable (else ERR if a status byte exists, else
//! the chain is consumed with used length 0) → opcode and op_type supported
//! (else NOTSUPP) → session known (else INVSESS) → everything else (ERR).

use std::ptr;

use algorithms::cipher::inout::InOutBuf;
use algorithms::{cbc_encrypt_multi, AesCbcKey, CbcStream, Direction, Lane, MacKey, MAX_LANES, MAX_MAC_LEN};
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, MemoryRegionAddress};

use crate::sessions::Sessions;
use crate::wire::{
    AlgChainPara, OpDataReq, Status, OP_DATA_REQ_SIZE, VIRTIO_CRYPTO_CIPHER_AES_CBC,
    VIRTIO_CRYPTO_CIPHER_DECRYPT, VIRTIO_CRYPTO_CIPHER_ENCRYPT, VIRTIO_CRYPTO_SYM_OP_ALGORITHM_CHAINING,
    VIRTIO_CRYPTO_SYM_OP_CIPHER,
};

/// Guest memory type used by the daemon (no dirty-page bitmap).
pub type GuestMemory_ = GuestMemoryMmap<()>;

/// `VRING_DESC_F_NEXT` (VIRTIO 1.2 §2.7.5).
pub const VRING_DESC_F_NEXT: u16 = 1;
/// `VRING_DESC_F_WRITE`.
pub const VRING_DESC_F_WRITE: u16 = 2;
/// `VRING_DESC_F_INDIRECT`.
pub const VRING_DESC_F_INDIRECT: u16 = 4;
/// Size of one split-ring descriptor.
pub const DESC_SIZE: usize = 16;
/// Largest queue size a split ring may have (VIRTIO 1.2 §2.7).
pub const MAX_QUEUE_SIZE: u16 = 32768;
/// Host segments kept per direction per request; a chain needing more is
/// malformed for this device (Linux uses a few dozen at most).
pub const MAX_SEGMENTS: usize = 1024;
/// AES-CBC IV length the device accepts.
pub const IV_LEN: u32 = 16;

/// A mapped piece of guest memory.
#[derive(Debug, Clone, Copy)]
pub struct Segment {
    ptr: *mut u8,
    len: usize,
}

/// A split-ring descriptor, copied out of guest memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Desc {
    /// Guest-physical buffer address.
    pub addr: u64,
    /// Buffer length in bytes.
    pub len: u32,
    /// `VRING_DESC_F_*` flags.
    pub flags: u16,
    /// Next descriptor index when `VRING_DESC_F_NEXT` is set.
    pub next: u16,
}

impl Desc {
    /// Decodes a descriptor from its 16 little-endian bytes.
    pub fn from_bytes(b: [u8; DESC_SIZE]) -> Self {
        Desc {
            addr: u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
            len: u32::from_le_bytes([b[8], b[9], b[10], b[11]]),
            flags: u16::from_le_bytes([b[12], b[13]]),
            next: u16::from_le_bytes([b[14], b[15]]),
        }
    }

    /// Encodes a descriptor (tests and the replay tool).
    pub fn to_bytes(&self) -> [u8; DESC_SIZE] {
        let mut b = [0u8; DESC_SIZE];
        b[0..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..12].copy_from_slice(&self.len.to_le_bytes());
        b[12..14].copy_from_slice(&self.flags.to_le_bytes());
        b[14..16].copy_from_slice(&self.next.to_le_bytes());
        b
    }
}

/// Why a chain is malformed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainFault {
    /// A `next` or head index outside the table.
    BadIndex,
    /// More descriptors than the table holds (a `next` loop).
    TooLong,
    /// An indirect descriptor inside an indirect table, or with NEXT set.
    BadIndirect,
    /// An indirect table of bad size or not mapped in one piece.
    BadIndirectTable,
    /// A device-readable descriptor after a device-writable one.
    ReadableAfterWritable,
    /// A buffer not (entirely) inside guest memory.
    Unmapped,
    /// More host segments than [`MAX_SEGMENTS`].
    TooManySegments,
}

/// Returns a host pointer to `len` bytes at `addr` when they lie in one
/// mapped region.
pub fn map_contiguous(mem: &GuestMemory_, addr: u64, len: usize) -> Option<*mut u8> {
    let region = mem.find_region(GuestAddress(addr))?;
    let off = addr - region.start_addr().0;
    let end = off.checked_add(len as u64)?;
    if end > region.len() {
        return None;
    }
    region.get_host_address(MemoryRegionAddress(off)).ok()
}

/// Scratch state for walking chains; allocated once per queue worker and
/// reused for every request (no allocation on the data path).
#[derive(Debug)]
pub struct ChainWalker {
    readable: Vec<Segment>,
    writable: Vec<Segment>,
    readable_len: u64,
    writable_len: u64,
    readable_ok: bool,
    writable_ok: bool,
    status: Option<*mut u8>,
    fault: Option<ChainFault>,
    seen_writable: bool,
    /// Descriptors the last walk read, plus the entries its indirect table
    /// declared ([`ChainWalker::descriptors`]).
    descriptors: u32,
    /// The guest-memory region the last translation found (start, length,
    /// host address of its start): buffers of one batch almost always lie
    /// in the same region, so most translations are a range check.
    /// Cleared by [`ChainWalker::begin_batch`] whenever the memory map may
    /// have changed.
    /// (An empty region, length 0, when none is cached.)
    region: (u64, u64, *mut u8),
}

// SAFETY: the raw pointers in a ChainWalker are only dereferenced while the
// guest-memory guard that produced them is held by the same call
// (`QueueWorker::process`); between requests they are stale values that are
// cleared before reuse, never dereferenced. Moving the walker between
// threads (it lives in a per-queue Mutex) is therefore sound.
unsafe impl Send for ChainWalker {}

impl Default for ChainWalker {
    fn default() -> Self {
        Self::new()
    }
}

impl ChainWalker {
    /// Allocates the segment arrays.
    pub fn new() -> Self {
        ChainWalker {
            readable: Vec::with_capacity(MAX_SEGMENTS),
            writable: Vec::with_capacity(MAX_SEGMENTS),
            readable_len: 0,
            writable_len: 0,
            readable_ok: true,
            writable_ok: true,
            status: None,
            fault: None,
            seen_writable: false,
            descriptors: 0,
            region: (0, 0, ptr::null_mut()),
        }
    }

    /// Forgets the cached region: call at the start of every batch, with
    /// the guest-memory guard the batch will hold.
    pub fn begin_batch(&mut self) {
        self.region = (0, 0, ptr::null_mut());
    }

    /// Translates `addr`: the host address and how many bytes from there
    /// lie in the same region (capped at `len`). Uses and refreshes the
    /// region cache.
    fn translate(&mut self, mem: &GuestMemory_, addr: u64, len: u64) -> Option<(*mut u8, u64)> {
        let (start, rlen, host) = self.region;
        // (Wraps to a huge offset below the region's start; never < 0 = an
        // empty region's length.)
        let off = addr.wrapping_sub(start);
        if off < rlen {
            // SAFETY: off < rlen: inside the region mapped at `host`, which
            // the batch's memory guard keeps mapped.
            return Some((unsafe { host.add(off as usize) }, len.min(rlen - off)));
        }
        let region = mem.find_region(GuestAddress(addr))?;
        let start = region.start_addr().0;
        let rlen = region.len();
        let host = region.get_host_address(MemoryRegionAddress(0)).ok()?;
        self.region = (start, rlen, host);
        let off = addr - start;
        // SAFETY: find_region returned the region holding addr, so off < rlen.
        Some((unsafe { host.add(off as usize) }, len.min(rlen - off)))
    }

    /// Host address of `len` bytes at `addr` when they lie in one region.
    fn map_contiguous_cached(&mut self, mem: &GuestMemory_, addr: u64, len: usize) -> Option<*mut u8> {
        let (p, n) = self.translate(mem, addr, len as u64)?;
        (n == len as u64).then_some(p)
    }

    fn reset(&mut self) {
        self.readable.clear();
        self.writable.clear();
        self.readable_len = 0;
        self.writable_len = 0;
        self.readable_ok = true;
        self.writable_ok = true;
        self.status = None;
        self.fault = None;
        self.seen_writable = false;
        self.descriptors = 0;
    }

    fn set_fault(&mut self, f: ChainFault) {
        if self.fault.is_none() {
            self.fault = Some(f);
        }
    }

    /// Walks the chain starting at `head` in the descriptor table at host
    /// address `table` holding `table_len` descriptors.
    ///
    /// # Safety
    /// `table` must point to `table_len * 16` mapped bytes that stay mapped
    /// while the walker's segments are used (the guest-memory guard is held),
    /// and `mem` must be the same memory map as in every walk since the last
    /// [`ChainWalker::begin_batch`] (the region cache holds its addresses).
    pub unsafe fn walk(&mut self, mem: &GuestMemory_, table: *const u8, table_len: u16, head: u16) {
        self.reset();
        let mut idx = head;
        let mut visited: u32 = 0;
        loop {
            if idx >= table_len {
                self.set_fault(ChainFault::BadIndex);
                return;
            }
            visited += 1;
            self.descriptors = visited;
            if visited > u32::from(table_len) {
                self.set_fault(ChainFault::TooLong);
                return;
            }
            // SAFETY: idx < table_len and the caller guarantees the table is mapped.
            let d = unsafe { read_desc(table, idx) };
            if d.flags & VRING_DESC_F_INDIRECT != 0 {
                if d.flags & VRING_DESC_F_NEXT != 0 {
                    self.set_fault(ChainFault::BadIndirect);
                    return;
                }
                self.walk_indirect(mem, d);
                return;
            }
            self.add_buffer(mem, d);
            if d.flags & VRING_DESC_F_NEXT == 0 {
                return;
            }
            idx = d.next;
        }
    }

    fn walk_indirect(&mut self, mem: &GuestMemory_, d: Desc) {
        let n = d.len as usize / DESC_SIZE;
        if d.len as usize % DESC_SIZE != 0 || n == 0 || n > usize::from(MAX_QUEUE_SIZE) {
            self.set_fault(ChainFault::BadIndirectTable);
            return;
        }
        // (n <= MAX_QUEUE_SIZE: no overflow.)
        self.descriptors += n as u32;
        let Some(table) = self.map_contiguous_cached(mem, d.addr, d.len as usize) else {
            self.set_fault(ChainFault::BadIndirectTable);
            return;
        };
        let mut idx: u16 = 0;
        for _ in 0..n {
            // SAFETY: idx < n (checked below) and the table was just mapped
            // for n descriptors.
            let e = unsafe { read_desc(table, idx) };
            if e.flags & VRING_DESC_F_INDIRECT != 0 {
                self.set_fault(ChainFault::BadIndirect);
                return;
            }
            self.add_buffer(mem, e);
            if e.flags & VRING_DESC_F_NEXT == 0 {
                return;
            }
            if usize::from(e.next) >= n {
                self.set_fault(ChainFault::BadIndex);
                return;
            }
            idx = e.next;
        }
        self.set_fault(ChainFault::TooLong);
    }

    /// Records one buffer: translates it (zero-length ones are skipped
    /// without translating), appends its segments to the readable or
    /// writable stream, and tracks where the status byte is.
    #[inline(always)]
    fn add_buffer(&mut self, mem: &GuestMemory_, d: Desc) {
        // A zero-length descriptor carries no bytes: it is skipped entirely,
        // whatever its address and direction flag (hostile-guest case H17).
        // Its flag must not decide the readable/writable order either, as a
        // zero-length writable one already did not.
        if d.len == 0 {
            return;
        }
        let write = d.flags & VRING_DESC_F_WRITE != 0;
        if !write && self.seen_writable {
            self.set_fault(ChainFault::ReadableAfterWritable);
        }
        if write {
            self.seen_writable = true;
            self.writable_len += u64::from(d.len);
            // The status byte is the last byte of the last non-empty writable
            // buffer: it moves with every new one.
            self.status = if !self.writable_ok {
                last_byte(mem, d)
            } else if let Some(p) = self.push_whole(d, true) {
                Some(p)
            } else {
                let before = self.writable.len();
                if self.push_segments(mem, d, true) {
                    self.writable.get(before..).and_then(|s| s.last()).map(|s| {
                        // SAFETY: the segment has len >= 1 bytes mapped.
                        unsafe { s.ptr.add(s.len - 1) }
                    })
                } else {
                    self.writable_ok = false;
                    last_byte(mem, d)
                }
            };
        } else {
            self.readable_len += u64::from(d.len);
            if self.readable_ok && self.push_whole(d, false).is_none() && !self.push_segments(mem, d, false) {
                self.readable_ok = false;
            }
        }
    }

    /// The usual case of [`ChainWalker::push_segments`]: the whole buffer
    /// (`d.len` >= 1) lies in the cached region and its list has room; then
    /// it is appended as one segment and its last byte returned. `None`:
    /// nothing was done.
    #[inline(always)]
    fn push_whole(&mut self, d: Desc, write: bool) -> Option<*mut u8> {
        let (start, rlen, host) = self.region;
        let off = d.addr.wrapping_sub(start);
        let len = u64::from(d.len);
        if off >= rlen || rlen - off < len {
            return None;
        }
        let list = if write {
            &mut self.writable
        } else {
            &mut self.readable
        };
        if list.len() == MAX_SEGMENTS {
            return None;
        }
        // SAFETY: off + len <= rlen: inside the region mapped at `host`,
        // which the batch's memory guard keeps mapped; len >= 1.
        let ptr = unsafe { host.add(off as usize) };
        list.push(Segment {
            ptr,
            len: d.len as usize,
        });
        // SAFETY: as above, the buffer's last byte.
        Some(unsafe { ptr.add(d.len as usize - 1) })
    }

    fn push_segments(&mut self, mem: &GuestMemory_, d: Desc, write: bool) -> bool {
        let mut addr = d.addr;
        let mut left = u64::from(d.len);
        while left > 0 {
            let Some((ptr, n)) = self.translate(mem, addr, left) else {
                self.set_fault(ChainFault::Unmapped);
                return false;
            };
            let list = if write {
                &mut self.writable
            } else {
                &mut self.readable
            };
            if list.len() == MAX_SEGMENTS {
                self.set_fault(ChainFault::TooManySegments);
                return false;
            }
            list.push(Segment { ptr, len: n as usize });
            addr = match addr.checked_add(n) {
                Some(a) => a,
                None if n == left => break,
                None => {
                    self.set_fault(ChainFault::Unmapped);
                    return false;
                }
            };
            left -= n;
        }
        true
    }

    /// Total device-readable bytes declared by the chain.
    pub fn readable_len(&self) -> u64 {
        self.readable_len
    }

    /// Total device-writable bytes declared by the chain.
    pub fn writable_len(&self) -> u64 {
        self.writable_len
    }

    /// How many descriptors the last walk read from the descriptor table,
    /// plus the number of entries its indirect table declared (read or
    /// not; drivers size their tables to the chain): an upper bound of
    /// what walking the chain cost, at most the queue size plus
    /// [`MAX_QUEUE_SIZE`]. A walk stops at its first structural fault.
    pub fn descriptors(&self) -> u32 {
        self.descriptors
    }

    /// The first structural or mapping fault, if any.
    pub fn fault(&self) -> Option<ChainFault> {
        self.fault
    }

    /// Whether a writable status byte was found and is mapped.
    pub fn has_status(&self) -> bool {
        self.status.is_some()
    }
}

fn last_byte(mem: &GuestMemory_, d: Desc) -> Option<*mut u8> {
    let a = d.addr.checked_add(u64::from(d.len) - 1)?;
    map_contiguous(mem, a, 1)
}

/// Reads descriptor `idx` of a mapped table, once.
///
/// # Safety
/// `table` must point to at least `(idx + 1) * 16` mapped bytes.
unsafe fn read_desc(table: *const u8, idx: u16) -> Desc {
    // SAFETY: in bounds per the contract.
    let p = unsafe { table.add(usize::from(idx) * DESC_SIZE) };
    // The guest may change the table at any time: the descriptor is read
    // once, with accesses the compiler may neither repeat nor tear into
    // something else (atomic or volatile), and only the copy is used.
    if p as usize % 8 == 0 {
        // SAFETY: 8-aligned and in bounds; relaxed atomic loads of guest
        // memory that the guest may write concurrently.
        let (a, b) = unsafe {
            (
                std::sync::atomic::AtomicU64::from_ptr(p as *mut u64)
                    .load(std::sync::atomic::Ordering::Relaxed),
                std::sync::atomic::AtomicU64::from_ptr(p.add(8) as *mut u64)
                    .load(std::sync::atomic::Ordering::Relaxed),
            )
        };
        // Little-endian fields: addr (u64), then len (u32), flags and next (u16).
        let b = u64::from_le(b);
        return Desc {
            addr: u64::from_le(a),
            len: b as u32,
            flags: (b >> 32) as u16,
            next: (b >> 48) as u16,
        };
    }
    // SAFETY: in bounds; an indirect table at an address that is not
    // 8-aligned (the spec does not require alignment for those).
    Desc::from_bytes(unsafe { ptr::read_volatile(p as *const [u8; DESC_SIZE]) })
}

/// Reads `buf.len()` bytes at `offset` of a segment stream into `buf`.
/// Returns false if the stream is too short.
fn gather(segs: &[Segment], offset: usize, buf: &mut [u8]) -> bool {
    Cursor::new(segs, offset).read(buf) == buf.len()
}

/// [`gather`] of a fixed-size field (header, IV) into `out`; false if the
/// stream is too short (`out` then holds a partial copy). When the `N`
/// bytes lie in one segment, as they almost always do, one fixed-size copy
/// the compiler inlines instead of a call to `memcpy`. (An out parameter,
/// not an `Option<[u8; N]>`: the IV's copy inside the option was re-read
/// at other offsets, a store-forwarding stall that cost ~6 ns a request.)
#[inline(always)]
fn gather_array<const N: usize>(c: Cursor<'_>, out: &mut [u8; N]) -> bool {
    let (p, n) = c.chunk();
    if n >= N && N % 8 == 0 && p as usize % 8 == 0 {
        // The guest may rewrite the field at any time: it is read once,
        // with loads the compiler may neither repeat nor replace by
        // re-reading guest memory later (relaxed atomics, as in
        // `read_desc`; a volatile copy went byte by byte, +28 % per
        // request), and only the copy is used.
        let word = |i: usize| {
            // SAFETY: p is mapped for n >= N bytes of a readable buffer
            // (see `Cursor::chunk`) and 8-aligned, and 8 * i + 8 <= N;
            // guest memory the guest may write concurrently.
            unsafe { std::sync::atomic::AtomicU64::from_ptr(p.add(8 * i) as *mut u64) }
                .load(std::sync::atomic::Ordering::Relaxed)
        };
        if let Ok(out) = <&mut [u8; 16]>::try_from(&mut out[..]) {
            // (N == 16.) The IV: written with one 16-byte store, because
            // it is read back as one 16-byte value right away, and a load
            // that spans two narrower stores is not forwarded from them
            // but waits for them to reach the cache (in a live profile,
            // `prepare` went from 17-19 % of the worker's samples to 11
            // %). The header's fields are read back one by one, each
            // inside one 8-byte store.
            store16(out, word(0), word(1));
        } else {
            for (i, w) in out.chunks_exact_mut(8).enumerate() {
                w.copy_from_slice(&word(i).to_ne_bytes());
            }
        }
        return true;
    }
    let mut c = c;
    c.read(out) == N
}

/// Writes the 16 bytes `lo`, `hi` (native byte order) into `out` with one
/// 16-byte store where the target has one.
#[inline(always)]
fn store16(out: &mut [u8; 16], lo: u64, hi: u64) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_set_epi64x, _mm_storeu_si128};
        // SAFETY: SSE2 is part of the x86_64 baseline; `out` is 16
        // writable bytes (its type), and the store has no alignment
        // requirement.
        unsafe {
            _mm_storeu_si128(
                out.as_mut_ptr() as *mut __m128i,
                _mm_set_epi64x(hi as i64, lo as i64),
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let (a, b) = out.split_at_mut(8);
        a.copy_from_slice(&lo.to_ne_bytes());
        b.copy_from_slice(&hi.to_ne_bytes());
    }
}

/// Writes `data` into a segment stream at `off` (the caller has checked
/// the stream is long enough).
fn scatter(segs: &[Segment], off: usize, data: &[u8]) {
    Cursor::new(segs, off).write(data);
}

/// Position in a segment stream.
#[derive(Clone, Copy)]
struct Cursor<'a> {
    segs: &'a [Segment],
    idx: usize,
    off: usize,
}

impl<'a> Cursor<'a> {
    /// The start of the stream (no segment is empty: zero-length
    /// descriptors are skipped, see [`ChainWalker::add_buffer`]).
    fn start(segs: &'a [Segment]) -> Self {
        debug_assert!(segs.first().is_none_or(|s| s.len > 0), "an empty segment");
        Cursor { segs, idx: 0, off: 0 }
    }

    fn new(segs: &'a [Segment], mut offset: usize) -> Self {
        let mut idx = 0;
        while idx < segs.len() && offset >= segs[idx].len {
            offset -= segs[idx].len;
            idx += 1;
        }
        Cursor {
            segs,
            idx,
            off: offset,
        }
    }

    /// The contiguous piece at the cursor: (pointer, bytes left in it).
    fn chunk(&self) -> (*mut u8, usize) {
        match self.segs.get(self.idx) {
            // SAFETY: off < len for the current segment.
            Some(s) => (unsafe { s.ptr.add(self.off) }, s.len - self.off),
            None => (ptr::null_mut(), 0),
        }
    }

    #[inline(always)]
    fn advance(&mut self, mut n: usize) {
        while n > 0 && self.idx < self.segs.len() {
            let left = self.segs[self.idx].len - self.off;
            if n < left {
                self.off += n;
                return;
            }
            n -= left;
            self.idx += 1;
            self.off = 0;
        }
    }

    /// Copies bytes out into `buf` until it is full or the stream ends;
    /// returns how many.
    fn read(&mut self, buf: &mut [u8]) -> usize {
        let mut done = 0;
        while done < buf.len() {
            let (p, n) = self.chunk();
            let n = n.min(buf.len() - done);
            if n == 0 {
                break;
            }
            // SAFETY: p is mapped for n bytes; buf is a distinct local buffer.
            unsafe { ptr::copy_nonoverlapping(p, buf[done..].as_mut_ptr(), n) };
            self.advance(n);
            done += n;
        }
        done
    }

    /// Copies `data` in until it is written or the stream ends; returns how
    /// many bytes were written.
    fn write(&mut self, data: &[u8]) -> usize {
        let mut done = 0;
        while done < data.len() {
            let (p, n) = self.chunk();
            let n = n.min(data.len() - done);
            if n == 0 {
                break;
            }
            // SAFETY: p is mapped for n bytes of a device-writable buffer;
            // data is a distinct local buffer.
            unsafe { ptr::copy_nonoverlapping(data[done..].as_ptr(), p, n) };
            self.advance(n);
            done += n;
        }
        done
    }
}

/// Runs the cipher from the readable stream at `src_off` into the writable
/// stream at `dst_off` for `len` bytes (a multiple of 16), in place on guest memory.
///
/// Where a source piece and a destination piece are both contiguous, the
/// cipher runs directly on them (same memory: in place; disjoint: buffer to
/// buffer). A block that straddles a descriptor or region boundary, or
/// source and destination pieces that partly overlap, go through a 16-byte
/// local block, read before it is written.
///
/// Source and destination that are the same bytes at the same stream
/// offsets (Linux's in-place requests, however the descriptors cut them)
/// give exact AES-CBC. Buffers that overlap at *different* offsets are not
/// a supported request: the result stays inside the request's writable
/// buffers, but output written early may be read back as later input, so
/// the bytes are not AES-CBC of the original source (the guest only harms
/// its own data; no driver sends this).
fn run_cipher(
    stream: &mut CbcStream,
    readable: &[Segment],
    src_off: usize,
    writable: &[Segment],
    dst_off: usize,
    len: usize,
) {
    let mut src = Cursor::new(readable, src_off);
    let mut dst = Cursor::new(writable, dst_off);
    let mut left = len;
    while left > 0 {
        let (sp, sl) = src.chunk();
        let (dp, dl) = dst.chunk();
        let n = sl.min(dl).min(left) & !15;
        let disjoint =
            (sp as usize).saturating_add(n) <= dp as usize || (dp as usize).saturating_add(n) <= sp as usize;
        if n >= 16 && (sp == dp || disjoint) {
            if sp == dp {
                // SAFETY: dp is mapped for n (≤ dl) bytes of a device-writable
                // buffer that stays mapped while the memory guard is held. No
                // other Rust reference to it exists; the guest may write it
                // concurrently, which can only change the output bytes.
                let data = unsafe { std::slice::from_raw_parts_mut(dp, n) };
                let _ = stream.process_in_place(data);
            } else {
                // SAFETY: as above for dst; src is mapped for n (≤ sl) bytes
                // and does not overlap dst (checked), so the shared and the
                // mutable slice do not alias.
                let (input, output) = unsafe {
                    (
                        std::slice::from_raw_parts(sp as *const u8, n),
                        std::slice::from_raw_parts_mut(dp, n),
                    )
                };
                let _ = stream.process_b2b(input, output);
            }
            src.advance(n);
            dst.advance(n);
            left -= n;
        } else {
            let mut blk = [0u8; 16];
            src.read(&mut blk);
            stream.process_block(&mut blk);
            dst.write(&blk);
            left -= 16;
        }
    }
}

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
    /// towards the batch byte cap ([`crate::queue::MAX_BATCH_BYTES`]): the
    /// used length alone would count a failed digest check over a large
    /// src as 1 byte.
    pub work: u64,
}

/// Limits applied to each request.
#[derive(Debug, Clone, Copy)]
pub struct RequestLimits {
    /// Largest `src_data_len` (= `dst_data_len`) accepted, in bytes.
    pub max_request_bytes: u32,
}

/// A validated encrypt request whose source and destination each lie in
/// one contiguous mapped piece (the same memory, or not overlapping), ready
/// to be encrypted together with others under the same key
/// ([`run_lanes`]). Holds host pointers into guest memory: only valid while
/// the guest-memory guard of the batch is held.
#[derive(Debug)]
pub struct LaneReq<'s> {
    /// The session's key schedule.
    pub key: &'s AesCbcKey,
    iv: [u8; 16],
    src: *const u8,
    dst: *mut u8,
    len: usize,
    status: *mut u8,
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

/// What [`prepare`] made of a request.
#[derive(Debug)]
pub enum Prepared<'s> {
    /// Completed (status written): an error, or a request run on its own.
    Done(Completion),
    /// A valid encrypt request to batch with others of the same key.
    Lane(LaneReq<'s>),
}

/// Validates the request whose chain `w` has just walked. Errors and
/// requests that cannot be batched are executed and completed here; with
/// `allow_lane`, a valid encrypt request whose buffers are contiguous is
/// returned as a [`LaneReq`] instead.
pub fn prepare<'s>(
    w: &ChainWalker,
    sessions: &'s Sessions,
    limits: RequestLimits,
    allow_lane: bool,
) -> Prepared<'s> {
    let v = match validate(w, sessions, limits) {
        Ok(v) => v,
        Err(status) => return Prepared::Done(complete(w, status, 0, 0)),
    };
    let src_off = OP_DATA_REQ_SIZE + IV_LEN as usize;
    if let Some(chain) = &v.chain {
        return Prepared::Done(run_chain(w, &v, chain));
    }
    if allow_lane && v.direction == Direction::Encrypt {
        let (sp, sl) = v.src.chunk();
        let (dp, dl) = Cursor::start(&w.writable).chunk();
        let disjoint = (sp as usize).saturating_add(v.len) <= dp as usize
            || (dp as usize).saturating_add(v.len) <= sp as usize;
        if let (true, Some(status)) = (sl >= v.len && dl >= v.len && (sp == dp || disjoint), w.status) {
            return Prepared::Lane(LaneReq {
                key: v.key,
                iv: v.iv,
                src: sp,
                dst: dp,
                len: v.len,
                status,
            });
        }
    }
    let mut stream = v.key.start(v.direction, &v.iv);
    run_cipher(&mut stream, &w.readable, src_off, &w.writable, 0, v.len);
    Prepared::Done(complete(w, Status::Ok, v.len as u32, v.len as u64))
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
/// own in [`prepare`], such as a decrypt, runs when it is reached, before
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

/// Writes `status` (when the chain has a status byte) and says what was
/// done: `written` bytes before the status byte, `work` bytes processed
/// ([`Completion::work`]).
fn complete(w: &ChainWalker, status: Status, written: u32, work: u64) -> Completion {
    match w.status {
        Some(p) => {
            // SAFETY: p points to the mapped last byte of a device-writable
            // buffer of this chain.
            unsafe { ptr::write_volatile(p, status as u8) };
            Completion {
                used_len: written + 1,
                status: Some(status),
                work,
            }
        }
        None => Completion {
            used_len: 0,
            status: None,
            work,
        },
    }
}

/// A request that passed every check.
struct Valid<'w, 's> {
    key: &'s AesCbcKey,
    direction: Direction,
    iv: [u8; 16],
    /// `src_data_len` = `dst_data_len`.
    len: usize,
    chain: Option<Chain<'s>>,
    /// Where src starts in the readable stream (after header and IV).
    src: Cursor<'w>,
}

/// The validated chaining part of a request: every range lies inside src
/// (offsets relative to src, in bytes).
struct Chain<'s> {
    mac: &'s MacKey,
    cipher_off: usize,
    cipher_len: usize,
    hash_off: usize,
    hash_len: usize,
    digest_len: usize,
}

fn validate<'w, 's>(
    w: &'w ChainWalker,
    sessions: &'s Sessions,
    limits: RequestLimits,
) -> Result<Valid<'w, 's>, Status> {
    // 1. Header readable: copied out once, everything below uses the copy.
    if w.status.is_none() {
        return Err(Status::Err);
    }
    let mut raw = [0u8; OP_DATA_REQ_SIZE];
    let mut at = Cursor::start(&w.readable);
    if !gather_array(at, &mut raw) {
        return Err(Status::Err);
    }
    let h = OpDataReq::from_bytes(&raw);

    // 2. Opcode, op_type and algorithm supported.
    let direction = match h.opcode {
        VIRTIO_CRYPTO_CIPHER_ENCRYPT => Direction::Encrypt,
        VIRTIO_CRYPTO_CIPHER_DECRYPT => Direction::Decrypt,
        _ => return Err(Status::NotSupp),
    };
    let chain_para = match h.op_type {
        VIRTIO_CRYPTO_SYM_OP_CIPHER => None,
        VIRTIO_CRYPTO_SYM_OP_ALGORITHM_CHAINING => Some(AlgChainPara::from_bytes(&raw)),
        _ => return Err(Status::NotSupp),
    };
    // AAD is not supported (QEMU and DPDK's guest driver put it before src,
    // the spec after it; no driver of this device's users sends any).
    if chain_para.is_some_and(|p| p.aad_len != 0) {
        return Err(Status::NotSupp);
    }
    // Linux leaves header.algo 0 for skcipher requests; the session decides
    // the algorithm. Any other value names an algorithm this device lacks.
    if h.algo != 0 && h.algo != VIRTIO_CRYPTO_CIPHER_AES_CBC {
        return Err(Status::NotSupp);
    }

    // 3. Session known.
    let session = sessions.get(h.session_id).ok_or(Status::InvSess)?;

    // 4. Everything else.
    if w.fault.is_some() || !w.readable_ok || !w.writable_ok {
        return Err(Status::Err);
    }
    if session.direction != direction
        || session.mac.is_some() != chain_para.is_some()
        || h.iv_len != IV_LEN
        || h.src_data_len != h.dst_data_len
        || h.src_data_len > limits.max_request_bytes
    {
        return Err(Status::Err);
    }
    let len = u64::from(h.src_data_len);
    let (chain, digest_len) = match (chain_para, &session.mac) {
        (Some(p), Some(mac)) => {
            let c = check_chain(&p, mac, len)?;
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
    let src_off = OP_DATA_REQ_SIZE as u64 + u64::from(IV_LEN);
    if w.readable_len < src_off + len || w.writable_len < len + digest_len + 1 {
        return Err(Status::Err);
    }
    let mut iv = [0u8; 16];
    at.advance(OP_DATA_REQ_SIZE);
    if !gather_array(at, &mut iv) {
        return Err(Status::Err);
    }
    at.advance(IV_LEN as usize);
    Ok(Valid {
        key: &session.key,
        direction,
        iv,
        len: len as usize,
        chain,
        src: at,
    })
}

/// Checks the chaining fields against src (`src_len` bytes) and the
/// session (an empty src, or empty cipher and hash ranges, are valid: a
/// MAC over an empty message is well defined, RFC 2104; unlike a plain
/// cipher request of 0 bytes, which has no output and gets ERR): both ranges inside src (sums in 64 bits, so no field can wrap
/// them), the cipher range whole AES blocks, and the request's
/// `hash_result_len` equal to the session's digest length (so never longer
/// than the hash). Any failure is ERR (DPDK's `vhost_crypto_check_chain_request`
/// class of checks, CVE-2020-14376; protocol reference §5.3).
fn check_chain<'s>(p: &AlgChainPara, mac: &'s MacKey, src_len: u64) -> Result<Chain<'s>, Status> {
    let cipher_end = u64::from(p.cipher_start_src_offset) + u64::from(p.len_to_cipher);
    let hash_end = u64::from(p.hash_start_src_offset) + u64::from(p.len_to_hash);
    if cipher_end > src_len
        || hash_end > src_len
        || p.len_to_cipher % 16 != 0
        || p.hash_result_len as usize != mac.digest_len()
    {
        return Err(Status::Err);
    }
    Ok(Chain {
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
///   (verify, as DPDK's vhost-crypto does); on a mismatch the request
///   completes with ERR and dst is not touched. Otherwise dst = src with
///   the cipher range decrypted.
///
/// dst bytes outside the cipher range carry the src bytes. Used length on
/// success is `dst_data_len + hash_result_len + 1` in both directions
/// (DPDK's convention); 1 on a digest mismatch.
fn run_chain(w: &ChainWalker, v: &Valid<'_, '_>, c: &Chain<'_>) -> Completion {
    let src_off = OP_DATA_REQ_SIZE + IV_LEN as usize;
    let mut digest = [0u8; MAX_MAC_LEN];
    let digest = &mut digest[..c.digest_len];
    if v.direction == Direction::Decrypt {
        let mut mac = c.mac.start();
        feed_mac(&mut mac, &w.readable, src_off + c.hash_off, c.hash_len);
        // The expected digest is read once into a local copy.
        if !gather(&w.writable, v.len, digest) || !mac.verify_truncated(digest) {
            return complete(w, Status::Err, 0, c.hash_len as u64);
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
    )
}

/// Feeds `len` bytes of a segment stream from `off` to a MAC.
fn feed_mac(mac: &mut algorithms::MacStream, segs: &[Segment], off: usize, len: usize) {
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
        unsafe { ptr::copy(sp, dp, n) };
        src.advance(n);
        dst.advance(n);
        left -= n;
    }
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
