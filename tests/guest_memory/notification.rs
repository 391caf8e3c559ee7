// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Notification suppression of `QueueWorker::process` (VIRTIO 1.2 §2.7.7,
//! §2.7.10; docs/PROTOCOL.md §7), on a split ring in real guest memory:
//! one batch per call, `avail_event` and the used ring's flags while
//! polling and after, kicks turned back on when a ring is stopped, and
//! when a batch asks for a used-buffer notification (`used_event` with
//! EVENT_IDX, the avail ring's NO_INTERRUPT flag without).

use crate::common::*;
use vhost_user_crypto::virtq::ring::{vring_need_event, RingAddrs};
use vhost_user_crypto::worker::MAX_BATCH;

/// Pushes `n` baseline encrypt requests (indirect tables, all on the
/// same buffers) without processing them.
fn push_requests(vm: &mut Vm, n: u16) {
    let b = vm.baseline();
    for _ in 0..n {
        let head = vm.indirect(&b);
        vm.push(head);
    }
}

/// Calls `process` until every request pushed is done, and returns how
/// many each call completed. After each call its batch is published and
/// the ring's `used.flags` and `avail_event` are `kicks`.
fn run_one_call_at_a_time(vm: &mut Vm, kicks: (u16, u16)) -> Vec<u32> {
    let mut seen = Vec::new();
    while vm.next_avail != vm.driver.avail_idx() {
        let r = vm.run();
        seen.push(r.completed);
        // Every batch is published before the call returns.
        assert_eq!(vm.used_idx(), vm.next_used);
        assert_eq!(
            (vm.u16_at(vm.ring().used), vm.avail_event()),
            kicks,
            "used.flags, avail_event"
        );
    }
    seen
}

#[test]
fn polling_caller_gets_one_batch_per_call_and_no_kicks() {
    let mut vm = Vm::new();
    push_requests(&mut vm, 200);
    vm.worker.set_polling(true);
    // While polling: no kicks wanted from either kind of driver
    // (VRING_USED_F_NO_NOTIFY, avail_event far ahead).
    let seen = run_one_call_at_a_time(&mut vm, (1, 200u16.wrapping_add(0x8000)));
    assert_eq!(seen, vec![64, 64, 64, 8], "batches of MAX_BATCH = {MAX_BATCH}");
    vm.assert_done(vm.used(199), &NIST_CT);
    // Polling ends: the next call asks for kicks again.
    vm.worker.set_polling(false);
    assert_eq!(vm.run().completed, 0);
    assert_eq!(vm.u16_at(vm.ring().used), 0);
    assert_eq!(vm.avail_event(), 200);
}

/// Not polling: one batch per call too, each ending with kicks on
/// (`used.flags` 0, `avail_event` at the avail index), so that a worker
/// never holds its locks for more than one batch.
#[test]
fn one_batch_per_call_without_polling_too() {
    let mut vm = Vm::new();
    push_requests(&mut vm, 200);
    let seen = run_one_call_at_a_time(&mut vm, (0, 200));
    assert_eq!(seen, vec![64, 64, 64, 8], "batches of MAX_BATCH = {MAX_BATCH}");
    for i in 0..200 {
        assert_eq!(vm.used(i).len, 65);
    }
    vm.assert_done(vm.used(199), &NIST_CT);
}

/// A VM whose worker has just run one polling batch of `n` baseline
/// requests, which turned the driver's kicks off in its ring.
fn after_a_polling_batch(n: u16) -> Vm {
    let mut vm = Vm::new();
    push_requests(&mut vm, n);
    vm.worker.set_polling(true);
    assert_eq!(vm.run().completed, u32::from(n));
    assert_eq!(vm.u16_at(vm.ring().used), 1, "VRING_USED_F_NO_NOTIFY");
    vm
}

/// A ring stopped after a polling batch (GET_VRING_BASE, `stop_vring`):
/// `enable_suppressed_kicks` turns the driver's kicks back on; after a
/// batch that left them on it writes nothing.
#[test]
fn kicks_a_polling_batch_turned_off_are_turned_back_on_when_stopped() {
    let mut vm = after_a_polling_batch(10);
    assert_eq!(vm.avail_event(), 10u16.wrapping_add(0x8000));
    vm.worker.enable_suppressed_kicks(&vm.mem, vm.ring());
    assert_eq!(vm.u16_at(vm.ring().used), 0);
    assert_eq!(vm.avail_event(), 10);

    // Kicks left on (a non-polling batch): nothing to turn on, nothing
    // written (the marks below stay).
    push_requests(&mut vm, 3);
    vm.worker.set_polling(false);
    assert_eq!(vm.run().completed, 3);
    assert_eq!((vm.u16_at(vm.ring().used), vm.avail_event()), (0, 13));
    vm.write(vm.ring().used, &7u16.to_le_bytes());
    vm.worker.enable_suppressed_kicks(&vm.mem, vm.ring());
    assert_eq!(vm.u16_at(vm.ring().used), 7, "nothing written");
}

