// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The queue workers' seccomp filter (`src/seccomp.rs`, docs/RELIABILITY.md
//! "Least privilege").
//!
//! A denied syscall kills the whole process, so the filter itself is tested
//! in child processes (this test binary run again with `VUC_SECCOMP_CHILD`
//! naming a scenario): a thread that installs the filter is killed by
//! SIGSYS for syscalls off the list (`socket`, an executable `mmap`, a
//! thread spawn, a `futex` requeue), gets `EACCES` from `openat`, and can do
//! everything a queue worker does, down to dropping the last reference to a
//! guest memory map and exiting. Then the daemon binary: its queue workers
//! run under the filter (`Seccomp: 2` in /proc) by default and serve NIST
//! SP 800-38A F.2.1, its other threads do not; with `--seccomp off` no
//! thread does.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::daemon::{self, spawn_daemon_logged};
use crate::common::{frontend_config, try_memfd, NIST_CT, NIST_IV, NIST_KEY, NIST_PT, OK};
use vhost_crypto_replay::frontend::CryptoFrontend;
use vhost_user_crypto::seccomp::WorkerFilter;
use vhost_user_crypto::wire::session::SymSessionInfo;
use vhost_user_crypto::wire::virtio_crypto::OpDataReq;
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// Environment variable naming the scenario a child process runs.
const CHILD: &str = "VUC_SECCOMP_CHILD";

/// The libtest name of [`child`] in this binary.
const CHILD_TEST: &str = "seccomp::child";

/// Runs scenario `name` in a child process ([`CHILD_TEST`] of this binary).
fn run_child(name: &str) -> Output {
    let exe = std::env::current_exe().unwrap();
    Command::new(exe)
        .args([
            "--exact",
            CHILD_TEST,
            "--include-ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD, name)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs `f` on a new thread that installs the worker filter first (as a
/// queue worker does on its first event) and joins it.
fn confined<T: Send + 'static>(filter: &WorkerFilter, f: impl FnOnce() -> T + Send + 'static) -> T {
    let filter = filter.clone();
    std::thread::spawn(move || {
        filter.apply().unwrap();
        println!("filter installed");
        f()
    })
    .join()
    .unwrap()
}

/// The child side: runs the scenario named by `VUC_SECCOMP_CHILD` (nothing
/// when it is not set: the parent tests below start it).
#[test]
#[ignore = "a child process of the other tests in this file"]
fn child() {
    let Ok(scenario) = std::env::var(CHILD) else {
        return;
    };
    // No core files from the SIGSYS kills.
    let none = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: setrlimit with a valid rlimit struct.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_CORE, &none) }, 0);
    let filter = WorkerFilter::new().unwrap();
    // Ends libtest's "test child ... " line, so each line below is whole.
    println!();
    match scenario.as_str() {
        "socket" => confined(&filter, || {
            // SAFETY: plain socket(2) call; no memory is passed.
            let r = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) };
            println!("socket returned {r}");
        }),
        "mmap_exec" => confined(&filter, || {
            // SAFETY: an anonymous private mapping; the result is only printed.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    4096,
                    libc::PROT_READ | libc::PROT_EXEC,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            println!("mmap returned {p:?}");
        }),
        "spawn" => confined(&filter, || {
            let t = std::thread::spawn(|| 1);
            println!("spawn returned {:?}", t.join());
        }),
        "futex_requeue" => confined(&filter, || {
            let word = std::sync::atomic::AtomicU32::new(0);
            // SAFETY: FUTEX_CMP_REQUEUE on a live u32 of ours as both
            // futexes; nobody waits on it, so it would return 0.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    word.as_ptr(),
                    libc::FUTEX_CMP_REQUEUE | libc::FUTEX_PRIVATE_FLAG,
                    1,
                    1,
                    word.as_ptr(),
                    0,
                )
            };
            println!("futex requeue returned {r}");
        }),
        "sigaction_usr1" => confined(&filter, || {
            // SAFETY: sigaction(2) reading SIGUSR1's action into a zeroed
            // struct of ours (no new action).
            let r = unsafe {
                let mut old: libc::sigaction = std::mem::zeroed();
                libc::sigaction(libc::SIGUSR1, std::ptr::null(), &mut old)
            };
            println!("sigaction SIGUSR1 returned {r}");
        }),
        "fcntl_setfl" => confined(&filter, || {
            // SAFETY: fcntl(F_SETFL) on stdin with an int argument.
            let r = unsafe { libc::fcntl(0, libc::F_SETFL, libc::O_NONBLOCK) };
            println!("fcntl F_SETFL returned {r}");
        }),
        "panic" => {
            // A panic on a filtered thread, with a backtrace: it ends that
            // thread, which the join reports.
            std::env::set_var("RUST_BACKTRACE", "1");
            let filter = filter.clone();
            let joined = std::thread::spawn(move || {
                filter.apply().unwrap();
                println!("filter installed");
                panic!("a panic on a filtered thread");
            })
            .join();
            println!("the panicking thread ended: {}", joined.is_err());
        }
        "sigbus" => {
            // A mapping whose file shrinks under it (guest memory truncated
            // by the frontend), made before the filter as the daemon maps
            // guest memory: the filtered thread's next access raises SIGBUS,
            // which std's handler hands back to the default action.
            let f = try_memfd(c"seccomp-sigbus", 0, 8192).unwrap();
            let fd = f.as_raw_fd();
            // SAFETY: a shared read-only mapping of the 8 KiB file; the
            // result is checked.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    8192,
                    libc::PROT_READ,
                    libc::MAP_SHARED,
                    fd,
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED);
            f.set_len(0).unwrap();
            let at = p as usize;
            confined(&filter, move || {
                // SAFETY: inside the mapping; the page is past the file's
                // end now, so the read raises SIGBUS (the point of the
                // scenario).
                let b = unsafe { std::ptr::read_volatile(at as *const u8) };
                println!("read past the end returned {b}");
            })
        }
        "worker" => worker_scenario(&filter),
        other => panic!("unknown scenario {other}"),
    }
    println!("scenario done");
}

