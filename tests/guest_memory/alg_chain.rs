// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Algorithm chaining (AES-CBC + HMAC-SHA1 / HMAC-SHA-256) through
//! `QueueWorker::process` on a split ring in real guest memory: the
//! AlgChain fields of the header (docs/PROTOCOL.md §5.2), digests made and
//! verified, and the batch byte cap's count of cipher and MAC bytes.
//!
//! Expected ciphertexts and MACs come from OpenSSL (`openssl::symm`,
//! `openssl::sign`), which shares no code with `aes`/`cbc`/`sha1`/`sha2`
//! or the `algorithms` crate. The request layout is the spec's
//! `virtio_crypto_alg_chain_data_vlf` as DPDK's guest driver sends it:
//! header | IV | src (readable), dst | hash result | status (writable).

use crate::common::*;
use vhost_user_crypto::wire::session::SymSessionInfo;
use vhost_user_crypto::wire::virtio_crypto::{AlgChainPara, OpDataReq};

const DIGEST: u64 = 0x15000;
const DIGEST_AREA: usize = 0x100;

/// Creates an AlgChain session: encrypt + CIPHER_THEN_HASH or decrypt +
/// HASH_THEN_CIPHER.
fn alg_chain_session(vm: &mut Vm, encrypt: bool, key: &[u8], mac: Mac, auth_key: &[u8], digest: u32) -> u64 {
    let mut i = SymSessionInfo {
        cipher_alg: 3,
        key_len: key.len() as u32,
        op_type: 2,
        direction: if encrypt { 1 } else { 2 },
        hash_mode: 2,
        alg_chain_order: if encrypt { 2 } else { 1 },
        hash_alg: mac.virtio(),
        auth_key_len: auth_key.len() as u32,
        hash_result_len: digest,
        ..Default::default()
    };
    i.cipher_key[..key.len()].copy_from_slice(key);
    i.auth_key[..auth_key.len()].copy_from_slice(auth_key);
    let id = vm.reg.create(&i);
    assert!(id > 0, "create returned {id}");
    id as u64
}

fn header(opcode: u32, sid: u64, src_len: u32, p: AlgChainPara) -> [u8; 72] {
    let mut b = OpDataReq {
        opcode,
        algo: 0,
        session_id: sid,
        op_type: 2,
        iv_len: 16,
        src_data_len: src_len,
        dst_data_len: src_len,
    }
    .to_bytes();
    p.write_to(&mut b);
    b
}

fn para(cipher: (u32, u32), hash: (u32, u32), digest: u32) -> AlgChainPara {
    AlgChainPara {
        cipher_start_src_offset: cipher.0,
        len_to_cipher: cipher.1,
        hash_start_src_offset: hash.0,
        len_to_hash: hash.1,
        aad_len: 0,
        hash_result_len: digest,
    }
}

/// Writes header, NIST IV and src at the default addresses, fills dst,
/// digest and status areas with the canary (then `digest_in`, the digest
/// the driver supplies on decrypt), and returns the six buffers with a
/// hash-result buffer of `digest_buf` bytes.
fn stage(vm: &Vm, h: &[u8; 72], src: &[u8], digest_in: &[u8], digest_buf: u32) -> Vec<Buf> {
    vm.write(HDR, h);
    vm.write(IV_ADDR, &NIST_IV);
    vm.write(SRC, src);
    vm.fill(DST, DST_AREA, CANARY);
    vm.fill(DIGEST, DIGEST_AREA, CANARY);
    vm.write(DIGEST, digest_in);
    vm.fill(STATUS, STATUS_AREA, CANARY);
    let n = src.len() as u32;
    vec![
        r(HDR, 72),
        r(IV_ADDR, 16),
        r(SRC, n),
        w(DST, n),
        w(DIGEST, digest_buf),
        w(STATUS, 1),
    ]
}

/// Expected dst of a chained request: src with the cipher range run
/// through OpenSSL AES-CBC.
fn expected_dst(encrypt: bool, key: &[u8], src: &[u8], p: &AlgChainPara) -> Vec<u8> {
    let (o, l) = (p.cipher_start_src_offset as usize, p.len_to_cipher as usize);
    let mut out = src.to_vec();
    if l > 0 {
        out[o..o + l].copy_from_slice(&oracle(encrypt, key, &NIST_IV, &src[o..o + l]));
    }
    out
}

