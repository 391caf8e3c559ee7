// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! No copy of a closed session's key material is left anywhere in the
//! daemon's memory: not on the heap (also `tests/key_zeroize.rs`) and not
//! on the stack of any of its threads, where moves and the cipher
//! libraries leave copies that no value owns (round keys, the HMAC states,
//! ring's padded HMAC key).
//!
//! The daemon runs as a child process; the test stops it (SIGSTOP), reads
//! every private writable mapping of it through `/proc/<pid>/mem` (allowed
//! for a child of the same user) and looks for byte strings derived from the keys by
//! this file's own code, not by the daemon's libraries: the AES-128 round
//! keys (FIPS-197 §5.2 key expansion) and the HMAC-SHA1 inner and outer
//! states after the key block (RFC 2104 with the FIPS 180-4 §6.1.2
//! compression function), both checked here against the standards'
//! examples. While the sessions are live the same scan must find them (in
//! the session tables), so the test cannot pass by not looking in the
//! right place, or by a needle in a form the libraries do not use.
//!
//! Two cases: the queue worker waiting for kicks when the sessions are
//! closed (it wipes its stack whenever it goes back to waiting), and the
//! worker busy-polling the ring when they are closed (it wipes at its next
//! look at the ring).

#[path = "common/daemon.rs"]
mod daemon;

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use daemon::spawn_daemon;
use openssl::symm::{Cipher, Crypter, Mode};
use vhost_crypto_replay::frontend::{CryptoFrontend, DescMode, FrontendConfig};
use vhost_user_crypto::session_msg::{SessionAbi, SymSessionInfo};
use vhost_user_crypto::wire::{AlgChainPara, OpDataReq};

/// The cipher session's key, and the chaining session's AES and HMAC keys.
const CIPHER_KEY: [u8; 16] = *b"\x5e\xc1\x3e\x70residue-k1\x0f\x19";
const CHAIN_KEY: [u8; 16] = *b"\xa7\x42\x90\x1bresidue-k2\x6d\xe3";
const AUTH_KEY: [u8; 20] = *b"\x3c\x8d\x21\xf4residue-hmac-key";
const IV: [u8; 16] = [0x24; 16];
/// Requests per session and size (bytes): 8 cipher requests fill the
/// multi-buffer lanes.
const CIPHER_REQUESTS: usize = 8;
const LEN: usize = 256;
const DIGEST: u32 = 20;

// ---- independent derivations ----

const SBOX_ROWS: [u128; 16] = [
    0x637c777bf26b6fc53001672bfed7ab76,
    0xca82c97dfa5947f0add4a2af9ca472c0,
    0xb7fd9326363ff7cc34a5e5f171d83115,
    0x04c723c31896059a071280e2eb27b275,
    0x09832c1a1b6e5aa0523bd6b329e32f84,
    0x53d100ed20fcb15b6acbbe394a4c58cf,
    0xd0efaafb434d338545f9027f503c9fa8,
    0x51a3408f929d38f5bcb6da2110fff3d2,
    0xcd0c13ec5f974417c4a77e3d645d1973,
    0x60814fdc222a908846eeb814de5e0bdb,
    0xe0323a0a4906245cc2d3ac629195e479,
    0xe7c8376d8dd54ea96c56f4ea657aae08,
    0xba78252e1ca6b4c6e8dd741f4bbd8b8a,
    0x703eb5664803f60e613557b986c11d9e,
    0xe1f8981169d98e949b1e87e9ce5528df,
    0x8ca1890dbfe6426841992d0fb054bb16,
];

/// The AES S-box (FIPS-197 Figure 7).
fn sbox(b: u8) -> u8 {
    (SBOX_ROWS[usize::from(b >> 4)] >> (8 * (15 - (b & 15)))) as u8
}

