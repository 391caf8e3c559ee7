// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The frontend's ring eventfds: what is accepted as one, reading one
//! without ever waiting, and the copies kept to wake a queue worker blocked
//! on one when a connection is torn down.
//!
//! A frontend shares the open file of each eventfd with the daemon, so it
//! can change the file's flags (`O_NONBLOCK`) or its counter at any time;
//! nothing here trusts either (`docs/RELIABILITY.md`, threat model).

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};

use crate::wire::vhost_user::FrontendReq;

/// A new eventfd (non-blocking, close-on-exec) of the daemon's own.
///
/// # Errors
/// `eventfd(2)` failed.
pub(crate) fn own_eventfd() -> io::Result<File> {
    // SAFETY: eventfd(2) with an initial count of 0 and flags; the result
    // is checked.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Checks a descriptor of `SET_VRING_KICK`, `SET_VRING_CALL` or
/// `SET_VRING_ERR` (`request`) and sets `O_NONBLOCK` on it.
///
/// vhost-user-backend 0.24 reads 8 bytes from a ring's kick descriptor
/// whenever its epoll (level-triggered) reports it readable, while it
/// holds the ring's lock (`event_loop.rs` `handle_event`, `vring.rs`
/// `read_kick`), and the worker writes 8 bytes to the call descriptor
/// after each batch. The vhost-user spec says these are eventfds; the
/// library does not check. So:
/// * anything else (a pipe, a socket, a file) is refused: a pipe holding
///   fewer than 8 bytes would block the worker in `read` for good, holding
///   the ring's lock (GET_VRING_BASE never answered) and, once the
///   frontend is gone, keeping the daemon from serving anyone else;
/// * an eventfd in semaphore mode (`EFD_SEMAPHORE`, shown as
///   `eventfd-semaphore: 1` in `/proc/self/fdinfo` on recent kernels,
///   e.g. 6.18) is refused: each read takes 1 off its counter, so one write of 2^32
///   keeps the worker waking up, a whole CPU, as long as the connection
///   lasts. (On older kernels, which do not show the mode, it cannot be
///   told apart and is accepted.)
/// * the others get `O_NONBLOCK`, so that neither the library's read of a
///   kick descriptor nor the worker's write of a call descriptor can
///   block: a call eventfd whose counter the frontend filled up makes the
///   write fail with `EAGAIN` instead (counted, see
///   [`crate::backend::CryptoBackend::signal_failures`]). The flag is on
///   the open file, shared with the frontend; QEMU opens its eventfds
///   with `EFD_NONBLOCK` anyway (`event_notifier_init`). A frontend can
///   clear it again; then a worker can block after all, and the daemon
///   lets it go on when the connection ends ([`EventFdCopies`]).
///
/// What a descriptor is comes from `/proc/self/fd/N`
/// (`anon_inode:[eventfd]`); without `/proc` nothing is accepted.
///
/// # Errors
/// `InvalidData` (the caller ends the connection) for a refused
/// descriptor, with the reason; the `fcntl` error if setting the flag
/// failed.
pub fn check_ring_eventfd(request: FrontendReq, file: &File) -> io::Result<()> {
    let fd = file.as_raw_fd();
    let what = format!("{request:?}");
    let bad = |m: String| Err(io::Error::new(io::ErrorKind::InvalidData, format!("{what}: {m}")));
    match std::fs::read_link(format!("/proc/self/fd/{fd}")) {
        Ok(target) if target.as_os_str() == "anon_inode:[eventfd]" => {}
        Ok(target) => return bad(format!("the descriptor is {}, not an eventfd", target.display())),
        Err(e) => return bad(format!("cannot tell what the descriptor is (/proc/self/fd: {e})")),
    }
    if fdinfo_field(file, "eventfd-semaphore").is_some_and(|v| v != "0") {
        return bad("the eventfd is in semaphore mode (EFD_SEMAPHORE)".into());
    }
    set_nonblocking(fd)
}

/// The value of field `key` of `/proc/self/fdinfo/N` for `file` (e.g.
/// `eventfd-id`, `eventfd-semaphore`), trimmed; `None` when the file or
/// the field is not there.
fn fdinfo_field(file: &File, key: &str) -> Option<String> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", file.as_raw_fd())).ok()?;
    info.lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim() == key)
        .map(|(_, v)| v.trim().to_string())
}

