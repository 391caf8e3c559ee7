// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A connection's life: frontends that leave in the middle of a batch,
//! with a busy ring or a ring of large requests, that half-close or close
//! right after sending, that fill the library's socket; a second frontend
//! waiting; a hundred connections under load and every kind of connection
//! leaving no descriptor, thread or mapping behind; prompt teardowns; and
//! the start-up check for /proc.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::*;
use crate::support::*;
use vhost_crypto_replay::driver_ring::Buf;
use vhost_user_crypto::wire::session::{create_request, SessionAbi};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// Without /proc the daemon cannot tell an eventfd from a pipe (see
/// `eventfd::check_ring_eventfd`): it says so and exits with status
/// 1 at start-up, instead of listening and then dropping every frontend at
/// its first SET_VRING_KICK. Needs a private
/// mount namespace (`unshare -m`, root); skipped, with a note, where that
/// is not allowed.
#[test]
fn without_proc_the_daemon_stops_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("crypto.sock");
    let script = format!(
        // (timeout: a daemon that starts anyway is stopped, status 124.)
        "umount -l /proc && exec timeout 10 {} --socket-path {}",
        env!("CARGO_BIN_EXE_vhost-user-crypto"),
        sock.display()
    );
    let probe = std::process::Command::new("unshare")
        .args(["-m", "--propagation", "private", "true"])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        skipped("unshare -m is not allowed here");
        return;
    }
    let out = std::process::Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("vhost-user-crypto: cannot check the frontend's eventfds")
            && stderr.contains("needs /proc mounted"),
        "{stderr}"
    );
    assert!(!sock.exists(), "it did not bind the socket");
}

/// A second frontend that connects while the first is served waits (the
/// daemon serves one at a time), sees nothing of the first one's state once
/// it is served, and its early requests are answered then.
#[test]
fn a_waiting_frontend_is_served_fresh_after_the_first_leaves() {
    // At most 3 live sessions: the first frontend's would fill a registry
    // carried over to the second.
    let mut daemon = Daemon::spawn(&["--max-sessions", "3"]);
    let mut first = frontend(&daemon.sock, &cfg(SessionAbi::C, 1, 64, 8, 64));
    for want in 1..=3 {
        assert_eq!(first.create_session(&session(&NIST_KEY, 1)).unwrap(), want);
    }
    // The second one sends GET_FEATURES right away.
    let second = Conn::open(&daemon.sock);
    second.send(GET_FEATURES, VERSION_1, &[], &[]).unwrap();
    second
        .s
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    assert!(
        matches!(second.recv(), Got::TimedOut),
        "served while the first frontend is"
    );
    assert_eq!(
        run_one(&mut first, ENCRYPT, 3, &NIST_PT),
        (OK, 65, NIST_CT.to_vec())
    );
    drop(first);
    second.s.set_read_timeout(Some(TIMEOUT)).unwrap();
    assert_ne!(second.reply_u64(GET_FEATURES) & F_PROTOCOL_FEATURES, 0);
    let create = create_request(SessionAbi::C, &session(&NIST_KEY, 1));
    second.send_bytes(&create, &[]).unwrap();
    let p = second.reply(CREATE_CRYPTO_SESSION);
    let id = i64::from_le_bytes(p[1064..1072].try_into().unwrap());
    // Fresh state (not NOSPC), and an id the first frontend never had.
    assert_eq!(id, 4, "the waiting frontend's first session id");
    drop(second);
    daemon.assert_alive("two frontends in a row");
    assert_nist(&daemon.sock, "two frontends in a row");
}

#[test]
fn honest_frontends_are_torn_down_promptly() {
    let mut daemon = Daemon::spawn(&[]);
    let mut worst = Duration::ZERO;
    let mut total = Duration::ZERO;
    let n = 100;
    let base = daemon.idle_snapshot();
    for i in 0..n {
        let mut fe = frontend(&daemon.sock, &cfg(SessionAbi::C, 1, 64, 8, 64));
        let e = fe.create_session(&session(&NIST_KEY, 1)).unwrap();
        assert_eq!(run_one(&mut fe, ENCRYPT, e as u64, &NIST_PT).0, OK);
        if i % 2 == 0 {
            let _ = fe.get_vring_base(0);
        }
        drop(fe);
        let t = served_within(&mut daemon, Duration::from_secs(10)).unwrap();
        worst = worst.max(t);
        total += t;
    }
    let after = daemon.idle_snapshot();
    eprintln!(
        "teardown latency: mean {:?}, worst {:?}; fds {} -> {}, threads {} -> {}, rss {} -> {}",
        total / n,
        worst,
        base.fds,
        after.fds,
        base.threads,
        after.threads,
        base.rss_kib,
        after.rss_kib
    );
    assert!(
        worst < Duration::from_secs(1),
        "an honest frontend's teardown took {worst:?}"
    );
    assert_eq!((after.fds, after.threads), (base.fds, base.threads));
}

