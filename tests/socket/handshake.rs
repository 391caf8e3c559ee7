// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The handshake QEMU makes (docs/PROTOCOL.md §4.1): a frontend that
//! leaves at every point of it, requests sent before the previous reply is
//! read, protocol features the daemon does not offer, and NIST SP 800-38A
//! F.2.1/F.2.2 in every session and descriptor layout, a new connection
//! each time.

use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};

use crate::common::daemon::spawn_daemon;
use crate::common::*;
use crate::support::*;
use vhost_crypto_replay::frontend::DescMode;
use vhost_user_crypto::wire::session::{create_request, SessionAbi};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

#[test]
fn nist_over_socket_all_layouts_and_reconnect() {
    let daemon = spawn_daemon(&[]);
    for abi in [SessionAbi::A, SessionAbi::B, SessionAbi::C] {
        for mode in [DescMode::Indirect, DescMode::Chain] {
            // A new connection each time: also tests reconnect with fresh state.
            nist_roundtrip(&daemon.sock, abi, mode);
        }
    }
}

/// A message of the QEMU-like handshake.
struct Msg {
    name: &'static str,
    req: u32,
    payload: Vec<u8>,
    fds: Vec<RawFd>,
    /// Whether the protocol has a reply (without REPLY_ACK negotiated).
    reply: bool,
}

/// Memory and eventfds the handshake hands over.
struct HandshakeRes {
    mem: File,
    kick: EventFd,
    call: EventFd,
}

impl HandshakeRes {
    fn new() -> Self {
        HandshakeRes {
            mem: memfd(MEM_SIZE),
            kick: EventFd::new(EFD_NONBLOCK).unwrap(),
            call: EventFd::new(EFD_NONBLOCK).unwrap(),
        }
    }

    /// What QEMU sends for `cryptodev-vhost-user` with one data queue,
    /// then a CREATE (layout C); the ring lives in the first 64 KiB.
    fn messages(&self) -> Vec<Msg> {
        let m = |name, req, payload: Vec<u8>, fds: Vec<RawFd>, reply| Msg {
            name,
            req,
            payload,
            fds,
            reply,
        };
        let (desc, avail, used) = (0x1000u64, 0x2000u64, 0x3000u64);
        let create = create_request(SessionAbi::C, &session(&NIST_KEY, 1));
        vec![
            m("GET_FEATURES", GET_FEATURES, vec![], vec![], true),
            m(
                "GET_PROTOCOL_FEATURES",
                GET_PROTOCOL_FEATURES,
                vec![],
                vec![],
                true,
            ),
            m(
                "SET_PROTOCOL_FEATURES",
                SET_PROTOCOL_FEATURES,
                PF_CRYPTO_SESSION.to_le_bytes().to_vec(),
                vec![],
                false,
            ),
            m("SET_OWNER", SET_OWNER, vec![], vec![], false),
            m(
                "SET_FEATURES",
                SET_FEATURES,
                F_PROTOCOL_FEATURES.to_le_bytes().to_vec(),
                vec![],
                false,
            ),
            m(
                "SET_MEM_TABLE",
                SET_MEM_TABLE,
                mem_table(&[(0, MEM_SIZE, UADDR, 0)]),
                vec![self.mem.as_raw_fd()],
                false,
            ),
            m("SET_VRING_NUM", SET_VRING_NUM, vring_state(0, 256), vec![], false),
            m("SET_VRING_BASE", SET_VRING_BASE, vring_state(0, 0), vec![], false),
            m(
                "SET_VRING_ADDR",
                SET_VRING_ADDR,
                vring_addr(0, UADDR + desc, UADDR + used, UADDR + avail),
                vec![],
                false,
            ),
            m(
                "SET_VRING_KICK",
                SET_VRING_KICK,
                0u64.to_le_bytes().to_vec(),
                vec![self.kick.as_raw_fd()],
                false,
            ),
            m(
                "SET_VRING_CALL",
                SET_VRING_CALL,
                0u64.to_le_bytes().to_vec(),
                vec![self.call.as_raw_fd()],
                false,
            ),
            m(
                "CREATE_CRYPTO_SESSION",
                CREATE_CRYPTO_SESSION,
                create[12..].to_vec(),
                vec![],
                true,
            ),
        ]
    }
}

