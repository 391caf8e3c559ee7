// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! seccomp allow-list for the queue worker threads (`--seccomp on`, the
//! default).
//!
//! The queue workers are the threads that read guest memory and parse what
//! the guest wrote, so they are the ones a hostile guest would attack. Each
//! one installs [`WorkerFilter`] on itself (a thread filter, not
//! `SECCOMP_FILTER_FLAG_TSYNC`: the daemon's other threads keep accepting
//! connections and mapping memory) the first time it runs the backend's code,
//! that is before it first looks at a ring; until then the thread has only
//! sat in `vhost-user-backend`'s `epoll_wait` loop (see
//! [`crate::backend`]).
//!
//! The list was taken from `strace -f` of the daemon under the shipped
//! traces, the socket, frontend-fault and replay tests and QEMU 7.2 and 10.0
//! guests (every worker syscall after its first event), plus what the C
//! library and Rust's standard library do on the paths those runs happen
//! not to take. docs/RELIABILITY.md
//! ("Least privilege") has the table with the reasons; [`ALLOWED`] is the
//! same list in code.
//!
//! Anything else kills the whole process (`SECCOMP_RET_KILL_PROCESS`, as
//! virtiofsd's default `--seccomp kill` and Firecracker's filters do): a
//! worker making a syscall outside the list has either been taken over or
//! met a bug, and the frontend sees the socket close. `open`/`openat` are
//! the exception, refused with `EACCES` rather than killing: glibc opens
//! `/proc/sys/vm/overcommit_memory` the first time any thread shrinks a
//! thread heap (`check_may_shrink_heap`, `sysdeps/unix/sysv/linux/malloc-sysdep.h`)
//! and copes with the failure, and that first time may be in a worker; so
//! are `readlink`/`readlinkat`, which std's backtrace printer tries for a
//! panicking worker when `RUST_BACKTRACE` is set.
//!
//! Filters are built with rust-vmm's `seccompiler` (the library Firecracker
//! and Cloud Hypervisor use), for x86_64, aarch64 and riscv64; on other
//! targets [`WorkerFilter::new`] fails and the daemon needs `--seccomp off`.
//! Kernel interface: seccomp(2), `Documentation/userspace-api/seccomp_filter.rst`.

use std::fmt;

/// A syscall the workers may make, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allowed {
    /// Syscall name (as in `man 2 syscalls`).
    pub name: &'static str,
    /// Who makes it and when.
    pub reason: &'static str,
}

