// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Data rings over the socket: ring fields no split ring has (H16), rings
//! without addresses or whose SET_VRING_ADDR failed half way, rings
//! stopped and started again the way QEMU does it, rings whose memory
//! leaves the table and comes back, kicks left suppressed across a
//! restart, and H10 logged by a filtered worker (docs/PROTOCOL.md §7, §8).

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::time::{Duration, Instant};

use crate::common::daemon::{self, spawn_daemon};
use crate::common::*;
use crate::support::*;
use vhost_crypto_replay::frontend::{CryptoFrontend, DescMode};
use vhost_user_crypto::wire::session::SessionAbi;
use vhost_user_crypto::wire::virtio_crypto::OpDataReq;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// H16: ring fields from the frontend are validated: SET_VRING_NUM 0, 3
/// and 65535 and SET_VRING_BASE for ring 0x10001 get an error or a clean
/// disconnect, never a crash; the next frontend is served normally.
#[test]
fn h16_bad_ring_messages_then_a_new_frontend_works() {
    use std::io::{Read, Write};
    let daemon = spawn_daemon(&[]);
    // (request, index, num)
    for (req, index, num) in [
        (SET_VRING_NUM, 0u32, 0u32),
        (SET_VRING_NUM, 0, 3),
        (SET_VRING_NUM, 0, 65535),
        (SET_VRING_BASE, 0x10001, 0),
        (SET_VRING_NUM, 7, 256),
    ] {
        let mut s = std::os::unix::net::UnixStream::connect(&daemon.sock).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut msg = Vec::new();
        let mut put = |req: u32, flags: u32, payload: &[u8]| msg.extend(Conn::message(req, flags, payload));
        // SET_FEATURES(PROTOCOL_FEATURES), SET_PROTOCOL_FEATURES(REPLY_ACK |
        // CRYPTO_SESSION), SET_OWNER, then the bad message with NEED_REPLY.
        put(SET_FEATURES, VERSION_1, &F_PROTOCOL_FEATURES.to_le_bytes());
        put(
            SET_PROTOCOL_FEATURES,
            VERSION_1,
            &(PF_REPLY_ACK | PF_CRYPTO_SESSION).to_le_bytes(),
        );
        put(SET_OWNER, VERSION_1, &[]);
        put(req, VERSION_1 | NEED_REPLY, &vring_state(index, num));
        s.write_all(&msg).unwrap();
        // Either a REPLY_ACK carrying an error (non-zero), or EOF.
        let mut reply = [0u8; 20];
        match s.read(&mut reply) {
            Ok(0) => {}
            Ok(n) => {
                assert_eq!(n, 20, "short reply");
                assert_eq!(&reply[..4], &req.to_le_bytes());
                let v = u64::from_le_bytes(reply[12..20].try_into().unwrap());
                assert_ne!(v, 0, "request {req} index {index} num {num} was accepted");
            }
            Err(e) => panic!("request {req} index {index} num {num}: no reply and no disconnect: {e}"),
        }
    }
    // The daemon is alive and serves the next frontend with fresh state.
    nist_roundtrip(&daemon.sock, SessionAbi::B, DescMode::Indirect);
}

