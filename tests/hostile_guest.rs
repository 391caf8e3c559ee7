// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Hostile-guest cases (`../shared/docs/hostile-guest-cases.md`, next to the repository) driven through
//! `QueueWorker::process` on a split ring built by hand in real guest
//! memory. Expected values come from the cases file, NIST SP 800-38A and
//! OpenSSL, never from the code under test.
//!
//! H16 (vhost-user ring messages) is a socket-level case and is not here.

mod common;

use std::time::{Duration, Instant};

use common::*;
use vhost_user_crypto::crypto::RequestLimits;
use vhost_user_crypto::proxy::{handle_create, AbiChoice};
use vhost_user_crypto::sessions::session_set;
use vhost_user_crypto::virtq::descriptor::{
    Desc, VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE,
};
use vhost_user_crypto::virtq::ring::RingAddrs;
use vhost_user_crypto::wire::session::{encode_create, SessionAbi};
use vhost_user_crypto::wire::virtio_crypto::OpDataReq;
use vhost_user_crypto::worker::QueueWorker;

/// Wild addresses for zero-length descriptors (never translated).
const WILD: [u64; 4] = [
    u64::MAX,
    0xFFFF_FFFF_FFFF_FF00,
    0xDEAD_BEEF_0000_0000,
    0x0000_7FFF_FFFF_F000,
];

// ---------------------------------------------------------------------------
// Baseline (D0..D4) and real-guest shapes
// ---------------------------------------------------------------------------

#[test]
fn baseline_encrypt_gives_nist_ciphertext() {
    let mut vm = Vm::new();
    let b = vm.baseline();
    let u = vm.submit(&b);
    vm.assert_done(u, &NIST_CT);
    assert_eq!(u.len, 65);
}

#[test]
fn baseline_decrypt_gives_nist_plaintext() {
    let mut vm = Vm::new();
    let b = vm.stage(&hdr(DECRYPT, D, 64, 64), &NIST_CT);
    let u = vm.submit(&b);
    vm.assert_done(u, &NIST_PT);
}

