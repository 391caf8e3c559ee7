// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A split ring's avail and used rings from the driver's side (VIRTIO 1.2
//! §2.7.6 avail ring: `le16 flags, le16 idx, le16 ring[size], le16
//! used_event`; §2.7.8 used ring: `le16 flags, le16 idx, {le32 id, le32
//! len}[size], le16 avail_event`; §2.7.7 / §2.7.10 notification
//! suppression).

use std::sync::atomic::{fence, Ordering};

use virtio_bindings::virtio_ring;

use super::descriptor::{self, Buf, Descriptor};
use super::DriverMemory;

/// `VRING_USED_F_NO_NOTIFY`: the device asks not to be kicked (used ring
/// flags, without `VIRTIO_F_EVENT_IDX`).
pub const USED_F_NO_NOTIFY: u16 = virtio_ring::VRING_USED_F_NO_NOTIFY as u16;
/// `VRING_AVAIL_F_NO_INTERRUPT`: the driver asks not to be interrupted.
pub const AVAIL_F_NO_INTERRUPT: u16 = virtio_ring::VRING_AVAIL_F_NO_INTERRUPT as u16;

/// Whether a party that asked to be notified at index `event` must be,
/// now that the other has moved its index from `old` to `new`
/// (`vring_need_event` of Linux's `virtio_ring.h`, VIRTIO 1.2 §2.7.7.2).
#[inline]
pub fn vring_need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

/// Guest addresses of a split ring's three parts. Address arithmetic
/// wraps, so a hostile placement (near the top of the address space) is
/// representable; the size may be any u16 (positions are taken modulo
/// it, 0 as 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitRing {
    /// Entries.
    pub size: u16,
    /// Descriptor table.
    pub desc: u64,
    /// Avail ring.
    pub avail: u64,
    /// Used ring.
    pub used: u64,
}

impl SplitRing {
    /// Bytes of the descriptor table of a ring of `size`.
    pub const fn desc_bytes(size: u16) -> u64 {
        16 * size as u64
    }

    /// Bytes of the avail ring of a ring of `size` (with `used_event`).
    pub const fn avail_bytes(size: u16) -> u64 {
        6 + 2 * size as u64
    }

    /// Bytes of the used ring of a ring of `size` (with `avail_event`).
    pub const fn used_bytes(size: u16) -> u64 {
        6 + 8 * size as u64
    }

    /// The layout QEMU's and Linux's `vring_init` use: the descriptor
    /// table at `base`, the avail ring right after it, the used ring from
    /// the next multiple of `align` bytes.
    pub const fn contiguous(base: u64, size: u16, align: u64) -> SplitRing {
        let avail = base + Self::desc_bytes(size);
        SplitRing {
            size,
            desc: base,
            avail,
            used: (avail + Self::avail_bytes(size)).next_multiple_of(align),
        }
    }

    /// Bytes from the start of a [`SplitRing::contiguous`] ring to the
    /// end of its used ring rounded up to `align`.
    pub const fn contiguous_bytes(size: u16, align: u64) -> u64 {
        let r = Self::contiguous(0, size, align);
        (r.used + Self::used_bytes(size)).next_multiple_of(align)
    }

    /// The ring position of index `idx`: `idx % size` (a mask for a power
    /// of two; a size of 0 counts as 1).
    #[inline]
    pub fn pos(&self, idx: u16) -> u16 {
        let n = self.size;
        if n.is_power_of_two() {
            idx & (n - 1)
        } else {
            idx % n.max(1)
        }
    }

    /// Address of descriptor `idx` of the ring's table.
    #[inline]
    pub fn desc_at(&self, idx: u16) -> u64 {
        self.desc.wrapping_add(16 * u64::from(idx))
    }

    /// Address of `avail.idx`.
    #[inline]
    pub fn avail_idx(&self) -> u64 {
        self.avail.wrapping_add(2)
    }

    /// Address of the avail ring entry for index `idx`.
    #[inline]
    pub fn avail_entry(&self, idx: u16) -> u64 {
        self.avail.wrapping_add(4 + 2 * u64::from(self.pos(idx)))
    }

    /// Address of `used_event` (after the avail ring's entries).
    #[inline]
    pub fn used_event(&self) -> u64 {
        self.avail.wrapping_add(4 + 2 * u64::from(self.size))
    }

    /// Address of `used.idx`.
    #[inline]
    pub fn used_idx(&self) -> u64 {
        self.used.wrapping_add(2)
    }

    /// Address of the used element for index `idx`.
    #[inline]
    pub fn used_elem(&self, idx: u16) -> u64 {
        self.used.wrapping_add(4 + 8 * u64::from(self.pos(idx)))
    }

    /// Address of `avail_event` (after the used ring's elements).
    #[inline]
    pub fn avail_event(&self) -> u64 {
        self.used.wrapping_add(4 + 8 * u64::from(self.size))
    }
}

/// One used ring element: the head of the chain the device returned and
/// the bytes it says it wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UsedElem {
    /// Head descriptor index, as the device wrote it (any u32).
    pub id: u32,
    /// Used length.
    pub len: u32,
}