#[track_caller]
fn assert_alg_chain_ok(vm: &Vm, u: Used, dst: &[u8], digest: &[u8]) {
    assert_eq!(vm.byte(STATUS), OK, "status");
    assert_eq!(u.len, (dst.len() + digest.len() + 1) as u32, "used length");
    assert_eq!(vm.read(DST, dst.len()), dst, "dst");
    vm.assert_canary(DST + dst.len() as u64, DST_AREA - dst.len());
    assert_eq!(vm.read(DIGEST, digest.len()), digest, "hash result");
    vm.assert_canary(DIGEST + digest.len() as u64, DIGEST_AREA - digest.len());
    vm.assert_canary(STATUS + 1, STATUS_AREA - 1);
}

/// Failed with `status`: used 1, dst untouched, the hash-result area holds
/// exactly what the driver put there.
#[track_caller]
fn assert_alg_chain_failed(vm: &Vm, u: Used, status: u8, digest_in: &[u8]) {
    assert_eq!(vm.byte(STATUS), status, "status");
    assert_eq!(u.len, 1, "used length");
    vm.assert_canary(DST, DST_AREA);
    assert_eq!(vm.read(DIGEST, digest_in.len()), digest_in, "hash result changed");
    vm.assert_canary(DIGEST + digest_in.len() as u64, DIGEST_AREA - digest_in.len());
    vm.assert_canary(STATUS + 1, STATUS_AREA - 1);
}

#[test]
fn encrypt_then_hmac_sha1_truncated() {
    let mut vm = Vm::new();
    let mut rng = Rng::new(1);
    let auth = rng.bytes(20);
    let sid = alg_chain_session(&mut vm, true, &NIST_KEY, Mac::Sha1, &auth, 12);
    let src = rng.bytes(256);
    // An ESP-like request: 16 bytes in clear, the rest encrypted, the MAC
    // over the whole output.
    let p = para((16, 224), (0, 256), 12);
    let b = stage(&vm, &header(ENCRYPT, sid, 256, p), &src, &[], 12);
    let u = vm.submit_indirect(&b);
    let dst = expected_dst(true, &NIST_KEY, &src, &p);
    assert_eq!(&dst[..16], &src[..16]);
    let tag = hmac(Mac::Sha1, &auth, &dst);
    assert_alg_chain_ok(&vm, u, &dst, &tag[..12]);
}

#[test]
fn encrypt_then_hmac_sha256_in_place_partial_hash() {
    // DPDK's guest driver: dst at the same address as src, and DPDK 22.11's
    // len_to_cipher = src_data_len - cipher_start_src_offset.
    let mut vm = Vm::new();
    let mut rng = Rng::new(2);
    let key = rng.bytes(32);
    let auth = rng.bytes(64);
    let sid = alg_chain_session(&mut vm, true, &key, Mac::Sha256, &auth, 32);
    let src = rng.bytes(1024);
    let p = para((32, 992), (8, 1000), 32);
    let mut b = stage(&vm, &header(ENCRYPT, sid, 1024, p), &src, &[], 32);
    b[3] = w(SRC, 1024);
    let u = vm.submit(&b);
    let dst = expected_dst(true, &key, &src, &p);
    let tag = hmac(Mac::Sha256, &auth, &dst[8..1008]);
    assert_eq!(vm.byte(STATUS), OK);
    assert_eq!(u.len, 1024 + 32 + 1);
    assert_eq!(vm.read(SRC, 1024), dst, "in-place output");
    assert_eq!(vm.read(DIGEST, 32), tag);
    vm.assert_canary(DST, DST_AREA);
    vm.assert_canary(DIGEST + 32, DIGEST_AREA - 32);
}