/// Honest ends of a connection, 30 times each: a frontend that sends
/// GET_FEATURES and shuts only its sending side still gets the reply, and
/// one that sends 50 messages and closes has them all taken, with no
/// "connection ended" warning. The relay notices a frontend closing
/// (`a_frontend_that_fills_the_library_socket_cannot_wedge_the_daemon`);
/// it must not cut these off with EPIPE.
#[test]
fn a_frontend_that_half_closes_or_closes_after_sending_is_served_in_full() {
    let mut daemon = Daemon::spawn(&[]);
    for i in 0..30 {
        let s = UnixStream::connect(&daemon.sock).unwrap();
        s.set_read_timeout(Some(TIMEOUT)).unwrap();
        (&s).write_all(&Conn::message(GET_FEATURES, VERSION_1, &[]))
            .unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        let mut reply = Vec::new();
        (&s).read_to_end(&mut reply).unwrap();
        assert_eq!(reply.len(), 20, "half-close {i}: the GET_FEATURES reply");
        assert_eq!(reply[..4], GET_FEATURES.to_le_bytes());
    }
    for _ in 0..30 {
        let c = Conn::negotiated(&daemon.sock);
        let m = Conn::message(SET_FEATURES, VERSION_1, &F_PROTOCOL_FEATURES.to_le_bytes());
        (&c.s).write_all(&m.repeat(50)).unwrap();
        drop(c);
    }
    daemon.assert_alive("frontends that half-close or close after sending");
    let log = daemon.log_tail(1 << 20);
    assert_eq!(log.matches("frontend connection ended").count(), 0, "{log}");
}

#[test]
fn disconnect_in_the_middle_of_a_batch() {
    let mut daemon = Daemon::spawn(&[]);
    let mut rng = Rng::new(7);
    let key = rng.bytes(32);
    let base = daemon.idle_snapshot();
    let mut last_sid = 0;
    for (round, reaped_first) in [0usize, 100, 255, 0, 400].into_iter().enumerate() {
        let mut fe = frontend(&daemon.sock, &cfg(SessionAbi::C, 1, 256, 256, 4096));
        let sid = fe.create_session(&session(&key, 1)).unwrap();
        // Each connection gets ids the daemon never gave before.
        assert!(sid > last_sid, "round {round}: session id {sid} after {last_sid}");
        last_sid = sid;
        let jobs = jobs_4k(&mut rng, 512, sid as u64, &key);
        // Verify `reaped_first` completions, keep the queue full up to 512
        // submitted, then drop the frontend with the rest in flight.
        if reaped_first > 0 {
            let v = run_jobs(&mut fe, 0, &jobs[..reaped_first], 256, None);
            assert_eq!(v, reaped_first);
        }
        let rest = &jobs[reaped_first..];
        run_jobs(&mut fe, 0, rest, 256, Some(rest.len().min(256)));
        assert!(
            fe.queues[0].in_flight() > 0,
            "round {round}: nothing left in flight"
        );
        drop(fe);
        let what = format!("round {round}: disconnect with requests in flight");
        daemon.assert_alive(&what);
        assert_nist(&daemon.sock, &what);
    }
    // QEMU's way out: GET_VRING_BASE (stop the ring) with 256 requests in
    // flight, then disconnect. Once the reply is back the backend has
    // stopped: every request before the returned base is completed, none
    // after it is, and the ring is not touched any more.
    for round in 0..5 {
        let mut fe = frontend(&daemon.sock, &cfg(SessionAbi::C, 1, 256, 256, 4096));
        let sid = fe.create_session(&session(&key, 1)).unwrap();
        let jobs = jobs_4k(&mut rng, 256, sid as u64, &key);
        run_jobs(&mut fe, 0, &jobs, 256, Some(256));
        std::thread::sleep(Duration::from_micros(200 * round));
        let base = fe.get_vring_base(0).unwrap();
        assert!(base <= 256, "round {round}: base {base}");
        let mut done = Vec::new();
        while done.len() < base as usize {
            fe.queues[0].reap(&mut done, TIMEOUT).unwrap();
        }
        std::thread::sleep(Duration::from_millis(50));
        if fe.queues[0].in_flight() > 0 {
            let mut late = Vec::new();
            let r = fe.queues[0].reap(&mut late, Duration::from_millis(1));
            assert!(
                r.is_err() && late.is_empty(),
                "round {round}: {} completions after the stop",
                late.len()
            );
        }
        assert_eq!(
            done.len(),
            base as usize,
            "round {round}: completions vs base {base}"
        );
        for u in &done {
            let j = &jobs[usize::from(u.slot)];
            let (st, len, dst) = result(&fe, 0, *u, 4096);
            assert_eq!((st, len), (OK, 4097), "round {round} slot {}", u.slot);
            assert!(
                dst == oracle(true, &j.key, &j.iv, &j.src),
                "round {round} slot {}",
                u.slot
            );
        }
        eprintln!("GET_VRING_BASE round {round}: base {base} of 256");
        drop(fe);
        let what = format!("round {round}: GET_VRING_BASE then disconnect");
        daemon.assert_alive(&what);
        assert_nist(&daemon.sock, &what);
    }
    // Nothing of the dropped connections is left behind.
    let after = daemon.idle_snapshot();
    eprintln!("mid-batch disconnects: {base:?} before, {after:?} after");
    assert!(
        after.fds <= base.fds + 2,
        "fds: {} before, {} after",
        base.fds,
        after.fds
    );
    assert_eq!(
        (after.threads, after.memfd_maps),
        (base.threads, 0),
        "threads, guest mappings"
    );
    // Four queues, all full, dropped at once.
    drop(daemon);
    let mut daemon = Daemon::spawn(&["--queues", "4"]);
    let mut fe = frontend(&daemon.sock, &cfg(SessionAbi::B, 4, 256, 256, 4096));
    let sid = fe.create_session(&session(&key, 1)).unwrap();
    for q in 0..4 {
        let jobs = jobs_4k(&mut rng, 256, sid as u64, &key);
        run_jobs(&mut fe, q, &jobs, 256, Some(256));
    }
    drop(fe);
    daemon.assert_alive("four full queues dropped");
    assert_nist(&daemon.sock, "four full queues dropped");
}

