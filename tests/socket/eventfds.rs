// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The kick, call and err eventfds of a ring (docs/RELIABILITY.md,
//! "Requirements on frontends"; docs/PROTOCOL.md §8): descriptors that
//! are not plain eventfds, blocking ones, a full call eventfd, a kick
//! eventfd shared by two rings, read back by the frontend, replaced while
//! in use or at its largest count. No queue worker is parked, spun or
//! ended, and the next frontend is served.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use crate::common::*;
use crate::support::*;
use vhost_user_crypto::eventfd::EVENTFD_COPIES_PER_RING;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// Ring descriptors that are not plain eventfds (vhost-user spec:
/// SET_VRING_KICK/CALL/ERR carry eventfds). vhost-user-backend reads 8
/// bytes from a kick descriptor when its epoll reports it readable, while
/// holding the ring's lock: a pipe holding one byte would block the worker
/// in `read` for good (GET_VRING_BASE never answered; once the frontend
/// left, tearing the connection down would wait for the worker, so no
/// later frontend would be served), and an eventfd in semaphore mode,
/// written 2^32 once, would keep the worker waking up at 100 % CPU. Each
/// kind is refused (an error ack or a disconnect), the daemon stays up,
/// and the next frontend gets NIST F.2.1 right.
#[test]
fn ring_descriptors_that_are_not_plain_eventfds_are_refused() {
    let mut daemon = Daemon::spawn(&[]);
    let (kick_r, kick_w) = pipe();
    (&kick_w).write_all(b"x").unwrap();
    let (call_r, call_w) = pipe();
    let (sock, _peer) = UnixStream::pair().unwrap();
    let semaphore = EventFd::new(libc::EFD_SEMAPHORE).unwrap();
    semaphore.write(1 << 32).unwrap();
    let mut cases: Vec<(&str, u32, RawFd)> = vec![
        (
            "a pipe's read end holding one byte as kick",
            SET_VRING_KICK,
            kick_r.as_raw_fd(),
        ),
        ("a pipe's write end as call", SET_VRING_CALL, call_w.as_raw_fd()),
        ("a pipe's read end as err", SET_VRING_ERR, call_r.as_raw_fd()),
        ("a socket as kick", SET_VRING_KICK, sock.as_raw_fd()),
    ];
    let mem = memfd(4096);
    cases.push(("a memfd as call", SET_VRING_CALL, mem.as_raw_fd()));
    // SAFETY: epoll_create1(2) with no flags; the result is checked.
    let epoll = unsafe { libc::epoll_create1(0) };
    assert!(epoll >= 0, "epoll_create1: {}", io::Error::last_os_error());
    // SAFETY: a fresh descriptor we own.
    let epoll = unsafe { File::from_raw_fd(epoll) };
    cases.push((
        "an epoll descriptor (another anonymous inode) as kick",
        SET_VRING_KICK,
        epoll.as_raw_fd(),
    ));
    let fdinfo = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", semaphore.as_raw_fd())).unwrap();
    if fdinfo.contains("eventfd-semaphore:") {
        cases.push((
            "a semaphore eventfd as kick",
            SET_VRING_KICK,
            semaphore.as_raw_fd(),
        ));
    } else {
        eprintln!("this kernel does not show an eventfd's semaphore mode: that case is not run");
    }
    for (what, req, fd) in cases {
        let c = Conn::negotiated(&daemon.sock);
        c.send(req, VERSION_1 | NEED_REPLY, &0u64.to_le_bytes(), &[fd])
            .unwrap();
        let how = expect_refused(&c, req, what);
        eprintln!("{what}: {how}");
        drop(c);
        daemon.assert_alive(what);
    }
    assert!(
        daemon.log_tail(8000).contains("not an eventfd"),
        "the refusals are logged with their reason"
    );
    assert_nist(&daemon.sock, "ring descriptors that are not plain eventfds");
}