/// A frontend that starts a ring (SET_VRING_KICK, SET_VRING_CALL) without
/// ever sending SET_VRING_ADDR: vhost-user-backend leaves the ring's three
/// addresses at 0 and marks it ready (docs/PROTOCOL.md §8), and serving it
/// would read an avail ring and write a used ring at guest address 0 that
/// the frontend never named. Such a ring is not served until its
/// addresses come: guest memory below 12 KiB stays as the guest left
/// it (an avail index of 1 at guest address 2, every other byte 0x5A),
/// and once the frontend sends SET_VRING_ADDR and kicks, a NIST request
/// is served at the ring those addresses name.
#[test]
fn a_ring_started_without_addresses_is_not_served_at_guest_address_0() {
    use std::os::unix::fs::FileExt;
    let mut daemon = Daemon::spawn(&[]);
    let c = Conn::negotiated(&daemon.sock);
    let mem = sealable_memfd(MEM_SIZE);
    let kick = EventFd::new(EFD_NONBLOCK).unwrap();
    let call = EventFd::new(EFD_NONBLOCK).unwrap();
    let mut low = vec![0x5Au8; 0x3000];
    low[2..4].copy_from_slice(&1u16.to_le_bytes());
    mem.write_all_at(&low, 0).unwrap();
    set_mem_table(&c, &mem, &[(0, MEM_SIZE, UADDR, 0)]);
    start_ring(&c, 0, None, &kick, &call);
    let sid = create_nist_session(&c);
    for _ in 0..20 {
        kick.write(1).unwrap();
        std::thread::sleep(Duration::from_millis(10));
    }
    daemon.until_logged(
        "has no SET_VRING_ADDR addresses",
        TIMEOUT,
        "the ring without addresses",
    );
    assert_eq!(
        daemon
            .log_tail(1 << 20)
            .matches("has no SET_VRING_ADDR addresses")
            .count(),
        1,
        "logged once per connection"
    );
    assert_unchanged_from_0(&mem, &low, "started without addresses");
    let addr = vring_addr(
        0,
        UADDR + RAW_DESC,
        UADDR + RAW_DESC + 0x2000,
        UADDR + RAW_DESC + 0x1000,
    );
    c.send(SET_VRING_ADDR, VERSION_1 | NEED_REPLY, &addr, &[])
        .unwrap();
    assert_eq!(c.reply_u64(SET_VRING_ADDR), 0, "SET_VRING_ADDR");
    assert_raw_nist_ok(1, raw_nist_request(&mem, &kick, &call, sid, 1));
    drop(c);
    daemon.assert_alive("a ring started without addresses");
}

/// Checks that guest memory from address 0 still holds `was` (where the
/// frontend named no ring); names the first 16 bytes that changed.
#[track_caller]
fn assert_unchanged_from_0(mem: &File, was: &[u8], what: &str) {
    use std::os::unix::fs::FileExt;
    let mut now = vec![0u8; was.len()];
    mem.read_exact_at(&mut now, 0).unwrap();
    let changed: Vec<usize> = (0..now.len()).filter(|&i| now[i] != was[i]).collect();
    assert!(
        changed.is_empty(),
        "{what}: {} bytes written below {:#x}, where the frontend named no ring (at {:?})",
        changed.len(),
        was.len(),
        &changed[..changed.len().min(16)]
    );
}

