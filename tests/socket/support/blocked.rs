// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Frontends that block the daemon's threads on purpose: a queue worker
//! blocked writing a full call eventfd, and descriptors whose close(2)
//! blocks (a TCP socket with `SO_LINGER` and unsent data).

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::time::{Duration, Instant};

use super::conn::{Conn, Got, MEM_SIZE};
use super::daemon::Daemon;
use super::probes::until_a_worker_blocks_in;
use super::raw_ring::{create_nist_session, create_nist_session_id, raw_ring, submit_raw_nist};
use crate::common::*;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// Both ends of a new pipe (blocking): (read end, write end).
pub fn pipe() -> (File, File) {
    let mut fds = [0; 2];
    // SAFETY: pipe(2) fills a 2-int array; the result is checked.
    let r = unsafe { libc::pipe(fds.as_mut_ptr()) };
    assert_eq!(r, 0, "pipe: {}", io::Error::last_os_error());
    // SAFETY: two fresh descriptors we own.
    unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) }
}

/// Clears `O_NONBLOCK` on a descriptor (on its open file, which the
/// daemon shares when the descriptor was sent to it).
pub fn clear_nonblock(fd: RawFd) {
    let flags = status_flags(fd);
    // SAFETY: fcntl(F_SETFL) with an int argument; touches no memory.
    let r = unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) };
    assert_eq!(r, 0, "F_SETFL: {}", io::Error::last_os_error());
}

/// A descriptor's status flags (`fcntl(F_GETFL)`).
pub fn status_flags(fd: RawFd) -> i32 {
    // SAFETY: fcntl(F_GETFL) takes no argument and touches no memory of ours.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    assert!(flags >= 0, "F_GETFL: {}", io::Error::last_os_error());
    flags
}

/// fcntl(F_GET_SEALS), or -1 for a file without seals.
pub fn seals(f: &File) -> i32 {
    // SAFETY: F_GET_SEALS on a descriptor we own; no memory is passed.
    unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GET_SEALS) }
}

/// A daemon (`extra` arguments) whose ring 0 worker is blocked writing its
/// call eventfd: ring 0 set up ([`raw_ring`]) and then `more`, the NIST
/// session, then the frontend fills the call eventfd's counter, clears the
/// `O_NONBLOCK` the daemon set on it (the flag is on the open file they
/// share) and submits a request; returned once a worker sits in `write`.
pub struct BlockedOnCall {
    pub daemon: Daemon,
    pub c: Conn,
    pub mem: File,
    pub _kick: EventFd,
    pub _call: EventFd,
}

/// Gives ring 0 `n` new call eventfds, one after another (returned, to
/// keep them open), then waits for the reply to a second CREATE: the
/// daemon's proxy answers it in order, so it has taken every message
/// before it (the proxy ends a connection as soon as the frontend closes,
/// whatever it has not read).
pub fn replace_call_eventfd(c: &Conn, n: usize) -> Vec<EventFd> {
    let new: Vec<EventFd> = (0..n).map(|_| EventFd::new(EFD_NONBLOCK).unwrap()).collect();
    for e in &new {
        c.send(SET_VRING_CALL, VERSION_1, &0u64.to_le_bytes(), &[e.as_raw_fd()])
            .unwrap();
    }
    assert_eq!(create_nist_session_id(c), 2);
    new
}

impl BlockedOnCall {
    pub fn start(extra: &[&str], more: impl FnOnce(&Conn)) -> BlockedOnCall {
        let daemon = Daemon::spawn(extra);
        let c = Conn::negotiated(&daemon.sock);
        let mem = sealable_memfd(MEM_SIZE);
        let kick = EventFd::new(EFD_NONBLOCK).unwrap();
        let call = EventFd::new(EFD_NONBLOCK).unwrap();
        raw_ring(&c, &mem, &kick, &call);
        more(&c);
        let sid = create_nist_session(&c);
        call.write(u64::MAX - 1).unwrap();
        clear_nonblock(call.as_raw_fd());
        submit_raw_nist(&mem, &kick, sid, 1);
        until_a_worker_blocks_in(daemon.pid(), libc::SYS_write, || {});
        BlockedOnCall {
            daemon,
            c,
            mem,
            _kick: kick,
            _call: call,
        }
    }
}

