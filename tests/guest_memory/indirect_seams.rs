// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Indirect descriptor tables that straddle the seam of two GPA-adjacent
//! memory regions (each its own mapping, so the table is not contiguous in
//! the host's address space). VIRTIO 1.2 §2.7.5.3 puts no such restriction
//! on a table; the device serves the request (docs/PROTOCOL.md §5.3).
//!
//! 64 B and 4 KiB requests, encrypt and decrypt, the table cut at a
//! descriptor boundary and inside a descriptor, with the request's own
//! buffers in one region or each straddling a seam too; and the largest
//! table the walker takes (32,768 entries) across a seam. Output must equal
//! OpenSSL's, and every byte of the area the test uses other than the
//! writable buffers' must be unchanged (compared with its image before).

use crate::common::*;
use vhost_crypto_replay::driver_ring;

/// Region 0 (ring, harness tables) ends here; 1 MiB regions follow, GPA-
/// adjacent, up to `END`: seams at 4, 5, 6, 7 and 8 MiB.
const SEAM: u64 = 4 * MIB;
const END: u64 = 9 * MIB;
/// The area compared byte for byte: everything the tests place, with
/// room around it.
const AREA: u64 = SEAM - 0x8_0000;

fn ranges() -> Vec<(u64, usize)> {
    let mut v = vec![(0, SEAM as usize)];
    let mut at = SEAM;
    while at < END {
        v.push((at, MIB as usize));
        at += MIB;
    }
    v
}

/// Where one request's buffers go.
struct Layout {
    hdr: u64,
    iv: u64,
    src: u64,
    dst: u64,
    status: u64,
}

/// Buffers inside region 1 (none straddles), or each straddling a seam of
/// its own (header 5 MiB, IV 6 MiB, src 7 MiB, dst 8 MiB; the status byte
/// right after the last seam).
fn layout(len: u64, straddle: bool) -> Layout {
    if straddle {
        Layout {
            hdr: 5 * MIB - 30,
            iv: 6 * MIB - 7,
            src: 7 * MIB - len / 2 - 3,
            dst: 8 * MIB - len / 2 + 5,
            status: 8 * MIB + 0x2000,
        }
    } else {
        Layout {
            hdr: SEAM + 0x1_0000,
            iv: SEAM + 0x1_1000,
            src: SEAM + 0x1_2000,
            dst: SEAM + 0x1_4000,
            status: SEAM + 0x1_6000,
        }
    }
}

/// Fills the compared area with a pattern that is neither the request
/// nor anything the device writes.
fn guard(vm: &Vm) {
    let pattern: Vec<u8> = (0..(END - AREA)).map(|i| (i as u8) ^ CANARY).collect();
    vm.write(AREA, &pattern);
}

/// Runs the request in `bufs` (already in memory) as the indirect table
/// at `table` and checks it: status OK, used length `out.len() + 1`, `out`
/// at `dst`, and nothing else in the area changed.
#[track_caller]
fn check(vm: &mut Vm, table: u64, bufs: &[Buf], l: &Layout, out: &[u8]) {
    let head = driver_ring::write_table(&vm.ram(), table, bufs);
    vm.set_desc(0, head);
    let mut want = vm.read(AREA, (END - AREA) as usize);
    let at = |a: u64| (a - AREA) as usize;
    want[at(l.dst)..at(l.dst) + out.len()].copy_from_slice(out);
    want[at(l.status)] = OK;
    vm.push(0);
    let used = vm.run_batch();
    assert_eq!(used[0].id, 0, "used id");
    assert_eq!(
        (used[0].len, vm.byte(l.status)),
        (out.len() as u32 + 1, OK),
        "used length, status"
    );
    let got = vm.read(AREA, (END - AREA) as usize);
    if let Some(i) = got.iter().zip(&want).position(|(g, w)| g != w) {
        panic!(
            "byte {:#x}: {:#04x}, expected {:#04x}",
            AREA + i as u64,
            got[i],
            want[i]
        );
    }
}

#[test]
fn indirect_tables_across_a_region_seam_are_served() {
    let mut vm = Vm::with_ranges(&ranges());
    let mut rng = Rng::new(0x1d1e_c75e_a5a5);
    for len in [64u64, 4096] {
        for straddle in [false, true] {
            // Cut between entries 2 and 3, and inside entry 2.
            for table in [SEAM - 48, SEAM - 40] {
                for encrypt in [true, false] {
                    guard(&vm);
                    let l = layout(len, straddle);
                    let (op, sid) = if encrypt { (ENCRYPT, E) } else { (DECRYPT, D) };
                    let iv = rng.bytes(16);
                    let src = rng.bytes(len as usize);
                    vm.write(l.hdr, &hdr(op, sid, len as u32, len as u32).to_bytes());
                    vm.write(l.iv, &iv);
                    vm.write(l.src, &src);
                    let bufs = [
                        r(l.hdr, 72),
                        r(l.iv, 16),
                        r(l.src, len as u32),
                        w(l.dst, len as u32),
                        w(l.status, 1),
                    ];
                    let out = oracle(encrypt, &NIST_KEY, &iv, &src);
                    check(&mut vm, table, &bufs, &l, &out);
                }
            }
        }
    }
}

#[test]
fn the_largest_indirect_table_across_a_region_seam_is_served() {
    // 32,768 entries (512 KiB), half on either side of the seam: header
    // and IV in the first entries, src in the middle past the seam, dst
    // and status in the last two; zero-length entries in between.
    let mut vm = Vm::with_ranges(&ranges());
    guard(&vm);
    let n = 32768usize;
    let table = SEAM - (n as u64 * 16) / 2;
    let l = layout(4096, true);
    let mut rng = Rng::new(0x01a7_ab1e);
    let iv = rng.bytes(16);
    let src = rng.bytes(4096);
    vm.write(l.hdr, &hdr(ENCRYPT, E, 4096, 4096).to_bytes());
    vm.write(l.iv, &iv);
    vm.write(l.src, &src);
    let mut bufs = vec![r(0, 0); n];
    bufs[0] = r(l.hdr, 72);
    bufs[1] = r(l.iv, 16);
    bufs[n / 2 + 7] = r(l.src, 4096);
    bufs[n - 2] = w(l.dst, 4096);
    bufs[n - 1] = w(l.status, 1);
    let out = oracle(true, &NIST_KEY, &iv, &src);
    check(&mut vm, table, &bufs, &l, &out);
}