/// A SET_VRING_ADDR that vhost-user-backend refuses half way: the used
/// ring's frontend address translates to guest address 0x82002 (the
/// second memory region's frontend address is 2 bytes off its guest
/// address), which is not 4-byte aligned, so the library sets the
/// descriptor table and the avail ring, leaves the used ring at 0 and ends
/// the connection. The ring was started (SET_VRING_KICK) before, and the
/// guest kicks all along with a request in its avail ring: until the
/// teardown, a worker serving it would use a used ring at guest address 0
/// (in about half of the tries). Ten tries, each on a connection of its
/// own: guest memory below 12 KiB (0x5A) must stay as it is, and the next
/// frontend is served.
#[test]
fn a_ring_whose_set_vring_addr_failed_half_way_is_not_served_at_guest_address_0() {
    use std::os::unix::fs::FileExt;
    use std::sync::atomic::{AtomicBool, Ordering};
    let mut daemon = Daemon::spawn(&[]);
    for round in 0..10 {
        let c = Conn::negotiated(&daemon.sock);
        let mem = sealable_memfd(MEM_SIZE);
        let kick = EventFd::new(EFD_NONBLOCK).unwrap();
        let call = EventFd::new(EFD_NONBLOCK).unwrap();
        let low = vec![0x5Au8; 0x3000];
        mem.write_all_at(&low, 0).unwrap();
        // Descriptor table at 0x40000, avail ring at 0x41000 with one
        // NIST request (session 1, which does not exist: INVSESS).
        write_chain(&mem, 0x40000, &put_nist_buffers(&mem, 1, RAW_HDR, 0x1000));
        mem.write_all_at(&0u16.to_le_bytes(), 0x41000 + 4).unwrap();
        mem.write_all_at(&1u16.to_le_bytes(), 0x41000 + 2).unwrap();
        let half = MEM_SIZE / 2;
        let table = mem_table(&[(0, half, UADDR, 0), (half, half, UADDR + half + 2, half)]);
        let fds = [mem.as_raw_fd(), mem.as_raw_fd()];
        c.send(SET_MEM_TABLE, VERSION_1 | NEED_REPLY, &table, &fds)
            .unwrap();
        assert_eq!(c.reply_u64(SET_MEM_TABLE), 0, "SET_MEM_TABLE");
        start_ring(&c, 0, None, &kick, &call);
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    let _ = kick.write(1);
                    std::thread::sleep(Duration::from_micros(100));
                }
            });
            std::thread::sleep(Duration::from_millis(20));
            // The used ring's frontend address is 4-byte aligned (the
            // vhost crate checks that); its guest address, 0x82002, is not.
            let addr = vring_addr(0, UADDR + 0x40000, UADDR + 0x82004, UADDR + 0x41000);
            let _ = c.send(SET_VRING_ADDR, VERSION_1, &addr, &[]);
            std::thread::sleep(Duration::from_millis(100));
            stop.store(true, Ordering::Relaxed);
        });
        drop(c);
        assert_unchanged_from_0(&mem, &low, &format!("try {round}"));
    }
    daemon.assert_alive("SET_VRING_ADDRs refused half way");
    assert_nist(&daemon.sock, "SET_VRING_ADDRs refused half way");
}

/// A ring stopped (GET_VRING_BASE) and started again the way QEMU does it
/// on `stop` then `cont` (NUM, BASE, ADDR, KICK, then CALL, the kick
/// eventfd already signalled for a request the guest queued meanwhile):
/// the request is not served before the ring has its new call eventfd,
/// and once it has, it completes (NIST F.2.1) with a used-buffer
/// notification. A ring kept enabled across the stop would complete the
/// request at KICK with no call eventfd to signal, and the guest would
/// wait for it for ever.
#[test]
fn a_ring_started_again_waits_for_its_call_eventfd() {
    restart_with_a_queued_request(false);
}

/// As above with the new call eventfd sent before the kick eventfd (the
/// order of QEMU's guest-notifier set-up before `vhost_dev_start`): the
/// ring is enabled again at KICK and the queued request completes (NIST
/// F.2.1) with a notification on the new call eventfd.
#[test]
fn a_ring_started_again_call_first_is_served_at_its_kick() {
    restart_with_a_queued_request(true);
}

