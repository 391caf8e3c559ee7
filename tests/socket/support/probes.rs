// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! What a process is doing, read from /proc: its threads, the syscall
//! each queue worker is in, CPU time, and the huge page pool.

use std::time::{Duration, Instant};

use super::daemon::TIMEOUT;

/// The names (`comm`) of `pid`'s threads, sorted.
pub fn thread_names(pid: u32) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .map(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .unwrap_or_default()
                .trim()
                .to_string()
        })
        .collect();
    names.sort();
    names
}

/// The syscall each `vring_worker` thread of process `pid` is in (the
/// first field of /proc/PID/task/TID/syscall: a number, or "running").
pub fn vring_worker_syscalls(pid: u32) -> Vec<String> {
    let mut out = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim() == "vring_worker" {
            let sc = std::fs::read_to_string(t.path().join("syscall")).unwrap_or_default();
            out.push(sc.split_whitespace().next().unwrap_or("").to_string());
        }
    }
    out
}

/// How many `vring_worker` threads process `pid` has (one per data queue
/// while a connection is served).
pub fn vring_workers(pid: u32) -> usize {
    vring_worker_syscalls(pid).len()
}

/// Waits until a `vring_worker` of `pid` sits in syscall `nr`
/// (`libc::SYS_read`, `libc::SYS_write`) twice 20 ms apart, calling `poke`
/// before each look; up to 4 × [`TIMEOUT`]: getting there can take a race
/// that two workers must run for at once, which can take more than
/// [`TIMEOUT`] on 2 CPUs while other builds and tests run beside it.
pub fn until_a_worker_blocks_in(pid: u32, nr: libc::c_long, mut poke: impl FnMut()) {
    let start = Instant::now();
    loop {
        poke();
        std::thread::sleep(Duration::from_millis(2));
        if a_worker_sits_in(pid, nr) {
            return;
        }
        assert!(
            start.elapsed() < 4 * TIMEOUT,
            "no worker blocked in syscall {nr}: {:?}",
            vring_worker_syscalls(pid)
        );
    }
}

/// Fails if a `vring_worker` of `pid` is seen in syscall `nr` twice 20 ms
/// apart during `within`, calling `poke` before each look (the opposite
/// of [`until_a_worker_blocks_in`]). A wait that needs a race between two
/// workers may take a while: a worker parked in a shared kick's `read`
/// shows after 22–826 ms, but on busy CPUs such a race can take more than
/// 5 s, so a single run may miss one.
pub fn no_worker_waits_in(pid: u32, nr: libc::c_long, within: Duration, mut poke: impl FnMut()) {
    let start = Instant::now();
    let mut looks = 0u32;
    while start.elapsed() < within {
        poke();
        std::thread::sleep(Duration::from_millis(2));
        looks += 1;
        assert!(
            !a_worker_sits_in(pid, nr),
            "a worker waits in syscall {nr} after {looks} pokes in {:?}: {:?}",
            start.elapsed(),
            vring_worker_syscalls(pid)
        );
    }
}

/// Whether a `vring_worker` of `pid` is in syscall `nr` now and still 20
/// ms later (one that is only passing through is not counted).
pub fn a_worker_sits_in(pid: u32, nr: libc::c_long) -> bool {
    let nr = &nr.to_string();
    let seen = || vring_worker_syscalls(pid).iter().any(|s| s == nr);
    seen() && {
        std::thread::sleep(Duration::from_millis(20));
        seen()
    }
}

/// User and system CPU time of process `pid` so far, in clock ticks.
pub fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // (Fields after the command name's closing parenthesis: utime and
    // stime are the 12th and 13th.)
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// The share of one CPU process `pid` used over the next `span`.
pub fn cpu_busy(pid: u32, span: Duration) -> f64 {
    let (t0, ticks0) = (Instant::now(), cpu_ticks(pid));
    std::thread::sleep(span);
    let ticks = cpu_ticks(pid) - ticks0;
    // (USER_HZ: 100 ticks a second.)
    ticks as f64 / 100.0 / t0.elapsed().as_secs_f64()
}

/// Field `name` (e.g. `HugePages_Free`) of /proc/meminfo; 0 if absent.
pub fn meminfo(name: &str) -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

pub fn free_huge_pages() -> u64 {
    meminfo("HugePages_Free")
}

pub fn reserved_huge_pages() -> u64 {
    meminfo("HugePages_Rsvd")
}