/// The 11 round keys of AES-128 (FIPS-197 §5.2), as bytes.
fn aes128_round_keys(key: &[u8; 16]) -> [[u8; 16]; 11] {
    let mut w = [[0u8; 4]; 44];
    for (i, c) in key.chunks(4).enumerate() {
        w[i].copy_from_slice(c);
    }
    let mut rcon = 1u8;
    for i in 4..44 {
        let mut t = w[i - 1];
        if i % 4 == 0 {
            t = [sbox(t[1]) ^ rcon, sbox(t[2]), sbox(t[3]), sbox(t[0])];
            rcon = (rcon << 1) ^ if rcon & 0x80 != 0 { 0x1b } else { 0 };
        }
        for j in 0..4 {
            w[i][j] = w[i - 4][j] ^ t[j];
        }
    }
    let mut rk = [[0u8; 16]; 11];
    for (r, k) in rk.iter_mut().enumerate() {
        for j in 0..4 {
            k[4 * j..4 * j + 4].copy_from_slice(&w[4 * r + j]);
        }
    }
    rk
}

const SHA1_H0: [u32; 5] = [0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476, 0xC3D2E1F0];

/// One SHA-1 compression (FIPS 180-4 §6.1.2) of `block` into `h`.
fn sha1_compress(mut h: [u32; 5], block: &[u8; 64]) -> [u32; 5] {
    let mut w = [0u32; 80];
    for (i, c) in block.chunks(4).enumerate() {
        w[i] = u32::from_be_bytes(c.try_into().unwrap());
    }
    for t in 16..80 {
        w[t] = (w[t - 3] ^ w[t - 8] ^ w[t - 14] ^ w[t - 16]).rotate_left(1);
    }
    let [mut a, mut b, mut c, mut d, mut e] = h;
    for (t, &wt) in w.iter().enumerate() {
        let (f, k) = match t {
            0..=19 => ((b & c) | (!b & d), 0x5A827999),
            20..=39 => (b ^ c ^ d, 0x6ED9EBA1),
            40..=59 => ((b & c) | (b & d) | (c & d), 0x8F1BBCDC),
            _ => (b ^ c ^ d, 0xCA62C1D6),
        };
        let tmp = a
            .rotate_left(5)
            .wrapping_add(f)
            .wrapping_add(e)
            .wrapping_add(k)
            .wrapping_add(wt);
        e = d;
        d = c;
        c = b.rotate_left(30);
        b = a;
        a = tmp;
    }
    for (x, y) in h.iter_mut().zip([a, b, c, d, e]) {
        *x = x.wrapping_add(y);
    }
    h
}

/// HMAC-SHA1's state after the inner (0x36) or outer (0x5c) key block
/// (RFC 2104 §2), as ring keeps it: the five words in the machine's byte
/// order (checked against a live `MacKey` below).
fn hmac_sha1_state(key: &[u8], pad: u8) -> Vec<u8> {
    let mut block = [pad; 64];
    for (b, k) in block.iter_mut().zip(key) {
        *b ^= k;
    }
    sha1_compress(SHA1_H0, &block)
        .iter()
        .flat_map(|w| w.to_ne_bytes())
        .collect()
}

/// Everything derived from the three keys that must be gone after CLOSE:
/// (name, bytes). The raw keys are the first round keys.
fn needles() -> Vec<(String, Vec<u8>)> {
    let mut n = Vec::new();
    for (name, key) in [("cipher", CIPHER_KEY), ("chain", CHAIN_KEY)] {
        for (r, k) in aes128_round_keys(&key).iter().enumerate() {
            n.push((format!("{name} AES round key {r}"), k.to_vec()));
        }
    }
    n.push(("HMAC inner state".into(), hmac_sha1_state(&AUTH_KEY, 0x36)));
    n.push(("HMAC outer state".into(), hmac_sha1_state(&AUTH_KEY, 0x5c)));
    let padded = |pad: u8| AUTH_KEY.iter().map(|k| k ^ pad).collect::<Vec<u8>>();
    n.push(("HMAC key ^ ipad".into(), padded(0x36)));
    n.push(("HMAC key ^ opad".into(), padded(0x5c)));
    n.push(("HMAC key".into(), AUTH_KEY.to_vec()));
    n
}

