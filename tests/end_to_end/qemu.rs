// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! End-to-end test: boots a Linux 6.1 guest under QEMU (TCG) whose
//! virtio-crypto-pci device is served by this crate's daemon over vhost-user,
//! and checks what the guest program `guest-test` reports through AF_ALG.
//!
//! Two runs: Debian 12's QEMU 7.2 (`/usr/bin/qemu-system-x86_64`, 632-byte
//! session messages) and QEMU 10.0.x unpacked by `tools/guest/fetch-qemu10.sh`
//! (1072-byte session messages).
//!
//! Prerequisites (built outside cargo):
//!   tools/guest/build-image.sh     guest kernel + initramfs in tools/guest/out
//!   tools/guest/fetch-qemu10.sh    QEMU 10.0.x in tools/guest/out/qemu10
//!   apt-get install qemu-system-x86
//! Without them the tests print `skipped: ...` and pass, unless
//! `VUC_REQUIRE_QEMU=1`, in which case they fail and say how to build them.
//!
//! Environment: `VUC_GUEST_OUT` (image folder), `VUC_GUEST_SEED` (guest PRNG
//! seed), `RUST_LOG` (daemon log level, default `info`; the daemon log is
//! shown when a run fails).

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::common::skipped;

/// QEMU's own time limit inside run-guest.sh (a passing run takes ~10 s).
const GUEST_TIMEOUT_SECS: u64 = 150;
/// Our own limit around run-guest.sh, in case the script itself hangs.
const SCRIPT_DEADLINE: Duration = Duration::from_secs(GUEST_TIMEOUT_SECS + 30);
/// Chunk sizes the guest's speed loop must report.
const SPEED_SIZES: [usize; 5] = [64, 256, 1024, 4096, 16384];

#[derive(Clone, Copy)]
enum Qemu {
    /// Debian 12's QEMU 7.2.
    System,
    /// QEMU 10.0.x from bookworm-backports, unpacked by fetch-qemu10.sh.
    Qemu10,
}

