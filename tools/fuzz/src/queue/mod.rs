// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Fuzz target `queue`: a guest program against `QueueWorker::process`.
//!
//! The input decodes into a [`QueueProgram`]: guest memory (region 0 at
//! GPA 0 holding the ring, plus up to three more regions, adjacent, after a
//! hole, or at the top of the address space), the ring (size, placement,
//! start index), sessions, then a list of [`QOp`]s: raw descriptors (ring
//! or indirect tables), raw request headers and bytes, avail-ring pushes
//! and index writes, session creates and closes, well-formed requests cut
//! into pieces ([`RequestSpec`]) and `process` calls.
//!
//! After every `process` call the harness checks:
//! * the batch result matches the index movement;
//! * no guest byte changed outside the used ring and the buffers that the
//!   ring's writable descriptors (direct and in referenced indirect tables)
//!   declare, whenever those do not overlap the ring structures;
//! * `process` allocated nothing (when the embedding binary installs
//!   [`CountingAlloc`](super::alloc::CountingAlloc));
//! * every well-formed request staged since the last `process` (with
//!   nothing else disturbing it) completed with the status and used length
//!   of `docs/PROTOCOL.md` §6 (H01–H17 of `docs/RELIABILITY.md`), and valid ones with the output of a reference
//!   cipher ([`Reference`]): the fuzz target uses `algorithms`' single-stream
//!   path ([`single_stream`], pinned by NIST vectors), the corpus replay in
//!   the `fuzz_corpus` test suite, OpenSSL, which shares no code with the daemon.
//!
//! This file holds the limits and the entry points; `program.rs` the
//! program and its byte encoding, `machine.rs` the harness's guest (memory,
//! the driver ring, staged requests), `check.rs` the `process` call and
//! the checks after it.

mod check;
mod machine;
mod program;

use vhost_crypto_replay::driver_ring::{self, DescAlloc, Descriptor, DriverRing, TableArea};
use vhost_user_crypto::crypto::RequestLimits;
use vhost_user_crypto::sessions::session_set;
use vhost_user_crypto::wire::virtio_crypto::{
    virtio_crypto_opcode, Status, OP_DATA_REQ_SIZE, VIRTIO_CRYPTO_CIPHER_DECRYPT,
    VIRTIO_CRYPTO_CIPHER_ENCRYPT, VIRTIO_CRYPTO_OP_DECRYPT, VIRTIO_CRYPTO_OP_ENCRYPT,
};
use vhost_user_crypto::worker::QueueWorker;

pub use machine::{single_stream, Outcome, Reference};
pub use program::{Addr, Gap, QOp, QueueProgram, RegionSpec, RequestSpec, RingPlace, SessionSpec};

use machine::{build_memory, ring_addrs, Guest, Machine};

/// Size of region 0 (GPA 0).
pub const REGION0_SIZE: u64 = 0x1_0000;
/// Indirect tables of the harness: 8 slots of 64 descriptors.
pub const INDIRECT_AREA: u64 = 0x4000;
/// Bytes per indirect slot.
pub const INDIRECT_SLOT: u64 = 0x400;
/// Data area of region 0 (where `Addr::Cursor` allocates).
pub const DATA_START: u64 = 0x6000;
/// Largest extra region.
pub const MAX_REGION: u64 = 0x4000;
/// Most operations decoded from one input.
pub const MAX_OPS: usize = 96;
/// Request size limit given to the worker.
pub const MAX_REQUEST_BYTES: u32 = 1 << 20;

/// `VIRTIO_CRYPTO_AKCIPHER_ENCRYPT` (VIRTIO 1.2 §5.9.7.2: service
/// AKCIPHER 4, operation 0), an opcode this device does not serve.
pub const AKCIPHER_ENCRYPT: u32 = virtio_crypto_opcode(4, 0);

const ENCRYPT: u32 = VIRTIO_CRYPTO_CIPHER_ENCRYPT;
const DECRYPT: u32 = VIRTIO_CRYPTO_CIPHER_DECRYPT;
const OK: u8 = Status::Ok as u8;
const ERR: u8 = Status::Err as u8;
const NOTSUPP: u8 = Status::NotSupp as u8;
const INVSESS: u8 = Status::InvSess as u8;

