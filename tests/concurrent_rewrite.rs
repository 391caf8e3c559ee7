// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A guest that rewrites descriptors, indirect tables, request headers and
//! avail entries *while* the device works on them (issue #5: "guest fields
//! are read once").
//!
//! The racing test runs `QueueWorker::process` on batches of 32 requests in
//! real guest memory while a second thread keeps flipping guest-controlled
//! fields between a few versions each: header fields (opcode, session id,
//! op_type, iv_len, src/dst lengths, the chaining offsets and lengths, the
//! IV), every field of the descriptors of direct chains (addr, len, flags,
//! next), the ring descriptor that points at an indirect table (which table,
//! its length, its flags), the entries of both indirect tables, and avail
//! ring entries. Most flips are single atomic stores, some are written byte
//! by byte, so the device may also see a mix of two versions; the allowed
//! sets below take every byte-wise mix into account. Every version of every
//! field stays inside the request's own 64 KiB area, `next` values only
//! point forward (or out of the table), and canary memory surrounds every
//! buffer. Each batch is processed 16 times in a row (on whatever memory the
//! previous rounds and the flipping thread left) before memory is checked
//! and reset. After each round:
//!
//! * `process` returned (no panic), completed all 32 chains and published
//!   the used index; each used element names a head the avail entry held in
//!   some version (exactly the submitted heads, once each, when avail
//!   entries are not flipped);
//! * each used length is 0, 1, or at most the largest total writable length
//!   any version of the request's descriptors declared (a header length
//!   version of 4096 is larger than all of them);
//!
//! and after each batch:
//!
//! * every byte outside the writable buffers of all versions is unchanged
//!   (flipped fields hold one of their versions, byte by byte), in the
//!   whole 4 MiB of guest memory;
//! * every status buffer holds its canary or a virtio-crypto status;
//! * requests nobody flips (a quarter of each batch) give exactly OpenSSL's
//!   output, status OK and used length `len + 1`.
//!
//! The deterministic tests use the library's own seams: the chain is walked
//! ([`ChainWalker::walk`]) in state X, then every descriptor and indirect
//! table entry is rewritten before the request is validated and run
//! ([`prepare`]); and a validated encrypt request waiting as a lane
//! ([`Prepared::Lane`]) has its header, IV and descriptors rewritten before
//! [`run_lanes`] executes it. Both must act on X exactly.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use common::*;
use openssl::hash::MessageDigest;
use openssl::pkey::PKey;
use openssl::sign::Signer;
use vhost_user_crypto::crypto::{prepare, run_lanes, Completion, Prepared, RequestLimits};
use vhost_user_crypto::virtq::descriptor::{
    ChainWalker, Desc, DESC_SIZE, VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE,
};
use vhost_user_crypto::virtq::map_contiguous;
use vhost_user_crypto::wire::session::SymSessionInfo;
use vhost_user_crypto::wire::virtio_crypto::{offsets, AlgChainPara, OpDataReq, Status};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const MEM: usize = 4 << 20;
/// Requests per batch; each owns 8 ring descriptors (QSIZE = 256).
const SLOTS: usize = 32;
const BLOCK: u16 = 8;
const SLOT_BASE: u64 = 0x10_0000;
const SLOT_BYTES: u64 = 0x1_0000;
/// Each buffer of a request lives in its own 8 KiB box, at one of two
/// offsets (they differ in one byte, so a torn read gives one or the other).
const BOX: u64 = 0x2000;
const OFF_A: u64 = 0x100;
const OFF_B: u64 = 0x900;
const BOX_HDR: u64 = 0;
const BOX_IV: u64 = 1;
const BOX_SRC: u64 = 2;
const BOX_DST: u64 = 3;
const BOX_ST: u64 = 4;
const BOX_DST2: u64 = 5;
/// Indirect tables T0 (at +OFF_A) and T1 (at +OFF_B).
const BOX_TABLES: u64 = 6;
/// Status buffers start with this; afterwards they hold it or a status.
const ST_CANARY: u8 = 0xEE;
const DIGEST_LEN: u32 = 32;
const N: u64 = VRING_DESC_F_NEXT as u64;
const W: u64 = VRING_DESC_F_WRITE as u64;
const I: u64 = VRING_DESC_F_INDIRECT as u64;
/// Sub-runs (request sets), batches per sub-run, and times each batch is
/// processed before memory is checked and reset.
const SEEDS: u64 = 8;
const BATCHES: u32 = 200;
const ROUNDS: u32 = 16;
const USED_BYTES: u64 = 6 + 8 * QSIZE as u64 + 2;

