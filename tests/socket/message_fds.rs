// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! File descriptors attached to messages: on messages that take none, many
//! on one message, spread over the bytes of one message, and ones whose
//! close(2) blocks. Only checked descriptors reach the library, every
//! other one is closed on the connection's closer thread, and a frontend
//! that makes those closes block ends at most its own connection
//! (docs/RELIABILITY.md, "Requirements on frontends").

use std::io::Write;
use std::os::fd::AsRawFd;
use std::time::Duration;

use crate::common::*;
use crate::support::*;
use vhost_user_crypto::wire::session::{create_request, SessionAbi};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

/// Descriptors on messages that take none, or that the daemon refuses,
/// are closed by the daemon; the frontend chooses what they are. A TCP
/// socket with `SO_LINGER` and unsent data makes that close(2) block for
/// as long as the frontend likes (here an hour). The daemon must still
/// tear the connection down and serve the next frontend (or, as a last
/// resort, exit with status 3), not hang for good.
#[test]
fn a_lingering_socket_attached_to_a_message_cannot_wedge_the_daemon() {
    let create = create_request(SessionAbi::C, &session(&NIST_KEY, 1));
    // (what, request bytes): a CREATE (answered by the proxy, takes no fd)
    // and a SET_VRING_KICK (refused: not an eventfd).
    // (what, request bytes, more eventfds attached)
    let cases: [(&str, Vec<u8>, usize); 4] = [
        ("CREATE_CRYPTO_SESSION with a socket attached", create.to_vec(), 0),
        (
            "SET_VRING_KICK with a socket instead of an eventfd",
            Conn::message(SET_VRING_KICK, VERSION_1, &0u64.to_le_bytes()),
            0,
        ),
        (
            "GET_FEATURES with a socket and 32 eventfds attached (33 > 32 descriptors)",
            Conn::message(GET_FEATURES, VERSION_1, &[]),
            32,
        ),
        (
            "GET_FEATURES with a socket attached",
            Conn::message(GET_FEATURES, VERSION_1, &[]),
            0,
        ),
    ];
    let mut failures = Vec::new();
    for (what, bytes, extra) in cases {
        let mut daemon = Daemon::spawn(&[]);
        let c = Conn::negotiated(&daemon.sock);
        let (sock, peer) = lingering_tcp_socket();
        hand_over_last_reference(&c, &bytes, sock, extra);
        c.s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let first = match c.recv() {
            Got::Msg(r, f, p) => format!("reply {r} (flags {f:#x}, {} bytes)", p.len()),
            other => format!("{other:?}"),
        };
        drop(c);
        // Not even the last resort (exit status 3): the daemon never
        // closes such a descriptor where it waits for it.
        match served_within(&mut daemon, Duration::from_secs(5)) {
            Ok(t) => eprintln!("{what}: daemon's answer {first}; next frontend served after {t:?}"),
            Err(e) => failures.push(format!("{what} (daemon's answer: {first}), then disconnect: {e}")),
        }
        drop(peer);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Once one descriptor's close blocks on the connection's closer thread,
/// every later descriptor the frontend sends queues behind it, still open
/// in the daemon: nothing bounds how many. A frontend that sends one
/// lingering socket and then a few hundred messages with 32 descriptors
/// each fills the daemon's descriptor table; the daemon can then no longer
/// accept or set up the next frontend (for as long as the linger lasts,
/// here an hour), and is not even ended with status 3. Before the closer
/// thread the pump blocked in that close instead and took nothing more.
#[test]
fn descriptors_queued_behind_a_blocked_close_cannot_exhaust_the_daemon() {
    let mut daemon = Daemon::spawn(&[]);
    let limit = daemon_fd_limit(&daemon);
    let c = Conn::negotiated(&daemon.sock);
    let (sock, peer) = lingering_tcp_socket();
    hand_over_last_reference(&c, &Conn::message(GET_FEATURES, VERSION_1, &[]), sock, 0);
    assert!(
        matches!(c.recv(), Got::Msg(GET_FEATURES, ..)),
        "GET_FEATURES with the socket"
    );
    let before = daemon.snapshot().fds;
    // 32 copies of one eventfd per message (the most the daemon takes on
    // one message), on a message that takes none.
    let ev = EventFd::new(EFD_NONBLOCK).unwrap();
    let fds = vec![ev.as_raw_fd(); 32];
    let mut sent = 0;
    while before + sent + 64 < limit {
        if c.send(GET_FEATURES, VERSION_1, &[], &fds).is_err() {
            break;
        }
        match c.recv() {
            Got::Msg(GET_FEATURES, ..) => sent += 32,
            _ => break,
        }
    }
    // Then one at a time, up to the limit (the daemon's recvmsg then fails).
    let one = [ev.as_raw_fd()];
    for _ in 0..128 {
        if c.send(GET_FEATURES, VERSION_1, &[], &one).is_err() {
            break;
        }
        match c.recv() {
            Got::Msg(GET_FEATURES, ..) => sent += 1,
            _ => break,
        }
    }
    let held = daemon.snapshot().fds;
    eprintln!(
        "daemon descriptors: {before} with the lingering socket, {held} after {sent} more were sent (limit {limit})"
    );
    drop(c);
    // The daemon ends the connection once 256 wait to be closed; its
    // teardown includes closing them, which cannot finish within the hour
    // of linger: the last resort, exit status 3 (10 s without progress),
    // lets a supervisor start it again. Or it is served, if the close
    // ever came.
    let r = served_within(&mut daemon, Duration::from_secs(25));
    drop(peer);
    match r {
        Ok(t) => eprintln!("next frontend served after {t:?}"),
        Err(e) if e.contains("exit status: 3") => eprintln!("{e} (last resort)"),
        Err(e) => panic!(
            "after {sent} descriptors sent behind one blocked close (daemon held {held} of {limit}): {e}\nlog tail: {}",
            daemon.log_tail(1500)
        ),
    }
    assert!(
        held <= before + 256 + 64,
        "descriptors held open behind the blocked close: {before} -> {held} (at most 256 may wait)"
    );
}

/// The pump ends a connection once more than MAX_PENDING_CLOSES (256)
/// frontend descriptors wait for closer threads *daemon-wide*, and the
/// teardown lets the next frontend in once no more than 256 wait. A
/// frontend that leaves exactly 256 waiting behind one blocked close
/// (here: a lingering socket and 253 eventfds on GET_FEATURES, plus its
/// own socket's two copies) is torn down and the next frontend is served,
/// but that next, honest frontend starts at the limit: each descriptor it
/// sends is counted until its own closer thread has closed it, and a
/// message right behind one with a descriptor (QEMU sends SET_VRING_KICK,
/// SET_VRING_CALL and the next ring's SET_VRING_NUM without waiting)
/// finds 257 waiting and the connection is ended. A frontend must harm
/// only its own connection.
#[test]
fn descriptors_left_waiting_by_one_frontend_do_not_end_the_next_honest_one() {
    let mut daemon = Daemon::spawn(&[]);
    let c = Conn::negotiated(&daemon.sock);
    let (peer, sent) = queue_behind_a_blocked_close(&c, 254);
    assert_eq!(sent, 254);
    // Leaving adds the two copies of its socket: 256 wait, not more.
    drop(c);
    served_within(&mut daemon, Duration::from_secs(5)).expect("the next frontend is served");

    // Honest frontends, one after another: QEMU's ring set-up order,
    // KICK and CALL then the next message without waiting for anything.
    let mut ended = Vec::new();
    for i in 0..10 {
        let c = Conn::negotiated(&daemon.sock);
        let (kick, call) = (
            EventFd::new(EFD_NONBLOCK).unwrap(),
            EventFd::new(EFD_NONBLOCK).unwrap(),
        );
        c.send(SET_VRING_NUM, VERSION_1, &vring_state(0, 64), &[])
            .unwrap();
        c.send_kick_and_call(kick.as_raw_fd(), call.as_raw_fd()).unwrap();
        c.send(SET_VRING_BASE, VERSION_1, &vring_state(0, 0), &[])
            .unwrap();
        c.send(GET_FEATURES, VERSION_1, &[], &[]).unwrap();
        match c.recv() {
            Got::Msg(GET_FEATURES, ..) => {}
            other => ended.push(format!("frontend {i}: {other:?}")),
        }
    }
    drop(peer);
    assert!(
        ended.is_empty(),
        "honest frontends ended after another left 256 descriptors waiting behind a blocked close:\n{}\nlog tail: {}",
        ended.join("\n"),
        daemon.log_tail(1500)
    );
}

/// recv_message takes every byte of a message, with every descriptor that
/// came with any of them, before it counts them (more than 32 end the
/// connection): a frontend that sends its message one byte per sendmsg,
/// each with 253 descriptors, fills the daemon's whole descriptor table
/// on the request pump. The recvmsg that finds the table full is
/// truncated (MSG_CTRUNC), and the descriptors of that recvmsg are closed
/// where it runs: vmm-sys-util's recv_with_fds closes those it installed,
/// the kernel drops the others (their final fput runs on the same thread
/// on its way back to user space). With a lingering socket among them
/// whose last reference is in flight, the pump blocks in that close for
/// the whole linger: the connection is never torn down, no later frontend
/// is served, and the daemon does not even exit with status 3.
#[test]
fn descriptors_spread_over_one_message_cannot_make_the_pump_close_one() {
    let mut daemon = Daemon::spawn(&[]);
    let limit = daemon_fd_limit(&daemon);
    let c = Conn::negotiated(&daemon.sock);
    let (sock, peer) = lingering_tcp_socket();
    // Stall the request pump (as hand_over_last_reference does): 1,000
    // refused CREATEs whose replies are not read yet.
    grow_send_buffer(&c, 64 << 20);
    const N: usize = 1000;
    let refused = Conn::message(CREATE_CRYPTO_SESSION, VERSION_1, &[0u8; 1072]);
    let all: Vec<u8> = refused.iter().copied().cycle().take(refused.len() * N).collect();
    (&c.s).write_all(&all).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let free = limit - daemon.snapshot().fds;
    // One GET_FEATURES with a 4096-byte payload; its first bytes one per
    // sendmsg, each with 253 copies of an eventfd, until ~100 slots are
    // left, then one byte with the socket and 252 eventfds.
    let msg = Conn::message(GET_FEATURES, VERSION_1, &[0u8; 4096]);
    let ev = EventFd::new(EFD_NONBLOCK).unwrap();
    let mut at = 0;
    let mut left = free.saturating_sub(100);
    while left > 0 {
        let n = left.min(253);
        let sent =
            c.s.send_with_fds(&[&msg[at..at + 1]], &vec![ev.as_raw_fd(); n])
                .unwrap();
        assert_eq!(sent, 1);
        at += 1;
        left -= n;
    }
    let mut last = vec![sock.as_raw_fd()];
    last.extend(std::iter::repeat_n(ev.as_raw_fd(), 252));
    assert_eq!(c.s.send_with_fds(&[&msg[at..at + 1]], &last).unwrap(), 1);
    at += 1;
    (&c.s).write_all(&msg[at..]).unwrap();
    // The in-flight copy keeps the socket open; this close returns at once.
    drop(sock);
    for _ in 0..N {
        c.reply(CREATE_CRYPTO_SESSION);
    }
    eprintln!("{at} bytes with descriptors; {free} slots were free in the daemon");
    c.s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let first = format!("{:?}", c.recv());
    drop(c);
    let r = served_within(&mut daemon, Duration::from_secs(20));
    drop(peer);
    match r {
        Ok(t) => eprintln!("next frontend served after {t:?}"),
        Err(e) if e.contains("exit status: 3") => eprintln!("{e} (last resort)"),
        Err(e) => panic!(
            "a message whose bytes carried {free}+ descriptors (answer: {first}), then disconnect: {e}\nlog tail: {}",
            daemon.log_tail(1500)
        ),
    }
}
