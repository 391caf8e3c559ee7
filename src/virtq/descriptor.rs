// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Walking one descriptor chain (direct, or ending in an indirect table)
//! into host segments: each descriptor is copied out of guest memory once,
//! and each non-empty buffer is translated before anything is written
//! (VIRTIO 1.2 §2.7.5, §2.7.5.3).

use std::ptr;

use virtio_bindings::virtio_ring;
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, MemoryRegionAddress};

use super::map_contiguous;
use super::segments::Segment;
use crate::wire::split_ring::MAX_QUEUE_SIZE;

/// `VRING_DESC_F_NEXT` (VIRTIO 1.2 §2.7.5), as the descriptor's u16.
pub const VRING_DESC_F_NEXT: u16 = virtio_ring::VRING_DESC_F_NEXT as u16;
/// `VRING_DESC_F_WRITE`, as the descriptor's u16.
pub const VRING_DESC_F_WRITE: u16 = virtio_ring::VRING_DESC_F_WRITE as u16;
/// `VRING_DESC_F_INDIRECT`, as the descriptor's u16.
pub const VRING_DESC_F_INDIRECT: u16 = virtio_ring::VRING_DESC_F_INDIRECT as u16;

/// Size of one split-ring descriptor (`struct vring_desc`, VIRTIO 1.2
/// §2.7.5): addr u64, len u32, flags u16, next u16.
pub const DESC_SIZE: usize = 16;

/// Host segments kept per direction per request; a chain needing more is
/// malformed for this device (Linux uses a few dozen at most).
pub const MAX_SEGMENTS: usize = 1024;

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
    /// An indirect table of bad size or not (entirely) inside guest memory.
    BadIndirectTable,
    /// A device-readable descriptor after a device-writable one.
    ReadableAfterWritable,
    /// A buffer not (entirely) inside guest memory.
    Unmapped,
    /// More host segments than [`MAX_SEGMENTS`].
    TooManySegments,
}

