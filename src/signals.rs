// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! SIGTERM and SIGINT: the daemon exits with status 0 within a second, a
//! frontend connected or not (QEMU's `docs/interop/vhost-user.rst`,
//! "Backend program conventions", asks for a prompt exit on SIGTERM),
//! having zeroized the keys of every live session
//! ([`crate::sessions::LiveTables::wipe_all`]; queue workers take no
//! request once it starts, `SessionTable::is_wiped`) and removed the
//! socket files it bound ([`remove_on_exit`]).
//!
//! [`handle_exit_signals`] blocks both signals in the calling thread and
//! starts one thread that waits for them (sigwait(3)). `daemon::run`
//! calls it before any other thread starts, so every thread of the daemon
//! inherits the mask: the signals are taken by that thread alone, no
//! handler runs on any other (the queue workers run under the seccomp
//! allow-list, `crate::seccomp`, which the mask does not involve). Child
//! processes (the memory-check helper) start with an empty mask: std's
//! `Command` resets it before `exec`.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::thread;
use std::time::Duration;

use log::{info, warn};

use crate::sessions::live_tables;

/// The longest the exit waits for a queue's batch to free its session
/// table before it leaves that table's keys to the process's end (a
/// batch takes at most milliseconds, unless the frontend made guest
/// memory block).
pub const WIPE_WITHIN: Duration = Duration::from_millis(500);

/// A socket file to remove at exit, as it was when it was bound.
#[derive(Debug)]
struct SocketFile {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

/// The files [`remove_on_exit`] was given.
static REMOVE_ON_EXIT: Mutex<Vec<SocketFile>> = Mutex::new(Vec::new());

/// Has the file at `path` (a socket the daemon bound: the frontend socket,
/// a statistics socket) removed when SIGTERM or SIGINT ends the daemon. It
/// is removed only if it is still the same file then (device and inode),
/// so that a socket another process bound at the path since stays.
///
/// # Errors
/// The file cannot be looked at (it is then not removed).
pub fn remove_on_exit(path: &Path) -> io::Result<()> {
    let m = std::fs::symlink_metadata(path)?;
    REMOVE_ON_EXIT
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(SocketFile {
            path: path.to_path_buf(),
            dev: m.dev(),
            ino: m.ino(),
        });
    Ok(())
}

/// Removes the files given to [`remove_on_exit`] that are still those:
/// on SIGTERM and SIGINT, and when the daemon ends after serving a
/// connected `--fd` socket.
pub fn remove_files() {
    let files = REMOVE_ON_EXIT.lock().unwrap_or_else(|e| e.into_inner());
    for f in files.iter() {
        let same = std::fs::symlink_metadata(&f.path).is_ok_and(|m| (m.dev(), m.ino()) == (f.dev, f.ino));
        if same {
            if let Err(e) = std::fs::remove_file(&f.path) {
                warn!("cannot remove {}: {e}", f.path.display());
            }
        }
    }
}

/// SIGTERM and SIGINT, as a signal set.
fn exit_signals() -> libc::sigset_t {
    // SAFETY: a sigset_t is plain data; sigemptyset initialises it.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: sigemptyset(3) and sigaddset(3) on a set of ours, with
    // valid signal numbers (they cannot fail).
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
    }
    set
}

/// Blocks SIGTERM and SIGINT in the calling thread (and so in every
/// thread it starts afterwards) and starts the thread that takes them:
/// it zeroizes the keys of every live session, removes the files given
/// to [`remove_on_exit`], logs one line and exits the process with
/// status 0. Call it before any other thread starts (a thread started
/// before has the signals unblocked and could take one itself, which
/// would end the process by the default action).
///
/// # Errors
/// The mask cannot be set or the thread cannot be started.
pub fn handle_exit_signals() -> io::Result<()> {
    let set = exit_signals();
    // SAFETY: pthread_sigmask(3) reading a set of ours.
    let r = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r));
    }
    thread::Builder::new()
        .name("vuc-signals".into())
        .spawn(move || loop {
            let mut sig: libc::c_int = 0;
            // SAFETY: sigwait(3) reading a set of ours and writing an int
            // of ours; both signals are blocked in every thread.
            if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
                continue;
            }
            exit_on(sig);
        })?;
    Ok(())
}

/// What the daemon does on SIGTERM or SIGINT (`sig`).
fn exit_on(sig: libc::c_int) -> ! {
    let name = if sig == libc::SIGINT { "SIGINT" } else { "SIGTERM" };
    let wiped = live_tables().wipe_all(WIPE_WITHIN);
    remove_files();
    if wiped.busy > 0 {
        warn!(
            "{name}: {} session tables stayed locked by a queue's batch for {WIPE_WITHIN:?}; their keys go with the process",
            wiped.busy
        );
    }
    info!(
        "{name}: exiting; session keys zeroized: {} (in {} session tables)",
        wiped.sessions, wiped.tables
    );
    log::logger().flush();
    std::process::exit(0)
}
