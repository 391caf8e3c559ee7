// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The memory checks' helper process: the daemon's own binary started with
//! [`MEMORY_CHECK_HELPER_ARG`], given copies of the region descriptors. A
//! check that waits uninterruptibly on a lock the frontend holds keeps only
//! that process waiting; the daemon kills it, refuses the table, and can
//! still exit.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use crate::eventfd::set_nonblocking;
use crate::wire::vhost_user::{FrontendReq, MAX_FDS, MAX_PAYLOAD};

use super::{check_memory_regions, MAX_STUCK_MEMORY_CHECKS, MEMORY_CHECK_LIMIT};

/// The argument that makes the daemon's binary run one memory check for
/// its parent ([`memory_check_helper_main`]); not for users.
pub const MEMORY_CHECK_HELPER_ARG: &str = "--internal-memory-check";

/// The binary [`super::check_memory_regions_bounded`] runs the checks in, when
/// set ([`use_memory_check_helper`]).
pub(super) static MEMORY_CHECK_HELPER: OnceLock<PathBuf> = OnceLock::new();

/// Helper processes whose check did not finish in time (killed, to be
/// reaped), daemon-wide.
static STUCK_HELPERS: Mutex<Vec<Child>> = Mutex::new(Vec::new());

/// Makes the memory table checks (`check_memory_regions_bounded`) run in a process of
/// their own, `exe` started with [`MEMORY_CHECK_HELPER_ARG`] (the daemon
/// passes `/proc/self/exe`). A check that waits uninterruptibly on a lock
/// the frontend holds then keeps only that process waiting, with copies of
/// the region descriptors and nothing else of the daemon's: the daemon can
/// still exit. Without it (the library's tests), the checks run on a
/// thread of the daemon's own.
pub fn use_memory_check_helper(exe: PathBuf) {
    let _ = MEMORY_CHECK_HELPER.set(exe);
}

/// The helper process's side of [`use_memory_check_helper`]: `args` are
/// the request code, `1` or `0` for `--require-sealed-memory`, and the
/// number N of region descriptors, which it has as descriptors 3 to
/// 2 + N; the payload comes on standard input. Writes a line `W <text>`
/// per warning, then `OK`, or `ERR <text>`, to standard output. Returns
/// the exit status.
pub fn memory_check_helper_main(args: &[String]) -> i32 {
    let (Some(request), Some(sealed), Some(n)) = (
        args.first()
            .and_then(|a| a.parse::<u32>().ok())
            .and_then(|r| FrontendReq::try_from(r).ok()),
        args.get(1),
        args.get(2)
            .and_then(|a| a.parse::<usize>().ok())
            .filter(|&n| n <= MAX_FDS),
    ) else {
        return 2;
    };
    let mut payload = Vec::new();
    if io::stdin()
        .take(MAX_PAYLOAD as u64)
        .read_to_end(&mut payload)
        .is_err()
    {
        return 2;
    }
    // SAFETY: the parent passed exactly these N descriptors, 3 to 2 + N
    // (`check_in_helper`), and nothing else owns them here.
    let files: Vec<File> = (0..n)
        .map(|i| unsafe { File::from_raw_fd(3 + i as RawFd) })
        .collect();
    let out = match check_memory_regions(request, &payload, &files, sealed == "1") {
        Ok(warnings) => {
            let mut o: String = warnings
                .iter()
                .map(|w| format!("W {}\n", w.replace('\n', " ")))
                .collect();
            o.push_str("OK\n");
            o
        }
        Err(e) => format!("ERR {}\n", e.to_string().replace('\n', " ")),
    };
    if io::stdout().write_all(out.as_bytes()).is_err() {
        return 1;
    }
    0
}

/// Why [`check_in_helper`] gave no answer.
pub(super) enum HelperError {
    /// The helper process could not be started (the caller checks on a
    /// thread instead).
    Spawn(io::Error),
    /// The check refused the table, or did not finish in time.
    Check(io::Error),
}

impl From<io::Error> for HelperError {
    fn from(e: io::Error) -> Self {
        HelperError::Check(e)
    }
}