/// Serves request 1 on ring 0, stops the ring, queues request 2 (its new
/// kick eventfd signalled, as QEMU's new host notifier starts) and sets
/// the ring up again: NUM, BASE, ADDR, KICK, then CALL, or CALL first.
/// Request 2 must not be served before the new call eventfd is set, and
/// must then complete with a notification on it.
fn restart_with_a_queued_request(call_first: bool) {
    use std::os::unix::fs::FileExt;
    let daemon = Daemon::spawn(&[]);
    let c = Conn::negotiated(&daemon.sock);
    let (mem, _kick, _call, sid) = ring_with_one_request_served(&c);
    c.send(GET_VRING_BASE, VERSION_1, &vring_state(0, 0), &[])
        .unwrap();
    assert_eq!(c.reply(GET_VRING_BASE), vring_state(0, 1), "GET_VRING_BASE");
    let kick2 = EventFd::new(EFD_NONBLOCK).unwrap();
    let call2 = EventFd::new(EFD_NONBLOCK).unwrap();
    submit_raw_nist(&mem, &kick2, sid, 2);
    let send = |req: u32, payload: &[u8], fds: &[RawFd]| {
        c.send(req, VERSION_1 | NEED_REPLY, payload, fds).unwrap();
        assert_eq!(c.reply_u64(req), 0, "request {req}");
    };
    let fd_message = 0u64.to_le_bytes();
    if call_first {
        send(SET_VRING_CALL, &fd_message, &[call2.as_raw_fd()]);
    }
    send(SET_VRING_NUM, &vring_state(0, 256), &[]);
    send(SET_VRING_BASE, &vring_state(0, 1), &[]);
    let addr = vring_addr(
        0,
        UADDR + RAW_DESC,
        UADDR + RAW_DESC + 0x2000,
        UADDR + RAW_DESC + 0x1000,
    );
    send(SET_VRING_ADDR, &addr, &[]);
    send(SET_VRING_KICK, &fd_message, &[kick2.as_raw_fd()]);
    if !call_first {
        std::thread::sleep(Duration::from_millis(200));
        let mut b = [0u8; 2];
        mem.read_exact_at(&mut b, RAW_USED + 2).unwrap();
        assert_eq!(
            u16::from_le_bytes(b),
            1,
            "used.idx: served before the ring had its call eventfd"
        );
        send(SET_VRING_CALL, &fd_message, &[call2.as_raw_fd()]);
    }
    await_call(&call2, "after the restart");
    assert_raw_nist_ok(2, raw_nist_result(&mem, 2));
}

/// A ring restarted while its suppression fields still say "no kicks" (as
/// a polling worker leaves them when the ring is stopped under it, e.g. a
/// VM paused under load, or a backend restarted): a request the guest made
/// available without kicking is still taken once the ring is set up again,
/// and the daemon's first batch resets the fields. (vhost-user-backend 0.24
/// runs a ring's handler once when it registers its kick fd, see
/// `VringEpollHandler::register_event`; this test keeps that true across
/// upgrades.)
#[test]
fn ring_restarted_with_kicks_suppressed_is_not_stalled() {
    let d = spawn_daemon(&[]);
    let mut fe = CryptoFrontend::connect(&d.sock, &config(SessionAbi::C, DescMode::Indirect)).unwrap();
    let e = fe.create_session(&nist_session(1)).unwrap() as u64;
    let (st, _, dst) = run_one(&mut fe, ENCRYPT, e, &NIST_PT);
    assert_eq!((st, dst), (OK, NIST_CT.to_vec()));
    let base = fe.get_vring_base(0).unwrap();
    assert_eq!(base, 1);
    // What a worker that was polling leaves behind: VRING_USED_F_NO_NOTIFY
    // and avail_event half the index space ahead.
    let q = &mut fe.queues[0];
    let ring = q.ring_addrs();
    q.mem().write(ring.used, &1u16.to_le_bytes());
    q.mem().write(
        ring.used + 4 + 8 * u64::from(ring.size),
        &(1u16 + 0x8000).to_le_bytes(),
    );
    // The guest makes a request available; the backend asked for no kick.
    let slot = q.next_slot().unwrap();
    let l = q.layout(slot);
    let hdr = OpDataReq {
        opcode: ENCRYPT,
        algo: 0,
        session_id: e,
        op_type: 1,
        iv_len: 16,
        src_data_len: 64,
        dst_data_len: 64,
    };
    q.mem().write(l.hdr, &hdr.to_bytes());
    q.mem().write(l.iv, &NIST_IV);
    q.mem().write(l.src, &NIST_PT);
    q.mem().write(l.status, &[0xFF]);
    q.submit(slot, 16, 64);
    q.publish_and_kick().unwrap();
    // QEMU restarts the ring at the index it was stopped at.
    fe.restart_ring(0, base as u16).unwrap();
    let q = &mut fe.queues[0];
    let mut done = Vec::new();
    q.reap(&mut done, Duration::from_secs(5))
        .expect("request taken after the restart");
    assert_eq!((done.len(), done[0].len), (1, 65));
    let mut out = vec![0; 64];
    q.mem().read(l.dst, &mut out);
    assert_eq!((q.mem().read_u8(l.status), out), (OK, NIST_CT.to_vec()));
    // The worker's first batch reset the suppression fields (it is no
    // longer polling a few ms later).
    std::thread::sleep(Duration::from_millis(20));
    let mut f = [0u8; 2];
    q.mem().read(ring.used, &mut f);
    assert_eq!(u16::from_le_bytes(f), 0, "used flags");
    q.mem().read(ring.used + 4 + 8 * u64::from(ring.size), &mut f);
    assert_eq!(u16::from_le_bytes(f), 2, "avail_event");
    // And kicks work again.
    let (st, _, dst) = run_one(&mut fe, ENCRYPT, e, &NIST_PT);
    assert_eq!((st, dst), (OK, NIST_CT.to_vec()));
}