/// Byte classes of guest memory for the after-batch check.
const STATIC: u8 = 0;
const FLIPPED: u8 = 1;
const WRITABLE: u8 = 2;
const DEVICE: u8 = 3;

/// A guest field the second thread flips (little-endian, `width` bytes).
#[derive(Debug, Clone)]
struct Field {
    addr: u64,
    width: usize,
    versions: Vec<u64>,
}

/// Every value a reader can see when the field is written as whole values
/// or byte by byte: each byte from any version.
fn mixes(versions: &[u64], width: usize) -> Vec<u64> {
    let mut out = vec![0u64];
    for b in 0..width {
        let mut bytes: Vec<u64> = versions.iter().map(|v| (v >> (8 * b)) & 0xFF).collect();
        bytes.sort_unstable();
        bytes.dedup();
        out = out
            .iter()
            .flat_map(|&o| bytes.iter().map(move |&x| o | (x << (8 * b))))
            .collect();
        assert!(out.len() <= 64, "too many mixes");
    }
    out
}

/// One descriptor with the versions of each of its fields (first = initial).
#[derive(Debug, Clone)]
struct Entry {
    at: u64,
    addr: Vec<u64>,
    len: Vec<u64>,
    flags: Vec<u64>,
    next: Vec<u64>,
}

impl Entry {
    fn fields(&self) -> [Field; 4] {
        [
            Field {
                addr: self.at,
                width: 8,
                versions: self.addr.clone(),
            },
            Field {
                addr: self.at + 8,
                width: 4,
                versions: self.len.clone(),
            },
            Field {
                addr: self.at + 12,
                width: 2,
                versions: self.flags.clone(),
            },
            Field {
                addr: self.at + 14,
                width: 2,
                versions: self.next.clone(),
            },
        ]
    }

    fn initial(&self) -> Desc {
        Desc {
            addr: self.addr[0],
            len: self.len[0] as u32,
            flags: self.flags[0] as u16,
            next: self.next[0] as u16,
        }
    }

    fn may_write(&self) -> bool {
        mixes(&self.flags, 2).iter().any(|f| f & W != 0 && f & I == 0)
    }

    /// Byte ranges any version may declare device-writable.
    fn writable_ranges(&self) -> Vec<(u64, u64)> {
        if !self.may_write() {
            return Vec::new();
        }
        let lens = mixes(&self.len, 4);
        mixes(&self.addr, 8)
            .into_iter()
            .flat_map(|a| lens.iter().map(move |&l| (a, a + l)))
            .collect()
    }