/// Decodes `data` and runs it against the [`single_stream`] reference;
/// panics when a check fails.
pub fn run(data: &[u8]) -> Outcome {
    run_with(data, single_stream)
}

/// [`run`] with expected outputs from `reference`.
pub fn run_with(data: &[u8], reference: Reference) -> Outcome {
    run_program(&QueueProgram::decode(data), reference)
}

/// Runs a decoded program, with expected outputs from `reference`.
pub fn run_program(p: &QueueProgram, reference: Reference) -> Outcome {
    let mut out = Outcome::default();
    let Some((mem, ranges)) = build_memory(&p.regions) else {
        return out;
    };
    let ring = ring_addrs(p.queue_size, p.ring, &ranges);
    let (mut reg, mut tables) = session_set(16, 1);
    let mut sessions = Vec::new();
    for s in &p.sessions {
        let id = reg.create(&s.info());
        if id > 0 {
            sessions.push(s.live(id as u64));
        }
    }
    let worker = QueueWorker::new(
        tables.remove(0),
        RequestLimits {
            max_request_bytes: MAX_REQUEST_BYTES,
        },
    );
    let mut m = Machine {
        guest: Guest { mem, ranges },
        reg,
        worker,
        driver: DriverRing::new(ring, p.start_idx),
        next_avail: p.start_idx,
        next_used: p.start_idx,
        sessions,
        cursor: DATA_START,
        descs: DescAlloc::new(ring.size),
        tables: TableArea::new(INDIRECT_AREA, INDIRECT_AREA + 8 * INDIRECT_SLOT, INDIRECT_SLOT),
        pending: Vec::new(),
        pushed: 0,
        clean: true,
        before: Vec::new(),
        after: Vec::new(),
        reference,
    };
    m.poke(ring.avail_idx(), &p.start_idx.to_le_bytes());
    m.poke(ring.used_idx(), &p.start_idx.to_le_bytes());
    for op in &p.ops {
        match op {
            QOp::Desc {
                table,
                idx,
                addr,
                len,
                flags,
                next,
            } => {
                let t = match table {
                    1..=8 => INDIRECT_AREA + u64::from(table - 1) * INDIRECT_SLOT,
                    _ => m.driver.ring().desc,
                };
                let addr = m.resolve(*addr, u64::from(*len).min(0x1000));
                let d = Descriptor::new(addr, *len, u16::from(*flags), *next);
                driver_ring::write_desc(&m.guest, t, *idx, &d);
                m.disturb();
            }
            QOp::Header { at, hdr } => {
                let a = m.resolve(*at, OP_DATA_REQ_SIZE as u64);
                m.poke(a, &hdr.to_bytes());
                m.disturb();
            }
            QOp::Bytes { at, data } => {
                let a = m.resolve(*at, data.len() as u64);
                m.poke(a, data);
                m.disturb();
            }
            QOp::Fill { at, len, byte } => {
                let len = u64::from(*len).min(0x1_0000);
                let a = m.resolve(*at, len);
                m.poke(a, &vec![*byte; len as usize]);
                m.disturb();
            }
            QOp::Push(head) => {
                m.push(*head);
                m.disturb();
            }
            QOp::AvailIdx(i) => {
                m.driver.set_avail_idx(*i);
                m.poke(m.driver.ring().avail_idx(), &i.to_le_bytes());
                m.disturb();
            }
            QOp::Process => m.process(&mut out),
            QOp::Create(s) => {
                let room = m.reg.len() < 16;
                let id = m.reg.create(&s.info());
                let valid = matches!(s.key_len, 16 | 24 | 32)
                    && matches!(s.direction, VIRTIO_CRYPTO_OP_ENCRYPT | VIRTIO_CRYPTO_OP_DECRYPT);
                assert_eq!(id > 0, valid && room, "create {s:?} gave {id}");
                if id > 0 {
                    m.sessions.push(s.live(id as u64));
                }
            }
            QOp::Close(id) => {
                let live = m.sessions.iter().any(|x| x.0 == *id);
                assert_eq!(m.reg.close(*id), live, "close {id}");
                m.sessions.retain(|x| x.0 != *id);
                m.disturb();
            }
            QOp::Reset => m.worker.reset(),
            QOp::Request(s) => m.stage(*s),
        }
    }
    m.process(&mut out);
    out
}