#[test]
fn hmac_sha256_verify_then_decrypt() {
    let mut vm = Vm::new();
    let mut rng = Rng::new(3);
    let auth = rng.bytes(100); // longer than SHA-256's block: hashed first
    let sid = alg_chain_session(&mut vm, false, &NIST_KEY, Mac::Sha256, &auth, 16);
    let plain = rng.bytes(512);
    let p = para((0, 512), (0, 512), 16);
    let ct = expected_dst(true, &NIST_KEY, &plain, &p);
    let tag = hmac(Mac::Sha256, &auth, &ct);
    let b = stage(&vm, &header(DECRYPT, sid, 512, p), &ct, &tag[..16], 16);
    let u = vm.submit_indirect(&b);
    // The hash result keeps the driver's digest.
    assert_alg_chain_ok(&vm, u, &plain, &tag[..16]);
}

#[test]
fn empty_src_gives_the_mac_of_the_empty_message() {
    // A chaining request with 0 bytes of src is valid (unlike a plain
    // cipher request of 0 bytes): the hash result is HMAC("") truncated,
    // used length 0 + digest + 1.
    let mut vm = Vm::new();
    let auth: Vec<u8> = (1..=20).collect();
    let sid = alg_chain_session(&mut vm, true, &NIST_KEY, Mac::Sha1, &auth, 12);
    let p = para((0, 0), (0, 0), 12);
    let mut b = stage(&vm, &header(ENCRYPT, sid, 0, p), &[], &[], 12);
    b.retain(|x| x.len > 0);
    let u = vm.submit(&b);
    assert_alg_chain_ok(&vm, u, &[], &hmac(Mac::Sha1, &auth, b"")[..12]);
    // The same on decrypt: the digest of the empty message verifies, a
    // wrong one does not.
    let dsid = alg_chain_session(&mut vm, false, &NIST_KEY, Mac::Sha1, &auth, 12);
    let good = hmac(Mac::Sha1, &auth, b"");
    let mut b = stage(&vm, &header(DECRYPT, dsid, 0, p), &[], &good[..12], 12);
    b.retain(|x| x.len > 0);
    let u = vm.submit(&b);
    assert_alg_chain_ok(&vm, u, &[], &good[..12]);
    let mut bad = good[..12].to_vec();
    bad[3] ^= 0x40;
    let mut b = stage(&vm, &header(DECRYPT, dsid, 0, p), &[], &bad, 12);
    b.retain(|x| x.len > 0);
    let u = vm.submit(&b);
    assert_alg_chain_failed(&vm, u, ERR, &bad);
}

/// Random chained requests, random offsets, random descriptor cuts of
/// src, dst and the hash result, both directions and MACs: every output
/// equals OpenSSL's.
#[test]
fn random_chained_requests_match_openssl() {
    let mut vm = Vm::new();
    let mut rng = Rng::new(6);
    for i in 0..300 {
        let encrypt = i % 2 == 0;
        let mac = if i % 4 < 2 { Mac::Sha1 } else { Mac::Sha256 };
        let full = if mac == Mac::Sha1 { 20 } else { 32 };
        let key = rng.bytes([16, 24, 32][i % 3]);
        let auth_len = rng.range(0, 300) as usize;
        let auth = rng.bytes(auth_len);
        let digest = rng.range(1, full) as u32;
        let sid = alg_chain_session(&mut vm, encrypt, &key, mac, &auth, digest);
        let len = rng.range(0, 2048) as usize;
        let c_len = (rng.range(0, len as u64) as usize) & !15;
        let c_off = rng.range(0, (len - c_len) as u64) as usize;
        let h_off = rng.range(0, len as u64) as usize;
        let h_len = rng.range(0, (len - h_off) as u64) as usize;
        let p = para((c_off as u32, c_len as u32), (h_off as u32, h_len as u32), digest);
        let src = rng.bytes(len);
        let dst = expected_dst(encrypt, &key, &src, &p);
        let tag = if encrypt {
            hmac(mac, &auth, &dst[h_off..h_off + h_len])
        } else {
            hmac(mac, &auth, &src[h_off..h_off + h_len])
        };
        let tag = &tag[..digest as usize];
        let digest_in: &[u8] = if encrypt { &[] } else { tag };
        let mut bufs = stage(
            &vm,
            &header(if encrypt { ENCRYPT } else { DECRYPT }, sid, len as u32, p),
            &src,
            digest_in,
            digest,
        );
        // Cut src (readable), dst and the hash result (writable) at random.
        let mut cut = Vec::new();
        for b in bufs.drain(..) {
            if b.len > 1 && b.addr != HDR && b.addr != STATUS {
                let mut at = 0;
                for piece in rng.cuts(b.len as usize, 4) {
                    cut.push(Buf {
                        addr: b.addr + at as u64,
                        len: piece as u32,
                        write: b.write,
                    });
                    at += piece;
                }
            } else if b.len > 0 {
                cut.push(b);
            }
        }
        let u = if i % 3 == 0 {
            vm.submit(&cut)
        } else {
            vm.submit_indirect(&cut)
        };
        assert_alg_chain_ok(&vm, u, &dst, tag);
        assert!(vm.reg.close(sid));
    }
}

