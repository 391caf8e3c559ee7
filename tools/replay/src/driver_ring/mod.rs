// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The driver side of a split virtqueue (VIRTIO 1.2 §2.7), written from the
//! spec and independent of the daemon's device-side code: what a guest
//! driver writes (descriptors, indirect tables, avail ring entries and
//! index, `used_event`) and reads (the used ring, `avail_event`, the used
//! ring's flags).
//!
//! * [`descriptor`]: descriptor encoding (rust-vmm `virtio-queue`'s
//!   [`Descriptor`], flag values from `virtio-bindings`), buffers linked
//!   into chains and indirect tables, and bump allocators for ring
//!   descriptors and indirect tables;
//! * [`ring`]: the addresses of a ring's three parts ([`SplitRing`]) and
//!   the driver's indices ([`DriverRing`]): avail pushes and publication,
//!   notification suppression, used ring reads.
//!
//! Everything takes the guest memory as a [`DriverMemory`], so one driver
//! serves the replay tool's memfd [`GuestMem`](crate::guest_mem::GuestMem)
//! (shared with a backend in another process) and a test's or fuzz
//! harness's `vm_memory::GuestMemoryMmap` (wrapped in a type of its own
//! that implements the trait).

pub mod descriptor;
pub mod ring;

pub use descriptor::{
    chain, decode, encode, indirect_head, write_desc, write_table, Buf, DescAlloc, Descriptor, TableArea,
    DESC_SIZE, F_INDIRECT, F_NEXT, F_WRITE,
};
pub use ring::{vring_need_event, DriverRing, SplitRing, UsedElem, AVAIL_F_NO_INTERRUPT, USED_F_NO_NOTIFY};

use std::sync::atomic::{fence, Ordering};

/// Guest memory as the driver sees it: byte writes and reads at guest
/// physical addresses, and the ring index accesses that need ordering.
///
/// What to do with an address outside the memory is the implementation's
/// choice (panic in a test, write the mapped part in a fuzz harness).
///
/// The provided ring index accesses are plain byte accesses with fences,
/// right for memory that no other thread or process touches while they
/// run (a device model called in the same thread). Memory shared with a
/// running backend implements them as atomic accesses instead, as
/// [`GuestMem`](crate::guest_mem::GuestMem) does.
pub trait DriverMemory {
    /// Writes `bytes` at `gpa`.
    fn write(&self, gpa: u64, bytes: &[u8]);

    /// Reads `buf.len()` bytes at `gpa`.
    fn read(&self, gpa: u64, buf: &mut [u8]);

    /// Writes `bytes` at `gpa`; memory shared with another CPU may skip
    /// the store when the bytes there are already equal (an unchanged
    /// cache line then stays shared). Used for descriptors and avail
    /// entries, which only the driver writes.
    #[inline]
    fn write_if_changed(&self, gpa: u64, bytes: &[u8]) {
        self.write(gpa, bytes);
    }

    /// Loads the little-endian u16 ring index at `gpa` with Acquire
    /// ordering.
    #[inline]
    fn load_u16_acquire(&self, gpa: u64) -> u16 {
        let mut b = [0u8; 2];
        self.read(gpa, &mut b);
        fence(Ordering::Acquire);
        u16::from_le_bytes(b)
    }

    /// Stores the little-endian u16 ring index `v` at `gpa` with Release
    /// ordering.
    #[inline]
    fn store_u16_release(&self, gpa: u64, v: u16) {
        fence(Ordering::Release);
        self.write(gpa, &v.to_le_bytes());
    }
}

impl<M: DriverMemory + ?Sized> DriverMemory for &M {
    #[inline]
    fn write(&self, gpa: u64, bytes: &[u8]) {
        (**self).write(gpa, bytes);
    }

    #[inline]
    fn read(&self, gpa: u64, buf: &mut [u8]) {
        (**self).read(gpa, buf);
    }

    #[inline]
    fn write_if_changed(&self, gpa: u64, bytes: &[u8]) {
        (**self).write_if_changed(gpa, bytes);
    }

    #[inline]
    fn load_u16_acquire(&self, gpa: u64) -> u16 {
        (**self).load_u16_acquire(gpa)
    }

    #[inline]
    fn store_u16_release(&self, gpa: u64, v: u16) {
        (**self).store_u16_release(gpa, v);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::cell::RefCell;

    use super::DriverMemory;

    /// A flat memory of `n` bytes at guest address 0 for the tests.
    pub(crate) struct Flat(pub RefCell<Vec<u8>>);

    impl Flat {
        pub(crate) fn new(n: usize) -> Flat {
            Flat(RefCell::new(vec![0; n]))
        }

        pub(crate) fn bytes(&self, gpa: u64, n: usize) -> Vec<u8> {
            self.0.borrow()[gpa as usize..gpa as usize + n].to_vec()
        }
    }

    impl DriverMemory for Flat {
        fn write(&self, gpa: u64, bytes: &[u8]) {
            let at = gpa as usize;
            self.0.borrow_mut()[at..at + bytes.len()].copy_from_slice(bytes);
        }

        fn read(&self, gpa: u64, buf: &mut [u8]) {
            let at = gpa as usize;
            buf.copy_from_slice(&self.0.borrow()[at..at + buf.len()]);
        }
    }
}
