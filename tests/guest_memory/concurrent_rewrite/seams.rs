// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Rewrites at the library's seams, deterministically: the chain is walked
//! ([`ChainWalker::walk`]) in state X, then every descriptor and indirect
//! table entry is rewritten before the request is validated and run
//! ([`prepare`]); and a validated encrypt or decrypt request waiting as a
//! lane ([`Prepared::Lane`]) has its header, IV and descriptors rewritten
//! before [`run_lanes`] executes it. Both must act on X exactly.

use super::model::MEM;
use crate::common::*;
use vhost_crypto_replay::driver_ring::{Descriptor, DESC_SIZE, F_INDIRECT, F_NEXT, F_WRITE};
use vhost_user_crypto::crypto::{prepare, run_lanes, Completion, LaneReq, Prepared, RequestLimits};
use vhost_user_crypto::virtq::descriptor::ChainWalker;
use vhost_user_crypto::virtq::map_contiguous;
use vhost_user_crypto::wire::virtio_crypto::{OpDataReq, Status};

const X: u64 = 0x10000;
/// Where the rewritten descriptors point (all canary, must stay so).
const Y: u64 = 0x40000;
const Y_BYTES: usize = 0x10000;
const Y_TABLE: u64 = 0x60000;
const LIMITS: RequestLimits = RequestLimits {
    max_request_bytes: 1 << 20,
};

/// Rewrites `n` descriptors of the table at `table` (ring-relative `next`
/// from `first`): every one device-writable, 4 KiB, into Y, chained on.
fn rewrite_to_y(vm: &Vm, table: u64, first: u16, n: u16) {
    for k in 0..n {
        let last = k + 1 == n;
        vm.put_desc(
            table,
            first + k,
            Descriptor::new(
                Y + u64::from(k) * 0x1000,
                0x1000,
                F_WRITE | if last { 0 } else { F_NEXT },
                first + k + 1,
            ),
        );
    }
}

/// Stages the baseline request at X (direct or indirect), fills Y with
/// the canary and walks the chain in this initial state.
fn stage_and_walk(vm: &mut Vm, h: &OpDataReq, src: &[u8], indirect: bool) -> (ChainWalker, u16) {
    let bufs = vm.stage_at(X, h, src);
    vm.fill(Y, Y_BYTES, CANARY);
    let head = if indirect {
        vm.indirect(&bufs)
    } else {
        vm.chain(&bufs)
    };
    let table = map_contiguous(&vm.mem, vm.ring().desc, usize::from(QSIZE) * DESC_SIZE).unwrap();
    let mut walker = ChainWalker::new();
    // SAFETY: `table` maps the ring's whole descriptor table (QSIZE
    // entries) in `vm.mem`, which outlives every use of the walker.
    unsafe { walker.walk(&vm.mem, table, QSIZE, head) };
    (walker, head)
}

/// Rewrites every descriptor of the request at `head`, its indirect table
/// and the ring descriptor pointing at it: all of them device-writable
/// buffers in Y.
fn rewrite_descriptors(vm: &Vm, head: u16, indirect: bool) {
    if indirect {
        rewrite_to_y(vm, INDIRECT_BASE, 0, 5);
        rewrite_to_y(vm, Y_TABLE, 0, 8);
        vm.set_desc(head, Descriptor::new(Y_TABLE, 8 * 16, F_INDIRECT, 0));
    } else {
        rewrite_to_y(vm, vm.ring().desc, head, 5);
    }
}

/// Runs `lane` on its own and returns its completion.
fn run_alone(lane: LaneReq<'_>) -> Completion {
    let mut lanes = [Some(lane)];
    run_lanes(&mut lanes);
    lanes[0].as_ref().expect("the lane").completion()
}

/// Asserts that the 64-byte request at X completed OK with `output` (what
/// X held when it was walked) and that nothing in Y was written.
#[track_caller]
fn assert_done_as_staged(vm: &Vm, c: Completion, output: &[u8], ctx: &str) {
    assert_eq!(
        c,
        Completion {
            used_len: 65,
            status: Some(Status::Ok),
            work: 64,
            src_len: 64,
        },
        "{ctx}"
    );
    vm.assert_done_at(
        X,
        Used {
            id: 0,
            len: c.used_len,
        },
        output,
    );
    vm.assert_canary(Y, Y_BYTES);
}

#[test]
fn descriptors_rewritten_after_the_walk_are_never_read_again() {
    for indirect in [false, true] {
        for (opcode, session, input, output, lane) in [
            (ENCRYPT, E, NIST_PT, NIST_CT, true),
            (ENCRYPT, E, NIST_PT, NIST_CT, false),
            (DECRYPT, D, NIST_CT, NIST_PT, true),
            (DECRYPT, D, NIST_CT, NIST_PT, false),
        ] {
            let ctx = format!("indirect {indirect}, opcode {opcode}, lane {lane}");
            let mut vm = Vm::with_ranges(&[(0, MEM)]);
            let (walker, head) = stage_and_walk(&mut vm, &hdr(opcode, session, 64, 64), &input, indirect);
            rewrite_descriptors(&vm, head, indirect);
            let c = {
                let sessions = vm.worker.sessions.lock();
                // (A valid contiguous 64-byte request of either direction
                // is a lane when lanes are allowed.)
                match (prepare(&walker, &sessions, LIMITS, lane), lane) {
                    (Prepared::Done(c), false) => c,
                    (Prepared::Lane(l), true) => run_alone(l),
                    (p, _) => panic!("{ctx}: {p:?}"),
                }
            };
            assert_done_as_staged(&vm, c, &output, &ctx);
        }
    }
}

#[test]
fn header_iv_and_descriptors_rewritten_after_validation_are_never_read_again() {
    // (Each rewritten to the other direction.)
    for (opcode, session, input, output, other, other_session) in [
        (ENCRYPT, E, NIST_PT, NIST_CT, DECRYPT, D),
        (DECRYPT, D, NIST_CT, NIST_PT, ENCRYPT, E),
    ] {
        for indirect in [false, true] {
            let ctx = format!("opcode {opcode}, indirect {indirect}");
            let mut vm = Vm::with_ranges(&[(0, MEM)]);
            let (walker, head) = stage_and_walk(&mut vm, &hdr(opcode, session, 64, 64), &input, indirect);
            let sessions = vm.worker.sessions.lock();
            // Validated, waiting to be run with other requests of its key.
            let lane = match prepare(&walker, &sessions, LIMITS, true) {
                Prepared::Lane(l) => l,
                Prepared::Done(c) => panic!("{ctx}: a valid contiguous 64-byte request is a lane: {c:?}"),
            };
            // The guest now rewrites the header (longer lengths, another IV
            // length, opcode, session and op_type), the IV and every
            // descriptor.
            rewrite_descriptors(&vm, head, indirect);
            let mut h = hdr(other, other_session, 0x800, 0x800);
            h.iv_len = 8;
            h.op_type = 2;
            vm.write(X, &h.to_bytes());
            vm.write(Addrs::at(X).iv, &[0xFF; 16]);
            let c = run_alone(lane);
            drop(sessions);
            // NIST F.2.1 / F.2.2 with the IV and length validated: the
            // snapshot.
            assert_done_as_staged(&vm, c, &output, &ctx);
        }
    }
}