/// Kick and call eventfds are made non-blocking when they are set (the flag
/// lives on the open file, which the frontend shares, so it shows here),
/// and a call eventfd whose counter the frontend filled up (0xffff...fe,
/// the most it holds) neither blocks the worker nor floods the log (a
/// blocking call eventfd would leave the worker stuck in `write` after its
/// first batch). Three requests complete with NIST F.2.1 (watched through
/// `used.idx`, since the call eventfd cannot signal), one warning is
/// logged, and the frontend is still served.
#[test]
fn kick_and_call_eventfds_are_made_non_blocking() {
    let mut daemon = Daemon::spawn(&[]);
    let c = Conn::negotiated(&daemon.sock);
    let mem = sealable_memfd(MEM_SIZE);
    let kick = EventFd::new(0).unwrap();
    let call = EventFd::new(0).unwrap();
    assert_eq!(status_flags(kick.as_raw_fd()) & libc::O_NONBLOCK, 0);
    raw_ring(&c, &mem, &kick, &call);
    for (what, fd) in [("kick", kick.as_raw_fd()), ("call", call.as_raw_fd())] {
        assert_ne!(
            status_flags(fd) & libc::O_NONBLOCK,
            0,
            "{what} eventfd is non-blocking"
        );
    }
    let sid = create_nist_session(&c);
    call.write(u64::MAX - 1).unwrap();
    let log_before = daemon
        .log_tail(1 << 20)
        .matches("signalling the call eventfd failed")
        .count();
    for n in 1..=3u16 {
        submit_raw_nist(&mem, &kick, sid, n);
        let start = Instant::now();
        while ring0_used_u16(&mem, 2) != n {
            assert!(start.elapsed() < TIMEOUT, "request {n} not completed");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_raw_nist_ok(n, raw_nist_result(&mem, n));
    }
    assert_ne!(c.get_features() & F_PROTOCOL_FEATURES, 0, "still served");
    let warnings = daemon
        .log_tail(1 << 20)
        .matches("signalling the call eventfd failed")
        .count();
    assert_eq!(
        (log_before, warnings),
        (0, 1),
        "warnings before and after the three requests"
    );
    drop(c);
    daemon.assert_alive("a call eventfd that cannot be written");
    assert!(
        daemon
            .log_tail(1 << 20)
            .contains("3 used-buffer notifications could not be signalled on this connection"),
        "the failures are counted at the end of the connection:\n{}",
        daemon.log_tail(8000)
    );
    assert_nist(&daemon.sock, "a call eventfd that cannot be written");
}

/// The frontend clears the `O_NONBLOCK` the daemon set on its call eventfd
/// (the flag is on the open file they share) and fills the counter: the
/// worker's used-buffer notification blocks in `write`. A teardown that
/// joined that worker would wait for ever and serve no later frontend; the
/// daemon empties the call eventfd through its own copy at teardown, so
/// the worker goes on and the next frontend gets NIST F.2.1 right. Also
/// when the frontend then gives the ring new call eventfds (the library
/// applies them only once the worker lets go), up to one fewer than the
/// copies kept per ring.
#[test]
fn a_frontend_clearing_o_nonblock_on_its_call_eventfd_cannot_wedge_the_daemon() {
    for replacements in [0, 1, EVENTFD_COPIES_PER_RING - 1] {
        let what = format!("a worker blocked writing the call eventfd, {replacements} new ones since");
        let BlockedOnCall {
            mut daemon, c, mem, ..
        } = BlockedOnCall::start(&[], |_| {});
        // The request was completed before the notification blocked.
        assert_raw_nist_ok(1, raw_nist_result(&mem, 1));
        let _new = replace_call_eventfd(&c, replacements);
        drop(c);
        daemon.assert_alive(&what);
        assert_nist(&daemon.sock, &what);
        assert!(
            daemon
                .log_tail(8000)
                .contains("waking any queue worker blocked on an eventfd"),
            "{what}: {}",
            daemon.log_tail(8000)
        );
    }
}

/// The last resort: a frontend that blocks a worker on its call eventfd
/// (as above) and then gives the ring more new call eventfds than the
/// daemon keeps copies of ([`EVENTFD_COPIES_PER_RING`]) leaves a worker the
/// daemon cannot wake. It then exits with status 3 once the workers have
/// used no CPU for 10 s, saying why, rather than serving nobody for good.
/// Also when the frontend, gone, keeps kicking a second ring's worker
/// through the kick eventfd it still holds, so that some worker always
/// uses a little CPU and the 10 s without CPU never come: the cap on the
/// whole teardown ends it then, a fraction of a second later with the
/// default request size.
#[test]
fn a_worker_that_cannot_be_woken_ends_the_daemon_with_status_3() {
    for kicks_after_leaving in [false, true] {
        let (kick1, call1) = (
            EventFd::new(EFD_NONBLOCK).unwrap(),
            EventFd::new(EFD_NONBLOCK).unwrap(),
        );
        let BlockedOnCall { mut daemon, c, .. } =
            BlockedOnCall::start(&["--queues", "2"], |c| raw_ring_at(c, 1, 0x84000, &kick1, &call1));
        let _new = replace_call_eventfd(&c, EVENTFD_COPIES_PER_RING);
        drop(c);
        let start = Instant::now();
        let status = loop {
            if let Some(status) = daemon.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "kicks after leaving {kicks_after_leaving}: still running after 20 s\n{}",
                daemon.log_tail(4000)
            );
            if kicks_after_leaving {
                let _ = kick1.write(1);
                std::thread::sleep(Duration::from_millis(2));
            } else {
                std::thread::sleep(Duration::from_millis(50));
            }
        };
        let log = daemon.log_tail(4000);
        assert_eq!(status.code(), Some(3), "{log}");
        assert!(
            start.elapsed() >= Duration::from_secs(10),
            "{:?}",
            start.elapsed()
        );
        assert!(log.contains("one stays blocked"), "{log}");
    }
}

