// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! No copy of a closed session's key material is left anywhere in the
//! daemon's memory: not on the heap (also the `security_heap` suite) and not
//! on the stack of any of its threads, where moves and the cipher
//! libraries leave copies that no value owns (round keys, the HMAC
//! states).
//!
//! The daemon runs as a child process; the test stops it (SIGSTOP), reads
//! every private writable mapping of it through `/proc/<pid>/mem` (allowed
//! for a child of the same user) and looks for byte strings derived from
//! the keys by this file's own code, not by the daemon's libraries: the
//! AES-128, -192 and -256 round keys (FIPS-197 §5.2 key expansion) and
//! decryption round keys (InvMixColumns of them, §5.3.5), and the
//! HMAC-SHA1 and HMAC-SHA-256 inner and outer states after the key block
//! (RFC 2104 with the FIPS 180-4 §6.1.2 and §6.2.2 compression functions),
//! all checked here against the standards' examples and against live keys
//! of the `aes` crate and `algorithms::MacKey`. One session of each kind the data path
//! has: encrypt through the multi-buffer lanes, decrypt, encrypt then MAC,
//! verify then decrypt. While the sessions are live the same scan must
//! find them (in the session tables), so the test cannot pass by not
//! looking in the right place, or by a needle in a form the libraries do
//! not use.
//!
//! Two cases: the queue worker waiting for kicks when the sessions are
//! closed (it wipes its stack whenever it goes back to waiting), and the
//! worker busy-polling the ring when they are closed (it wipes at its next
//! look at the ring).

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use crate::common::daemon::spawn_daemon;
use crate::common::frontend_config::one_queue;
use crate::common::{hex, hmac, oracle, Mac};
use vhost_crypto_replay::frontend::{CryptoFrontend, FrontendConfig};
use vhost_user_crypto::wire::session::SymSessionInfo;
use vhost_user_crypto::wire::virtio_crypto::{AlgChainPara, OpDataReq};

/// The sessions of the test, one of each kind the data path has: the
/// multi-buffer lanes (encrypt), the decrypt (gathered as lanes, each
/// request decrypted on its own), and both chaining orders, over the
/// three AES key sizes and both HMACs.
const SESSIONS: [Sess; 4] = [
    Sess {
        name: "cipher",
        key: b"\x5e\xc1\x3e\x70residue-k1\x0f\x19",
        decrypt: false,
        mac: None,
        requests: 16, // fills the lanes (32 requests in all: the queue depth)
    },
    Sess {
        name: "chain",
        key: b"\xa7\x42\x90\x1bresidue-k2\x6d\xe3",
        decrypt: false,
        mac: Some((Mac::Sha1, b"\x3c\x8d\x21\xf4residue-hmac-key")),
        requests: 5, // five or more HMAC-SHA1 take the 16-lane MAC kernels
    },
    Sess {
        name: "decrypt",
        key: b"\x91\x04\xd2\x6aresidue-aes-256-key-for-de\x33\x7c",
        decrypt: true,
        mac: None,
        requests: 2,
    },
    Sess {
        name: "verify",
        key: b"\x0b\xe7\x58\xc4residue-192-key\x81\x2f\xa0\x66\x19",
        decrypt: true,
        mac: Some((
            Mac::Sha256,
            b"\xd5\x6e\x17\x8bresidue-hmac-sha256-key\x42\x99\xc1\x0e\x5d",
        )),
        requests: 9, // nine or more HMAC-SHA-256 take the 16-lane kernels
    },
];
const IV: [u8; 16] = [0x24; 16];
/// Request size (bytes).
const LEN: usize = 256;

