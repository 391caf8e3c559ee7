// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The seed corpus: programs built from the hostile-guest cases H01–H17 of
//! `docs/RELIABILITY.md` and the shapes real guests send.
//! the `fuzz_corpus` test suite checks that `tools/fuzz/corpus/<target>/<name>`
//! holds exactly `encode()` of each (and rewrites them with
//! `FUZZ_CORPUS_REGEN=1`).

use vhost_crypto_replay::driver_ring::{self, Buf};
use vhost_user_crypto::wire::virtio_crypto::{
    OpDataReq, VIRTIO_CRYPTO_CIPHER_AES_CBC, VIRTIO_CRYPTO_CIPHER_CREATE_SESSION,
    VIRTIO_CRYPTO_CIPHER_DECRYPT, VIRTIO_CRYPTO_CIPHER_ENCRYPT, VIRTIO_CRYPTO_OP_DECRYPT,
    VIRTIO_CRYPTO_OP_ENCRYPT, VIRTIO_CRYPTO_SYM_OP_CIPHER,
};

use super::engines::{EnginesProgram, LaneSpec, MacSpec};
use super::queue::{
    Addr, Gap, QOp, QueueProgram, RegionSpec, RequestSpec, RingPlace, SessionSpec, AKCIPHER_ENCRYPT,
    REGION0_SIZE,
};
use super::session::{Payload, SOp, SessionProgram};

const ENCRYPT: u32 = VIRTIO_CRYPTO_CIPHER_ENCRYPT;
const DECRYPT: u32 = VIRTIO_CRYPTO_CIPHER_DECRYPT;
/// Descriptor flags as [`QOp::Desc`] carries them (the low byte).
const F_NEXT: u8 = driver_ring::F_NEXT as u8;
const F_INDIRECT: u8 = driver_ring::F_INDIRECT as u8;

/// Baseline addresses in region 0 (D0..D4 of `docs/RELIABILITY.md`'s
/// baseline request, scaled down).
const H: u64 = 0x8000;
const IV: u64 = 0x9000;
const SRC: u64 = 0xA000;
const DST: u64 = 0xB000;
const ST: u64 = 0xC000;

const NIST_IV: [u8; 16] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];
const PT: [u8; 64] = [
    0x6b, 0xc1, 0xbe, 0xe2, 0x2e, 0x40, 0x9f, 0x96, 0xe9, 0x3d, 0x7e, 0x11, 0x73, 0x93, 0x17, 0x2a, 0xae,
    0x2d, 0x8a, 0x57, 0x1e, 0x03, 0xac, 0x9c, 0x9e, 0xb7, 0x6f, 0xac, 0x45, 0xaf, 0x8e, 0x51, 0x30, 0xc8,
    0x1c, 0x46, 0xa3, 0x5c, 0xe4, 0x11, 0xe5, 0xfb, 0xc1, 0x19, 0x1a, 0x0a, 0x52, 0xef, 0xf6, 0x9f, 0x24,
    0x45, 0xdf, 0x4f, 0x9b, 0x17, 0xad, 0x2b, 0x41, 0x7b, 0xe6, 0x6c, 0x37, 0x10,
];

fn hdr(opcode: u32, session_id: u64, src: u32, dst: u32) -> OpDataReq {
    OpDataReq {
        opcode,
        algo: 0,
        session_id,
        op_type: VIRTIO_CRYPTO_SYM_OP_CIPHER,
        iv_len: 16,
        src_data_len: src,
        dst_data_len: dst,
    }
}

/// Sessions 1 (E, AES-128), 2 (D, AES-128), 3 (E, AES-256), 4 (D, AES-192).
fn std_sessions() -> Vec<SessionSpec> {
    vec![
        SessionSpec {
            key_len: 16,
            direction: VIRTIO_CRYPTO_OP_ENCRYPT,
            key_byte: 0x2b,
        },
        SessionSpec {
            key_len: 16,
            direction: VIRTIO_CRYPTO_OP_DECRYPT,
            key_byte: 0x2b,
        },
        SessionSpec {
            key_len: 32,
            direction: VIRTIO_CRYPTO_OP_ENCRYPT,
            key_byte: 0x60,
        },
        SessionSpec {
            key_len: 24,
            direction: VIRTIO_CRYPTO_OP_DECRYPT,
            key_byte: 0x8e,
        },
    ]
}

