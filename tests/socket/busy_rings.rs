// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A guest that keeps its ring busy while the frontend sends control
//! messages, stops, moves or disables the ring: one batch per lock, so
//! control messages are answered within a bound, and a stopped ring has
//! the driver's kicks on again where it is now (docs/PROTOCOL.md §7).

use std::time::{Duration, Instant};

use crate::common::*;
use crate::support::*;

/// GET_VRING_BASE and CREATE while the guest keeps a ring of 1 MiB
/// requests busy, with and without polling. std's locks are not fair: a
/// worker that took its locks back right after each batch would starve
/// the library's thread (GET_VRING_BASE answered after seconds, or not
/// within a minute with `--poll-us 0`) and a CREATE, which waits for the
/// queue's session table. The worker takes its locks for one batch at a
/// time and stays off them for a moment every 10 ms of busy work, so each
/// is answered within the bound below (tens of milliseconds here). A ring
/// stopped while the worker polled it is left with the driver's kicks on.
#[test]
fn control_messages_are_answered_while_the_guest_keeps_a_ring_of_large_requests_busy() {
    use std::os::unix::fs::FileExt;
    const BOUND: Duration = Duration::from_millis(1000);
    for poll in ["0", "50"] {
        for get_base in [false, true] {
            let mut r = BusyRing::start_with(&["--poll-us", poll], 1 << 20);
            // (Measured while requests are being served.)
            let until = Instant::now() + TIMEOUT;
            let first = r.used_idx();
            while r.used_idx() == first && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(1));
            }
            assert_ne!(
                r.used_idx(),
                first,
                "--poll-us {poll}: the guest's requests are served"
            );
            let t = Instant::now();
            let what = if get_base {
                r.conn()
                    .send(GET_VRING_BASE, VERSION_1, &vring_state(0, 0), &[])
                    .unwrap();
                let got = r.conn().recv();
                assert!(
                    matches!(got, Got::Msg(GET_VRING_BASE, ..)),
                    "--poll-us {poll}: GET_VRING_BASE: {got:?}"
                );
                "GET_VRING_BASE"
            } else {
                create_nist_session(r.conn());
                "CREATE_CRYPTO_SESSION"
            };
            let took = t.elapsed();
            r.stop_guest();
            eprintln!("--poll-us {poll}: {what} answered after {took:?}");
            assert!(
                took < BOUND,
                "--poll-us {poll}: {what} answered only after {took:?}"
            );
            if get_base {
                // The worker, polling, had the driver's kicks off: the
                // stopped ring has them on again (used.flags 0, avail_event
                // at the avail index the worker saw, which the guest may
                // have moved on since, by less than the ring), or whoever
                // serves it next would never be kicked. (Kicks left off
                // put avail_event 0x8000 ahead.)
                let mut b = [0u8; 2];
                r.mem.read_exact_at(&mut b, RAW_DESC + 0x1000 + 2).unwrap();
                let avail = u16::from_le_bytes(b);
                r.mem.read_exact_at(&mut b, RAW_USED + 4 + 8 * 256).unwrap();
                let avail_event = u16::from_le_bytes(b);
                let flags = ring0_used_u16(&r.mem, 0);
                assert!(
                    flags == 0 && avail.wrapping_sub(avail_event) <= 256,
                    "--poll-us {poll}: after GET_VRING_BASE used.flags {flags}, avail_event {avail_event}, avail {avail}"
                );
            }
            r.finish(what);
        }
    }
}

/// GET_VRING_BASE while the guest keeps ring 0 busy: the reply comes
/// (within a batch, not when the guest stops sending), and once it is
/// back the ring is no longer served.
#[test]
fn get_vring_base_is_answered_while_the_guest_keeps_the_ring_busy() {
    let mut r = BusyRing::start();
    r.conn()
        .send(GET_VRING_BASE, VERSION_1, &vring_state(0, 0), &[])
        .unwrap();
    let got = r.conn().recv();
    let u1 = r.used_idx();
    std::thread::sleep(Duration::from_millis(100));
    let u2 = r.used_idx();
    r.stop_guest();
    let Got::Msg(GET_VRING_BASE, _, p) = got else {
        panic!("GET_VRING_BASE not answered while the guest keeps the ring busy: {got:?}");
    };
    eprintln!("GET_VRING_BASE: {p:?}; used.idx {u1}, then {u2}");
    assert!(u1 > 0, "the busy guest's requests were served");
    assert_eq!(
        p,
        vring_state(0, u32::from(u1)),
        "the base is where the used ring stopped"
    );
    assert_eq!(u2, u1, "the ring is still served after GET_VRING_BASE");
    r.finish("GET_VRING_BASE under a busy ring");
}

