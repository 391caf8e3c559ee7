// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! `--spawn-daemon`: run the backend daemon on a private socket for the
//! length of a replay.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// A daemon child process, killed on drop.
pub struct SpawnedDaemon {
    child: Child,
    _dir: tempfile::TempDir,
    socket: PathBuf,
}

impl SpawnedDaemon {
    /// Starts `bin` (default: `vhost-user-crypto` next to this executable)
    /// with `--socket-path` in a private directory and `--queues queues`,
    /// and waits for its socket.
    ///
    /// # Errors
    /// The binary is missing, exits, or does not listen within 10 s.
    pub fn start(bin: Option<&Path>, queues: u16) -> io::Result<Self> {
        Self::start_with(bin, &["--queues", &queues.to_string()])
    }

    /// [`SpawnedDaemon::start`] with the daemon options `args` after
    /// `--socket-path`.
    ///
    /// # Errors
    /// As [`SpawnedDaemon::start`].
    pub fn start_with(bin: Option<&Path>, args: &[&str]) -> io::Result<Self> {
        let (bin, hint) = match bin {
            Some(b) => (b.to_path_buf(), "(--daemon-bin)"),
            None => (
                std::env::current_exe()?.with_file_name("vhost-user-crypto"),
                "(build it, or pass --daemon-bin)",
            ),
        };
        if !bin.exists() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("daemon binary {} not found {hint}", bin.display()),
            ));
        }
        let dir = tempfile::Builder::new()
            .prefix("vhost-crypto-replay.")
            .tempdir()?;
        let socket = dir.path().join("crypto.sock");
        let mut cmd = Command::new(&bin);
        if std::env::var_os("RUST_LOG").is_none() {
            // Keep the daemon's per-connection info lines out of the report.
            cmd.env("RUST_LOG", "warn");
        }
        let mut child = cmd
            .arg("--socket-path")
            .arg(&socket)
            .args(args)
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("cannot start {}: {e}", bin.display())))?;
        let start = Instant::now();
        while !socket.exists() {
            if let Some(st) = child.try_wait()? {
                return Err(io::Error::other(format!("{} exited: {st}", bin.display())));
            }
            if start.elapsed() > Duration::from_secs(10) {
                let _ = child.kill();
                return Err(io::Error::other(format!(
                    "{} did not listen within 10 s",
                    bin.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(SpawnedDaemon {
            child,
            _dir: dir,
            socket,
        })
    }

    /// The daemon's socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for SpawnedDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