/// The driver's side of a split ring: its addresses and the driver's own
/// indices (the next avail index it fills, the avail index it last
/// published, the next used index it reads). The memory is passed to each
/// call, so the driver holds no borrow of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriverRing {
    ring: SplitRing,
    avail_idx: u16,
    published: u16,
    last_used: u16,
}

impl DriverRing {
    /// A driver for `ring` whose avail and used indices start at `idx`
    /// (0 for a new ring; the memory is not touched).
    pub const fn new(ring: SplitRing, idx: u16) -> DriverRing {
        DriverRing {
            ring,
            avail_idx: idx,
            published: idx,
            last_used: idx,
        }
    }

    /// The ring's addresses.
    #[inline]
    pub fn ring(&self) -> SplitRing {
        self.ring
    }

    /// The next avail index the driver fills (what [`DriverRing::publish`]
    /// stores).
    #[inline]
    pub fn avail_idx(&self) -> u16 {
        self.avail_idx
    }

    /// Entries pushed and not yet published.
    #[inline]
    pub fn unpublished(&self) -> u16 {
        self.avail_idx.wrapping_sub(self.published)
    }

    /// The next used index the driver reads.
    #[inline]
    pub fn last_used(&self) -> u16 {
        self.last_used
    }

    /// Moves the driver's avail index to `idx` without writing anything
    /// (entries before it count as published).
    pub fn set_avail_idx(&mut self, idx: u16) {
        self.avail_idx = idx;
        self.published = idx;
    }

    /// Moves the driver's used index to `idx` (the next element it reads).
    #[inline]
    pub fn set_last_used(&mut self, idx: u16) {
        self.last_used = idx;
    }

    /// Writes `d` as descriptor `idx` of the ring's table.
    #[inline]
    pub fn write_desc<M: DriverMemory + ?Sized>(&self, mem: &M, idx: u16, d: &Descriptor) {
        descriptor::write_desc(mem, self.ring.desc, idx, d);
    }

    /// Writes `bufs` as a direct chain in the ring's descriptors `head`,
    /// `head + 1`, …; returns `head`.
    pub fn write_chain<M: DriverMemory + ?Sized>(&self, mem: &M, head: u16, bufs: &[Buf]) -> u16 {
        for (k, d) in descriptor::chain(bufs, head).enumerate() {
            self.write_desc(mem, head.wrapping_add(k as u16), &d);
        }
        head
    }

    /// Writes `bufs` as an indirect table at `table` and ring descriptor
    /// `head` pointing at it; returns `head`.
    pub fn write_indirect<M: DriverMemory + ?Sized>(
        &self,
        mem: &M,
        head: u16,
        table: u64,
        bufs: &[Buf],
    ) -> u16 {
        let d = descriptor::write_table(mem, table, bufs);
        self.write_desc(mem, head, &d);
        head
    }

    /// Puts `head` in the avail ring's next entry; the device sees it once
    /// [`DriverRing::publish`] stores the index. Returns the avail index
    /// it was put at.
    #[inline]
    pub fn push<M: DriverMemory + ?Sized>(&mut self, mem: &M, head: u16) -> u16 {
        let at = self.avail_idx;
        mem.write_if_changed(self.ring.avail_entry(at), &head.to_le_bytes());
        self.avail_idx = at.wrapping_add(1);
        at
    }

    /// Stores `avail.idx` (Release) for the entries pushed since the last
    /// call, then a full fence, so that the device's notification
    /// suppression fields read next are at least as new (VIRTIO 1.2
    /// §2.7.13.3, §2.7.13.4). Returns the (old, new) index, or `None`
    /// when nothing was pushed since.
    #[inline]
    pub fn publish<M: DriverMemory + ?Sized>(&mut self, mem: &M) -> Option<(u16, u16)> {
        let (old, new) = (self.published, self.avail_idx);
        if old == new {
            return None;
        }
        mem.store_u16_release(self.ring.avail_idx(), new);
        fence(Ordering::SeqCst);
        self.published = new;
        Some((old, new))
    }

    /// Whether the device wants a notification after a publication that
    /// moved the avail index from `old` to `new`: with
    /// `VIRTIO_F_EVENT_IDX` (`event_idx`) per `avail_event`, else unless
    /// the used ring's flags have [`USED_F_NO_NOTIFY`] (VIRTIO 1.2
    /// §2.7.10).
    #[inline]
    pub fn needs_kick<M: DriverMemory + ?Sized>(&self, mem: &M, event_idx: bool, old: u16, new: u16) -> bool {
        if event_idx {
            vring_need_event(self.avail_event(mem), new, old)
        } else {
            self.used_flags(mem) & USED_F_NO_NOTIFY == 0
        }
    }

    /// `avail_event`, as the device last wrote it (Acquire).
    #[inline]
    pub fn avail_event<M: DriverMemory + ?Sized>(&self, mem: &M) -> u16 {
        mem.load_u16_acquire(self.ring.avail_event())
    }