/// The frontend moves the ring after a polling batch turned the driver's
/// kicks off, without stopping it first, and stops it later: the kicks
/// are turned back on where the ring is now, and the old place, no longer
/// a ring, is left as the guest keeps it. A ring resized in place (same used ring) gets them back in
/// its used ring.
#[test]
fn kicks_turned_off_are_turned_back_on_where_the_ring_is_when_stopped() {
    let mut vm = after_a_polling_batch(10);
    let old = vm.ring();
    let moved = RingAddrs {
        desc: 0x10_0000,
        avail: 0x18_0000,
        used: 0x1A_0000,
        ..old
    };
    vm.move_ring(moved);
    // The new ring as the driver left it: kicks off, avail index 7.
    vm.write(moved.used, &1u16.to_le_bytes());
    vm.write(
        moved.used + 4 + 8 * u64::from(moved.size),
        &0x5A5Au16.to_le_bytes(),
    );
    vm.write(moved.avail + 2, &7u16.to_le_bytes());
    // The guest uses the old used ring's first line for something else.
    vm.write(old.used, &[0x5A; 64]);
    vm.worker.enable_suppressed_kicks(&vm.mem, moved);
    assert_eq!(vm.u16_at(moved.used), 0, "kicks on in the ring as it is now");
    assert_eq!(vm.avail_event(), 7, "avail_event at the new ring's avail index");
    assert_eq!(
        vm.read(old.used, 64),
        [0x5A; 64],
        "nothing written at the old place"
    );

    // Resized in place: the same used ring, half the entries.
    let mut vm = after_a_polling_batch(10);
    let half = RingAddrs {
        size: vm.ring().size / 2,
        ..vm.ring()
    };
    vm.resize_in_place(half);
    vm.worker.enable_suppressed_kicks(&vm.mem, half);
    assert_eq!(vm.u16_at(half.used), 0, "kicks on in the used ring that stayed");
    assert_eq!(
        vm.avail_event(),
        10,
        "avail_event after the resized ring's entries"
    );
}

#[test]
fn notify_follows_used_event_with_event_idx() {
    let mut vm = Vm::new();
    vm.worker.event_idx = true;
    let used_event_at = vm.ring().avail + 4 + 2 * u64::from(vm.ring().size);
    // used_event = 0: the driver wants to hear about used entry 0.
    vm.write(used_event_at, &0u16.to_le_bytes());
    push_requests(&mut vm, 3);
    assert!(vm.run().notify, "batch 0..3 crosses used_event 0");
    // used_event left at 0 (the driver is busy): the next batch is not notified.
    push_requests(&mut vm, 3);
    assert!(!vm.run().notify, "batch 3..6 does not cross used_event 0");
    // The driver asks about entry 7; a batch of 2 (6..8) crosses it.
    vm.write(used_event_at, &7u16.to_le_bytes());
    push_requests(&mut vm, 2);
    assert!(vm.run().notify);
    // An empty call never notifies.
    assert!(!vm.run().notify);
    // The flag is ignored with EVENT_IDX.
    vm.write(vm.ring().avail, &1u16.to_le_bytes());
    vm.write(used_event_at, &8u16.to_le_bytes());
    push_requests(&mut vm, 1);
    assert!(vm.run().notify);
}

#[test]
fn notify_follows_the_no_interrupt_flag_without_event_idx() {
    let mut vm = Vm::new();
    push_requests(&mut vm, 2);
    assert!(vm.run().notify, "flags 0: notify");
    vm.write(vm.ring().avail, &1u16.to_le_bytes()); // VRING_AVAIL_F_NO_INTERRUPT
    push_requests(&mut vm, 2);
    assert!(!vm.run().notify, "NO_INTERRUPT: no notification");
    // used_event is not looked at without EVENT_IDX.
    vm.write(vm.ring().avail, &0u16.to_le_bytes());
    vm.write(
        vm.ring().avail + 4 + 2 * u64::from(vm.ring().size),
        &1000u16.to_le_bytes(),
    );
    push_requests(&mut vm, 2);
    assert!(vm.run().notify);
}

#[test]
fn vring_need_event_matches_the_spec_formula() {
    // (u16)(new - event - 1) < (u16)(new - old), VIRTIO 1.2 §2.7.7.2.
    assert!(vring_need_event(0, 1, 0));
    assert!(vring_need_event(5, 8, 3));
    assert!(!vring_need_event(8, 8, 3), "event not yet reached");
    assert!(!vring_need_event(2, 8, 3), "event already passed before old");
    assert!(vring_need_event(65535, 2, 65534), "across the wrap");
    assert!(!vring_need_event(0x8005, 10, 5), "event half the space ahead");
}