struct Sess {
    name: &'static str,
    key: &'static [u8],
    decrypt: bool,
    /// For a chaining session: encrypt then MAC the output, or verify the
    /// MAC of the input then decrypt.
    mac: Option<(Mac, &'static [u8])>,
    requests: usize,
}

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

/// The round keys of AES-128, -192 or -256 (FIPS-197 §5.2), as bytes:
/// Nr + 1 of them (11, 13, 15).
fn aes_round_keys(key: &[u8]) -> Vec<[u8; 16]> {
    let nk = key.len() / 4;
    let nr = nk + 6;
    let mut w: Vec<[u8; 4]> = key.chunks(4).map(|c| c.try_into().unwrap()).collect();
    let mut rcon = 1u8;
    for i in nk..4 * (nr + 1) {
        let mut t = w[i - 1];
        if i % nk == 0 {
            t = [sbox(t[1]) ^ rcon, sbox(t[2]), sbox(t[3]), sbox(t[0])];
            rcon = (rcon << 1) ^ if rcon & 0x80 != 0 { 0x1b } else { 0 };
        } else if nk > 6 && i % nk == 4 {
            t = [sbox(t[0]), sbox(t[1]), sbox(t[2]), sbox(t[3])];
        }
        let p = w[i - nk];
        w.push([p[0] ^ t[0], p[1] ^ t[1], p[2] ^ t[2], p[3] ^ t[3]]);
    }
    w.chunks(4)
        .map(|c| {
            let mut k = [0u8; 16];
            for (j, word) in c.iter().enumerate() {
                k[4 * j..4 * j + 4].copy_from_slice(word);
            }
            k
        })
        .collect()
}

/// Multiplication in GF(2^8) with the AES polynomial (FIPS-197 §4.2).
fn gmul(mut a: u8, mut b: u8) -> u8 {
    let mut p = 0;
    while b != 0 {
        if b & 1 != 0 {
            p ^= a;
        }
        a = (a << 1) ^ if a & 0x80 != 0 { 0x1b } else { 0 };
        b >>= 1;
    }
    p
}

/// InvMixColumns (FIPS-197 §5.3.3) of a round key: the decryption round
/// keys of the equivalent inverse cipher (§5.3.5) are these for rounds 1
/// to Nr - 1, which is what AES-NI's `aesimc` makes.
fn inv_mix_columns(k: &[u8; 16]) -> [u8; 16] {
    let mut out = [0u8; 16];
    for c in 0..4 {
        let a = &k[4 * c..4 * c + 4];
        for r in 0..4 {
            out[4 * c + r] = gmul(a[r], 14)
                ^ gmul(a[(r + 1) % 4], 11)
                ^ gmul(a[(r + 2) % 4], 13)
                ^ gmul(a[(r + 3) % 4], 9);
        }
    }
    out
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

const SHA256_H0: [u32; 8] = [
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
];

/// SHA-256 round constants (FIPS 180-4 §4.2.2).
const SHA256_K: [u32; 64] = [
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
];

/// One SHA-256 compression (FIPS 180-4 §6.2.2) of `block` into `h`.
fn sha256_compress(mut h: [u32; 8], block: &[u8; 64]) -> [u32; 8] {
    let mut w = [0u32; 64];
    for (i, c) in block.chunks(4).enumerate() {
        w[i] = u32::from_be_bytes(c.try_into().unwrap());
    }
    for t in 16..64 {
        let s0 = w[t - 15].rotate_right(7) ^ w[t - 15].rotate_right(18) ^ (w[t - 15] >> 3);
        let s1 = w[t - 2].rotate_right(17) ^ w[t - 2].rotate_right(19) ^ (w[t - 2] >> 10);
        w[t] = w[t - 16].wrapping_add(s0).wrapping_add(w[t - 7]).wrapping_add(s1);
    }
    let mut v = h;
    for t in 0..64 {
        let [a, b, c, d, e, f, g, hh] = v;
        let t1 = hh
            .wrapping_add(e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25))
            .wrapping_add((e & f) ^ (!e & g))
            .wrapping_add(SHA256_K[t])
            .wrapping_add(w[t]);
        let t2 = (a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22))
            .wrapping_add((a & b) ^ (a & c) ^ (b & c));
        v = [t1.wrapping_add(t2), a, b, c, d.wrapping_add(t1), e, f, g];
    }
    for (x, y) in h.iter_mut().zip(v) {
        *x = x.wrapping_add(y);
    }
    h
}

