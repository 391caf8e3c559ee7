// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The racing test's requests: each field a guest may flip, with its
//! versions, laid out in guest memory, and the bounds every version allows
//! (writable ranges, the largest used length).

use crate::common::*;
use vhost_crypto_replay::driver_ring::{encode, Descriptor, DESC_SIZE, F_INDIRECT, F_NEXT, F_WRITE};
use vhost_user_crypto::wire::session::SymSessionInfo;
use vhost_user_crypto::wire::virtio_crypto::{offsets, AlgChainPara, OpDataReq};

pub(super) const MEM: usize = 4 << 20;
/// Requests per batch; each owns 8 ring descriptors (QSIZE = 256).
pub(super) const SLOTS: usize = 32;
pub(super) const BLOCK: u16 = 8;
pub(super) const SLOT_BASE: u64 = 0x10_0000;
pub(super) const SLOT_BYTES: u64 = 0x1_0000;
/// Each buffer of a request lives in its own 8 KiB box, at one of two
/// offsets (they differ in one byte, so a torn read gives one or the other).
pub(super) const BOX: u64 = 0x2000;
pub(super) const OFF_A: u64 = 0x100;
pub(super) const OFF_B: u64 = 0x900;
pub(super) const BOX_HDR: u64 = 0;
pub(super) const BOX_IV: u64 = 1;
pub(super) const BOX_SRC: u64 = 2;
pub(super) const BOX_DST: u64 = 3;
pub(super) const BOX_ST: u64 = 4;
pub(super) const BOX_DST2: u64 = 5;
/// Indirect tables T0 (at +OFF_A) and T1 (at +OFF_B).
pub(super) const BOX_TABLES: u64 = 6;
/// Status buffers start with this; afterwards they hold it or a status.
pub(super) const ST_CANARY: u8 = 0xEE;
pub(super) const DIGEST_LEN: u32 = 32;
pub(super) const N: u64 = F_NEXT as u64;
pub(super) const W: u64 = F_WRITE as u64;
pub(super) const I: u64 = F_INDIRECT as u64;

pub(super) const USED_BYTES: u64 = 6 + 8 * QSIZE as u64 + 2;

/// Byte classes of guest memory for the after-batch check.
pub(super) const STATIC: u8 = 0;
pub(super) const FLIPPED: u8 = 1;
pub(super) const WRITABLE: u8 = 2;
pub(super) const DEVICE: u8 = 3;

/// A guest field the second thread flips (little-endian, `width` bytes).
#[derive(Debug, Clone)]
pub(super) struct Field {
    pub(super) addr: u64,
    pub(super) width: usize,
    pub(super) versions: Vec<u64>,
}