/// The frontend gives two rings one kick eventfd and clears its
/// `O_NONBLOCK` (the flag is on the open file it shares with the daemon):
/// both workers wake for a kick and one takes the count. A plain `read`
/// by the other would wait for the next kick, its ring unserved meanwhile
/// (and a teardown waiting for that worker would serve no other
/// frontend). The workers take the count with `preadv2(RWF_NOWAIT)`: over
/// 5 s of kicks no worker waits in `read`, both rings are served with the
/// flag still cleared, and the next frontend is served, also after the
/// frontend gives both rings new kick eventfds.
#[test]
fn a_frontend_clearing_o_nonblock_on_a_shared_kick_eventfd_parks_no_worker() {
    for replace in [false, true] {
        let what = format!("a shared kick eventfd without O_NONBLOCK, replaced: {replace}");
        let mut daemon = Daemon::spawn(&["--queues", "2"]);
        let c = Conn::negotiated(&daemon.sock);
        let mem = sealable_memfd(MEM_SIZE);
        let kick = EventFd::new(EFD_NONBLOCK).unwrap();
        let call = EventFd::new(EFD_NONBLOCK).unwrap();
        let call1 = EventFd::new(EFD_NONBLOCK).unwrap();
        raw_ring(&c, &mem, &kick, &call);
        // Ring 1 at 640 KiB, with ring 0's kick eventfd.
        raw_ring_at(&c, 1, 0xA0000, &kick, &call1);
        let sid = create_nist_session(&c);
        clear_nonblock(kick.as_raw_fd());
        if !replace {
            no_worker_waits_in(daemon.pid(), libc::SYS_read, TIMEOUT, || kick.write(1).unwrap());
        }
        both_rings_served_on_a_shared_kick(&mem, &kick, sid, &what);
        let new = [
            EventFd::new(EFD_NONBLOCK).unwrap(),
            EventFd::new(EFD_NONBLOCK).unwrap(),
        ];
        if replace {
            for (ring, e) in new.iter().enumerate() {
                c.send(
                    SET_VRING_KICK,
                    VERSION_1,
                    &(ring as u64).to_le_bytes(),
                    &[e.as_raw_fd()],
                )
                .unwrap();
            }
            // All taken by the proxy (see the status-3 test).
            assert!(create_nist_session_id(&c) >= 1);
        }
        drop(c);
        daemon.assert_alive(&what);
        assert_nist(&daemon.sock, &what);
    }
}

