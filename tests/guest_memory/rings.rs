// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The rings themselves (VIRTIO 1.2 §2.7): an avail index that jumps past
//! the queue size stops the queue (H10), ring addresses and sizes no split
//! ring has complete nothing and do not panic, and a ring outside the
//! memory map is served again once a memory map holds it. The same ring
//! fields sent over the socket (H16) are the socket suite's.

use std::time::{Duration, Instant};

use crate::common::*;
use vhost_user_crypto::crypto::RequestLimits;
use vhost_user_crypto::virtq::ring::RingAddrs;
use vhost_user_crypto::worker::QueueWorker;

#[test]
fn h10_avail_index_jump_stops_the_queue() {
    let mut vm = Vm::build(&[(0, 256 << 20)], 2);
    let b = vm.baseline();
    let head = vm.chain(&b);
    vm.write(RING_AVAIL + 4, &head.to_le_bytes());
    vm.fill(RING_USED + 4, 8 * usize::from(QSIZE) + 2, CANARY);
    vm.set_avail_idx(1000);
    let r = vm.run_within(Duration::from_millis(100));
    assert_eq!(r.completed, 0);
    assert_eq!((vm.next_avail, vm.next_used), (0, 0));
    assert_eq!(vm.used_idx(), 0);
    vm.assert_canary(RING_USED + 4, 8 * usize::from(QSIZE) + 2);
    vm.assert_canary(DST, DST_AREA);
    vm.assert_canary(STATUS, STATUS_AREA);

    // Kicked again and again: nothing, and no busy loop.
    let t = Instant::now();
    for _ in 0..10_000 {
        assert_eq!(vm.run().completed, 0);
    }
    assert!(t.elapsed() < Duration::from_millis(500), "took {:?}", t.elapsed());
    // Even once the index looks sane again the stopped queue completes nothing
    // (no double completion).
    vm.set_avail_idx(1);
    assert_eq!(vm.run().completed, 0);
    assert_eq!(vm.used_idx(), 0);
    vm.assert_canary(DST, DST_AREA);

    // Boundary: exactly `size` ahead is legal, `size + 1` is not.
    let mut vm2 = Vm::new();
    let b = vm2.baseline();
    for _ in 0..256 {
        let head = vm2.indirect(&b);
        vm2.push(head);
    }
    let used = vm2.run_batch();
    assert!(used.iter().all(|u| u.len == 65));
    vm2.assert_done(used[255], &NIST_CT);
    vm2.set_avail_idx(vm2.next_avail.wrapping_add(257));
    assert_eq!(vm2.run().completed, 0);
    assert_eq!(vm2.next_avail, 256);

    // Another queue (another worker, another ring) is unaffected.
    let limits = RequestLimits {
        max_request_bytes: 1 << 20,
    };
    let other = QueueWorker::new(vm.spare_tables.remove(0), limits);
    let stopped = std::mem::replace(&mut vm.worker, other);
    vm.move_ring(RingAddrs {
        size: QSIZE,
        desc: 0x5000,
        avail: 0x6000,
        used: 0x7000,
    });
    let b = vm.baseline();
    let u = vm.submit(&b);
    vm.assert_done(u, &NIST_CT);
    // The stopped worker serves a ring the frontend sets up anew.
    vm.worker = stopped;
    vm.move_ring(RingAddrs {
        size: QSIZE,
        desc: 0x8000,
        avail: 0x9000,
        used: 0xA000,
    });
    let b = vm.baseline();
    let u = vm.submit(&b);
    vm.assert_done(u, &NIST_CT);
}

/// H10 neighbour: a request whose dst is the avail ring's header, so the
/// device's own output moves the avail index past the queue size while
/// the batch runs. The chain completed is notified (the driver did not
/// set NO_INTERRUPT: bit 0 of the flags the output wrote is 0), and the
/// next call sees the jump and stops the queue, as in H10.
#[test]
fn h10_avail_index_jump_after_a_batch_still_notifies_it() {
    let mut vm = Vm::new();
    // A 16-byte plaintext whose ciphertext, written over avail.flags and
    // avail.idx, leaves NO_INTERRUPT clear and the index more than a ring
    // ahead of 1 (the ciphertext comes from OpenSSL).
    let (src, ct) = (0u8..=255)
        .map(|k| ([k; 16], oracle(true, &NIST_KEY, &NIST_IV, &[k; 16])))
        .find(|(_, ct)| ct[0] & 1 == 0 && u16::from_le_bytes([ct[2], ct[3]]).wrapping_sub(1) > QSIZE)
        .expect("a plaintext with that ciphertext");
    let a = Addrs::at(HDR);
    vm.write(a.hdr, &hdr(ENCRYPT, E, 16, 16).to_bytes());
    vm.write(a.iv, &NIST_IV);
    vm.write(a.src, &src);
    vm.fill(a.status, STATUS_AREA, CANARY);
    let head = vm.chain(&[
        r(a.hdr, 72),
        r(a.iv, 16),
        r(a.src, 16),
        w(RING_AVAIL, 16),
        w(a.status, 1),
    ]);
    vm.push(head);
    let res = vm.run_within(Duration::from_millis(100));
    assert_eq!(vm.read(RING_AVAIL, 16), ct, "dst written over the avail ring");
    assert_eq!((res.completed, res.notify), (1, true));
    assert_eq!(vm.used_idx(), 1);
    assert_eq!(vm.used(0).id, u32::from(head));
    assert_eq!(vm.used(0).len, 17);
    assert_eq!(vm.byte(a.status), OK);
    // The next call sees the jump: stopped.
    assert_eq!(vm.run().completed, 0);
    assert_eq!((vm.next_avail, vm.next_used), (1, 1));
    // Nothing more, whatever the index says now: a well-formed request
    // pushed at avail index 1 is not served.
    vm.write(RING_AVAIL, &[0, 0]);
    let b = vm.baseline();
    let head = vm.chain(&b);
    vm.driver.set_avail_idx(1);
    vm.push(head);
    assert_eq!(vm.run().completed, 0);
    assert_eq!(vm.used_idx(), 1);
    vm.assert_canary(DST, DST_AREA);
}