/// Checks that [`check_ring_eventfd`] works here, on an eventfd of its
/// own, so that a daemon that cannot tell eventfds apart (no `/proc`)
/// fails at start-up instead of refusing every frontend.
///
/// # Errors
/// Creating the eventfd failed, or the check refused it (the error says
/// why, e.g. `/proc/self/fd` missing).
pub fn probe_eventfd_check() -> io::Result<()> {
    let file = own_eventfd()?;
    check_ring_eventfd(FrontendReq::SET_VRING_KICK, &file).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("{e} (the daemon needs /proc mounted to tell eventfds from other descriptors)"),
        )
    })
}

/// Most eventfd copies [`EventFdCopies`] keeps per ring and kind (kick,
/// call); past it the oldest is let go.
pub const EVENTFD_COPIES_PER_RING: usize = 16;

/// Copies (`dup`s) of the kick and call eventfds the frontend gave each
/// data ring, kept for tearing the connection down: the latest ones, and
/// the ones they replaced, one per eventfd (told apart by the
/// `eventfd-id` of `/proc/self/fdinfo`; QEMU switches a ring's call
/// between two eventfds as the guest masks and unmasks its interrupt), at
/// most [`EVENTFD_COPIES_PER_RING`] of each kind per ring.
///
/// [`check_ring_eventfd`] makes those eventfds non-blocking, but the flag
/// lives on the open file, which the frontend shares and can clear again.
/// A worker can then be blocked for good in the call write (the frontend
/// filled the counter) or, where the kernel's eventfds refuse
/// `RWF_NOWAIT` (see [`read_eventfd_nowait`]), in its read of the
/// frontend's kick eventfd (the frontend read the counter first, or gave
/// two rings one kick eventfd), and the daemon, which joins the workers
/// when the connection ends, would wait for it forever.
/// [`EventFdCopies::wake_workers`] lets such a worker go on, also when the
/// frontend has since given the ring another eventfd (the library applies
/// that only once the worker lets go of the ring).
#[derive(Debug, Default)]
pub struct EventFdCopies {
    kick: Vec<Vec<(Option<u64>, File)>>,
    call: Vec<Vec<(Option<u64>, File)>>,
}

/// The `eventfd-id` of an eventfd (`/proc/self/fdinfo`), if shown.
fn eventfd_id(file: &File) -> Option<u64> {
    fdinfo_field(file, "eventfd-id")?.parse().ok()
}

impl EventFdCopies {
    /// Keeps a copy of `file`, the eventfd of `SET_VRING_KICK` or
    /// `SET_VRING_CALL` (`req`; others are ignored) for ring `index`,
    /// as the latest (a copy of the same eventfd kept before is let go).
    ///
    /// # Errors
    /// `dup` failed.
    pub(crate) fn keep(&mut self, req: FrontendReq, index: usize, file: &File) -> io::Result<()> {
        let rings = match req {
            FrontendReq::SET_VRING_KICK => &mut self.kick,
            FrontendReq::SET_VRING_CALL => &mut self.call,
            _ => return Ok(()),
        };
        if rings.len() <= index {
            rings.resize_with(index + 1, Vec::new);
        }
        let copies = &mut rings[index];
        let id = eventfd_id(file);
        if id.is_some() {
            copies.retain(|(other, _)| *other != id);
        }
        if copies.len() == EVENTFD_COPIES_PER_RING {
            copies.remove(0);
        }
        copies.push((id, file.try_clone()?));
        Ok(())
    }