/// [`super::check_memory_regions_bounded`] in a helper process (see
/// [`use_memory_check_helper`]).
pub(super) fn check_in_helper(
    exe: &Path,
    request: FrontendReq,
    payload: &[u8],
    fds: &[File],
    require_sealed: bool,
) -> Result<Vec<String>, HelperError> {
    use std::os::unix::process::CommandExt;
    {
        let mut stuck = STUCK_HELPERS.lock().unwrap_or_else(|e| e.into_inner());
        stuck.retain_mut(|c| matches!(c.try_wait(), Ok(None)));
        if stuck.len() >= MAX_STUCK_MEMORY_CHECKS {
            return Err(HelperError::Check(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!("{MAX_STUCK_MEMORY_CHECKS} earlier memory tables' checks are still blocked"),
            )));
        }
    }
    let n = fds.len().min(MAX_FDS);
    let mut raw = [-1 as RawFd; MAX_FDS];
    for (r, f) in raw.iter_mut().zip(fds) {
        *r = f.as_raw_fd();
    }
    let mut cmd = Command::new(exe);
    cmd.arg(MEMORY_CHECK_HELPER_ARG)
        .arg(u32::from(request).to_string())
        .arg(if require_sealed { "1" } else { "0" })
        .arg(n.to_string())
        .env("RUST_LOG", "off")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    // SAFETY: the closure runs in the forked child before exec and makes
    // only async-signal-safe system calls (fcntl, dup2, close_range) on
    // plain integers; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            let first = 3 + n as RawFd;
            let mut high = [-1 as RawFd; MAX_FDS];
            // Copies above the target range first, so that placing them
            // at 3.. cannot overwrite one not yet placed.
            for i in 0..n {
                high[i] = libc::fcntl(raw[i], libc::F_DUPFD_CLOEXEC, first);
                if high[i] < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            for (i, &h) in high.iter().enumerate().take(n) {
                if libc::dup2(h, 3 + i as RawFd) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            // Nothing else of the daemon's goes along: close-on-exec for
            // all the rest (CLOSE_RANGE_CLOEXEC, Linux 5.11; closing them
            // here would also close the pipe on which the standard library
            // reports a failed exec).
            const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
            libc::syscall(
                libc::SYS_close_range,
                first as libc::c_uint,
                libc::c_uint::MAX,
                CLOSE_RANGE_CLOEXEC,
            );
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(HelperError::Spawn)?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(payload);
    }
    let Some(mut stdout) = child.stdout.take() else {
        reap_or_keep(child);
        return Err(io::Error::other("memory check helper without output").into());
    };
    if let Err(e) = set_nonblocking(stdout.as_raw_fd()) {
        let _ = child.kill();
        reap_or_keep(child);
        return Err(e.into());
    }
    let deadline = Instant::now() + MEMORY_CHECK_LIMIT;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    // Until the answer's last line, not until EOF: after its answer the
    // helper closes the region files (when `memory_check_helper_main`
    // returns, its stdout still open), and closing one can wait on the
    // frontend (a FUSE file's FLUSH).
    let answered = |out: &[u8]| {
        out.ends_with(b"\n")
            && out[..out.len() - 1]
                .rsplit(|&b| b == b'\n')
                .next()
                .is_some_and(|last| last == b"OK" || last.starts_with(b"ERR "))
    };
    loop {
        match stdout.read(&mut buf) {
            Ok(0) => break,
            Ok(k) => {
                out.extend_from_slice(&buf[..k]);
                if answered(&out) {
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    // It waits on something of the frontend's: killed
                    // (it dies once that lets it go), reaped later.
                    let _ = child.kill();
                    reap_or_keep(child);
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("checking the memory regions' files took more than {MEMORY_CHECK_LIMIT:?}"),
                    )
                    .into());
                }
                let mut p = libc::pollfd {
                    fd: stdout.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: poll(2) on one pollfd of ours.
                unsafe {
                    libc::poll(
                        &mut p,
                        1,
                        i32::try_from(left.as_millis()).unwrap_or(i32::MAX).max(1),
                    )
                };
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                reap_or_keep(child);
                return Err(e.into());
            }
        }
    }
    reap_or_keep(child);
    let text = String::from_utf8_lossy(&out);
    let mut warnings = Vec::new();
    for line in text.lines() {
        if let Some(w) = line.strip_prefix("W ") {
            warnings.push(w.to_string());
        } else if line == "OK" {
            return Ok(warnings);
        } else if let Some(e) = line.strip_prefix("ERR ") {
            return Err(io::Error::new(io::ErrorKind::InvalidData, e.to_string()).into());
        }
    }
    Err(io::Error::other("the memory check helper gave no result").into())
}

/// Reaps a helper process that has exited, or exits within 100 ms (after
/// its answer it only closes its descriptors); one that does not is kept
/// in `STUCK_HELPERS`, to be reaped later and counted until then.
fn reap_or_keep(mut child: Child) {
    let until = Instant::now() + Duration::from_millis(100);
    loop {
        match child.try_wait() {
            Ok(Some(_)) | Err(_) => return,
            Ok(None) if Instant::now() >= until => break,
            Ok(None) => thread::sleep(Duration::from_millis(1)),
        }
    }
    STUCK_HELPERS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(child);
}