/// An HMAC's hash state after the inner (0x36) or outer (0x5c) key block
/// (RFC 2104 §2), as `MacKey` keeps it: the words in the machine's byte order
/// (checked against a live `MacKey` below).
fn hmac_state(mac: Mac, key: &[u8], pad: u8) -> Vec<u8> {
    let mut block = [pad; 64];
    for (b, k) in block.iter_mut().zip(key) {
        *b ^= k;
    }
    let words: Vec<u32> = match mac {
        Mac::Sha1 => sha1_compress(SHA1_H0, &block).to_vec(),
        Mac::Sha256 => sha256_compress(SHA256_H0, &block).to_vec(),
    };
    words.iter().flat_map(|w| w.to_ne_bytes()).collect()
}

/// Everything derived from the sessions' keys that must be gone after
/// CLOSE: (name, bytes). The raw AES key is the first round key (both
/// halves of it for AES-256; AES-192's last 8 bytes are in round key 1).
fn needles() -> Vec<(String, Vec<u8>)> {
    let mut n = Vec::new();
    for s in &SESSIONS {
        let rk = aes_round_keys(s.key);
        let bits = s.key.len() * 8;
        for (r, k) in rk.iter().enumerate() {
            n.push((format!("{} AES-{bits} round key {r}", s.name), k.to_vec()));
            if r > 0 && r + 1 < rk.len() {
                n.push((
                    format!("{} AES-{bits} decryption round key {r}", s.name),
                    inv_mix_columns(k).to_vec(),
                ));
            }
        }
        if let Some((mac, key)) = s.mac {
            n.push((format!("{} HMAC inner state", s.name), hmac_state(mac, key, 0x36)));
            n.push((format!("{} HMAC outer state", s.name), hmac_state(mac, key, 0x5c)));
            let padded = |pad: u8| key.iter().map(|k| k ^ pad).collect::<Vec<u8>>();
            n.push((format!("{} HMAC key ^ ipad", s.name), padded(0x36)));
            n.push((format!("{} HMAC key ^ opad", s.name), padded(0x5c)));
            n.push((format!("{} HMAC key", s.name), key.to_vec()));
        }
    }
    n
}

