// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The stats socket (`--stats-socket`, docs/OPERATING.md): after requests
//! of known statuses (NIST SP 800-38A F.2.1 / F.2.2, unknown sessions,
//! a bad length, an unknown opcode, a chain without a status byte) on two
//! queues, the counters equal what was sent, by status, per queue and in
//! total; the session counters equal the CREATEs and CLOSEs sent; nothing
//! is reset by a reconnect; clients that never read block nothing; the
//! socket file is mode 0600, a stale one is replaced, one in use or a
//! file that is not a socket is refused. Expected values are counted from
//! the requests sent, and each request's status and output are checked
//! against the status policy (docs/PROTOCOL.md §6) and the NIST vectors.

use std::io::Read;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::stats::read_stats;
use crate::common::*;
use crate::support::*;
use vhost_crypto_replay::driver_ring::{Descriptor, F_NEXT};
use vhost_crypto_replay::frontend::{CryptoFrontend, Used};
use vhost_user_crypto::wire::session::SessionAbi;
use vhost_user_crypto::wire::virtio_crypto::OP_DATA_REQ_SIZE;

/// A daemon with `--queues queues --stats-socket <tmp>/stats.sock`.
fn daemon_with_stats(queues: u16) -> (Daemon, tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stats.sock");
    let daemon = Daemon::spawn(&[
        "--queues",
        &queues.to_string(),
        "--stats-socket",
        path.to_str().unwrap(),
    ]);
    (daemon, dir, path)
}

/// A queue's counters as the object gives them.
fn counters(requests: u64, ok: u64, err: u64, notsupp: u64, invsess: u64, bytes: u64) -> Value {
    json!({
        "requests": requests,
        "bytes_in": bytes,
        "bytes_out": bytes,
        "status": {"ok": ok, "err": err, "badmsg": 0, "notsupp": notsupp, "invsess": invsess},
    })
}

/// Checks `got` (a queue's or the totals' object) against `want`'s
/// fields, and the fields the requests sent do not decide: at least one
/// batch and no more than requests, no more notifications than batches,
/// no throttling.
#[track_caller]
fn assert_counters(got: &Value, want: &Value, what: &str) {
    for k in ["requests", "bytes_in", "bytes_out", "status"] {
        assert_eq!(got[k], want[k], "{what}: {k} in {got}");
    }
    let n = |k: &str| got[k].as_u64().unwrap_or_else(|| panic!("{what}: {k} in {got}"));
    let batches = if n("requests") == 0 {
        0..=0
    } else {
        1..=n("requests")
    };
    assert!(batches.contains(&n("batches")), "{what}: batches in {got}");
    assert!(
        n("notifications") <= n("batches"),
        "{what}: notifications in {got}"
    );
    assert_eq!(got["throttled_s"], json!(0.0), "{what}");
}

/// Makes the request `put` lays out on queue `q` available, kicks, and
/// returns its completion.
fn complete_one(fe: &mut CryptoFrontend, q: usize, put: impl FnOnce(&mut CryptoFrontend) -> u16) -> Used {
    let slot = put(fe);
    fe.queues[q].publish_and_kick().unwrap();
    let mut done = Vec::new();
    fe.queues[q].reap(&mut done, TIMEOUT).unwrap();
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].slot, slot);
    done[0]
}

/// One request on queue `q`; returns (status byte, used length, dst).
fn request(fe: &mut CryptoFrontend, q: usize, opcode: u32, sid: u64, src: &[u8]) -> (u8, u32, Vec<u8>) {
    let u = complete_one(fe, q, |fe| put_request(fe, q, opcode, sid, &NIST_IV, src));
    result(fe, q, u, src.len())
}

/// The status byte and used length of a [`request`]'s result.
fn status_len(r: (u8, u32, Vec<u8>)) -> (u8, u32) {
    (r.0, r.1)
}

