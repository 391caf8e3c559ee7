// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Checks of the guest memory the frontend shares (`SET_MEM_TABLE`,
//! `ADD_MEM_REG`) before the library maps it: each region's file is sealed
//! against shrinking where it can be ([`seal`]), must be a regular file
//! large enough for the region, and a hugetlbfs region gets its huge pages
//! reserved ([`hugetlbfs`]). A region past the end of its file, a file
//! truncated later, or a huge page the pool cannot supply would turn the
//! daemon's first access into SIGBUS.
//!
//! The frontend can make the system calls of these checks wait as long as
//! it likes, so they run in a helper process ([`helper`]) started from a
//! thread of their own, for at most `MEMORY_CHECK_LIMIT` (2 s).

pub mod helper;
pub mod hugetlbfs;
pub mod seal;

use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use log::warn;

use crate::wire::vhost_user::FrontendReq;
use helper::{check_in_helper, HelperError, MEMORY_CHECK_HELPER};
use hugetlbfs::reserve_huge_pages;
use seal::{seal_against_shrinking, ShrinkSeal};

/// Memory checks ([`check_memory_regions_bounded`]) whose thread has not
/// returned, daemon-wide.
static MEMORY_CHECKS_RUNNING: AtomicUsize = AtomicUsize::new(0);

/// Most memory checks that may be running at a time: past it, a memory
/// table is refused at once. (A check that does not return waits on a lock
/// the frontend holds, e.g. the inode lock, uninterruptibly: not even an
/// exit of the daemon could finish then; so the daemon goes on serving,
/// with at most this many threads and 4 × 32 descriptor copies held, and
/// refuses memory tables while they wait.)
pub(crate) const MAX_STUCK_MEMORY_CHECKS: usize = 4;

/// How long the checks of a memory table's files may take: they run on a
/// thread of their own ([`check_memory_regions_bounded`]).
pub(crate) const MEMORY_CHECK_LIMIT: Duration = Duration::from_secs(2);

/// [`check_memory_regions`] in a helper process ([`helper::use_memory_check_helper`];
/// else directly), started from a thread of its own, for at most
/// [`MEMORY_CHECK_LIMIT`]; its warnings are logged. The frontend can make
/// the checks' system calls on its files wait as long as it likes
/// (`F_ADD_SEALS` takes the file's inode lock, which a write of the
/// frontend's own can hold while it waits in a page fault it never
/// resolves; `fstat` of a FUSE file asks the FUSE server; the helper's exec
/// closes copies of a FUSE file, which waits for the server): then the
/// region is refused, a helper process is killed (it dies once the
/// frontend lets it), and the thread is left to finish whenever the
/// frontend lets it (holding copies of the descriptors until then).
/// While [`MAX_STUCK_MEMORY_CHECKS`] such checks wait, tables are refused
/// at once.
///
/// # Errors
/// As [`check_memory_regions`]; `TimedOut` past the limit; `WouldBlock`
/// while too many earlier checks wait; `dup` failing.
pub(crate) fn check_memory_regions_bounded(
    request: FrontendReq,
    payload: &[u8],
    fds: &[File],
    require_sealed: bool,
) -> io::Result<()> {
    // Checks that have not returned hold their thread and copies of up to
    // 32 descriptors each: at most MAX_STUCK_MEMORY_CHECKS at a time.
    if MEMORY_CHECKS_RUNNING.fetch_add(1, Ordering::Relaxed) >= MAX_STUCK_MEMORY_CHECKS {
        MEMORY_CHECKS_RUNNING.fetch_sub(1, Ordering::Relaxed);
        return Err(io::Error::new(
            io::ErrorKind::WouldBlock,
            format!("{MAX_STUCK_MEMORY_CHECKS} earlier memory tables' checks are still blocked"),
        ));
    }
    let done = || MEMORY_CHECKS_RUNNING.fetch_sub(1, Ordering::Relaxed);
    let copies = match fds.iter().map(File::try_clone).collect::<io::Result<Vec<File>>>() {
        Ok(c) => c,
        Err(e) => {
            done();
            return Err(e);
        }
    };
    let payload = payload.to_vec();
    let (tx, rx) = mpsc::channel();
    // Even the helper's start runs on this thread: its exec closes the
    // child's close-on-exec copies of the region files, and closing a FUSE
    // file waits for the frontend's server (FLUSH).
    let spawned = thread::Builder::new().name("vuc-memcheck".into()).spawn(move || {
        let r = match MEMORY_CHECK_HELPER.get() {
            Some(exe) => match check_in_helper(exe, request, &payload, &copies, require_sealed) {
                Err(HelperError::Spawn(e)) => {
                    warn!("cannot start the memory check helper ({e}); checking on this thread");
                    check_memory_regions(request, &payload, &copies, require_sealed)
                }
                Err(HelperError::Check(e)) => Err(e),
                Ok(w) => Ok(w),
            },
            None => check_memory_regions(request, &payload, &copies, require_sealed),
        };
        drop(copies);
        done();
        let _ = tx.send(r);
    });
    if let Err(e) = spawned {
        // (The closure, with the copies, was dropped.)
        done();
        return Err(e);
    }
    match rx.recv_timeout(MEMORY_CHECK_LIMIT) {
        Ok(r) => {
            for w in r? {
                warn!("{w}");
            }
            Ok(())
        }
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("checking the memory regions' files took more than {MEMORY_CHECK_LIMIT:?}"),
        )),
    }
}