/// Checks the reply to handshake message `m`: a CREATE's id must be
/// above `last_id` (ids are never given twice in the daemon), and
/// becomes the new `last_id`.
#[track_caller]
fn check_handshake_reply(c: &Conn, m: &Msg, last_id: &mut i64) {
    let p = c.reply(m.req);
    match m.req {
        GET_FEATURES => {
            let f = u64::from_le_bytes(p[..8].try_into().unwrap());
            assert_ne!(f & F_PROTOCOL_FEATURES, 0, "features {f:#x}");
        }
        GET_PROTOCOL_FEATURES => {
            let f = u64::from_le_bytes(p[..8].try_into().unwrap());
            assert_ne!(f & PF_CRYPTO_SESSION, 0, "protocol features {f:#x}");
        }
        CREATE_CRYPTO_SESSION => {
            assert_eq!(p.len(), 1072, "CREATE reply size (layout C)");
            let id = i64::from_le_bytes(p[1064..1072].try_into().unwrap());
            assert!(id > *last_id, "session id {id} after {last_id}");
            *last_id = id;
        }
        _ => unreachable!(),
    }
}

/// How a connection ends after the first k messages.
#[derive(Debug, Clone, Copy)]
enum Cut {
    /// Right after message k-1 (and its reply).
    Clean,
    /// After 6 bytes of message k's header.
    HalfHeader,
    /// After message k's header (with its fds), without its payload.
    HeaderOnly,
    /// After message k's header and half its payload.
    HalfPayload,
    /// After all of message k, without reading its reply.
    ReplyUnread,
}

#[test]
fn disconnect_at_every_point_of_the_handshake() {
    let mut daemon = Daemon::spawn(&[]);
    let n = HandshakeRes::new().messages().len();
    let mut cases = 0;
    let mut last_id = 0;
    for k in 0..=n {
        for cut in [
            Cut::Clean,
            Cut::HalfHeader,
            Cut::HeaderOnly,
            Cut::HalfPayload,
            Cut::ReplyUnread,
        ] {
            let res = HandshakeRes::new();
            let msgs = res.messages();
            let next = msgs.get(k);
            match (cut, next) {
                (Cut::Clean, _) => {}
                (_, None) => continue,
                (Cut::HeaderOnly | Cut::HalfPayload, Some(m)) if m.payload.is_empty() => continue,
                (Cut::ReplyUnread, Some(m)) if !m.reply => continue,
                _ => {}
            }
            let c = Conn::open(&daemon.sock);
            for m in &msgs[..k] {
                c.send(m.req, VERSION_1, &m.payload, &m.fds).unwrap();
                if m.reply {
                    check_handshake_reply(&c, m, &mut last_id);
                }
            }
            if let Some(m) = next {
                let whole = Conn::message(m.req, VERSION_1, &m.payload);
                match cut {
                    Cut::Clean => {}
                    Cut::HalfHeader => c.send_bytes(&whole[..6], &[]).unwrap(),
                    Cut::HeaderOnly => c.send_bytes(&whole[..12], &m.fds).unwrap(),
                    Cut::HalfPayload => c.send_bytes(&whole[..12 + m.payload.len() / 2], &m.fds).unwrap(),
                    Cut::ReplyUnread => c.send_bytes(&whole, &m.fds).unwrap(),
                }
            }
            let what = format!(
                "{k} messages then {cut:?} (next: {})",
                next.map_or("none", |m| m.name)
            );
            drop(c);
            drop(res);
            daemon.assert_alive(&what);
            assert_nist(&daemon.sock, &what);
            cases += 1;
        }
    }
    // 13 clean cuts, 12 half headers, 9 headers without payload, 9 half
    // payloads, 3 replies unread (GET_FEATURES, GET_PROTOCOL_FEATURES, CREATE).
    assert_eq!(cases, 46);
    daemon.assert_alive("the handshake cuts");
}