    fn max_writable(&self) -> u64 {
        if self.may_write() {
            mixes(&self.len, 4).into_iter().max().unwrap_or(0)
        } else {
            0
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Cipher,
    Chain,
}

/// A request of the batch and everything the guest may flip in it.
struct Slot {
    head: u16,
    kind: Kind,
    encrypt: bool,
    key: Vec<u8>,
    auth_key: Vec<u8>,
    session: u64,
    len: u32,
    iv: [u8; 16],
    src: Vec<u8>,
    /// Nothing of it is flipped: its result must be exact.
    control: bool,
    entries: Vec<Entry>,
    /// Indirect: which entries form table T0 and T1 (indices into `entries`).
    tables: Option<(Vec<usize>, Vec<usize>)>,
    header_fields: Vec<Field>,
}

fn box_addr(slot: usize, b: u64, off: u64) -> u64 {
    SLOT_BASE + slot as u64 * SLOT_BYTES + b * BOX + off
}

fn hmac_sha256(key: &[u8], data: &[u8]) -> Vec<u8> {
    let pkey = PKey::hmac(key).unwrap();
    let mut s = Signer::new(MessageDigest::sha256(), &pkey).unwrap();
    s.update(data).unwrap();
    s.sign_to_vec().unwrap()
}

/// A session the requests can name.
#[derive(Debug, Clone)]
struct Sess {
    id: u64,
    kind: Kind,
    encrypt: bool,
    key: Vec<u8>,
    auth_key: Vec<u8>,
}

struct Sessions {
    list: Vec<Sess>,
}

fn create_sessions(vm: &mut Vm) -> Sessions {
    let cipher = |id: u64, encrypt: bool, key: Vec<u8>| Sess {
        id,
        kind: Kind::Cipher,
        encrypt,
        key,
        auth_key: Vec::new(),
    };
    let k256: Vec<u8> = (0..32).map(|i| 0x40 + i as u8).collect();
    let k192: Vec<u8> = (0..24).map(|i| 0x90 ^ i as u8).collect();
    let auth: Vec<u8> = (0..32).map(|i| 0x11u8.wrapping_mul(i as u8 + 1)).collect();
    let mut list = vec![
        cipher(E, true, NIST_KEY.to_vec()),
        cipher(D, false, NIST_KEY.to_vec()),
    ];
    let id = vm.reg.create(&session_info(&k256, 1));
    assert!(id > 0);
    list.push(cipher(id as u64, true, k256));
    let id = vm.reg.create(&session_info(&k192, 2));
    assert!(id > 0);
    list.push(cipher(id as u64, false, k192));
    for encrypt in [true, false] {
        let mut i = SymSessionInfo {
            cipher_alg: 3,
            key_len: 16,
            op_type: 2,
            direction: if encrypt { 1 } else { 2 },
            hash_mode: 2,
            alg_chain_order: if encrypt { 2 } else { 1 },
            hash_alg: 4,
            auth_key_len: auth.len() as u32,
            hash_result_len: DIGEST_LEN,
            ..Default::default()
        };
        i.cipher_key[..16].copy_from_slice(&NIST_KEY);
        i.auth_key[..auth.len()].copy_from_slice(&auth);
        let id = vm.reg.create(&i);
        assert!(id > 0, "chaining session: {id}");
        list.push(Sess {
            id: id as u64,
            kind: Kind::Chain,
            encrypt,
            key: NIST_KEY.to_vec(),
            auth_key: auth.clone(),
        });
    }
    Sessions { list }
}

/// A version list: the first value, plus the others when `on`.
fn vs(on: bool, first: u64, others: &[u64]) -> Vec<u64> {
    let mut v = vec![first];
    if on {
        v.extend_from_slice(others);
    }
    v
}

impl Slot {
    /// Builds request `i` with a random kind, size and layout; unless it is
    /// a control request, each field is flipped with probability ~1/3.
    fn new(i: usize, rng: &mut Rng, sessions: &Sessions, control: bool) -> Slot {
        let head = i as u16 * BLOCK;
        let pick = if control {
            rng.range(0, 3)
        } else {
            rng.range(0, sessions.list.len() as u64 - 1)
        } as usize;
        let Sess {
            id: session,
            kind,
            encrypt,
            key,
            auth_key,
        } = sessions.list[pick].clone();
        let len = 16 * rng.range(1, 128) as u32;
        let alt_len = 16 * rng.range(1, 127) as u32;
        let digest = if kind == Kind::Chain { DIGEST_LEN } else { 0 };
        let mut iv = [0u8; 16];
        iv.copy_from_slice(&rng.bytes(16));
        let src = rng.bytes(len.max(alt_len) as usize);
        let indirect = rng.next_u64() % 2 == 0;
        let flip = |rng: &mut Rng| !control && rng.next_u64() % 3 == 0;
        let a = |b: u64| box_addr(i, b, OFF_A);
        let b = |b: u64| box_addr(i, b, OFF_B);
        let d = u64::from(len + digest);
        let d2 = u64::from(alt_len + digest);
        // `next` values relative to the chain start: forward, or out of
        // any table by 256 (one byte apart, so mixes stay forward or out).
        let rel = |base: u64, n: u64| base + n;
        let entries_at = |rng: &mut Rng, at: &dyn Fn(u64) -> u64, base: u64, swap: bool| -> Vec<Entry> {
            let (dst_box, dst2_box) = if swap {
                (BOX_DST2, BOX_DST)
            } else {
                (BOX_DST, BOX_DST2)
            };
            vec![
                Entry {
                    at: at(0),
                    addr: vs(flip(rng), a(BOX_HDR), &[b(BOX_HDR)]),
                    len: vs(flip(rng), 72, &[64, 0x148]),
                    flags: vs(flip(rng), N, &[N | W]),
                    next: vs(flip(rng), rel(base, 1), &[rel(base, 257)]),
                },
                Entry {
                    at: at(1),
                    addr: vs(flip(rng), a(BOX_IV), &[b(BOX_IV)]),
                    len: vs(flip(rng), 16, &[8, 0x110]),
                    flags: vs(flip(rng), N, &[N | W]),
                    next: vs(flip(rng), rel(base, 2), &[rel(base, 258)]),
                },
                Entry {
                    at: at(2),
                    addr: vs(flip(rng), a(BOX_SRC), &[b(BOX_SRC)]),
                    len: vs(flip(rng), u64::from(len), &[u64::from(alt_len)]),
                    flags: vs(flip(rng), N, &[N | W]),
                    next: vs(flip(rng), rel(base, 3), &[rel(base, 5), rel(base, 259)]),
                },
                Entry {
                    at: at(3),
                    addr: vs(flip(rng), a(dst_box), &[b(dst_box)]),
                    len: vs(flip(rng), d, &[d2, 0]),
                    flags: vs(flip(rng), N | W, &[N, W]),
                    next: vs(flip(rng), rel(base, 4), &[rel(base, 260)]),
                },
                Entry {
                    at: at(4),
                    addr: vs(flip(rng), a(BOX_ST), &[b(BOX_ST)]),
                    len: vec![1],
                    flags: vs(flip(rng), W, &[0]),
                    next: vec![0],
                },
                // Reached only through entry 2's other `next`.
                Entry {
                    at: at(5),
                    addr: vs(flip(rng), a(dst2_box), &[b(dst2_box)]),
                    len: vec![d],
                    flags: vec![N | W],
                    next: vec![rel(base, 4)],
                },
            ]
        };
        let (entries, tables) = if indirect {
            let t0 = a(BOX_TABLES);
            let t1 = b(BOX_TABLES);
            let mut e = vec![Entry {
                at: RING_DESC + u64::from(head) * DESC_SIZE as u64,
                addr: vs(flip(rng), t0, &[t1]),
                len: vs(flip(rng), 6 * 16, &[5 * 16, 6 * 16 + 1]),
                flags: vs(flip(rng), I, &[I | N]),
                next: vec![0],
            }];
            e.extend(entries_at(rng, &|k| t0 + 16 * k, 0, false));
            e.extend(entries_at(rng, &|k| t1 + 16 * k, 0, true));
            (e, Some(((1..7).collect(), (7..13).collect())))
        } else {
            let ring = |k: u64| RING_DESC + (u64::from(head) + k) * DESC_SIZE as u64;
            (entries_at(rng, &ring, u64::from(head), false), None)
        };

        let mut header_fields = Vec::new();
        let opcode = if encrypt { ENCRYPT } else { DECRYPT };
        let other = sessions.list[(pick + 1) % sessions.list.len()].id;
        let op_type = if kind == Kind::Chain { 2 } else { 1 };
        let l = u64::from(len);
        let mut hf = |rng: &mut Rng, off: usize, width: usize, first: u64, others: &[u64]| {
            let v = vs(flip(rng), first, others);
            for h in [a(BOX_HDR), b(BOX_HDR)] {
                header_fields.push(Field {
                    addr: h + off as u64,
                    width,
                    versions: v.clone(),
                });
            }
        };
        hf(
            rng,
            offsets::OPCODE,
            4,
            u64::from(opcode),
            &[u64::from(opcode ^ 1), 2],
        );
        hf(
            rng,
            offsets::SESSION_ID,
            8,
            session,
            &[other, 0xDEAD_0000_0000 | session],
        );
        hf(rng, offsets::OP_TYPE, 4, op_type, &[3 - op_type, 7]);
        hf(rng, offsets::IV_LEN, 4, 16, &[8]);
        // 0x1000 is more than any version of the request's writable
        // buffers: a length read again after validation would write past them.
        hf(rng, offsets::SRC_DATA_LEN, 4, l, &[u64::from(alt_len), 0x1000]);
        hf(rng, offsets::DST_DATA_LEN, 4, l, &[u64::from(alt_len), 0x1000]);
        if kind == Kind::Chain {
            hf(rng, offsets::CIPHER_START_SRC_OFFSET, 4, 0, &[16, 0xFFFF_FFF0]);
            hf(
                rng,
                offsets::LEN_TO_CIPHER,
                4,
                l,
                &[l.saturating_sub(16), 0x7FFF_FFF0],
            );
            hf(rng, offsets::HASH_START_SRC_OFFSET, 4, 0, &[0xFFFF_FFF0]);
            hf(rng, offsets::LEN_TO_HASH, 4, l, &[16, 0xFFFF_FF00]);
            hf(
                rng,
                offsets::HASH_RESULT_LEN,
                4,
                u64::from(DIGEST_LEN),
                &[20, 0xFFFF_FFFF],
            );
        }
        let iv_lo = u64::from_le_bytes(iv[..8].try_into().unwrap());
        for at in [a(BOX_IV), b(BOX_IV)] {
            if flip(rng) {
                header_fields.push(Field {
                    addr: at,
                    width: 8,
                    versions: vec![iv_lo, !iv_lo],
                });
            }
        }
        Slot {
            head,
            kind,
            encrypt,
            key,
            auth_key,
            session,
            len,
            iv,
            src,
            control,
            entries,
            tables,
            header_fields,
        }
    }

    fn fields(&self) -> Vec<Field> {
        self.entries
            .iter()
            .flat_map(|e| e.fields())
            .chain(self.header_fields.iter().cloned())
            .filter(|f| f.versions.len() > 1)
            .collect()
    }

    /// The largest used length any state of this request allows: the sum
    /// of the largest writable lengths along a chain (each descriptor is
    /// reached at most once, `next` only goes forward).
    fn max_used(&self) -> u64 {
        let sum = |idx: &[usize]| idx.iter().map(|&k| self.entries[k].max_writable()).sum::<u64>();
        match &self.tables {
            Some((t0, t1)) => sum(t0).max(sum(t1)),
            None => sum(&(0..self.entries.len()).collect::<Vec<_>>()),
        }
    }

    /// Writes the request in its initial state into `img`, marks bytes in
    /// `class`.
    fn lay_out(&self, i: usize, img: &mut [u8], class: &mut [u8]) {
        let put =
            |img: &mut [u8], at: u64, b: &[u8]| img[at as usize..at as usize + b.len()].copy_from_slice(b);
        let base = box_addr(i, 0, 0) as usize;
        img[base..base + SLOT_BYTES as usize].fill(CANARY);
        let op_type = if self.kind == Kind::Chain { 2 } else { 1 };
        let mut h = OpDataReq {
            opcode: if self.encrypt { ENCRYPT } else { DECRYPT },
            algo: 0,
            session_id: self.session,
            op_type,
            iv_len: 16,
            src_data_len: self.len,
            dst_data_len: self.len,
        }
        .to_bytes();
        if self.kind == Kind::Chain {
            AlgChainPara {
                cipher_start_src_offset: 0,
                len_to_cipher: self.len,
                hash_start_src_offset: 0,
                len_to_hash: self.len,
                aad_len: 0,
                hash_result_len: DIGEST_LEN,
            }
            .write_to(&mut h);
        }
        for off in [OFF_A, OFF_B] {
            put(img, box_addr(i, BOX_HDR, off), &h);
            put(img, box_addr(i, BOX_IV, off), &self.iv);
            put(img, box_addr(i, BOX_SRC, off), &self.src);
            put(img, box_addr(i, BOX_ST, off), &[ST_CANARY]);
            if self.kind == Kind::Chain && !self.encrypt {
                // The digest the driver supplies, after dst.
                let mac = hmac_sha256(&self.auth_key, &self.src[..self.len as usize]);
                for b in [BOX_DST, BOX_DST2] {
                    put(img, box_addr(i, b, off) + u64::from(self.len), &mac);
                }
            }
        }
        for e in &self.entries {
            put(img, e.at, &e.initial().to_bytes());
        }
        for e in &self.entries {
            for (s, t) in e.writable_ranges() {
                // Every version stays inside its own box of this request.
                assert!(s >= box_addr(i, 0, 0) && t <= box_addr(i + 1, 0, 0) && (t - 1) / BOX == s / BOX);
                class[s as usize..t as usize].fill(WRITABLE);
            }
        }
        for f in self.fields() {
            for k in 0..f.width {
                let c = &mut class[f.addr as usize + k];
                if *c == STATIC {
                    *c = FLIPPED;
                }
            }
        }
    }

    fn expected_output(&self) -> Vec<u8> {
        assert_eq!(
            self.kind,
            Kind::Cipher,
            "control requests are plain cipher requests"
        );
        oracle(self.encrypt, &self.key, &self.iv, &self.src[..self.len as usize])
    }
}

fn mutator(mem: &GuestMemoryMmap<()>, fields: &[Field], seed: u64, stop: &AtomicBool, flips: &AtomicU64) {
    if fields.is_empty() {
        return;
    }
    let mut rng = Rng::new(seed);
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..64 {
            let f = &fields[rng.range(0, fields.len() as u64 - 1) as usize];
            let v = f.versions[rng.range(0, f.versions.len() as u64 - 1) as usize];
            let at = GuestAddress(f.addr);
            if rng.next_u64() % 8 == 0 {
                // Byte by byte, lowest or highest first.
                let bytes = v.to_le_bytes();
                let up = rng.next_u64() % 2 == 0;
                for k in 0..f.width {
                    let k = if up { k } else { f.width - 1 - k };
                    mem.store(bytes[k], GuestAddress(f.addr + k as u64), Ordering::Relaxed)
                        .unwrap();
                }
            } else {
                match f.width {
                    2 => mem.store(v as u16, at, Ordering::Relaxed),
                    4 => mem.store(v as u32, at, Ordering::Relaxed),
                    _ => mem.store(v, at, Ordering::Relaxed),
                }
                .unwrap();
            }
            n += 1;
        }
    }
    flips.fetch_add(n, Ordering::Relaxed);
}

#[derive(Debug, Default)]
struct Tally {
    batches: u64,
    requests: u64,
    consumed: u64,
    errors: u64,
    ok: u64,
    control_ok: u64,
    status_values: Vec<u64>,
}

/// One sub-run: a fresh set of 32 requests from `seed`, `batches` batches
/// raced by the flipping thread.
fn race(seed: u64, batches: u32, flip_avail: bool, tally: &mut Tally, flips: &AtomicU64) {
    let mut vm = Vm::with_ranges(&[(0, MEM)]);
    let sessions = create_sessions(&mut vm);
    let mut rng = Rng::new(seed);
    let slots: Vec<Slot> = (0..SLOTS)
        .map(|i| Slot::new(i, &mut rng, &sessions, i % 4 == 0))
        .collect();
    // Avail position p holds slot order[p].
    let mut order: Vec<usize> = (0..SLOTS).collect();
    for k in (1..SLOTS).rev() {
        order.swap(k, rng.range(0, k as u64) as usize);
    }

    let mut img = vec![0u8; MEM];
    let mut class = vec![STATIC; MEM];
    for (i, s) in slots.iter().enumerate() {
        s.lay_out(i, &mut img, &mut class);
    }
    let used = RING_USED as usize;
    class[used..used + USED_BYTES as usize].fill(DEVICE);
    img[RING_AVAIL as usize + 2..RING_AVAIL as usize + 4].copy_from_slice(&(SLOTS as u16).to_le_bytes());
    let mut fields: Vec<Field> = slots.iter().flat_map(Slot::fields).collect();
    // Avail entries: the head, another flipped request's head, or one
    // past the table (256 further: one byte apart).
    let mut avail_versions: Vec<Vec<u64>> = Vec::new();
    for (p, &s) in order.iter().enumerate() {
        let head = u64::from(slots[s].head);
        let at = RING_AVAIL + 4 + 2 * p as u64;
        img[at as usize..at as usize + 2].copy_from_slice(&(head as u16).to_le_bytes());
        let mut v = vec![head];
        if flip_avail && !slots[s].control && rng.next_u64() % 3 == 0 {
            let other = (0..SLOTS)
                .map(|k| (s + 1 + k) % SLOTS)
                .find(|&k| !slots[k].control)
                .unwrap();
            v.extend([u64::from(slots[other].head), head + 256]);
            fields.push(Field {
                addr: at,
                width: 2,
                versions: v.clone(),
            });
            class[at as usize..at as usize + 2].fill(FLIPPED);
        }
        avail_versions.push(mixes(&v, 2));
    }
    let max_used: Vec<u64> = slots.iter().map(Slot::max_used).collect();
    let expected: Vec<Option<Vec<u8>>> = slots
        .iter()
        .map(|s| s.control.then(|| s.expected_output()))
        .collect();
    let mut heads: Vec<u32> = slots.iter().map(|s| u32::from(s.head)).collect();
    heads.sort_unstable();

    let stop = AtomicBool::new(false);
    let Vm {
        mem, worker, ring, ..
    } = &mut vm;
    let mem: &GuestMemoryMmap<()> = mem;
    let ring = *ring;
    let mut seen = vec![0u8; MEM];
    std::thread::scope(|sc| {
        sc.spawn(|| mutator(mem, &fields, seed ^ 0x5eed, &stop, flips));
        // A panic below must still stop the flipping thread.
        struct StopOnDrop<'a>(&'a AtomicBool);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let _stop = StopOnDrop(&stop);
        let mut used_reset = vec![0xFFu8; 4 + 8 * SLOTS];
        used_reset[..4].fill(0);
        let mut used_seen = vec![0u8; 4 + 8 * SLOTS];
        for batch in 0..batches {
            // Initial state (flipped fields start over from their first
            // version; the thread keeps flipping them meanwhile).
            mem.write_slice(&img, GuestAddress(0)).unwrap();
            // The same 32 chains, processed ROUNDS times on memory the
            // previous rounds (and the flipping thread) left behind.
            for round in 0..ROUNDS {
                mem.write_slice(&used_reset, GuestAddress(RING_USED)).unwrap();
                let (mut next_avail, mut next_used) = (0u16, 0u16);
                let r = worker.process(mem, ring, &mut next_avail, &mut next_used);
                let ctx = || format!("seed {seed} batch {batch} round {round}");
                assert_eq!(r.completed, SLOTS as u32, "{}: chains completed", ctx());
                assert_eq!((next_avail, next_used), (SLOTS as u16, SLOTS as u16), "{}", ctx());
                mem.read_slice(&mut used_seen, GuestAddress(RING_USED)).unwrap();
                let u32_at = |a: usize| u32::from_le_bytes(used_seen[a..a + 4].try_into().unwrap());
                assert_eq!(
                    u16::from_le_bytes([used_seen[2], used_seen[3]]),
                    SLOTS as u16,
                    "{}: used.idx",
                    ctx()
                );
                let mut ids = Vec::with_capacity(SLOTS);
                for (p, &s) in order.iter().enumerate() {
                    let id = u32_at(4 + 8 * p);
                    let len = u32_at(8 + 8 * p);
                    ids.push(id);
                    assert!(
                        avail_versions[p].contains(&u64::from(id)),
                        "{}: used element {p} names head {id}, avail held {:?}",
                        ctx(),
                        avail_versions[p]
                    );
                    tally.requests += 1;
                    match len {
                        0 => tally.consumed += 1,
                        1 => tally.errors += 1,
                        _ => tally.ok += 1,
                    }
                    if id >= u32::from(QSIZE) {
                        assert_eq!(len, 0, "{}: head {id} is outside the table", ctx());
                        continue;
                    }
                    let owner = usize::from(id as u16 / BLOCK);
                    assert!(
                        u64::from(len) <= max_used[owner].max(1),
                        "{}: used length {len} for head {id}, its descriptors never declared more than {} writable bytes",
                        ctx(),
                        max_used[owner]
                    );
                    if slots[s].control {
                        assert_eq!(
                            len,
                            slots[s].len + 1,
                            "{}: control request {s}: used length",
                            ctx()
                        );
                    }
                }
                if !flip_avail {
                    ids.sort_unstable();
                    assert_eq!(ids, heads, "{}: every head completed exactly once", ctx());
                }
            }
            mem.read_slice(&mut seen, GuestAddress(0)).unwrap();
            let ctx = format!("seed {seed} batch {batch}");
            for (s, want) in expected.iter().enumerate() {
                if let Some(want) = want {
                    let dst = box_addr(s, BOX_DST, OFF_A) as usize;
                    let st = seen[box_addr(s, BOX_ST, OFF_A) as usize];
                    assert_eq!(st, OK, "{ctx}: control request {s}: status");
                    assert!(
                        seen[dst..dst + want.len()] == want[..],
                        "{ctx}: control request {s}: output"
                    );
                    tally.control_ok += 1;
                }
            }

            // Bytes nobody may have written.
            if let Some(k) = (0..MEM).find(|&k| class[k] == STATIC && seen[k] != img[k]) {
                panic!(
                    "{ctx}: byte {k:#x} outside every writable buffer changed: {:#04x} -> {:#04x}",
                    img[k], seen[k]
                );
            }
            for f in &fields {
                for k in 0..f.width {
                    let a = f.addr as usize + k;
                    if class[a] == FLIPPED {
                        let b = u64::from(seen[a]);
                        assert!(
                            f.versions.iter().any(|v| (v >> (8 * k)) & 0xFF == b),
                            "{ctx}: flipped field at {:#x} byte {k} holds {b:#04x}, none of its versions",
                            f.addr
                        );
                    }
                }
            }
            for s in 0..SLOTS {
                for off in [OFF_A, OFF_B] {
                    let st = seen[box_addr(s, BOX_ST, off) as usize];
                    assert!(
                        st == ST_CANARY || st <= Status::NoSpc as u8,
                        "{ctx}: status buffer of request {s} holds {st:#04x}"
                    );
                    tally.status_values[usize::from(st)] += 1;
                }
            }
            tally.batches += 1;
        }
    });
}