    /// How many copies are kept (all rings, both kinds).
    pub fn len(&self) -> usize {
        self.kick.iter().chain(&self.call).map(Vec::len).sum()
    }

    /// Whether no copy is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Wakes a worker blocked on one of the eventfds: empties each call
    /// eventfd without waiting, so a worker blocked writing it goes on, and
    /// adds 1 to each kick eventfd that is empty, so a worker blocked
    /// reading it goes on. The call eventfd is read with `preadv2` and
    /// `RWF_NOWAIT`, which does not depend on `O_NONBLOCK`; where the
    /// kernel does not support that for eventfds (`EOPNOTSUPP`), the copy
    /// sets `O_NONBLOCK` again and reads. The kick eventfd is written after
    /// setting `O_NONBLOCK` again. Meant for the end of a connection, when
    /// the workers no longer serve the rings; call it on a thread of its
    /// own: a frontend that clears `O_NONBLOCK` and fills a kick eventfd
    /// between those steps would block the write until a worker reads it.
    pub fn wake_workers(&self) {
        for (_, call) in self.call.iter().flatten() {
            let fd = call.as_raw_fd();
            if let Err(e) = read_eventfd_nowait(fd) {
                if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
                    let _ = set_nonblocking(fd);
                    let _ = (&*call).read(&mut [0u8; 8]);
                }
            }
        }
        for (_, kick) in self.kick.iter().flatten() {
            let mut p = libc::pollfd {
                fd: kick.as_raw_fd(),
                events: libc::POLLIN | libc::POLLOUT,
                revents: 0,
            };
            // SAFETY: poll(2) on one pollfd of ours, without waiting.
            let ready = unsafe { libc::poll(&mut p, 1, 0) };
            if ready == 1 && p.revents & libc::POLLIN == 0 && p.revents & libc::POLLOUT != 0 {
                let _ = set_nonblocking(kick.as_raw_fd());
                let _ = (&*kick).write(&1u64.to_ne_bytes());
            }
        }
    }
}

/// Takes an eventfd's counter (eventfd(2): an 8-byte read returns it and
/// sets it to 0) without ever waiting, whatever the open file's
/// `O_NONBLOCK`, which the frontend shares and can clear: `preadv2(2)` at
/// the current position with `RWF_NOWAIT`, which an eventfd whose counter
/// is 0 answers with `EAGAIN`.
///
/// # Errors
/// The `preadv2` error: `EAGAIN` when the counter is 0; `EOPNOTSUPP` where
/// the kernel's eventfds do not take `RWF_NOWAIT` (kernels older than the
/// eventfd `read_iter` conversion).
pub fn read_eventfd_nowait(fd: RawFd) -> io::Result<u64> {
    let mut buf = [0u8; 8];
    let iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: preadv2 into one 8-byte buffer of ours, at the current
    // position (-1); RWF_NOWAIT: EAGAIN instead of waiting when the counter
    // is 0.
    let r = unsafe { libc::preadv2(fd, &iov, 1, -1, libc::RWF_NOWAIT) };
    match r {
        8 => Ok(u64::from_ne_bytes(buf)),
        r if r < 0 => Err(io::Error::last_os_error()),
        _ => Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
    }
}