#[test]
fn the_derivations_match_the_standards_and_the_libraries() {
    // FIPS-197 Appendix A.1: the last round key of 2b7e1516...
    let key: [u8; 16] = hex("2b7e151628aed2a6abf7158809cf4f3c").try_into().unwrap();
    assert_eq!(
        aes128_round_keys(&key)[10].to_vec(),
        hex("d014f9a8c9ee2589e13f0cc8b6630ca6")
    );
    // FIPS 180-4 example "abc" (one block): a9993e36 4706816a ba3e2571 7850c26c 9cd0d89d.
    let mut block = [0u8; 64];
    block[..3].copy_from_slice(b"abc");
    block[3] = 0x80;
    block[63] = 24;
    assert_eq!(
        sha1_compress(SHA1_H0, &block),
        [0xa9993e36, 0x4706816a, 0xba3e2571, 0x7850c26c, 0x9cd0d89d]
    );
    // The libraries keep them in these forms: a live key schedule holds
    // the round keys, a live HMAC key both states.
    let aes = algorithms::AesCbcKey::new(&CHAIN_KEY).unwrap();
    let mac = algorithms::MacKey::new(algorithms::MacAlg::HmacSha1, &AUTH_KEY, DIGEST as usize).unwrap();
    // SAFETY: reads the bytes of two live values (padding included, which
    // is fine for a test that only compares them).
    let (aes_bytes, mac_bytes) = unsafe {
        (
            std::slice::from_raw_parts(&aes as *const _ as *const u8, std::mem::size_of_val(&aes)),
            std::slice::from_raw_parts(&mac as *const _ as *const u8, std::mem::size_of_val(&mac)),
        )
    };
    for (r, k) in aes128_round_keys(&CHAIN_KEY).iter().enumerate() {
        assert!(
            find(aes_bytes, k) > 0,
            "round key {r} not in the `aes` key schedule"
        );
    }
    for pad in [0x36, 0x5c] {
        assert!(
            find(mac_bytes, &hmac_sha1_state(&AUTH_KEY, pad)) > 0,
            "HMAC state {pad:#x} not in ring's key"
        );
    }
}

// ---- the scan ----

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Occurrences of `needle` in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).filter(|w| *w == needle).count()
}

/// Occurrences of each needle (all at least 16 bytes) in the private
/// writable mappings of process `pid`, by name.
fn scan_process(pid: u32, needles: &[(String, Vec<u8>)]) -> HashMap<String, usize> {
    // Needles by their first two bytes (fast enough in a debug build too:
    // the polling case must finish within the daemon's poll time).
    let mut by_prefix: Vec<Vec<usize>> = vec![Vec::new(); 1 << 16];
    for (i, (_, n)) in needles.iter().enumerate() {
        assert!(n.len() >= 16);
        by_prefix[usize::from(u16::from_ne_bytes([n[0], n[1]]))].push(i);
    }
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mem = File::open(format!("/proc/{pid}/mem")).expect("open the daemon's /proc/<pid>/mem");
    let mut hits: HashMap<String, usize> = needles.iter().map(|(n, _)| (n.clone(), 0)).collect();
    let mut scanned = 0usize;
    const CHUNK: usize = 4 << 20;
    const OVERLAP: usize = 64;
    let mut buf = vec![0u8; CHUNK + OVERLAP];
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (range, perms) = (f.next().unwrap(), f.next().unwrap());
        if !perms.starts_with("rw") || !perms.ends_with('p') {
            continue;
        }
        let (a, b) = range.split_once('-').unwrap();
        let (start, end) = (
            u64::from_str_radix(a, 16).unwrap(),
            u64::from_str_radix(b, 16).unwrap(),
        );
        let mut at = start;
        while at < end {
            let n = ((end - at) as usize).min(CHUNK + OVERLAP);
            let chunk = &mut buf[..n];
            // The daemon is stopped: its private writable mappings stay as
            // /proc/<pid>/maps listed them, and all of them are readable.
            mem.read_exact_at(chunk, at)
                .unwrap_or_else(|e| panic!("reading {n} bytes at {at:#x} of {line}: {e}"));
            scanned += n;
            let last = at + CHUNK as u64 >= end;
            for (i, pair) in chunk.windows(2).enumerate() {
                for &k in &by_prefix[usize::from(u16::from_ne_bytes([pair[0], pair[1]]))] {
                    let (name, needle) = &needles[k];
                    if chunk[i..].starts_with(needle) && (i < CHUNK || last) {
                        *hits.get_mut(name).unwrap() += 1;
                    }
                }
            }
            at += CHUNK as u64;
        }
    }
    assert!(scanned > 0, "nothing of the daemon's memory could be read");
    hits
}

