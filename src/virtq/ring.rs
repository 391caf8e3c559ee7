// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A split ring mapped from guest memory: the avail and used rings' fields,
//! each read or written exactly once per use, with atomic or volatile
//! accesses (VIRTIO 1.2 §2.7.6, §2.7.8).

use std::sync::atomic::{fence, AtomicU16, Ordering};

use virtio_bindings::virtio_ring;
use vm_memory::GuestMemoryMmap;

use super::descriptor::DESC_SIZE;
use super::map_contiguous;
use crate::wire::split_ring::MAX_QUEUE_SIZE;

/// Guest-physical layout of a split ring, as set by the frontend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingAddrs {
    /// Number of entries (a power of two, 1..=32768).
    pub size: u16,
    /// Descriptor table address (16-byte aligned).
    pub desc: u64,
    /// Available ring address (2-byte aligned).
    pub avail: u64,
    /// Used ring address (4-byte aligned).
    pub used: u64,
}

/// Why a queue was stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum QueueError {
    /// Size not a power of two in 1..=32768.
    #[error("invalid queue size {0}")]
    InvalidSize(u16),
    /// A ring area is misaligned or not mapped in one piece.
    #[error("ring memory not mapped or misaligned")]
    BadRingMemory,
    /// The avail index moved more than the queue size past the last seen one.
    #[error("avail index {avail} is {ahead} entries ahead of {next_avail} on a queue of {size}")]
    AvailIndexJump {
        /// Avail index read.
        avail: u16,
        /// Next avail index expected.
        next_avail: u16,
        /// How far ahead.
        ahead: u16,
        /// Queue size.
        size: u16,
    },
}

/// `VRING_USED_F_NO_NOTIFY` (VIRTIO 1.2 §2.7.10), as the flags' u16.
pub const VRING_USED_F_NO_NOTIFY: u16 = virtio_ring::VRING_USED_F_NO_NOTIFY as u16;

/// `VRING_AVAIL_F_NO_INTERRUPT` (VIRTIO 1.2 §2.7.7), as the flags' u16.
pub const VRING_AVAIL_F_NO_INTERRUPT: u16 = virtio_ring::VRING_AVAIL_F_NO_INTERRUPT as u16;

/// `vring_need_event` (VIRTIO 1.2 §2.7.7.2): whether moving an index from
/// `old` to `new` crosses the `event` index the other side asked about.
pub fn vring_need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

/// A split ring's three areas, translated to host addresses for one batch
/// (valid while the guest-memory guard they came from is held).
pub(crate) struct Ring {
    /// Number of entries.
    pub(crate) size: u16,
    /// The descriptor table, `size` × 16 bytes.
    pub(crate) desc: *const u8,
    avail: *mut u8,
    used: *mut u8,
}

impl Ring {
    /// Translates the ring at `a`: every area mapped in one piece and
    /// aligned, in guest and host addresses.
    ///
    /// # Errors
    /// [`QueueError::InvalidSize`], [`QueueError::BadRingMemory`].
    pub(crate) fn map(mem: &GuestMemoryMmap, a: RingAddrs) -> Result<Ring, QueueError> {
        if a.size == 0 || a.size > MAX_QUEUE_SIZE || !a.size.is_power_of_two() {
            return Err(QueueError::InvalidSize(a.size));
        }
        if !a.desc.is_multiple_of(16) || !a.avail.is_multiple_of(2) || !a.used.is_multiple_of(4) {
            return Err(QueueError::BadRingMemory);
        }
        let n = usize::from(a.size);
        let desc = map_contiguous(mem, a.desc, n * DESC_SIZE).ok_or(QueueError::BadRingMemory)?;
        let avail = map_contiguous(mem, a.avail, 6 + 2 * n).ok_or(QueueError::BadRingMemory)?;
        let used = map_contiguous(mem, a.used, 6 + 8 * n).ok_or(QueueError::BadRingMemory)?;
        // The ring fields are accessed as u16/u32 through host pointers: an
        // aligned GPA gives an aligned host address only when the region's
        // guest start is aligned too, which a memory table does not promise.
        if !(avail as usize).is_multiple_of(2) || !(used as usize).is_multiple_of(4) {
            return Err(QueueError::BadRingMemory);
        }
        Ok(Ring {
            size: a.size,
            desc,
            avail,
            used,
        })
    }

