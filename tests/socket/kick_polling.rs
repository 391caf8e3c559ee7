// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A data ring started with `SET_VRING_KICK` carrying
//! `VHOST_USER_VRING_NOFD_MASK` (no kick eventfd): the vhost-user spec
//! (QEMU `docs/interop/vhost-user.rst`, "VHOST_USER_SET_VRING_KICK") says
//! polling is then used instead of waiting for kicks. The daemon polls
//! the ring (docs/PROTOCOL.md §7) until a kick eventfd comes, and logs
//! that once.

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use crate::common::*;
use crate::support::*;
use vhost_crypto_replay::driver_ring::DriverRing;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// How long a request placed without a kick may take on a polled ring
/// (the poll period is 1 ms; wide for a busy machine).
const POLLED_WITHIN: Duration = Duration::from_secs(2);

/// Places NIST F.2.1 request `n` of data ring 0 (head 0, buffers at
/// [`RAW_HDR`]) and publishes it, without a kick.
fn place(mem: &std::fs::File, sid: u64, n: u16) {
    let bufs = put_nist_buffers(mem, sid, RAW_HDR, 0x1000);
    let mut driver = DriverRing::new(raw_split_ring(RAW_DESC), n - 1);
    driver.write_chain(&FileMem(mem), 0, &bufs);
    driver.push(&FileMem(mem), 0);
    driver.publish(&FileMem(mem));
}

/// Whether `used.idx` reaches `n` within `limit`.
fn used_within(mem: &std::fs::File, n: u16, limit: Duration) -> bool {
    let start = Instant::now();
    while used_idx_at(mem, RAW_DESC) != n {
        if start.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    true
}

#[test]
fn a_ring_without_a_kick_eventfd_is_polled_until_one_comes() {
    let mut daemon = Daemon::spawn_logged(&[], "info");
    let c = Conn::negotiated(&daemon.sock);
    let mem = memfd(MEM_SIZE);
    let call = EventFd::new(EFD_NONBLOCK).unwrap();
    set_mem_table(&c, &mem, &[(0, MEM_SIZE, UADDR, 0)]);
    let addr = vring_addr(
        0,
        UADDR + RAW_DESC,
        UADDR + RAW_DESC + 0x2000,
        UADDR + RAW_DESC + 0x1000,
    );
    let nofd = VRING_NOFD_MASK.to_le_bytes().to_vec();
    let ring0 = 0u64.to_le_bytes().to_vec();
    for (req, payload, fds) in [
        (SET_VRING_NUM, vring_state(0, 256), vec![]),
        (SET_VRING_BASE, vring_state(0, 0), vec![]),
        (SET_VRING_ADDR, addr, vec![]),
        (SET_VRING_KICK, nofd, vec![]),
        (SET_VRING_CALL, ring0.clone(), vec![call.as_raw_fd()]),
    ] {
        c.send(req, VERSION_1 | NEED_REPLY, &payload, &fds).unwrap();
        assert_eq!(c.reply_u64(req), 0, "request {req}");
    }
    let sid = create_nist_session(&c);

    // Requests placed without any kick are served, one after the other
    // (the ring empty in between), with a used-buffer notification each.
    for n in 1..=3u16 {
        place(&mem, sid, n);
        assert!(
            used_within(&mem, n, POLLED_WITHIN),
            "request {n} on the polled ring not served within {POLLED_WITHIN:?}"
        );
        assert_raw_nist_ok(n, raw_nist_result(&mem, n));
        await_call(&call, &format!("for request {n}"));
    }
    daemon.until_logged("has no kick eventfd", TIMEOUT, "the polled ring logged");
    assert_eq!(
        daemon.log_tail(1 << 20).matches("has no kick eventfd").count(),
        1,
        "logged once"
    );

    // A kick eventfd ends the polling: a request is served at its kick,
    // and one placed without a kick waits for the next kick.
    let kick = EventFd::new(EFD_NONBLOCK).unwrap();
    c.send(
        SET_VRING_KICK,
        VERSION_1 | NEED_REPLY,
        &ring0,
        &[kick.as_raw_fd()],
    )
    .unwrap();
    assert_eq!(c.reply_u64(SET_VRING_KICK), 0, "SET_VRING_KICK with an eventfd");
    place(&mem, sid, 4);
    kick.write(1).unwrap();
    assert!(used_within(&mem, 4, TIMEOUT), "request 4 not served at its kick");
    assert_raw_nist_ok(4, raw_nist_result(&mem, 4));
    std::thread::sleep(Duration::from_millis(50));
    place(&mem, sid, 5);
    assert!(
        !used_within(&mem, 5, Duration::from_millis(300)),
        "request 5 served without a kick: the ring is still polled"
    );
    kick.write(1).unwrap();
    assert!(used_within(&mem, 5, TIMEOUT), "request 5 not served at its kick");
    assert_raw_nist_ok(5, raw_nist_result(&mem, 5));
    drop(c);
    daemon.assert_alive("a ring polled for want of a kick eventfd");
}
