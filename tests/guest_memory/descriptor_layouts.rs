// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Valid requests in every shape a driver may give them (docs/PROTOCOL.md
//! §5.3): fields split over many descriptors with empty ones between,
//! in place, merged buffers, copies clamped to the declared lengths (H08),
//! one descriptor per byte, buffers across region boundaries or running
//! into a hole, and random sizes and layouts checked against OpenSSL.

use std::time::{Duration, Instant};

use crate::common::*;

/// Wild addresses for zero-length descriptors (never translated).
pub(super) const WILD: [u64; 4] = [
    u64::MAX,
    0xFFFF_FFFF_FFFF_FF00,
    0xDEAD_BEEF_0000_0000,
    0x0000_7FFF_FFFF_F000,
];

/// Header 24+48, IV 10+6, src 8+16+40, dst 7+57, each piece at its own
/// address, zero-length descriptors with wild addresses in between.
fn split_chain(vm: &Vm, opcode: u32, session: u64, input: &[u8; 64]) -> Vec<Buf> {
    let h = hdr(opcode, session, 64, 64).to_bytes();
    vm.write(0x10000, &h[..24]);
    vm.write(0x10800, &h[24..]);
    vm.write(0x11000, &NIST_IV[..10]);
    vm.write(0x11800, &NIST_IV[10..]);
    vm.write(0x12000, &input[..8]);
    vm.write(0x12400, &input[8..24]);
    vm.write(0x12800, &input[24..]);
    vm.fill(DST, DST_AREA, CANARY);
    vm.fill(STATUS, STATUS_AREA, CANARY);
    vec![
        r(WILD[0], 0),
        r(0x10000, 24),
        r(WILD[1], 0),
        r(0x10800, 48),
        r(0x11000, 10),
        r(WILD[2], 0),
        r(0x11800, 6),
        r(0x12000, 8),
        r(0x12400, 16),
        r(WILD[3], 0),
        r(0x12800, 40),
        w(WILD[0], 0),
        w(0x13000, 7),
        w(WILD[1], 0),
        w(0x13800, 57),
        w(WILD[2], 0),
        w(STATUS, 1),
        w(WILD[3], 0),
    ]
}

#[track_caller]
fn assert_split_out(vm: &Vm, u: Used, out: &[u8; 64]) {
    assert_eq!(vm.byte(STATUS), OK);
    assert_eq!(u.len, 65);
    assert_eq!(vm.read(0x13000, 7), &out[..7]);
    assert_eq!(vm.read(0x13800, 57), &out[7..]);
    vm.assert_canary(0x13007, 0x800 - 7);
    vm.assert_canary(0x13800 + 57, 0x800 - 57);
    vm.assert_canary(STATUS + 1, STATUS_AREA - 1);
}

#[test]
fn every_field_split_with_wild_empty_descriptors_direct() {
    let mut vm = Vm::new();
    let b = split_chain(&vm, ENCRYPT, E, &NIST_PT);
    let u = vm.submit(&b);
    assert_split_out(&vm, u, &NIST_CT);
    let b = split_chain(&vm, DECRYPT, D, &NIST_CT);
    let u = vm.submit(&b);
    assert_split_out(&vm, u, &NIST_PT);
}

#[test]
fn every_field_split_with_wild_empty_descriptors_indirect() {
    let mut vm = Vm::new();
    let b = split_chain(&vm, ENCRYPT, E, &NIST_PT);
    let u = vm.submit_indirect(&b);
    assert_split_out(&vm, u, &NIST_CT);
    let b = split_chain(&vm, DECRYPT, D, &NIST_CT);
    let u = vm.submit_indirect(&b);
    assert_split_out(&vm, u, &NIST_PT);
}