/// Sets `O_NONBLOCK` on `fd`'s open file, if it is not set already.
///
/// # Errors
/// The `fcntl` error.
pub(crate) fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl(F_GETFL) on a descriptor the caller owns; it takes no
    // argument and touches no memory of ours.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    if flags & libc::O_NONBLOCK != 0 {
        return Ok(());
    }
    // SAFETY: fcntl(F_SETFL) with an int argument on a descriptor the
    // caller owns; it touches no memory of ours.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eventfd(flags: i32) -> File {
        // SAFETY: eventfd(2) with a count and flags; the result is checked.
        let fd = unsafe { libc::eventfd(0, flags) };
        assert!(fd >= 0, "eventfd: {}", io::Error::last_os_error());
        // SAFETY: a fresh descriptor we own.
        unsafe { File::from_raw_fd(fd) }
    }

    /// An eventfd's counter (`eventfd-count`, hexadecimal in fdinfo).
    fn count(f: &File) -> u64 {
        u64::from_str_radix(&fdinfo_field(f, "eventfd-count").unwrap(), 16).unwrap()
    }

    /// One copy per eventfd and ring (QEMU's two alternating call eventfds
    /// stay two copies), at most EVENTFD_COPIES_PER_RING per ring and kind.
    #[test]
    fn eventfd_copies_are_one_per_eventfd_and_bounded() {
        let mut c = EventFdCopies::default();
        let (a, b) = (eventfd(0), eventfd(0));
        for _ in 0..10 {
            c.keep(FrontendReq::SET_VRING_CALL, 0, &a).unwrap();
            c.keep(FrontendReq::SET_VRING_CALL, 0, &b).unwrap();
        }
        assert_eq!(c.len(), 2);
        c.keep(FrontendReq::SET_VRING_KICK, 0, &a).unwrap();
        c.keep(FrontendReq::SET_VRING_CALL, 3, &a).unwrap();
        c.keep(FrontendReq::SET_VRING_ERR, 0, &a).unwrap();
        assert_eq!(c.len(), 4);
        let many: Vec<File> = (0..2 * EVENTFD_COPIES_PER_RING).map(|_| eventfd(0)).collect();
        for f in &many {
            c.keep(FrontendReq::SET_VRING_KICK, 1, f).unwrap();
        }
        assert_eq!(c.len(), 4 + EVENTFD_COPIES_PER_RING);
    }

    /// wake_workers empties a full call eventfd and adds 1 to an empty kick
    /// eventfd, whether or not the frontend's copy is non-blocking, and
    /// leaves a kick that already holds a count alone.
    #[test]
    fn wake_workers_empties_calls_and_kicks_empty_kicks() {
        let mut c = EventFdCopies::default();
        let (call, kick, busy_kick) = (eventfd(0), eventfd(0), eventfd(libc::EFD_NONBLOCK));
        (&call).write_all(&(u64::MAX - 1).to_ne_bytes()).unwrap();
        (&busy_kick).write_all(&5u64.to_ne_bytes()).unwrap();
        c.keep(FrontendReq::SET_VRING_CALL, 0, &call).unwrap();
        c.keep(FrontendReq::SET_VRING_KICK, 0, &kick).unwrap();
        c.keep(FrontendReq::SET_VRING_KICK, 1, &busy_kick).unwrap();
        c.wake_workers();
        assert_eq!((count(&call), count(&kick), count(&busy_kick)), (0, 1, 5));
    }

    /// read_eventfd_nowait takes the whole counter of a blocking eventfd
    /// (no `O_NONBLOCK`, as a frontend can leave the kick eventfd it
    /// shares) and answers `EAGAIN` at once when it is 0, where read(2)
    /// would wait for the next write (eventfd(2)). The reads run on a
    /// thread of their own, so a read that waits fails the test instead
    /// of hanging it.
    #[test]
    fn read_eventfd_nowait_never_waits() {
        let f = eventfd(0);
        (&f).write_all(&5u64.to_ne_bytes()).unwrap();
        let fd = f.as_raw_fd();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let first = read_eventfd_nowait(fd).map_err(|e| e.raw_os_error());
            let second = read_eventfd_nowait(fd).map_err(|e| e.raw_os_error());
            let _ = tx.send((first, second));
        });
        let got = rx.recv_timeout(std::time::Duration::from_secs(5));
        // Let a thread that waits go before `f` closes.
        (&f).write_all(&1u64.to_ne_bytes()).unwrap();
        assert_eq!(got, Ok((Ok(5), Err(Some(libc::EAGAIN)))));
        assert_eq!(count(&f), 1);
    }
}
