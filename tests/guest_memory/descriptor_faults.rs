// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Descriptor chains a hostile guest builds (docs/PROTOCOL.md §5.3, the
//! hostile-guest cases of docs/RELIABILITY.md): loops and bad `next`
//! indices (H09), chains without a writable status byte (H11), length sums
//! that overflow (H12), ranges outside guest memory (H13), zero-length
//! descriptors (H17) and bad indirect tables. Each is consumed (used
//! length 0) or fails with ERR where a status byte is reachable, and the
//! next chain is served.

use std::time::{Duration, Instant};

use super::descriptor_layouts::WILD;
use crate::common::*;
use vhost_crypto_replay::driver_ring::{Descriptor, F_INDIRECT, F_NEXT, F_WRITE};
use vhost_user_crypto::virtq::ring::RingAddrs;

#[test]
fn h09_descriptor_loop_and_bad_next() {
    let mut vm = Vm::new();
    let b = vm.baseline();
    let nd = Descriptor::new;
    const N: u16 = F_NEXT;
    const WR: u16 = F_WRITE;

    // D1.next -> D0, no writable descriptor: consumed.
    vm.set_desc(0, nd(HDR, 72, N, 1));
    vm.set_desc(1, nd(IV_ADDR, 16, N, 0));
    // next = 300 on a 256 queue, no writable descriptor: consumed.
    vm.set_desc(2, nd(HDR, 72, N, 300));
    // next = 300 after the status descriptor: ERR (status reachable).
    vm.set_desc(3, nd(HDR, 72, N, 4));
    vm.set_desc(4, nd(IV_ADDR, 16, N, 5));
    vm.set_desc(5, nd(SRC, 64, N, 6));
    vm.set_desc(6, nd(DST, 64, N | WR, 7));
    vm.set_desc(7, nd(STATUS, 1, N | WR, 300));
    // A loop through a writable descriptor: ERR, bounded.
    vm.set_desc(8, nd(HDR, 72, N, 9));
    vm.set_desc(9, nd(STATUS + 0x200, 1, N | WR, 8));
    // A later good chain.
    vm.set_desc(10, nd(b[0].addr, 72, N, 11));
    vm.set_desc(11, nd(b[1].addr, 16, N, 12));
    vm.set_desc(12, nd(b[2].addr, 64, N, 13));
    vm.set_desc(13, nd(b[3].addr, 64, N | WR, 14));
    vm.set_desc(14, nd(b[4].addr, 1, WR, 0));
    for head in [0, 2, 3, 8, 10] {
        vm.push(head);
    }
    let used = vm.run_batch();
    let ids: Vec<u32> = used.iter().map(|u| u.id).collect();
    assert_eq!(ids, [0, 2, 3, 8, 10]);
    assert_eq!(used[0].len, 0);
    assert_eq!(used[1].len, 0);
    assert_eq!(used[2].len, 1);
    assert_eq!(used[3].len, 1);
    assert_eq!(vm.byte(STATUS + 0x200), ERR);
    // The good chain wrote its ciphertext; nothing else touched D3.
    vm.assert_done(used[4], &NIST_CT);

    // A head index outside the table: consumed, next chain fine.
    let b = vm.baseline();
    vm.push(300);
    let head = vm.chain(&b);
    vm.push(head);
    let used = vm.run_batch();
    assert_eq!(used[0].len, 0);
    vm.assert_done(used[1], &NIST_CT);
}

