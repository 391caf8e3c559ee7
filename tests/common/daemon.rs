// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The daemon binary on a private socket, killed when dropped.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

pub struct Daemon {
    child: Child,
    _dir: tempfile::TempDir,
    pub sock: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `vhost-user-crypto --socket-path <tmp>/crypto.sock EXTRA...`
/// (RUST_LOG=warn) and waits for its socket.
pub fn spawn_daemon(extra: &[&str]) -> Daemon {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("crypto.sock");
    let child = Command::new(env!("CARGO_BIN_EXE_vhost-user-crypto"))
        .arg("--socket-path")
        .arg(&sock)
        .args(extra)
        .env("RUST_LOG", "warn")
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !sock.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "daemon did not create its socket"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    Daemon {
        child,
        _dir: dir,
        sock,
    }
}