fn prog(ops: Vec<QOp>) -> QueueProgram {
    QueueProgram {
        queue_size: 256,
        ring: RingPlace::Standard,
        start_idx: 0,
        regions: Vec::new(),
        sessions: std_sessions(),
        ops,
    }
}

fn desc(idx: u16, addr: u64, len: u32, flags: u8, next: u16) -> QOp {
    QOp::Desc {
        table: 0,
        idx,
        addr: Addr::Raw(addr),
        len,
        flags,
        next,
    }
}

/// `bufs` (addr, len, writable) as buffers.
fn bufs_of(bufs: &[(u64, u32, bool)]) -> Vec<Buf> {
    bufs.iter()
        .map(|&(addr, len, write)| Buf { addr, len, write })
        .collect()
}

/// A chain of (addr, len, writable) at ring slots first.., pushed.
fn chain(first: u16, bufs: &[(u64, u32, bool)]) -> Vec<QOp> {
    let bufs = bufs_of(bufs);
    let mut ops: Vec<QOp> = driver_ring::chain(&bufs, first)
        .zip(first..)
        .map(|(d, idx)| desc(idx, d.addr().0, d.len(), d.flags() as u8, d.next()))
        .collect();
    ops.push(QOp::Push(first));
    ops
}

/// The same buffers in indirect slot `slot`, head at ring slot `head`.
fn indirect(head: u16, slot: u8, bufs: &[(u64, u32, bool)]) -> Vec<QOp> {
    let bufs = bufs_of(bufs);
    let mut ops: Vec<QOp> = driver_ring::chain(&bufs, 0)
        .zip(0..)
        .map(|(d, idx)| QOp::Desc {
            table: 1 + slot,
            idx,
            addr: Addr::Raw(d.addr().0),
            len: d.len(),
            flags: d.flags() as u8,
            next: d.next(),
        })
        .collect();
    ops.push(QOp::Desc {
        table: 0,
        idx: head,
        addr: Addr::Indirect(slot),
        len: 16 * bufs.len() as u32,
        flags: F_INDIRECT,
        next: 0,
    });
    ops.push(QOp::Push(head));
    ops
}

/// Header, IV and source of a baseline-layout request.
fn stage(h: OpDataReq, src: &[u8]) -> Vec<QOp> {
    vec![
        QOp::Header {
            at: Addr::Raw(H),
            hdr: h,
        },
        QOp::Bytes {
            at: Addr::Raw(IV),
            data: NIST_IV.to_vec(),
        },
        QOp::Bytes {
            at: Addr::Raw(SRC),
            data: src.to_vec(),
        },
    ]
}

fn baseline_bufs(n: u32) -> Vec<(u64, u32, bool)> {
    vec![
        (H, 72, false),
        (IV, 16, false),
        (SRC, n, false),
        (DST, n, true),
        (ST, 1, true),
    ]
}

fn req(opcode: u8, session: u8, blocks: u16, shape: u8, seed: u8, at: Addr) -> QOp {
    QOp::Request(RequestSpec {
        opcode,
        session,
        blocks,
        shape,
        seed,
        at,
    })
}

/// A baseline request followed by a well-formed one, so every seed also
/// checks that the queue goes on after the hostile part.
fn then_ok(mut ops: Vec<QOp>) -> Vec<QOp> {
    ops.push(QOp::Process);
    ops.push(req(0, 0, 3, 0, 7, Addr::Cursor));
    ops
}

