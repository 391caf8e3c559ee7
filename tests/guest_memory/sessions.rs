// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Sessions as the data path and the session messages see them: the
//! error paths of CREATE and CLOSE (H05), key lengths and payload sizes of
//! CREATE in every layout (H06, docs/PROTOCOL.md §3), and requests naming a
//! closed session or sent while the exit wipes the sessions.

use std::time::Duration;

use crate::common::*;
use vhost_user_crypto::proxy::{handle_create, AbiChoice};
use vhost_user_crypto::sessions::{session_set, LiveTables};
use vhost_user_crypto::wire::session::{encode_create, SessionAbi};

#[test]
fn h05_session_error_paths_do_not_leak() {
    let mut vm = Vm::new();
    let mut bad = session_info(&NIST_KEY, 1);
    bad.key_len = 17;
    for _ in 0..100_000 {
        assert!(vm.reg.create(&bad) < 0);
    }
    assert_eq!(vm.reg.len(), 2, "only E and D live");
    for id in (3..100_002u64).chain([0, u64::MAX, 1 << 63]) {
        assert!(!vm.reg.close(id), "close of unknown id {id}");
    }
    assert_eq!(vm.reg.len(), 2);
    // The data path still serves, and its table is flat.
    let b = vm.baseline();
    let u = vm.submit(&b);
    vm.assert_done(u, &NIST_CT);
    assert_eq!(vm.worker.sessions.len(), 2);
    // A good create after the flood works.
    let id = vm.reg.create(&session_info(&NIST_KEY, 1));
    assert!(id > 0);
    let b = vm.stage(&hdr(ENCRYPT, id as u64, 64, 64), &NIST_PT);
    let u = vm.submit(&b);
    vm.assert_done(u, &NIST_CT);
}

#[test]
fn h06_key_length_in_session_message() {
    let (mut reg, _tables) = session_set(1024, 1);
    for key_len in [0x1000, 0, 64, 17, 15, 33, u32::MAX] {
        let mut info = session_info(&[0x2b; 64], 1);
        info.key_len = key_len;
        assert!(reg.create(&info) < 0, "key_len {key_len}");
        // The same through the frontend proxy, in each payload layout.
        for abi in [SessionAbi::A, SessionAbi::B, SessionAbi::C] {
            let payload = encode_create(abi, &info);
            let reply = handle_create(&mut reg, &payload, AbiChoice::Auto);
            assert_reply(&reply, &payload, Some(abi.session_id_offset()), |id| id < 0);
        }
    }
    assert_eq!(reg.len(), 0);

    // Payloads of odd sizes (including shorter than any layout): same-size
    // reply, negative id at offset 0 when it fits.
    for n in [0usize, 1, 7, 8, 71, 100, 631, 633, 1071, 1073, 2048, 4096] {
        for fill in [0x00u8, 0xFF, 0x41] {
            let payload = vec![fill; n];
            let reply = handle_create(&mut reg, &payload, AbiChoice::Auto);
            assert_reply(&reply, &payload, (n >= 8).then_some(0), |id| id < 0);
        }
    }
    // Garbage in the two known sizes: id at 0 (632) / 1064 (1072).
    for fill in [0x00u8, 0xFF, 0x41] {
        let p = vec![fill; 632];
        assert_reply(&handle_create(&mut reg, &p, AbiChoice::Auto), &p, Some(0), |id| {
            id < 0
        });
        let p = vec![fill; 1072];
        assert_reply(
            &handle_create(&mut reg, &p, AbiChoice::Auto),
            &p,
            Some(1064),
            |id| id < 0,
        );
    }
    // A forced layout that does not match the size.
    let p = vec![0u8; 632];
    assert_reply(
        &handle_create(&mut reg, &p, AbiChoice::Fixed(SessionAbi::C)),
        &p,
        Some(0),
        |id| id < 0,
    );
    assert_eq!(reg.len(), 0, "no session created by any bad message");

    // The handler keeps serving: a good CREATE in each layout.
    for abi in [SessionAbi::A, SessionAbi::B, SessionAbi::C] {
        let payload = encode_create(abi, &session_info(&NIST_KEY, 1));
        let reply = handle_create(&mut reg, &payload, AbiChoice::Auto);
        assert_reply(&reply, &payload, Some(abi.session_id_offset()), |id| id > 0);
    }
    assert_eq!(reg.len(), 3);
}

#[track_caller]
fn assert_reply(reply: &[u8], payload: &[u8], id_at: Option<usize>, ok: impl Fn(i64) -> bool) {
    assert_eq!(reply.len(), 12 + payload.len(), "reply size");
    assert_eq!(&reply[0..4], &26u32.to_le_bytes(), "request");
    assert_eq!(&reply[4..8], &5u32.to_le_bytes(), "flags");
    assert_eq!(&reply[8..12], &(payload.len() as u32).to_le_bytes(), "size");
    if let Some(off) = id_at {
        let id = i64::from_le_bytes(reply[12 + off..12 + off + 8].try_into().unwrap());
        assert!(
            ok(id),
            "session id {id} at {off} ({} byte payload)",
            payload.len()
        );
    }
}

#[test]
fn closed_session_is_invsess() {
    let mut vm = Vm::new();
    let b = vm.baseline();
    let u = vm.submit(&b);
    vm.assert_done(u, &NIST_CT);
    assert!(vm.reg.close(E));
    let b = vm.baseline();
    let u = vm.submit(&b);
    vm.assert_failed(u, INVSESS);
    // D is still served.
    let b = vm.stage(&hdr(DECRYPT, D, 64, 64), &NIST_CT);
    let u = vm.submit(&b);
    vm.assert_done(u, &NIST_PT);
    // A new session does not bring the closed id back.
    let id = vm.reg.create(&session_info(&NIST_KEY, 1));
    assert!(id > 0 && id as u64 != E);
    let b = vm.baseline();
    let u = vm.submit(&b);
    vm.assert_failed(u, INVSESS);
    let b = vm.stage(&hdr(ENCRYPT, id as u64, 64, 64), &NIST_PT);
    let u = vm.submit(&b);
    vm.assert_done(u, &NIST_CT);
}

/// Once the exit on SIGTERM or SIGINT has started wiping the session
/// tables, the worker takes no more requests: a request taken then would
/// find its session gone and complete as INVSESS although the driver never
/// closed it. It stays on the avail ring instead.
#[test]
fn no_request_is_taken_once_the_exit_wipes_the_sessions() {
    let live: &'static LiveTables = Box::leak(Box::new(LiveTables::new()));
    let mut vm = Vm::build_in(&[(0, 256 << 20)], 2, live);
    let b = vm.baseline();
    let u = vm.submit(&b);
    vm.assert_done(u, &NIST_CT);
    let wiped = live.wipe_all(Duration::from_secs(1));
    assert_eq!((wiped.tables, wiped.sessions, wiped.busy), (2, 4, 0));
    let b = vm.baseline();
    let head = vm.chain(&b);
    vm.push(head);
    let r = vm.run();
    assert_eq!(r.completed, 0, "requests taken after the wipe");
    assert_eq!(vm.next_avail, 1, "next_avail");
    assert_eq!(vm.used_idx(), 1, "used.idx");
    vm.assert_canary(DST, DST_AREA);
    vm.assert_canary(STATUS, STATUS_AREA);
}