/// Seals each region's file of a SET_MEM_TABLE / ADD_MEM_REG against
/// shrinking where it can ([`seal_against_shrinking`]), then checks that the
/// region fits in the file. A region declared larger than its file, or a
/// file truncated later, would make the first access past the end raise
/// SIGBUS in the daemon. A file that cannot be sealed is refused with
/// `require_sealed`, and accepted with a warning otherwise. The payload is
/// `VhostUserMemory` (u32 count, u32 padding, then 32-byte regions: guest
/// address, size, frontend address, mmap offset), or for ADD_MEM_REG an u64
/// padding and one region (vhost-user spec, "Memory regions description").
/// (Public for the `socket` fuzz target, `tools/fuzz`.)
pub fn check_memory_regions(
    request: FrontendReq,
    payload: &[u8],
    fds: &[File],
    require_sealed: bool,
) -> io::Result<Vec<String>> {
    let mut warnings = Vec::new();
    let bad = |m: String| Err(io::Error::new(io::ErrorKind::InvalidData, m));
    let regions = if request == FrontendReq::SET_MEM_TABLE {
        payload.get(8..)
    } else {
        payload.get(8..40)
    };
    let Some(regions) = regions else {
        return bad("memory table too short".into());
    };
    if regions.len() / 32 < fds.len() {
        // Every descriptor is checked below, or none is forwarded.
        return bad(format!(
            "{} descriptors for {} memory regions",
            fds.len(),
            regions.len() / 32
        ));
    }
    for (i, r) in regions.chunks_exact(32).enumerate() {
        let word = |o: usize| u64::from_le_bytes(r[o..o + 8].try_into().unwrap_or_default());
        let (size, offset) = (word(8), word(24));
        let Some(file) = fds.get(i) else {
            // The library refuses a region without a descriptor itself.
            continue;
        };
        match seal_against_shrinking(file) {
            ShrinkSeal::Present | ShrinkSeal::Added => {}
            ShrinkSeal::Impossible(why) if require_sealed => {
                return bad(format!(
                    "memory region {i}: its file cannot be sealed against shrinking ({why}), \
                     and --require-sealed-memory is set"
                ));
            }
            ShrinkSeal::Impossible(why) => warnings.push(format!(
                "memory region {i}: its file cannot be sealed against shrinking ({why}); \
                 if the frontend truncates it, the daemon dies of SIGBUS (--require-sealed-memory \
                 refuses such regions)"
            )),
        }
        let meta = file.metadata()?;
        if !meta.file_type().is_file() {
            return bad(format!("memory region {i}: its descriptor is not a regular file"));
        }
        let file_len = meta.len();
        if offset.checked_add(size).is_none_or(|end| end > file_len) {
            return bad(format!(
                "memory region {i}: {size} bytes at offset {offset} do not fit its {file_len}-byte file"
            ));
        }
        reserve_huge_pages(file, offset, size)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("memory region {i}: {e}")))?;
    }
    Ok(warnings)
}

#[cfg(test)]
pub(crate) mod test_files {
    //! Memory tables and files for the tests of this module and of the
    //! frontend compatibility layer.
    use std::fs::File;
    use std::io;
    use std::os::fd::{AsRawFd, FromRawFd};

    /// SET_MEM_TABLE payload with one region of `size` bytes at file `offset`.
    pub(crate) fn table(size: u64, offset: u64) -> Vec<u8> {
        let mut p = vec![1, 0, 0, 0, 0, 0, 0, 0];
        for w in [0u64, size, 0x7f00_0000_0000, offset] {
            p.extend_from_slice(&w.to_le_bytes());
        }
        p
    }

    /// A memfd of `len` bytes made with `flags` (besides MFD_CLOEXEC).
    pub(crate) fn memfd(flags: libc::c_uint, len: u64) -> File {
        // SAFETY: a valid NUL-terminated name; the result is checked.
        let fd = unsafe { libc::memfd_create(c"proxy-test".as_ptr(), libc::MFD_CLOEXEC | flags) };
        assert!(fd >= 0, "memfd_create: {}", io::Error::last_os_error());
        // SAFETY: a fresh descriptor we own.
        let f = unsafe { File::from_raw_fd(fd) };
        f.set_len(len).unwrap();
        f
    }

    pub(crate) fn seals(f: &File) -> i32 {
        // SAFETY: F_GET_SEALS on a descriptor we own.
        unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GET_SEALS) }
    }
}

#[cfg(test)]
mod tests {
    use super::test_files::{memfd, seals, table};
    use super::*;
    use std::os::fd::{AsRawFd, FromRawFd};