/// Seeds of the `queue` target.
pub fn queue_seeds() -> Vec<(&'static str, QueueProgram)> {
    let mut v: Vec<(&'static str, QueueProgram)> = Vec::new();
    let mut ops = stage(hdr(ENCRYPT, 1, 64, 64), &PT);
    ops.extend(chain(0, &baseline_bufs(64)));
    v.push(("baseline-direct", prog(ops)));

    let mut ops = stage(hdr(DECRYPT, 2, 64, 64), &PT);
    ops.extend(indirect(0, 0, &baseline_bufs(64)));
    v.push(("baseline-indirect-decrypt", prog(ops)));

    // Well-formed requests of every shape in one batch (lanes, key changes,
    // split streams, in place, indirect, merged status).
    let mut ops = Vec::new();
    for k in 0..12u8 {
        ops.push(req(
            k % 3,
            [0, 2, 1, 3][usize::from(k % 4)],
            u16::from(k) * 5,
            k * 0x11,
            k,
            Addr::Cursor,
        ));
    }
    v.push(("request-mix", prog(ops)));

    let mut ops = Vec::new();
    for k in 0..20u8 {
        ops.push(req(0, if k % 5 < 3 { 0 } else { 2 }, 15, 0, k, Addr::Cursor));
    }
    v.push(("lanes-two-keys", prog(ops)));

    let mut ops = Vec::new();
    for (k, shape) in [0x70u8, 0x72, 0x75, 0x77].into_iter().enumerate() {
        ops.push(req(1 + k as u8 % 2, k as u8, 1023, shape, k as u8, Addr::Cursor));
    }
    v.push(("large-split-16k", prog(ops)));

    // H01 / H02 / H03 / H04 / H07 / H14: headers the lengths of which lie.
    for (name, h, n) in [
        ("h01-length-sum-overflow", hdr(ENCRYPT, 1, 0xFFFF_FFF8, 16), 64),
        ("h02-src-dst-mismatch", hdr(ENCRYPT, 1, 64, 16), 64),
        (
            "h03-guest-sized-length",
            hdr(ENCRYPT, 1, 0x7FFF_FFF0, 0x7FFF_FFF0),
            64,
        ),
        ("h04-akcipher-opcode", hdr(AKCIPHER_ENCRYPT, 1, 64, 64), 64),
        ("h14-not-a-block-multiple", hdr(ENCRYPT, 1, 17, 17), 17),
    ] {
        let mut ops = stage(h, &PT);
        ops.extend(chain(0, &baseline_bufs(n)));
        v.push((name, prog(then_ok(ops))));
    }
    let mut h = hdr(ENCRYPT, 1, 64, 64);
    h.op_type = 0;
    let mut ops = stage(h, &PT);
    h.op_type = 1;
    h.algo = 4;
    ops.extend(chain(0, &baseline_bufs(64)));
    ops.push(QOp::Header {
        at: Addr::Raw(H + 0x100),
        hdr: h,
    });
    let mut b = baseline_bufs(64);
    b[0].0 = H + 0x100;
    b[4].0 = ST + 2;
    ops.extend(indirect(5, 0, &b));
    v.push(("h04-op-type-and-algo", prog(then_ok(ops))));

    let mut h = hdr(ENCRYPT, 1, 64, 64);
    h.iv_len = 4096;
    let mut ops = stage(h, &PT);
    let mut b = baseline_bufs(64);
    b[1].1 = 4096;
    ops.extend(chain(0, &b));
    v.push(("h07-iv-4096", prog(then_ok(ops))));

    let mut ops = stage(hdr(ENCRYPT, 1, 64, 64), &PT);
    let mut b = baseline_bufs(64);
    b[3].1 = 16;
    ops.extend(chain(0, &b));
    v.push(("h07-dst-short", prog(then_ok(ops))));

    let mut ops = stage(hdr(ENCRYPT, 1, 32, 32), &PT);
    let mut b = baseline_bufs(32);
    b[3].1 = 4096;
    ops.extend(chain(0, &b));
    v.push(("h14-32-bytes-4k-dst", prog(then_ok(ops))));

    // H08: header 24 + 48, IV 10 + 6, src 8 + 4096 (16 declared).
    let mut ops = stage(hdr(ENCRYPT, 1, 16, 16), &PT);
    ops.extend(chain(
        0,
        &[
            (H, 24, false),
            (H + 24, 48, false),
            (IV, 10, false),
            (IV + 10, 6, false),
            (SRC, 8, false),
            (SRC + 8, 4096, false),
            (DST, 16, true),
            (ST, 1, true),
        ],
    ));
    v.push(("h08-pieces-clamped", prog(then_ok(ops))));

    // H09: D1.next -> D0 with no writable descriptor; next = 300.
    let mut ops = stage(hdr(ENCRYPT, 1, 64, 64), &PT);
    ops.push(desc(0, H, 72, F_NEXT, 1));
    ops.push(desc(1, IV, 16, F_NEXT, 0));
    ops.push(QOp::Push(0));
    ops.push(desc(2, H, 72, F_NEXT, 300));
    ops.push(QOp::Push(2));
    v.push(("h09-loop-and-bad-next", prog(then_ok(ops))));

    // H10: avail index 1000 ahead; then reset and serve.
    let mut ops = stage(hdr(ENCRYPT, 1, 64, 64), &PT);
    ops.extend(chain(0, &baseline_bufs(64)));
    ops.push(QOp::AvailIdx(1000));
    ops.push(QOp::Process);
    ops.push(QOp::Process);
    ops.push(QOp::AvailIdx(0));
    ops.push(QOp::Reset);
    ops.push(req(0, 0, 0, 0, 1, Addr::Cursor));
    v.push(("h10-avail-index-jump", prog(ops)));

    // H11: header-only chain, then the baseline.
    let mut ops = stage(hdr(ENCRYPT, 1, 64, 64), &PT);
    ops.extend(chain(0, &baseline_bufs(64)[..1]));
    ops.extend(chain(1, &baseline_bufs(64)));
    v.push(("h11-never-completed", prog(ops)));

    // H12: writable 0xFFFFFFFF chained to 0x12345678.
    let mut ops = stage(hdr(ENCRYPT, 1, 64, 64), &PT);
    ops.extend(chain(
        0,
        &[
            (H, 72, false),
            (IV, 16, false),
            (SRC, 64, false),
            (DST, u32::MAX, true),
            (ST, 0x1234_5678, true),
        ],
    ));
    v.push(("h12-writable-length-sum", prog(then_ok(ops))));

    // H13: dst at 2^64 - 256; dst running past RAM; IV past RAM.
    let mut ops = stage(hdr(ENCRYPT, 1, 64, 64), &PT);
    let mut b = baseline_bufs(64);
    b[3].0 = 0xFFFF_FFFF_FFFF_FF00;
    ops.extend(chain(0, &b));
    let mut b = baseline_bufs(64);
    b[3].0 = REGION0_SIZE - 16;
    b[4].0 = ST + 4;
    ops.extend(chain(5, &b));
    let mut b = baseline_bufs(64);
    b[1].0 = REGION0_SIZE - 8;
    b[4].0 = ST + 8;
    ops.extend(chain(10, &b));
    v.push(("h13-ranges-past-ram", prog(then_ok(ops))));

    // H17: zero-length descriptors with wild addresses; empty status; no writable byte.
    let mut ops = stage(hdr(ENCRYPT, 1, 64, 64), &PT);
    ops.extend(chain(
        0,
        &[
            (u64::MAX, 0, false),
            (H, 72, false),
            (0xDEAD_BEEF_0000_0000, 0, true),
            (IV, 16, false),
            (SRC, 64, false),
            (DST, 64, true),
            (0xFFFF_FFFF_FFFF_FF00, 0, false),
            (ST, 1, true),
            (0, 0, true),
        ],
    ));
    let mut b = baseline_bufs(64);
    b[4].1 = 0;
    ops.extend(chain(9, &b));
    b[3].1 = 0;
    ops.extend(chain(14, &b));
    v.push(("h17-zero-length", prog(then_ok(ops))));

    // Indirect-table faults: bad sizes, INDIRECT|NEXT, nested, table past RAM.
    let mut ops = stage(hdr(ENCRYPT, 1, 64, 64), &PT);
    for (k, (len, flags)) in [(79u32, F_INDIRECT), (0, F_INDIRECT), (80, F_INDIRECT | F_NEXT)]
        .into_iter()
        .enumerate()
    {
        ops.push(QOp::Desc {
            table: 0,
            idx: k as u16,
            addr: Addr::Indirect(0),
            len,
            flags,
            next: 0,
        });
        ops.push(QOp::Push(k as u16));
    }
    ops.extend(indirect(3, 1, &baseline_bufs(64)));
    ops.push(QOp::Desc {
        table: 2,
        idx: 2,
        addr: Addr::Indirect(0),
        len: 80,
        flags: F_INDIRECT | F_NEXT,
        next: 3,
    });
    ops.push(desc(4, REGION0_SIZE - 32, 80, F_INDIRECT, 0));
    ops.push(QOp::Push(4));
    v.push(("indirect-table-faults", prog(then_ok(ops))));

    // Memory made of several regions: adjacent, after a hole, at the top.
    let mut p = prog(vec![
        req(0, 0, 20, 0x30, 1, Addr::RegionEnd { idx: 0, back: 40 }),
        req(1, 1, 20, 0x13, 2, Addr::RegionEnd { idx: 1, back: 100 }),
        req(0, 2, 3, 0x02, 3, Addr::RegionEnd { idx: 2, back: 7 }),
        req(2, 3, 9, 0x75, 4, Addr::Region { idx: 1, off: 5 }),
    ]);
    p.regions = vec![
        RegionSpec {
            gap: Gap::Adjacent,
            size: 4097,
        },
        RegionSpec {
            gap: Gap::Adjacent,
            size: 33,
        },
        RegionSpec {
            gap: Gap::Adjacent,
            size: 0x4000,
        },
    ];
    v.push(("regions-adjacent", p));

    let mut p = prog(vec![
        req(0, 0, 10, 0, 1, Addr::RegionEnd { idx: 1, back: 64 }),
        req(0, 0, 10, 0, 2, Addr::Region { idx: 1, off: 0 }),
        req(1, 1, 10, 1, 3, Addr::RegionEnd { idx: 2, back: 300 }),
    ]);
    p.regions = vec![
        RegionSpec {
            gap: Gap::Hole(0x1000),
            size: 0x2000,
        },
        RegionSpec {
            gap: Gap::Top,
            size: 0x1000,
        },
    ];
    v.push(("regions-hole-and-top", p));

    // Ring geometry: bad sizes, misaligned, overlapping, elsewhere.
    for (name, size, ring) in [
        ("ring-size-3", 3u16, RingPlace::Standard),
        ("ring-size-0", 0, RingPlace::Standard),
        ("ring-size-1", 1, RingPlace::Standard),
        ("ring-size-32768", 32768, RingPlace::Standard),
        ("ring-avail-odd", 256, RingPlace::AvailOdd),
        ("ring-used-misaligned", 256, RingPlace::UsedMisaligned),
        ("ring-desc-misaligned", 256, RingPlace::DescMisaligned),
        ("ring-used-at-region-end", 256, RingPlace::UsedAtRegionEnd),
        ("ring-used-over-avail", 16, RingPlace::UsedOverAvail),
        ("ring-used-over-desc", 16, RingPlace::UsedOverDesc),
        ("ring-in-region-1", 64, RingPlace::InRegion1),
    ] {
        let mut p = prog(vec![
            req(0, 0, 1, 0, 1, Addr::Cursor),
            req(1, 1, 2, 1, 2, Addr::Cursor),
            QOp::Process,
            req(0, 2, 3, 0, 3, Addr::Cursor),
        ]);
        p.queue_size = size;
        p.ring = ring;
        if ring == RingPlace::InRegion1 {
            p.regions = vec![RegionSpec {
                gap: Gap::Hole(0x10_0000),
                size: 0x4000,
            }];
        }
        v.push((name, p));
    }

    // Indices across the u16 wrap.
    let mut p = prog((0..6u8).map(|k| req(k % 4, k, 2, k, k, Addr::Cursor)).collect());
    p.start_idx = 0xFFFD;
    v.push(("start-index-wrap", p));

    // Sessions closed and created between batches.
    let mut p = prog(vec![
        req(0, 0, 4, 0, 1, Addr::Cursor),
        QOp::Close(1),
        req(0, 0, 4, 0, 2, Addr::Cursor),
        QOp::Process,
        QOp::Create(SessionSpec {
            key_len: 24,
            direction: VIRTIO_CRYPTO_OP_ENCRYPT,
            key_byte: 9,
        }),
        QOp::Create(SessionSpec {
            key_len: 17,
            direction: VIRTIO_CRYPTO_OP_ENCRYPT,
            key_byte: 9,
        }),
        req(0, 3, 4, 0, 3, Addr::Cursor),
        req(3, 3, 4, 0, 4, Addr::Cursor),
        req(0, 0xF5, 4, 0, 5, Addr::Cursor),
    ]);
    p.sessions.truncate(2);
    v.push(("sessions-close-create", p));

    // Raw header written over a staged request, pushes of bad heads.
    let mut p = prog(vec![
        req(0, 0, 4, 0, 1, Addr::Data(0)),
        QOp::Fill {
            at: Addr::Data(0),
            len: 40,
            byte: 0xFF,
        },
        QOp::Push(255),
        QOp::Push(0xFFFF),
        req(1, 1, 4, 1, 2, Addr::Data(0x1000)),
    ]);
    p.queue_size = 256;
    v.push(("overwritten-and-bad-heads", p));
    v
}

fn create(abi: u8, layout: u8, key_len: u32, direction: u8) -> SOp {
    SOp::Create {
        abi,
        payload: Payload::Layout {
            layout,
            op_code: VIRTIO_CRYPTO_CIPHER_CREATE_SESSION.into(),
            cipher_alg: VIRTIO_CRYPTO_CIPHER_AES_CBC,
            key_len,
            op_type: VIRTIO_CRYPTO_SYM_OP_CIPHER as u8,
            direction,
            key_byte: 0x2b,
            patch_at: 0,
            patch: Vec::new(),
        },
    }
}

fn raw(abi: u8, len: u16, fill: u8) -> SOp {
    SOp::Create {
        abi,
        payload: Payload::Raw {
            len,
            fill,
            patch: Vec::new(),
        },
    }
}

/// Seeds of the `session` target.
pub fn session_seeds() -> Vec<(&'static str, SessionProgram)> {
    let p = |max_sessions: u8, ops: Vec<SOp>| SessionProgram { max_sessions, ops };
    let mut v = Vec::new();
    v.push((
        "valid-all-layouts",
        p(
            8,
            vec![
                create(0, 0, 16, 1),
                create(0, 1, 24, 2),
                create(0, 2, 32, 1),
                create(1, 0, 16, 2),
                create(2, 1, 16, 1),
                create(3, 2, 16, 2),
                SOp::Close(2),
                SOp::Close(2),
                create(0, 2, 16, 1),
            ],
        ),
    ));
    // H06: key lengths in every layout.
    let mut ops = Vec::new();
    for key_len in [0x1000, 0, 64, 17, 15, 33, u32::MAX] {
        for layout in 0..3 {
            ops.push(create(0, layout, key_len, 1));
        }
    }
    ops.push(create(0, 1, 16, 1));
    v.push(("h06-key-lengths", p(8, ops)));
    // H05: bad creates, then closes of unknown ids.
    let mut ops: Vec<SOp> = (0..10).map(|k| create(0, k % 3, 17, 1)).collect();
    ops.extend([0, 1, 3, u64::MAX, 1 << 63].map(SOp::Close));
    ops.push(create(0, 0, 16, 1));
    ops.push(SOp::Close(1));
    v.push(("h05-error-paths", p(4, ops)));
    // Payloads of odd sizes and garbage in the two known sizes.
    let mut ops = Vec::new();
    for n in [0u16, 1, 7, 8, 71, 100, 119, 120, 631, 633, 1071, 1073, 2048, 4096] {
        ops.push(raw(0, n, 0x41));
    }
    for fill in [0u8, 0xFF, 0x41, 0x02] {
        ops.push(raw(0, 632, fill));
        ops.push(raw(0, 1072, fill));
    }
    v.push(("odd-sizes-and-garbage", p(8, ops)));
    // A forced layout that does not match the size, and one that does.
    v.push((
        "forced-layout",
        p(
            8,
            vec![
                raw(3, 632, 0),
                raw(1, 1072, 0),
                create(3, 0, 16, 1),
                create(1, 2, 16, 1),
                create(2, 0, 16, 1),
                create(1, 0, 16, 1),
            ],
        ),
    ));
    // Session limit.
    v.push((
        "session-limit",
        p(
            1,
            vec![
                create(0, 0, 16, 1),
                create(0, 1, 16, 2),
                SOp::Close(1),
                create(0, 2, 32, 2),
            ],
        ),
    ));
    // Unsupported algorithm, op_type, op_code; direction 0 and 3; a layout
    // C op_code above 32 bits; B that reads as A (cipher_alg 2, key_len 14).
    let mut ops = Vec::new();
    for (layout, op_code, cipher_alg, op_type, direction) in [
        (0u8, 2u64, 4u32, 1u8, 1u8),
        (2, 2, 3, 2, 1),
        (0, 0x404, 3, 1, 1),
        (2, 0x404, 3, 1, 1),
        (2, 0x1_0000_0002, 3, 1, 1),
        (1, 2, 3, 1, 0),
        (1, 2, 3, 1, 3),
        (1, 2, 2, 1, 1),
    ] {
        ops.push(SOp::Create {
            abi: 0,
            payload: Payload::Layout {
                layout,
                op_code,
                cipher_alg,
                key_len: if cipher_alg == 2 { 14 } else { 16 },
                op_type,
                direction,
                key_byte: 1,
                patch_at: 40,
                patch: vec![0xEF, 0xBE, 0xAD, 0xDE, 0, 0x7F],
            },
        });
    }
    v.push(("unsupported-and-ambiguous", p(8, ops)));
    // CLOSE payloads of bad sizes.
    v.push((
        "close-sizes",
        p(
            8,
            vec![
                create(0, 0, 16, 1),
                SOp::CloseRaw(vec![1; 7]),
                SOp::CloseRaw(vec![1, 0, 0, 0, 0, 0, 0, 0, 0]),
                SOp::CloseRaw(Vec::new()),
                SOp::CloseRaw(vec![1, 0, 0, 0, 0, 0, 0, 0]),
            ],
        ),
    ));
    v
}

/// Seeds of the `engines` target: NIST SP 800-38A F.2 keys and IV, lanes
/// ragged and equal, in and out of place, and MAC jobs around the SHA
/// padding boundaries (55/56/64/119/120 bytes) with keys shorter and
/// longer than the 64-byte block.
pub fn engines_seeds() -> Vec<(&'static str, EnginesProgram)> {
    const K128: [u8; 16] = [
        0x2b, 0x7e, 0x15, 0x16, 0x28, 0xae, 0xd2, 0xa6, 0xab, 0xf7, 0x15, 0x88, 0x09, 0xcf, 0x4f, 0x3c,
    ];
    let lane = |blocks: u16, out_of_place: bool, offset: u8, cut: u8| LaneSpec {
        blocks,
        out_of_place,
        offset,
        cut,
        iv: NIST_IV,
    };
    let mac = |sha256: bool, key_len: usize, len: u16, digest_len: u8, cut: u8| MacSpec {
        sha256,
        key: (0..key_len).map(|i| i as u8).collect(),
        len,
        digest_len,
        cut,
    };
    let data: Vec<u8> = PT.iter().cycle().take(4096).copied().collect();
    let mut v = Vec::new();
    v.push((
        "nist-one-lane",
        EnginesProgram {
            key: K128.to_vec(),
            lanes: vec![lane(4, false, 0, 0)],
            macs: vec![mac(false, 20, 8, 20, 0), mac(true, 32, 50, 32, 0)],
            data: PT.to_vec(),
        },
    ));
    v.push((
        "ragged-16-lanes",
        EnginesProgram {
            key: (0..32).collect(),
            lanes: (0..16u16)
                .map(|k| lane((k * 7) % 20, k % 3 == 0, k as u8 % 16, (k % 4) as u8))
                .collect(),
            macs: [0u16, 1, 55, 56, 63, 64, 65, 119, 120, 128, 200, 1000]
                .iter()
                .enumerate()
                .map(|(i, &n)| {
                    mac(
                        i % 2 == 0,
                        [0, 1, 64, 65, 200][i % 5],
                        n,
                        1 + (i as u8 % 20),
                        i as u8 * 11,
                    )
                })
                .collect(),
            data: data.clone(),
        },
    ));
    v.push((
        "equal-8-lanes-out-of-place",
        EnginesProgram {
            key: (100..124).collect(),
            lanes: (0..8).map(|k| lane(48, true, k, 5)).collect(),
            macs: (0..16).map(|i| mac(true, 32, 256 + i * 64, 16, 0)).collect(),
            data: data.clone(),
        },
    ));
    v.push((
        "long-and-empty",
        EnginesProgram {
            key: K128.to_vec(),
            lanes: vec![
                lane(0, false, 0, 0),
                lane(600, false, 3, 17),
                lane(0, true, 1, 0),
                lane(33, true, 0, 1),
            ],
            macs: vec![
                mac(false, 0, 5000, 12, 7),
                mac(true, 0, 0, 1, 0),
                mac(false, 200, 64, 20, 63),
            ],
            data,
        },
    ));
    v
}