/// A memory table that leaves ring 0's memory out (only the first 256
/// KiB; the ring lies at 512 KiB), a request queued and kicked meanwhile,
/// then a table that maps the ring again: the request must be served once
/// that table is in place, without another kick (the guest kicked once
/// and waits; a worker that had kicks suppressed while polling could not
/// even turn them back on in unmapped memory), so a table change wakes
/// the worker.
#[test]
fn a_ring_whose_memory_comes_back_is_served_without_another_kick() {
    memory_comes_back_without_a_kick(1, 0);
}

/// As above for ring 1 of a daemon with two data queues (ring 0 not set
/// up): each queue's worker thread is woken for its own ring, not only
/// ring 0's.
#[test]
fn a_second_ring_whose_memory_comes_back_is_served_without_another_kick() {
    memory_comes_back_without_a_kick(2, 1);
}

/// The two tests above: ring `index` of a daemon with `queues` data
/// queues, set up at [`RAW_DESC`], serves request 1; a memory table
/// without the ring; request 2 queued and kicked, not served; the full
/// table again; request 2 must complete (NIST F.2.1) with a notification.
fn memory_comes_back_without_a_kick(queues: u32, index: u32) {
    let daemon = Daemon::spawn(&["--queues", &queues.to_string()]);
    let c = Conn::negotiated(&daemon.sock);
    let (mem, kick, call, sid) = ring_with_one_request_served_at(&c, index);
    set_mem_table(&c, &mem, &[(0, RAW_DESC / 2, UADDR, 0)]);
    submit_raw_nist(&mem, &kick, sid, 2);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        used_idx_at(&mem, RAW_DESC),
        1,
        "ring {index}: used.idx: served while the ring was unmapped"
    );
    let _ = call.read();
    set_mem_table(&c, &mem, &[(0, MEM_SIZE, UADDR, 0)]);
    await_call(
        &call,
        &format!("on ring {index} after the ring's memory came back"),
    );
    assert_raw_nist_ok(2, raw_nist_result(&mem, 2));
}