/// Scratch state for walking chains; allocated once per queue worker and
/// reused for every request (no allocation on the data path).
#[derive(Debug)]
pub struct ChainWalker {
    pub(crate) readable: Vec<Segment>,
    pub(crate) writable: Vec<Segment>,
    pub(crate) readable_len: u64,
    pub(crate) writable_len: u64,
    pub(crate) readable_ok: bool,
    pub(crate) writable_ok: bool,
    pub(crate) status: Option<*mut u8>,
    pub(crate) fault: Option<ChainFault>,
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
    /// Where an indirect table that is not contiguous in the host mapping
    /// (it straddles the seam of two GPA-adjacent regions, each mapped on
    /// its own) is copied to be walked: room for the largest table the
    /// walker takes, [`MAX_QUEUE_SIZE`] entries (512 KiB), allocated once
    /// with the walker. Its pages are touched only by such tables.
    table_copy: Vec<u8>,
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
            // (Zeroed pages from the allocator: nothing is written here
            // until a table is copied.)
            table_copy: vec![0u8; usize::from(MAX_QUEUE_SIZE) * DESC_SIZE],
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
    fn translate(&mut self, mem: &GuestMemoryMmap, addr: u64, len: u64) -> Option<(*mut u8, u64)> {
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
    fn map_contiguous_cached(&mut self, mem: &GuestMemoryMmap, addr: u64, len: usize) -> Option<*mut u8> {
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
    pub unsafe fn walk(&mut self, mem: &GuestMemoryMmap, table: *const u8, table_len: u16, head: u16) {
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

    fn walk_indirect(&mut self, mem: &GuestMemoryMmap, d: Desc) {
        let n = d.len as usize / DESC_SIZE;
        if !(d.len as usize).is_multiple_of(DESC_SIZE) || n == 0 || n > usize::from(MAX_QUEUE_SIZE) {
            self.set_fault(ChainFault::BadIndirectTable);
            return;
        }
        // (n <= MAX_QUEUE_SIZE: no overflow.)
        self.descriptors += n as u32;
        let table = match self.map_contiguous_cached(mem, d.addr, d.len as usize) {
            Some(t) => t as *const u8,
            None if self.copy_table(mem, d.addr, d.len as usize) => self.table_copy.as_mut_ptr() as *const u8,
            None => {
                self.set_fault(ChainFault::BadIndirectTable);
                return;
            }
        };
        let mut idx: u16 = 0;
        for _ in 0..n {
            // SAFETY: idx < n (checked below) and the table was just mapped
            // (or copied into `table_copy`, which nothing else touches
            // during this loop) for n descriptors.
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

    /// Copies the indirect table of `len` bytes at `addr` (at most
    /// [`MAX_QUEUE_SIZE`] entries) into `table_copy`, region by region:
    /// for a table that does not lie in one region. False if part of it
    /// is outside guest memory. Each guest byte is read once; the walk
    /// reads only the copy.
    fn copy_table(&mut self, mem: &GuestMemoryMmap, addr: u64, len: usize) -> bool {
        if len > self.table_copy.len() {
            return false;
        }
        let mut at = addr;
        let mut done = 0;
        while done < len {
            let Some((p, n)) = self.translate(mem, at, (len - done) as u64) else {
                return false;
            };
            let n = n as usize;
            // SAFETY: `translate` found n <= len - done bytes mapped at p,
            // which the batch's memory guard keeps mapped; done + n <= len
            // <= table_copy.len(); guest memory never overlaps the heap.
            unsafe { ptr::copy_nonoverlapping(p, self.table_copy.as_mut_ptr().add(done), n) };
            done += n;
            let Some(next) = at.checked_add(n as u64) else {
                return done == len;
            };
            at = next;
        }
        true
    }

    /// Records one buffer: translates it (zero-length ones are skipped
    /// without translating), appends its segments to the readable or
    /// writable stream, and tracks where the status byte is.
    #[inline(always)]
    fn add_buffer(&mut self, mem: &GuestMemoryMmap, d: Desc) {
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

    fn push_segments(&mut self, mem: &GuestMemoryMmap, d: Desc, write: bool) -> bool {
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

fn last_byte(mem: &GuestMemoryMmap, d: Desc) -> Option<*mut u8> {
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
    if (p as usize).is_multiple_of(8) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_fields_at_spec_offsets() {
        // `struct virtq_desc` (VIRTIO 1.2 §2.7.5): le64 addr, le32 len,
        // le16 flags, le16 next; flag values of §2.7.5 (NEXT 1, WRITE 2,
        // INDIRECT 4).
        let b = [
            0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, 0x10, 0x20, 0x30, 0x40, 0x03, 0x00, 0x05, 0x01,
        ];
        let d = Desc::from_bytes(b);
        assert_eq!(
            d,
            Desc {
                addr: 0x1122_3344_5566_7788,
                len: 0x4030_2010,
                flags: 3,
                next: 0x0105,
            }
        );
        assert_eq!(
            (VRING_DESC_F_NEXT, VRING_DESC_F_WRITE, VRING_DESC_F_INDIRECT),
            (1, 2, 4)
        );
        assert_eq!(DESC_SIZE, 16);
    }

    #[test]
    fn aligned_and_unaligned_tables_read_the_same_descriptor() {
        // `read_desc` takes two 8-byte loads from an 8-aligned table and a
        // volatile 16-byte copy otherwise: both give the same fields.
        let mut buf = [0u8; 64];
        let bytes = [1u8, 0, 0, 0, 0, 0, 0, 0, 64, 0, 0, 0, 1, 0, 2, 0];
        let aligned = buf.as_ptr().align_offset(8);
        buf[aligned + 16..aligned + 32].copy_from_slice(&bytes);
        buf[aligned + 33..aligned + 49].copy_from_slice(&bytes);
        // SAFETY: both tables lie inside `buf` for two descriptors.
        let (a, u) = unsafe {
            (
                read_desc(buf.as_ptr().add(aligned), 1),
                read_desc(buf.as_ptr().add(aligned + 17), 1),
            )
        };
        let want = Desc {
            addr: 1,
            len: 64,
            flags: VRING_DESC_F_NEXT,
            next: 2,
        };
        assert_eq!((a, u), (want, want));
    }
}