/// SET_VRING_KICK gives a running ring a new kick eventfd (no stop
/// before), and the frontend then writes the old one. vhost-user-backend
/// 0.24 leaves the old eventfd in the worker's epoll (other copies of it
/// are open) but reads the new, empty one: `EAGAIN` ends the queue's
/// worker thread for the rest of the connection, and requests kicked on
/// the new eventfd are never served, even after a full ring restart
/// (docs/PROTOCOL.md §8). The workers watch the frontend's kick eventfds
/// themselves and the library gets eventfds of the daemon's own. Ring 0
/// of one queue and ring 1 of two.
#[test]
fn a_kick_eventfd_written_after_its_replacement_stops_no_worker() {
    for (queues, index) in [(1u32, 0u32), (2, 1)] {
        let mut daemon = Daemon::spawn(&["--queues", &queues.to_string()]);
        let c = Conn::negotiated(&daemon.sock);
        let (mem, kick, _call, sid) = ring_with_one_request_served_at(&c, index);
        let kick2 = EventFd::new(EFD_NONBLOCK).unwrap();
        c.send(
            SET_VRING_KICK,
            VERSION_1 | NEED_REPLY,
            &u64::from(index).to_le_bytes(),
            &[kick2.as_raw_fd()],
        )
        .unwrap();
        assert_eq!(c.reply_u64(SET_VRING_KICK), 0, "SET_VRING_KICK");
        kick.write(1).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(
            vring_workers(daemon.pid()),
            queues as usize,
            "ring {index}: worker threads after a write to the replaced kick eventfd"
        );
        // The replaced eventfd is out of the worker's epoll: its count,
        // which nobody takes now, does not wake the worker again and
        // again (90 % of a CPU if it stayed in).
        let busy = cpu_busy(daemon.pid(), Duration::from_secs(1));
        assert!(
            busy < 0.5,
            "ring {index}: the daemon used {:.0} % of a CPU after a write to the replaced kick eventfd",
            busy * 100.0
        );
        assert!(
            served_at(&mem, &kick2, RAW_DESC, RAW_HDR, sid, 2),
            "ring {index}: request 2, kicked on the new eventfd, not served"
        );
        assert_raw_nist_ok(2, raw_nist_result(&mem, 2));
        drop(c);
        daemon.assert_alive("a replaced kick eventfd written");
    }
}

/// Two rings share one non-blocking kick eventfd: each kick wakes both
/// workers, and the one that reads second gets nothing; the library's read
/// would fail with `EAGAIN` and end that worker's thread (within a few
/// hundred kicks, docs/PROTOCOL.md §8). After
/// 1,000 kicks both workers must be there and serve their rings. (Which
/// worker sees a given kick is a race the frontend made by sharing the
/// eventfd: a worker whose epoll looks only after the other took the
/// count does not wake for it. So the requests are kicked until served.)
#[test]
fn two_rings_sharing_a_kick_eventfd_keep_their_workers() {
    let mut daemon = Daemon::spawn(&["--queues", "2"]);
    let c = Conn::negotiated(&daemon.sock);
    let mem = memfd(MEM_SIZE);
    let kick = EventFd::new(EFD_NONBLOCK).unwrap();
    let (call0, call1) = (
        EventFd::new(EFD_NONBLOCK).unwrap(),
        EventFd::new(EFD_NONBLOCK).unwrap(),
    );
    raw_ring(&c, &mem, &kick, &call0);
    raw_ring_at(&c, 1, 0xA0000, &kick, &call1);
    let sid = create_nist_session(&c);
    for _ in 0..1000 {
        kick.write(1).unwrap();
        std::thread::sleep(Duration::from_micros(100));
    }
    assert_eq!(
        vring_workers(daemon.pid()),
        2,
        "worker threads after 1,000 shared kicks"
    );
    both_rings_served_on_a_shared_kick(&mem, &kick, sid, "a shared kick eventfd");
    drop(c);
    daemon.assert_alive("a shared kick eventfd");
}

