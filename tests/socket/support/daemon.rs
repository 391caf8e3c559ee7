// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The daemon under test, as the socket suite runs it: a watchdog, its
//! log printed when a test fails, liveness probes, and its resource use
//! read from /proc.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::conn::{Conn, Got};
use super::probes::thread_names;
use crate::common::daemon;
use crate::common::*;

/// Read timeout on every socket: a daemon bug shows as a failure, not a hang.
pub const TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a test may run before its daemon is killed (see `Daemon::with_watchdog`).
pub const WATCHDOG: Duration = Duration::from_secs(240);

/// The daemon under test (RUST_LOG=warn, log in a file) with a watchdog;
/// killed on drop (its log is printed if the test failed).
pub struct Daemon {
    inner: daemon::Daemon,
    watchdog: Option<(mpsc::Sender<()>, std::thread::JoinHandle<()>)>,
}

impl std::ops::Deref for Daemon {
    type Target = daemon::Daemon;
    fn deref(&self) -> &daemon::Daemon {
        &self.inner
    }
}

impl std::ops::DerefMut for Daemon {
    fn deref_mut(&mut self) -> &mut daemon::Daemon {
        &mut self.inner
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some((stop, t)) = self.watchdog.take() {
            let _ = stop.send(());
            let _ = t.join();
        }
        self.inner.stop();
        if std::thread::panicking() {
            eprintln!("---- daemon log (tail) ----\n{}", self.log_tail(4000));
        }
    }
}

impl Daemon {
    pub fn spawn(extra: &[&str]) -> Daemon {
        Daemon::spawn_logged(extra, "warn")
    }

    /// [`Daemon::spawn`] with `RUST_LOG` = `rust_log`.
    pub fn spawn_logged(extra: &[&str], rust_log: &str) -> Daemon {
        Daemon {
            inner: daemon::spawn_daemon_logged(extra, rust_log),
            watchdog: None,
        }
        .with_watchdog(WATCHDOG)
    }