/// An F.2.1 request on queue `q` whose chain has no device-writable
/// descriptor (header, IV and src only): consumed with used length 0, no
/// status byte (docs/PROTOCOL.md §6, step 1).
fn request_without_status(fe: &mut CryptoFrontend, q: usize, sid: u64) -> u32 {
    complete_one(fe, q, |fe| {
        let dq = &mut fe.queues[q];
        let slot = dq.next_slot().expect("a free slot");
        let l = dq.layout(slot);
        put_request_bytes(fe, q, l.hdr, l.iv, l.src, sid);
        let descs = [
            Descriptor::new(l.hdr, OP_DATA_REQ_SIZE as u32, F_NEXT, 1),
            Descriptor::new(l.iv, 16, F_NEXT, 2),
            Descriptor::new(l.src, 64, 0, 0),
        ];
        fe.queues[q].submit_descs(slot, &descs, true).unwrap();
        slot
    })
    .len
}

/// Writes an F.2.1 encrypt header for `sid`, the IV and the plaintext.
fn put_request_bytes(fe: &CryptoFrontend, q: usize, hdr: u64, iv: u64, src: u64, sid: u64) {
    use vhost_user_crypto::wire::virtio_crypto::OpDataReq;
    let h = OpDataReq {
        opcode: ENCRYPT,
        algo: 0,
        session_id: sid,
        op_type: 1,
        iv_len: 16,
        src_data_len: 64,
        dst_data_len: 64,
    };
    let m = fe.queues[q].mem();
    m.write(hdr, &h.to_bytes());
    m.write(iv, &NIST_IV);
    m.write(src, &NIST_PT);
}