#[test]
fn guest_flipping_fields_during_processing_cannot_widen_the_snapshot() {
    let t = Instant::now();
    let flips = AtomicU64::new(0);
    let mut tally = Tally {
        status_values: vec![0; 256],
        ..Default::default()
    };
    for seed in 1..=SEEDS {
        race(seed, BATCHES, seed % 2 == 0, &mut tally, &flips);
    }
    let flips = flips.load(Ordering::Relaxed);
    eprintln!(
        "{} batches, {} requests ({} ok, {} errors, {} consumed; {} exact control results), {flips} flips, {:?}",
        tally.batches,
        tally.requests,
        tally.ok,
        tally.errors,
        tally.consumed,
        tally.control_ok,
        t.elapsed()
    );
    let s = &tally.status_values;
    eprintln!(
        "status buffers: untouched {}, OK {}, ERR {}, NOTSUPP {}, INVSESS {}",
        s[usize::from(ST_CANARY)],
        s[0],
        s[1],
        s[3],
        s[4]
    );
    assert_eq!(tally.requests, SEEDS * u64::from(BATCHES * ROUNDS) * SLOTS as u64);
    assert!(flips > 100_000, "the guest thread flipped only {flips} times");
    // The flips reached the device: every kind of outcome occurred.
    assert!(
        tally.ok > 0 && tally.errors > 0 && tally.consumed > 0,
        "{tally:?}"
    );
    assert!(
        s[0] > 0 && s[1] > 0 && s[3] > 0 && s[4] > 0,
        "status values seen: {s:?}"
    );
    assert_eq!(tally.control_ok, SEEDS * u64::from(BATCHES) * SLOTS as u64 / 4);
}