/// Every value a reader can see when the field is written as whole values
/// or byte by byte: each byte from any version.
pub(super) fn mixes(versions: &[u64], width: usize) -> Vec<u64> {
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
pub(super) struct Entry {
    pub(super) at: u64,
    pub(super) addr: Vec<u64>,
    pub(super) len: Vec<u64>,
    pub(super) flags: Vec<u64>,
    pub(super) next: Vec<u64>,
}

impl Entry {
    pub(super) fn fields(&self) -> [Field; 4] {
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

    pub(super) fn initial(&self) -> Descriptor {
        Descriptor::new(
            self.addr[0],
            self.len[0] as u32,
            self.flags[0] as u16,
            self.next[0] as u16,
        )
    }

    pub(super) fn may_write(&self) -> bool {
        mixes(&self.flags, 2).iter().any(|f| f & W != 0 && f & I == 0)
    }

    /// Byte ranges any version may declare device-writable.
    pub(super) fn writable_ranges(&self) -> Vec<(u64, u64)> {
        if !self.may_write() {
            return Vec::new();
        }
        let lens = mixes(&self.len, 4);
        mixes(&self.addr, 8)
            .into_iter()
            .flat_map(|a| lens.iter().map(move |&l| (a, a + l)))
            .collect()
    }

    pub(super) fn max_writable(&self) -> u64 {
        if self.may_write() {
            mixes(&self.len, 4).into_iter().max().unwrap_or(0)
        } else {
            0
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Cipher,
    AlgChain,
}

/// A request of the batch and everything the guest may flip in it.
pub(super) struct Slot {
    pub(super) head: u16,
    pub(super) kind: Kind,
    pub(super) encrypt: bool,
    pub(super) key: Vec<u8>,
    pub(super) auth_key: Vec<u8>,
    pub(super) session: u64,
    pub(super) len: u32,
    pub(super) iv: [u8; 16],
    pub(super) src: Vec<u8>,
    /// Nothing of it is flipped: its result must be exact.
    pub(super) control: bool,
    pub(super) entries: Vec<Entry>,
    /// Indirect: which entries form table T0 and T1 (indices into `entries`).
    pub(super) tables: Option<(Vec<usize>, Vec<usize>)>,
    pub(super) header_fields: Vec<Field>,
}

pub(super) fn box_addr(slot: usize, b: u64, off: u64) -> u64 {
    SLOT_BASE + slot as u64 * SLOT_BYTES + b * BOX + off
}

/// A session the requests can name.
#[derive(Debug, Clone)]
pub(super) struct Sess {
    pub(super) id: u64,
    pub(super) kind: Kind,
    pub(super) encrypt: bool,
    pub(super) key: Vec<u8>,
    pub(super) auth_key: Vec<u8>,
}

pub(super) struct Sessions {
    pub(super) list: Vec<Sess>,
}

pub(super) fn create_sessions(vm: &mut Vm) -> Sessions {
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
            kind: Kind::AlgChain,
            encrypt,
            key: NIST_KEY.to_vec(),
            auth_key: auth.clone(),
        });
    }
    Sessions { list }
}

/// A version list: the first value, plus the others when `on`.
pub(super) fn vs(on: bool, first: u64, others: &[u64]) -> Vec<u64> {
    let mut v = vec![first];
    if on {
        v.extend_from_slice(others);
    }
    v
}

impl Slot {
    /// Builds request `i` with a random kind, size and layout; unless it is
    /// a control request, each field is flipped with probability ~1/3.
    pub(super) fn new(i: usize, rng: &mut Rng, sessions: &Sessions, control: bool) -> Slot {
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
        let digest = if kind == Kind::AlgChain { DIGEST_LEN } else { 0 };
        let mut iv = [0u8; 16];
        iv.copy_from_slice(&rng.bytes(16));
        let src = rng.bytes(len.max(alt_len) as usize);
        let indirect = rng.next_u64().is_multiple_of(2);
        let flip = |rng: &mut Rng| !control && rng.next_u64().is_multiple_of(3);
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
        let op_type = if kind == Kind::AlgChain { 2 } else { 1 };
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
        if kind == Kind::AlgChain {
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

    pub(super) fn fields(&self) -> Vec<Field> {
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
    pub(super) fn max_used(&self) -> u64 {
        let sum = |idx: &[usize]| idx.iter().map(|&k| self.entries[k].max_writable()).sum::<u64>();
        match &self.tables {
            Some((t0, t1)) => sum(t0).max(sum(t1)),
            None => sum(&(0..self.entries.len()).collect::<Vec<_>>()),
        }
    }

    /// Writes the request in its initial state into `img`, marks bytes in
    /// `class`.
    pub(super) fn lay_out(&self, i: usize, img: &mut [u8], class: &mut [u8]) {
        let put =
            |img: &mut [u8], at: u64, b: &[u8]| img[at as usize..at as usize + b.len()].copy_from_slice(b);
        let base = box_addr(i, 0, 0) as usize;
        img[base..base + SLOT_BYTES as usize].fill(CANARY);
        let op_type = if self.kind == Kind::AlgChain { 2 } else { 1 };
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
        if self.kind == Kind::AlgChain {
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
            if self.kind == Kind::AlgChain && !self.encrypt {
                // The digest the driver supplies, after dst.
                let mac = hmac(Mac::Sha256, &self.auth_key, &self.src[..self.len as usize]);
                for b in [BOX_DST, BOX_DST2] {
                    put(img, box_addr(i, b, off) + u64::from(self.len), &mac);
                }
            }
        }
        for e in &self.entries {
            put(img, e.at, &encode(&e.initial()));
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

    pub(super) fn expected_output(&self) -> Vec<u8> {
        assert_eq!(
            self.kind,
            Kind::Cipher,
            "control requests are plain cipher requests"
        );
        oracle(self.encrypt, &self.key, &self.iv, &self.src[..self.len as usize])
    }
}