    /// `avail.idx` (Acquire: the entries before it are visible).
    pub(crate) fn avail_idx(&self) -> u16 {
        // SAFETY: avail is mapped for 6 + 2n bytes and its host address is
        // 2-byte aligned (checked in `map`); byte 2 holds idx.
        unsafe { AtomicU16::from_ptr(self.avail.add(2) as *mut u16) }
            .load(Ordering::Acquire)
            .to_le()
    }

    /// `avail.ring[i % size]`: a head index as the driver wrote it.
    pub(crate) fn avail_entry(&self, i: u16) -> u16 {
        let slot = usize::from(i & (self.size - 1));
        // SAFETY: slot < size, so 4 + 2*slot + 2 <= 6 + 2n mapped bytes.
        u16::from_le(unsafe { std::ptr::read_volatile(self.avail.add(4 + 2 * slot) as *const u16) })
    }

    /// Writes used element `i % size` (id, len).
    pub(crate) fn put_used(&self, i: u16, id: u32, len: u32) {
        let slot = usize::from(i & (self.size - 1));
        // One 8-byte store (id, then len, little-endian), not two: a batch
        // ends with up to 64 of them, each waiting for room in the store
        // buffer. (A plain store: the driver reads the element only after
        // the used index, which is published with a Release store after
        // it.)
        // SAFETY: slot < size, so the 8-byte element at 4 + 8*slot lies in
        // the 6 + 8n mapped used ring; an unaligned write has no alignment
        // requirement (the element is only 4-aligned).
        unsafe {
            let p = self.used.add(4 + 8 * slot);
            std::ptr::write_unaligned(p as *mut u64, (u64::from(len) << 32 | u64::from(id)).to_le());
        }
    }

    /// Stores `used.idx` (Release: after the elements it covers).
    pub(crate) fn publish_used_idx(&self, idx: u16) {
        // SAFETY: byte 2 of the mapped, 4-aligned used ring.
        unsafe { AtomicU16::from_ptr(self.used.add(2) as *mut u16) }.store(idx.to_le(), Ordering::Release);
    }

    /// `used_event`, the u16 after the avail ring's entries.
    pub(crate) fn used_event(&self) -> u16 {
        // SAFETY: used_event is the u16 after the n avail entries, inside
        // the 6 + 2n mapped bytes, 2-aligned.
        unsafe { AtomicU16::from_ptr(self.avail.add(4 + 2 * usize::from(self.size)) as *mut u16) }
            .load(Ordering::Acquire)
            .to_le()
    }

    /// `avail.flags`.
    pub(crate) fn avail_flags(&self) -> u16 {
        // SAFETY: byte 0 of the mapped, 2-aligned avail ring.
        unsafe { AtomicU16::from_ptr(self.avail as *mut u16) }
            .load(Ordering::Acquire)
            .to_le()
    }

    /// Stores `used.flags`.
    pub(crate) fn set_used_flags(&self, flags: u16) {
        // SAFETY: byte 0 of the mapped, 4-aligned used ring.
        unsafe { AtomicU16::from_ptr(self.used as *mut u16) }.store(flags.to_le(), Ordering::Release);
    }

    /// Stores `avail_event`, the u16 after the used ring's elements.
    pub(crate) fn set_avail_event(&self, idx: u16) {
        // SAFETY: avail_event is the u16 after the n used elements, inside
        // the 6 + 8n mapped bytes, 2-aligned.
        unsafe { AtomicU16::from_ptr(self.used.add(4 + 8 * usize::from(self.size)) as *mut u16) }
            .store(idx.to_le(), Ordering::Release);
    }

    /// Asks the driver to kick for its next request after avail index
    /// `avail` (both kinds of driver: the flag and avail_event), and makes
    /// that visible before the caller reads the avail index again (the
    /// driver/device race of VIRTIO 1.2 §2.7.10).
    pub(crate) fn enable_kicks(&self, avail: u16) {
        self.set_used_flags(0);
        self.set_avail_event(avail);
        fence(Ordering::SeqCst);
    }
}