#[test]
fn bad_ring_geometry_completes_nothing_and_does_not_panic() {
    let mut vm = Vm::new();
    let b = vm.baseline();
    let head = vm.chain(&b);
    vm.push(head);
    let ram_end = 256 * MIB;
    let ok = vm.ring();
    let rings = [
        RingAddrs { size: 0, ..ok },
        RingAddrs { size: 3, ..ok },
        RingAddrs { size: 65535, ..ok },
        RingAddrs { size: 384, ..ok },
        RingAddrs {
            desc: ok.desc + 8,
            ..ok
        },
        RingAddrs {
            avail: ok.avail + 1,
            ..ok
        },
        RingAddrs {
            used: ok.used + 2,
            ..ok
        },
        RingAddrs {
            desc: ram_end - 0x800,
            ..ok
        },
        RingAddrs {
            avail: ram_end - 0x100,
            ..ok
        },
        RingAddrs {
            used: ram_end - 0x400,
            ..ok
        },
        RingAddrs {
            avail: u64::MAX - 1,
            ..ok
        },
        RingAddrs {
            used: u64::MAX - 3,
            ..ok
        },
        RingAddrs {
            size: 32768,
            desc: ram_end - 0x1000,
            ..ok
        },
    ];
    for ring in rings {
        let (mut na, mut nu) = (0u16, 0u16);
        let r = vm.worker.process(&vm.mem, ring, &mut na, &mut nu);
        assert_eq!((r.completed, na, nu), (0, 0, 0), "{ring:?}");
    }
    assert_eq!(vm.used_idx(), 0);
    vm.assert_canary(DST, DST_AREA);
    // The well-formed ring is then served.
    let used = vm.run_batch();
    vm.assert_done(used[0], &NIST_CT);
}

#[test]
fn ring_in_a_region_with_an_odd_guest_start() {
    // Region 2 starts at an odd GPA: an aligned GPA there is a misaligned
    // host address. Data buffers may live there; rings are refused.
    let odd = 0x10_0001;
    let mut vm = Vm::with_ranges(&[(0, 1 << 20), (odd, 1 << 20)]);
    let base = 0x11_0000;
    let b = vm.stage_at(base, &hdr(ENCRYPT, E, 64, 64), &NIST_PT);
    let u = vm.submit(&b);
    vm.assert_done_at(base, u, &NIST_CT);

    vm.move_ring(RingAddrs {
        size: QSIZE,
        desc: 0x18_0000,
        avail: 0x18_2000,
        used: 0x18_4000,
    });
    let b = vm.stage_at(base, &hdr(ENCRYPT, E, 64, 64), &NIST_PT);
    let head = vm.chain(&b);
    vm.push(head);
    let r = vm.run();
    assert_eq!((r.completed, vm.next_avail), (0, 0));
    assert_eq!(vm.used_idx(), 0);
    vm.assert_canary(Addrs::at(base).dst, DST_AREA);
}

/// A ring whose memory a memory table leaves out (the frontend's
/// SET_MEM_TABLE, then a corrected one): nothing is served while it does
/// not map, and once a memory map holds it again the ring is served as
/// usual: a ring outside the map is not a reason to stop the queue until
/// the frontend stops the ring or moves it.
#[test]
fn a_ring_whose_memory_comes_back_is_served_again() {
    let mut vm = Vm::new();
    let b = vm.baseline();
    let head = vm.indirect(&b);
    vm.push(head);
    // Guest memory without the ring (which lies in the first MiB).
    let without =
        vm_memory::GuestMemoryMmap::<()>::from_ranges(&[(vm_memory::GuestAddress(1 << 20), 1 << 20)])
            .unwrap();
    for _ in 0..3 {
        let (mut na, mut nu) = (0u16, 0u16);
        let r = vm.worker.process(&without, vm.ring(), &mut na, &mut nu);
        assert_eq!((r.completed, na, nu), (0, 0, 0));
    }
    assert_eq!(vm.used_idx(), 0);
    vm.assert_canary(DST, DST_AREA);
    let used = vm.run_batch();
    assert_eq!(used.len(), 1);
    vm.assert_done(used[0], &NIST_CT);
}