impl Qemu {
    fn selector(self) -> &'static str {
        match self {
            Qemu::System => "system",
            Qemu::Qemu10 => "qemu10",
        }
    }
    fn expected_version(self) -> &'static str {
        match self {
            Qemu::System => "QEMU emulator version 7.2.",
            Qemu::Qemu10 => "QEMU emulator version 10.0.",
        }
    }
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn out_dir() -> PathBuf {
    std::env::var_os("VUC_GUEST_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("tools/guest/out"))
}

fn required() -> bool {
    std::env::var("VUC_REQUIRE_QEMU").is_ok_and(|v| v == "1")
}

/// Prints a line that shows even when cargo captures test output (a direct
/// write to stderr bypasses the capture of `println!`/`eprintln!`).
fn say(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// What is missing to run the guest with `qemu`, as instructions.
fn missing_prerequisites(qemu: Qemu) -> Vec<String> {
    let mut missing = Vec::new();
    let out = out_dir();
    let env_file = out.join("image.env");
    match std::fs::read_to_string(&env_file) {
        Ok(text) => {
            for key in ["KERNEL", "INITRD"] {
                let path = text
                    .lines()
                    .find_map(|l| l.strip_prefix(&format!("{key}=")))
                    .map(PathBuf::from);
                if !path.as_deref().is_some_and(Path::is_file) {
                    missing.push(format!(
                        "{key} of {} missing: run tools/guest/build-image.sh",
                        env_file.display()
                    ));
                }
            }
        }
        Err(_) => missing.push(format!(
            "guest image missing ({}): run tools/guest/build-image.sh",
            env_file.display()
        )),
    }
    match qemu {
        Qemu::System => {
            if !Path::new("/usr/bin/qemu-system-x86_64").is_file() {
                missing.push("/usr/bin/qemu-system-x86_64 missing: apt-get install qemu-system-x86".into());
            }
        }
        Qemu::Qemu10 => {
            let q = out.join("qemu10");
            if !q.join("usr/bin/qemu-system-x86_64").is_file() || !q.join("qemu10.env").is_file() {
                missing.push(format!(
                    "QEMU 10 missing in {}: run tools/guest/fetch-qemu10.sh",
                    q.display()
                ));
            }
        }
    }
    if Command::new("bash")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .map_or(true, |s| !s.success())
    {
        missing.push("bash missing".into());
    }
    missing
}

/// Warns when guest-test's sources are newer than the packed initramfs.
fn warn_if_image_stale() {
    let initrd = out_dir().join("initramfs.gz");
    let Ok(built) = std::fs::metadata(&initrd).and_then(|m| m.modified()) else {
        return;
    };
    let src = repo().join("tools/guest-test/src");
    let newer = std::fs::read_dir(&src)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.metadata().ok()?.modified().ok())
        .any(|t| t > built);
    if newer {
        say(&format!(
            "warning: {} is older than tools/guest-test/src; rerun tools/guest/build-image.sh",
            initrd.display()
        ));
    }
}

/// The daemon under test; killed (and reaped) on drop.
struct Daemon {
    child: Child,
    log: PathBuf,
}

impl Daemon {
    fn start(sock: &Path, log: &Path) -> Self {
        let file = File::create(log).expect("create daemon log");
        let child = Command::new(env!("CARGO_BIN_EXE_vhost-user-crypto"))
            .arg("--socket-path")
            .arg(sock)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("dup daemon log"))
            .stderr(file)
            .spawn()
            .expect("spawn the vhost-user-crypto daemon");
        let mut daemon = Self {
            child,
            log: log.to_owned(),
        };
        let start = Instant::now();
        while !sock.exists() {
            if let Some(status) = daemon.exited() {
                panic!(
                    "daemon exited ({status}) before creating {}:\n{}",
                    sock.display(),
                    daemon.log_tail(60)
                );
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "daemon did not create {} within 10 s:\n{}",
                sock.display(),
                daemon.log_tail(60)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        daemon
    }

    fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("try_wait on the daemon")
    }

    fn log_tail(&self, lines: usize) -> String {
        tail(&self.log, lines)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_else(|e| format!("(cannot read {}: {e})", path.display()));
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Runs run-guest.sh against the daemon's socket; returns its exit status
/// (None if it had to be killed) and the guest console text.
fn run_guest(qemu: Qemu, sock: &Path, dir: &Path) -> (Option<ExitStatus>, String) {
    let guest_log = dir.join("guest.log");
    let script_out = File::create(dir.join("run-guest.out")).expect("create run-guest.out");
    let mut cmd = Command::new("bash");
    cmd.arg(repo().join("tools/guest/run-guest.sh"))
        .arg("--qemu")
        .arg(qemu.selector())
        .arg("--socket")
        .arg(sock)
        .arg("--timeout")
        .arg(GUEST_TIMEOUT_SECS.to_string())
        .arg("--log")
        .arg(&guest_log);
    if let Ok(seed) = std::env::var("VUC_GUEST_SEED") {
        cmd.arg("--seed").arg(seed);
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(script_out.try_clone().expect("dup"))
        .stderr(script_out)
        .spawn()
        .expect("spawn run-guest.sh");
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().expect("try_wait on run-guest.sh") {
            break Some(st);
        }
        if start.elapsed() > SCRIPT_DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let console = std::fs::read(&guest_log)
        .map(|b| String::from_utf8_lossy(&b).replace('\r', ""))
        .unwrap_or_default();
    (status, console)
}

/// Every problem found in the guest console.
fn check_console(qemu: Qemu, console: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let has = |s: &str| console.lines().any(|l| l.contains(s));
    if !has(qemu.expected_version()) {
        problems.push(format!("QEMU version line {:?} missing", qemu.expected_version()));
    }
    if !has("SELFTEST virtio_crypto_aes_cbc: passed") {
        problems.push("the guest kernel does not show `selftest : passed` for virtio_crypto_aes_cbc".into());
    }
    if !has("KAT virtio_crypto_aes_cbc: 6/6 ok") {
        problems.push("NIST SP 800-38A F.2.1-F.2.6 did not all pass on the device".into());
    }
    if !has("KAT cbc-aes-aesni: 6/6 ok") {
        problems.push("NIST known answers failed on the reference cbc-aes-aesni".into());
    }
    match console.lines().find(|l| l.starts_with("CROSSCHECK: ")) {
        Some(line) => {
            let ops = line
                .split_whitespace()
                .find_map(|w| w.strip_prefix("ops="))
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0);
            if !line.starts_with("CROSSCHECK: ok ")
                || !line.contains(" mismatches=0 ")
                || !line.contains(" errors=0 ")
                || ops < 300
            {
                problems.push(format!("cross-check failed: {line}"));
            }
        }
        None => problems.push("no CROSSCHECK result line".into()),
    }
    if !has("REKEY: ok") {
        problems.push("rekey test did not pass".into());
    }
    for size in SPEED_SIZES {
        let prefix = format!("Encrypting in chunks of {size} bytes: done. ");
        let ok = console.lines().any(|l| {
            l.strip_prefix(&prefix).is_some_and(|rest| {
                // "X MiB in Y secs: Z MiB/sec (N packets)"
                let w: Vec<&str> = rest.split_whitespace().collect();
                w.len() == 9
                    && w[0].parse::<f64>().is_ok()
                    && w[1] == "MiB"
                    && w[2] == "in"
                    && w[3].parse::<f64>().is_ok()
                    && w[4] == "secs:"
                    && w[5].parse::<f64>().is_ok()
                    && w[6] == "MiB/sec"
                    && w[7]
                        .strip_prefix('(')
                        .and_then(|n| n.parse::<u64>().ok())
                        .is_some_and(|n| n > 0)
                    && w[8] == "packets)"
            })
        });
        if !ok {
            problems.push(format!("speed line for {size}-byte chunks missing or malformed"));
        }
    }
    if !has("GUEST-RESULT: PASS") || has("GUEST-RESULT: FAIL") {
        let verdict = console
            .lines()
            .find(|l| l.contains("GUEST-RESULT:"))
            .unwrap_or("(no GUEST-RESULT line)");
        problems.push(format!("guest verdict: {verdict}"));
    }
    problems
}

fn e2e(qemu: Qemu) {
    // One guest at a time, alone in this binary: TCG is CPU-bound and the
    // speed loop is timed.
    let _alone = crate::alone();
    let name = format!("QEMU {} guest", qemu.selector());
    let missing = missing_prerequisites(qemu);
    if !missing.is_empty() {
        let msg = format!(
            "{name}: prerequisites missing:\n  {}\n(build with tools/guest/build-image.sh and \
             tools/guest/fetch-qemu10.sh; see tools/guest/README.md)",
            missing.join("\n  ")
        );
        if required() {
            panic!("{msg}\nVUC_REQUIRE_QEMU=1 is set, so this is a failure");
        }
        skipped(&msg);
        return;
    }
    warn_if_image_stale();

    let tmp = tempfile::Builder::new()
        .prefix("vuc-e2e.")
        .tempdir()
        .expect("temporary directory");
    let sock = tmp.path().join("sock");
    let mut daemon = Daemon::start(&sock, &tmp.path().join("daemon.log"));
    let started = Instant::now();
    let (status, console) = run_guest(qemu, &sock, tmp.path());
    let secs = started.elapsed().as_secs_f64();
    let daemon_exit = daemon.exited();

    let mut problems = check_console(qemu, &console);
    match status {
        Some(s) if s.success() => {}
        Some(s) => problems.push(format!("run-guest.sh failed ({s})")),
        None => problems.push(format!(
            "run-guest.sh still running after {} s; killed",
            SCRIPT_DEADLINE.as_secs()
        )),
    }
    if let Some(s) = daemon_exit {
        problems.push(format!("the daemon exited during the run ({s})"));
    }
    if problems.is_empty() {
        say(&format!("{name}: PASS in {secs:.1} s"));
        for l in console
            .lines()
            .filter(|l| l.starts_with("CROSSCHECK: ") || l.starts_with("Encrypting in chunks"))
        {
            say(&format!("  {l}"));
        }
        return;
    }
    panic!(
        "{name} against the daemon failed after {secs:.1} s:\n  - {}\n\
         --- run-guest.sh output (last 40 lines) ---\n{}\n\
         --- guest console (last 80 lines) ---\n{}\n\
         --- daemon log (last 80 lines; RUST_LOG=debug for more) ---\n{}",
        problems.join("\n  - "),
        tail(&tmp.path().join("run-guest.out"), 40),
        console
            .lines()
            .rev()
            .take(80)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n"),
        daemon.log_tail(80),
    );
}

#[test]
fn qemu72_guest_against_daemon() {
    e2e(Qemu::System);
}

#[test]
fn qemu10_guest_against_daemon() {
    e2e(Qemu::Qemu10);
}