// ---- the daemon's side ----

fn config() -> FrontendConfig {
    FrontendConfig {
        queues: 1,
        queue_size: 64,
        queue_depth: 32,
        max_payload: LEN,
        max_iv: 16,
        memory_bytes: 0,
        session_abi: SessionAbi::C,
        desc_mode: DescMode::Indirect,
        dpdk: false,
    }
}

fn cipher_session() -> SymSessionInfo {
    SymSessionInfo {
        op_code: 2, // VIRTIO_CRYPTO_CIPHER_CREATE_SESSION
        ..SymSessionInfo::aes_cbc(&CIPHER_KEY, 1)
    }
}

/// Encrypt + HMAC-SHA1 over the output (CIPHER_THEN_HASH).
fn chain_session() -> SymSessionInfo {
    let mut i = SymSessionInfo {
        op_code: 2,
        op_type: 2,         // VIRTIO_CRYPTO_SYM_OP_ALGORITHM_CHAINING
        hash_mode: 2,       // VIRTIO_CRYPTO_SYM_HASH_MODE_AUTH
        alg_chain_order: 2, // CIPHER_THEN_HASH
        hash_alg: 2,        // VIRTIO_CRYPTO_MAC_HMAC_SHA1
        hash_result_len: DIGEST,
        auth_key_len: AUTH_KEY.len() as u32,
        ..SymSessionInfo::aes_cbc(&CHAIN_KEY, 1)
    };
    i.auth_key[..AUTH_KEY.len()].copy_from_slice(&AUTH_KEY);
    i
}

fn openssl_cbc_encrypt(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut c = Crypter::new(Cipher::aes_128_cbc(), Mode::Encrypt, key, Some(&IV)).unwrap();
    c.pad(false);
    let mut out = vec![0; data.len() + 16];
    let n = c.update(data, &mut out).unwrap();
    out.truncate(n);
    out
}

/// Runs `CIPHER_REQUESTS` requests on the cipher session and one on the
/// chaining session, in one batch, and checks their ciphertexts against
/// OpenSSL (so the keys were really used).
fn run_requests(fe: &mut CryptoFrontend, cipher: u64, chain: u64) {
    let q = &mut fe.queues[0];
    let mut want = Vec::new();
    for k in 0..=CIPHER_REQUESTS {
        let (sid, key) = if k < CIPHER_REQUESTS {
            (cipher, CIPHER_KEY)
        } else {
            (chain, CHAIN_KEY)
        };
        let src: Vec<u8> = (0..LEN).map(|i| (i * 7 + k) as u8).collect();
        let slot = q.next_slot().expect("a free slot");
        let l = q.layout(slot);
        let mut hdr = OpDataReq {
            opcode: 0, // VIRTIO_CRYPTO_CIPHER_ENCRYPT
            algo: 0,
            session_id: sid,
            op_type: if sid == chain { 2 } else { 1 },
            iv_len: 16,
            src_data_len: LEN as u32,
            dst_data_len: LEN as u32,
        }
        .to_bytes();
        let digest_len = if sid == chain {
            AlgChainPara {
                cipher_start_src_offset: 0,
                len_to_cipher: LEN as u32,
                hash_start_src_offset: 0,
                len_to_hash: LEN as u32,
                aad_len: 0,
                hash_result_len: DIGEST,
            }
            .write_to(&mut hdr);
            DIGEST
        } else {
            0
        };
        q.mem().write(l.hdr, &hdr);
        q.mem().write(l.iv, &IV);
        q.mem().write(l.src, &src);
        q.mem().fill(l.dst, LEN, 0xEE);
        q.mem().write(l.status, &[0xFF]);
        q.submit_request(slot, 16, LEN as u32, digest_len, false);
        want.push((slot, openssl_cbc_encrypt(&key, &src)));
    }
    q.publish_and_kick().unwrap();
    let mut done = Vec::new();
    while done.len() < want.len() {
        q.reap(&mut done, Duration::from_secs(5)).unwrap();
    }
    for (slot, ct) in want {
        let l = q.layout(slot);
        let mut dst = vec![0; LEN];
        q.mem().read(l.dst, &mut dst);
        assert_eq!(q.mem().read_u8(l.status), 0, "status of slot {slot}");
        assert_eq!(dst, ct, "ciphertext of slot {slot}");
    }
}