#[test]
fn in_place_encrypt_and_decrypt() {
    let mut vm = Vm::new();
    vm.fill(SRC + 64, 64, CANARY);
    // Same pages, same cuts.
    for (opcode, session, input, out) in [(ENCRYPT, E, NIST_PT, NIST_CT), (DECRYPT, D, NIST_CT, NIST_PT)] {
        let mut b = vm.stage(&hdr(opcode, session, 64, 64), &input);
        b[3] = w(SRC, 64);
        let u = vm.submit(&b);
        assert_eq!((vm.byte(STATUS), u.len), (OK, 65));
        assert_eq!(vm.read(SRC, 64), out);
        vm.assert_canary(SRC + 64, 64);
        vm.assert_canary(DST, DST_AREA);
    }
    // Same pages, different cuts (blocks straddle descriptor boundaries).
    for (opcode, session, input, out) in [(ENCRYPT, E, NIST_PT, NIST_CT), (DECRYPT, D, NIST_CT, NIST_PT)] {
        let b = vm.stage(&hdr(opcode, session, 64, 64), &input);
        let chain = [
            b[0],
            b[1],
            r(SRC, 8),
            r(SRC + 8, 40),
            r(SRC + 48, 16),
            w(SRC, 24),
            w(SRC + 24, 3),
            w(SRC + 27, 37),
            b[4],
        ];
        let u = vm.submit(&chain);
        assert_eq!((vm.byte(STATUS), u.len), (OK, 65));
        assert_eq!(vm.read(SRC, 64), out);
        vm.assert_canary(SRC + 64, 64);
    }
}

#[test]
fn merged_buffers_header_iv_src_in_one_and_dst_status_in_one() {
    let mut vm = Vm::new();
    // Header, IV and src contiguous in one readable descriptor; dst and
    // status in one writable descriptor (the status is its last byte).
    let at = 0x50000;
    vm.write(at, &hdr(ENCRYPT, E, 64, 64).to_bytes());
    vm.write(at + 72, &NIST_IV);
    vm.write(at + 88, &NIST_PT);
    vm.fill(DST, DST_AREA, CANARY);
    let u = vm.submit(&[r(at, 72 + 16 + 64), w(DST, 65)]);
    assert_eq!(u.len, 65);
    assert_eq!(vm.read(DST, 64), NIST_CT);
    assert_eq!(vm.byte(DST + 64), OK);
    vm.assert_canary(DST + 65, DST_AREA - 65);
    // Same, indirect.
    vm.fill(DST, DST_AREA, CANARY);
    let u = vm.submit_indirect(&[r(at, 72 + 16 + 64), w(DST, 65)]);
    assert_eq!(u.len, 65);
    assert_eq!(vm.read(DST, 64), NIST_CT);
    assert_eq!(vm.byte(DST + 64), OK);
}

#[test]
fn h08_copy_clamped_to_declared_bytes() {
    let mut vm = Vm::new();
    // src of 16 bytes split 8 + 4096.
    let b = vm.stage(&hdr(ENCRYPT, E, 16, 16), &NIST_PT[..8]);
    vm.write(0x40000, &NIST_PT[8..16]);
    vm.fill(0x40008, 4088, 0x77);
    let chain = [b[0], b[1], r(SRC, 8), r(0x40000, 4096), w(DST, 16), b[4]];
    let u = vm.submit(&chain);
    vm.assert_done(u, &NIST_CT[..16]);

    // IV split 10 + 6.
    let b = vm.baseline();
    vm.write(IV_ADDR + 0x800, &NIST_IV[10..]);
    let chain = [b[0], r(IV_ADDR, 10), r(IV_ADDR + 0x800, 6), b[2], b[3], b[4]];
    let u = vm.submit(&chain);
    vm.assert_done(u, &NIST_CT);

    // Header split 24 + 48.
    let b = vm.baseline();
    vm.write(HDR + 0x800, &hdr(ENCRYPT, E, 64, 64).to_bytes()[24..]);
    let chain = [r(HDR, 24), r(HDR + 0x800, 48), b[1], b[2], b[3], b[4]];
    let u = vm.submit(&chain);
    vm.assert_done(u, &NIST_CT);
}

#[test]
fn one_descriptor_per_byte() {
    let mut vm = Vm::new();
    let b = vm.baseline();
    let mut chain = Vec::new();
    for d in &b {
        for k in 0..u64::from(d.len) {
            chain.push(Buf {
                addr: d.addr + k,
                len: 1,
                write: d.write,
            });
        }
    }
    assert_eq!(chain.len(), 217);
    let u = vm.submit(&chain);
    vm.assert_done(u, &NIST_CT);
    vm.stage(&hdr(DECRYPT, D, 64, 64), &NIST_CT);
    let u = vm.submit_indirect(&chain);
    vm.assert_done(u, &NIST_PT);
}