#[test]
fn bad_chain_fields_are_err() {
    let mut vm = Vm::new();
    let mut rng = Rng::new(5);
    let auth = rng.bytes(20);
    let enc = alg_chain_session(&mut vm, true, &NIST_KEY, Mac::Sha1, &auth, 12);
    let src = rng.bytes(256);
    let ok = para((16, 224), (0, 256), 12);
    let m = u32::MAX;
    let cases: Vec<(&str, AlgChainPara, u8)> = vec![
        ("cipher range past src", para((16, 256), (0, 256), 12), ERR),
        ("cipher offset past src", para((272, 0), (0, 256), 12), ERR),
        (
            "cipher offset + length wraps 32 bits",
            para((0xFFFF_FFF0, 0x20), (0, 256), 12),
            ERR,
        ),
        (
            "len_to_cipher not whole blocks",
            para((16, 17), (0, 256), 12),
            ERR,
        ),
        (
            "len_to_cipher 2^32 - 16",
            para((0, 0xFFFF_FFF0), (0, 256), 12),
            ERR,
        ),
        ("hash range past src", para((16, 224), (1, 256), 12), ERR),
        ("len_to_hash 0xFFFFFFFF", para((16, 224), (0, m), 12), ERR),
        ("hash offset 0xFFFFFFFF", para((16, 224), (m, 1), 12), ERR),
        (
            "hash offset + length wraps 32 bits",
            para((16, 224), (m, 2), 12),
            ERR,
        ),
        ("digest longer than SHA-1", para((16, 224), (0, 256), 21), ERR),
        ("digest 33", para((16, 224), (0, 256), 33), ERR),
        ("digest 0xFFFFFFFF", para((16, 224), (0, 256), m), ERR),
        ("digest 0", para((16, 224), (0, 256), 0), ERR),
        (
            "digest shorter than the session's",
            para((16, 224), (0, 256), 11),
            ERR,
        ),
        ("aad", AlgChainPara { aad_len: 16, ..ok }, NOTSUPP),
    ];
    for (name, p, status) in cases {
        let digest_buf = p.hash_result_len.min(64);
        let b = stage(&vm, &header(ENCRYPT, enc, 256, p), &src, &[], digest_buf);
        let u = vm.submit(&b);
        assert_eq!(vm.byte(STATUS), status, "{name}: status");
        assert_eq!(u.len, 1, "{name}: used length");
        vm.assert_canary(DST, DST_AREA);
        vm.assert_canary(DIGEST, DIGEST_AREA);
    }

    // Writable area one byte short of dst + digest + status.
    let b = stage(&vm, &header(ENCRYPT, enc, 256, ok), &src, &[], 11);
    let u = vm.submit(&b);
    assert_alg_chain_failed(&vm, u, ERR, &[]);

    // src_data_len != dst_data_len.
    let mut h = header(ENCRYPT, enc, 256, ok);
    h[32..36].copy_from_slice(&240u32.to_le_bytes());
    let b = stage(&vm, &h, &src, &[], 12);
    let u = vm.submit(&b);
    assert_alg_chain_failed(&vm, u, ERR, &[]);

    // A chaining request on a cipher session, a cipher request on a
    // chaining session, and the wrong direction.
    let b = stage(&vm, &header(ENCRYPT, E, 256, ok), &src, &[], 12);
    let u = vm.submit(&b);
    assert_alg_chain_failed(&vm, u, ERR, &[]);
    let mut h = header(ENCRYPT, enc, 256, ok);
    h[64] = 1;
    let b = stage(&vm, &h, &src, &[], 12);
    let u = vm.submit(&b);
    assert_alg_chain_failed(&vm, u, ERR, &[]);
    let b = stage(&vm, &header(DECRYPT, enc, 256, ok), &src, &[], 12);
    let u = vm.submit(&b);
    assert_alg_chain_failed(&vm, u, ERR, &[]);

    // Unknown session: INVSESS.
    let b = stage(&vm, &header(ENCRYPT, 999, 256, ok), &src, &[], 12);
    let u = vm.submit(&b);
    assert_alg_chain_failed(&vm, u, INVSESS, &[]);

    // And the baseline request itself is fine.
    let b = stage(&vm, &header(ENCRYPT, enc, 256, ok), &src, &[], 12);
    let u = vm.submit(&b);
    let dst = expected_dst(true, &NIST_KEY, &src, &ok);
    assert_alg_chain_ok(&vm, u, &dst, &hmac(Mac::Sha1, &auth, &dst)[..12]);
}