/// One NIST F.2.1 request on ring 0 (at [`RAW_DESC`]) and one on ring 1
/// (at 0xA0000, buffers from 0x30000), both rings kicked through the one
/// `kick` eventfd they share, until both are served (within [`TIMEOUT`]);
/// checks both results. Which worker sees a kick on a shared eventfd is a
/// race of the frontend's making (a worker whose epoll looks after the
/// other took the count does not wake), hence a kick every 10 ms.
fn both_rings_served_on_a_shared_kick(mem: &File, kick: &EventFd, sid: u64, what: &str) {
    use std::os::unix::fs::FileExt;
    submit_nist_at(mem, kick, RAW_DESC, RAW_HDR, sid, 1);
    submit_nist_at(mem, kick, 0xA0000, 0x30000, sid, 1);
    let start = Instant::now();
    while used_idx_at(mem, RAW_DESC) != 1 || used_idx_at(mem, 0xA0000) != 1 {
        assert!(
            start.elapsed() < TIMEOUT,
            "{what}: rings not served: used.idx {} and {}",
            used_idx_at(mem, RAW_DESC),
            used_idx_at(mem, 0xA0000)
        );
        kick.write(1).unwrap();
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_raw_nist_ok(1, raw_nist_result(mem, 1));
    let mut dst = vec![0u8; 64];
    mem.read_exact_at(&mut dst, 0x33000).unwrap();
    assert_eq!(dst, NIST_CT.to_vec(), "{what}: ring 1: F.2.1 ciphertext");
}

/// The frontend reads its own kick eventfd right after each write (it
/// holds a copy): a worker woken for the kick finds it empty, which the
/// library's read would answer with `EAGAIN`, ending the thread (after
/// about 700 pairs). The ring must still be served after 5,000 such pairs.
#[test]
fn a_frontend_taking_back_its_kicks_keeps_the_worker() {
    let mut daemon = Daemon::spawn(&[]);
    let c = Conn::negotiated(&daemon.sock);
    let (mem, kick, _call, sid) = ring_with_one_request_served(&c);
    for i in 0..5000u32 {
        kick.write(1).unwrap();
        for _ in 0..(i % 50) * 20 {
            std::hint::spin_loop();
        }
        let _ = kick.read();
    }
    assert_eq!(
        vring_workers(daemon.pid()),
        1,
        "worker threads after 5,000 kicks taken back"
    );
    assert!(
        served_at(&mem, &kick, RAW_DESC, RAW_HDR, sid, 2),
        "request 2 not served"
    );
    assert_raw_nist_ok(2, raw_nist_result(&mem, 2));
    drop(c);
    daemon.assert_alive("kicks taken back");
}

/// Takes eventfd `efd`'s count to `u64::MAX`, which `write(2)` cannot (it
/// stops at `u64::MAX - 1`): that write, then one Linux AIO read whose
/// completion signals the eventfd (`IOCB_FLAG_RESFD`; the kernel's
/// `eventfd_signal` may reach `u64::MAX`). Such an eventfd polls as IN and
/// ERR. False where AIO is not available.
fn saturate_eventfd(efd: &EventFd) -> bool {
    /// `struct iocb` (linux/aio_abi.h, little-endian).
    #[repr(C)]
    #[derive(Default)]
    struct Iocb {
        aio_data: u64,
        aio_key: u32,
        aio_rw_flags: i32,
        aio_lio_opcode: u16,
        aio_reqprio: i16,
        aio_fildes: u32,
        aio_buf: u64,
        aio_nbytes: u64,
        aio_offset: i64,
        aio_reserved2: u64,
        aio_flags: u32,
        aio_resfd: u32,
    }
    const IOCB_CMD_PREAD: u16 = 0;
    const IOCB_FLAG_RESFD: u32 = 1;
    if efd.write(u64::MAX - 1).is_err() {
        return false;
    }
    let file = memfd(4096);
    let mut buf = [0u8; 16];
    let mut ctx: libc::c_ulong = 0;
    // SAFETY: io_setup(2) writes the context id into `ctx`.
    if unsafe { libc::syscall(libc::SYS_io_setup, 1, &mut ctx) } != 0 {
        return false;
    }
    let mut cb = Iocb {
        aio_lio_opcode: IOCB_CMD_PREAD,
        aio_fildes: file.as_raw_fd() as u32,
        aio_buf: buf.as_mut_ptr() as u64,
        aio_nbytes: buf.len() as u64,
        aio_flags: IOCB_FLAG_RESFD,
        aio_resfd: efd.as_raw_fd() as u32,
        ..Default::default()
    };
    let mut cbs = [&mut cb as *mut Iocb];
    let mut events = [0u64; 4 * 4];
    // SAFETY: io_submit(2) of one iocb whose buffer and descriptors outlive
    // the request (it is waited for with io_getevents(2) below, into room
    // for four 32-byte io_events), then io_destroy(2) of our context.
    let done = unsafe {
        libc::syscall(libc::SYS_io_submit, ctx, 1, cbs.as_mut_ptr()) == 1
            && libc::syscall(
                libc::SYS_io_getevents,
                ctx,
                1,
                1,
                events.as_mut_ptr(),
                std::ptr::null_mut::<libc::timespec>(),
            ) == 1
    };
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_io_destroy, ctx) };
    let mut p = libc::pollfd {
        fd: efd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll(2) on one pollfd of ours, without waiting.
    done && unsafe { libc::poll(&mut p, 1, 0) } == 1 && p.revents & libc::POLLERR != 0
}