// ---------------------------------------------------------------------------
// Deterministic: rewrites at the library's seams
// ---------------------------------------------------------------------------

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
            Desc {
                addr: Y + u64::from(k) * 0x1000,
                len: 0x1000,
                flags: VRING_DESC_F_WRITE | if last { 0 } else { VRING_DESC_F_NEXT },
                next: first + k + 1,
            },
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
    let table = map_contiguous(&vm.mem, vm.ring.desc, usize::from(QSIZE) * DESC_SIZE).unwrap();
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
        vm.set_desc(
            head,
            Desc {
                addr: Y_TABLE,
                len: 8 * 16,
                flags: VRING_DESC_F_INDIRECT,
                next: 0,
            },
        );
    } else {
        rewrite_to_y(vm, vm.ring.desc, head, 5);
    }
}

#[test]
fn descriptors_rewritten_after_the_walk_are_never_read_again() {
    for indirect in [false, true] {
        for (opcode, session, input, output, lane) in [
            (ENCRYPT, E, NIST_PT, NIST_CT, true),
            (ENCRYPT, E, NIST_PT, NIST_CT, false),
            (DECRYPT, D, NIST_CT, NIST_PT, true),
        ] {
            let ctx = format!("indirect {indirect}, opcode {opcode}, lane {lane}");
            let mut vm = Vm::with_ranges(&[(0, MEM)]);
            let (walker, head) = stage_and_walk(&mut vm, &hdr(opcode, session, 64, 64), &input, indirect);
            rewrite_descriptors(&vm, head, indirect);
            let c = {
                let sessions = vm.worker.sessions.lock();
                match prepare(&walker, &sessions, LIMITS, lane) {
                    Prepared::Done(c) => c,
                    Prepared::Lane(l) => {
                        let c = l.completion();
                        run_lanes(&[Some(l)]);
                        c
                    }
                }
            };
            assert_eq!(
                c,
                Completion {
                    used_len: 65,
                    status: Some(Status::Ok),
                    work: 64,
                },
                "{ctx}"
            );
            vm.assert_done_at(
                X,
                Used {
                    id: 0,
                    len: c.used_len,
                },
                &output,
            );
            vm.assert_canary(Y, Y_BYTES);
        }
    }
}