/// Everything a queue worker does, on two filtered threads: eventfds, epoll,
/// contended locks, channels, a HashMap seed, clocks, logging to stderr,
/// allocation that grows and trims heaps, openat (EACCES), dropping the last
/// reference to a memfd-backed guest memory map (munmap, close), and exit.
fn worker_scenario(filter: &WorkerFilter) {
    let kick = EventFd::new(EFD_NONBLOCK).unwrap();
    let call = EventFd::new(EFD_NONBLOCK).unwrap();
    let epoll = Epoll::new().unwrap();
    epoll
        .ctl(
            ControlOperation::Add,
            kick.as_raw_fd(),
            EpollEvent::new(EventSet::IN, 7),
        )
        .unwrap();
    let memfd = || try_memfd(c"seccomp-test", 0, 1 << 20).unwrap();
    let guest = |f: File| {
        GuestMemoryMmap::<()>::from_ranges_with_files([(
            GuestAddress(0),
            1 << 20,
            Some(FileOffset::new(f, 0)),
        )])
        .unwrap()
    };
    let atomic = GuestMemoryAtomic::new(guest(memfd()));
    let counter = Arc::new(Mutex::new(0u64));
    let (to_main, from_worker) = mpsc::channel::<()>();
    let (to_worker, from_main) = mpsc::channel::<()>();

    let contender = {
        let filter = filter.clone();
        let counter = counter.clone();
        std::thread::spawn(move || {
            filter.apply().unwrap();
            for _ in 0..200_000 {
                *counter.lock().unwrap() += 1;
            }
        })
    };
    let worker = {
        let filter = filter.clone();
        let counter = counter.clone();
        let atomic = atomic.clone();
        std::thread::spawn(move || {
            filter.apply().unwrap();
            // The library's loop: epoll_wait, then read the kick.
            kick.write(1).unwrap();
            let mut events = vec![EpollEvent::default(); 4];
            let n = epoll.wait(1000, &mut events).unwrap();
            println!("epoll events: {n} data {}", events[0].data());
            println!("kick: {}", kick.read().unwrap());
            // Contended lock (futex), a HashMap (getrandom), clocks.
            for _ in 0..200_000 {
                *counter.lock().unwrap() += 1;
            }
            let mut m = HashMap::new();
            m.insert(1u64, 2u64);
            let t = Instant::now();
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: clock_gettime through the syscall itself (not the
            // vDSO), into a timespec of ours.
            let r = unsafe { libc::syscall(libc::SYS_clock_gettime, libc::CLOCK_MONOTONIC, &mut ts) };
            println!(
                "clock_gettime syscall: {r}, {:?}",
                t.elapsed() < Duration::from_secs(5)
            );
            eprintln!("a log line to stderr from a filtered thread");
            // Heaps grow and shrink: glibc's first trim of a thread heap
            // opens /proc/sys/vm/overcommit_memory, which gets EACCES.
            for _ in 0..3 {
                let blocks: Vec<Vec<u8>> = (0..40).map(|i| vec![i as u8; 100_000]).collect();
                drop(blocks);
                drop(vec![1u8; 8 << 20]);
            }
            match File::open("/etc/hostname") {
                Err(e) => println!(
                    "openat: {}",
                    if e.raw_os_error() == Some(libc::EACCES) {
                        "EACCES"
                    } else {
                        "other"
                    }
                ),
                Ok(_) => println!("openat: opened"),
            }
            // A guest memory map replaced while this thread holds it: the
            // last reference goes here (munmap, close of its memfd).
            let guard = atomic.memory();
            guard.write_obj(0x5au8, GuestAddress(0x1000)).unwrap();
            to_main.send(()).unwrap();
            from_main.recv().unwrap();
            let byte: u8 = guard.read_obj(GuestAddress(0x1000)).unwrap();
            drop(guard);
            println!("old guest memory dropped here, read back {byte:#x}");
            // The used-ring notification.
            call.write(1).unwrap();
            call
        })
    };
    from_worker.recv().unwrap();
    atomic.lock().unwrap().replace(guest(memfd()));
    to_worker.send(()).unwrap();
    let call = worker.join().expect("worker thread");
    contender.join().expect("contender thread");
    println!("call: {}", call.read().unwrap());
    println!("counter: {}", *counter.lock().unwrap());
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    println!(
        "memfd mappings left: {}",
        maps.lines().filter(|l| l.contains("memfd:seccomp-test")).count()
    );
}

/// Runs scenario `name`, which must exit successfully: its (stdout, stderr).
#[track_caller]
fn run_child_to_the_end(name: &str) -> (String, String) {
    let out = run_child(name);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(
        out.status.success(),
        "{name}: {:?}\n{stdout}\n{stderr}",
        out.status
    );
    (stdout, stderr)
}

#[track_caller]
fn assert_killed_by_sigsys(name: &str) {
    assert_killed_by(name, libc::SIGSYS);
}

/// Scenario `name` installs the filter, then dies of `signal` before its
/// syscall or access returns.
#[track_caller]
fn assert_killed_by(name: &str, signal: i32) {
    let out = run_child(name);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.signal(),
        Some(signal),
        "{name}: {:?}\n{stdout}\n{}",
        out.status,
        text(&out.stderr)
    );
    assert!(stdout.contains("filter installed"), "{name}: {stdout}");
    assert!(!stdout.contains("returned"), "{name} went through: {stdout}");
}