/// A running ring gets a kick eventfd whose count the frontend took to
/// `u64::MAX` ([`saturate_eventfd`]): the worker's epoll reports it as IN
/// and ERR. A kick watch that gave up on any event set but IN before
/// reading the kick would see the event come back at once for ever: a core
/// at 100 % and 40 MB of warnings a second. The count is read first: the
/// worker settles, one warning at most, and the next request kicked on
/// that eventfd is served.
#[test]
fn a_kick_eventfd_at_its_largest_count_is_taken_not_spun_on() {
    let mut daemon = Daemon::spawn(&[]);
    let c = Conn::negotiated(&daemon.sock);
    let (mem, _kick, call, sid) = ring_with_one_request_served(&c);
    let kick2 = EventFd::new(EFD_NONBLOCK).unwrap();
    if !saturate_eventfd(&kick2) {
        skipped("Linux AIO is not available to take an eventfd to its largest count");
        return;
    }
    let log_before = std::fs::metadata(daemon.log()).unwrap().len();
    c.send(
        SET_VRING_KICK,
        VERSION_1 | NEED_REPLY,
        &0u64.to_le_bytes(),
        &[kick2.as_raw_fd()],
    )
    .unwrap();
    assert_eq!(c.reply_u64(SET_VRING_KICK), 0, "SET_VRING_KICK");
    std::thread::sleep(Duration::from_millis(100));
    let busy = cpu_busy(daemon.pid(), Duration::from_secs(1));
    let grew = std::fs::metadata(daemon.log()).unwrap().len() - log_before;
    assert!(
        busy < 0.5,
        "the daemon used {:.0} % of a CPU after the kick",
        busy * 100.0
    );
    assert!(grew < 4096, "the log grew by {grew} bytes after the kick");
    let _ = call.read();
    let (id, len, status, dst) = raw_nist_request(&mem, &kick2, &call, sid, 2);
    assert_raw_nist_ok(2, (id, len, status, dst));
    drop(c);
    daemon.assert_alive("a kick eventfd at its largest count");
}
