// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! memfds to share as guest memory (memfd_create(2)).

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::fd::FromRawFd;

/// A memfd named `name` of `size` bytes, made with `MFD_CLOEXEC | flags`;
/// the kernel's error where it cannot make one.
pub fn try_memfd(name: &CStr, flags: libc::c_uint, size: u64) -> io::Result<File> {
    // SAFETY: a valid NUL-terminated name; the result is checked.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    let f = unsafe { File::from_raw_fd(fd) };
    f.set_len(size)?;
    Ok(f)
}

/// A memfd of `size` bytes that cannot be sealed (no `MFD_ALLOW_SEALING`:
/// `F_SEAL_SEAL` from birth).
pub fn memfd(size: u64) -> File {
    try_memfd(c"vuc-test", 0, size).expect("memfd_create")
}

/// A memfd of `size` bytes made with `MFD_ALLOW_SEALING`, no seals yet.
pub fn sealable_memfd(size: u64) -> File {
    try_memfd(c"vuc-test", libc::MFD_ALLOW_SEALING, size).expect("memfd_create")
}

/// A memfd in hugetlbfs (`MFD_HUGETLB | MFD_ALLOW_SEALING`) of `size`
/// bytes, or None where the kernel cannot make one.
pub fn hugetlb_memfd(size: u64) -> Option<File> {
    try_memfd(
        c"vuc-test-huge",
        libc::MFD_ALLOW_SEALING | libc::MFD_HUGETLB,
        size,
    )
    .ok()
}
