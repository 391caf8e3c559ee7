// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! QEMU's vhost-user backend program conventions
//! (`docs/interop/vhost-user.rst`, "Backend program conventions"):
//! `--print-capabilities` and the discovery file of `tools/packaging/`,
//! whose `type` must be `crypto` (QEMU's `docs/interop/vhost-user.json`);
//! `--fd` with a listening or a connected socket; the exit on SIGTERM and
//! SIGINT.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixDatagram, UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::common::frontend_config::one_queue;
use crate::support::{cpu_busy, vring_workers};
use vhost_crypto_replay::frontend::{CryptoFrontend, FrontendConfig};
use vhost_crypto_replay::replay::{replay, ReplayOptions};
use vhost_crypto_replay::trace::Trace;

/// `--print-capabilities` prints `{"type": "crypto"}` as JSON and exits
/// 0, whatever other options come with it (even invalid ones), and
/// without listening on anything.
#[test]
fn print_capabilities_prints_the_crypto_type_and_ignores_other_options() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("s");
    for extra in [
        &[][..],
        &["--queues", "0", "--no-such-option"][..],
        &["--socket-path", sock.to_str().unwrap()][..],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_vhost-user-crypto"))
            .args(extra)
            .arg("--print-capabilities")
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{extra:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
        assert_eq!(v, serde_json::json!({"type": "crypto"}), "{extra:?}");
        assert!(!sock.exists(), "it listened");
    }
}

/// The discovery file has the schema's required members: a description,
/// the type `crypto` and the binary as an absolute path.
#[test]
fn the_discovery_file_names_a_crypto_backend_binary() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tools/packaging/50-vhost-user-crypto.json"
    );
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(v["type"], "crypto");
    assert!(v["description"].as_str().is_some_and(|d| !d.is_empty()));
    assert!(v["binary"].as_str().is_some_and(|b| b.starts_with('/')), "{v}");
}

/// The daemon binary started with `args`, `fd` (if any) given to it as
/// descriptor 3, RUST_LOG=info and its log in a file; killed on drop (the
/// log printed if the test failed).
struct Spawned {
    child: Child,
    _dir: tempfile::TempDir,
    log: PathBuf,
}

