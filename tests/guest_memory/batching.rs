// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Batches of `QueueWorker::process`: requests of every outcome in one
//! batch and across the u16 wrap of the ring indices, 64 guest-sized
//! requests in one batch (H03), overlapping requests of one batch, and the
//! batch byte cap (`MAX_BATCH_BYTES`) for large requests and long chains.

use std::time::{Duration, Instant};

use crate::common::*;

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
    assert_eq!(vm.avail_event(), vm.driver.avail_idx(), "avail_event");
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

/// Requests of one batch whose buffers overlap one another (a guest bug,
/// or a guest probing the device): B reads A's dst as its src, and C
/// writes A's dst again. Requests under one key are normally gathered as
/// lanes (encrypt requests run side by side in the multi-buffer lanes);
/// these must not be (two lanes' slices would alias), and they run one
/// after another in avail order instead: B ciphers A's output, and A's
/// dst ends up holding C's output. Nothing outside the three requests'
/// writable buffers changes.
#[test]
fn overlapping_requests_of_one_batch_run_one_after_another() {
    overlapping_requests(ENCRYPT);
}

/// As above for decrypt requests, gathered as lanes too.
#[test]
fn overlapping_decrypt_requests_of_one_batch_run_one_after_another() {
    overlapping_requests(DECRYPT);
}

