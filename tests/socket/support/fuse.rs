// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A frontend's guest memory in a FUSE file whose server it is: a minimal
//! FUSE server (raw /dev/fuse protocol 7.31) that can leave the FLUSH
//! requests of the daemon's memory-check helpers unanswered.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::time::{Duration, Instant};

use super::conn::{mem_table, Conn, Got, MEM_SIZE, UADDR};
use super::daemon::Daemon;
use crate::common::*;

/// A minimal FUSE server (raw /dev/fuse protocol 7.31) with one regular
/// file `mem` of `MEM_SIZE` bytes; FLUSH requests from children of `spare`
/// (the daemon: its memory-check helpers) are left unanswered while `block`
/// is set.
pub struct FuseMem {
    pub dir: std::path::PathBuf,
    pub dev: File,
    /// Hold every FLUSH from a child of the daemon. (Only its children: a
    /// daemon that another test spawns at the same moment gets a copy of
    /// this test's FUSE descriptors between its fork and its exec, and its
    /// exec's FLUSH must not wait for this test to end.)
    pub block: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Hold those only from a process that asked for the file's
    /// attributes before (GETATTR, which a process in execve does not
    /// send: the helper's `fstat` after its exec), so that the closes of
    /// the helper's execve are answered and those after its checks (its
    /// region files dropped once it has written its answer, its stdout
    /// still open) are held. (`/proc/PID/stat` cannot tell the two
    /// apart either way: reading it for a process inside execve waits for
    /// the exec, here for good.)
    pub block_after_getattr: std::sync::Arc<std::sync::atomic::AtomicBool>,
    pub held: std::sync::Arc<std::sync::Mutex<Vec<u64>>>,
}

/// Field `name` (`"Tgid:"`, `"PPid:"`) of `/proc/TID/status` for thread
/// `tid`, which can be read while the process is inside execve; 0 if
/// unknown.
pub fn fuse_status_field(tid: u32, name: &str) -> u32 {
    std::fs::read_to_string(format!("/proc/{tid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(name).map(|v| v.trim().parse::<u32>().ok()))
                .flatten()
        })
        .unwrap_or(0)
}

/// The thread group of thread `tid`; 0 if unknown.
pub fn fuse_tgid(tid: u32) -> u32 {
    fuse_status_field(tid, "Tgid:")
}

pub fn fuse_attr(ino: u64, mode: u32, size: u64) -> Vec<u8> {
    let mut a = Vec::new();
    for v in [ino, size, size.div_ceil(512), 0, 0, 0] {
        a.extend_from_slice(&v.to_le_bytes());
    }
    for v in [0u32, 0, 0, mode, 1, 0, 0, 0, 4096, 0] {
        a.extend_from_slice(&v.to_le_bytes());
    }
    a
}