/// A frontend may send its next request before reading the previous reply
/// (the replies are in request order on the stream): the daemon answers
/// some requests itself (CREATE) and forwards the others, and the replies
/// must still come back in request order.
#[test]
fn pipelined_requests_get_replies_in_order() {
    let daemon = Daemon::spawn(&["--max-sessions", "100000"]);
    let c = Conn::negotiated(&daemon.sock);
    let create = create_request(SessionAbi::C, &session(&NIST_KEY, 1)).to_vec();
    let get = |req: u32| Conn::message(req, VERSION_1, &[]);
    let set_features = Conn::message(
        SET_FEATURES,
        VERSION_1 | NEED_REPLY,
        &F_PROTOCOL_FEATURES.to_le_bytes(),
    );
    // (name, messages sent back to back, replies expected in this order)
    let sequences = [
        (
            "GET_FEATURES, CREATE",
            vec![get(GET_FEATURES), create.clone()],
            vec![GET_FEATURES, CREATE_CRYPTO_SESSION],
        ),
        (
            "SET_FEATURES with NEED_REPLY, CREATE",
            vec![set_features, create.clone()],
            vec![SET_FEATURES, CREATE_CRYPTO_SESSION],
        ),
        (
            "GET_PROTOCOL_FEATURES, CREATE, GET_FEATURES",
            vec![get(GET_PROTOCOL_FEATURES), create.clone(), get(GET_FEATURES)],
            vec![GET_PROTOCOL_FEATURES, CREATE_CRYPTO_SESSION, GET_FEATURES],
        ),
    ];
    let mut out_of_order = Vec::new();
    for (name, msgs, want) in &sequences {
        let mut bad = 0;
        for _ in 0..200 {
            c.send_bytes(&msgs.concat(), &[]).unwrap();
            let got: Vec<u32> = want
                .iter()
                .map(|_| match c.recv() {
                    Got::Msg(r, f, _) => {
                        assert_eq!(f, REPLY | VERSION_1, "{name}: reply flags");
                        r
                    }
                    other => panic!("{name}: {other:?}"),
                })
                .collect();
            let mut sorted = got.clone();
            sorted.sort_unstable();
            let mut want_sorted = want.clone();
            want_sorted.sort_unstable();
            assert_eq!(sorted, want_sorted, "{name}: one reply per request");
            if got != *want {
                bad += 1;
            }
        }
        if bad > 0 {
            out_of_order.push(format!("{name}: {bad} of 200 out of order"));
        }
    }
    assert!(
        out_of_order.is_empty(),
        "replies out of request order: {out_of_order:?}"
    );
}

/// SET_PROTOCOL_FEATURES with bits GET_PROTOCOL_FEATURES did not offer
/// must be refused (error ack or disconnect), as SET_FEATURES with
/// unoffered virtio bits is (`malformed_messages_never_crash_the_daemon`):
/// a feature is negotiated only when the backend offered it and the
/// frontend acked it, and the messages those features bring
/// (GET_CONFIG/SET_CONFIG, GET_INFLIGHT_FD, ADD_MEM_REG/REM_MEM_REG) are
/// otherwise served by code paths the daemon never meant to expose.
#[test]
fn protocol_features_the_backend_did_not_offer_are_refused() {
    let mut daemon = Daemon::spawn(&[]);
    let mut accepted = Vec::new();
    for (name, bit) in [
        ("CONFIG", PF_CONFIG),
        ("INFLIGHT_SHMFD", PF_INFLIGHT_SHMFD),
        ("CONFIGURE_MEM_SLOTS", PF_CONFIGURE_MEM_SLOTS),
        ("all 64 bits", u64::MAX),
    ] {
        let c = Conn::negotiated(&daemon.sock);
        c.send(GET_PROTOCOL_FEATURES, VERSION_1, &[], &[]).unwrap();
        let offered = c.reply_u64(GET_PROTOCOL_FEATURES);
        assert_ne!(bit & !offered, 0, "{name} is offered ({offered:#x})");
        c.send(
            SET_PROTOCOL_FEATURES,
            VERSION_1 | NEED_REPLY,
            &(PF_CRYPTO_SESSION | PF_REPLY_ACK | bit).to_le_bytes(),
            &[],
        )
        .unwrap();
        let o = accepted_or_refused(&c, SET_PROTOCOL_FEATURES);
        if o == "accepted" {
            accepted.push(format!("{name} ({bit:#x}; offered {offered:#x})"));
        }
        drop(c);
        daemon.assert_alive(name);
    }
    assert!(
        accepted.is_empty(),
        "SET_PROTOCOL_FEATURES acked with 0 for bits never offered: {}",
        accepted.join(", ")
    );
}
