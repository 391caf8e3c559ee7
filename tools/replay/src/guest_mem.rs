// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! memfd-backed "guest" memory shared with the backend through
//! `SET_MEM_TABLE`: one region at guest-physical address 0. Like QEMU's
//! `memory-backend-memfd` (default `seal=on`), the memfd is sealed against
//! shrinking and growing once sized, so the backend can trust its size.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::{AtomicU16, Ordering};

use vhost::VhostUserMemoryRegionInfo;

/// A shared memory region mapped into this process.
pub struct GuestMem {
    file: File,
    ptr: *mut u8,
    size: usize,
}

// SAFETY: the mapping is plain shared memory owned by this struct for its
// whole life; all access goes through bounds-checked methods.
unsafe impl Send for GuestMem {}
// SAFETY: as above; concurrent accesses are byte copies or atomics.
unsafe impl Sync for GuestMem {}

impl GuestMem {
    /// Creates and maps `size` bytes of memfd memory, sealed with
    /// `F_SEAL_SHRINK | F_SEAL_GROW` (memfd_create(2), fcntl(2) "File
    /// sealing").
    ///
    /// # Errors
    /// memfd_create, ftruncate, fcntl or mmap failed.
    pub fn new(size: usize) -> io::Result<Self> {
        // SAFETY: the name is a valid NUL-terminated string.
        let fd = unsafe {
            libc::memfd_create(
                c"vhost-crypto-replay".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor we own.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(size as u64)?;
        // SAFETY: fcntl(F_ADD_SEALS) with an int argument on a descriptor
        // we own; it touches no memory.
        let sealed = unsafe {
            libc::fcntl(
                file.as_raw_fd(),
                libc::F_ADD_SEALS,
                libc::F_SEAL_SHRINK | libc::F_SEAL_GROW,
            )
        };
        if sealed < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: mapping a file we own, shared, with a valid length; the
        // result is checked against MAP_FAILED.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(GuestMem {
            file,
            ptr: ptr.cast(),
            size,
        })
    }

    /// Size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The memfd behind the memory.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The region as `SET_MEM_TABLE` describes it (userspace address = our mapping).
    pub fn region_info(&self) -> VhostUserMemoryRegionInfo {
        VhostUserMemoryRegionInfo {
            guest_phys_addr: 0,
            memory_size: self.size as u64,
            userspace_addr: self.ptr as u64,
            mmap_offset: 0,
            mmap_handle: self.file.as_raw_fd(),
        }
    }

    /// Our virtual address of guest address `gpa` (for `SET_VRING_ADDR`).
    pub fn va(&self, gpa: u64) -> u64 {
        self.ptr as u64 + gpa
    }

    fn check(&self, gpa: u64, len: usize) -> usize {
        let off = usize::try_from(gpa).expect("gpa fits usize");
        assert!(
            off.checked_add(len).is_some_and(|e| e <= self.size),
            "guest access out of range"
        );
        off
    }

    /// Writes bytes at `gpa`.
    pub fn write(&self, gpa: u64, data: &[u8]) {
        let off = self.check(gpa, data.len());
        // SAFETY: in bounds (checked); the source is a distinct buffer.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(off), data.len()) };
    }

    /// Writes `data` at `gpa` unless the bytes there are already equal
    /// (descriptors and headers that a slot reuses: an unchanged cache line
    /// stays shared with the backend's CPU instead of bouncing to ours).
    pub fn write_if_changed(&self, gpa: u64, data: &[u8]) {
        let off = self.check(gpa, data.len());
        // SAFETY: in bounds (checked). Used for driver-owned bytes only
        // (descriptors, avail entries, request headers), which the backend
        // never writes.
        let cur = unsafe { std::slice::from_raw_parts(self.ptr.add(off), data.len()) };
        if cur != data {
            self.write(gpa, data);
        }
    }

    /// [`GuestMem::write_if_changed`] for an array whose length is a
    /// multiple of 8 (a request header): compared 8 bytes at a time
    /// inline rather than through a call to memcmp.
    pub fn write_array_if_changed<const N: usize>(&self, gpa: u64, data: &[u8; N]) {
        const { assert!(N.is_multiple_of(8)) };
        let cur = self.view(gpa, N);
        let word = |b: &[u8]| u64::from_ne_bytes(b.try_into().unwrap_or([0; 8]));
        let differ = cur
            .chunks_exact(8)
            .zip(data.chunks_exact(8))
            .fold(0, |acc, (a, b)| acc | (word(a) ^ word(b)));
        if differ != 0 {
            self.write(gpa, data);
        }
    }

