// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Session messages over the socket (docs/PROTOCOL.md §2, §3): floods and
//! churn of CREATE and CLOSE (H05), key lengths at and around the valid
//! ones in every layout, payloads of no known size, session ids across
//! connections, and sessions that come and go while more queues than CPUs
//! are busy.

use std::io::{self, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use crate::common::daemon::spawn_daemon;
use crate::common::*;
use crate::support::*;
use vhost_crypto_replay::driver_ring::{DriverMemory, DriverRing};
use vhost_crypto_replay::frontend::{CryptoFrontend, DescMode};
use vhost_user_crypto::wire::session::{close_request, create_request, SessionAbi, SymSessionInfo};

/// CREATE in each layout with the AES key lengths at and around the
/// valid ones, the session table full, then CLOSE and CREATE again, and
/// the same id closed twice (acked under REPLY_ACK: 0 closed, 1 unknown).
#[test]
fn session_boundaries_in_each_layout_over_the_socket() {
    let mut daemon = Daemon::spawn(&["--max-sessions", "4"]);
    for abi in [SessionAbi::A, SessionAbi::B, SessionAbi::C] {
        let c = Conn::negotiated(&daemon.sock);
        let id_of = |info: &SymSessionInfo| -> i64 {
            c.send_bytes(&create_request(abi, info), &[]).unwrap();
            let p = c.reply(CREATE_CRYPTO_SESSION);
            assert_eq!(p.len(), abi.size(), "{abi:?}: reply size");
            let off = if abi == SessionAbi::C { 1064 } else { 0 };
            i64::from_le_bytes(p[off..off + 8].try_into().unwrap())
        };
        for len in [0usize, 1, 15, 17, 23, 25, 31, 33, 63, 64, 65, 4096] {
            let id = id_of(&session(&vec![7u8; len], 1));
            assert_eq!(id, ID_ERR, "{abi:?}: key of {len} bytes");
        }
        let mut ids = Vec::new();
        for len in [16usize, 24, 32, 16] {
            ids.push(id_of(&session(&vec![7u8; len], 1)));
        }
        // Ids go on from the previous layout's connection (never reused).
        let from = ids[0];
        assert!(from >= 1, "{abi:?}: first id {from}");
        assert_eq!(
            ids,
            [from, from + 1, from + 2, from + 3],
            "{abi:?}: ids of valid sessions"
        );
        assert_eq!(id_of(&session(&[7; 16], 2)), ID_NOSPC, "{abi:?}: table full");
        let close = |id: u64| -> u64 {
            let mut m = close_request(id).to_vec();
            m[4..8].copy_from_slice(&(VERSION_1 | NEED_REPLY).to_le_bytes());
            c.send_bytes(&m, &[]).unwrap();
            c.reply_u64(27)
        };
        let second = (from + 1) as u64;
        assert_eq!(close(second), 0, "{abi:?}: CLOSE of a live id");
        assert_eq!(close(second), 1, "{abi:?}: the same CLOSE again");
        assert_eq!(close(u64::MAX), 1, "{abi:?}: CLOSE of an id never given");
        assert_eq!(
            id_of(&session(&[7; 32], 2)),
            from + 4,
            "{abi:?}: CREATE after a CLOSE"
        );
        assert_eq!(id_of(&session(&[7; 16], 2)), ID_NOSPC, "{abi:?}: full again");
        drop(c);
        daemon.assert_alive(&format!("{abi:?} session boundaries"));
    }
    assert_nist(&daemon.sock, "session boundaries");
}

/// A CREATE whose payload matches no layout gets a same-size reply with a
/// negative id, and the connection goes on.
#[test]
fn odd_create_payload_gets_negative_reply_without_disconnect() {
    let daemon = spawn_daemon(&[]);
    let mut fe = CryptoFrontend::connect(&daemon.sock, &config(SessionAbi::C, DescMode::Indirect)).unwrap();
    let mut msg = vec![26, 0, 0, 0, 1, 0, 0, 0, 100, 0, 0, 0];
    msg.extend_from_slice(&[0x41; 100]);
    fe.send_raw(&msg).unwrap();
    let reply = fe.recv_raw_reply().unwrap();
    assert_eq!(&reply[..12], &[26, 0, 0, 0, 5, 0, 0, 0, 100, 0, 0, 0]);
    let id = i64::from_le_bytes(reply[12..20].try_into().unwrap());
    assert!(id < 0, "odd payload got id {id}");
    let ok = fe.create_session(&nist_session(1)).unwrap();
    assert!(ok >= 1);
    let (st, len, dst) = run_one(&mut fe, ENCRYPT, ok as u64, &NIST_PT);
    assert_eq!((st, len, dst), (OK, 65, NIST_CT.to_vec()));
}

#[test]
fn session_ids_go_on_across_connections_and_bad_creates_do_not_disconnect() {
    let daemon = spawn_daemon(&["--max-sessions", "2"]);
    // Refused CREATEs use no id; a second connection's ids follow the
    // first's (never reused in the daemon, see `sessions::SessionIds`).
    for first in [1i64, 3] {
        let mut fe =
            CryptoFrontend::connect(&daemon.sock, &config(SessionAbi::C, DescMode::Indirect)).unwrap();
        let mut bad = nist_session(1);
        bad.key_len = 17;
        assert!(fe.create_session(&bad).unwrap() < 0);
        assert_eq!(fe.create_session(&nist_session(1)).unwrap(), first);
        assert_eq!(fe.create_session(&nist_session(2)).unwrap(), first + 1);
        assert!(
            fe.create_session(&nist_session(2)).unwrap() < 0,
            "past --max-sessions"
        );
        let (st, len, dst) = run_one(&mut fe, ENCRYPT, first as u64, &NIST_PT);
        assert_eq!((st, len, dst), (OK, 65, NIST_CT.to_vec()));
    }
}

/// A guest keeps the session ids a connection gave it; after its frontend
/// reconnects, a request naming one must not run under a session the new
/// connection created (with ids restarting at 1 per connection it ran
/// under the new session's key and completed OK).
#[test]
fn a_previous_connections_session_id_is_not_given_again() {
    let daemon = Daemon::spawn(&[]);
    let mut fe = frontend(&daemon.sock, &cfg(SessionAbi::C, 1, 64, 8, 64));
    let old = fe.create_session(&session(&NIST_KEY, 1)).unwrap();
    assert_eq!(
        run_one(&mut fe, ENCRYPT, old as u64, &NIST_PT),
        (OK, 65, NIST_CT.to_vec())
    );
    drop(fe);
    let mut fe = frontend(&daemon.sock, &cfg(SessionAbi::C, 1, 64, 8, 64));
    let new = fe.create_session(&session(&[0x5a; 16], 1)).unwrap();
    assert_ne!(new, old, "the new connection's first session id");
    let (st, len, dst) = run_one(&mut fe, ENCRYPT, old as u64, &NIST_PT);
    assert_eq!((st, len), (INVSESS, 1), "the previous connection's session {old}");
    assert_eq!(dst, vec![0xEE; 64], "INVSESS wrote dst");
    // The new session works (its ciphertext differs from F.2.1's key's).
    let (st, len, dst) = run_one(&mut fe, ENCRYPT, new as u64, &NIST_PT);
    assert_eq!((st, len), (OK, 65));
    assert_ne!(dst, NIST_CT.to_vec());
}

/// Sends `msgs` from a writer thread on a clone of `s` while this thread
/// reads one CREATE reply (layout C) per message; returns the ids.
fn pipelined_creates(s: &UnixStream, msgs: Vec<u8>, count: usize) -> Vec<i64> {
    let w = s.try_clone().unwrap();
    let writer = std::thread::spawn(move || (&w).write_all(&msgs));
    let mut r = BufReader::with_capacity(1 << 16, s.try_clone().unwrap());
    let mut ids = Vec::with_capacity(count);
    let mut reply = vec![0u8; 12 + 1072];
    for i in 0..count {
        r.read_exact(&mut reply)
            .unwrap_or_else(|e| panic!("CREATE reply {i}: {e}"));
        assert_eq!(
            &reply[..12],
            &Conn::message(CREATE_CRYPTO_SESSION, REPLY | VERSION_1, &[0; 1072])[..12]
        );
        ids.push(i64::from_le_bytes(reply[12 + 1064..].try_into().unwrap()));
    }
    writer.join().unwrap().unwrap();
    ids
}

#[test]
fn session_flood() {
    const N: usize = 100_000;
    let mut daemon = Daemon::spawn(&["--max-sessions", "64"]);
    let s = UnixStream::connect(&daemon.sock).unwrap();
    s.set_read_timeout(Some(TIMEOUT)).unwrap();
    s.set_write_timeout(Some(TIMEOUT)).unwrap();
    let raw = s.try_clone().unwrap();
    let mut fe = CryptoFrontend::from_stream(s, &cfg(SessionAbi::C, 1, 64, 8, 64)).unwrap();
    // Warm up the data path, then measure.
    let warm = fe.create_session(&session(&NIST_KEY, 1)).unwrap();
    assert_eq!(warm, 1);
    assert_eq!(run_one(&mut fe, ENCRYPT, 1, &NIST_PT), (OK, 65, NIST_CT.to_vec()));
    fe.close_session(1).unwrap();
    let before = daemon.snapshot();
    let log_before = daemon.log_len();
    let t = Instant::now();

    // 100,000 CREATEs with a 17-byte key: all -ERR, no disconnect.
    let mut bad = session(&NIST_KEY, 1);
    bad.key_len = 17;
    let one = create_request(SessionAbi::C, &bad);
    let ids = pipelined_creates(&raw, one.repeat(N), N);
    assert!(ids.iter().all(|&id| id == ID_ERR), "17-byte key: {:?}", &ids[..4]);
    let t_bad = t.elapsed();

    // 100,000 valid CREATEs past --max-sessions 64: ids 2..=65 (1 was
    // used and closed), then -NOSPC.
    let mut msgs = Vec::with_capacity(N * 1084);
    for i in 0..N {
        let dir = if i % 2 == 0 { 1 } else { 2 };
        msgs.extend_from_slice(&create_request(SessionAbi::C, &session(&NIST_KEY, dir)));
    }
    let ids = pipelined_creates(&raw, msgs, N);
    let expect: Vec<i64> = (2..=65).collect();
    assert_eq!(&ids[..64], &expect[..], "the first 64 sessions");
    assert!(
        ids[64..].iter().all(|&id| id == ID_NOSPC),
        "past the limit: {:?}",
        &ids[64..68]
    );
    let t_valid = t.elapsed();

    // 100,000 CLOSEs of ids never created (and 0, u64::MAX): no reply, ever.
    let mut msgs = Vec::with_capacity((N + 2) * 20);
    for id in (66..66 + N as u64 - 2).chain([0, u64::MAX, 1]) {
        msgs.extend_from_slice(&close_request(id));
    }
    (&raw).write_all(&msgs).unwrap();
    // Barrier: GET_FEATURES; its reply must be the very next bytes.
    (&raw)
        .write_all(&Conn::message(GET_FEATURES, VERSION_1, &[]))
        .unwrap();
    let mut reply = [0u8; 20];
    (&raw).read_exact(&mut reply).unwrap();
    assert_eq!(
        &reply[..12],
        &Conn::message(GET_FEATURES, REPLY | VERSION_1, &[0; 8])[..12],
        "a CLOSE was answered"
    );
    raw.set_nonblocking(true).unwrap();
    let mut extra = [0u8; 64];
    match (&raw).read(&mut extra) {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
        other => panic!("bytes after the barrier reply: {other:?}"),
    }
    raw.set_nonblocking(false).unwrap();
    let t_close = t.elapsed();

    let after = daemon.snapshot();
    let log_bytes = daemon.log_len() - log_before;
    eprintln!(
        "session flood: 17-byte keys {t_bad:?}, valid {:?}, closes {:?}; RSS {} -> {} KiB; \
         fds {} -> {}; {log_bytes} bytes of log",
        t_valid - t_bad,
        t_close - t_valid,
        before.rss_kib,
        after.rss_kib,
        before.fds,
        after.fds
    );
    // Measured +100..+130 KiB. The flood may cost at most the 64 live
    // sessions (a few KiB each in 1 table) and fixed buffers: 4 MiB is far
    // above that and far below anything kept per message (300,000 messages
    // at even 16 bytes each would be 4.6 MiB).
    assert!(
        after.rss_kib <= before.rss_kib + 4096,
        "RSS grew from {} KiB to {} KiB",
        before.rss_kib,
        after.rss_kib
    );
    assert_eq!(after.fds, before.fds, "fds during the flood");
    // The guest can repeat refused CREATEs at will: the log must not grow
    // per message (one warning line per connection is about 100 bytes; a
    // line per refusal would be 10 MB here).
    assert!(log_bytes < 64 << 10, "{log_bytes} bytes of log for the flood");

    // Requests still work: the 64 live sessions (2 = encrypt, 3 = decrypt,
    // …), 66.. and the closed 1 are unknown.
    assert_eq!(run_one(&mut fe, ENCRYPT, 2, &NIST_PT), (OK, 65, NIST_CT.to_vec()));
    assert_eq!(
        run_one(&mut fe, DECRYPT, 65, &NIST_CT),
        (OK, 65, NIST_PT.to_vec())
    );
    for sid in [1u64, 66, 100_000] {
        let (st, len, _) = run_one(&mut fe, ENCRYPT, sid, &NIST_PT);
        assert_eq!((st, len), (INVSESS, 1), "session {sid}");
    }
    // Closing a live one frees a slot: the next CREATE gets 66.
    fe.close_session(2).unwrap();
    assert_eq!(fe.create_session(&session(&NIST_KEY, 1)).unwrap(), 66);
    drop(fe);
    drop(raw);
    daemon.assert_alive("the session flood");
    assert_nist(&daemon.sock, "the session flood");
}

/// Sessions created and closed over and over with no request in between,
/// on a four-queue daemon (QEMU only ever starts data queue 0): whatever a
/// queue keeps per session must go away with the session, not pile up until
/// the queue next runs. Then sessions come and go while every queue is busy.
#[test]
fn session_churn_without_requests_stays_bounded() {
    const N: usize = 50_000;
    let mut daemon = Daemon::spawn(&["--queues", "4", "--max-sessions", "64"]);
    let s = UnixStream::connect(&daemon.sock).unwrap();
    s.set_read_timeout(Some(TIMEOUT)).unwrap();
    s.set_write_timeout(Some(TIMEOUT)).unwrap();
    let raw = s.try_clone().unwrap();
    let mut fe = CryptoFrontend::from_stream(s, &cfg(SessionAbi::C, 4, 256, 64, 256)).unwrap();
    let key = NIST_KEY.to_vec();
    assert_eq!(fe.create_session(&session(&key, 1)).unwrap(), 1);
    assert_eq!(run_one(&mut fe, ENCRYPT, 1, &NIST_PT), (OK, 65, NIST_CT.to_vec()));
    let before = daemon.snapshot();

    // CREATE (id 2 + i, known in advance) and CLOSE of that id, pipelined.
    let mut msgs = Vec::with_capacity(N * (1084 + 20));
    for i in 0..N {
        msgs.extend_from_slice(&create_request(SessionAbi::C, &session(&key, 1 + (i % 2) as u8)));
        msgs.extend_from_slice(&close_request(2 + i as u64));
    }
    let t = Instant::now();
    let ids = pipelined_creates(&raw, msgs, N);
    assert!(
        ids.iter().enumerate().all(|(i, &id)| id == 2 + i as i64),
        "ids of create/close pairs: {:?}",
        &ids[..4]
    );
    (&raw)
        .write_all(&Conn::message(GET_FEATURES, VERSION_1, &[]))
        .unwrap();
    let mut reply = [0u8; 20];
    (&raw).read_exact(&mut reply).unwrap();
    assert_eq!(reply[..4], GET_FEATURES.to_le_bytes());
    let after = daemon.snapshot();
    eprintln!(
        "session churn: {N} create/close pairs in {:?}; RSS {} -> {} KiB",
        t.elapsed(),
        before.rss_kib,
        after.rss_kib
    );
    // Each session holds an expanded AES key per queue (hundreds of bytes):
    // 50,000 of them kept on 4 queues would be tens of MiB.
    assert!(
        after.rss_kib <= before.rss_kib + 4096,
        "RSS grew from {} KiB to {} KiB with no session live",
        before.rss_kib,
        after.rss_kib
    );
    // Closed sessions are gone on every queue; a new one works on every queue.
    let next = fe.create_session(&session(&key, 1)).unwrap();
    assert_eq!(next, 2 + N as i64);
    for q in 0..4 {
        for (sid, want) in [(2u64, INVSESS), (1 + N as u64, INVSESS), (next as u64, OK)] {
            let slot = put_request(&mut fe, q, ENCRYPT, sid, &NIST_IV, &NIST_PT);
            fe.queues[q].publish_and_kick().unwrap();
            let mut done = Vec::new();
            fe.queues[q].reap(&mut done, TIMEOUT).unwrap();
            assert_eq!(done[0].slot, slot);
            let (st, _, dst) = result(&fe, q, done[0], 64);
            assert_eq!(st, want, "queue {q} session {sid}");
            if want == OK {
                assert_eq!(dst, NIST_CT.to_vec(), "queue {q}");
            }
        }
    }

    // Sessions come and go while all four queues have requests in flight.
    let mut rng = Rng::new(3);
    let mut jobs: Vec<Vec<Job>> = (0..4)
        .map(|_| {
            (0..64)
                .map(|_| Job {
                    sid: next as u64,
                    encrypt: true,
                    key: key.clone(),
                    iv: rng.bytes(16),
                    src: rng.bytes(256),
                })
                .collect()
        })
        .collect();
    for round in 0..20 {
        let mut slots = Vec::new();
        for (q, js) in jobs.iter().enumerate() {
            let s: Vec<u16> = js
                .iter()
                .map(|j| put_request(&mut fe, q, ENCRYPT, j.sid, &j.iv, &j.src))
                .collect();
            fe.queues[q].publish_and_kick().unwrap();
            slots.push(s);
        }
        let id = fe.create_session(&session(&key, 2)).unwrap();
        assert!(id > next, "round {round}: id {id}");
        fe.close_session(id as u64).unwrap();
        for (q, js) in jobs.iter().enumerate() {
            let mut done = Vec::new();
            while done.len() < js.len() {
                fe.queues[q].reap(&mut done, TIMEOUT).unwrap();
            }
            for u in done {
                let i = slots[q].iter().position(|&s| s == u.slot).unwrap();
                let j = &js[i];
                let (st, len, dst) = result(&fe, q, u, 256);
                assert_eq!((st, len), (OK, 257), "round {round} queue {q} job {i}");
                assert!(
                    dst == oracle(true, &j.key, &j.iv, &j.src),
                    "round {round} queue {q} job {i}"
                );
            }
        }
        for js in &mut jobs {
            for j in js.iter_mut() {
                j.iv = rng.bytes(16);
            }
        }
    }
    drop(fe);
    drop(raw);
    daemon.assert_alive("the session churn");
    assert_nist(&daemon.sock, "the session churn");
}

/// More busy queues than CPUs: a CREATE or CLOSE that waited for each
/// queue's session table in turn, each queue letting go of it only at its
/// next lock gap, would wait long with so many workers sharing two CPUs
/// (with 1 MiB requests about 1 s at 16 queues and 6–7 s at 32). The
/// registry posts the change to every table, and a table that a batch
/// holds is updated by its worker when it takes it for its next batch: a
/// CREATE waits for no batch, a CLOSE for the busy queues' current batches
/// at once (a tenth of a second or two here). A request made available on
/// each ring right after the CREATE reply finds the session.
#[test]
fn sessions_come_and_go_quickly_while_more_queues_than_cpus_are_busy() {
    use std::os::unix::fs::FileExt;
    const QUEUES: u32 = 32;
    const BOUND: Duration = Duration::from_millis(1500);
    // (32 requests ahead: enough to keep every worker busy between the
    // guest's top-ups, so that the sequential registry took seconds, and
    // few enough to drain within about a second at the end.)
    let mut r = BusyRing::start_queues(&[], 1 << 20, QUEUES, 32);
    let until = Instant::now() + TIMEOUT;
    let first = r.used_idx();
    while r.used_idx() == first && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_ne!(r.used_idx(), first, "the guest's requests are served");
    // A CLOSE waits for the busy queues' current batches (a session of
    // its own, so that the CREATE below is still to be applied by the
    // queues' workers).
    let closed = create_nist_session(r.conn());
    let mut m = close_request(closed).to_vec();
    m[4..8].copy_from_slice(&(VERSION_1 | NEED_REPLY).to_le_bytes());
    let t = Instant::now();
    r.conn().send_bytes(&m, &[]).unwrap();
    assert_eq!(r.conn().reply_u64(CLOSE_CRYPTO_SESSION), 0, "CLOSE of a live id");
    let close = t.elapsed();
    let t = Instant::now();
    let sid = create_nist_session(r.conn());
    let create = t.elapsed();
    // Each ring gets one more request, naming the new session (made
    // available after the reply, as a guest would): an indirect table at
    // head 8, its buffers in ring q's page at 0x20000 + q * 0x1000.
    r.stop_guest();
    let mut ends = Vec::new();
    for q in 0..QUEUES {
        let (ring, page) = (RAW_DESC + u64::from(q) * 0x3000, 0x20000 + u64::from(q) * 0x1000);
        let table = page + 0x800;
        let bufs = put_nist_buffers(&r.mem, sid, page, 0x100);
        let (dst, status) = (bufs[3].addr, bufs[4].addr);
        let (m, split) = (FileMem(&r.mem), raw_split_ring(ring));
        let n = m.load_u16_acquire(split.avail_idx());
        let mut driver = DriverRing::new(split, n);
        driver.write_indirect(&m, 8, table, &bufs);
        driver.push(&m, 8);
        driver.publish(&m);
        r.kick(q);
        ends.push((ring, n.wrapping_add(1), dst, status));
    }
    // (The rings' last 1 MiB requests drain first: about a second alone,
    // longer beside other tests at the daemon's nice value.)
    let until = Instant::now() + 6 * TIMEOUT;
    for (q, &(ring, end, dst, status)) in ends.iter().enumerate() {
        while used_idx_at(&r.mem, ring) != end && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(
            used_idx_at(&r.mem, ring),
            end,
            "ring {q}: the request after the CREATE is served"
        );
        let (mut st, mut out) = ([0u8; 1], [0u8; 64]);
        r.mem.read_exact_at(&mut st, status).unwrap();
        r.mem.read_exact_at(&mut out, dst).unwrap();
        assert_eq!(
            (st[0], out.to_vec()),
            (OK, NIST_CT.to_vec()),
            "ring {q}: the new session's request"
        );
    }
    eprintln!("{QUEUES} busy queues: CREATE answered after {create:?}, CLOSE after {close:?}");
    assert!(create < BOUND, "CREATE answered only after {create:?}");
    assert!(close < BOUND, "CLOSE answered only after {close:?}");
    r.finish("sessions under many busy queues");
}