#[test]
fn forged_or_truncated_digest_on_decrypt_is_err_and_dst_untouched() {
    for mac in [Mac::Sha1, Mac::Sha256] {
        let mut vm = Vm::new();
        let mut rng = Rng::new(4);
        let auth = rng.bytes(20);
        let full = if mac == Mac::Sha1 { 20 } else { 32 };
        let sid = alg_chain_session(&mut vm, false, &NIST_KEY, mac, &auth, full);
        let ct = rng.bytes(256);
        let p = para((16, 240), (0, 256), full);
        let good = hmac(mac, &auth, &ct);
        // Every bit position of the first and last digest byte.
        for (byte, bit) in (0..8)
            .map(|b| (0, b))
            .chain((0..8).map(|b| (full as usize - 1, b)))
        {
            let mut forged = good.clone();
            forged[byte] ^= 1 << bit;
            let b = stage(&vm, &header(DECRYPT, sid, 256, p), &ct, &forged, full);
            let u = vm.submit(&b);
            assert_alg_chain_failed(&vm, u, ERR, &forged);
        }
        // The MAC of other bytes (hash range shifted by one) is a forgery too.
        let other = hmac(mac, &auth, &ct[1..]);
        let b = stage(&vm, &header(DECRYPT, sid, 256, p), &ct, &other, full);
        let u = vm.submit(&b);
        assert_alg_chain_failed(&vm, u, ERR, &other);
        // A zeroed hash result (a backend that ignores it would accept this).
        let zero = vec![0u8; full as usize];
        let b = stage(&vm, &header(DECRYPT, sid, 256, p), &ct, &zero, full);
        let u = vm.submit(&b);
        assert_alg_chain_failed(&vm, u, ERR, &zero);
        // The genuine digest still verifies afterwards.
        let b = stage(&vm, &header(DECRYPT, sid, 256, p), &ct, &good, full);
        let u = vm.submit(&b);
        assert_alg_chain_ok(&vm, u, &expected_dst(false, &NIST_KEY, &ct, &p), &good);
    }
}

/// A failed digest check hashes the whole range and completes with 1
/// used byte: the batch byte cap (`MAX_BATCH_BYTES`, 64 KiB) counts the
/// bytes hashed, so 40 such requests of 4 KiB come in batches of 16, 16
/// and 8, not in one batch of 40 (with requests of `--max-request-bytes`,
/// one batch would hold the worker's locks for 64 of them).
#[test]
fn failed_digest_checks_count_their_hashed_bytes_towards_the_batch_byte_cap() {
    let mut vm = Vm::new();
    let mut rng = Rng::new(9);
    let auth = rng.bytes(20);
    let sid = alg_chain_session(&mut vm, false, &NIST_KEY, Mac::Sha256, &auth, 32);
    const LEN: u32 = 4096;
    let ct = rng.bytes(LEN as usize);
    let mut forged = hmac(Mac::Sha256, &auth, &ct);
    forged[0] ^= 1;
    let b = stage(
        &vm,
        &header(DECRYPT, sid, LEN, para((0, LEN), (0, LEN), 32)),
        &ct,
        &forged,
        32,
    );
    for _ in 0..40 {
        let head = vm.indirect(&b);
        vm.push(head);
    }
    let seen = vm.polling_batch_sizes();
    assert_eq!(seen, vec![16, 16, 8]);
    for i in 0..40 {
        assert_eq!(vm.used(i).len, 1, "used length {i}");
    }
    assert_alg_chain_failed(&vm, vm.used(39), ERR, &forged);
}