/// What the worker filter allows (in the order of docs/RELIABILITY.md).
/// `mmap` and `mprotect` only without `PROT_EXEC`, `futex` only for the
/// wait/wake operations, `fcntl` only for `F_GETFD`, `rt_sigaction` only
/// for `SIGSEGV` and `SIGBUS`; `epoll_wait` and `open` exist on x86_64
/// only.
pub const ALLOWED: &[Allowed] = &[
    Allowed {
        name: "read",
        reason: "vhost-user-backend reads the kick and vring-enable eventfds; the worker reads the \
                 frontend's kick eventfd where the kernel refuses RWF_NOWAIT (see preadv2)",
    },
    Allowed {
        name: "preadv2",
        reason: "the worker takes the frontend's kick eventfd's count with RWF_NOWAIT, which \
                 does not wait even when the frontend has cleared O_NONBLOCK",
    },
    Allowed {
        name: "write",
        reason: "the used-ring notification (call eventfd); log lines to stderr",
    },
    Allowed {
        name: "epoll_wait",
        reason: "vhost-user-backend's worker loop (x86_64; glibc uses epoll_pwait elsewhere)",
    },
    Allowed {
        name: "epoll_pwait",
        reason: "the same loop on aarch64 and riscv64",
    },
    Allowed {
        name: "futex",
        reason: "contended locks: the worker, session-table and memory locks, stderr, glibc malloc; \
                 a worker waiting for rate-limit tokens (thread::park_timeout) \
                 (FUTEX_WAIT, FUTEX_WAKE, FUTEX_WAIT_BITSET, FUTEX_WAKE_BITSET only)",
    },
    Allowed {
        name: "getrandom",
        reason: "std's per-thread HashMap seed (vhost-user-backend takes its pending-vring HashSet)",
    },
    Allowed {
        name: "clock_gettime",
        reason: "Instant::now in the polling loop and log timestamps when the clock has no vDSO path",
    },
    Allowed {
        name: "mmap",
        reason: "glibc malloc (large blocks, new heaps); never with PROT_EXEC",
    },
    Allowed {
        name: "mprotect",
        reason: "glibc malloc growing a thread heap; never with PROT_EXEC",
    },
    Allowed {
        name: "munmap",
        reason: "dropping the last reference to a replaced guest memory map; free; thread exit",
    },
    Allowed {
        name: "mremap",
        reason: "glibc realloc of a block it mmapped",
    },
    Allowed {
        name: "madvise",
        reason: "glibc frees the unused stack at thread exit and trims thread heaps (MADV_DONTNEED)",
    },
    Allowed {
        name: "brk",
        reason: "glibc malloc growing or trimming the main heap",
    },
    Allowed {
        name: "close",
        reason: "dropping the last reference to a replaced guest memory map closes its files",
    },
    Allowed {
        name: "sigaltstack",
        reason: "std removes its stack-overflow signal stack at thread exit",
    },
    Allowed {
        name: "rt_sigprocmask",
        reason: "glibc blocks signals while a thread exits",
    },
    Allowed {
        name: "rt_sigaction",
        reason: "std's SIGSEGV/SIGBUS handler puts the default action back before it returns, so \
                 that a fault that is not a stack overflow (guest memory truncated under the \
                 daemon) ends the process by that signal",
    },
    Allowed {
        name: "rt_sigreturn",
        reason: "return from a signal handler: std's SIGSEGV/SIGBUS handler hands a fault that is \
                 not a stack overflow back to the default action this way",
    },
    Allowed {
        name: "gettid",
        reason: "std's panic message names the thread by its OS id: a panicking worker ends its \
                 thread (and the connection), not the process",
    },
    Allowed {
        name: "getcwd",
        reason: "std's backtrace printer (RUST_BACKTRACE set) shortens paths against it",
    },
    Allowed {
        name: "fcntl",
        reason: "F_GETFD only: std checks that a descriptor is open before closing it in debug \
                 builds (dropping a replaced guest memory map's files)",
    },
    Allowed {
        name: "exit",
        reason: "thread exit (the daemon drops a connection's workers)",
    },
    Allowed {
        name: "restart_syscall",
        reason: "the kernel resumes an interrupted wait (SIGSTOP/SIGCONT, a debugger) through it",
    },
];

/// Syscalls that fail with `EACCES` instead of killing the process:
/// glibc's `open`s (see the module docs), and the `readlink` of
/// `/proc/self/exe` that std's backtrace printer tries (`RUST_BACKTRACE`
/// set, a panicking worker), which then prints no symbols.
pub const REFUSED: &[&str] = &["open", "openat", "readlink", "readlinkat"];

/// Why the filter could not be built or installed.
#[derive(Debug)]
pub struct Error(String);

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

#[cfg(all(
    target_endian = "little",
    any(target_arch = "x86_64", target_arch = "aarch64", target_arch = "riscv64")
))]
mod imp {
    use std::collections::BTreeMap;

    use seccompiler::{
        BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
        SeccompRule, TargetArch,
    };

    use super::{Error, ALLOWED, REFUSED};

    #[cfg(target_arch = "x86_64")]
    const ARCH: TargetArch = TargetArch::x86_64;
    #[cfg(target_arch = "aarch64")]
    const ARCH: TargetArch = TargetArch::aarch64;
    #[cfg(target_arch = "riscv64")]
    const ARCH: TargetArch = TargetArch::riscv64;

    fn err(what: &str, e: impl std::fmt::Display) -> Error {
        Error(format!("{what}: {e}"))
    }

    /// `(arg & mask) == value` on a 32-bit argument.
    fn masked(arg: u8, mask: u64, value: u64) -> Result<SeccompRule, Error> {
        let c = SeccompCondition::new(arg, SeccompCmpArgLen::Dword, SeccompCmpOp::MaskedEq(mask), value)
            .map_err(|e| err("seccomp condition", e))?;
        SeccompRule::new(vec![c]).map_err(|e| err("seccomp rule", e))
    }

