// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The daemon binary on a private socket, killed when dropped.
#![allow(dead_code)]

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Daemon {
    pub child: Child,
    dir: tempfile::TempDir,
    pub sock: PathBuf,
    log: Option<PathBuf>,
}

impl Daemon {
    /// The daemon's log file (only for [`spawn_daemon_logged`]).
    pub fn log(&self) -> &Path {
        self.log
            .as_deref()
            .expect("daemon started with spawn_daemon_logged")
    }

    /// Kills the daemon and waits for it (the log stays readable until
    /// the `Daemon` is dropped).
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Starts `vhost-user-crypto --socket-path <tmp>/crypto.sock EXTRA...`
/// (RUST_LOG=warn, log on our stderr) and waits for its socket.
pub fn spawn_daemon(extra: &[&str]) -> Daemon {
    spawn(extra, "warn", false)
}

/// Like [`spawn_daemon`] with RUST_LOG=`rust_log` and the log written to
/// a file ([`Daemon::log`]); stdin and stdout are /dev/null.
pub fn spawn_daemon_logged(extra: &[&str], rust_log: &str) -> Daemon {
    spawn(extra, rust_log, true)
}

/// Like [`spawn_daemon`] with RUST_LOG=`rust_log`, the log styling
/// variables (`RUST_LOG_STYLE`, `CLICOLOR`, `CLICOLOR_FORCE`, `NO_COLOR`) removed and
/// then `env` set, and stderr going to `stderr`; stdin and stdout are
/// /dev/null. ([`Daemon::log`] is not available.)
pub fn spawn_daemon_env(extra: &[&str], rust_log: &str, env: &[(&str, &str)], stderr: Stdio) -> Daemon {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = command(&dir, extra, rust_log);
    cmd.env_remove("RUST_LOG_STYLE")
        .env_remove("CLICOLOR")
        .env_remove("CLICOLOR_FORCE")
        .env_remove("NO_COLOR")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr);
    start(cmd, dir, None)
}

fn command(dir: &tempfile::TempDir, extra: &[&str], rust_log: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vhost-user-crypto"));
    cmd.arg("--socket-path")
        .arg(dir.path().join("crypto.sock"))
        .args(extra)
        .env("RUST_LOG", rust_log);
    cmd
}

fn spawn(extra: &[&str], rust_log: &str, to_file: bool) -> Daemon {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = command(&dir, extra, rust_log);
    let log = to_file.then(|| dir.path().join("daemon.log"));
    if let Some(log) = &log {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(log).unwrap());
    }
    start(cmd, dir, log)
}

/// Spawns `cmd` and waits for its socket in `dir`.
fn start(mut cmd: Command, dir: tempfile::TempDir, log: Option<PathBuf>) -> Daemon {
    let sock = dir.path().join("crypto.sock");
    let child = cmd.spawn().unwrap();
    let start = Instant::now();
    while !sock.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "daemon did not create its socket"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    Daemon {
        child,
        dir,
        sock,
        log,
    }
}
