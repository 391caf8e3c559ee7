// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The request header (docs/PROTOCOL.md §5.1) and the status policy
//! (§6): the baseline request of docs/RELIABILITY.md and the hostile-guest
//! cases of its header fields (H01, H02, H04, H07, H14), the request size
//! limit, and which status decides when a request has several faults.

use crate::common::*;
use vhost_user_crypto::wire::virtio_crypto::OpDataReq;

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
fn h04_unadvertised_service_opcode_op_type_algo() {
    let mut vm = Vm::new();
    let mut headers = Vec::new();
    for opcode in [
        0x0400, 0xFFFF, 0x0100, 0x0200, 0x0300, 0x0301, 0x0401, 0x0402, 0x0403, 0x0002, 0x0003, 0x0500,
    ] {
        headers.push(hdr(opcode, E, 64, 64));
    }
    // op_type 2 (ALGORITHM_CHAINING) is supported: see `alg_chain`.
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
