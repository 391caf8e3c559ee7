// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Malformed vhost-user messages and every message variant a frontend may
//! send (sizes, framing, flags, unknown codes, ring values and memory
//! tables no split ring or memory map has, messages out of order): an
//! error ack or a clean disconnect, the daemon alive, the next frontend
//! served, no descriptor or mapping left behind.

use std::net::Shutdown;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use crate::common::*;
use crate::support::*;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

#[test]
fn malformed_messages_never_crash_the_daemon() {
    let mut daemon = Daemon::spawn(&[]);
    let base = daemon.idle_snapshot();
    let mem = memfd(MEM_SIZE);
    let ev = EventFd::new(EFD_NONBLOCK).unwrap();
    let efd = ev.as_raw_fd();
    let mut outcomes = Vec::new();
    // Closes the bad connection first: the daemon serves one frontend at a
    // time, so the next one is only served once this one is gone.
    let mut check = |daemon: &mut Daemon, c: Conn, what: &str, outcome: &'static str| {
        drop(c);
        daemon.assert_alive(what);
        assert_nist(&daemon.sock, what);
        outcomes.push(format!("{what}: {outcome}"));
    };

    // Payload size field over 4096, the payload not sent.
    for size in [4097u32, 0x10000, u32::MAX] {
        let c = Conn::negotiated(&daemon.sock);
        let mut h = Conn::message(SET_OWNER, VERSION_1 | NEED_REPLY, &[]);
        h[8..12].copy_from_slice(&size.to_le_bytes());
        c.send_bytes(&h, &[]).unwrap();
        let o = expect_refused(&c, SET_OWNER, "size field > 4096");
        assert_eq!(o, "disconnect", "size {size}");
        check(&mut daemon, c, &format!("size field {size}"), o);
    }
    // Size field larger than what is sent, then the frontend half-closes.
    for (req, size, sent) in [(SET_FEATURES, 8u32, 3usize), (CREATE_CRYPTO_SESSION, 1072, 500)] {
        let c = Conn::negotiated(&daemon.sock);
        let mut m = Conn::message(req, VERSION_1, &vec![0u8; sent]);
        m[8..12].copy_from_slice(&size.to_le_bytes());
        c.send_bytes(&m, &[]).unwrap();
        c.s.shutdown(Shutdown::Write).unwrap();
        let o = expect_refused(&c, req, "short payload");
        check(
            &mut daemon,
            c,
            &format!("request {req}: {sent} of {size} payload bytes, then close"),
            o,
        );
    }
    // Unknown request codes, with and without payload.
    for (req, payload) in [
        (0u32, vec![]),
        (99, vec![]),
        (0xFFFF, vec![]),
        (99, vec![0u8; 8]),
        (u32::MAX, vec![0u8; 40]),
    ] {
        let c = Conn::negotiated(&daemon.sock);
        c.send(req, VERSION_1 | NEED_REPLY, &payload, &[]).unwrap();
        let o = expect_refused(&c, req, "unknown request");
        check(
            &mut daemon,
            c,
            &format!("unknown request {req:#x} ({} bytes)", payload.len()),
            o,
        );
    }
    // Bad header flags: version 0 and 2, reserved bits.
    for flags in [0u32, 2, 0x100 | VERSION_1] {
        let c = Conn::negotiated(&daemon.sock);
        c.send(GET_FEATURES, flags, &[], &[]).unwrap();
        let o = match c.recv() {
            Got::Closed => "disconnect",
            other => panic!("GET_FEATURES with flags {flags:#x}: {other:?}"),
        };
        check(&mut daemon, c, &format!("header flags {flags:#x}"), o);
    }
    // Ring values H16 (`rings::h16_bad_ring_messages_then_a_new_frontend_works`)
    // does not cover: sizes past
    // 16 bits that truncate to a valid size (0x10100 -> 256), 2^31 and
    // 32768 * 2; a base past 16 bits; SET_VRING_ENABLE with 2 and for ring 5.
    for (req, payload) in [
        (SET_VRING_NUM, vring_state(0, 0x1_0100)),
        (SET_VRING_NUM, vring_state(0, 1 << 31)),
        (SET_VRING_NUM, vring_state(0, 65536)),
        (SET_VRING_BASE, vring_state(0, 0x1_0000)),
        (SET_VRING_BASE, vring_state(0, u32::MAX)),
        (SET_VRING_ENABLE, vring_state(0, 2)),
        (SET_VRING_ENABLE, vring_state(5, 1)),
    ] {
        let c = Conn::negotiated(&daemon.sock);
        c.send(req, VERSION_1 | NEED_REPLY, &payload, &[]).unwrap();
        let o = expect_refused(&c, req, "bad ring value");
        let v = u32::from_le_bytes(payload[4..8].try_into().unwrap());
        let i = u32::from_le_bytes(payload[..4].try_into().unwrap());
        check(
            &mut daemon,
            c,
            &format!("request {req} for ring {i} with {v:#x}"),
            o,
        );
    }
    // Ring index 5 on a one-queue daemon (with memory set up).
    for (req, payload, fds) in [
        (SET_VRING_NUM, vring_state(5, 256), vec![]),
        (SET_VRING_BASE, vring_state(5, 0), vec![]),
        (
            SET_VRING_ADDR,
            vring_addr(5, UADDR + 0x1000, UADDR + 0x3000, UADDR + 0x2000),
            vec![],
        ),
        (SET_VRING_KICK, 5u64.to_le_bytes().to_vec(), vec![efd]),
        (SET_VRING_CALL, 5u64.to_le_bytes().to_vec(), vec![efd]),
        (SET_VRING_KICK, 0x105u64.to_le_bytes().to_vec(), vec![]),
        (GET_VRING_BASE, vring_state(5, 0), vec![]),
    ] {
        let c = Conn::negotiated(&daemon.sock);
        c.send(
            SET_MEM_TABLE,
            VERSION_1 | NEED_REPLY,
            &mem_table(&[(0, MEM_SIZE, UADDR, 0)]),
            &[mem.as_raw_fd()],
        )
        .unwrap();
        assert_eq!(c.reply_u64(SET_MEM_TABLE), 0, "SET_MEM_TABLE ack");
        c.send(req, VERSION_1 | NEED_REPLY, &payload, &fds).unwrap();
        let o = expect_refused(&c, req, "ring 5");
        check(&mut daemon, c, &format!("request {req} for ring 5"), o);
    }
    // SET_MEM_TABLE: 0 regions; a region without its fd; one region with
    // two fds; a region of size 0; 33 regions.
    let many: Vec<(u64, u64, u64, u64)> = (0..33)
        .map(|i| (i << 20, 1 << 20, UADDR + (i << 20), 0))
        .collect();
    for (name, payload, fds) in [
        ("0 regions", mem_table(&[]), vec![]),
        ("0 regions with an fd", mem_table(&[]), vec![mem.as_raw_fd()]),
        (
            "a region without fd",
            mem_table(&[(0, MEM_SIZE, UADDR, 0)]),
            vec![],
        ),
        (
            "a region with two fds",
            mem_table(&[(0, MEM_SIZE, UADDR, 0)]),
            vec![mem.as_raw_fd(), efd],
        ),
        (
            "a region of size 0",
            mem_table(&[(0, 0, UADDR, 0)]),
            vec![mem.as_raw_fd()],
        ),
        ("33 regions", mem_table(&many), vec![mem.as_raw_fd()]),
        (
            "num_regions 2, one region",
            {
                let mut p = mem_table(&[(0, MEM_SIZE, UADDR, 0)]);
                p[0] = 2;
                p
            },
            vec![mem.as_raw_fd()],
        ),
    ] {
        let c = Conn::negotiated(&daemon.sock);
        c.send(SET_MEM_TABLE, VERSION_1 | NEED_REPLY, &payload, &fds)
            .unwrap();
        let o = expect_refused(&c, SET_MEM_TABLE, name);
        check(&mut daemon, c, &format!("SET_MEM_TABLE with {name}"), o);
    }
    // SET_FEATURES with bits the backend did not offer.
    for bits in [1u64 << 0, 1 << 63, 1 << 31, u64::MAX] {
        let c = Conn::negotiated(&daemon.sock);
        let offered = c.get_features();
        assert_eq!(
            offered & bits & (1 << 0 | 1 << 63 | 1 << 31),
            0,
            "offered {offered:#x}"
        );
        c.send(
            SET_FEATURES,
            VERSION_1 | NEED_REPLY,
            &(F_PROTOCOL_FEATURES | bits).to_le_bytes(),
            &[],
        )
        .unwrap();
        let o = expect_refused(&c, SET_FEATURES, "unoffered features");
        check(&mut daemon, c, &format!("SET_FEATURES with {bits:#x}"), o);
    }
    // Messages with fds they must not carry.
    for req in [GET_FEATURES, SET_OWNER] {
        let c = Conn::negotiated(&daemon.sock);
        c.send(req, VERSION_1 | NEED_REPLY, &[], &[efd]).unwrap();
        let o = expect_refused(&c, req, "stray fd");
        check(&mut daemon, c, &format!("request {req} with an fd"), o);
    }
    // Out of order: SET_VRING_ADDR before SET_MEM_TABLE (nothing to
    // translate the addresses with): refused.
    {
        let c = Conn::negotiated(&daemon.sock);
        c.send(SET_VRING_NUM, VERSION_1 | NEED_REPLY, &vring_state(0, 256), &[])
            .unwrap();
        assert_eq!(c.reply_u64(SET_VRING_NUM), 0);
        let p = vring_addr(0, UADDR + 0x1000, UADDR + 0x3000, UADDR + 0x2000);
        c.send(SET_VRING_ADDR, VERSION_1 | NEED_REPLY, &p, &[]).unwrap();
        let o = expect_refused(&c, SET_VRING_ADDR, "SET_VRING_ADDR before SET_MEM_TABLE");
        check(&mut daemon, c, "SET_VRING_ADDR before SET_MEM_TABLE", o);
    }
    // Out of order, but not invalid: the daemon may accept them; it must
    // stay consistent. Each then kicks the ring and checks the connection
    // still answers.
    let accepted = |c: &Conn, req: u32, payload: &[u8], fds: &[RawFd]| -> &'static str {
        c.send(req, VERSION_1 | NEED_REPLY, payload, fds).unwrap();
        match c.recv() {
            Got::Msg(r, f, p) if (r, f) == (req, REPLY | VERSION_1) && p == [0u8; 8] => "accepted",
            Got::Msg(r, f, p) if (r, f) == (req, REPLY | VERSION_1) && p.len() == 8 => "error ack",
            Got::Closed => "disconnect",
            other => panic!("request {req}: {other:?}"),
        }
    };
    {
        // SET_VRING_KICK before SET_MEM_TABLE, then a kick.
        let c = Conn::negotiated(&daemon.sock);
        let kick = EventFd::new(EFD_NONBLOCK).unwrap();
        let o = accepted(&c, SET_VRING_KICK, &0u64.to_le_bytes(), &[kick.as_raw_fd()]);
        if o == "accepted" {
            kick.write(1).unwrap();
            std::thread::sleep(Duration::from_millis(50));
            assert_ne!(c.get_features() & F_PROTOCOL_FEATURES, 0);
        }
        check(
            &mut daemon,
            c,
            "SET_VRING_KICK before SET_MEM_TABLE, then a kick",
            o,
        );
    }
    {
        // SET_VRING_ADDR before SET_VRING_NUM (memory set up), then KICK and a kick.
        let c = Conn::negotiated(&daemon.sock);
        c.send(
            SET_MEM_TABLE,
            VERSION_1 | NEED_REPLY,
            &mem_table(&[(0, MEM_SIZE, UADDR, 0)]),
            &[mem.as_raw_fd()],
        )
        .unwrap();
        assert_eq!(c.reply_u64(SET_MEM_TABLE), 0);
        let p = vring_addr(0, UADDR + 0x1000, UADDR + 0x3000, UADDR + 0x2000);
        let mut o = accepted(&c, SET_VRING_ADDR, &p, &[]);
        if o == "accepted" {
            let kick = EventFd::new(EFD_NONBLOCK).unwrap();
            o = accepted(&c, SET_VRING_KICK, &0u64.to_le_bytes(), &[kick.as_raw_fd()]);
            if o == "accepted" {
                kick.write(1).unwrap();
                std::thread::sleep(Duration::from_millis(50));
                assert_ne!(c.get_features() & F_PROTOCOL_FEATURES, 0);
            }
        }
        check(
            &mut daemon,
            c,
            "SET_VRING_ADDR before SET_VRING_NUM, then a kick",
            o,
        );
    }
    {
        // GET_VRING_BASE on a ring never started: base 0 for ring 0.
        let c = Conn::negotiated(&daemon.sock);
        c.send(GET_VRING_BASE, VERSION_1, &vring_state(0, 0), &[])
            .unwrap();
        let p = c.reply(GET_VRING_BASE);
        assert_eq!(p, vring_state(0, 0), "GET_VRING_BASE of a ring never started");
        assert_ne!(c.get_features() & F_PROTOCOL_FEATURES, 0);
        check(
            &mut daemon,
            c,
            "GET_VRING_BASE on a ring never started",
            "reply (0, 0)",
        );
    }
    drop(mem);
    drop(ev);
    let after = daemon.idle_snapshot();
    eprintln!("malformed messages:\n  {}", outcomes.join("\n  "));
    eprintln!("fds: {} before, {} after", base.fds, after.fds);
    assert!(
        after.fds <= base.fds + 2,
        "fd leak: {} before, {} after",
        base.fds,
        after.fds
    );
    assert_eq!(
        after.memfd_maps, 0,
        "guest memory of closed connections still mapped"
    );
}