/// Waits until the object says `frontend_connected` is `want`.
fn await_connected(path: &Path, want: bool) -> Value {
    let start = Instant::now();
    loop {
        let s = read_stats(path);
        if s["frontend_connected"] == json!(want) {
            return s;
        }
        assert!(start.elapsed() < TIMEOUT, "frontend_connected stays {}", !want);
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn counters_equal_the_requests_sent_by_status_per_queue_and_across_reconnects() {
    let (mut daemon, _dir, path) = daemon_with_stats(2);
    let s = read_stats(&path);
    assert_eq!(s["frontend_connected"], json!(false));
    assert!(s["uptime_s"].as_f64().unwrap() >= 0.0);
    assert_eq!(
        s["sessions"],
        json!({"live": 0, "created": 0, "closed": 0, "create_failed": 0, "dropped": 0})
    );
    assert_eq!(s["queues"].as_array().unwrap().len(), 2);
    assert_counters(&s["totals"], &counters(0, 0, 0, 0, 0, 0), "totals before");

    let mut fe = frontend(&daemon.sock, &cfg(SessionAbi::C, 2, 64, 8, 64));
    let e = fe.create_session(&session(&NIST_KEY, 1)).unwrap() as u64;
    let d = fe.create_session(&session(&NIST_KEY, 2)).unwrap() as u64;
    let closed = fe.create_session(&session(&NIST_KEY, 1)).unwrap() as u64;
    // A 7-byte AES key: refused with a negative id.
    assert_eq!(fe.create_session(&session(&[7; 7], 1)).unwrap(), ID_ERR);
    // A payload of 100 bytes, no layout's size: a negative id too.
    let mut msg = vec![26, 0, 0, 0, 1, 0, 0, 0, 100, 0, 0, 0];
    msg.extend_from_slice(&[0x41; 100]);
    fe.send_raw(&msg).unwrap();
    let reply = fe.recv_raw_reply().unwrap();
    assert!(i64::from_le_bytes(reply[12..20].try_into().unwrap()) < 0);
    fe.close_session(closed).unwrap();
    // CLOSE of an id never given: ignored, not counted.
    fe.close_session(999_999).unwrap();
    let unknown = 1_000_000;

    // Queue 0: 3 OK, 2 INVSESS (an id never given, the closed one), 1 ERR
    // (src_data_len 17, not a whole number of AES blocks), 1 NOTSUPP
    // (opcode 0x9999), 1 without a status byte.
    for _ in 0..3 {
        let r = request(&mut fe, 0, ENCRYPT, e, &NIST_PT);
        assert_eq!(r, (OK, 65, NIST_CT.to_vec()), "F.2.1");
    }
    for sid in [unknown, closed] {
        assert_eq!(
            status_len(request(&mut fe, 0, ENCRYPT, sid, &NIST_PT)),
            (INVSESS, 1)
        );
    }
    assert_eq!(status_len(request(&mut fe, 0, ENCRYPT, e, &[0x41; 17])), (ERR, 1));
    assert_eq!(status_len(request(&mut fe, 0, 0x9999, e, &NIST_PT)), (NOTSUPP, 1));
    assert_eq!(
        request_without_status(&mut fe, 0, e),
        0,
        "used length without a status byte"
    );
    // Queue 1: 2 OK, 1 INVSESS.
    for _ in 0..2 {
        let r = request(&mut fe, 1, DECRYPT, d, &NIST_CT);
        assert_eq!(r, (OK, 65, NIST_PT.to_vec()), "F.2.2");
    }
    assert_eq!(
        status_len(request(&mut fe, 1, DECRYPT, unknown, &NIST_CT)),
        (INVSESS, 1)
    );

    let q0 = counters(8, 3, 1, 1, 2, 3 * 64);
    let q1 = counters(3, 2, 0, 0, 1, 2 * 64);
    let totals = counters(11, 5, 1, 1, 3, 5 * 64);
    let s = read_stats(&path);
    assert_eq!(s["frontend_connected"], json!(true));
    assert_eq!(s["queues"][0]["index"], 0);
    assert_eq!(s["queues"][1]["index"], 1);
    assert_counters(&s["queues"][0], &q0, "queue 0");
    assert_counters(&s["queues"][1], &q1, "queue 1");
    assert_counters(&s["totals"], &totals, "totals");
    for k in ["batches", "notifications"] {
        let sum = s["queues"][0][k].as_u64().unwrap() + s["queues"][1][k].as_u64().unwrap();
        assert_eq!(s["totals"][k], sum, "totals' {k}");
    }
    assert_eq!(
        s["sessions"],
        json!({"live": 2, "created": 3, "closed": 1, "create_failed": 2, "dropped": 0})
    );

    // Disconnected: nothing is reset; the two live sessions end with the
    // connection.
    drop(fe);
    let s = await_connected(&path, false);
    assert_counters(&s["queues"][0], &q0, "queue 0 after the disconnect");
    assert_counters(&s["queues"][1], &q1, "queue 1 after the disconnect");
    assert_eq!(
        s["sessions"],
        json!({"live": 0, "created": 3, "closed": 1, "create_failed": 2, "dropped": 2})
    );
    daemon.assert_alive("the first frontend");

    // A second frontend's requests add to the same counters.
    let mut fe = frontend(&daemon.sock, &cfg(SessionAbi::C, 2, 64, 8, 64));
    let e = fe.create_session(&session(&NIST_KEY, 1)).unwrap() as u64;
    assert_eq!(
        request(&mut fe, 0, ENCRYPT, e, &NIST_PT),
        (OK, 65, NIST_CT.to_vec())
    );
    let s = read_stats(&path);
    assert_counters(
        &s["queues"][0],
        &counters(9, 4, 1, 1, 2, 4 * 64),
        "queue 0 after a reconnect",
    );
    assert_counters(&s["queues"][1], &q1, "queue 1 after a reconnect");
    assert_counters(
        &s["totals"],
        &counters(12, 6, 1, 1, 3, 6 * 64),
        "totals after a reconnect",
    );
    assert_eq!(
        s["sessions"],
        json!({"live": 1, "created": 4, "closed": 1, "create_failed": 2, "dropped": 2})
    );
}

/// Clients that connect and never read (nor close) hold nothing of the
/// daemon: a frontend is served meanwhile, each of them finds the object
/// and EOF when it reads at last, and another client gets its object.
/// Clients that close at once do not end the daemon either.
#[test]
fn stats_clients_that_never_read_block_nothing() {
    // 64 queues: the largest object.
    let (mut daemon, _dir, path) = daemon_with_stats(64);
    let idle: Vec<UnixStream> = (0..100).map(|_| UnixStream::connect(&path).unwrap()).collect();
    // And clients gone before their object is written (EPIPE, not a
    // SIGPIPE that would end the daemon).
    for _ in 0..20 {
        drop(UnixStream::connect(&path).unwrap());
    }
    assert_nist(&daemon.sock, "100 stats clients that never read");
    daemon.assert_alive("100 stats clients that never read");
    let s = read_stats(&path);
    assert_eq!(s["queues"].as_array().unwrap().len(), 64);
    assert_counters(&s["totals"], &counters(2, 2, 0, 0, 0, 2 * 64), "totals");
    assert_eq!(s["sessions"]["created"], 2);
    for mut c in idle.into_iter().step_by(33) {
        c.set_read_timeout(Some(TIMEOUT)).unwrap();
        let mut b = Vec::new();
        c.read_to_end(&mut b)
            .expect("the object, then EOF, on an idle client");
        let v: Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v["queues"].as_array().unwrap().len(), 64);
    }
}

/// The daemon at `stats` as a plain child (no frontend socket wait), its
/// frontend socket at `socket` or in a directory of its own: its exit
/// status and stderr, or `None` if it still runs after 10 s.
fn start_expecting_exit(stats: &Path, socket: Option<&Path>) -> Option<(std::process::ExitStatus, String)> {
    let dir = tempfile::tempdir().unwrap();
    let own = dir.path().join("crypto.sock");
    let mut child = Command::new(env!("CARGO_BIN_EXE_vhost-user-crypto"))
        .arg("--socket-path")
        .arg(socket.unwrap_or(&own))
        .arg("--stats-socket")
        .arg(stats)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
            return Some((status, err));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// Mode 0600; a stale socket file is replaced; a socket another process
/// listens on, a file that is not a socket, or the frontend socket's path
/// is refused (exit 1).
#[test]
fn stats_socket_is_private_and_replaces_only_a_stale_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stats.sock");
    // A stale socket file: bound, nobody listening any more.
    drop(UnixListener::bind(&path).unwrap());
    assert!(UnixStream::connect(&path).is_err());
    let mut daemon = Daemon::spawn(&["--stats-socket", path.to_str().unwrap()]);
    let m = std::fs::symlink_metadata(&path).unwrap();
    assert!(m.file_type().is_socket());
    assert_eq!(m.permissions().mode() & 0o7777, 0o600, "stats socket mode");
    assert_eq!(read_stats(&path)["queues"].as_array().unwrap().len(), 1);

    // In use by the first daemon: a second one refuses it.
    let (status, err) = start_expecting_exit(&path, None).expect("the second daemon exits");
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("in use"), "{err}");
    assert_eq!(read_stats(&path)["frontend_connected"], json!(false));
    daemon.assert_alive("a second daemon on the same stats socket");

    // Not a socket: refused, the file left alone.
    let file = dir.path().join("not-a-socket");
    std::fs::write(&file, b"data").unwrap();
    let (status, err) = start_expecting_exit(&file, None).expect("the daemon exits");
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("is not a socket"), "{err}");
    assert_eq!(std::fs::read(&file).unwrap(), b"data");

    // The frontend socket's path: refused before either is bound.
    let same = dir.path().join("both.sock");
    let (status, err) = start_expecting_exit(&same, Some(&same)).expect("the daemon exits");
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("is the --socket-path too"), "{err}");
    assert!(!same.exists(), "{err}");
}