/// The frontend disconnects while its guest keeps ring 0 busy (QEMU gone,
/// or a frontend doing it on purpose; the guest's pages are still shared):
/// the queue worker stops serving the ring at once, the connection is torn
/// down and the next frontend is served, while the old guest still writes
/// its avail index.
#[test]
fn busy_ring_after_disconnect_does_not_hold_up_the_next_frontend() {
    let mut r = BusyRing::start();
    let u0 = r.used_idx();
    assert!(u0 > 0, "the busy guest's requests are served");
    drop(r.conn.take());
    std::thread::sleep(Duration::from_millis(200));
    let u1 = r.used_idx();
    let next = Conn::open(&r.daemon.sock);
    next.send(GET_FEATURES, VERSION_1, &[], &[]).unwrap();
    let got = next.recv();
    std::thread::sleep(Duration::from_millis(100));
    let u2 = r.used_idx();
    r.stop_guest();
    eprintln!("used.idx {u0} while connected, {u1} 200 ms after the disconnect, {u2} later");
    assert!(
        matches!(got, Got::Msg(GET_FEATURES, _, _)),
        "the next frontend is not served while the old guest keeps its ring busy: {got:?}"
    );
    assert_eq!(u2, u1, "the ring is still served after its frontend left");
    drop(next);
    r.finish("busy ring after disconnect");
}

