// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! `vuc-xcpu-rtt`, the vCPU placement probe of `tools/bench/compare.sh`:
//! its argument checks, and a real measurement between CPUs 0 and 1.

use std::process::Command;

/// Runs the probe with `args`: its exit code (None if a signal ended it),
/// stdout and stderr.
fn run(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_vuc-xcpu-rtt"))
        .args(args)
        .output()
        .expect("run vuc-xcpu-rtt");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_arguments_exit_2_with_the_reason() {
    for (args, why) in [
        (&["0"][..], "exactly two CPUs"),
        (&["0", "1", "2"][..], "exactly two CPUs"),
        (&["1", "1"][..], "must differ"),
        (&["0", "x"][..], "bad CPU number x"),
        (
            &["--rounds", "0", "0", "1"][..],
            "--rounds must be a positive integer",
        ),
        (
            &["--rounds", "18446744073709551615", "0", "1"][..],
            "--rounds is too large",
        ),
        (&["--rounds"][..], "--rounds needs a value"),
        // No machine this runs on has CPU 100000: pinning fails (the set
        // is too small for it) and the probe must say so, not spin.
        (&["0", "100000"][..], "cannot run on CPU 100000"),
    ] {
        let (code, out, err) = run(args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?} printed {out}");
        assert!(err.contains(why), "{args:?}: {err}");
    }
}

/// The CPUs this process may run on.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: sched_getaffinity fills the zeroed set we pass.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: a valid cpu_set_t of the size given, for this thread.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    assert_eq!(rc, 0);
    let bits = 8 * std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: CPU numbers below the set's size in bits.
    (0..bits)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

#[test]
fn a_cpu_outside_the_affinity_mask_is_refused() {
    // The first CPU number this process may not use (offline, or not in
    // its mask): the kernel refuses to pin there, and the probe must say
    // so rather than wait for a peer that never runs.
    let allowed = allowed_cpus();
    let cpu = (0..)
        .find(|c| !allowed.contains(c))
        .expect("a CPU number outside the mask");
    let first = allowed[0].to_string();
    let (code, out, err) = run(&[first.as_str(), &cpu.to_string()]);
    assert_eq!(code, Some(2), "{err}");
    assert!(out.is_empty(), "{out}");
    assert!(err.contains(&format!("cannot run on CPU {cpu}")), "{err}");
}

#[test]
fn measures_a_round_trip_between_cpu_0_and_1() {
    let cpus = allowed_cpus();
    if !(cpus.contains(&0) && cpus.contains(&1)) {
        eprintln!("skipped: CPUs 0 and 1 are not both available here");
        return;
    }
    let (code, out, err) = run(&["--rounds", "500", "0", "1"]);
    assert_eq!(code, Some(0), "{err}");
    let ns: f64 = out
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("not a number: {out:?}"));
    // A cache line does not go to another CPU and back in under 5 ns (even
    // between SMT siblings it takes tens): less means the probe did not
    // wait for its peer. No upper bound: with other tests loading both
    // CPUs, a round trip can wait for a time slice.
    assert!(ns.is_finite() && ns >= 5.0, "{ns} ns");
}