    #[test]
    fn memory_checks_fall_back_to_a_thread_when_the_helper_cannot_start() {
        // (Process-wide: other tests' tables then fall back the same way.)
        helper::use_memory_check_helper("/nonexistent/vuc-memory-check".into());
        let f = [memfd(libc::MFD_ALLOW_SEALING, 1 << 20)];
        let check = |p: &[u8]| check_memory_regions_bounded(FrontendReq::SET_MEM_TABLE, p, &f, false);
        check(&table(1 << 20, 0)).unwrap();
        assert_eq!(seals(&f[0]) & libc::F_SEAL_SHRINK, libc::F_SEAL_SHRINK);
        let e = check(&table(2 << 20, 0)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    }

    #[test]
    fn memory_regions_must_fit_their_files() {
        let f = tempfile::tempfile().unwrap();
        f.set_len(1 << 20).unwrap();
        let fds = [f];
        for require in [false, true] {
            let sealable = [memfd(libc::MFD_ALLOW_SEALING, 1 << 20)];
            let check = |p: &[u8]| check_memory_regions(FrontendReq::SET_MEM_TABLE, p, &sealable, require);
            assert!(check(&table(1 << 20, 0)).is_ok());
            assert!(check(&table(4096, (1 << 20) - 4096)).is_ok());
            for (size, offset) in [(2 << 20, 0), (4096, 1 << 20), (u64::MAX, 4096)] {
                let e = check(&table(size, offset)).unwrap_err();
                assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{size} at {offset}");
            }
        }
        // A plain file fits too, and is accepted while sealing is not required.
        assert!(check_memory_regions(FrontendReq::SET_MEM_TABLE, &table(1 << 20, 0), &fds, false).is_ok());
        // ADD_MEM_REG: u64 padding then one region.
        let mut add = vec![0u8; 8];
        add.extend_from_slice(&table(2 << 20, 0)[8..]);
        assert!(check_memory_regions(FrontendReq::ADD_MEM_REG, &add, &fds, false).is_err());
    }

    #[test]
    fn sealable_memfds_get_f_seal_shrink() {
        let f = memfd(libc::MFD_ALLOW_SEALING, 1 << 20);
        assert_eq!(seals(&f), 0, "a fresh MFD_ALLOW_SEALING memfd has no seals");
        assert!(check_memory_regions(FrontendReq::SET_MEM_TABLE, &table(1 << 20, 0), &[f], true).is_ok());
        let f = memfd(libc::MFD_ALLOW_SEALING, 1 << 20);
        assert_eq!(seal_against_shrinking(&f), ShrinkSeal::Added);
        assert_eq!(seals(&f), libc::F_SEAL_SHRINK);
        // Shrinking now fails for everyone (fcntl(2): EPERM); growing does not.
        let e = f.set_len(4096).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPERM));
        f.set_len(2 << 20).unwrap();
        assert_eq!(f.metadata().unwrap().len(), 2 << 20);
        assert_eq!(seal_against_shrinking(&f), ShrinkSeal::Present);
        // QEMU's memory-backend-memfd (seal=on): GROW | SHRINK | SEAL.
        let q = memfd(libc::MFD_ALLOW_SEALING, 1 << 20);
        let qemu = libc::F_SEAL_GROW | libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL;
        // SAFETY: F_ADD_SEALS with an int on a descriptor we own.
        assert_eq!(unsafe { libc::fcntl(q.as_raw_fd(), libc::F_ADD_SEALS, qemu) }, 0);
        assert_eq!(seal_against_shrinking(&q), ShrinkSeal::Present);
        assert_eq!(seals(&q), qemu);
    }

    #[test]
    fn unsealable_files_are_accepted_unless_sealing_is_required() {
        let plain = tempfile::tempfile().unwrap();
        plain.set_len(1 << 20).unwrap();
        // A memfd without MFD_ALLOW_SEALING (QEMU's memory-backend-memfd with
        // seal=off, util/memfd.c) carries F_SEAL_SEAL from birth.
        let no_sealing = memfd(0, 1 << 20);
        assert_eq!(seals(&no_sealing), libc::F_SEAL_SEAL);
        for f in [plain, no_sealing] {
            assert!(
                matches!(seal_against_shrinking(&f), ShrinkSeal::Impossible(_)),
                "{f:?}"
            );
            let fds = [f];
            assert!(
                check_memory_regions(FrontendReq::SET_MEM_TABLE, &table(1 << 20, 0), &fds, false).is_ok()
            );
            let e =
                check_memory_regions(FrontendReq::SET_MEM_TABLE, &table(1 << 20, 0), &fds, true).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData);
            assert!(e.to_string().contains("cannot be sealed"), "{e}");
            // Nothing was sealed, and the frontend can still resize its file.
            fds[0].set_len(4096).unwrap();
        }
        // Neither is a file of another kind.
        let efd = vmm_sys_util::eventfd::EventFd::new(0).unwrap();
        // SAFETY: dup of a live descriptor; the copy is owned by the File.
        let dup = unsafe { File::from_raw_fd(libc::dup(efd.as_raw_fd())) };
        assert!(matches!(seal_against_shrinking(&dup), ShrinkSeal::Impossible(_)));
    }
}