#[test]
fn header_iv_and_descriptors_rewritten_after_validation_are_never_read_again() {
    for indirect in [false, true] {
        let mut vm = Vm::with_ranges(&[(0, MEM)]);
        let (walker, head) = stage_and_walk(&mut vm, &hdr(ENCRYPT, E, 64, 64), &NIST_PT, indirect);
        let sessions = vm.worker.sessions.lock();
        // Validated, waiting to be encrypted with other requests of its key.
        let lane = match prepare(&walker, &sessions, LIMITS, true) {
            Prepared::Lane(l) => l,
            Prepared::Done(c) => panic!("a valid contiguous encrypt request is a lane: {c:?}"),
        };
        // The guest now rewrites the header (longer lengths, another IV
        // length, opcode, session and op_type), the IV and every descriptor.
        rewrite_descriptors(&vm, head, indirect);
        let mut h = hdr(DECRYPT, D, 0x800, 0x800);
        h.iv_len = 8;
        h.op_type = 2;
        vm.write(X, &h.to_bytes());
        vm.write(Addrs::at(X).iv, &[0xFF; 16]);
        let c = lane.completion();
        run_lanes(&[Some(lane)]);
        drop(sessions);
        assert_eq!(
            c,
            Completion {
                used_len: 65,
                status: Some(Status::Ok),
                work: 64,
            },
            "indirect {indirect}"
        );
        // NIST F.2.1 with the IV and length validated: the snapshot.
        vm.assert_done_at(
            X,
            Used {
                id: 0,
                len: c.used_len,
            },
            &NIST_CT,
        );
        vm.assert_canary(Y, Y_BYTES);
    }
}

#[test]
fn mixes_cover_byte_wise_tears() {
    assert_eq!(mixes(&[0x0100, 0x0900], 2), vec![0x0100, 0x0900]);
    let mut m = mixes(&[0x40, 0x1000], 4);
    m.sort_unstable();
    assert_eq!(m, vec![0, 0x40, 0x1000, 0x1040]);
    assert_eq!(mixes(&[7], 8), vec![7]);
}