/// H10 against the daemon binary, with its log in colour and not: the
/// guest moves the avail index 1,000 past the last one on a 256-entry
/// ring and kicks. The queue worker stops the ring and logs "data queue
/// stopped" from its own thread, which runs under the seccomp filter. A
/// logger that asked for each coloured line whether stderr is a terminal
/// would make an `ioctl` the filter does not allow, and the filter would
/// kill the whole daemon (SIGSYS) instead of stopping one ring; the logger
/// decides colour once at start-up. For stderr a file (plain,
/// `RUST_LOG_STYLE=always`, `CLICOLOR_FORCE=1`) and a terminal
/// (`TERM=xterm-256color`): the line is logged once, the daemon lives, the
/// connection still answers, and the next frontend gets NIST F.2.1 right
/// (docs/RELIABILITY.md H10: stop that queue, log once, other connections
/// unaffected).
#[test]
fn h10_logged_by_a_filtered_worker_in_colour_does_not_kill_the_daemon() {
    use std::os::unix::fs::FileExt;
    use std::sync::{Arc, Mutex};
    type Captured = Arc<Mutex<Vec<u8>>>;
    // A pseudo-terminal whose other side is read into a buffer.
    let terminal = || -> (File, Captured) {
        let (mut master, mut slave) = (-1, -1);
        // SAFETY: openpty(3) fills two ints; no name, termios or window size.
        let rc = unsafe {
            libc::openpty(
                &mut master,
                &mut slave,
                std::ptr::null_mut(),
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        assert_eq!(rc, 0, "openpty: {}", io::Error::last_os_error());
        // SAFETY: two fresh descriptors we own.
        let (mut m, s) = unsafe { (File::from_raw_fd(master), File::from_raw_fd(slave)) };
        let out = Captured::default();
        let sink = out.clone();
        std::thread::spawn(move || {
            let mut b = [0u8; 4096];
            while let Ok(n @ 1..) = m.read(&mut b) {
                sink.lock().unwrap().extend_from_slice(&b[..n]);
            }
        });
        (s, out)
    };
    /// What is tried, the daemon's extra environment, stderr on a
    /// terminal, colour expected.
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], bool, bool);
    let cases: [Case; 5] = [
        ("stderr a file", &[], false, false),
        (
            "RUST_LOG_STYLE=always",
            &[("RUST_LOG_STYLE", "always")],
            false,
            true,
        ),
        ("CLICOLOR_FORCE=1", &[("CLICOLOR_FORCE", "1")], false, true),
        ("stderr a terminal", &[("TERM", "xterm-256color")], true, true),
        (
            "stderr a terminal, CLICOLOR=0",
            &[("TERM", "xterm-256color"), ("CLICOLOR", "0")],
            true,
            false,
        ),
    ];
    for (what, env, on_terminal, colour) in cases {
        let (stderr, log): (File, Box<dyn Fn() -> String>) = if on_terminal {
            let (s, out) = terminal();
            (
                s,
                Box::new(move || String::from_utf8_lossy(&out.lock().unwrap()).into_owned()),
            )
        } else {
            // (The daemon shares the file's offset: read from 0, by position.)
            let f = tempfile::tempfile().unwrap();
            let r = f.try_clone().unwrap();
            (
                f,
                Box::new(move || {
                    let mut b = vec![0u8; r.metadata().unwrap().len() as usize];
                    r.read_exact_at(&mut b, 0).unwrap();
                    String::from_utf8_lossy(&b).into_owned()
                }),
            )
        };
        let mut seen = String::new();
        let mut d = daemon::spawn_daemon_env(&[], "warn", env, stderr.into());
        let c = Conn::negotiated(&d.sock);
        let mem = sealable_memfd(MEM_SIZE);
        let kick = EventFd::new(EFD_NONBLOCK).unwrap();
        let call = EventFd::new(EFD_NONBLOCK).unwrap();
        raw_ring(&c, &mem, &kick, &call);
        mem.write_all_at(&1000u16.to_le_bytes(), RAW_AVAIL + 2).unwrap();
        kick.write(1).unwrap();
        let start = Instant::now();
        while !seen.contains("data queue stopped") {
            if let Some(status) = d.child.try_wait().unwrap() {
                panic!(
                    "{what}: the daemon died after H10: {status:?}; its log:\n{}",
                    log()
                );
            }
            assert!(
                start.elapsed() < TIMEOUT,
                "{what}: H10 not logged; the log:\n{seen}"
            );
            std::thread::sleep(Duration::from_millis(5));
            seen = log();
        }
        // A kick more, and the connection still answers.
        kick.write(1).unwrap();
        assert_ne!(c.get_features() & F_PROTOCOL_FEATURES, 0, "{what}: still served");
        std::thread::sleep(Duration::from_millis(100));
        let seen = log();
        assert_eq!(
            seen.matches("data queue stopped").count(),
            1,
            "{what}: logged once:\n{seen}"
        );
        assert_eq!(
            seen.contains("\x1b["),
            colour,
            "{what}: in colour or not:\n{seen}"
        );
        assert!(d.child.try_wait().unwrap().is_none(), "{what}: daemon died");
        drop(c);
        assert_nist(&d.sock, what);
        d.stop();
    }
}