#[test]
fn h09_loop_on_the_largest_queue_is_bounded() {
    let mut vm = Vm::new();
    vm.move_ring(RingAddrs {
        size: 32768,
        desc: 0x10_0000,
        avail: 0x18_0000,
        used: 0x1A_0000,
    });
    let b = vm.baseline();
    // Two-descriptor loop, and a loop through all 32768 descriptors.
    for i in 0..32768u16 {
        let next = if i == 1 { 0 } else { i.wrapping_add(1) % 32768 };
        vm.set_desc(
            i,
            Descriptor::new(if i % 2 == 0 { HDR } else { IV_ADDR }, 16, F_NEXT, next),
        );
    }
    vm.push(0);
    vm.push(2);
    let t = Instant::now();
    let used = vm.run_batch();
    assert!(t.elapsed() < Duration::from_secs(1), "took {:?}", t.elapsed());
    assert_eq!(used, vec![Used { id: 0, len: 0 }, Used { id: 2, len: 0 }]);
    // The queue goes on.
    let head = vm.chain(&b);
    vm.push(head);
    let u = vm.run_batch();
    vm.assert_done(u[0], &NIST_CT);
}

#[test]
fn h11_malformed_chain_never_completed() {
    let mut vm = Vm::new();
    let b = vm.baseline();
    let h0 = vm.chain(&[b[0]]); // header only, no writable descriptor
    let h1 = vm.chain(&b);
    vm.push(h0);
    vm.push(h1);
    let used = vm.run_batch();
    assert_eq!(
        used[0],
        Used {
            id: u32::from(h0),
            len: 0
        }
    );
    assert_eq!(used[1].id, u32::from(h1));
    vm.assert_done(used[1], &NIST_CT);
    assert_eq!(used[1].len, 65);
}

#[test]
fn h12_descriptor_lengths_overflow_a_32_bit_sum() {
    let mut vm = Vm::new();
    // 0xFFFFFFFF chained to 0x12345678, no other writable byte: consumed.
    let b = vm.baseline();
    let u = vm.submit(&[b[0], b[1], b[2], w(DST, 0xFFFF_FFFF), w(0x50000, 0x1234_5678)]);
    vm.assert_consumed(u);
    // With a reachable status byte after them: ERR.
    let b = vm.baseline();
    let u = vm.submit(&[
        b[0],
        b[1],
        b[2],
        w(DST, 0xFFFF_FFFF),
        w(0x50000, 0x1234_5678),
        b[4],
    ]);
    vm.assert_failed(u, ERR);
    let b = vm.baseline();
    let u = vm.submit(&[
        b[0],
        b[1],
        b[2],
        w(DST, 0x1234_5678),
        w(0x50000, 0xFFFF_FFFF),
        b[4],
    ]);
    vm.assert_failed(u, ERR);
    // Readable lengths too.
    let b = vm.baseline();
    let u = vm.submit(&[
        b[0],
        b[1],
        r(SRC, 0xFFFF_FFFF),
        r(0x50000, 0x1234_5678),
        b[3],
        b[4],
    ]);
    vm.assert_failed(u, ERR);
}

#[test]
fn h13_ranges_checked_before_the_first_write() {
    let mut vm = Vm::new();
    let ram_end = 256 * MIB;
    // D3 at 0xFFFFFFFFFFFFFF00.
    let mut b = vm.baseline();
    b[3] = w(0xFFFF_FFFF_FFFF_FF00, 64);
    let u = vm.submit(&b);
    vm.assert_failed(u, ERR);
    // D3 at 0x0FFFFFF0 runs past RAM: its 16 in-RAM bytes unchanged.
    let mut b = vm.baseline();
    vm.fill(ram_end - 16, 16, CANARY);
    b[3] = w(ram_end - 16, 64);
    let u = vm.submit(&b);
    vm.assert_failed(u, ERR);
    vm.assert_canary(ram_end - 16, 16);
    // IV at 0x0FFFFFF8 (half of it past RAM).
    let mut b = vm.baseline();
    b[1] = r(ram_end - 8, 16);
    let u = vm.submit(&b);
    vm.assert_failed(u, ERR);
    // Neighbours: a 64-byte D3 whose end wraps the address space; src past RAM.
    let mut b = vm.baseline();
    b[3] = w(u64::MAX - 15, 64);
    let u = vm.submit(&b);
    vm.assert_failed(u, ERR);
    let mut b = vm.baseline();
    b[2] = r(ram_end - 32, 64);
    let u = vm.submit(&b);
    vm.assert_failed(u, ERR);
}