impl FuseMem {
    pub fn mount(spare: u32) -> Option<FuseMem> {
        // SAFETY: plain open(2) of a NUL-terminated path.
        let fd = unsafe { libc::open(c"/dev/fuse".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            return None;
        }
        // SAFETY: a fresh descriptor we own.
        let dev = unsafe { File::from_raw_fd(fd) };
        // (One directory per mount: the tests run side by side.)
        static MOUNTS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "vuc-test-fuse-{}-{}",
            std::process::id(),
            MOUNTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let _ = std::fs::create_dir(&dir);
        let cdir = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
        let opts = std::ffi::CString::new(format!("fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other"))
            .unwrap();
        // SAFETY: mount(2) with NUL-terminated strings.
        let r = unsafe {
            libc::mount(
                c"vucfuse".as_ptr(),
                cdir.as_ptr(),
                c"fuse".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                opts.as_ptr().cast(),
            )
        };
        if r < 0 {
            eprintln!("fuse mount: {}", io::Error::last_os_error());
            return None;
        }
        // fusectl, for the abort in Drop (EBUSY when mounted already).
        // SAFETY: mount(2) with NUL-terminated strings.
        unsafe {
            libc::mount(
                c"fusectl".as_ptr(),
                c"/sys/fs/fuse/connections".as_ptr(),
                c"fusectl".as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        let block = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let block_after_getattr = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let held = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (b, bg, mut d, h) = (
            block.clone(),
            block_after_getattr.clone(),
            dev.try_clone().unwrap(),
            held.clone(),
        );
        let mut getattr_from = std::collections::HashSet::new();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let n = match d.read(&mut buf) {
                    Ok(n) => n,
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                    Err(_) => return,
                };
                if n < 40 {
                    continue;
                }
                let u32at = |o: usize| u32::from_le_bytes(buf[o..o + 4].try_into().unwrap());
                let (op, unique, nodeid, pid) = (
                    u32at(4),
                    u64::from_le_bytes(buf[8..16].try_into().unwrap()),
                    u64::from_le_bytes(buf[16..24].try_into().unwrap()),
                    u32at(32),
                );
                let (err, body): (i32, Vec<u8>) = match op {
                    26 => {
                        // INIT
                        let mut o = Vec::new();
                        for v in [7u32, 31, 0, 0] {
                            o.extend_from_slice(&v.to_le_bytes());
                        }
                        o.extend_from_slice(&1u16.to_le_bytes());
                        o.extend_from_slice(&1u16.to_le_bytes());
                        o.extend_from_slice(&65536u32.to_le_bytes());
                        o.extend_from_slice(&1u32.to_le_bytes());
                        o.resize(64, 0);
                        (0, o)
                    }
                    1 => {
                        // LOOKUP
                        let name = &buf[40..n];
                        if name.starts_with(b"mem\0") {
                            let mut o = Vec::new();
                            for v in [2u64, 0, 0, 0] {
                                o.extend_from_slice(&v.to_le_bytes());
                            }
                            o.extend_from_slice(&[0u8; 8]);
                            o.extend_from_slice(&fuse_attr(2, 0o100_666, MEM_SIZE));
                            (0, o)
                        } else {
                            (-libc::ENOENT, Vec::new())
                        }
                    }
                    3 => {
                        // GETATTR
                        if bg.load(std::sync::atomic::Ordering::SeqCst) {
                            let t = fuse_tgid(pid);
                            if t != 0 {
                                getattr_from.insert(t);
                            }
                        }
                        let mut o = vec![0u8; 16];
                        o.extend_from_slice(&if nodeid == 1 {
                            fuse_attr(1, 0o040_777, 0)
                        } else {
                            fuse_attr(2, 0o100_666, MEM_SIZE)
                        });
                        (0, o)
                    }
                    14 | 27 => (0, vec![0u8; 16]), // OPEN, OPENDIR
                    17 => {
                        // STATFS
                        let mut o = vec![0u8; 80];
                        o[40..44].copy_from_slice(&4096u32.to_le_bytes());
                        (0, o)
                    }
                    25 => {
                        // FLUSH
                        let tgid = fuse_tgid(pid);
                        let hold = b.load(std::sync::atomic::Ordering::SeqCst)
                            || (bg.load(std::sync::atomic::Ordering::SeqCst) && getattr_from.contains(&tgid));
                        // (Not the daemon itself, nor this test: neither is
                        // the daemon's child.)
                        if hold && fuse_status_field(pid, "PPid:") == spare {
                            eprintln!("fuse: FLUSH from pid {pid} (tgid {tgid}) left unanswered");
                            h.lock().unwrap().push(unique);
                            continue;
                        }
                        (0, Vec::new())
                    }
                    18 | 29 | 38 => (0, Vec::new()), // RELEASE, RELEASEDIR, DESTROY
                    2 | 42 | 36 => continue,         // FORGET, BATCH_FORGET, INTERRUPT
                    _ => (-libc::ENOSYS, Vec::new()),
                };
                let mut out = Vec::new();
                out.extend_from_slice(&((16 + body.len()) as u32).to_le_bytes());
                out.extend_from_slice(&err.to_le_bytes());
                out.extend_from_slice(&unique.to_le_bytes());
                out.extend_from_slice(&body);
                let _ = d.write(&out);
            }
        });
        Some(FuseMem {
            dir,
            dev,
            block,
            block_after_getattr,
            held,
        })
    }
}

impl Drop for FuseMem {
    fn drop(&mut self) {
        // Abort the connection (every pending request fails with
        // ENOTCONN; fusectl), answer the FLUSHes held, then unmount.
        use std::os::unix::fs::MetadataExt;
        if let Ok(m) = std::fs::metadata(&self.dir) {
            let minor = libc::minor(m.dev());
            let _ = std::fs::write(format!("/sys/fs/fuse/connections/{minor}/abort"), "1");
        }
        for u in self.held.lock().unwrap().drain(..) {
            let mut out = 16u32.to_le_bytes().to_vec();
            out.extend_from_slice(&0i32.to_le_bytes());
            out.extend_from_slice(&u.to_le_bytes());
            let _ = (&self.dev).write(&out);
        }
        let cdir = std::ffi::CString::new(self.dir.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: umount2(2) of our own mount point.
        unsafe { libc::umount2(cdir.as_ptr(), libc::MNT_DETACH) };
        let _ = &self.dev;
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// For the FUSE tests: a daemon and a FUSE server whose FLUSH modes know
/// it, or `None`, recorded as skipped, without root or FUSE.
pub fn fuse_daemon() -> Option<(Daemon, FuseMem)> {
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skipped("mounting FUSE needs root here");
        return None;
    }
    let daemon = Daemon::spawn(&[]);
    let Some(fuse) = FuseMem::mount(daemon.pid()) else {
        skipped("no FUSE here");
        return None;
    };
    Some((daemon, fuse))
}

/// For the FUSE tests: opens the FUSE server's file, sets `hold` (one of
/// `fuse`'s FLUSH modes), sends the file in a SET_MEM_TABLE on a new
/// connection to `daemon` and waits up to 4 s for the answer. Returns the
/// file (to be dropped after `fuse`), the answer and how long it took.
pub fn fuse_mem_table(
    daemon: &Daemon,
    fuse: &FuseMem,
    hold: &std::sync::atomic::AtomicBool,
) -> (File, Got, Duration) {
    let mem = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(fuse.dir.join("mem"))
        .unwrap();
    hold.store(true, std::sync::atomic::Ordering::SeqCst);
    let c = Conn::negotiated(&daemon.sock);
    c.s.set_read_timeout(Some(Duration::from_secs(4))).unwrap();
    c.send(
        SET_MEM_TABLE,
        VERSION_1 | NEED_REPLY,
        &mem_table(&[(0, MEM_SIZE, UADDR, 0)]),
        &[mem.as_raw_fd()],
    )
    .unwrap();
    let start = Instant::now();
    let got = c.recv();
    (mem, got, start.elapsed())
}
