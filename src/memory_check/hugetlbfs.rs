// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Huge-page reservation for guest memory in hugetlbfs files.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

use log::warn;

/// `HUGETLBFS_MAGIC` (statfs(2)).
const HUGETLBFS_MAGIC: i64 = 0x9584_58f6;

/// For a region in a hugetlbfs file, makes sure huge pages are reserved
/// for all of it, so that the daemon's accesses cannot fault on a page
/// that no huge page backs. The library maps regions with
/// `MAP_NORESERVE` (vm-memory `MmapRegion::from_file`), and hugetlbfs does
/// not overcommit: without a reservation, the first access to a page the
/// pool cannot supply raises SIGBUS. A shared mapping without
/// `MAP_NORESERVE` reserves the range's pages on the file for good (they
/// stay reserved after `munmap`; Documentation/mm/hugetlbfs_reserv.rst),
/// or fails with `ENOMEM` when the pool has too few. QEMU's own mapping
/// of hugetlbfs guest memory reserves them the same way, so its pages are
/// reserved already, except with `reserve=off` (QEMU ≥ 6.1, `MAP_NORESERVE`
/// on its side too): then the daemon reserves the region's pages itself,
/// and refuses the region if the pool cannot hold them all. The mapping's
/// length is the region's rounded up to the file's huge page size
/// (`f_bsize`): `munmap` of an unaligned length fails on hugetlbfs.
/// Other files: nothing to do.
///
/// # Errors
/// `fstatfs` failed, or the range cannot be reserved (the error says why).
pub(super) fn reserve_huge_pages(file: &File, offset: u64, size: u64) -> io::Result<()> {
    // SAFETY: an all-zero statfs is a valid value of this plain C struct.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs(2) on a descriptor `file` owns, writing into `st`.
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) } < 0 {
        return Err(io::Error::last_os_error());
    }
    #[allow(clippy::unnecessary_cast)] // f_type's type differs between targets
    if st.f_type as i64 != HUGETLBFS_MAGIC || size == 0 {
        return Ok(());
    }
    let page = u64::try_from(st.f_bsize).unwrap_or(0).max(4096);
    let (Some(len), Ok(off)) = (
        size.checked_next_multiple_of(page)
            .and_then(|l| usize::try_from(l).ok()),
        libc::off_t::try_from(offset),
    ) else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "region too large"));
    };
    // SAFETY: a new shared read-only mapping of the frontend's file, at an
    // address the kernel picks; nothing reads it, and it is unmapped below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            off,
        )
    };
    if p == libc::MAP_FAILED {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("cannot reserve huge pages for its {size} bytes of hugetlbfs memory ({e})"),
        ));
    }
    // SAFETY: the mapping made just above, of `len` bytes, used by nothing.
    if unsafe { libc::munmap(p, len) } < 0 {
        // (Cannot happen with a whole number of huge pages; the mapping
        // would stay, holding the file and its reservation.)
        warn!(
            "munmap of a hugetlbfs reservation mapping: {}",
            io::Error::last_os_error()
        );
    }
    Ok(())
}