#[test]
fn the_derivations_match_the_standards_and_the_libraries() {
    // FIPS-197 Appendix A.1-A.3: the last round key of each example key.
    for (key, last) in [
        (
            "2b7e151628aed2a6abf7158809cf4f3c",
            "d014f9a8c9ee2589e13f0cc8b6630ca6",
        ),
        (
            "8e73b0f7da0e6452c810f32b809079e562f8ead2522c6b7b",
            "e98ba06f448c773c8ecc720401002202",
        ),
        (
            "603deb1015ca71be2b73aef0857d77811f352c073b6108d72d9810a30914dff4",
            "fe4890d1e6188d0b046df344706c631e",
        ),
    ] {
        assert_eq!(
            aes_round_keys(&hex(key)).last().unwrap().to_vec(),
            hex(last),
            "{key}"
        );
    }
    // MixColumns examples (db 13 53 45 -> 8e 4d a1 bc, f2 0a 22 5c -> 9f dc
    // 58 9d, and columns of equal bytes are fixed points), undone.
    let mixed: [u8; 16] = hex("8e4da1bc9fdc589d01010101c6c6c6c6").try_into().unwrap();
    assert_eq!(
        inv_mix_columns(&mixed).to_vec(),
        hex("db135345f20a225c01010101c6c6c6c6")
    );
    // FIPS 180-4 examples "abc" (one block).
    let mut block = [0u8; 64];
    block[..3].copy_from_slice(b"abc");
    block[3] = 0x80;
    block[63] = 24;
    assert_eq!(
        sha1_compress(SHA1_H0, &block),
        [0xa9993e36, 0x4706816a, 0xba3e2571, 0x7850c26c, 0x9cd0d89d]
    );
    assert_eq!(
        sha256_compress(SHA256_H0, &block),
        [0xba7816bf, 0x8f01cfea, 0x414140de, 0x5dae2223, 0xb00361a3, 0x96177a9c, 0xb410ff61, 0xf20015ad]
    );
    // The libraries keep them in these forms: a live key schedule holds
    // the round keys and the decryption round keys, a live HMAC key both
    // states.
    fn bytes_of<T>(v: &T) -> &[u8] {
        // SAFETY: the bytes of a live value (padding included, which is
        // fine for a test that only compares them).
        unsafe { std::slice::from_raw_parts(v as *const T as *const u8, std::mem::size_of_val(v)) }
    }
    for s in &SESSIONS {
        let aes = algorithms::AesCbcKey::new(s.key).unwrap();
        let rk = aes_round_keys(s.key);
        for (r, k) in rk.iter().enumerate() {
            assert!(
                find(bytes_of(&aes), k) > 0,
                "{}: round key {r} not in `aes`'s schedule",
                s.name
            );
            if r > 0 && r + 1 < rk.len() {
                assert!(
                    find(bytes_of(&aes), &inv_mix_columns(k)) > 0,
                    "{}: decryption round key {r} not in `aes`'s schedule",
                    s.name
                );
            }
        }
        if let Some((mac, key)) = s.mac {
            let alg = match mac {
                Mac::Sha1 => algorithms::MacAlg::HmacSha1,
                Mac::Sha256 => algorithms::MacAlg::HmacSha256,
            };
            let m = algorithms::MacKey::new(alg, key, mac.digest_len()).unwrap();
            for pad in [0x36, 0x5c] {
                assert!(
                    find(bytes_of(&m), &hmac_state(mac, key, pad)) > 0,
                    "{}: HMAC state {pad:#x} not in the MacKey",
                    s.name
                );
            }
        }
    }
}

// ---- the scan ----

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
        max_payload: LEN,
        ..one_queue(64, 32)
    }
}

/// The CREATE of session `s`: AES-CBC in its direction; chaining sessions
/// encrypt then MAC the output (CIPHER_THEN_HASH) or verify the MAC of the
/// input then decrypt (HASH_THEN_CIPHER).
fn session_info(s: &Sess) -> SymSessionInfo {
    let mut i = SymSessionInfo {
        op_code: 2, // VIRTIO_CRYPTO_CIPHER_CREATE_SESSION
        ..SymSessionInfo::aes_cbc(s.key, if s.decrypt { 2 } else { 1 })
    };
    if let Some((mac, key)) = s.mac {
        i.op_type = 2; // VIRTIO_CRYPTO_SYM_OP_ALGORITHM_CHAINING
        i.hash_mode = 2; // VIRTIO_CRYPTO_SYM_HASH_MODE_AUTH
        i.alg_chain_order = if s.decrypt { 1 } else { 2 };
        i.hash_alg = match mac {
            Mac::Sha1 => 2,   // VIRTIO_CRYPTO_MAC_HMAC_SHA1
            Mac::Sha256 => 4, // VIRTIO_CRYPTO_MAC_HMAC_SHA_256
        };
        i.hash_result_len = mac.digest_len() as u32;
        i.auth_key_len = key.len() as u32;
        i.auth_key[..key.len()].copy_from_slice(key);
    }
    i
}