    /// The number of syscall `name` on this target, for the names in
    /// [`super::ALLOWED`] and [`super::REFUSED`] (None: not a syscall here,
    /// or not one of them).
    pub(super) fn number(name: &str) -> Option<i64> {
        Some(match name {
            "read" => libc::SYS_read,
            "preadv2" => libc::SYS_preadv2,
            "write" => libc::SYS_write,
            #[cfg(target_arch = "x86_64")]
            "epoll_wait" => libc::SYS_epoll_wait,
            "epoll_pwait" => libc::SYS_epoll_pwait,
            "futex" => libc::SYS_futex,
            "getrandom" => libc::SYS_getrandom,
            "clock_gettime" => libc::SYS_clock_gettime,
            "mmap" => libc::SYS_mmap,
            "mprotect" => libc::SYS_mprotect,
            "munmap" => libc::SYS_munmap,
            "mremap" => libc::SYS_mremap,
            "madvise" => libc::SYS_madvise,
            "brk" => libc::SYS_brk,
            "close" => libc::SYS_close,
            "sigaltstack" => libc::SYS_sigaltstack,
            "rt_sigprocmask" => libc::SYS_rt_sigprocmask,
            "rt_sigaction" => libc::SYS_rt_sigaction,
            "rt_sigreturn" => libc::SYS_rt_sigreturn,
            "gettid" => libc::SYS_gettid,
            "getcwd" => libc::SYS_getcwd,
            "fcntl" => libc::SYS_fcntl,
            "exit" => libc::SYS_exit,
            "restart_syscall" => libc::SYS_restart_syscall,
            #[cfg(target_arch = "x86_64")]
            "open" => libc::SYS_open,
            "openat" => libc::SYS_openat,
            #[cfg(target_arch = "x86_64")]
            "readlink" => libc::SYS_readlink,
            "readlinkat" => libc::SYS_readlinkat,
            _ => return None,
        })
    }

    /// Argument rules of syscall `name` (empty: any arguments).
    fn conditions(name: &str) -> Result<Vec<SeccompRule>, Error> {
        match name {
            // prot (argument 2) without PROT_EXEC.
            "mmap" | "mprotect" => Ok(vec![masked(2, libc::PROT_EXEC as u64, 0)?]),
            // The command (argument 1) F_GETFD only.
            "fcntl" => Ok(vec![masked(1, u64::from(u32::MAX), libc::F_GETFD as u64)?]),
            // The signal (argument 0) SIGSEGV or SIGBUS only.
            "rt_sigaction" => [libc::SIGSEGV, libc::SIGBUS]
                .into_iter()
                .map(|sig| masked(0, u64::from(u32::MAX), sig as u64))
                .collect(),
            // The operation (argument 1) without the flags the kernel masks
            // off too (FUTEX_CMD_MASK, kernel/futex/syscalls.c).
            "futex" => {
                let cmd = !(libc::FUTEX_PRIVATE_FLAG | libc::FUTEX_CLOCK_REALTIME) as u32 as u64;
                [
                    libc::FUTEX_WAIT,
                    libc::FUTEX_WAKE,
                    libc::FUTEX_WAIT_BITSET,
                    libc::FUTEX_WAKE_BITSET,
                ]
                .into_iter()
                .map(|op| masked(1, cmd, op as u64))
                .collect()
            }
            _ => Ok(Vec::new()),
        }
    }

    /// Rules for `names`, skipping those that are no syscall on this target.
    fn rules<'a>(names: impl Iterator<Item = &'a str>) -> Result<BTreeMap<i64, Vec<SeccompRule>>, Error> {
        let mut rules = BTreeMap::new();
        for name in names {
            if let Some(nr) = number(name) {
                rules.insert(nr, conditions(name)?);
            }
        }
        Ok(rules)
    }

    fn compile(
        rules: BTreeMap<i64, Vec<SeccompRule>>,
        mismatch: SeccompAction,
        matched: SeccompAction,
    ) -> Result<BpfProgram, Error> {
        let filter =
            SeccompFilter::new(rules, mismatch, matched, ARCH).map_err(|e| err("seccomp filter", e))?;
        BpfProgram::try_from(filter).map_err(|e| err("seccomp filter", e))
    }

    /// The two compiled programs: the allow-list (anything else kills the
    /// process) and the `EACCES` layer on top of it. The kernel runs both
    /// and takes the stricter verdict, so `openat` gets `EACCES` and
    /// everything off the list is still killed.
    #[derive(Debug, Clone)]
    pub struct Programs {
        allow: BpfProgram,
        refuse: BpfProgram,
    }

    impl Programs {
        pub fn new() -> Result<Self, Error> {
            Ok(Programs {
                // REFUSED are let through here, to get EACCES from `refuse`.
                allow: compile(
                    rules(ALLOWED.iter().map(|a| a.name).chain(REFUSED.iter().copied()))?,
                    SeccompAction::KillProcess,
                    SeccompAction::Allow,
                )?,
                refuse: compile(
                    rules(REFUSED.iter().copied())?,
                    SeccompAction::Allow,
                    SeccompAction::Errno(libc::EACCES as u32),
                )?,
            })
        }

        pub fn apply(&self) -> Result<(), Error> {
            // The EACCES layer first: installing a filter takes prctl and
            // seccomp, which the allow-list does not allow. The kernel runs
            // every installed filter whatever the order.
            seccompiler::apply_filter(&self.refuse).map_err(|e| err("installing the seccomp filter", e))?;
            seccompiler::apply_filter(&self.allow).map_err(|e| err("installing the seccomp filter", e))
        }
    }
}