    /// The used ring's flags (Acquire).
    #[inline]
    pub fn used_flags<M: DriverMemory + ?Sized>(&self, mem: &M) -> u16 {
        mem.load_u16_acquire(self.ring.used)
    }

    /// Asks for a notification once the device has put the used element
    /// for index `idx` (`used_event`, Release), then a full fence, so that
    /// a used index read next is at least as new (VIRTIO 1.2 §2.7.7.2).
    #[inline]
    pub fn set_used_event<M: DriverMemory + ?Sized>(&self, mem: &M, idx: u16) {
        mem.store_u16_release(self.ring.used_event(), idx);
        fence(Ordering::SeqCst);
    }

    /// `used.idx` (Acquire: the elements before it are then readable).
    #[inline]
    pub fn used_idx<M: DriverMemory + ?Sized>(&self, mem: &M) -> u16 {
        mem.load_u16_acquire(self.ring.used_idx())
    }

    /// The used element at used index `idx`, read in one piece.
    #[inline]
    pub fn used_elem<M: DriverMemory + ?Sized>(&self, mem: &M, idx: u16) -> UsedElem {
        let mut e = [0u8; 8];
        mem.read(self.ring.used_elem(idx), &mut e);
        let e = u64::from_le_bytes(e);
        UsedElem {
            id: e as u32,
            len: (e >> 32) as u32,
        }
    }

    /// The next used element, if the device has put one there since the
    /// last call.
    pub fn pop_used<M: DriverMemory + ?Sized>(&mut self, mem: &M) -> Option<UsedElem> {
        if self.last_used == self.used_idx(mem) {
            return None;
        }
        let e = self.used_elem(mem, self.last_used);
        self.last_used = self.last_used.wrapping_add(1);
        Some(e)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::Flat;
    use super::*;

    #[test]
    fn contiguous_layout_follows_vring_init() {
        // 256 entries, 4 KiB alignment: table 4096 bytes, avail 518, used
        // from 8192 (Linux vring_init), 2054 bytes.
        let r = SplitRing::contiguous(0x1000, 256, 4096);
        assert_eq!((r.desc, r.avail, r.used), (0x1000, 0x2000, 0x3000));
        assert_eq!(SplitRing::contiguous_bytes(256, 4096), 0x3000);
        assert_eq!(
            (r.used_event(), r.avail_event()),
            (0x2000 + 4 + 512, 0x3000 + 4 + 2048)
        );
        let odd = SplitRing { size: 3, ..r };
        assert_eq!((odd.pos(7), SplitRing { size: 0, ..r }.pos(7)), (1, 0));
    }

    #[test]
    fn need_event_is_linux_vring_need_event() {
        // Kick when the event index is among the new entries (old, new].
        assert!(vring_need_event(5, 6, 5));
        assert!(!vring_need_event(6, 6, 5));
        assert!(vring_need_event(0xFFFF, 1, 0xFFF0));
        assert!(!vring_need_event(2, 1, 0xFFF0));
    }

    #[test]
    fn push_publish_and_used_reads_go_where_the_spec_puts_them() {
        let mem = Flat::new(0x4000);
        let ring = SplitRing::contiguous(0, 4, 0x1000);
        let mut d = DriverRing::new(ring, 0xFFFF);
        assert_eq!(d.push(&mem, 3), 0xFFFF);
        assert_eq!(d.push(&mem, 1), 0);
        assert_eq!(d.unpublished(), 2);
        // Entry for index 0xFFFF is position 3, for 0 position 0.
        assert_eq!(mem.bytes(ring.avail + 4 + 6, 2), [3, 0]);
        assert_eq!(mem.bytes(ring.avail + 4, 2), [1, 0]);
        assert_eq!(d.publish(&mem), Some((0xFFFF, 1)));
        assert_eq!(d.publish(&mem), None);
        assert_eq!(mem.bytes(ring.avail + 2, 2), [1, 0]);
        // The device puts two elements and moves used.idx.
        mem.write(ring.used + 4 + 8 * 3, &[3, 0, 0, 0, 65, 0, 0, 0]);
        mem.write(ring.used + 4, &[1, 0, 0, 0, 1, 0, 0, 0]);
        mem.write(ring.used + 2, &1u16.to_le_bytes());
        assert_eq!(d.pop_used(&mem), Some(UsedElem { id: 3, len: 65 }));
        assert_eq!(d.pop_used(&mem), Some(UsedElem { id: 1, len: 1 }));
        assert_eq!(d.pop_used(&mem), None);
        d.set_used_event(&mem, 7);
        assert_eq!(mem.bytes(ring.avail + 4 + 8, 2), [7, 0]);
        mem.write(ring.used, &USED_F_NO_NOTIFY.to_le_bytes());
        assert!(!d.needs_kick(&mem, false, 0, 1));
        mem.write(ring.avail_event(), &0u16.to_le_bytes());
        assert!(d.needs_kick(&mem, true, 0, 1));
    }
}