#[test]
fn h17_zero_length_descriptors() {
    let mut vm = Vm::new();
    // Zero-length descriptors with wild addresses between real ones (each
    // flagged like its neighbours, then flagged the other way): OK.
    for flip in [false, true] {
        let b = vm.baseline();
        let z = |k: usize, write: bool| Buf {
            addr: WILD[k],
            len: 0,
            write: write ^ flip,
        };
        let chain = [
            z(0, false),
            b[0],
            z(1, false),
            b[1],
            b[2],
            z(2, false),
            b[3],
            z(3, true),
            b[4],
            z(0, true),
        ];
        let u = vm.submit(&chain);
        vm.assert_done(u, &NIST_CT);
    }
    // D4 of length 0: the status is D3's last byte; 63 bytes for 64 -> ERR there.
    let mut b = vm.baseline();
    b[4].len = 0;
    let u = vm.submit(&b);
    assert_eq!(u.len, 1);
    assert_eq!(vm.byte(DST + 63), ERR);
    vm.assert_canary(DST, 63);
    vm.assert_canary(DST + 64, DST_AREA - 64);
    vm.assert_canary(STATUS, STATUS_AREA);
    // Only zero-length writable descriptors: consumed.
    let mut b = vm.baseline();
    b[3].len = 0;
    b[4].len = 0;
    let u = vm.submit(&b);
    vm.assert_consumed(u);
}

#[test]
fn indirect_table_faults_are_consumed_or_err() {
    let mut vm = Vm::new();
    let b = vm.baseline();
    let table = 0x30_0000;
    for (k, d) in b.iter().enumerate() {
        let last = k == b.len() - 1;
        let flags = if d.write { F_WRITE } else { 0 } | if last { 0 } else { F_NEXT };
        vm.put_desc(
            table,
            k as u16,
            Descriptor::new(d.addr, d.len, flags, k as u16 + 1),
        );
    }
    let ind = |len, flags| Descriptor::new(table, len, flags, 0);
    // Table length not a multiple of 16; zero; INDIRECT together with NEXT;
    // table past RAM: consumed (no status byte was reached).
    vm.set_desc(0, ind(79, F_INDIRECT));
    vm.set_desc(1, ind(0, F_INDIRECT));
    vm.set_desc(2, ind(80, F_INDIRECT | F_NEXT));
    vm.set_desc(3, Descriptor::new(256 * MIB - 32, 80, F_INDIRECT, 0));
    for head in 0..4 {
        vm.push(head);
    }
    let used = vm.run_batch();
    for u in &used {
        assert_eq!(u.len, 0);
    }
    vm.assert_consumed(used[0]);
    // An indirect entry inside the table, after the status: ERR.
    let t2 = 0x30_1000;
    for (k, d) in b.iter().enumerate() {
        let flags = if d.write { F_WRITE } else { 0 } | F_NEXT;
        vm.put_desc(t2, k as u16, Descriptor::new(d.addr, d.len, flags, k as u16 + 1));
    }
    vm.put_desc(t2, 5, Descriptor::new(table, 80, F_INDIRECT, 0));
    // An indirect next index past the table, after the status: ERR.
    let t3 = 0x30_2000;
    for (k, d) in b.iter().enumerate() {
        let flags = if d.write { F_WRITE } else { 0 } | F_NEXT;
        let next = if k == 4 { 40 } else { k as u16 + 1 };
        vm.put_desc(t3, k as u16, Descriptor::new(d.addr, d.len, flags, next));
    }
    vm.set_desc(0, Descriptor::new(t2, 96, F_INDIRECT, 0));
    vm.set_desc(1, Descriptor::new(t3, 80, F_INDIRECT, 0));
    vm.set_desc(2, ind(80, F_INDIRECT));
    for head in 0..3 {
        vm.push(head);
    }
    let used = vm.run_batch();
    assert_eq!((used[0].len, used[1].len), (1, 1));
    // The well-formed table afterwards is served.
    vm.assert_done(used[2], &NIST_CT);
}