#[test]
fn a_syscall_off_the_list_kills_the_process() {
    assert_killed_by_sigsys("socket");
}

#[test]
fn executable_mappings_are_off_the_list() {
    assert_killed_by_sigsys("mmap_exec");
}

#[test]
fn a_filtered_thread_cannot_start_threads() {
    assert_killed_by_sigsys("spawn");
}

#[test]
fn futex_is_limited_to_wait_and_wake() {
    assert_killed_by_sigsys("futex_requeue");
}

#[test]
fn fcntl_is_limited_to_f_getfd() {
    assert_killed_by_sigsys("fcntl_setfl");
}

#[test]
fn sigaction_is_limited_to_sigsegv_and_sigbus() {
    assert_killed_by_sigsys("sigaction_usr1");
}

/// A panic on a filtered thread (with `RUST_BACKTRACE=1`) ends that thread
/// and not the process: std's panic message asks `gettid`, its backtrace
/// printer `getcwd`, and both are on the list (off it, they would kill the
/// process by SIGSYS).
#[test]
fn a_panic_on_a_filtered_thread_ends_only_that_thread() {
    let (stdout, stderr) = run_child_to_the_end("panic");
    assert!(stdout.contains("filter installed"), "{stdout}");
    assert!(
        stdout.lines().any(|l| l == "the panicking thread ended: true"),
        "{stdout}\n{stderr}"
    );
    assert!(stderr.contains("a panic on a filtered thread"), "{stderr}");
    assert!(stderr.contains("stack backtrace"), "{stderr}");
    assert!(stdout.contains("scenario done"), "{stdout}");
}

/// Guest memory truncated under a filtered thread ends the process by
/// SIGBUS, as documented, not SIGSYS: std's handler restores the default
/// action with `rt_sigaction` before returning.
#[test]
fn a_fault_on_truncated_memory_ends_the_process_by_sigbus() {
    assert_killed_by("sigbus", libc::SIGBUS);
}

