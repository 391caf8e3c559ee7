// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Split-ring descriptors as a driver writes them (VIRTIO 1.2 §2.7.5: le64
//! addr, le32 len, le16 flags, le16 next; §2.7.5.3 indirect tables):
//! encoding, chains of buffers, indirect heads, and the bump allocators a
//! test driver hands ring descriptors and table space out with.
//!
//! The descriptor type is rust-vmm `virtio-queue`'s [`Descriptor`] and the
//! flag values are `virtio-bindings`' `virtio_ring` constants (Linux's
//! `include/uapi/linux/virtio_ring.h`), not the daemon's own types.

use virtio_bindings::virtio_ring;
use vm_memory::ByteValued;

pub use virtio_queue::desc::split::Descriptor;

use super::DriverMemory;

/// Size of one descriptor in bytes (`struct vring_desc`).
pub const DESC_SIZE: usize = 16;
/// `VRING_DESC_F_NEXT`: the chain goes on at `next`.
pub const F_NEXT: u16 = virtio_ring::VRING_DESC_F_NEXT as u16;
/// `VRING_DESC_F_WRITE`: the buffer is device-writable.
pub const F_WRITE: u16 = virtio_ring::VRING_DESC_F_WRITE as u16;
/// `VRING_DESC_F_INDIRECT`: the buffer is an indirect table.
pub const F_INDIRECT: u16 = virtio_ring::VRING_DESC_F_INDIRECT as u16;

/// The 16 little-endian bytes of `d`.
#[inline]
pub fn encode(d: &Descriptor) -> [u8; DESC_SIZE] {
    let mut b = [0u8; DESC_SIZE];
    b.copy_from_slice(d.as_slice());
    b
}

/// The descriptor whose bytes are `b`.
#[inline]
pub fn decode(b: [u8; DESC_SIZE]) -> Descriptor {
    let mut d = Descriptor::default();
    d.as_mut_slice().copy_from_slice(&b);
    d
}

/// One buffer of a request: guest address, length, and whether the device
/// may write it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buf {
    /// Guest-physical address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// Device-writable (`F_WRITE`).
    pub write: bool,
}

impl Buf {
    /// A device-readable buffer.
    pub const fn readable(addr: u64, len: u32) -> Buf {
        Buf {
            addr,
            len,
            write: false,
        }
    }

    /// A device-writable buffer.
    pub const fn writable(addr: u64, len: u32) -> Buf {
        Buf {
            addr,
            len,
            write: true,
        }
    }
}

/// `bufs` as the descriptors of one chain whose entries sit at
/// consecutive indices from `first` (0 for an indirect table, the head's
/// ring index for a direct chain): each has `F_WRITE` when its buffer is
/// writable, and all but the last `F_NEXT` with `next` = its own index + 1
/// (the last has `next` 0), as Linux's `virtqueue_add_split` links them.
pub fn chain(bufs: &[Buf], first: u16) -> impl Iterator<Item = Descriptor> + '_ {
    let n = bufs.len();
    bufs.iter().enumerate().map(move |(k, b)| {
        let last = k + 1 == n;
        let flags = if b.write { F_WRITE } else { 0 } | if last { 0 } else { F_NEXT };
        let next = if last { 0 } else { first.wrapping_add(k as u16 + 1) };
        Descriptor::new(b.addr, b.len, flags, next)
    })
}

/// The ring descriptor that points at an indirect table of `n` entries at
/// `table`: `F_INDIRECT`, length `16 * n`.
#[inline]
pub fn indirect_head(table: u64, n: usize) -> Descriptor {
    Descriptor::new(table, (DESC_SIZE * n) as u32, F_INDIRECT, 0)
}

/// Writes `d` as entry `idx` of the descriptor table at `table` (the
/// ring's or an indirect one; addresses wrap, as a hostile placement may
/// need).
#[inline]
pub fn write_desc<M: DriverMemory + ?Sized>(mem: &M, table: u64, idx: u16, d: &Descriptor) {
    let at = table.wrapping_add(DESC_SIZE as u64 * u64::from(idx));
    mem.write_if_changed(at, &encode(d));
}

/// Writes `bufs` as an indirect table at `table`, entries linked 0 → 1 →
/// … ([`chain`] from 0); returns the ring descriptor that points at it
/// ([`indirect_head`]).
pub fn write_table<M: DriverMemory + ?Sized>(mem: &M, table: u64, bufs: &[Buf]) -> Descriptor {
    for (k, d) in chain(bufs, 0).enumerate() {
        write_desc(mem, table, k as u16, &d);
    }
    indirect_head(table, bufs.len())
}