/// A TCP socket whose close(2) blocks: connected over loopback to a peer
/// that never reads, its send buffer full, `SO_LINGER` on for an hour
/// (socket(7): close then waits until the queued data is sent or the
/// linger time is over). Returns (the socket, the peer); the peer must stay
/// open, or its RST ends the wait.
pub fn lingering_tcp_socket() -> (std::net::TcpStream, std::net::TcpStream) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let s = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (peer, _) = l.accept().unwrap();
    s.set_nonblocking(true).unwrap();
    let chunk = [0u8; 65536];
    let start = Instant::now();
    loop {
        match (&s).write(&chunk) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // The peer's receive window may still open a little.
                std::thread::sleep(Duration::from_millis(20));
                if (&s).write(&chunk).is_err() {
                    break;
                }
            }
            Err(e) => panic!("filling the TCP send buffer: {e}"),
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "TCP send buffer never filled"
        );
    }
    s.set_nonblocking(false).unwrap();
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 3600,
    };
    // SAFETY: setsockopt with a linger struct of ours on a socket we own.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "SO_LINGER: {}", io::Error::last_os_error());
    (s, peer)
}

/// Asks for a send buffer of `bytes` on `c`'s socket: `SO_SNDBUFFORCE` as
/// root, else `SO_SNDBUF`, which `wmem_max` caps (socket(7)).
pub fn grow_send_buffer(c: &Conn, bytes: libc::c_int) {
    // SAFETY: setsockopt with an int of ours on a socket we own.
    unsafe {
        for opt in [libc::SO_SNDBUFFORCE, libc::SO_SNDBUF] {
            libc::setsockopt(
                c.s.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&bytes as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }
}

/// Sends `bytes` with `sock` attached so that the daemon holds the last
/// reference to it: the message goes behind 1,000 refused CREATEs whose
/// replies are not read yet (the daemon's request pump stops after the
/// first few hundred, its socket buffer to us full), our copy is closed
/// while the message waits unread, then the replies are read and the pump
/// goes on to it.
pub fn hand_over_last_reference(c: &Conn, bytes: &[u8], sock: std::net::TcpStream, extra: usize) {
    const N: usize = 1000;
    grow_send_buffer(c, 16 << 20);
    let refused = Conn::message(CREATE_CRYPTO_SESSION, VERSION_1, &[0u8; 1072]);
    let all: Vec<u8> = refused.iter().copied().cycle().take(refused.len() * N).collect();
    (&c.s).write_all(&all).unwrap();
    let others: Vec<EventFd> = (0..extra).map(|_| EventFd::new(EFD_NONBLOCK).unwrap()).collect();
    let mut fds = vec![sock.as_raw_fd()];
    fds.extend(others.iter().map(|e| e.as_raw_fd()));
    c.send_bytes(bytes, &fds).unwrap();
    // The daemon has not read this message yet: the in-flight copy keeps
    // the socket open, and this close returns at once.
    drop(sock);
    for _ in 0..N {
        let p = c.reply(CREATE_CRYPTO_SESSION);
        assert_eq!(
            i64::from_le_bytes(p[1064..1072].try_into().unwrap()),
            -3,
            "refused CREATE"
        );
    }
}

/// Makes the daemon's close of a lingering TCP socket (attached to a
/// GET_FEATURES with 31 eventfds) block, then sends GET_FEATURES messages
/// with up to 32 copies of an eventfd each, until `total` descriptors
/// (the socket included) went with answered messages or the daemon ends
/// the connection. Returns the socket's peer (keep it open, or the close
/// ends) and how many were answered.
pub fn queue_behind_a_blocked_close(c: &Conn, total: usize) -> (std::net::TcpStream, usize) {
    let (sock, peer) = lingering_tcp_socket();
    hand_over_last_reference(c, &Conn::message(GET_FEATURES, VERSION_1, &[]), sock, 31);
    assert!(matches!(c.recv(), Got::Msg(GET_FEATURES, ..)));
    let ev = EventFd::new(EFD_NONBLOCK).unwrap();
    let mut sent = 32;
    while sent < total {
        let n = (total - sent).min(32);
        if c.send(GET_FEATURES, VERSION_1, &[], &vec![ev.as_raw_fd(); n])
            .is_err()
            || !matches!(c.recv(), Got::Msg(GET_FEATURES, ..))
        {
            break;
        }
        sent += n;
    }
    (peer, sent)
}