/// Stops process `pid` (SIGSTOP) and waits until it is stopped, so that a
/// scan sees one still picture of its memory.
fn stop(pid: u32) {
    // SAFETY: kill(2) of our child, not reaped yet.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGSTOP) }, 0);
    let t = Instant::now();
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        // "pid (comm) STATE ...": the state follows the last ')'.
        let state = stat
            .rsplit(')')
            .next()
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap();
        if state == "T" || state == "t" {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the daemon did not stop: {state}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn cont(pid: u32) {
    // SAFETY: as in `stop`.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGCONT) }, 0);
}

/// Starts a daemon with `extra`, runs the requests, checks that the scan
/// finds the keys while the sessions are live (if `scan_live`), closes
/// them, and `after_close_wait` later stops the daemon and returns what the
/// scan finds and whether the worker was still polling the ring (it sets
/// `VRING_USED_F_NO_NOTIFY` in the used ring's flags while it polls); then
/// lets it go on and checks that it still serves the connection.
fn residue_after_close(
    extra: &[&str],
    scan_live: bool,
    after_close_wait: Duration,
) -> (HashMap<String, usize>, bool) {
    let daemon = spawn_daemon(extra);
    let mut fe = CryptoFrontend::connect(&daemon.sock, &config()).unwrap();
    let cipher = fe.create_session(&cipher_session()).unwrap();
    let chain = fe.create_session(&chain_session()).unwrap();
    assert!(cipher > 0 && chain > 0, "session ids {cipher} {chain}");
    let needles = needles();
    run_requests(&mut fe, cipher as u64, chain as u64);
    let pid = daemon.child.id();
    if scan_live {
        stop(pid);
        let live = scan_process(pid, &needles);
        cont(pid);
        for name in [
            "cipher AES round key 10",
            "chain AES round key 10",
            "HMAC inner state",
            "HMAC outer state",
        ] {
            assert!(
                live[name] > 0,
                "the scan does not find {name} while the session is live: {live:?}"
            );
        }
    }
    fe.close_session(cipher as u64).unwrap();
    fe.close_session(chain as u64).unwrap();
    std::thread::sleep(after_close_wait);
    stop(pid);
    let used_flags = fe.queues[0].mem().read_u8(fe.queues[0].ring_addrs().used);
    let polling = used_flags & 1 != 0;
    let after = scan_process(pid, &needles);
    cont(pid);
    // The daemon is still serving this connection.
    let again = fe.create_session(&cipher_session()).unwrap();
    assert!(again > chain, "a new session after the closes: {again}");
    (after, polling)
}

fn assert_none(hits: &HashMap<String, usize>) {
    let left: Vec<_> = hits.iter().filter(|(_, &n)| n > 0).collect();
    assert!(left.is_empty(), "key material left after CLOSE: {left:?}");
}

#[test]
fn nothing_of_a_closed_session_is_left_with_the_worker_waiting_for_kicks() {
    // The worker polls 50 µs after the batch (the default), then waits for
    // kicks: the CLOSE comes well after that.
    let (hits, polling) = residue_after_close(&[], true, Duration::from_millis(100));
    assert!(!polling, "the worker still polls the ring");
    assert_none(&hits);
}

#[test]
fn nothing_of_a_closed_session_is_left_with_the_worker_polling() {
    // The worker keeps polling the ring for 1 s after the batch (the
    // largest --poll-us), through the CLOSE; the daemon is stopped for the
    // scan 20 ms after it. (No scan while the sessions are live here: the
    // daemon stopped for it would see its poll time run out.)
    let (hits, polling) = residue_after_close(&["--poll-us", "1000000"], false, Duration::from_millis(20));
    assert!(
        polling,
        "the worker had stopped polling before the daemon was stopped: this case tests nothing"
    );
    assert_none(&hits);
}