#[test]
fn baseline_as_one_indirect_table() {
    let mut vm = Vm::new();
    let b = vm.baseline();
    let u = vm.submit_indirect(&b);
    vm.assert_done(u, &NIST_CT);

    let b = vm.stage(&hdr(DECRYPT, D, 64, 64), &NIST_CT);
    let u = vm.submit_indirect(&b);
    vm.assert_done(u, &NIST_PT);
}

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
fn request_size_limit_boundary() {
    // max_request_bytes = 1 MiB: exactly 1 MiB is served, 1 MiB + 16 is ERR.
    let mut vm = Vm::new();
    let mut rng = Rng::new(7);
    let data = rng.bytes(1 << 20);
    let (src, dst, st) = (0x100_0000, 0x200_0000, 0x300_0000);
    vm.write(HDR, &hdr(ENCRYPT, E, 1 << 20, 1 << 20).to_bytes());
    vm.write(IV_ADDR, &NIST_IV);
    vm.write(src, &data);
    vm.fill(dst, (1 << 20) + 64, CANARY);
    vm.fill(st, 16, CANARY);
    let u = vm.submit(&[
        r(HDR, 72),
        r(IV_ADDR, 16),
        r(src, 1 << 20),
        w(dst, 1 << 20),
        w(st, 1),
    ]);
    assert_eq!((vm.byte(st), u.len), (OK, (1 << 20) + 1));
    assert!(vm.read(dst, 1 << 20) == oracle(true, &NIST_KEY, &NIST_IV, &data));
    vm.assert_canary(dst + (1 << 20), 64);

    let n = (1 << 20) + 16;
    vm.write(HDR, &hdr(ENCRYPT, E, n, n).to_bytes());
    vm.fill(dst, n as usize + 64, CANARY);
    let u = vm.submit(&[r(HDR, 72), r(IV_ADDR, 16), r(src, n), w(dst, n), w(st, 1)]);
    assert_eq!((vm.byte(st), u.len), (ERR, 1));
    vm.assert_canary(dst, n as usize + 64);
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

// ---------------------------------------------------------------------------
// H01..H17
// ---------------------------------------------------------------------------

#[test]
fn h01_length_sum_overflow() {
    let mut vm = Vm::new();
    for (iv, src, dst) in [
        (16, 0xFFFF_FFF8, 16),
        (16, 16, 0xFFFF_FFF8),
        (16, 0xFFFF_FFF0, 0xFFFF_FFF0),
        (0xFFFF_FFF0, 64, 64),
        (0xFFFF_FFFF, 1, 64),
    ] {
        let mut h = hdr(ENCRYPT, E, src, dst);
        h.iv_len = iv;
        let b = vm.stage(&h, &NIST_PT);
        let u = vm.submit(&b);
        vm.assert_failed(u, ERR);
    }
}

#[test]
fn h02_src_dst_length_mismatch() {
    let mut vm = Vm::new();
    // src 64, dst 16, D3 16 bytes.
    let mut b = vm.stage(&hdr(ENCRYPT, E, 64, 16), &NIST_PT);
    b[3].len = 16;
    let u = vm.submit(&b);
    vm.assert_failed(u, ERR);
    // src 16, dst 64.
    let b = vm.stage(&hdr(ENCRYPT, E, 16, 64), &NIST_PT);
    let u = vm.submit(&b);
    vm.assert_failed(u, ERR);
    // Neighbour: src = dst but the readable stream is shorter than src.
    let mut b = vm.stage(&hdr(ENCRYPT, E, 64, 64), &NIST_PT);
    b[2].len = 48;
    let u = vm.submit(&b);
    vm.assert_failed(u, ERR);
}

#[test]
fn h03_guest_sized_lengths_64_in_one_batch() {
    let mut vm = Vm::new();
    let b = vm.stage(&hdr(ENCRYPT, E, 0x7FFF_FFF0, 0x7FFF_FFF0), &NIST_PT);
    let mut heads = Vec::new();
    for k in 0..64u64 {
        let chain = [b[0], b[1], b[2], b[3], w(STATUS + 2 * k, 1)];
        let head = vm.indirect(&chain);
        vm.push(head);
        heads.push(head);
    }
    let t = Instant::now();
    let used = vm.run_batch();
    assert!(t.elapsed() < Duration::from_millis(500), "took {:?}", t.elapsed());
    for (k, u) in used.iter().enumerate() {
        assert_eq!(u.id, u32::from(heads[k]));
        assert_eq!(u.len, 1);
        assert_eq!(vm.byte(STATUS + 2 * k as u64), ERR);
        assert_eq!(vm.byte(STATUS + 2 * k as u64 + 1), CANARY);
    }
    vm.assert_canary(DST, DST_AREA);
}

#[test]
fn h04_unadvertised_service_opcode_op_type_algo() {
    let mut vm = Vm::new();
    let mut headers = Vec::new();
    for opcode in [
        0x0400, 0xFFFF, 0x0100, 0x0200, 0x0300, 0x0301, 0x0401, 0x0402, 0x0403, 0x0002, 0x0003, 0x0500,
    ] {
        headers.push(hdr(opcode, E, 64, 64));
    }
    // op_type 2 (ALGORITHM_CHAINING) is supported: see tests/chaining.rs.
    for op_type in [0, 3, 5, 0xFFFF_FFFF] {
        let mut h = hdr(ENCRYPT, E, 64, 64);
        h.op_type = op_type;
        headers.push(h);
    }
    for algo in [1, 2, 4, 13, 0xFFFF_FFFF] {
        let mut h = hdr(ENCRYPT, E, 64, 64);
        h.algo = algo;
        headers.push(h);
    }
    for h in headers {
        let b = vm.stage(&h, &NIST_PT);
        let u = vm.submit(&b);
        vm.assert_failed(u, NOTSUPP);
    }
    // A chaining request naming a plain cipher session: the op_type is
    // supported, the session does not fit it: ERR.
    let mut h = hdr(ENCRYPT, E, 64, 64);
    h.op_type = 2;
    let b = vm.stage(&h, &NIST_PT);
    let u = vm.submit(&b);
    vm.assert_failed(u, ERR);
    // algo = AES_CBC (3) is the session's algorithm: served.
    let mut h = hdr(ENCRYPT, E, 64, 64);
    h.algo = 3;
    let b = vm.stage(&h, &NIST_PT);
    let u = vm.submit(&b);
    vm.assert_done(u, &NIST_CT);
}

#[test]
fn h05_session_error_paths_do_not_leak() {
    let mut vm = Vm::new();
    let mut bad = session_info(&NIST_KEY, 1);
    bad.key_len = 17;
    for _ in 0..100_000 {
        assert!(vm.reg.create(&bad) < 0);
    }
    assert_eq!(vm.reg.len(), 2, "only E and D live");
    for id in (3..100_002u64).chain([0, u64::MAX, 1 << 63]) {
        assert!(!vm.reg.close(id), "close of unknown id {id}");
    }
    assert_eq!(vm.reg.len(), 2);
    // The data path still serves, and its table is flat.
    let b = vm.baseline();
    let u = vm.submit(&b);
    vm.assert_done(u, &NIST_CT);
    assert_eq!(vm.worker.sessions.len(), 2);
    // A good create after the flood works.
    let id = vm.reg.create(&session_info(&NIST_KEY, 1));
    assert!(id > 0);
    let b = vm.stage(&hdr(ENCRYPT, id as u64, 64, 64), &NIST_PT);
    let u = vm.submit(&b);
    vm.assert_done(u, &NIST_CT);
}

#[test]
fn h06_key_length_in_session_message() {
    let (mut reg, _tables) = session_set(1024, 1);
    for key_len in [0x1000, 0, 64, 17, 15, 33, u32::MAX] {
        let mut info = session_info(&[0x2b; 64], 1);
        info.key_len = key_len;
        assert!(reg.create(&info) < 0, "key_len {key_len}");
        // The same through the frontend proxy, in each payload layout.
        for abi in [SessionAbi::A, SessionAbi::B, SessionAbi::C] {
            let payload = encode_create(abi, &info);
            let reply = handle_create(&mut reg, &payload, AbiChoice::Auto);
            assert_reply(&reply, &payload, Some(abi.session_id_offset()), |id| id < 0);
        }
    }
    assert_eq!(reg.len(), 0);

    // Payloads of odd sizes (including shorter than any layout): same-size
    // reply, negative id at offset 0 when it fits.
    for n in [0usize, 1, 7, 8, 71, 100, 631, 633, 1071, 1073, 2048, 4096] {
        for fill in [0x00u8, 0xFF, 0x41] {
            let payload = vec![fill; n];
            let reply = handle_create(&mut reg, &payload, AbiChoice::Auto);
            assert_reply(&reply, &payload, (n >= 8).then_some(0), |id| id < 0);
        }
    }
    // Garbage in the two known sizes: id at 0 (632) / 1064 (1072).
    for fill in [0x00u8, 0xFF, 0x41] {
        let p = vec![fill; 632];
        assert_reply(&handle_create(&mut reg, &p, AbiChoice::Auto), &p, Some(0), |id| {
            id < 0
        });
        let p = vec![fill; 1072];
        assert_reply(
            &handle_create(&mut reg, &p, AbiChoice::Auto),
            &p,
            Some(1064),
            |id| id < 0,
        );
    }
    // A forced layout that does not match the size.
    let p = vec![0u8; 632];
    assert_reply(
        &handle_create(&mut reg, &p, AbiChoice::Fixed(SessionAbi::C)),
        &p,
        Some(0),
        |id| id < 0,
    );
    assert_eq!(reg.len(), 0, "no session created by any bad message");

    // The handler keeps serving: a good CREATE in each layout.
    for abi in [SessionAbi::A, SessionAbi::B, SessionAbi::C] {
        let payload = encode_create(abi, &session_info(&NIST_KEY, 1));
        let reply = handle_create(&mut reg, &payload, AbiChoice::Auto);
        assert_reply(&reply, &payload, Some(abi.session_id_offset()), |id| id > 0);
    }
    assert_eq!(reg.len(), 3);
}

#[track_caller]
fn assert_reply(reply: &[u8], payload: &[u8], id_at: Option<usize>, ok: impl Fn(i64) -> bool) {
    assert_eq!(reply.len(), 12 + payload.len(), "reply size");
    assert_eq!(&reply[0..4], &26u32.to_le_bytes(), "request");
    assert_eq!(&reply[4..8], &5u32.to_le_bytes(), "flags");
    assert_eq!(&reply[8..12], &(payload.len() as u32).to_le_bytes(), "size");
    if let Some(off) = id_at {
        let id = i64::from_le_bytes(reply[12 + off..12 + off + 8].try_into().unwrap());
        assert!(
            ok(id),
            "session id {id} at {off} ({} byte payload)",
            payload.len()
        );
    }
}

#[test]
fn h07_iv_and_dst_length_beyond_the_buffer() {
    let mut vm = Vm::new();
    // iv_len 4096 with a 4096-byte IV descriptor.
    let mut h = hdr(ENCRYPT, E, 64, 64);
    h.iv_len = 4096;
    let mut b = vm.stage(&h, &NIST_PT);
    b[1].len = 4096;
    let u = vm.submit(&b);
    vm.assert_failed(u, ERR);

    // dst_data_len 64 with only 16 writable bytes before the status.
    let mut b = vm.baseline();
    b[3].len = 16;
    let u = vm.submit(&b);
    vm.assert_failed(u, ERR);

    // src = dst = 16 with a 4096-byte D3: exactly 16 bytes written.
    let mut b = vm.stage(&hdr(ENCRYPT, E, 16, 16), &NIST_PT[..16]);
    b[3].len = 4096;
    let u = vm.submit(&b);
    vm.assert_done(u, &NIST_CT[..16]);
    assert_eq!(u.len, 17);
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
fn h09_descriptor_loop_and_bad_next() {
    let mut vm = Vm::new();
    let b = vm.baseline();
    let nd = |addr, len, flags, next| Desc {
        addr,
        len,
        flags,
        next,
    };
    const N: u16 = VRING_DESC_F_NEXT;
    const WR: u16 = VRING_DESC_F_WRITE;

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
            Desc {
                addr: if i % 2 == 0 { HDR } else { IV_ADDR },
                len: 16,
                flags: VRING_DESC_F_NEXT,
                next,
            },
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
    vm.avail_idx = 1;
    vm.push(head);
    assert_eq!(vm.run().completed, 0);
    assert_eq!(vm.used_idx(), 1);
    vm.assert_canary(DST, DST_AREA);
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
fn h14_real_guest_shapes() {
    let mut vm = Vm::new();
    // src = dst = 17: not a block multiple.
    let mut pt = NIST_PT[..17].to_vec();
    pt[16] = 0x42;
    let b = vm.stage(&hdr(ENCRYPT, E, 17, 17), &pt);
    let u = vm.submit(&b);
    vm.assert_failed(u, ERR);
    // src = dst = 32 with a 4096-byte D3: exactly 32 bytes written.
    let mut b = vm.stage(&hdr(ENCRYPT, E, 32, 32), &NIST_PT[..32]);
    b[3].len = 4096;
    let u = vm.submit(&b);
    vm.assert_done(u, &NIST_CT[..32]);
    assert_eq!(u.len, 33);
    // Neighbour: src = dst = 0.
    let b = vm.stage(&hdr(ENCRYPT, E, 0, 0), &NIST_PT);
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

// ---------------------------------------------------------------------------
// Status precedence
// ---------------------------------------------------------------------------

#[test]
fn precedence_notsupp_before_invsess_before_err() {
    let mut vm = Vm::new();
    let mut cases: Vec<(OpDataReq, u8)> = Vec::new();
    // opcode 0xFFFF + unknown session -> NOTSUPP.
    cases.push((hdr(0xFFFF, 99, 64, 64), NOTSUPP));
    // op_type 0 + unknown session + bad lengths -> NOTSUPP.
    let mut h = hdr(ENCRYPT, 99, 17, 5);
    h.op_type = 0;
    cases.push((h, NOTSUPP));
    // unknown session + bad iv_len -> INVSESS.
    let mut h = hdr(ENCRYPT, 99, 64, 64);
    h.iv_len = 8;
    cases.push((h, INVSESS));
    // unknown session + length mismatch -> INVSESS.
    cases.push((hdr(DECRYPT, 99, 0xFFFF_FFF8, 16), INVSESS));
    // session 0 and other never-created ids -> INVSESS.
    for id in [0, 3, u64::MAX] {
        cases.push((hdr(ENCRYPT, id, 64, 64), INVSESS));
    }
    // direction mismatch -> ERR.
    cases.push((hdr(ENCRYPT, D, 64, 64), ERR));
    cases.push((hdr(DECRYPT, E, 64, 64), ERR));
    for (h, status) in cases {
        let b = vm.stage(&h, &NIST_PT);
        let u = vm.submit(&b);
        vm.assert_failed(u, status);
    }
}

#[test]
fn precedence_header_checks_before_chain_faults() {
    let mut vm = Vm::new();
    // A chain fault (unmapped D3) with a bad opcode -> NOTSUPP,
    // with an unknown session -> INVSESS, with a good header -> ERR.
    for (h, status) in [
        (hdr(0x0400, E, 64, 64), NOTSUPP),
        (hdr(ENCRYPT, 42, 64, 64), INVSESS),
        (hdr(ENCRYPT, E, 64, 64), ERR),
    ] {
        let mut b = vm.stage(&h, &NIST_PT);
        b[3] = w(0xFFFF_FFFF_0000, 64);
        let u = vm.submit(&b);
        vm.assert_failed(u, status);
    }
    // Readable after writable with a bad opcode -> NOTSUPP; good header -> ERR.
    for (h, status) in [(hdr(0xFFFF, E, 64, 64), NOTSUPP), (hdr(ENCRYPT, E, 64, 64), ERR)] {
        let b = vm.stage(&h, &NIST_PT);
        let u = vm.submit(&[b[0], b[1], b[3], b[2], b[4]]);
        vm.assert_failed(u, status);
    }
}

#[test]
fn precedence_header_not_readable() {
    let mut vm = Vm::new();
    // Only 71 header bytes readable, status present -> ERR, used 1.
    let b = vm.baseline();
    let u = vm.submit(&[r(HDR, 71), b[4]]);
    vm.assert_failed(u, ERR);
    // 71 bytes readable, dst and status present -> ERR, D3 untouched.
    let b = vm.baseline();
    let u = vm.submit(&[r(HDR, 71), b[3], b[4]]);
    vm.assert_failed(u, ERR);
    // Header past RAM, status present -> ERR.
    let b = vm.baseline();
    let u = vm.submit(&[r(256 * MIB - 40, 72), b[1], b[2], b[3], b[4]]);
    vm.assert_failed(u, ERR);
    // 71 bytes and no status -> consumed.
    vm.baseline();
    let u = vm.submit(&[r(HDR, 71)]);
    vm.assert_consumed(u);
    // No writable descriptor -> consumed, and the next chain of the same batch is OK.
    let b = vm.baseline();
    let h0 = vm.chain(&b[..3]);
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
    vm.assert_done(used[1], &NIST_CT);
}

#[test]
fn closed_session_is_invsess() {
    let mut vm = Vm::new();
    let b = vm.baseline();
    let u = vm.submit(&b);
    vm.assert_done(u, &NIST_CT);
    assert!(vm.reg.close(E));
    let b = vm.baseline();
    let u = vm.submit(&b);
    vm.assert_failed(u, INVSESS);
    // D is still served.
    let b = vm.stage(&hdr(DECRYPT, D, 64, 64), &NIST_CT);
    let u = vm.submit(&b);
    vm.assert_done(u, &NIST_PT);
    // A new session does not bring the closed id back.
    let id = vm.reg.create(&session_info(&NIST_KEY, 1));
    assert!(id > 0 && id as u64 != E);
    let b = vm.baseline();
    let u = vm.submit(&b);
    vm.assert_failed(u, INVSESS);
    let b = vm.stage(&hdr(ENCRYPT, id as u64, 64, 64), &NIST_PT);
    let u = vm.submit(&b);
    vm.assert_done(u, &NIST_CT);
}

// ---------------------------------------------------------------------------
// Batches
// ---------------------------------------------------------------------------

/// Six requests of every outcome, each at its own addresses.
fn mixed_batch(vm: &mut Vm) -> Vec<(u16, u64)> {
    let base = |k: u64| 0x100_0000 + k * 0x10000;
    let mut heads = Vec::new();
    let b = vm.stage_at(base(0), &hdr(ENCRYPT, E, 64, 64), &NIST_PT);
    heads.push((vm.chain(&b), base(0)));
    let b = vm.stage_at(base(1), &hdr(DECRYPT, D, 64, 64), &NIST_CT);
    heads.push((vm.indirect(&b), base(1)));
    let b = vm.stage_at(base(2), &hdr(ENCRYPT, E, 17, 17), &NIST_PT[..17]);
    heads.push((vm.chain(&b), base(2)));
    let b = vm.stage_at(base(3), &hdr(ENCRYPT, E, 64, 64), &NIST_PT);
    heads.push((vm.chain(&b[..3]), base(3)));
    let b = vm.stage_at(base(4), &hdr(0x0400, E, 64, 64), &NIST_PT);
    heads.push((vm.chain(&b), base(4)));
    let b = vm.stage_at(base(5), &hdr(ENCRYPT, 77, 64, 64), &NIST_PT);
    heads.push((vm.chain(&b), base(5)));
    for &(h, _) in &heads {
        vm.push(h);
    }
    heads
}

#[track_caller]
fn check_mixed_batch(vm: &Vm, heads: &[(u16, u64)], used: &[Used]) {
    let ids: Vec<u32> = used.iter().map(|u| u.id).collect();
    let want: Vec<u32> = heads.iter().map(|&(h, _)| u32::from(h)).collect();
    assert_eq!(ids, want, "used ids in avail order");
    vm.assert_done_at(heads[0].1, used[0], &NIST_CT);
    vm.assert_done_at(heads[1].1, used[1], &NIST_PT);
    vm.assert_failed_at(heads[2].1, used[2], ERR);
    vm.assert_consumed_at(heads[3].1, used[3]);
    vm.assert_failed_at(heads[4].1, used[4], NOTSUPP);
    vm.assert_failed_at(heads[5].1, used[5], INVSESS);
    assert_eq!(vm.avail_event(), vm.avail_idx, "avail_event");
}

#[test]
fn batch_of_mixed_requests() {
    let mut vm = Vm::new();
    let heads = mixed_batch(&mut vm);
    let used = vm.run_batch();
    assert_eq!(vm.used_idx(), 6);
    assert_eq!(vm.avail_event(), 6);
    check_mixed_batch(&vm, &heads, &used);
    // Nothing new: nothing completed, indices unchanged.
    assert_eq!(vm.run().completed, 0);
    assert_eq!((vm.used_idx(), vm.avail_event()), (6, 6));
}

#[test]
fn batch_across_the_u16_wrap() {
    let mut vm = Vm::new();
    vm.start_at(0xFFFD);
    let heads = mixed_batch(&mut vm);
    let used = vm.run_batch();
    assert_eq!(vm.used_idx(), 3);
    assert_eq!(vm.avail_event(), 3);
    check_mixed_batch(&vm, &heads, &used);
}

#[test]
fn indirect_table_faults_are_consumed_or_err() {
    let mut vm = Vm::new();
    let b = vm.baseline();
    let table = 0x30_0000;
    for (k, d) in b.iter().enumerate() {
        let last = k == b.len() - 1;
        let flags = if d.write { VRING_DESC_F_WRITE } else { 0 } | if last { 0 } else { VRING_DESC_F_NEXT };
        vm.put_desc(
            table,
            k as u16,
            Desc {
                addr: d.addr,
                len: d.len,
                flags,
                next: k as u16 + 1,
            },
        );
    }
    let ind = |len, flags| Desc {
        addr: table,
        len,
        flags,
        next: 0,
    };
    // Table length not a multiple of 16; zero; INDIRECT together with NEXT;
    // table past RAM: consumed (no status byte was reached).
    vm.set_desc(0, ind(79, VRING_DESC_F_INDIRECT));
    vm.set_desc(1, ind(0, VRING_DESC_F_INDIRECT));
    vm.set_desc(2, ind(80, VRING_DESC_F_INDIRECT | VRING_DESC_F_NEXT));
    vm.set_desc(
        3,
        Desc {
            addr: 256 * MIB - 32,
            len: 80,
            flags: VRING_DESC_F_INDIRECT,
            next: 0,
        },
    );
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
        let flags = if d.write { VRING_DESC_F_WRITE } else { 0 } | VRING_DESC_F_NEXT;
        vm.put_desc(
            t2,
            k as u16,
            Desc {
                addr: d.addr,
                len: d.len,
                flags,
                next: k as u16 + 1,
            },
        );
    }
    vm.put_desc(
        t2,
        5,
        Desc {
            addr: table,
            len: 80,
            flags: VRING_DESC_F_INDIRECT,
            next: 0,
        },
    );
    // An indirect next index past the table, after the status: ERR.
    let t3 = 0x30_2000;
    for (k, d) in b.iter().enumerate() {
        let flags = if d.write { VRING_DESC_F_WRITE } else { 0 } | VRING_DESC_F_NEXT;
        let next = if k == 4 { 40 } else { k as u16 + 1 };
        vm.put_desc(
            t3,
            k as u16,
            Desc {
                addr: d.addr,
                len: d.len,
                flags,
                next,
            },
        );
    }
    vm.set_desc(
        0,
        Desc {
            addr: t2,
            len: 96,
            flags: VRING_DESC_F_INDIRECT,
            next: 0,
        },
    );
    vm.set_desc(
        1,
        Desc {
            addr: t3,
            len: 80,
            flags: VRING_DESC_F_INDIRECT,
            next: 0,
        },
    );
    vm.set_desc(2, ind(80, VRING_DESC_F_INDIRECT));
    for head in 0..3 {
        vm.push(head);
    }
    let used = vm.run_batch();
    assert_eq!((used[0].len, used[1].len), (1, 1));
    // The well-formed table afterwards is served.
    vm.assert_done(used[2], &NIST_CT);
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

// ---------------------------------------------------------------------------
// Ring geometry (process-level neighbours of H16; the socket case itself is
// not tested here)
// ---------------------------------------------------------------------------

#[test]
fn bad_ring_geometry_completes_nothing_and_does_not_panic() {
    let mut vm = Vm::new();
    let b = vm.baseline();
    let head = vm.chain(&b);
    vm.push(head);
    let ram_end = 256 * MIB;
    let ok = vm.ring;
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
/// usual (before, the first failure stopped the queue until the frontend
/// stopped the ring or moved it).
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
        let r = vm.worker.process(&without, vm.ring, &mut na, &mut nu);
        assert_eq!((r.completed, na, nu), (0, 0, 0));
    }
    assert_eq!(vm.used_idx(), 0);
    vm.assert_canary(DST, DST_AREA);
    let used = vm.run_batch();
    assert_eq!(used.len(), 1);
    vm.assert_done(used[0], &NIST_CT);
}

/// Requests of one batch whose buffers overlap one another (a guest bug,
/// or a guest probing the device): B reads A's dst as its src, and C
/// writes A's dst again. Encrypt requests under one key normally run side
/// by side as multi-buffer lanes; these must not (two lanes' slices would
/// alias), and they run one after another in avail order instead: B
/// encrypts A's output, and A's dst ends up holding C's output. Nothing outside the three requests'
/// writable buffers changes.
#[test]
fn overlapping_requests_of_one_batch_run_one_after_another() {
    let mut vm = Vm::new();
    let (a_at, b_at, c_at) = (0x40_0000u64, 0x50_0000u64, 0x60_0000u64);
    let shared = Addrs::at(a_at).dst;
    let c_src: Vec<u8> = NIST_PT.iter().rev().copied().collect();
    let a = vm.stage_at(a_at, &hdr(ENCRYPT, E, 64, 64), &NIST_PT);
    let mut b = vm.stage_at(b_at, &hdr(ENCRYPT, E, 64, 64), &[0x5a; 64]);
    b[2] = r(shared, 64);
    let mut c = vm.stage_at(c_at, &hdr(ENCRYPT, E, 64, 64), &c_src);
    c[3] = w(shared, 64);
    // Two rounds: direct chains, then indirect tables.
    for indirect in [false, true] {
        vm.fill(shared, 64, CANARY);
        let heads: Vec<u16> = [&a, &b, &c]
            .iter()
            .map(|bufs| {
                if indirect {
                    vm.indirect(bufs)
                } else {
                    vm.chain(bufs)
                }
            })
            .collect();
        for &h in &heads {
            vm.push(h);
        }
        let used = vm.run_batch();
        assert_eq!(
            used.iter().map(|u| u.id).collect::<Vec<_>>(),
            heads.iter().map(|&h| u32::from(h)).collect::<Vec<_>>()
        );
        for (u, base) in used.iter().zip([a_at, b_at, c_at]) {
            assert_eq!(
                (u.len, vm.byte(Addrs::at(base).status)),
                (65, OK),
                "request at {base:#x}"
            );
        }
        let a_out = oracle(true, &NIST_KEY, &NIST_IV, &NIST_PT);
        assert_eq!(a_out, NIST_CT, "oracle");
        let b_out = oracle(true, &NIST_KEY, &NIST_IV, &a_out);
        let c_out = oracle(true, &NIST_KEY, &NIST_IV, &c_src);
        assert_eq!(
            vm.read(Addrs::at(b_at).dst, 64),
            b_out,
            "B encrypted A's output (indirect: {indirect})"
        );
        assert_eq!(
            vm.read(shared, 64),
            c_out,
            "A's dst holds C's output, written last (indirect: {indirect})"
        );
        vm.assert_canary(shared + 64, 0x1000 - 64);
        vm.assert_canary(Addrs::at(b_at).dst + 64, 0x1000 - 64);
        vm.assert_canary(Addrs::at(c_at).dst, 0x1000);
    }
}