#[test]
fn buffers_crossing_adjacent_region_boundaries() {
    // Eight adjacent 1 MiB regions: boundaries at every MiB.
    let ranges: Vec<(u64, usize)> = (0..8).map(|k| (k * MIB, MIB as usize)).collect();
    for indirect in [false, true] {
        let mut vm = Vm::with_ranges(&ranges);
        // (2 MiB is where the harness writes indirect tables.)
        let (h, iv, src, dst, st) = (MIB - 24, 7 * MIB - 10, 3 * MIB - 40, 4 * MIB - 8, 5 * MIB - 1);
        vm.write(h, &hdr(ENCRYPT, E, 64, 64).to_bytes());
        vm.write(iv, &NIST_IV);
        vm.write(src, &NIST_PT);
        vm.fill(dst - 16, 96, CANARY);
        vm.fill(st - 15, 32, CANARY);
        let b = [r(h, 72), r(iv, 16), r(src, 64), w(dst, 64), w(st, 1)];
        let u = if indirect {
            vm.submit_indirect(&b)
        } else {
            vm.submit(&b)
        };
        assert_eq!((vm.byte(st), u.len), (OK, 65));
        assert_eq!(vm.read(dst, 64), NIST_CT);
        vm.assert_canary(dst - 16, 16);
        vm.assert_canary(dst + 64, 16);
        vm.assert_canary(st - 15, 15);
        vm.assert_canary(st + 1, 16);

        // In place across a boundary, decrypt back.
        let ip = 6 * MIB - 20;
        vm.write(h, &hdr(DECRYPT, D, 64, 64).to_bytes());
        vm.write(ip, &NIST_CT);
        let b = [r(h, 72), r(iv, 16), r(ip, 64), w(ip, 64), w(st, 1)];
        let u = vm.submit(&b);
        assert_eq!((vm.byte(st), u.len), (OK, 65));
        assert_eq!(vm.read(ip, 64), NIST_PT);
    }
}

#[test]
fn buffers_running_into_a_hole_between_regions() {
    // 0..16 MiB, hole 16..17 MiB, 17..33 MiB.
    let hole = 16 * MIB;
    let mut vm = Vm::with_ranges(&[(0, 16 << 20), (17 * MIB, 16 << 20)]);

    // dst runs into the hole: ERR, its in-RAM part untouched.
    let mut b = vm.baseline();
    vm.fill(hole - 32, 32, CANARY);
    b[3] = w(hole - 32, 64);
    let u = vm.submit(&b);
    assert_eq!((vm.byte(STATUS), u.len), (ERR, 1));
    vm.assert_canary(hole - 32, 32);

    // IV runs into the hole: ERR.
    let mut b = vm.baseline();
    vm.write(hole - 8, &NIST_IV[..8]);
    b[1] = r(hole - 8, 16);
    let u = vm.submit(&b);
    vm.assert_failed(u, ERR);

    // Status byte in the hole: consumed.
    let mut b = vm.baseline();
    b[4] = w(hole + 0x100, 1);
    let u = vm.submit(&b);
    vm.assert_consumed(u);

    // Everything in the second region: OK.
    let base = 20 * MIB;
    let b = vm.stage_at(base, &hdr(ENCRYPT, E, 64, 64), &NIST_PT);
    let u = vm.submit(&b);
    vm.assert_done_at(base, u, &NIST_CT);
}

/// Writes `data` (or, for writable pieces, the canary) in random pieces at
/// `*at`, with random gaps, and returns the pieces.
fn scatter(vm: &Vm, rng: &mut Rng, at: &mut u64, data: &[u8], max_pieces: usize, write: bool) -> Vec<Buf> {
    let mut out = Vec::new();
    let mut off = 0;
    for len in rng.cuts(data.len(), max_pieces) {
        let gap = rng.range(0, 48);
        if write {
            vm.fill(*at, len + gap as usize, CANARY);
            out.push(w(*at, len as u32));
        } else {
            vm.write(*at, &data[off..off + len]);
            out.push(r(*at, len as u32));
        }
        off += len;
        *at += (len as u64) + gap;
    }
    out
}