/// The frontend moves a running ring (SET_VRING_ADDR, no GET_VRING_BASE
/// first) while the worker polls it with the driver's kicks turned off, to
/// a place whose avail index is far ahead (the new ring is stopped at
/// once, H10), and the guest reuses the old ring's used page. Turning the
/// kicks back on at the old place would write used.flags and avail_event
/// into memory that is no longer a ring (two and two bytes of the old used
/// page); the stop turns them back on where the ring is at that moment, so
/// the GET_VRING_BASE writes nothing at the old place.
#[test]
fn a_ring_moved_while_polled_is_not_written_at_its_old_place_when_stopped() {
    use std::os::unix::fs::FileExt;
    // Waits for the worker to stop a ring for H10 (logged).
    let until_h10 = |r: &BusyRing, what: &str| r.daemon.until_logged("data queue stopped", TIMEOUT, what);
    // Stops the ring and checks the old used page, which the guest filled
    // with 0x5A, is as the guest left it.
    let stop_and_check_old_page = |r: &BusyRing, what: &str| {
        r.conn()
            .send(GET_VRING_BASE, VERSION_1, &vring_state(0, 0), &[])
            .unwrap();
        let got = r.conn().recv();
        assert!(
            matches!(got, Got::Msg(GET_VRING_BASE, _, _)),
            "{what}: GET_VRING_BASE not answered: {got:?}"
        );
        let mut page = vec![0u8; 0x1000];
        r.mem.read_exact_at(&mut page, RAW_USED).unwrap();
        let written: Vec<(u64, u8)> = page
            .iter()
            .enumerate()
            .filter(|&(_, &b)| b != 0x5A)
            .map(|(i, &b)| (RAW_USED + i as u64, b))
            .collect();
        assert!(
            written.is_empty(),
            "{what}: stopping it wrote into its old used page: {written:x?}"
        );
    };
    let mut r = BusyRing::start();
    // The new place: avail at +0x1000 with an index 40,000 ahead of the
    // ring's, used at +0x2000.
    const NEW: u64 = 0xC0000;
    r.mem
        .write_all_at(&40000u16.to_le_bytes(), NEW + 0x1000 + 2)
        .unwrap();
    r.mem.write_all_at(&0u16.to_le_bytes(), NEW + 0x2000 + 2).unwrap();
    let addr = vring_addr(0, UADDR + NEW, UADDR + NEW + 0x2000, UADDR + NEW + 0x1000);
    r.conn()
        .send(SET_VRING_ADDR, VERSION_1 | NEED_REPLY, &addr, &[])
        .unwrap();
    assert_eq!(r.conn().reply_u64(SET_VRING_ADDR), 0, "SET_VRING_ADDR");
    // The worker was polling the busy ring with the driver's kicks off
    // (without them off there would be nothing to turn back on).
    assert_eq!(
        ring0_used_u16(&r.mem, 0),
        1,
        "VRING_USED_F_NO_NOTIFY in the old used ring"
    );
    r.stop_guest();
    // The worker has looked at the new place once H10 is logged.
    until_h10(&r, "the new place was not looked at");
    // The guest uses the old used page for something else.
    r.mem.write_all_at(&[0x5A; 0x1000], RAW_USED).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    stop_and_check_old_page(&r, "the moved ring");
    r.finish("a ring moved while polled, then stopped");

    // The worker need not look at the new place before the stop at all:
    // here the old ring is stopped by H10 right after a polling batch (the
    // guest's avail index jumps), so its worker waits for kicks with the
    // kicks it turned off still off, and nothing wakes it between the
    // move and the stop. (Requests of 1 MiB: the ring is still being
    // served when the jump is written, so the worker still polls it.)
    let mut r = BusyRing::start_with(&[], 1 << 20);
    r.stop_guest();
    let jump = r.used_idx().wrapping_add(40000);
    r.mem.write_all_at(&jump.to_le_bytes(), RAW_AVAIL + 2).unwrap();
    until_h10(&r, "the jump was not seen");
    assert_eq!(
        ring0_used_u16(&r.mem, 0),
        1,
        "kicks still off in the stopped ring"
    );
    r.mem.write_all_at(&[0x5A; 0x1000], RAW_USED).unwrap();
    // The new place's used ring with the kicks off, as the driver may
    // have left it.
    r.mem.write_all_at(&1u16.to_le_bytes(), NEW + 0x2000).unwrap();
    r.conn()
        .send(SET_VRING_ADDR, VERSION_1 | NEED_REPLY, &addr, &[])
        .unwrap();
    assert_eq!(r.conn().reply_u64(SET_VRING_ADDR), 0, "SET_VRING_ADDR");
    stop_and_check_old_page(&r, "a ring moved while its worker waited");
    let mut flags = [0u8; 2];
    r.mem.read_exact_at(&mut flags, NEW + 0x2000).unwrap();
    assert_eq!(
        u16::from_le_bytes(flags),
        0,
        "kicks back on where the ring is now"
    );
    r.finish("a ring moved while its worker waited, then stopped");
}

/// SET_VRING_ENABLE(0, 0) while the guest keeps ring 0 busy: acked, and
/// from then on the ring is not served, with the driver's kicks turned
/// back on in guest memory (the worker had them off while polling); once
/// enabled again (the guest still kicking), it is served again.
#[test]
fn a_ring_disabled_while_busy_stops_and_comes_back() {
    let mut r = BusyRing::start();
    let c = r.conn();
    c.send(SET_VRING_ENABLE, VERSION_1 | NEED_REPLY, &vring_state(0, 0), &[])
        .unwrap();
    assert_eq!(c.reply_u64(SET_VRING_ENABLE), 0, "SET_VRING_ENABLE(0, 0) ack");
    // The batch running when the message came may still complete.
    std::thread::sleep(Duration::from_millis(50));
    let u1 = r.used_idx();
    std::thread::sleep(Duration::from_millis(100));
    let (u2, flags) = (r.used_idx(), ring0_used_u16(&r.mem, 0));
    c.send(SET_VRING_ENABLE, VERSION_1 | NEED_REPLY, &vring_state(0, 1), &[])
        .unwrap();
    assert_eq!(c.reply_u64(SET_VRING_ENABLE), 0, "SET_VRING_ENABLE(0, 1) ack");
    std::thread::sleep(Duration::from_millis(100));
    let u3 = r.used_idx();
    r.stop_guest();
    eprintln!("used.idx {u1} after the disable, {u2} 100 ms later (flags {flags:#x}), {u3} after the enable");
    assert!(u1 > 0, "the busy guest's requests were served");
    assert_eq!(u2, u1, "a disabled ring is still served");
    assert_eq!(flags, 0, "kicks left suppressed on a disabled ring");
    assert!(u3 != u2, "the ring is not served again once enabled");
    r.finish("ring disabled and enabled under a busy guest");
}