/// An honest frontend leaves while its guest has a ring of 256 large
/// requests queued (64 MiB each, `--max-request-bytes` 64 MiB, no
/// polling). A worker that finished the whole ring before looking at the
/// disconnect would encrypt about 16 GiB here, and the daemon would exit
/// with status 3 after 10 s; it stops after the batch in progress: the
/// next frontend is served within seconds, and the daemon lives.
#[test]
fn a_ring_of_large_requests_does_not_hold_up_the_teardown() {
    use std::os::unix::fs::FileExt;
    let (size, len) = (160u64 << 20, 64u32 << 20);
    let mut daemon = Daemon::spawn(&["--max-request-bytes", "67108864", "--poll-us", "0"]);
    let c = Conn::negotiated(&daemon.sock);
    let mem = sealable_memfd(size);
    let kick = EventFd::new(EFD_NONBLOCK).unwrap();
    let call = EventFd::new(EFD_NONBLOCK).unwrap();
    let table = mem_table(&[(0, size, UADDR, 0)]);
    c.send(SET_MEM_TABLE, VERSION_1 | NEED_REPLY, &table, &[mem.as_raw_fd()])
        .unwrap();
    assert_eq!(c.reply_u64(SET_MEM_TABLE), 0);
    raw_ring_at(&c, 0, RAW_DESC, &kick, &call);
    let sid = create_nist_session(&c);
    // Every avail entry names the same chain: header, IV, 64 MiB src and dst.
    let (src_at, dst_at) = (0x100_0000u64, 0x500_0000u64);
    mem.write_all_at(&hdr(ENCRYPT, sid, len, len).to_bytes(), RAW_HDR)
        .unwrap();
    write_chain(
        &mem,
        RAW_DESC,
        &[
            Buf::readable(RAW_HDR, 72),
            Buf::readable(RAW_IV, 16),
            Buf::readable(src_at, len),
            Buf::writable(dst_at, len),
            Buf::writable(RAW_STATUS, 1),
        ],
    );
    for slot in 0..256u64 {
        mem.write_all_at(&0u16.to_le_bytes(), RAW_AVAIL + 4 + 2 * slot)
            .unwrap();
    }
    mem.write_all_at(&256u16.to_le_bytes(), RAW_AVAIL + 2).unwrap();
    kick.write(1).unwrap();
    let start = Instant::now();
    while ring0_used_u16(&mem, 2) < 2 {
        assert!(start.elapsed() < TIMEOUT, "the first requests did not complete");
        std::thread::sleep(Duration::from_millis(1));
    }
    // A backlog of messages the library takes one per batch (each needs
    // the ring's lock), so that the daemon's proxy is still taking them
    // when the frontend closes: the workers must not go on serving the
    // ring meanwhile.
    let err = Conn::message(SET_VRING_ERR, VERSION_1, &VRING_NOFD_MASK.to_le_bytes());
    (&c.s).write_all(&err.repeat(5000)).unwrap();
    let at_close = ring0_used_u16(&mem, 2);
    drop(c);
    let left = Instant::now();
    daemon.assert_alive("a frontend left with a ring of large requests queued");
    let took = left.elapsed();
    let after = ring0_used_u16(&mem, 2).wrapping_sub(at_close);
    assert!(
        took < Duration::from_secs(5),
        "the next frontend waited {took:?}; {after} requests served after the close"
    );
    // The batch in progress, and perhaps the next: MAX_LANES requests each.
    assert!(
        after <= 16,
        "{after} requests served after the close (in {took:?})"
    );
    assert_nist(
        &daemon.sock,
        "a frontend left with a ring of large requests queued",
    );
}