    /// Kills the daemon if the test is still running after `limit`.
    ///
    /// Socket reads here have timeouts, but rust-vmm's `Frontend` (inside
    /// `CryptoFrontend`) retries a timed-out read forever; killing the
    /// daemon turns such a hang into a disconnect error, so the test fails
    /// instead of hanging.
    pub fn with_watchdog(mut self, limit: Duration) -> Daemon {
        let (stop, rx) = mpsc::channel::<()>();
        let pid = self.pid() as libc::pid_t;
        let t = std::thread::spawn(move || {
            if rx.recv_timeout(limit) == Err(mpsc::RecvTimeoutError::Timeout) {
                eprintln!("watchdog: test still running after {limit:?}; killing the daemon (pid {pid})");
                // SAFETY: plain kill(2) of our child, which is not reaped
                // yet (Drop stops this thread before it waits for the child).
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        });
        self.watchdog = Some((stop, t));
        self
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    #[track_caller]
    pub fn assert_alive(&mut self, after: &str) {
        // A dead daemon's sockets close before its exit status is ready, so
        // probe it with a GET_FEATURES round trip on a new connection (it
        // serves one frontend at a time: call this with no other open).
        let probe = || -> io::Result<()> {
            let s = UnixStream::connect(&self.sock)?;
            s.set_read_timeout(Some(TIMEOUT))?;
            (&s).write_all(&Conn::message(GET_FEATURES, VERSION_1, &[]))?;
            let mut reply = [0u8; 20];
            (&s).read_exact(&mut reply)?;
            if reply[..4] != GET_FEATURES.to_le_bytes() {
                return Err(io::Error::other(format!("bad reply {reply:02x?}")));
            }
            Ok(())
        };
        let probed = probe();
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("daemon died after {after}: {status}");
            }
            if probed.is_ok() {
                return;
            }
            if start.elapsed() > Duration::from_secs(2) {
                panic!("daemon does not answer after {after}: {probed:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits up to `within` for `needle` to appear in the last 4000 bytes
    /// of the daemon's log; fails with `what` and the log's tail.
    pub fn until_logged(&self, needle: &str, within: Duration, what: &str) {
        let start = Instant::now();
        while !self.log_tail(4000).contains(needle) {
            assert!(
                start.elapsed() < within,
                "{what}\nlog tail: {}",
                self.log_tail(1500)
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn log_tail(&self, bytes: usize) -> String {
        let s = std::fs::read_to_string(self.log()).unwrap_or_default();
        let cut = s.len().saturating_sub(bytes);
        let cut = (cut..s.len()).find(|&i| s.is_char_boundary(i)).unwrap_or(s.len());
        s[cut..].to_string()
    }

    pub fn log_len(&self) -> u64 {
        std::fs::metadata(self.log()).map(|m| m.len()).unwrap_or(0)
    }

    pub fn proc_file(&self, name: &str) -> String {
        std::fs::read_to_string(format!("/proc/{}/{name}", self.pid())).unwrap()
    }

    /// A `kB` field of /proc/PID/status.
    pub fn status_kib(&self, field: &str) -> u64 {
        let status = self.proc_file("status");
        let line = status
            .lines()
            .find(|l| l.starts_with(field))
            .unwrap_or_else(|| panic!("no {field} in /proc/PID/status"));
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    pub fn snapshot(&self) -> Snapshot {
        let fds = std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .unwrap()
            .count();
        let maps = self.proc_file("maps");
        Snapshot {
            fds,
            threads: self.status_kib("Threads:"),
            rss_kib: self.status_kib("VmRSS:"),
            memfd_maps: maps.lines().filter(|l| l.contains("/memfd:")).count(),
        }
    }

    /// Resource use of the daemon with one idle, freshly accepted
    /// connection: opening it and waiting for a GET_FEATURES reply proves
    /// the previous connection was torn down (the daemon serves one
    /// frontend at a time and sets the next one up only after the last one
    /// is gone), and every measurement is then taken in the same state.
    /// Threads that end on their own after an earlier connection (its
    /// `vuc-closer`, which the daemon does not wait for, a `vuc-memcheck`
    /// that has given its answer, a `vuc-wake`) get up to 1 s to be gone
    /// first, and the threads must be the same 20 ms apart: a snapshot
    /// that catches one counts a thread more than the next (which the
    /// thread names alone do not always avoid). The names are printed, for
    /// a failure's output.
    pub fn idle_snapshot(&self) -> Snapshot {
        let c = Conn::open(&self.sock);
        c.get_features();
        let start = Instant::now();
        let mut names = thread_names(self.pid());
        while start.elapsed() < Duration::from_secs(1) {
            let count = |name: &str| names.iter().filter(|n| *n == name).count();
            let settled = count("vuc-closer") <= 1 && count("vuc-memcheck") == 0 && count("vuc-wake") == 0;
            // (And the same threads 20 ms later.)
            std::thread::sleep(Duration::from_millis(20));
            let again = thread_names(self.pid());
            if settled && again == names {
                break;
            }
            names = again;
        }
        let s = self.snapshot();
        // (Shown with a failed assertion on the counts.)
        eprintln!("idle snapshot {s:?}, threads {names:?}");
        drop(c);
        s
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Snapshot {
    pub fds: usize,
    pub threads: u64,
    pub rss_kib: u64,
    pub memfd_maps: usize,
}

/// Whether the daemon answers a GET_FEATURES on a new connection within
/// `limit`; Err with what happened instead (exit status or no answer).
pub fn served_within(daemon: &mut Daemon, limit: Duration) -> Result<Duration, String> {
    let start = Instant::now();
    let c = Conn::open(&daemon.sock);
    c.s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    c.send(GET_FEATURES, VERSION_1, &[], &[]).unwrap();
    loop {
        match c.recv() {
            Got::Msg(GET_FEATURES, ..) => return Ok(start.elapsed()),
            Got::Msg(r, ..) => return Err(format!("unexpected reply {r}")),
            Got::Closed => {
                std::thread::sleep(Duration::from_millis(500));
                return Err(match daemon.child.try_wait().unwrap() {
                    Some(st) => format!("daemon exited: {st}"),
                    None => "connection closed".into(),
                });
            }
            Got::TimedOut => {}
        }
        if let Some(st) = daemon.child.try_wait().unwrap() {
            return Err(format!("daemon exited: {st}"));
        }
        if start.elapsed() > limit {
            let pid = daemon.pid();
            let threads: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
                .map(|d| {
                    d.flatten()
                        .map(|t| {
                            let f = |n: &str| std::fs::read_to_string(t.path().join(n)).unwrap_or_default();
                            format!("{} in {}", f("comm").trim(), f("wchan").trim())
                        })
                        .collect()
                })
                .unwrap_or_default();
            return Err(format!(
                "no answer within {limit:?}, daemon still running (wedged); its threads: {}",
                threads.join(", ")
            ));
        }
    }
}

/// `Max open files` (soft) of the daemon, from /proc/PID/limits.
pub fn daemon_fd_limit(daemon: &Daemon) -> usize {
    daemon
        .proc_file("limits")
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3)?.parse().ok())
        .unwrap()
}
