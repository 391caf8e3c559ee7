// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The device side of a split virtqueue (VIRTIO 1.2 §2.7): the ring's
//! guest memory ([`ring`]), the walk of one descriptor chain into host
//! segments ([`descriptor`]), and reads and writes of those segments as two
//! byte streams ([`segments`]). Nothing here knows what a request means.
//!
//! The ring is walked by this code rather than through virtio-queue's
//! `DescriptorChain`, `Reader` and `Writer`, which allocate per chain and
//! store the used index per element (`docs/ARCHITECTURE.md`).

pub mod descriptor;
pub mod ring;
pub mod segments;

use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, MemoryRegionAddress};

/// Returns a host pointer to `len` bytes at `addr` when they lie in one
/// mapped region.
pub fn map_contiguous(mem: &GuestMemoryMmap, addr: u64, len: usize) -> Option<*mut u8> {
    let region = mem.find_region(GuestAddress(addr))?;
    let off = addr - region.start_addr().0;
    let end = off.checked_add(len as u64)?;
    if end > region.len() {
        return None;
    }
    region.get_host_address(MemoryRegionAddress(off)).ok()
}