/// The frontend blocks a worker on its call eventfd ([`BlockedOnCall`]),
/// asks for GET_VRING_BASE (the library's thread then waits for the ring
/// behind the worker and stops reading) and sends until its socket is
/// full, so the daemon's request pump blocks writing to the library; then
/// it leaves.
/// The blocked pump cannot see the end of the connection, so the reply
/// relay also watches for the frontend hanging up and ends the connection;
/// the next frontend is served.
#[test]
fn a_frontend_that_fills_the_library_socket_cannot_wedge_the_daemon() {
    let BlockedOnCall { mut daemon, c, .. } = BlockedOnCall::start(&[], |_| {});
    c.send(GET_VRING_BASE, VERSION_1, &vring_state(0, 0), &[])
        .unwrap();
    c.s.set_nonblocking(true).unwrap();
    let m = Conn::message(SET_FEATURES, VERSION_1, &F_PROTOCOL_FEATURES.to_le_bytes());
    let (mut sent, start) = (0usize, Instant::now());
    // Until the socket stays full for half a second.
    let mut full_since = None;
    while full_since.is_none_or(|t: Instant| t.elapsed() < Duration::from_millis(500)) {
        match (&c.s).write(&m) {
            Ok(n) => {
                assert_eq!(n, m.len());
                sent += 1;
                full_since = None;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                full_since.get_or_insert_with(Instant::now);
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("after {sent} messages: {e}"),
        }
        assert!(start.elapsed() < TIMEOUT, "the socket never filled ({sent} sent)");
    }
    drop(c);
    daemon.assert_alive("a frontend that filled the library's socket");
    assert_nist(&daemon.sock, "a frontend that filled the library's socket");
}

#[test]
fn hundred_connect_disconnect_cycles_under_load() {
    let mut daemon = Daemon::spawn(&["--max-sessions", "16"]);
    let mut rng = Rng::new(42);
    let keys = [rng.bytes(16), rng.bytes(24), rng.bytes(32)];
    let mut first: Option<Snapshot> = None;
    let mut total = 0;
    let mut prev_ids: Vec<i64> = Vec::new();
    for cycle in 0..100 {
        let mut fe = frontend(&daemon.sock, &cfg(SessionAbi::C, 1, 256, 64, 256));
        // The previous connection's sessions are gone: INVSESS, used length 1.
        for &sid in prev_ids.iter().step_by(5) {
            let (st, len, dst) = run_one(&mut fe, ENCRYPT, sid as u64, &NIST_PT);
            assert_eq!((st, len), (INVSESS, 1), "cycle {cycle}: old session {sid}");
            assert_eq!(dst, vec![0xEE; 64], "cycle {cycle}: INVSESS wrote dst");
        }
        // Ids go on from the previous connection's: never reused.
        let mut sids = Vec::new();
        for key in &keys {
            for dir in [1u8, 2] {
                sids.push((
                    fe.create_session(&session(key, dir)).unwrap(),
                    key.clone(),
                    dir == 1,
                ));
            }
        }
        let ids: Vec<i64> = sids.iter().map(|s| s.0).collect();
        let from = prev_ids.last().map_or(1, |&l| l + 1);
        assert_eq!(
            ids,
            (from..from + 6).collect::<Vec<i64>>(),
            "cycle {cycle}: session ids"
        );
        let jobs: Vec<Job> = (0..300)
            .map(|i| {
                let (sid, key, encrypt) = &sids[i % sids.len()];
                let len = 16 * (1 + (rng.next_u64() % 16) as usize);
                Job {
                    sid: *sid as u64,
                    encrypt: *encrypt,
                    key: key.clone(),
                    iv: rng.bytes(16),
                    src: rng.bytes(len),
                }
            })
            .collect();
        if cycle % 3 == 2 {
            // Disconnect mid-batch: 200 verified, 64 more left in flight.
            total += run_jobs(&mut fe, 0, &jobs[..200], 64, None);
            run_jobs(&mut fe, 0, &jobs[200..], 64, Some(64));
        } else {
            total += run_jobs(&mut fe, 0, &jobs, 64, None);
            if cycle % 2 == 0 {
                for &(sid, _, _) in &sids[..3] {
                    fe.close_session(sid as u64).unwrap();
                }
                let (st, len, _) = run_one(&mut fe, ENCRYPT, ids[0] as u64, &NIST_PT);
                assert_eq!(
                    (st, len),
                    (INVSESS, 1),
                    "cycle {cycle}: closed session {}",
                    ids[0]
                );
            }
        }
        if cycle == 0 {
            // The mapping check below can see guest memory: here it is mapped.
            assert!(
                daemon.snapshot().memfd_maps >= 1,
                "guest memory not seen in /proc/PID/maps"
            );
        }
        drop(fe);
        daemon.assert_alive(&format!("cycle {cycle}"));
        if cycle == 0 {
            first = Some(daemon.idle_snapshot());
        }
        prev_ids = ids;
    }
    let first = first.unwrap();
    let last = daemon.idle_snapshot();
    eprintln!("cycles: {total} requests verified; after cycle 1: {first:?}; after cycle 100: {last:?}");
    // Both snapshots are taken in the same state (one idle, freshly
    // accepted connection, the previous one torn down), and after cycle 1
    // everything opened once per process exists already, so the expected
    // difference is 0 (measured: 0). The slack of 2 only tolerates a
    // descriptor some library opens lazily on a rare path; a per-cycle
    // leak (the kick and call eventfds of each connection, say) is 99 × k
    // and far past it.
    assert!(
        last.fds <= first.fds + 2,
        "fd leak: {} after cycle 1, {} after cycle 100",
        first.fds,
        last.fds
    );
    assert_eq!(last.threads, first.threads, "thread count");
    assert_eq!(
        last.memfd_maps, 0,
        "guest memory of closed connections still mapped"
    );
    // RSS: measured +12..+30 KiB over 99 cycles (glibc reuses the arenas
    // of the per-connection threads). 4 MiB is about 40 KiB per cycle:
    // far above that noise, far below a leak of anything per connection
    // (its 2 MiB guest memory, threads' stacks, 6 sessions' key schedules
    // in 3 tables, 300 requests' buffers); leaked mappings are also
    // checked directly above.
    assert!(
        last.rss_kib <= first.rss_kib + 4096,
        "RSS grew from {} KiB to {} KiB",
        first.rss_kib,
        last.rss_kib
    );
    assert_nist(&daemon.sock, "100 cycles");
    daemon.assert_alive("100 cycles");
}

/// Connections of one kind, `n` of them in a row; resource use of the
/// daemon before and after (idle snapshots).
fn per_kind_growth(daemon: &Daemon, n: usize, mut one: impl FnMut(&Path)) -> (Snapshot, Snapshot) {
    let before = daemon.idle_snapshot();
    for _ in 0..n {
        one(&daemon.sock);
    }
    // The last one's teardown.
    let after = daemon.idle_snapshot();
    (before, after)
}

#[test]
fn connection_kinds_leave_no_descriptors_or_threads_behind() {
    let mut daemon = Daemon::spawn(&[]);
    let mut report = Vec::new();
    let n = 60;
    type Kind = (&'static str, Box<dyn FnMut(&Path)>);
    let kinds: Vec<Kind> = vec![
        ("connect+close", Box::new(|s: &Path| drop(Conn::open(s)))),
        ("negotiated", Box::new(|s: &Path| drop(Conn::negotiated(s)))),
        (
            "ring+session, no GET_VRING_BASE",
            Box::new(|s: &Path| drop(ring_with_one_request_served(&Conn::negotiated(s)))),
        ),
        (
            "33 fds on GET_FEATURES",
            Box::new(|s: &Path| {
                let c = Conn::negotiated(s);
                let evs: Vec<EventFd> = (0..33).map(|_| EventFd::new(EFD_NONBLOCK).unwrap()).collect();
                let fds: Vec<RawFd> = evs.iter().map(|e| e.as_raw_fd()).collect();
                let _ = c.send(GET_FEATURES, VERSION_1, &[], &fds);
                let _ = c.recv();
            }),
        ),
        (
            "SET_VRING_ERR",
            Box::new(|s: &Path| {
                let c = Conn::negotiated(s);
                let e = EventFd::new(EFD_NONBLOCK).unwrap();
                c.send(
                    SET_VRING_ERR,
                    VERSION_1 | NEED_REPLY,
                    &0u64.to_le_bytes(),
                    &[e.as_raw_fd()],
                )
                .unwrap();
                let _ = c.recv();
            }),
        ),
        (
            "SET_DEVICE_STATE_FD",
            Box::new(|s: &Path| {
                let c = Conn::negotiated(s);
                let (r, _w) = pipe();
                let mut p = 0u32.to_le_bytes().to_vec();
                p.extend_from_slice(&0u32.to_le_bytes());
                c.send(42, VERSION_1, &p, &[r.as_raw_fd()]).unwrap();
                let _ = c.recv();
            }),
        ),
        (
            "BACKEND_REQ acked + SET_BACKEND_REQ_FD",
            Box::new(|s: &Path| {
                let c = Conn::negotiated(s);
                c.send(
                    SET_PROTOCOL_FEATURES,
                    VERSION_1 | NEED_REPLY,
                    &(PF_CRYPTO_SESSION | PF_REPLY_ACK | 1 << 5).to_le_bytes(),
                    &[],
                )
                .unwrap();
                let _ = c.recv();
                // (BACKEND_REQ was not offered: the daemon has closed the
                // connection by now.)
                let (a, _b) = UnixStream::pair().unwrap();
                let _ = c.send(21, VERSION_1 | NEED_REPLY, &[], &[a.as_raw_fd()]);
                let _ = c.recv();
            }),
        ),
    ];
    for (name, mut one) in kinds {
        let (b, a) = per_kind_growth(&daemon, n, &mut one);
        report.push(format!(
            "{name}: fds {} -> {}, threads {} -> {}, rss {} -> {} KiB, maps {} -> {}",
            b.fds, a.fds, b.threads, a.threads, b.rss_kib, a.rss_kib, b.memfd_maps, a.memfd_maps
        ));
        assert_eq!(
            (a.fds, a.threads, a.memfd_maps),
            (b.fds, b.threads, 0),
            "after {n} x {name}"
        );
        assert!(
            a.rss_kib < b.rss_kib + 2048,
            "RSS after {n} x {name}: {} -> {} KiB",
            b.rss_kib,
            a.rss_kib
        );
    }
    daemon.assert_alive("probes");
    eprintln!("{}", report.join("\n"));
}