impl Spawned {
    fn new(args: &[&OsStr], fd: Option<RawFd>) -> Spawned {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("daemon.log");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_vhost-user-crypto"));
        cmd.args(args)
            .env("RUST_LOG", "info")
            .env("RUST_LOG_STYLE", "never")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&log).unwrap());
        if let Some(fd) = fd {
            // SAFETY: the closure runs in the forked child before exec and
            // makes only async-signal-safe calls (fcntl, dup2) on integers.
            unsafe {
                cmd.pre_exec(move || {
                    let r = if fd == INHERITED_FD {
                        libc::fcntl(fd, libc::F_SETFD, 0)
                    } else {
                        libc::dup2(fd, INHERITED_FD)
                    };
                    if r < 0 {
                        Err(io::Error::last_os_error())
                    } else {
                        Ok(())
                    }
                });
            }
        }
        Spawned {
            child: cmd.spawn().unwrap(),
            _dir: dir,
            log,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits up to `within` for `needle` in the log.
    #[track_caller]
    fn wait_log(&self, needle: &str, within: Duration) {
        let start = Instant::now();
        while !self.log().contains(needle) {
            assert!(
                start.elapsed() < within,
                "no {needle:?} in the log after {within:?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The exit status, if the daemon exits within `within`.
    fn exit_within(&mut self, within: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return Some(s);
            }
            if start.elapsed() >= within {
                return None;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Sends `sig` and returns the exit status and how long the exit took
    /// (None: still running after 10 s).
    fn signal_and_wait(&mut self, sig: libc::c_int) -> (Option<ExitStatus>, Duration) {
        // SAFETY: kill(2) of our child, not reaped yet.
        assert_eq!(unsafe { libc::kill(self.child.id() as libc::pid_t, sig) }, 0);
        let sent = Instant::now();
        let status = self.exit_within(Duration::from_secs(10));
        (status, sent.elapsed())
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("---- daemon log ----\n{}", self.log());
        }
    }
}

/// The descriptor number the daemon inherits its socket as (systemd's
/// first, `SD_LISTEN_FDS_START`).
const INHERITED_FD: RawFd = 3;

/// The NIST SP 800-38A CBC known-answer trace shipped in `tools/traces`.
fn nist_trace() -> (Trace, u64) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/traces/nist-sp800-38a.jsonl");
    let text = std::fs::read_to_string(&path).unwrap();
    // Counted from the file, not by the replay tool's parser.
    let requests = text.lines().filter(|l| l.contains(r#""op":"request""#)).count() as u64;
    assert!(requests >= 12, "{requests}");
    (Trace::load(&path).unwrap(), requests)
}

fn replay_config(trace: &Trace) -> FrontendConfig {
    FrontendConfig {
        max_payload: trace.max_payload().max(16),
        ..one_queue(64, 8)
    }
}

fn replay_options(repeat: u32) -> ReplayOptions {
    ReplayOptions {
        repeat,
        queue_depth: 8,
        timeout: Duration::from_secs(10),
        progress: false,
        record: false,
    }
}

/// Replays the NIST trace through `fe`: every request completes with the
/// standard's output.
#[track_caller]
fn nist_passes(fe: &mut CryptoFrontend, what: &str) {
    let (trace, requests) = nist_trace();
    let r = replay(fe, &trace, &replay_options(1)).unwrap();
    assert_eq!(
        (r.requests, r.mismatches, r.error.as_deref()),
        (requests, 0, None),
        "{what}: {:?}",
        r.first_mismatches
    );
}

/// `--fd 3` with a listening socket the test bound: the replay tool's
/// frontend connects by the path and passes the NIST trace, twice in a
/// row (a reconnect is served like one with `--socket-path`). SIGTERM then
/// ends the daemon with status 0 and leaves the socket file, which the
/// daemon did not bind.
#[test]
fn fd_with_a_listening_socket_serves_frontends_one_after_another() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("passed.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let mut d = Spawned::new(&["--fd".as_ref(), "3".as_ref()], Some(listener.as_raw_fd()));
    drop(listener);
    let (trace, _) = nist_trace();
    for connection in ["first connection", "second connection"] {
        let mut fe = CryptoFrontend::connect(&path, &replay_config(&trace)).unwrap();
        nist_passes(&mut fe, connection);
    }
    d.wait_log("listening on descriptor 3 (--fd)", Duration::from_secs(10));
    let (status, took) = d.signal_and_wait(libc::SIGTERM);
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{status:?}");
    assert!(took < Duration::from_secs(1), "{took:?}");
    assert!(path.exists(), "the daemon removed a socket file it did not bind");
}

/// `--fd 3` with one end of a socketpair (a connected socket, as libvirt
/// passes to some backends): the frontend on the other end passes the
/// NIST trace, and once it leaves the daemon exits with status 0.
#[test]
fn fd_with_a_connected_socket_serves_that_frontend_then_exits_0() {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let mut d = Spawned::new(&["--fd".as_ref(), "3".as_ref()], Some(theirs.as_raw_fd()));
    drop(theirs);
    ours.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let (trace, _) = nist_trace();
    let mut fe = CryptoFrontend::from_stream(ours, &replay_config(&trace)).unwrap();
    nist_passes(&mut fe, "socketpair");
    assert!(
        d.child.try_wait().unwrap().is_none(),
        "exited while the frontend was connected"
    );
    drop(fe);
    let status = d.exit_within(Duration::from_secs(20));
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{status:?}");
    assert!(d.log().contains("left; exiting"), "{}", d.log());
}

/// `--fd` with `--socket-path`, neither of them, or `--fd` naming a
/// descriptor that is not a Unix stream socket: refused at start-up with
/// a message that says why (status 2 for usage errors, 1 for a bad
/// descriptor), without listening anywhere.
#[test]
fn fd_is_refused_with_socket_path_and_on_anything_but_a_unix_stream_socket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let listener = UnixListener::bind(dir.path().join("l")).unwrap();
    let file = tempfile::tempfile().unwrap();
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let dgram = UnixDatagram::unbound().unwrap();
    let fd3: &[&OsStr] = &["--fd".as_ref(), "3".as_ref()];
    let both: Vec<&OsStr> = vec![
        "--fd".as_ref(),
        "3".as_ref(),
        "--socket-path".as_ref(),
        path.as_ref(),
    ];
    let high: &[&OsStr] = &["--fd".as_ref(), "1000".as_ref()];
    // Nothing passed as descriptor 3: the daemon's own stats socket must
    // not be taken for it.
    let stats = dir.path().join("stats");
    let fd3_stats: Vec<&OsStr> = vec![
        "--fd".as_ref(),
        "3".as_ref(),
        "--stats-socket".as_ref(),
        stats.as_ref(),
    ];
    let cases: [(&[&OsStr], Option<RawFd>, i32, &str); 7] = [
        (&both, Some(listener.as_raw_fd()), 2, "cannot be used with"),
        (&[], None, 2, "the following required arguments were not provided"),
        (
            fd3,
            Some(file.as_raw_fd()),
            1,
            "descriptor 3 (--fd) is a regular file, not a Unix stream socket",
        ),
        (
            fd3,
            Some(udp.as_raw_fd()),
            1,
            "descriptor 3 (--fd) is a socket of another family than AF_UNIX",
        ),
        (
            fd3,
            Some(dgram.as_raw_fd()),
            1,
            "descriptor 3 (--fd) is a Unix socket of another type than SOCK_STREAM",
        ),
        (high, None, 1, "descriptor 1000 (--fd): Bad file descriptor"),
        (&fd3_stats, None, 1, "descriptor 3 (--fd): Bad file descriptor"),
    ];
    for (args, fd, code, says) in cases {
        let mut d = Spawned::new(args, fd);
        let status = d.exit_within(Duration::from_secs(10));
        let log = d.log();
        assert_eq!(status.and_then(|s| s.code()), Some(code), "{args:?}: {log}");
        assert!(log.contains(says), "{args:?}: {log}");
        assert!(!path.exists(), "{args:?}: it bound --socket-path");
        assert!(!stats.exists(), "{args:?}: it bound --stats-socket");
    }
}

/// SIGTERM while the replay tool is in the middle of a long run (a
/// session live, requests in flight): the daemon exits with status 0
/// within a second, having zeroized the session's keys in the queue's
/// table, and removes its socket file.
#[test]
fn sigterm_mid_run_exits_0_within_a_second() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crypto.sock");
    let mut d = Spawned::new(&["--socket-path".as_ref(), path.as_ref()], None);
    d.wait_log("listening on", Duration::from_secs(10));
    // 100,000 requests of 256 bytes, replayed up to 200 times (the run
    // closes and creates the session again between passes: long passes
    // make a SIGTERM in between unlikely).
    let trace = Trace::parse(
        concat!(
            r#"{"op":"create_session","name":"s","algo":"aes-cbc","key":"2b7e151628aed2a6abf7158809cf4f3c","direction":"encrypt"}"#,
            "\n",
            r#"{"op":"generate","session":"s","opcode":"encrypt","size":256,"count":100000,"seed":7}"#,
            "\n"
        )
        .as_bytes(),
    )
    .unwrap();
    let total = 100_000 * 200;
    let cfg = FrontendConfig {
        max_payload: 256,
        ..one_queue(256, 64)
    };
    let opts = ReplayOptions {
        queue_depth: 64,
        timeout: Duration::from_secs(5),
        ..replay_options(200)
    };
    let mut fe = CryptoFrontend::connect(&path, &cfg).unwrap();
    let run = std::thread::spawn(move || replay(&mut fe, &trace, &opts));
    // Mid-run: the queue worker is busy with requests.
    let start = Instant::now();
    while vring_workers(d.child.id()) == 0 || cpu_busy(d.child.id(), Duration::from_millis(100)) == 0.0 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the daemon is not serving the run"
        );
    }
    assert!(!run.is_finished(), "the run ended before SIGTERM");
    let signalled = Instant::now();
    let (status, took) = d.signal_and_wait(libc::SIGTERM);
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{status:?}");
    assert!(took < Duration::from_secs(1), "{took:?}");
    // The run stops with a report that says why, well before its 5 s
    // completion timeout: the replay tool sees the connection close.
    let r = run.join().unwrap().expect("a report");
    let ended = signalled.elapsed();
    assert!(r.requests < total, "{}", r.requests);
    // Every request completed before the close has status OK: none found
    // its session already wiped (INVSESS).
    assert!(
        r.status_counts.get("ok").is_some_and(|&n| n > 0),
        "{:?}",
        r.status_counts
    );
    assert!(r.status_counts.keys().all(|s| s == "ok"), "{:?}", r.status_counts);
    let why = r.error.unwrap_or_default();
    // (A signal in the moment between two passes stops the session's
    // CLOSE or CREATE message instead: a socket error, or the GET_FEATURES
    // that follows a CLOSE.)
    assert!(
        why.contains("the backend closed the connection with")
            || why.starts_with("socket:")
            || why.starts_with("vhost-user GET_FEATURES failed"),
        "{why}"
    );
    assert!(
        ended < Duration::from_secs(3),
        "the run ended {ended:?} after SIGTERM: {why}"
    );
    // (1 session; 0 if the signal came in the moment between two passes,
    // when the run has closed its session and not yet created the next.)
    let log = d.log();
    assert!(
        ["1", "0"].iter().any(|n| log.contains(&format!(
            "SIGTERM: exiting; session keys zeroized: {n} (in 1 session tables)"
        ))),
        "{log}"
    );
    assert!(!path.exists(), "the socket file is left");
}

/// SIGTERM and SIGINT with no frontend: status 0 within a second, and
/// the socket file is removed.
#[test]
fn sigterm_and_sigint_while_idle_exit_0_within_a_second() {
    for (sig, name) in [(libc::SIGTERM, "SIGTERM"), (libc::SIGINT, "SIGINT")] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("crypto.sock");
        let mut d = Spawned::new(&["--socket-path".as_ref(), path.as_ref()], None);
        d.wait_log("listening on", Duration::from_secs(10));
        assert!(path.exists());
        let (status, took) = d.signal_and_wait(sig);
        assert_eq!(status.and_then(|s| s.code()), Some(0), "{name}: {status:?}");
        assert!(took < Duration::from_secs(1), "{name}: {took:?}");
        assert!(!path.exists(), "{name}: the socket file is left");
        assert!(
            d.log().contains(&format!("{name}: exiting")),
            "{name}: {}",
            d.log()
        );
    }
}
