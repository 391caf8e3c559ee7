// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The checks of a memory table's files, which run in a helper process
//! within 2 s (docs/RELIABILITY.md, "Guest memory sealing"), against
//! frontends that make them wait: a memfd whose inode lock the frontend
//! holds, and a FUSE file whose FLUSH it never answers. The daemon tears
//! the connection down and serves the next frontend, or exits with status
//! 3 as its last resort, and the checks left waiting do not pile up.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::time::{Duration, Instant};

use crate::common::*;
use crate::support::*;

/// Keeps the inode lock of `mem` (a shmem file) held: a thread writes to
/// it from a page registered with a userfaultfd nobody serves, so the
/// write waits in the page fault with the lock taken (shmem's write path
/// holds it across the copy). Dropping the returned userfaultfd lets the
/// fault and the write finish. None where userfaultfd is not available.
fn hold_inode_lock(mem: &File) -> Option<(File, std::thread::JoinHandle<()>)> {
    // SAFETY: userfaultfd(2) with flags; the result is checked.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC) } as RawFd;
    if fd < 0 {
        return None;
    }
    // SAFETY: a fresh descriptor we own.
    let uffd = unsafe { File::from_raw_fd(fd) };
    // struct uffdio_api { api, features, ioctls }: UFFDIO_API = _IOWR(0xAA, 0x3F, 24 bytes).
    let mut api = [0xAAu64, 0, 0];
    // SAFETY: ioctl with a 24-byte struct of ours.
    if unsafe { libc::ioctl(fd, 0xc018_aa3f, api.as_mut_ptr()) } < 0 {
        return None;
    }
    // SAFETY: an anonymous private page, checked below.
    let page = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(page, libc::MAP_FAILED);
    // struct uffdio_register { start, len, mode, ioctls }: _IOWR(0xAA, 0x00, 32 bytes); MODE_MISSING = 1.
    let mut reg = [page as u64, 4096, 1, 0];
    // SAFETY: ioctl with a 32-byte struct of ours.
    if unsafe { libc::ioctl(fd, 0xc020_aa00, reg.as_mut_ptr()) } < 0 {
        return None;
    }
    let writer = mem.try_clone().unwrap();
    let addr = page as usize;
    let t = std::thread::spawn(move || {
        // SAFETY: pwrite from the registered page (its fault waits until
        // the userfaultfd is closed); the page stays mapped for good.
        unsafe { libc::pwrite(writer.as_raw_fd(), addr as *const libc::c_void, 4096, 0) };
    });
    // Wait until the writer sits in the fault.
    let start = Instant::now();
    loop {
        let tid_wchan = std::fs::read_dir("/proc/self/task")
            .unwrap()
            .flatten()
            .any(|t| std::fs::read_to_string(t.path().join("wchan")).is_ok_and(|w| w.contains("userfault")));
        if tid_wchan {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the writer never reached the fault"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    Some((uffd, t))
}

/// A sealable memfd of [`MEM_SIZE`] whose inode lock [`hold_inode_lock`]
/// holds until [`LockedMemfd::release`]; None (the test skips) where
/// userfaultfd is not available.
struct LockedMemfd {
    mem: File,
    uffd: File,
    writer: std::thread::JoinHandle<()>,
}

impl LockedMemfd {
    fn new() -> Option<Self> {
        let mem = sealable_memfd(MEM_SIZE);
        let (uffd, writer) = hold_inode_lock(&mem)?;
        Some(LockedMemfd { mem, uffd, writer })
    }

    /// Lets the stuck write (and any check of the daemon's waiting on the
    /// lock) go on, and waits for the write.
    fn release(self) {
        drop(self.uffd);
        self.writer.join().unwrap();
    }
}

/// The frontend holds the inode lock of its guest memory memfd (a write
/// to it stuck in a page fault) while it sends SET_MEM_TABLE: the proxy's
/// F_ADD_SEALS (memfd_add_seals takes the inode lock) then waits on the
/// request pump for as long as the frontend likes. Once the frontend has
/// left, the daemon must still tear the connection down and serve the
/// next frontend (or exit with status 3 as a last resort), not hang.
#[test]
fn a_frontend_holding_its_memfd_locked_cannot_wedge_the_daemon() {
    let mut daemon = Daemon::spawn(&[]);
    let Some(locked) = LockedMemfd::new() else {
        skipped("no userfaultfd here");
        return;
    };
    let table = mem_table(&[(0, MEM_SIZE, UADDR, 0)]);
    let first = match send_mem_table(&daemon.sock, &table, &[locked.mem.as_raw_fd()]) {
        Got::Msg(r, f, p) => format!("reply {r} (flags {f:#x}, {} bytes)", p.len()),
        other => format!("{other:?}"),
    };
    // The checks of the table's files give up after 2 s.
    let r = served_within(&mut daemon, Duration::from_secs(5));
    // Let the write (and the daemon's check) go on.
    locked.release();
    match r {
        Ok(t) => eprintln!("next frontend served after {t:?}"),
        Err(e) => panic!("SET_MEM_TABLE (answer: {first}), then disconnect: {e}"),
    }
    // Refused once its checks took 2 s: the connection ends.
    assert_eq!(first, "Closed", "SET_MEM_TABLE of a file held busy");
}

/// A memory table whose checks time out leaves its check behind, holding
/// copies of every descriptor of the table, for as long as the frontend
/// keeps its file busy (the check waits uninterruptibly on the inode
/// lock). Without a bound each frontend that leaves such a table would add
/// 32 descriptors and a thread to the daemon, up to its descriptor limit
/// (at 32 per 2 s, the default 20,000 in about 21 minutes), and later
/// frontends would meet EMFILE. The checks run in helper processes, at
/// most 4 of them waiting at a time; further tables are refused at once
/// while they do, and the daemon serves again once the frontend lets go.
#[test]
fn memory_checks_left_behind_do_not_pile_up_descriptors() {
    let mut daemon = Daemon::spawn(&[]);
    let Some(locked) = LockedMemfd::new() else {
        skipped("no userfaultfd here");
        return;
    };
    let base = daemon.idle_snapshot();
    let regions: Vec<(u64, u64, u64, u64)> = (0..32u64)
        .map(|i| (i * 4096, 4096, UADDR + i * 4096, i * 4096))
        .collect();
    let table = mem_table(&regions);
    let fds = vec![locked.mem.as_raw_fd(); 32];
    let n = 12;
    for _ in 0..n {
        let _ = send_mem_table(&daemon.sock, &table, &fds);
    }
    let after = daemon.idle_snapshot();
    locked.release();
    eprintln!(
        "after {n} tables of 32 regions in a locked memfd: fds {} -> {}, threads {} -> {}",
        base.fds, after.fds, base.threads, after.threads
    );
    daemon.assert_alive("memory tables of a locked memfd");
    // Once the frontend lets go, the checks return: the next frontend gets
    // its memory table.
    assert_nist(&daemon.sock, "memory tables of a locked memfd");
    // The checks run in helper processes, started from at most 4 threads
    // at a time; a thread holds copies of the table's descriptors until its
    // helper is given up (2 s): bounded, not growing with the frontends.
    assert!(
        after.fds <= base.fds + 4 * 32 + 64,
        "{n} frontends, each gone after its table's checks timed out, left the daemon with {} more \
         descriptors and {} more threads (nothing bounds them)",
        after.fds - base.fds,
        after.threads - base.threads
    );
}

/// A memory table whose checks time out leaves a check waiting
/// uninterruptibly on the frontend's inode lock. The teardown's last
/// resort, exit status 3, is still reachable meanwhile (here: more than
/// 256 descriptors left behind a blocked close). A check on a thread of
/// the daemon's would keep exit_group from finishing while that thread
/// waits: the process would stay, serving nobody, until the frontend let
/// go. The checks run in a helper process, so the daemon's exit finishes
/// while the lock is still held.
#[test]
fn exit_status_3_finishes_while_a_memory_check_waits_on_the_frontends_lock() {
    let mut daemon = Daemon::spawn(&[]);
    let Some(locked) = LockedMemfd::new() else {
        skipped("no userfaultfd here");
        return;
    };
    // 1. One memory table whose checks time out (one vuc-memcheck left).
    let table = mem_table(&[(0, MEM_SIZE, UADDR, 0)]);
    assert!(
        matches!(
            send_mem_table(&daemon.sock, &table, &[locked.mem.as_raw_fd()]),
            Got::Closed
        ),
        "table of a locked memfd refused"
    );
    served_within(&mut daemon, Duration::from_secs(5)).expect("served with one check left waiting");

    // 2. Another connection leaves more than 256 descriptors behind a
    // blocked close: the teardown's last resort, exit status 3.
    let c = Conn::negotiated(&daemon.sock);
    let (peer, sent) = queue_behind_a_blocked_close(&c, 640);
    assert!(sent > 256, "only {sent} descriptors taken");
    drop(c);
    // The exit-3 line comes 10 s into the teardown; the exit cannot finish.
    daemon.until_logged("exiting (status 3)", Duration::from_secs(30), "no exit-3 line");
    let start = Instant::now();
    let status = loop {
        if let Some(st) = daemon.child.try_wait().unwrap() {
            break Some(st);
        }
        if start.elapsed() > Duration::from_secs(5) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // Only now does the frontend let go.
    locked.release();
    drop(peer);
    let status = status.expect("the daemon's exit did not finish while the frontend held its lock");
    assert_eq!(status.code(), Some(3), "exit status");
}

/// The frontend's memory file is a FUSE file (its own FUSE server). Every
/// close of a FUSE file descriptor, even of one copy, sends FLUSH to the
/// server and waits for it, uninterruptibly. The forked helper's execve
/// closes its close-on-exec copies of the region descriptors (the received
/// one, the F_DUPFD_CLOEXEC copies of pre_exec), and the standard
/// library's `spawn` waits for the exec to finish, on the request pump,
/// before `check_in_helper`'s 2 s limit even starts: a frontend holding
/// those FLUSHes could hold the pump for as long as it likes. Only
/// FLUSHes from the daemon's children (its helpers) are held here, the
/// daemon's own closes are answered: the SET_MEM_TABLE must still be
/// answered within 4 s and the next frontend served.
#[test]
fn a_frontend_that_never_answers_the_helpers_flush_cannot_wedge_the_daemon() {
    let Some((mut daemon, fuse)) = fuse_daemon() else {
        return;
    };
    let (mem, got, took) = fuse_mem_table(&daemon, &fuse, &fuse.block);
    let answered = !matches!(got, Got::TimedOut);
    eprintln!(
        "SET_MEM_TABLE of a FUSE file: {} after {took:?}",
        match got {
            Got::Msg(r, ..) => format!("reply to {r}"),
            Got::Closed => "disconnect".into(),
            Got::TimedOut => "nothing".into(),
        },
    );
    let served = served_within(&mut daemon, Duration::from_secs(5));
    let pid = daemon.pid();
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        let p = t.path();
        let r = |f: &str| std::fs::read_to_string(p.join(f)).unwrap_or_default();
        eprintln!(
            "daemon thread {:?} {} wchan {}",
            t.file_name(),
            r("comm").trim(),
            r("wchan")
        );
    }
    // (The forked child is not inspected: reads of most of its /proc
    // files, such as stat, wait while it is inside execve.)
    let held = fuse.held.lock().unwrap().len();
    eprintln!("next frontend: {served:?}; FLUSHes held: {held}");
    // Let everything go before asserting (the helper, then the daemon).
    fuse.block.store(false, std::sync::atomic::Ordering::SeqCst);
    drop(fuse);
    drop(mem);
    // (Otherwise no FLUSH of the helper's was held: the test would show
    // nothing.)
    assert!(held > 0, "no FLUSH from the helper was held");
    assert!(
        answered,
        "no answer to SET_MEM_TABLE within 4 s (the pump waits for the helper)"
    );
    served.expect("the next frontend after a FUSE memory table whose helper's FLUSH is never answered");
    daemon.assert_alive("a FUSE memory table");
}

/// The other end of the same: the helper's execve gets its FLUSHes
/// answered and the helper writes its answer, but then it closes its
/// region files (dropped when `memory_check_helper_main` returns, before
/// its exit, its stdout still open), and that close waits on a FLUSH the
/// frontend never answers. The daemon takes the answer at its last line
/// (EOF never comes) and waits at most 100 ms for the helper to be reaped
/// (then keeps it with the stuck ones). Waiting for the helper's exit
/// (`child.wait()` in `reap_or_keep`) or for EOF instead runs into the
/// check's 2 s limit: a region whose check passed is refused with a
/// disconnect, as this test then shows.
#[test]
fn a_frontend_that_never_answers_the_flush_after_the_helpers_answer_cannot_wedge_the_daemon() {
    let Some((mut daemon, fuse)) = fuse_daemon() else {
        return;
    };
    let (mem, got, took) = fuse_mem_table(&daemon, &fuse, &fuse.block_after_getattr);
    // Accepted (a FUSE file cannot be sealed: without
    // --require-sealed-memory that is a warning, and the reply is 0).
    let answered =
        matches!(&got, Got::Msg(r, _, p) if *r == SET_MEM_TABLE && p.as_slice() == 0u64.to_le_bytes());
    eprintln!(
        "SET_MEM_TABLE of a FUSE file, the helper's last FLUSH held: answered {answered} after {took:?}"
    );
    let served = served_within(&mut daemon, Duration::from_secs(5));
    // (The FUSE server may take the FLUSH off /dev/fuse a little later.)
    let until = Instant::now() + Duration::from_secs(2);
    let held = loop {
        let held = fuse.held.lock().unwrap().len();
        if held > 0 || Instant::now() >= until {
            break held;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    eprintln!("next frontend: {served:?}; FLUSHes held: {held}");
    fuse.block_after_getattr
        .store(false, std::sync::atomic::Ordering::SeqCst);
    drop(fuse);
    drop(mem);
    // (Otherwise the helper never reached its last close: the test would
    // show nothing.)
    assert!(held > 0, "no FLUSH from the helper after its answer was held");
    assert!(
        answered,
        "no reply to SET_MEM_TABLE (the check waited for the helper's last close, past its limit)"
    );
    // About 100 ms (the reap's wait); a much longer wait would delay every
    // FUSE-backed memory table and race the check's 2 s limit.
    assert!(
        took < Duration::from_secs(1),
        "SET_MEM_TABLE answered only after {took:?}"
    );
    served.expect("the next frontend after a FUSE memory table whose helper's last FLUSH is never answered");
    daemon.assert_alive("a FUSE memory table");
}