    /// The `len` bytes at `gpa`, in place. For a completed request's
    /// output: the backend wrote it before it put the request on the used
    /// ring and has no reason to write it again (if it did, only this
    /// tool's comparison would see the bytes change).
    pub fn view(&self, gpa: u64, len: usize) -> &[u8] {
        let off = self.check(gpa, len);
        // SAFETY: in bounds (checked) of the mapping, which lives as long
        // as `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.add(off), len) }
    }

    /// Starts loading the cache lines of the `len` bytes at `gpa` (at
    /// most [`PREFETCH_MAX`] bytes; a hint only).
    pub fn prefetch(&self, gpa: u64, len: usize) {
        for line in self.lines(gpa, len) {
            prefetch_read(line as *const u8);
        }
    }

    /// Starts taking the cache lines of the `len` bytes at `gpa` for
    /// writing (`PREFETCHW`; at most [`PREFETCH_MAX`] bytes; a hint only).
    pub fn prefetch_write(&self, gpa: u64, len: usize) {
        for line in self.lines(gpa, len) {
            prefetch_write(line as *const u8);
        }
    }

    /// [`GuestMem::prefetch`] of the one byte at `gpa`: its cache line,
    /// without the line loop.
    pub fn prefetch_byte(&self, gpa: u64) {
        let off = self.check(gpa, 1);
        prefetch_read(self.ptr.wrapping_add(off));
    }

    /// [`GuestMem::prefetch_write`] of the one byte at `gpa`: its cache
    /// line, without the line loop.
    pub fn prefetch_write_byte(&self, gpa: u64) {
        let off = self.check(gpa, 1);
        prefetch_write(self.ptr.wrapping_add(off));
    }

    /// Host addresses of the cache lines the `len` bytes at `gpa` touch
    /// (at most [`PREFETCH_MAX`] bytes of them; checked to be in range).
    fn lines(&self, gpa: u64, len: usize) -> impl Iterator<Item = usize> {
        let len = len.min(PREFETCH_MAX);
        let off = self.check(gpa, len);
        // SAFETY: in bounds (checked); only the address is formed.
        line_starts(unsafe { self.ptr.add(off) } as usize, len)
    }

    /// Reads bytes at `gpa`.
    pub fn read(&self, gpa: u64, buf: &mut [u8]) {
        let off = self.check(gpa, buf.len());
        // SAFETY: in bounds (checked); the destination is a distinct buffer.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(off), buf.as_mut_ptr(), buf.len()) };
    }

    /// Fills `len` bytes at `gpa` with `byte`.
    pub fn fill(&self, gpa: u64, len: usize, byte: u8) {
        let off = self.check(gpa, len);
        // SAFETY: in bounds (checked).
        unsafe { std::ptr::write_bytes(self.ptr.add(off), byte, len) };
    }

    /// Reads one byte.
    pub fn read_u8(&self, gpa: u64) -> u8 {
        let mut b = [0u8];
        self.read(gpa, &mut b);
        b[0]
    }

    /// Reads a little-endian u32.
    pub fn read_u32(&self, gpa: u64) -> u32 {
        let mut b = [0u8; 4];
        self.read(gpa, &mut b);
        u32::from_le_bytes(b)
    }

    /// Writes a little-endian u16 (plain store).
    pub fn write_u16(&self, gpa: u64, v: u16) {
        self.write(gpa, &v.to_le_bytes());
    }

    fn atomic_u16(&self, gpa: u64) -> &AtomicU16 {
        assert!(gpa.is_multiple_of(2), "unaligned ring index");
        let off = self.check(gpa, 2);
        // SAFETY: in bounds and 2-aligned (mmap is page aligned); the memory
        // lives as long as self.
        unsafe { AtomicU16::from_ptr(self.ptr.add(off).cast()) }
    }

    /// Loads a ring index with Acquire ordering.
    pub fn load_u16_acquire(&self, gpa: u64) -> u16 {
        u16::from_le(self.atomic_u16(gpa).load(Ordering::Acquire))
    }

