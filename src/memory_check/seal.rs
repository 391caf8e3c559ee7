// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Sealing guest memory files against shrinking (`F_SEAL_SHRINK`).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// Whether a guest memory file is protected against shrinking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShrinkSeal {
    /// `F_SEAL_SHRINK` was set already (QEMU's `memory-backend-memfd` with
    /// its default `seal=on` sets `F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL`).
    Present,
    /// It was not, and [`seal_against_shrinking`] added it.
    Added,
    /// The file cannot get it: not a memfd (a `/dev/shm` or hugetlbfs file
    /// of `memory-backend-file`, anything else), or a memfd made without
    /// `MFD_ALLOW_SEALING` (`memory-backend-memfd` with `seal=off`). Why,
    /// for the log.
    Impossible(String),
}

/// Makes sure `file` has `F_SEAL_SHRINK`, adding it if the file allows
/// (memfd_create(2), "File sealing" in fcntl(2)): a sealed file can no
/// longer be made smaller by anyone, so memory mapped from it cannot turn
/// into SIGBUS under the daemon. The seal stays on the frontend's file for
/// good (seals cannot be removed); growing it and punching holes are still
/// allowed, and a frontend has no reason to shrink guest memory it shares.
pub fn seal_against_shrinking(file: &File) -> ShrinkSeal {
    let fd = file.as_raw_fd();
    // SAFETY: fcntl(F_GET_SEALS) on a descriptor `file` owns; it takes no
    // argument and touches no memory of ours.
    let seals = unsafe { libc::fcntl(fd, libc::F_GET_SEALS) };
    if seals < 0 {
        let e = io::Error::last_os_error();
        return ShrinkSeal::Impossible(format!("no file seals on it: F_GET_SEALS: {e}"));
    }
    if seals & libc::F_SEAL_SHRINK != 0 {
        return ShrinkSeal::Present;
    }
    if seals & libc::F_SEAL_SEAL != 0 {
        return ShrinkSeal::Impossible(
            "F_SEAL_SEAL is set without F_SEAL_SHRINK (a memfd made without MFD_ALLOW_SEALING, \
             or a tmpfs or hugetlbfs file)"
                .into(),
        );
    }
    // SAFETY: fcntl(F_ADD_SEALS) with an int argument on a descriptor `file`
    // owns; it touches no memory of ours.
    if unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) } < 0 {
        let e = io::Error::last_os_error();
        return ShrinkSeal::Impossible(format!("F_ADD_SEALS(F_SEAL_SHRINK): {e}"));
    }
    ShrinkSeal::Added
}