/// Chained requests that succeed count their cipher and their MAC bytes
/// towards the batch byte cap: 24 encrypt + HMAC-SHA-256 requests of 4 KiB,
/// the MAC over all of it, count 8 KiB each, so they come in batches of
/// 8 (by used lengths, 4,129 bytes each, they came in batches of 16). The
/// hash result is cut in two descriptors, so each runs on its own.
#[test]
fn chained_requests_count_cipher_and_mac_bytes_towards_the_batch_byte_cap() {
    let mut vm = Vm::new();
    let mut rng = Rng::new(10);
    let auth = rng.bytes(32);
    let sid = alg_chain_session(&mut vm, true, &NIST_KEY, Mac::Sha256, &auth, 32);
    const LEN: u32 = 4096;
    let src = rng.bytes(LEN as usize);
    let p = para((0, LEN), (0, LEN), 32);
    let mut b = stage(&vm, &header(ENCRYPT, sid, LEN, p), &src, &[], 32);
    b.splice(4..5, [w(DIGEST, 16), w(DIGEST + 16, 16)]);
    for _ in 0..24 {
        let head = vm.indirect(&b);
        vm.push(head);
    }
    let seen = vm.polling_batch_sizes();
    assert_eq!(seen, vec![8, 8, 8]);
    // The 24 share their buffers: each wrote the same output.
    let dst = expected_dst(true, &NIST_KEY, &src, &p);
    assert_alg_chain_ok(&vm, vm.used(23), &dst, &hmac(Mac::Sha256, &auth, &dst));
}

/// The same through the multi-buffer lanes, which count when their group
/// of 16 (`algorithms::MAX_LANES`) runs: 64 requests of 1 KiB, the MAC
/// over all of it, count 2 KiB each, so they come in batches of two
/// groups, 32 and 32 (by used lengths, 1,057 bytes each, they came in one
/// batch of 64).
#[test]
fn chained_lanes_count_cipher_and_mac_bytes_towards_the_batch_byte_cap() {
    let mut vm = Vm::new();
    let mut rng = Rng::new(11);
    let auth = rng.bytes(32);
    let sid = alg_chain_session(&mut vm, true, &NIST_KEY, Mac::Sha256, &auth, 32);
    const LEN: u32 = 1024;
    let src = rng.bytes(LEN as usize);
    let p = para((0, LEN), (0, LEN), 32);
    let b = stage(&vm, &header(ENCRYPT, sid, LEN, p), &src, &[], 32);
    for _ in 0..64 {
        let head = vm.indirect(&b);
        vm.push(head);
    }
    let seen = vm.polling_batch_sizes();
    assert_eq!(seen, vec![32, 32]);
    let dst = expected_dst(true, &NIST_KEY, &src, &p);
    assert_alg_chain_ok(&vm, vm.used(63), &dst, &hmac(Mac::Sha256, &auth, &dst));
}

/// One chained request of a batch, staged at its own 64 KiB: header at
/// +0, IV at +0x100, src at +0x1000, dst at +0x3000 (or src, in place),
/// the hash result right after dst (or apart, at +0x5000, in its own
/// descriptor either way), status at +0x6000.
struct Staged {
    base: u64,
    dst_addr: u64,
    digest_addr: u64,
    dst: Vec<u8>,
    digest: Vec<u8>,
    /// Decrypt with a forged digest: ERR, dst untouched.
    forged: bool,
}