#[cfg(not(all(
    target_endian = "little",
    any(target_arch = "x86_64", target_arch = "aarch64", target_arch = "riscv64")
)))]
mod imp {
    use super::Error;

    #[derive(Debug, Clone)]
    pub struct Programs;

    impl Programs {
        pub fn new() -> Result<Self, Error> {
            Err(Error(format!(
                "no seccomp filter for {} (use --seccomp off)",
                std::env::consts::ARCH
            )))
        }

        pub fn apply(&self) -> Result<(), Error> {
            Err(Error("no seccomp filter on this target".into()))
        }
    }
}

/// The compiled worker filter.
#[derive(Debug, Clone)]
pub struct WorkerFilter(imp::Programs);

impl WorkerFilter {
    /// Compiles the filter for the target the daemon was built for.
    ///
    /// # Errors
    /// The target is not one `seccompiler` supports (x86_64, aarch64,
    /// riscv64, little-endian), or compiling failed.
    pub fn new() -> Result<Self, Error> {
        imp::Programs::new().map(WorkerFilter)
    }

    /// Installs the filter on the calling thread, for the rest of its life
    /// (it also sets `PR_SET_NO_NEW_PRIVS` on the thread, which seccomp
    /// requires of an unprivileged caller). Threads it spawns afterwards
    /// would inherit it, but with this filter it cannot spawn any.
    ///
    /// # Errors
    /// The kernel refused (no `CONFIG_SECCOMP_FILTER`, or seccomp denied by
    /// an outer sandbox).
    pub fn apply(&self) -> Result<(), Error> {
        self.0.apply()
    }

    /// Checks the filter works here before any frontend is served: a
    /// short-lived thread installs it, checks that `openat` now fails with
    /// `EACCES`, and exits under it (the same exit path as a worker's).
    ///
    /// # Errors
    /// Installing failed, or the filter had no effect.
    pub fn probe(&self) -> Result<(), Error> {
        let filter = self.clone();
        let t = std::thread::Builder::new()
            .name("vuc-seccomp-probe".into())
            .spawn(move || -> Result<(), Error> {
                filter.apply()?;
                match std::fs::File::open("/") {
                    Err(e) if e.raw_os_error() == Some(libc::EACCES) => Ok(()),
                    other => Err(Error(format!(
                        "seccomp filter installed but openat was not refused: {other:?}"
                    ))),
                }
            })
            .map_err(|e| Error(format!("seccomp probe thread: {e}")))?;
        t.join()
            .map_err(|_| Error("seccomp probe thread panicked".into()))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_list_entries_are_unique_and_explained() {
        assert_eq!(ALLOWED.len(), 24);
        for a in ALLOWED {
            assert!(!a.reason.is_empty(), "{}", a.name);
        }
        let mut names: Vec<_> = ALLOWED.iter().map(|a| a.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ALLOWED.len(), "duplicate entries");
        assert!(!names.contains(&"openat") && REFUSED.contains(&"openat"));
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn every_name_is_a_syscall_on_x86_64() {
        for name in ALLOWED.iter().map(|a| a.name).chain(REFUSED.iter().copied()) {
            assert!(imp::number(name).is_some(), "{name}");
        }
        // asm/unistd_64.h
        assert_eq!(imp::number("read"), Some(0));
        assert_eq!(imp::number("openat"), Some(257));
        assert_eq!(imp::number("socket"), None);
    }

    #[test]
    fn probe_installs_it_on_a_thread_of_its_own() {
        let f = WorkerFilter::new().unwrap();
        f.probe().unwrap();
        // Only the probe thread was filtered: this one still opens files.
        assert!(std::fs::File::open("/").is_ok());
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        assert!(status.lines().any(|l| l == "Seccomp:\t0"), "{status}");
    }
}