/// Runs every session's requests in one batch and checks the outputs
/// (and the MACs the device made) against OpenSSL, so that every key was
/// really used.
fn run_requests(fe: &mut CryptoFrontend, ids: &[u64]) {
    let q = &mut fe.queues[0];
    let mut want = Vec::new();
    for (s, &sid) in SESSIONS.iter().zip(ids) {
        for k in 0..s.requests {
            let plain: Vec<u8> = (0..LEN).map(|i| (i * 7 + k) as u8).collect();
            let (src, dst) = if s.decrypt {
                (oracle(true, s.key, &IV, &plain), plain)
            } else {
                let ct = oracle(true, s.key, &IV, &plain);
                (plain, ct)
            };
            let slot = q.next_slot().expect("a free slot");
            let l = q.layout(slot);
            let mut hdr = OpDataReq {
                opcode: u32::from(s.decrypt), // VIRTIO_CRYPTO_CIPHER_ENCRYPT / _DECRYPT
                algo: 0,
                session_id: sid,
                op_type: if s.mac.is_some() { 2 } else { 1 },
                iv_len: 16,
                src_data_len: LEN as u32,
                dst_data_len: LEN as u32,
            }
            .to_bytes();
            let mut digest = Vec::new();
            if let Some((mac, key)) = s.mac {
                AlgChainPara {
                    cipher_start_src_offset: 0,
                    len_to_cipher: LEN as u32,
                    hash_start_src_offset: 0,
                    len_to_hash: LEN as u32,
                    aad_len: 0,
                    hash_result_len: mac.digest_len() as u32,
                }
                .write_to(&mut hdr);
                // Over the ciphertext: the output (encrypt) or the input
                // (decrypt, supplied by the driver).
                digest = hmac(mac, key, if s.decrypt { &src } else { &dst });
                q.mem().write(
                    l.digest,
                    if s.decrypt {
                        &digest
                    } else {
                        &[0; 32][..digest.len()]
                    },
                );
            }
            q.mem().write(l.hdr, &hdr);
            q.mem().write(l.iv, &IV);
            q.mem().write(l.src, &src);
            q.mem().fill(l.dst, LEN, 0xEE);
            q.mem().write(l.status, &[0xFF]);
            q.submit_request(slot, 16, LEN as u32, digest.len() as u32, false);
            want.push((s.name, slot, dst, digest));
        }
    }
    q.publish_and_kick().unwrap();
    let mut done = Vec::new();
    while done.len() < want.len() {
        q.reap(&mut done, Duration::from_secs(5)).unwrap();
    }
    for (name, slot, dst, digest) in want {
        let l = q.layout(slot);
        let mut got = vec![0; LEN];
        q.mem().read(l.dst, &mut got);
        assert_eq!(q.mem().read_u8(l.status), 0, "status of a {name} request");
        assert_eq!(got, dst, "output of a {name} request");
        let mut got = vec![0; digest.len()];
        q.mem().read(l.digest, &mut got);
        assert_eq!(got, digest, "MAC of a {name} request");
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
    let ids: Vec<u64> = SESSIONS
        .iter()
        .map(|s| {
            let id = fe.create_session(&session_info(s)).unwrap();
            assert!(id > 0, "{}: session id {id}", s.name);
            id as u64
        })
        .collect();
    let needles = needles();
    run_requests(&mut fe, &ids);
    let pid = daemon.child.id();
    if scan_live {
        stop(pid);
        let live = scan_process(pid, &needles);
        cont(pid);
        for s in &SESSIONS {
            let bits = s.key.len() * 8;
            let nr = s.key.len() / 4 + 6;
            let mut names = vec![
                format!("{} AES-{bits} round key {nr}", s.name),
                format!("{} AES-{bits} decryption round key 1", s.name),
            ];
            if s.mac.is_some() {
                names.push(format!("{} HMAC inner state", s.name));
                names.push(format!("{} HMAC outer state", s.name));
            }
            for name in names {
                assert!(
                    live[&name] > 0,
                    "the scan does not find {name} while the session is live: {live:?}"
                );
            }
        }
    }
    for &id in &ids {
        fe.close_session(id).unwrap();
    }
    std::thread::sleep(after_close_wait);
    stop(pid);
    let used_flags = fe.queues[0].mem().read_u8(fe.queues[0].ring_addrs().used);
    let polling = used_flags & 1 != 0;
    let after = scan_process(pid, &needles);
    cont(pid);
    // The daemon is still serving this connection.
    let again = fe.create_session(&session_info(&SESSIONS[0])).unwrap();
    assert!(again > ids[3] as i64, "a new session after the closes: {again}");
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