/// Batches of chained requests, as DPDK's guest driver sends them in
/// bursts: in place or not, random cipher and hash ranges, truncated
/// digests, some forged digests on decrypt, hash results right after dst
/// (the multi-buffer lanes take those) or apart (one at a time), two
/// sessions interleaved in some batches. Every output equals OpenSSL's,
/// and nothing outside dst, the hash result and the status is written.
#[test]
fn batches_of_chained_requests_match_openssl() {
    let mut vm = Vm::new();
    let mut rng = Rng::new(7);
    for round in 0..40 {
        let encrypt = round % 2 == 0;
        let mac = if round % 4 < 2 { Mac::Sha1 } else { Mac::Sha256 };
        let full = if mac == Mac::Sha1 { 20 } else { 32 };
        let sessions: Vec<_> = (0..1 + round % 3 / 2)
            .map(|_| {
                let key_len = [16, 24, 32][rng.range(0, 2) as usize];
                let key = rng.bytes(key_len);
                let auth_len = rng.range(0, 100) as usize;
                let auth = rng.bytes(auth_len);
                let digest = if rng.range(0, 1) == 0 {
                    12
                } else {
                    rng.range(1, full) as u32
                };
                let sid = alg_chain_session(&mut vm, encrypt, &key, mac, &auth, digest);
                (sid, key, auth, digest)
            })
            .collect();
        let count = rng.range(1, 40) as usize;
        let mut staged = Vec::new();
        for k in 0..count {
            let (sid, key, auth, digest) = &sessions[(k / 3) % sessions.len()];
            let base = 0x100_0000 + k as u64 * 0x10000;
            let len = rng.range(1, 4000) as usize;
            let c_len = (rng.range(0, len as u64) as usize) & !15;
            let c_off = rng.range(0, (len - c_len) as u64) as usize;
            let h_off = rng.range(0, len as u64) as usize;
            let h_len = rng.range(0, (len - h_off) as u64) as usize;
            let p = para(
                (c_off as u32, c_len as u32),
                (h_off as u32, h_len as u32),
                *digest,
            );
            let src = rng.bytes(len);
            let dst = expected_dst(encrypt, key, &src, &p);
            let hashed = if encrypt { &dst } else { &src };
            let tag = hmac(mac, auth, &hashed[h_off..h_off + h_len])[..*digest as usize].to_vec();
            let in_place = rng.range(0, 1) == 0;
            let dst_addr = base + if in_place { 0x1000 } else { 0x3000 };
            let digest_addr = if rng.range(0, 4) == 0 {
                base + 0x5000
            } else {
                dst_addr + len as u64
            };
            let forged = !encrypt && rng.range(0, 3) == 0;
            let mut digest_in = if encrypt { Vec::new() } else { tag.clone() };
            if forged {
                digest_in[0] ^= 1;
            }
            let op = if encrypt { ENCRYPT } else { DECRYPT };
            vm.write(base, &header(op, *sid, len as u32, p));
            vm.write(base + 0x100, &NIST_IV);
            vm.fill(base + 0x1000, 0xF000, CANARY);
            vm.write(base + 0x1000, &src);
            vm.write(digest_addr, &digest_in);
            let bufs = [
                r(base, 72),
                r(base + 0x100, 16),
                r(base + 0x1000, len as u32),
                w(dst_addr, len as u32),
                w(digest_addr, *digest),
                w(base + 0x6000, 1),
            ];
            let head = if k % 2 == 0 {
                vm.chain(&bufs)
            } else {
                vm.indirect(&bufs)
            };
            vm.push(head);
            let (dst, digest) = if forged { (src, digest_in) } else { (dst, tag) };
            staged.push(Staged {
                base,
                dst_addr,
                digest_addr,
                dst,
                digest,
                forged,
            });
        }
        let used = vm.run_batch();
        for (k, (s, u)) in staged.iter().zip(&used).enumerate() {
            let ctx = format!("round {round}, request {k}");
            let len = s.dst.len();
            if s.forged {
                assert_eq!(
                    (vm.byte(s.base + 0x6000), u.len),
                    (ERR, 1),
                    "{ctx}: forged digest"
                );
            } else {
                assert_eq!(
                    (vm.byte(s.base + 0x6000), u.len),
                    (OK, (len + s.digest.len() + 1) as u32),
                    "{ctx}"
                );
            }
            // In place, or forged: dst (src) holds the expected bytes; out of
            // place and forged, dst is untouched.
            if !s.forged || s.dst_addr == s.base + 0x1000 {
                assert_eq!(vm.read(s.dst_addr, len), s.dst, "{ctx}: dst");
            } else {
                vm.assert_canary(s.dst_addr, len);
            }
            assert_eq!(
                vm.read(s.digest_addr, s.digest.len()),
                s.digest,
                "{ctx}: hash result"
            );
            let after = s.digest_addr + s.digest.len() as u64;
            vm.assert_canary(after, (s.base + 0x6000 - after) as usize);
            vm.assert_canary(s.base + 0x6001, 0x10000 - 0x6001);
        }
        for (sid, ..) in &sessions {
            assert!(vm.reg.close(*sid));
        }
    }
}