#[test]
fn message_variants_get_an_answer_or_a_clean_disconnect() {
    let mut daemon = Daemon::spawn(&[]);
    let mut report = Vec::new();
    let mem = memfd(MEM_SIZE);
    let mfd = mem.as_raw_fd();
    let two = memfd(2 * MEM_SIZE);
    let spare = EventFd::new(EFD_NONBLOCK).unwrap();
    type Step = (u32, u32, Vec<u8>, Vec<RawFd>);
    let ack = |pf: u64| {
        (
            SET_PROTOCOL_FEATURES,
            VERSION_1 | NEED_REPLY,
            (PF_CRYPTO_SESSION | PF_REPLY_ACK | pf).to_le_bytes().to_vec(),
            vec![],
        )
    };
    let mt = |r: &[(u64, u64, u64, u64)], fds: Vec<RawFd>| {
        (SET_MEM_TABLE, VERSION_1 | NEED_REPLY, mem_table(r), fds)
    };
    let cases: Vec<(&str, Vec<Step>)> = vec![
        (
            "overlapping regions",
            vec![mt(
                &[(0, MEM_SIZE, UADDR, 0), (0x8000, MEM_SIZE, UADDR + (4 << 20), 0)],
                vec![mfd, mfd],
            )],
        ),
        (
            "offset beyond file",
            vec![mt(&[(0, 4096, UADDR, 2 * MEM_SIZE)], vec![mfd])],
        ),
        (
            "offset not page aligned",
            vec![mt(&[(0, 4096, UADDR, 100)], vec![mfd])],
        ),
        (
            "size not page multiple",
            vec![mt(&[(0, 100, UADDR, 0)], vec![mfd])],
        ),
        (
            "gpa near u64 max",
            vec![mt(&[(u64::MAX - 4095, 4096, UADDR, 0)], vec![mfd])],
        ),
        (
            "uaddr overlap",
            vec![mt(
                &[(0, MEM_SIZE, UADDR, 0), (4 << 20, MEM_SIZE, UADDR, 0)],
                vec![mfd, mfd],
            )],
        ),
        (
            "32 regions",
            vec![mt(
                &(0..32)
                    .map(|i| (i << 16, 1 << 16, UADDR + (i << 16), i << 15))
                    .collect::<Vec<_>>(),
                vec![two.as_raw_fd(); 32],
            )],
        ),
        (
            "SET_MEM_TABLE twice, then ring",
            vec![
                mt(&[(0, MEM_SIZE, UADDR, 0)], vec![mfd]),
                mt(&[(0, MEM_SIZE, UADDR, 0)], vec![mfd]),
                (SET_VRING_NUM, VERSION_1 | NEED_REPLY, vring_state(0, 256), vec![]),
                (
                    SET_VRING_ADDR,
                    VERSION_1 | NEED_REPLY,
                    vring_addr(0, UADDR + RAW_DESC, UADDR + RAW_USED, UADDR + RAW_AVAIL),
                    vec![],
                ),
            ],
        ),
        (
            "ring crosses end of memory",
            vec![
                mt(&[(0, MEM_SIZE, UADDR, 0)], vec![mfd]),
                (SET_VRING_NUM, VERSION_1 | NEED_REPLY, vring_state(0, 256), vec![]),
                (
                    SET_VRING_ADDR,
                    VERSION_1 | NEED_REPLY,
                    vring_addr(
                        0,
                        UADDR + MEM_SIZE - 16,
                        UADDR + MEM_SIZE - 8,
                        UADDR + MEM_SIZE - 2,
                    ),
                    vec![],
                ),
            ],
        ),
        (
            "ring misaligned",
            vec![
                mt(&[(0, MEM_SIZE, UADDR, 0)], vec![mfd]),
                (SET_VRING_NUM, VERSION_1 | NEED_REPLY, vring_state(0, 256), vec![]),
                (
                    SET_VRING_ADDR,
                    VERSION_1 | NEED_REPLY,
                    vring_addr(
                        0,
                        UADDR + RAW_DESC + 1,
                        UADDR + RAW_USED + 1,
                        UADDR + RAW_AVAIL + 1,
                    ),
                    vec![],
                ),
            ],
        ),
        (
            "ring at uaddr end of region",
            vec![
                mt(&[(0, MEM_SIZE, UADDR, 0)], vec![mfd]),
                (SET_VRING_NUM, VERSION_1 | NEED_REPLY, vring_state(0, 256), vec![]),
                (
                    SET_VRING_ADDR,
                    VERSION_1 | NEED_REPLY,
                    vring_addr(0, UADDR + MEM_SIZE, UADDR + RAW_USED, UADDR + RAW_AVAIL),
                    vec![],
                ),
            ],
        ),
        (
            "GET_CONFIG unacked",
            vec![(24, VERSION_1, vec![0; 12 + 8], vec![])],
        ),
        (
            "CONFIG acked, GET_CONFIG 8",
            vec![ack(1 << 9), {
                let mut p = 0u32.to_le_bytes().to_vec();
                p.extend_from_slice(&8u32.to_le_bytes());
                p.extend_from_slice(&0u32.to_le_bytes());
                p.extend_from_slice(&[0; 8]);
                (24, VERSION_1, p, vec![])
            }],
        ),
        (
            "CONFIG acked, GET_CONFIG off huge",
            vec![ack(1 << 9), {
                let mut p = u32::MAX.to_le_bytes().to_vec();
                p.extend_from_slice(&256u32.to_le_bytes());
                p.extend_from_slice(&0u32.to_le_bytes());
                p.extend_from_slice(&[0; 256]);
                (24, VERSION_1, p, vec![])
            }],
        ),
        (
            "CONFIG acked, SET_CONFIG",
            vec![ack(1 << 9), {
                let mut p = 0u32.to_le_bytes().to_vec();
                p.extend_from_slice(&8u32.to_le_bytes());
                p.extend_from_slice(&0u32.to_le_bytes());
                p.extend_from_slice(&[0; 8]);
                (25, VERSION_1 | NEED_REPLY, p, vec![])
            }],
        ),
        (
            "INFLIGHT acked, GET_INFLIGHT_FD",
            vec![ack(1 << 12), (31, VERSION_1, vec![0; 24], vec![])],
        ),
        (
            "LOG_SHMFD acked, SET_LOG_BASE",
            vec![ack(1 << 1), (6, VERSION_1, vec![0; 16], vec![mfd])],
        ),
        ("SET_LOG_FD", vec![(7, VERSION_1 | NEED_REPLY, vec![], vec![mfd])]),
        (
            "GPU_SET_SOCKET",
            vec![(33, VERSION_1 | NEED_REPLY, vec![], vec![mfd])],
        ),
        ("CHECK_DEVICE_STATE", vec![(43, VERSION_1, vec![], vec![])]),
        ("RESET_DEVICE", vec![(34, VERSION_1 | NEED_REPLY, vec![], vec![])]),
        ("RESET_OWNER", vec![(4, VERSION_1 | NEED_REPLY, vec![], vec![])]),
        (
            "SET_OWNER twice",
            vec![(SET_OWNER, VERSION_1 | NEED_REPLY, vec![], vec![])],
        ),
        ("GET_QUEUE_NUM unacked", vec![(17, VERSION_1, vec![], vec![])]),
        (
            "MQ acked GET_QUEUE_NUM",
            vec![ack(1), (17, VERSION_1, vec![], vec![])],
        ),
        (
            "GET_MAX_MEM_SLOTS acked",
            vec![ack(1 << 15), (36, VERSION_1, vec![], vec![])],
        ),
        (
            "ADD_MEM_REG unacked",
            vec![(
                37,
                VERSION_1 | NEED_REPLY,
                {
                    let mut p = vec![0u8; 8];
                    for v in [0, MEM_SIZE, UADDR, 0u64] {
                        p.extend_from_slice(&v.to_le_bytes());
                    }
                    p
                },
                vec![mfd],
            )],
        ),
        (
            "VRING_KICK msg 35",
            vec![(35, VERSION_1 | NEED_REPLY, vring_state(0, 0), vec![])],
        ),
        (
            "SET_STATUS",
            vec![(39, VERSION_1 | NEED_REPLY, vec![0; 8], vec![])],
        ),
        ("GET_STATUS", vec![(40, VERSION_1, vec![], vec![])]),
        (
            "CREATE 0 bytes",
            vec![(CREATE_CRYPTO_SESSION, VERSION_1, vec![], vec![])],
        ),
        (
            "CREATE 631",
            vec![(CREATE_CRYPTO_SESSION, VERSION_1, vec![0; 631], vec![])],
        ),
        (
            "CREATE 633",
            vec![(CREATE_CRYPTO_SESSION, VERSION_1, vec![0; 633], vec![])],
        ),
        (
            "CREATE 1071",
            vec![(CREATE_CRYPTO_SESSION, VERSION_1, vec![0; 1071], vec![])],
        ),
        (
            "CREATE 4096",
            vec![(CREATE_CRYPTO_SESSION, VERSION_1, vec![0; 4096], vec![])],
        ),
        (
            "CREATE 7",
            vec![(CREATE_CRYPTO_SESSION, VERSION_1, vec![0; 7], vec![])],
        ),
        (
            "CREATE with fd",
            vec![(CREATE_CRYPTO_SESSION, VERSION_1, vec![0; 1072], vec![mfd])],
        ),
        (
            "CREATE with REPLY flag",
            vec![(CREATE_CRYPTO_SESSION, VERSION_1 | REPLY, vec![0; 1072], vec![])],
        ),
        (
            "CLOSE 0 bytes NEED_REPLY",
            vec![(27, VERSION_1 | NEED_REPLY, vec![], vec![])],
        ),
        (
            "CLOSE 16 bytes NEED_REPLY",
            vec![(27, VERSION_1 | NEED_REPLY, vec![0; 16], vec![])],
        ),
        (
            "CLOSE with fd NEED_REPLY",
            vec![(27, VERSION_1 | NEED_REPLY, 1u64.to_le_bytes().to_vec(), vec![mfd])],
        ),
        (
            "KICK index 255 nofd",
            vec![(
                SET_VRING_KICK,
                VERSION_1 | NEED_REPLY,
                0x1ffu64.to_le_bytes().to_vec(),
                vec![],
            )],
        ),
        (
            "KICK nofd with fd",
            vec![(
                SET_VRING_KICK,
                VERSION_1 | NEED_REPLY,
                0x100u64.to_le_bytes().to_vec(),
                vec![spare.as_raw_fd()],
            )],
        ),
        (
            "KICK high bits",
            vec![(
                SET_VRING_KICK,
                VERSION_1 | NEED_REPLY,
                (1u64 << 40).to_le_bytes().to_vec(),
                vec![],
            )],
        ),
        (
            "KICK payload 16",
            vec![(SET_VRING_KICK, VERSION_1 | NEED_REPLY, vec![0; 16], vec![])],
        ),
        (
            "KICK payload 4",
            vec![(SET_VRING_KICK, VERSION_1 | NEED_REPLY, vec![0; 4], vec![])],
        ),
        (
            "VRING_NUM payload 4",
            vec![(SET_VRING_NUM, VERSION_1 | NEED_REPLY, vec![0; 4], vec![])],
        ),
        (
            "VRING_NUM payload 12",
            vec![(
                SET_VRING_NUM,
                VERSION_1 | NEED_REPLY,
                {
                    let mut p = vring_state(0, 0);
                    p.extend_from_slice(&[0; 4]);
                    p
                },
                vec![],
            )],
        ),
        (
            "VRING_BASE payload 12 big",
            vec![(
                SET_VRING_BASE,
                VERSION_1 | NEED_REPLY,
                {
                    let mut p = vring_state(0, u32::MAX);
                    p.extend_from_slice(&[0; 4]);
                    p
                },
                vec![],
            )],
        ),
        (
            "VRING_ENABLE index huge",
            vec![(
                SET_VRING_ENABLE,
                VERSION_1 | NEED_REPLY,
                vring_state(u32::MAX, 1),
                vec![],
            )],
        ),
        (
            "GET_VRING_BASE index huge",
            vec![(GET_VRING_BASE, VERSION_1, vring_state(u32::MAX, 0), vec![])],
        ),
        (
            "SET_FEATURES payload 0",
            vec![(SET_FEATURES, VERSION_1 | NEED_REPLY, vec![], vec![])],
        ),
        (
            "SET_PROTOCOL_FEATURES all",
            vec![(
                SET_PROTOCOL_FEATURES,
                VERSION_1 | NEED_REPLY,
                u64::MAX.to_le_bytes().to_vec(),
                vec![],
            )],
        ),
    ];
    for (name, steps) in cases {
        let c = Conn::negotiated(&daemon.sock);
        let mut outs = Vec::new();
        for (req, flags, payload, fds) in steps {
            if let Err(e) = c.send(req, flags, &payload, &fds) {
                outs.push(format!("send: {e}"));
                break;
            }
            c.s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
            let o = outcome_of(&c);
            let stop = o == "disconnect";
            outs.push(o);
            if stop {
                break;
            }
        }
        c.s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        if outs.last().is_none_or(|o| o != "disconnect") {
            let _ = c.send(GET_FEATURES, VERSION_1, &[], &[]);
            outs.push(format!("then GET_FEATURES: {}", outcome_of(&c)));
        }
        drop(c);
        daemon.assert_alive(name);
        report.push(format!("{name}: {}", outs.join("; ")));
    }
    assert_nist(&daemon.sock, "probes");
    eprintln!("{}", report.join("\n"));
}