#[test]
fn random_sizes_and_layouts_match_openssl() {
    let mut vm = Vm::new();
    let mut rng = Rng::new(0x5eed_c0de_2024);
    let mut sessions = Vec::new();
    for klen in [16, 24, 32] {
        let key = rng.bytes(klen);
        let e = vm.reg.create(&session_info(&key, 1));
        let d = vm.reg.create(&session_info(&key, 2));
        assert!(e > 0 && d > 0);
        sessions.push((key, e as u64, d as u64));
    }
    let started = Instant::now();
    for i in 0..60 {
        let (key, e, d) = &sessions[i % 3];
        let encrypt = rng.range(0, 1) == 0;
        let len = 16 * rng.range(1, 4096) as usize; // up to 64 KiB
        let iv: [u8; 16] = rng.bytes(16).try_into().unwrap();
        let data = rng.bytes(len);
        let expect = oracle(encrypt, key, &iv, &data);
        let (opcode, session) = if encrypt { (ENCRYPT, *e) } else { (DECRYPT, *d) };
        let h = hdr(opcode, session, len as u32, len as u32).to_bytes();

        let mut at = 0x40_0000;
        let mut chain = scatter(&vm, &mut rng, &mut at, &h, 3, false);
        chain.extend(scatter(&vm, &mut rng, &mut at, &iv, 3, false));
        let in_place = rng.range(0, 3) == 0;
        let (dst_chain, dst_base, dst_span) = if in_place {
            // src and dst cover the same bytes, cut differently.
            let base = 0x80_0000;
            vm.write(base, &data);
            vm.fill(base + len as u64, 64, CANARY);
            let mut o = 0;
            for n in rng.cuts(len, 16) {
                chain.push(r(base + o, n as u32));
                o += n as u64;
            }
            let mut o = 0;
            let mut dsts = Vec::new();
            for n in rng.cuts(len, 16) {
                dsts.push(w(base + o, n as u32));
                o += n as u64;
            }
            (dsts, base, len as u64 + 64)
        } else {
            chain.extend(scatter(&vm, &mut rng, &mut at, &data, 16, false));
            let mut dat = 0x80_0000;
            let dsts = scatter(&vm, &mut rng, &mut dat, &data, 16, true);
            vm.fill(dat, 64, CANARY);
            (dsts, 0x80_0000, dat + 64 - 0x80_0000)
        };
        chain.extend(dst_chain.iter().copied());
        vm.fill(STATUS, STATUS_AREA, CANARY);
        chain.push(w(STATUS, 1));
        // Sprinkle zero-length descriptors with wild addresses.
        for _ in 0..rng.range(0, 3) {
            let pos = rng.range(0, chain.len() as u64) as usize;
            let write = chain.get(pos).or(chain.last()).is_some_and(|b| b.write);
            chain.insert(
                pos,
                Buf {
                    addr: WILD[pos % 4],
                    len: 0,
                    write,
                },
            );
        }

        let u = if rng.range(0, 1) == 0 {
            vm.submit(&chain)
        } else {
            vm.submit_indirect(&chain)
        };
        let what = format!(
            "request {i}: {len} bytes, key {} bits, encrypt {encrypt}, in place {in_place}",
            key.len() * 8
        );
        assert_eq!(vm.byte(STATUS), OK, "{what}");
        assert_eq!(u.len, len as u32 + 1, "{what}");
        vm.assert_canary(STATUS + 1, STATUS_AREA - 1);
        // Expected image of the whole dst span: output in the pieces, canary elsewhere.
        let mut image = vec![CANARY; dst_span as usize];
        let mut o = 0;
        for b in &dst_chain {
            let p = (b.addr - dst_base) as usize;
            image[p..p + b.len as usize].copy_from_slice(&expect[o..o + b.len as usize]);
            o += b.len as usize;
        }
        assert!(
            vm.read(dst_base, dst_span as usize) == image,
            "{what}: dst differs from OpenSSL"
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "took {:?}",
        started.elapsed()
    );
}