fn overlapping_requests(opcode: u32) {
    let mut vm = Vm::new();
    let (session, encrypt) = if opcode == ENCRYPT { (E, true) } else { (D, false) };
    let (a_at, b_at, c_at) = (0x40_0000u64, 0x50_0000u64, 0x60_0000u64);
    let shared = Addrs::at(a_at).dst;
    let a_src = if encrypt { NIST_PT } else { NIST_CT };
    let c_src: Vec<u8> = a_src.iter().rev().copied().collect();
    let a = vm.stage_at(a_at, &hdr(opcode, session, 64, 64), &a_src);
    let mut b = vm.stage_at(b_at, &hdr(opcode, session, 64, 64), &[0x5a; 64]);
    b[2] = r(shared, 64);
    let mut c = vm.stage_at(c_at, &hdr(opcode, session, 64, 64), &c_src);
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
        let a_out = oracle(encrypt, &NIST_KEY, &NIST_IV, &a_src);
        assert_eq!(a_out, if encrypt { NIST_CT } else { NIST_PT }, "oracle");
        let b_out = oracle(encrypt, &NIST_KEY, &NIST_IV, &a_out);
        let c_out = oracle(encrypt, &NIST_KEY, &NIST_IV, &c_src);
        assert_eq!(
            vm.read(Addrs::at(b_at).dst, 64),
            b_out,
            "B ciphered A's output (indirect: {indirect})"
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

/// Batches of random AES-CBC requests of 16 B to 4 KiB under one decrypt
/// session (those of up to 1 KiB gathered as lanes and run one after
/// another, the longer ones run on their own): out of place, in place,
/// with src cut in two non-empty descriptors (run on its own, not
/// gathered), and with encrypt requests of another session between them
/// (which end a group). Every output equals OpenSSL's, in avail order, and
/// nothing after dst changes.
#[test]
fn random_decrypt_batches_match_openssl() {
    let mut vm = Vm::new();
    let mut rng = Rng::new(0x0dec_1a2e);
    let mut kinds = [0usize; 4];
    for batch in 0..20 {
        let n = rng.range(1, 40);
        let mut want = Vec::new();
        let mut heads = Vec::new();
        for k in 0..n {
            let base = 0x100_0000 + k * 0x1_0000;
            let a = Addrs::at(base);
            let kind = rng.range(0, 3) as usize;
            // (At least two blocks for a src cut in two.)
            let len = 16 * rng.range(if kind == 2 { 2 } else { 1 }, 256) as usize;
            let src = rng.bytes(len);
            kinds[kind] += 1;
            let (opcode, session, encrypt) = if kind == 3 {
                (ENCRYPT, E, true)
            } else {
                (DECRYPT, D, false)
            };
            let mut bufs = vm.stage_at(base, &hdr(opcode, session, len as u32, len as u32), &src);
            let out_at = match kind {
                1 => {
                    bufs[3] = w(a.src, len as u32);
                    a.src
                }
                2 => {
                    let cut = 16 * rng.range(1, len as u64 / 16 - 1) as u32;
                    bufs.splice(2..3, [r(a.src, cut), r(a.src + u64::from(cut), len as u32 - cut)]);
                    a.dst
                }
                _ => a.dst,
            };
            let head = vm.chain(&bufs);
            vm.push(head);
            heads.push(head);
            want.push((a, out_at, oracle(encrypt, &NIST_KEY, &NIST_IV, &src)));
        }
        let used = vm.run_batch();
        assert_eq!(
            used.iter().map(|u| u.id).collect::<Vec<_>>(),
            heads.iter().map(|&h| u32::from(h)).collect::<Vec<_>>(),
            "batch {batch}: used ids in avail order"
        );
        for (k, (u, (a, out_at, out))) in used.iter().zip(&want).enumerate() {
            assert_eq!(
                (u.len, vm.byte(a.status)),
                (out.len() as u32 + 1, OK),
                "batch {batch} request {k}"
            );
            assert_eq!(&vm.read(*out_at, out.len()), out, "batch {batch} request {k}");
            if *out_at == a.dst {
                vm.assert_canary(a.dst + out.len() as u64, DST_AREA - out.len());
            }
            vm.assert_canary(a.status + 1, STATUS_AREA - 1);
        }
    }
    assert!(kinds.iter().all(|&c| c > 20), "every kind of request: {kinds:?}");
}

/// Batches of large requests end on their byte cap (`MAX_BATCH_BYTES`,
/// 64 KiB of data gone through), not on `MAX_BATCH`: the chains after the cap
/// are left on the avail ring for the next batch, and every request is
/// completed once, in avail order, with the right output (OpenSSL's).
/// Encrypt requests of 3,072 bytes count when their group of 16 lanes
/// runs: 48 KiB after the first group, 96 KiB after the second, so the
/// batch ends at the 32nd (one at a time it would end at the 22nd, as the
/// decrypt requests below do).
#[test]
fn batches_of_large_requests_end_on_their_byte_cap() {
    byte_cap_batches(ENCRYPT, 3072, &[32, 8]);
}

/// As above for decrypt requests of 3,072 bytes, which are completed one
/// at a time (over `LaneReq::DECRYPT_GATHER_MAX`, not gathered as lanes):
/// the cap is checked after each, so the 22nd (66 KiB) ends the batch,
/// where groups of 16 would end it at the 32nd.
#[test]
fn batches_of_large_decrypt_requests_end_on_their_byte_cap() {
    byte_cap_batches(DECRYPT, 3072, &[22, 18]);
}

fn byte_cap_batches(opcode: u32, len: usize, batches: &[u32]) {
    let mut vm = Vm::new();
    const N: u16 = 40;
    let (session, encrypt) = if opcode == ENCRYPT { (E, true) } else { (D, false) };
    let mut heads = Vec::new();
    let mut want = Vec::new();
    for k in 0..N {
        let base = 0x100_0000 + u64::from(k) * 0x1_0000;
        let src: Vec<u8> = (0..len).map(|i| (i * 7 + usize::from(k) * 13) as u8).collect();
        let bufs = vm.stage_at(base, &hdr(opcode, session, len as u32, len as u32), &src);
        let head = vm.indirect(&bufs);
        vm.push(head);
        heads.push(head);
        want.push((Addrs::at(base), oracle(encrypt, &NIST_KEY, &NIST_IV, &src)));
    }
    let seen = vm.polling_batch_sizes();
    assert_eq!(seen, batches, "batches capped at MAX_BATCH_BYTES");
    for (k, (head, (a, ct))) in heads.iter().zip(&want).enumerate() {
        let u = vm.used(k as u16);
        assert_eq!(u.id, u32::from(*head), "used element {k}");
        assert_eq!(u.len, len as u32 + 1, "used length {k}");
        assert_eq!(vm.byte(a.status), OK, "status {k}");
        assert_eq!(&vm.read(a.dst, len), ct, "dst {k}");
    }
}

/// Long chains count towards the byte cap too (`DESCRIPTOR_WORK` bytes per
/// descriptor past the first `FREE_DESCRIPTORS`): 10 valid requests whose
/// indirect tables hold 995 zero-length descriptors before their five
/// buffers (and the ring descriptor pointing at the table) count
/// (1,001 - 16) × 16 = 15,760 bytes each, so they come in batches of 5,
/// not in one batch of 10 (64 chains of 32,768 descriptors in one batch
/// take 5–10 ms). Each is still completed with NIST F.2.1.
#[test]
fn batches_of_long_chains_end_on_the_byte_cap() {
    let mut vm = Vm::new();
    let mut bufs = vec![r(HDR, 0); 995];
    bufs.extend(vm.baseline());
    assert_eq!(bufs.len(), 1000);
    for _ in 0..10 {
        let head = vm.indirect(&bufs);
        vm.push(head);
    }
    let seen = vm.polling_batch_sizes();
    assert_eq!(
        seen,
        vec![5, 5],
        "batches of long chains capped at MAX_BATCH_BYTES"
    );
    for i in 0..10 {
        vm.assert_done(vm.used(i), &NIST_CT);
    }
}