/// Hands out the descriptors of a ring's table in order, as a test driver
/// that frees them all at once (after the device has consumed every chain)
/// does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DescAlloc {
    next: u16,
    size: u16,
}

impl DescAlloc {
    /// An allocator over a table of `size` descriptors, none taken.
    pub const fn new(size: u16) -> DescAlloc {
        DescAlloc { next: 0, size }
    }

    /// The first of `n` consecutive free descriptors, or `None` when fewer
    /// than `n` are left.
    pub fn take(&mut self, n: u16) -> Option<u16> {
        let first = self.next;
        (n <= self.left()).then(|| {
            self.next += n;
            first
        })
    }

    /// Descriptors left.
    pub fn left(&self) -> u16 {
        self.size - self.next
    }

    /// Frees every descriptor.
    pub fn reset(&mut self) {
        self.next = 0;
    }
}

/// Hands out indirect tables from the guest area `base..end`: each table
/// starts at a multiple of `granule` bytes from `base` and takes its size
/// rounded up to `granule`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableArea {
    base: u64,
    end: u64,
    granule: u64,
    next: u64,
}

impl TableArea {
    /// An area from `base` to `end` (exclusive), tables `granule`-aligned.
    pub const fn new(base: u64, end: u64, granule: u64) -> TableArea {
        TableArea {
            base,
            end,
            granule,
            next: base,
        }
    }

    /// Where a table of `n` descriptors goes, or `None` when the area is
    /// full.
    pub fn take(&mut self, n: usize) -> Option<u64> {
        let bytes = ((DESC_SIZE * n.max(1)) as u64).next_multiple_of(self.granule);
        let at = self.next;
        let end = at.checked_add(bytes)?;
        (end <= self.end).then(|| {
            self.next = end;
            at
        })
    }

    /// Frees every table.
    pub fn reset(&mut self) {
        self.next = self.base;
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::Flat;
    use super::*;

    #[test]
    fn flags_and_layout_are_the_spec_values() {
        // VIRTIO 1.2 §2.7.5: NEXT 1, WRITE 2, INDIRECT 4.
        assert_eq!((F_NEXT, F_WRITE, F_INDIRECT), (1, 2, 4));
        let d = Descriptor::new(0x0102_0304_0506_0708, 0x1122_3344, 0x5566, 0x7788);
        assert_eq!(
            encode(&d),
            [
                0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, 0x44, 0x33, 0x22, 0x11, 0x66, 0x55, 0x88,
                0x77
            ]
        );
        let back = decode(encode(&d));
        assert_eq!(
            (back.addr().0, back.len(), back.flags(), back.next()),
            (0x0102_0304_0506_0708, 0x1122_3344, 0x5566, 0x7788)
        );
    }

    #[test]
    fn chains_link_every_entry_but_the_last() {
        let bufs = [
            Buf::readable(0x100, 72),
            Buf::readable(0x200, 16),
            Buf::writable(0x300, 1),
        ];
        let got: Vec<(u64, u32, u16, u16)> = chain(&bufs, 6)
            .map(|d| (d.addr().0, d.len(), d.flags(), d.next()))
            .collect();
        assert_eq!(got, [(0x100, 72, 1, 7), (0x200, 16, 1, 8), (0x300, 1, 2, 0)]);
        let mem = Flat::new(0x1000);
        let head = write_table(&mem, 0x800, &bufs);
        assert_eq!((head.addr().0, head.len(), head.flags()), (0x800, 48, 4));
        assert_eq!(
            mem.bytes(0x800 + 16, 16),
            encode(&Descriptor::new(0x200, 16, 1, 2))
        );
    }

    #[test]
    fn allocators_hand_out_in_order_until_full() {
        let mut a = DescAlloc::new(4);
        assert_eq!(
            (a.take(3), a.take(2), a.take(1), a.take(1)),
            (Some(0), None, Some(3), None)
        );
        a.reset();
        assert_eq!(a.take(4), Some(0));
        let mut t = TableArea::new(0x4000, 0x4800, 0x400);
        assert_eq!(
            (t.take(5), t.take(64), t.take(1)),
            (Some(0x4000), Some(0x4400), None)
        );
        let mut t = TableArea::new(0x1000, u64::MAX, 0x100);
        assert_eq!((t.take(17), t.take(1)), (Some(0x1000), Some(0x1200)));
    }
}
