// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! `vuc-xcpu-rtt [--rounds N] CPU_A CPU_B`: how long one cache line takes to
//! go from CPU A to CPU B and back, in nanoseconds (the median of five
//! batches of N round trips, N = 10,000 by default), printed as one number.
//!
//! `tools/bench/compare.sh` runs it before and after every replay run,
//! with the backend stopped, to record where the host has placed the
//! frontend's and the backend's vCPUs. On the 2-vCPU AMD EPYC VM of
//! docs/PERFORMANCE.md the round trip is 80–115 ns most of the time and
//! 380–480 ns or 20–55 ns in some seconds; on the Intel VM of the compare
//! runs in docs/bench it is 200 ns or more in nearly every run. Every
//! backend's throughput follows it (docs/PERFORMANCE.md, "Run-to-run
//! spread").
//!
//! Exit status 2 on bad arguments or when a thread cannot be pinned.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// One counter on its own pair of cache lines (adjacent-line prefetch
/// pulls lines in pairs).
#[repr(align(128))]
struct Line(AtomicU64);

const BATCHES: usize = 5;

fn pin(cpu: usize) -> std::io::Result<()> {
    // SAFETY: cpu_set_t is a plain bit array; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if cpu >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: `cpu` is below the set's size in bits (checked above).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: a valid cpu_set_t of the size given, for the calling thread (0).
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn usage(why: &str) -> ! {
    eprintln!("vuc-xcpu-rtt: {why}\nusage: vuc-xcpu-rtt [--rounds N] CPU_A CPU_B");
    std::process::exit(2);
}

fn main() {
    let mut rounds: u64 = 10_000;
    let mut cpus = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "-h" || a == "--help" {
            println!("usage: vuc-xcpu-rtt [--rounds N] CPU_A CPU_B\nprints the round trip of one cache line between CPU_A and CPU_B, in ns");
            return;
        } else if a == "--rounds" {
            let v = args.next().unwrap_or_else(|| usage("--rounds needs a value"));
            rounds = v
                .parse()
                .ok()
                .filter(|&n| n > 0)
                .unwrap_or_else(|| usage("--rounds must be a positive integer"));
        } else {
            cpus.push(
                a.parse::<usize>()
                    .unwrap_or_else(|_| usage(&format!("bad CPU number {a}"))),
            );
        }
    }
    let [a, b] = cpus[..] else {
        usage("give exactly two CPUs")
    };
    if a == b {
        // Two spinning threads on one CPU only progress at preemption.
        usage("the two CPUs must differ");
    }

    let lines = Arc::new((Line(AtomicU64::new(0)), Line(AtomicU64::new(0))));
    let peer = lines.clone();
    let Some(total) = rounds.checked_mul(BATCHES as u64) else {
        usage("--rounds is too large")
    };
    // CPU B answers: it waits for ping k (odd) and answers with pong k+1.
    let (ready_tx, ready) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        let pinned = pin(b);
        let ok = pinned.is_ok();
        let _ = ready_tx.send(pinned);
        if !ok {
            return;
        }
        for i in 0..total {
            while peer.0 .0.load(Ordering::Acquire) != 2 * i + 1 {
                std::hint::spin_loop();
            }
            peer.1 .0.store(2 * i + 2, Ordering::Release);
        }
    });
    match ready.recv() {
        Ok(Ok(())) => {}
        Ok(Err(e)) => usage(&format!("cannot run on CPU {b}: {e}")),
        Err(_) => usage("the CPU B thread ended early"),
    }
    if let Err(e) = pin(a) {
        // The peer waits for pings that never come: exit without joining.
        usage(&format!("cannot run on CPU {a}: {e}"));
    }
    let mut ns = Vec::with_capacity(BATCHES);
    let mut i = 0u64;
    for _ in 0..BATCHES {
        let t0 = Instant::now();
        for _ in 0..rounds {
            lines.0 .0.store(2 * i + 1, Ordering::Release);
            while lines.1 .0.load(Ordering::Acquire) != 2 * i + 2 {
                std::hint::spin_loop();
            }
            i += 1;
        }
        ns.push(t0.elapsed().as_nanos() as f64 / rounds as f64);
    }
    if t.join().is_err() {
        usage("the CPU B thread panicked");
    }
    ns.sort_by(f64::total_cmp);
    println!("{:.1}", ns[BATCHES / 2]);
}