/// Chained requests of one batch whose buffers a guest made meet run one
/// at a time in avail order, as if each batch held one request: request
/// 0's hash result is the start of request 1's src (in place), so request
/// 1 encrypts and MACs its src with request 0's digest in it; requests 1
/// and 2 share their hash result, which ends with request 2's digest.
#[test]
fn chained_requests_whose_hash_results_meet_run_in_avail_order() {
    let mut vm = Vm::new();
    let mut rng = Rng::new(12);
    let auth = rng.bytes(20);
    let sid = alg_chain_session(&mut vm, true, &NIST_KEY, Mac::Sha1, &auth, 12);
    let p = para((0, 256), (0, 256), 12);
    let base = |k: u64| 0x100_0000 + k * 0x10000;
    let shared = 0x180_0000;
    vm.fill(shared, 64, CANARY);
    let srcs: Vec<Vec<u8>> = (0..3).map(|_| rng.bytes(256)).collect();
    for k in 0..3u64 {
        let b = base(k);
        vm.write(b, &header(ENCRYPT, sid, 256, p));
        vm.write(b + 0x100, &NIST_IV);
        vm.write(b + 0x1000, &srcs[k as usize]);
        // Request 1 in place; request 0's digest at request 1's src.
        let dst = if k == 1 { b + 0x1000 } else { b + 0x3000 };
        let digest = if k == 0 { base(1) + 0x1000 } else { shared };
        let bufs = [
            r(b, 72),
            r(b + 0x100, 16),
            r(b + 0x1000, 256),
            w(dst, 256),
            w(digest, 12),
            w(b + 0x6000, 1),
        ];
        let head = vm.chain(&bufs);
        vm.push(head);
    }
    let dst0 = expected_dst(true, &NIST_KEY, &srcs[0], &p);
    let tag0 = hmac(Mac::Sha1, &auth, &dst0)[..12].to_vec();
    let mut src1 = srcs[1].clone();
    src1[..12].copy_from_slice(&tag0);
    let dst1 = expected_dst(true, &NIST_KEY, &src1, &p);
    let dst2 = expected_dst(true, &NIST_KEY, &srcs[2], &p);
    let tag2 = hmac(Mac::Sha1, &auth, &dst2)[..12].to_vec();
    let used = vm.run_batch();
    for (k, u) in used.iter().enumerate() {
        assert_eq!(
            (vm.byte(base(k as u64) + 0x6000), u.len),
            (OK, 256 + 12 + 1),
            "request {k}"
        );
    }
    assert_eq!(vm.read(base(0) + 0x3000, 256), dst0, "request 0's dst");
    assert_eq!(
        vm.read(base(1) + 0x1000, 256),
        dst1,
        "request 1's dst, from its src with request 0's digest"
    );
    assert_eq!(vm.read(base(2) + 0x3000, 256), dst2, "request 2's dst");
    assert_eq!(
        vm.read(shared, 12),
        tag2,
        "the shared hash result: request 2's digest"
    );
    vm.assert_canary(shared + 12, 52);
}
