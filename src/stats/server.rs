// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The stats socket (`--stats-socket PATH`): a Unix stream socket, mode
//! 0600, on which every connection gets one JSON object ([`Snapshot`](super::Snapshot))
//! and a newline, then EOF (`socat - UNIX-CONNECT:PATH` prints it).
//!
//! A thread of its own (`vuc-stats`) accepts and answers; queue workers
//! never do, and never wait for it: they only add to their counters, which
//! it reads. Each answer is one non-blocking write of a few KiB (the
//! socket's send buffer holds it whole), after which the connection is
//! closed: a client that never reads, or never closes, costs the thread
//! one write and holds nothing of the daemon. A write that would block
//! (a send buffer too small for the object) is given up at once, and the
//! client gets the object cut short rather than delaying the next one.

use std::ffi::CString;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::thread;
use std::time::Duration;

use log::{debug, warn};

/// Mode of the stats socket file: the daemon's user only (the daemon
/// binds it so, `crate::daemon::bind_listener_with_mode`).
pub const STATS_SOCKET_MODE: u32 = 0o600;

/// The bound stats socket file: its path (as a C string, for
/// [`remove_socket_file`]) and the device and inode it was bound as.
struct Bound {
    path: CString,
    dev: u64,
    ino: u64,
}

static BOUND: OnceLock<Bound> = OnceLock::new();

/// The running stats socket; dropping it removes the socket file
/// ([`remove_socket_file`]). The thread serving it runs until the process
/// exits.
#[derive(Debug)]
pub struct StatsSocket {
    path: PathBuf,
}

impl StatsSocket {
    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for StatsSocket {
    fn drop(&mut self) {
        remove_socket_file();
    }
}

/// Starts the thread that answers each connection to `listener`, bound
/// at `path`, with the counters of the first `queues` data queues.
///
/// # Errors
/// The thread cannot be started (the socket file is then removed).
pub fn start(listener: UnixListener, path: &Path, queues: usize) -> io::Result<StatsSocket> {
    if let (Ok(m), Ok(c)) = (
        std::fs::symlink_metadata(path),
        CString::new(path.as_os_str().as_bytes()),
    ) {
        let _ = BOUND.set(Bound {
            path: c,
            dev: m.dev(),
            ino: m.ino(),
        });
    }
    let socket = StatsSocket { path: path.into() };
    let stats = super::daemon();
    thread::Builder::new()
        .name("vuc-stats".into())
        .spawn(move || serve(&listener, stats, queues))?;
    Ok(socket)
}

/// Removes the stats socket file, if it is still the one this process
/// bound (same device and inode: a file another daemon bound there since
/// is left alone). Does nothing without a stats socket, or a second time.
///
/// Async-signal-safe (`lstat` and `unlink` on a path prepared at bind
/// time, no allocation), so a signal handler may call it too.
pub fn remove_socket_file() {
    let Some(b) = BOUND.get() else {
        return;
    };
    // SAFETY: a zeroed `stat` is a valid value to be written over.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: lstat(2) reading a NUL-terminated path we own and writing
    // into a struct of ours.
    if unsafe { libc::lstat(b.path.as_ptr(), &mut st) } != 0 {
        return;
    }
    if st.st_dev as u64 == b.dev && st.st_ino as u64 == b.ino {
        // SAFETY: unlink(2) of a NUL-terminated path we own.
        unsafe { libc::unlink(b.path.as_ptr()) };
    }
}

/// Answers connections until the process exits.
fn serve(listener: &UnixListener, stats: &'static super::DaemonStats, queues: usize) {
    let mut accept_failures = 0u64;
    loop {
        match listener.accept() {
            Ok((client, _)) => {
                if let Err(e) = answer(client, stats, queues) {
                    debug!("stats client not answered in full: {e}");
                }
            }
            Err(e) => {
                // (E.g. out of descriptors: logged once, then tried again
                // after a pause rather than in a busy loop.)
                if accept_failures == 0 {
                    warn!("stats socket: accept failed: {e} (further failures are not logged)");
                }
                accept_failures += 1;
                thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// Writes the object and a newline to `client` without waiting, then
/// closes it.
fn answer(client: UnixStream, stats: &super::DaemonStats, queues: usize) -> io::Result<()> {
    client.set_nonblocking(true)?;
    let mut body = serde_json::to_vec(&stats.snapshot(queues)).map_err(io::Error::other)?;
    body.push(b'\n');
    (&client).write_all(&body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;

    /// The only test in this process that binds a stats socket
    /// ([`remove_socket_file`] keeps one path per process).
    #[test]
    fn answers_with_one_line_of_json_and_removes_its_file_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stats.sock");
        let listener = crate::daemon::bind_listener_with_mode(&path, Some(STATS_SOCKET_MODE)).unwrap();
        let socket = start(listener, &path, 3).unwrap();
        let mode = std::fs::symlink_metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o7777, 0o600);
        let mut c = UnixStream::connect(&path).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = String::new();
        c.read_to_string(&mut b).unwrap();
        assert!(b.ends_with('\n') && b.matches('\n').count() == 1, "{b:?}");
        let v: serde_json::Value = serde_json::from_str(&b).unwrap();
        let indexes: Vec<_> = v["queues"]
            .as_array()
            .unwrap()
            .iter()
            .map(|q| q["index"].clone())
            .collect();
        assert_eq!(indexes, [0, 1, 2]);
        drop(socket);
        assert!(!path.exists(), "the socket file is removed");
        // A file bound there since is not this process's: left alone.
        let other = UnixListener::bind(&path).unwrap();
        remove_socket_file();
        assert!(path.exists(), "another socket at the path is left alone");
        drop(other);
    }
}