#[test]
fn everything_a_worker_does_is_allowed() {
    let (stdout, stderr) = run_child_to_the_end("worker");
    for line in [
        "epoll events: 1 data 7",
        "kick: 1",
        "clock_gettime syscall: 0, true",
        "openat: EACCES",
        "old guest memory dropped here, read back 0x5a",
        "call: 1",
        "counter: 400000",
        "memfd mappings left: 1",
        "scenario done",
    ] {
        assert!(
            stdout.lines().any(|l| l == line),
            "missing {line:?} in:\n{stdout}\n{stderr}"
        );
    }
    assert!(
        stderr.contains("a log line to stderr from a filtered thread"),
        "{stderr}"
    );
}

// ---- the daemon ----

fn spawn_daemon(extra: &[&str]) -> daemon::Daemon {
    spawn_daemon_logged(extra, "info")
}

/// Connects, creates an encrypt session and runs NIST SP 800-38A F.2.1's
/// first block on queue 0; returns the frontend (still connected, so its
/// workers live).
fn serve_nist(sock: &Path) -> CryptoFrontend {
    let mut fe = CryptoFrontend::connect(sock, &frontend_config::one_queue(64, 8)).unwrap();
    let info = SymSessionInfo {
        op_code: 2,
        ..SymSessionInfo::aes_cbc(&NIST_KEY, 1)
    };
    let sid = fe.create_session(&info).unwrap();
    assert!(sid >= 1, "session id {sid}");
    let q = &mut fe.queues[0];
    let slot = q.next_slot().unwrap();
    let l = q.layout(slot);
    let hdr = OpDataReq {
        opcode: 0,
        algo: 0,
        session_id: sid as u64,
        op_type: 1,
        iv_len: 16,
        src_data_len: 16,
        dst_data_len: 16,
    };
    q.mem().write(l.hdr, &hdr.to_bytes());
    q.mem().write(l.iv, &NIST_IV);
    q.mem().write(l.src, &NIST_PT[..16]);
    q.mem().fill(l.dst, 16, 0xEE);
    q.mem().write(l.status, &[0xFF]);
    q.submit(slot, 16, 16);
    q.publish_and_kick().unwrap();
    let mut done = Vec::new();
    q.reap(&mut done, Duration::from_secs(10)).unwrap();
    assert_eq!((done.len(), done[0].slot, done[0].len), (1, slot, 17));
    let mut dst = [0u8; 16];
    q.mem().read(l.dst, &mut dst);
    assert_eq!(
        (q.mem().read_u8(l.status), &dst[..]),
        (OK, &NIST_CT[..16]),
        "status and F.2.1 ciphertext"
    );
    fe
}

/// (thread name, `Seccomp:` mode) of every thread of `pid`.
fn thread_seccomp(pid: u32) -> Vec<(String, u32)> {
    let mut v = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let dir = task.unwrap().path();
        // A thread that ended meanwhile has no files any more.
        let (Ok(comm), Ok(status)) = (
            std::fs::read_to_string(dir.join("comm")),
            std::fs::read_to_string(dir.join("status")),
        ) else {
            continue;
        };
        let mode = status
            .lines()
            .find_map(|l| l.strip_prefix("Seccomp:"))
            .map(|m| m.trim().parse().unwrap())
            .unwrap_or_else(|| panic!("no Seccomp line for {dir:?}"));
        v.push((comm.trim().to_string(), mode));
    }
    v.sort();
    v
}

#[test]
fn daemon_workers_run_filtered_by_default() {
    let daemon = spawn_daemon(&[]);
    for round in 0..2 {
        let fe = serve_nist(&daemon.sock);
        let threads = thread_seccomp(daemon.child.id());
        // SECCOMP_MODE_FILTER (2) on the one queue worker, on nothing else.
        let workers: Vec<_> = threads.iter().filter(|t| t.0 == "vring_worker").collect();
        assert_eq!(
            workers,
            [&("vring_worker".to_string(), 2)],
            "round {round}: {threads:?}"
        );
        assert!(
            threads.iter().filter(|t| t.0 != "vring_worker").all(|t| t.1 == 0),
            "round {round}: {threads:?}"
        );
        drop(fe);
    }
    let log = std::fs::read_to_string(daemon.log()).unwrap();
    assert!(
        log.contains("queue workers run under the seccomp allow-list"),
        "{log}"
    );
}

#[test]
fn seccomp_off_filters_nothing() {
    let daemon = spawn_daemon(&["--seccomp", "off"]);
    let fe = serve_nist(&daemon.sock);
    let threads = thread_seccomp(daemon.child.id());
    assert!(threads.iter().any(|t| t.0 == "vring_worker"), "{threads:?}");
    assert!(threads.iter().all(|t| t.1 == 0), "{threads:?}");
    drop(fe);
    let log = std::fs::read_to_string(daemon.log()).unwrap();
    assert!(log.contains("--seccomp off"), "{log}");
}