    /// Stores a ring index with Release ordering.
    pub fn store_u16_release(&self, gpa: u64, v: u16) {
        self.atomic_u16(gpa).store(v.to_le(), Ordering::Release);
    }
}

/// A hint to load the cache line holding `p` (`PREFETCHT0`).
#[inline(always)]
fn prefetch_read(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 only hints the cache: it reads nothing
    // architecturally and does not fault, whatever the address (Intel SDM
    // vol. 2, "PREFETCHh").
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// A hint to take the cache line holding `p` for writing (`PREFETCHW`, a
/// NOP on CPUs without it). `core::arch` has no stable intrinsic for it
/// (`_MM_HINT_ET0` becomes `PREFETCHT0` unless the build enables
/// `prfchw`), hence the one instruction of assembly.
#[inline(always)]
fn prefetch_write(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHW only hints the cache: it writes nothing and does
    // not fault, whatever the address (Intel SDM vol. 2, "PREFETCHW").
    unsafe {
        std::arch::asm!("prefetchw byte ptr [{0}]", in(reg) p, options(nostack, preserves_flags, readonly));
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Most bytes one prefetch call asks for (longer buffers are streams the
/// hardware prefetcher follows).
pub const PREFETCH_MAX: usize = 1024;

/// Starts loading the cache lines of `bytes` (at most [`PREFETCH_MAX`]
/// bytes; `PREFETCHT0`, a hint that never faults).
pub fn prefetch(bytes: &[u8]) {
    for line in line_starts(bytes.as_ptr() as usize, bytes.len()) {
        prefetch_read(line as *const u8);
    }
}

/// Starts taking the cache lines of `bytes` for writing (at most
/// [`PREFETCH_MAX`] bytes; `PREFETCHW`, a hint that never faults).
pub fn prefetch_for_write(bytes: &[u8]) {
    for line in line_starts(bytes.as_ptr() as usize, bytes.len()) {
        prefetch_write(line as *const u8);
    }
}

/// The start address of every 64-byte cache line that the first
/// `min(len, PREFETCH_MAX)` bytes at address `p` touch (none when `len` is
/// 0), counted from `p`'s own line, so an unaligned buffer gets its last
/// line too.
fn line_starts(p: usize, len: usize) -> impl Iterator<Item = usize> {
    let end = p + len.min(PREFETCH_MAX);
    let first = if len == 0 { end } else { p & !63 };
    LineStarts { next: first, end }
}

/// `(next..end).step_by(64)` as a plain compare-and-add loop (`StepBy`
/// first works out how many steps there are, on every prefetch call).
struct LineStarts {
    next: usize,
    end: usize,
}

impl Iterator for LineStarts {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        let line = self.next;
        if line >= self.end {
            return None;
        }
        self.next = line + 64;
        Some(line)
    }
}

impl crate::driver_ring::DriverMemory for GuestMem {
    #[inline]
    fn write(&self, gpa: u64, bytes: &[u8]) {
        GuestMem::write(self, gpa, bytes);
    }

    #[inline]
    fn read(&self, gpa: u64, buf: &mut [u8]) {
        GuestMem::read(self, gpa, buf);
    }

    #[inline]
    fn write_if_changed(&self, gpa: u64, bytes: &[u8]) {
        GuestMem::write_if_changed(self, gpa, bytes);
    }

    #[inline]
    fn load_u16_acquire(&self, gpa: u64) -> u16 {
        GuestMem::load_u16_acquire(self, gpa)
    }

    #[inline]
    fn store_u16_release(&self, gpa: u64, v: u16) {
        GuestMem::store_u16_release(self, gpa, v);
    }
}

impl Drop for GuestMem {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `new` mapped.
        unsafe { libc::munmap(self.ptr.cast(), self.size) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_starts_cover_every_touched_line() {
        let v: Vec<usize> = line_starts(0x1030, 64).collect();
        assert_eq!(v, [0x1000, 0x1040]);
        let v: Vec<usize> = line_starts(0x1000, 64).collect();
        assert_eq!(v, [0x1000]);
        assert_eq!(line_starts(0x1030, 0).count(), 0);
        // Capped at PREFETCH_MAX bytes from p: 0x1030..0x1430 touches 17 lines.
        let v: Vec<usize> = line_starts(0x1030, 5000).collect();
        assert_eq!((v.len(), v[0], v[16]), (17, 0x1000, 0x1400));
    }
}
