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
//!   [`crate::alloc::CountingAlloc`](super::alloc::CountingAlloc));
//! * every well-formed request staged since the last `process` (with
//!   nothing else disturbing it) completed with the status and used length
//!   of the cases file, and valid ones with the output of a reference
//!   cipher ([`Reference`]): the fuzz target uses `algorithms`' single-stream
//!   path ([`single_stream`], pinned by NIST vectors), the corpus replay in
//!   `tests/fuzz_corpus.rs` OpenSSL, which shares no code with the daemon.

use algorithms::Direction;
use vhost_crypto_replay::driver_ring::{
    self, decode, Buf, DescAlloc, Descriptor, DriverMemory, DriverRing, SplitRing, TableArea, UsedElem,
    DESC_SIZE,
};
use vhost_user_crypto::crypto::RequestLimits;
use vhost_user_crypto::sessions::{session_set, SessionRegistry};
use vhost_user_crypto::virtq::ring::RingAddrs;
use vhost_user_crypto::wire::session::SymSessionInfo;
use vhost_user_crypto::wire::virtio_crypto::{
    virtio_crypto_opcode, OpDataReq, Status, VIRTIO_CRYPTO_CIPHER_AES_CBC, VIRTIO_CRYPTO_CIPHER_DECRYPT,
    VIRTIO_CRYPTO_CIPHER_ENCRYPT, VIRTIO_CRYPTO_MAC_HMAC_SHA1, VIRTIO_CRYPTO_MAC_HMAC_SHA_256,
    VIRTIO_CRYPTO_OP_DECRYPT, VIRTIO_CRYPTO_OP_ENCRYPT, VIRTIO_CRYPTO_SYM_ALG_CHAIN_ORDER_CIPHER_THEN_HASH,
    VIRTIO_CRYPTO_SYM_ALG_CHAIN_ORDER_HASH_THEN_CIPHER, VIRTIO_CRYPTO_SYM_HASH_MODE_AUTH,
    VIRTIO_CRYPTO_SYM_OP_ALGORITHM_CHAINING, VIRTIO_CRYPTO_SYM_OP_CIPHER,
};
use vhost_user_crypto::worker::{BatchResult, QueueWorker};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::alloc;
use super::reader::{Reader, Writer};

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

/// Where an extra region starts relative to the end of the previous one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gap {
    /// Right after it.
    Adjacent,
    /// After a hole of this many bytes.
    Hole(u64),
    /// At the top of the address space (its last byte is `u64::MAX - 1`).
    Top,
}

/// An extra guest-memory region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionSpec {
    /// Placement.
    pub gap: Gap,
    /// Size in bytes, 1..=[`MAX_REGION`].
    pub size: u64,
}

/// Where the three ring areas are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingPlace {
    /// Descriptor table at 0, avail and used rings after it.
    Standard,
    /// Avail ring at an odd address.
    AvailOdd,
    /// Used ring 2-aligned only.
    UsedMisaligned,
    /// Descriptor table 8-aligned only.
    DescMisaligned,
    /// Used ring running off the end of region 0.
    UsedAtRegionEnd,
    /// Used ring on top of the avail ring.
    UsedOverAvail,
    /// Used ring on top of the descriptor table.
    UsedOverDesc,
    /// All three at the start of region 1 (standard if there is none).
    InRegion1,
}

const RING_PLACES: [RingPlace; 8] = [
    RingPlace::Standard,
    RingPlace::AvailOdd,
    RingPlace::UsedMisaligned,
    RingPlace::DescMisaligned,
    RingPlace::UsedAtRegionEnd,
    RingPlace::UsedOverAvail,
    RingPlace::UsedOverDesc,
    RingPlace::InRegion1,
];

/// A session created before the first operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionSpec {
    /// `key_len` of the CREATE (16/24/32 valid).
    pub key_len: u32,
    /// 1 encrypt, 2 decrypt, others refused.
    pub direction: u8,
    /// Key bytes are `key_byte ^ i`.
    pub key_byte: u8,
}

/// A guest address, chosen structurally.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Addr {
    /// Offset into region 0's data area.
    Data(u32),
    /// Start of region `idx` (modulo the region count) plus `off`.
    Region {
        /// Region index.
        idx: u8,
        /// Offset from its start (may run past its end).
        off: u32,
    },
    /// End of region `idx` minus `back`.
    RegionEnd {
        /// Region index.
        idx: u8,
        /// Bytes before its end.
        back: u16,
    },
    /// Any address.
    Raw(u64),
    /// The harness's allocation cursor in region 0's data area.
    Cursor,
    /// Indirect slot `n % 8`.
    Indirect(u8),
}

/// A well-formed request, cut into pieces, staged and pushed in one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestSpec {
    /// 0: the session's direction; 1 encrypt; 2 decrypt; 3 an unsupported opcode.
    pub opcode: u8,
    /// Below 0xF0: a created session (index); above: an unknown id.
    pub session: u8,
    /// Length in blocks minus one (modulo 1024: 16 B..16 KiB).
    pub blocks: u16,
    /// Bit 0 indirect, bit 1 in place, bit 2 status shares a descriptor
    /// with dst, bits 4..6 extra cuts per stream.
    pub shape: u8,
    /// Data, IV and cut points.
    pub seed: u8,
    /// Where the request's bytes start.
    pub at: Addr,
}

/// One step of the guest program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QOp {
    /// Writes a descriptor: `table` 0 is the ring's, 1..=8 indirect slot `table - 1`.
    Desc {
        /// Which table.
        table: u8,
        /// Entry index.
        idx: u16,
        /// Buffer address.
        addr: Addr,
        /// Buffer length.
        len: u32,
        /// Flags (low byte).
        flags: u8,
        /// Next index.
        next: u16,
    },
    /// Writes a request header.
    Header {
        /// Where.
        at: Addr,
        /// The header.
        hdr: OpDataReq,
    },
    /// Writes bytes.
    Bytes {
        /// Where.
        at: Addr,
        /// What.
        data: Vec<u8>,
    },
    /// Fills bytes.
    Fill {
        /// Where.
        at: Addr,
        /// How many (at most 64 KiB).
        len: u32,
        /// With what.
        byte: u8,
    },
    /// Puts a head on the avail ring and publishes the index.
    Push(u16),
    /// Writes avail.idx directly.
    AvailIdx(u16),
    /// Calls `QueueWorker::process`.
    Process,
    /// Creates a session.
    Create(SessionSpec),
    /// Closes a session id.
    Close(u64),
    /// Forgets a stopped ring (`QueueWorker::reset`).
    Reset,
    /// A well-formed request.
    Request(RequestSpec),
}

/// A decoded `queue` input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueProgram {
    /// Queue size (any u16; only powers of two up to 32768 are valid).
    pub queue_size: u16,
    /// Ring placement.
    pub ring: RingPlace,
    /// Initial avail/used index.
    pub start_idx: u16,
    /// Extra regions after region 0.
    pub regions: Vec<RegionSpec>,
    /// Sessions created first.
    pub sessions: Vec<SessionSpec>,
    /// The program.
    pub ops: Vec<QOp>,
}

impl Addr {
    fn decode(r: &mut Reader<'_>) -> Addr {
        match r.u8() % 6 {
            0 => Addr::Data(r.compact32()),
            1 => Addr::Region {
                idx: r.u8(),
                off: r.compact32(),
            },
            2 => Addr::RegionEnd {
                idx: r.u8(),
                back: r.compact16(),
            },
            3 => Addr::Raw(r.compact()),
            4 => Addr::Cursor,
            _ => Addr::Indirect(r.u8()),
        }
    }

    fn encode(&self, w: &mut Writer) {
        match *self {
            Addr::Data(o) => {
                w.u8(0);
                w.compact(o.into());
            }
            Addr::Region { idx, off } => {
                w.u8(1);
                w.u8(idx);
                w.compact(off.into());
            }
            Addr::RegionEnd { idx, back } => {
                w.u8(2);
                w.u8(idx);
                w.compact(back.into());
            }
            Addr::Raw(a) => {
                w.u8(3);
                w.compact(a);
            }
            Addr::Cursor => w.u8(4),
            Addr::Indirect(n) => {
                w.u8(5);
                w.u8(n);
            }
        }
    }
}

/// A live session as the model knows it: id, direction, cipher key,
/// whether it is a chaining session.
type LiveSession = (u64, Direction, Vec<u8>, bool);

impl SessionSpec {
    fn decode(r: &mut Reader<'_>) -> SessionSpec {
        SessionSpec {
            key_len: r.compact32(),
            direction: r.u8(),
            key_byte: r.u8(),
        }
    }

    fn encode(&self, w: &mut Writer) {
        w.compact(self.key_len.into());
        w.u8(self.direction);
        w.u8(self.key_byte);
    }

    fn key(&self) -> [u8; 64] {
        std::array::from_fn(|i| self.key_byte ^ i as u8)
    }

    /// Key bytes with the top bit set make an ALGORITHM_CHAINING session
    /// (HMAC-SHA1 with bit 6, else HMAC-SHA-256; digest 1 + the low four
    /// bits; the order that goes with the direction), so the worker's
    /// chaining path is reached (its fields come from raw byte writes).
    fn chaining(&self) -> bool {
        self.key_byte & 0x80 != 0
    }

    /// The model's record of this session once created with `id`.
    fn live(&self, id: u64) -> LiveSession {
        let dir = if self.direction == VIRTIO_CRYPTO_OP_ENCRYPT {
            Direction::Encrypt
        } else {
            Direction::Decrypt
        };
        (
            id,
            dir,
            self.key()[..self.key_len as usize].to_vec(),
            self.chaining(),
        )
    }

    fn info(&self) -> SymSessionInfo {
        let mut info = SymSessionInfo {
            cipher_alg: VIRTIO_CRYPTO_CIPHER_AES_CBC,
            key_len: self.key_len,
            op_type: VIRTIO_CRYPTO_SYM_OP_CIPHER as u8,
            direction: self.direction,
            ..Default::default()
        };
        info.cipher_key.copy_from_slice(&self.key());
        if self.chaining() {
            info.op_type = VIRTIO_CRYPTO_SYM_OP_ALGORITHM_CHAINING as u8;
            info.hash_mode = VIRTIO_CRYPTO_SYM_HASH_MODE_AUTH;
            info.hash_alg = if self.key_byte & 0x40 != 0 {
                VIRTIO_CRYPTO_MAC_HMAC_SHA1
            } else {
                VIRTIO_CRYPTO_MAC_HMAC_SHA_256
            };
            info.hash_result_len = 1 + u32::from(self.key_byte & 0x0f);
            info.alg_chain_order = if self.direction == VIRTIO_CRYPTO_OP_ENCRYPT {
                VIRTIO_CRYPTO_SYM_ALG_CHAIN_ORDER_CIPHER_THEN_HASH
            } else {
                VIRTIO_CRYPTO_SYM_ALG_CHAIN_ORDER_HASH_THEN_CIPHER
            };
            info.auth_key_len = 20;
            info.auth_key[..20].copy_from_slice(&self.key()[..20]);
        }
        info
    }
}

fn decode_header(r: &mut Reader<'_>) -> OpDataReq {
    OpDataReq {
        opcode: r.compact32(),
        algo: r.compact32(),
        session_id: r.compact(),
        op_type: r.compact32(),
        iv_len: r.compact32(),
        src_data_len: r.compact32(),
        dst_data_len: r.compact32(),
    }
}

fn encode_header(h: &OpDataReq, w: &mut Writer) {
    for v in [u64::from(h.opcode), u64::from(h.algo), h.session_id] {
        w.compact(v);
    }
    for v in [h.op_type, h.iv_len, h.src_data_len, h.dst_data_len] {
        w.compact(v.into());
    }
}

impl QOp {
    fn decode(r: &mut Reader<'_>) -> QOp {
        match r.u8() % 11 {
            0 => QOp::Desc {
                table: r.u8(),
                idx: r.compact16(),
                addr: Addr::decode(r),
                len: r.compact32(),
                flags: r.u8(),
                next: r.compact16(),
            },
            1 => QOp::Header {
                at: Addr::decode(r),
                hdr: decode_header(r),
            },
            2 => QOp::Bytes {
                at: Addr::decode(r),
                data: r.blob(),
            },
            3 => QOp::Fill {
                at: Addr::decode(r),
                len: r.compact32(),
                byte: r.u8(),
            },
            4 => QOp::Push(r.compact16()),
            5 => QOp::AvailIdx(r.u16()),
            6 => QOp::Process,
            7 => QOp::Create(SessionSpec::decode(r)),
            8 => QOp::Close(r.compact()),
            9 => QOp::Reset,
            _ => QOp::Request(RequestSpec {
                opcode: r.u8(),
                session: r.u8(),
                blocks: r.compact16(),
                shape: r.u8(),
                seed: r.u8(),
                at: Addr::decode(r),
            }),
        }
    }

    fn encode(&self, w: &mut Writer) {
        match self {
            QOp::Desc {
                table,
                idx,
                addr,
                len,
                flags,
                next,
            } => {
                w.u8(0);
                w.u8(*table);
                w.compact((*idx).into());
                addr.encode(w);
                w.compact((*len).into());
                w.u8(*flags);
                w.compact((*next).into());
            }
            QOp::Header { at, hdr } => {
                w.u8(1);
                at.encode(w);
                encode_header(hdr, w);
            }
            QOp::Bytes { at, data } => {
                w.u8(2);
                at.encode(w);
                w.blob(data);
            }
            QOp::Fill { at, len, byte } => {
                w.u8(3);
                at.encode(w);
                w.compact((*len).into());
                w.u8(*byte);
            }
            QOp::Push(h) => {
                w.u8(4);
                w.compact((*h).into());
            }
            QOp::AvailIdx(i) => {
                w.u8(5);
                w.u16(*i);
            }
            QOp::Process => w.u8(6),
            QOp::Create(s) => {
                w.u8(7);
                s.encode(w);
            }
            QOp::Close(id) => {
                w.u8(8);
                w.compact(*id);
            }
            QOp::Reset => w.u8(9),
            QOp::Request(s) => {
                w.u8(10);
                w.u8(s.opcode);
                w.u8(s.session);
                w.compact(s.blocks.into());
                w.u8(s.shape);
                w.u8(s.seed);
                s.at.encode(w);
            }
        }
    }
}

impl QueueProgram {
    /// Decodes any byte string.
    pub fn decode(data: &[u8]) -> QueueProgram {
        let mut r = Reader::new(data);
        let q = r.u8();
        let queue_size = if q == 0xFF { r.u16() } else { 1 << (q % 16) };
        let ring = RING_PLACES[usize::from(r.u8() % 8)];
        let start_idx = r.u16();
        let regions = (0..r.u8() % 4)
            .map(|_| {
                let gap = match r.u8() % 3 {
                    0 => Gap::Adjacent,
                    1 => Gap::Hole(r.compact()),
                    _ => Gap::Top,
                };
                RegionSpec {
                    gap,
                    size: 1 + r.compact() % MAX_REGION,
                }
            })
            .collect();
        let sessions = (0..r.u8() % 5).map(|_| SessionSpec::decode(&mut r)).collect();
        let mut ops = Vec::new();
        while !r.is_empty() && ops.len() < MAX_OPS {
            ops.push(QOp::decode(&mut r));
        }
        QueueProgram {
            queue_size,
            ring,
            start_idx,
            regions,
            sessions,
            ops,
        }
    }

    /// Encodes the program in the form [`QueueProgram::decode`] reads back.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        if self.queue_size.is_power_of_two() {
            w.u8(self.queue_size.trailing_zeros() as u8);
        } else {
            w.u8(0xFF);
            w.u16(self.queue_size);
        }
        w.u8(RING_PLACES.iter().position(|&p| p == self.ring).unwrap_or(0) as u8);
        w.u16(self.start_idx);
        w.u8(self.regions.len() as u8);
        for reg in &self.regions {
            match reg.gap {
                Gap::Adjacent => w.u8(0),
                Gap::Hole(n) => {
                    w.u8(1);
                    w.compact(n);
                }
                Gap::Top => w.u8(2),
            }
            w.compact(reg.size - 1);
        }
        w.u8(self.sessions.len() as u8);
        for s in &self.sessions {
            s.encode(&mut w);
        }
        for op in &self.ops {
            op.encode(&mut w);
        }
        w.buf
    }
}

// ---------------------------------------------------------------------------
// Execution
// ---------------------------------------------------------------------------

/// A request staged by [`QOp::Request`] and what it must give.
#[derive(Debug)]
struct Expect {
    /// Avail position it was pushed at.
    avail_pos: u16,
    head: u16,
    /// Guest bytes it occupies (start, end), all mapped.
    footprint: Vec<(u64, u64)>,
    /// Output pieces in stream order.
    dst: Vec<(u64, u64)>,
    status_at: u64,
    status: u8,
    /// Expected output (for OK).
    out: Vec<u8>,
}

/// Guest memory and its mapped ranges (start, end exclusive, sorted), as
/// the driver ring writes it: a write covers whatever part of it is
/// mapped, a read of unmapped bytes gives zeroes.
struct Guest {
    mem: GuestMemoryMmap<()>,
    ranges: Vec<(u64, u64)>,
}

impl DriverMemory for Guest {
    fn write(&self, a: u64, bytes: &[u8]) {
        for &(s, e) in &self.ranges {
            let lo = a.max(s);
            let hi = a.saturating_add(bytes.len() as u64).min(e);
            if lo < hi {
                let o = (lo - a) as usize;
                let _ = self
                    .mem
                    .write_slice(&bytes[o..o + (hi - lo) as usize], GuestAddress(lo));
            }
        }
    }

    fn read(&self, a: u64, buf: &mut [u8]) {
        let _ = self.mem.read_slice(buf, GuestAddress(a));
    }
}

struct Machine {
    guest: Guest,
    reg: SessionRegistry,
    worker: QueueWorker,
    /// The ring and the driver's avail index.
    driver: DriverRing,
    /// The device's indices (`process` moves them).
    next_avail: u16,
    next_used: u16,
    /// Live sessions.
    sessions: Vec<LiveSession>,
    cursor: u64,
    /// Ring descriptors for staged requests (freed by `process`).
    descs: DescAlloc,
    /// Indirect tables for staged requests: 8 slots of
    /// [`INDIRECT_SLOT`] bytes from [`INDIRECT_AREA`] (freed by `process`).
    tables: TableArea,
    pending: Vec<Expect>,
    /// Pushes since the last process call.
    pushed: u16,
    /// Whether the requests staged since the last process are still as staged.
    clean: bool,
    /// Memory snapshots around a process call (kept for their buffers).
    before: Vec<Vec<u8>>,
    after: Vec<Vec<u8>>,
    reference: Reference,
}

/// A reference AES-CBC for the expected outputs: direction, key (16, 24
/// or 32 bytes), IV, data (whole blocks) encrypted or decrypted in place;
/// false if it refuses the input.
pub type Reference = fn(Direction, &[u8], &[u8; 16], &mut [u8]) -> bool;

/// The fuzz target's [`Reference`]: `algorithms::aes_cbc`, the
/// single-stream path (pinned by NIST SP 800-38A in `algorithms`' tests;
/// the daemon's batches run the multi-buffer lanes).
pub fn single_stream(direction: Direction, key: &[u8], iv: &[u8; 16], data: &mut [u8]) -> bool {
    algorithms::aes_cbc(direction, key, iv, data).is_ok()
}

/// What `run` observed (for tests and statistics).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// `process` calls.
    pub batches: u32,
    /// Chains completed.
    pub completed: u32,
    /// Staged requests whose result was checked.
    pub verified: u32,
    /// Of those, completed with OK.
    pub verified_ok: u32,
    /// Batches whose write-containment check ran.
    pub contained: u32,
}

/// Guest memory and its mapped ranges (start, end exclusive).
type Memory = (GuestMemoryMmap<()>, Vec<(u64, u64)>);

fn build_memory(regions: &[RegionSpec]) -> Option<Memory> {
    let mut ranges = vec![(0u64, REGION0_SIZE)];
    for reg in regions {
        let prev_end = ranges.last()?.1;
        let start = match reg.gap {
            Gap::Adjacent => prev_end,
            Gap::Hole(n) => prev_end.checked_add(n)?,
            Gap::Top => (u64::MAX - reg.size).max(prev_end),
        };
        let end = start.checked_add(reg.size)?;
        if end == u64::MAX && reg.gap != Gap::Top {
            return None;
        }
        ranges.push((start, end));
    }
    let r: Vec<(GuestAddress, usize)> = ranges
        .iter()
        .map(|&(s, e)| (GuestAddress(s), (e - s) as usize))
        .collect();
    let mem = GuestMemoryMmap::<()>::from_ranges(&r).ok()?;
    Some((mem, ranges))
}

fn ring_addrs(size: u16, place: RingPlace, ranges: &[(u64, u64)]) -> SplitRing {
    let n = u64::from(size);
    let base = match (place, ranges.get(1)) {
        (RingPlace::InRegion1, Some(&(s, _))) => s,
        _ => 0,
    };
    let desc = base;
    let avail = base.wrapping_add((16 * n).max(0x1000));
    let used = avail.wrapping_add((6 + 2 * n).next_multiple_of(0x1000));
    let mut a = SplitRing {
        size,
        desc,
        avail,
        used,
    };
    match place {
        RingPlace::AvailOdd => a.avail = a.avail.wrapping_add(1),
        RingPlace::UsedMisaligned => a.used = a.used.wrapping_add(2),
        RingPlace::DescMisaligned => a.desc = a.desc.wrapping_add(8),
        RingPlace::UsedAtRegionEnd => a.used = REGION0_SIZE - 8,
        RingPlace::UsedOverAvail => a.used = a.avail,
        RingPlace::UsedOverDesc => a.used = a.desc,
        _ => {}
    }
    a
}

/// Tiny PRNG for request contents and cut points.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }

    /// Cuts 0..len into pieces with `extra` random cut points (plus `must`).
    fn cuts(&mut self, len: u64, extra: u64, must: Option<u64>) -> Vec<(u64, u64)> {
        let mut p = vec![0, len];
        if len > 1 {
            for _ in 0..extra {
                p.push(1 + self.below(len - 1));
            }
        }
        p.extend(must.filter(|&m| m > 0 && m < len));
        p.sort_unstable();
        p.dedup();
        p.windows(2).map(|w| (w[0], w[1])).collect()
    }
}

impl Machine {
    fn mapped(&self, a: u64, len: u64) -> bool {
        let Some(end) = a.checked_add(len) else {
            return false;
        };
        let mut at = a;
        while at < end {
            match self.guest.ranges.iter().find(|&&(s, e)| s <= at && at < e) {
                Some(&(_, e)) => at = e,
                None => return false,
            }
        }
        true
    }

    /// Writes whatever part of `bytes` at `a` is mapped.
    fn poke(&self, a: u64, bytes: &[u8]) {
        self.guest.write(a, bytes);
    }

    fn peek(&self, a: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.guest.read(a, &mut v);
        v
    }

    fn resolve(&mut self, at: Addr, size: u64) -> u64 {
        let ranges = &self.guest.ranges;
        let region = |idx: u8| ranges[usize::from(idx) % ranges.len()];
        match at {
            Addr::Data(o) => DATA_START + u64::from(o) % (REGION0_SIZE - DATA_START),
            Addr::Region { idx, off } => region(idx).0.wrapping_add(off.into()),
            Addr::RegionEnd { idx, back } => region(idx).1.wrapping_sub(back.into()),
            Addr::Raw(a) => a,
            Addr::Indirect(n) => INDIRECT_AREA + u64::from(n % 8) * INDIRECT_SLOT,
            Addr::Cursor => {
                if self.cursor + size > REGION0_SIZE {
                    self.cursor = DATA_START;
                }
                let a = self.cursor;
                self.cursor = (a + size.min(REGION0_SIZE)).next_multiple_of(16);
                a
            }
        }
    }

    /// Puts `head` on the avail ring and publishes the new index; returns
    /// the avail index it went to.
    fn push(&mut self, head: u16) -> u16 {
        let pos = self.driver.push(&self.guest, head);
        self.driver.publish(&self.guest);
        self.pushed = self.pushed.wrapping_add(1);
        pos
    }

    /// A staged request invalidates nothing; every other guest write may
    /// change what staged requests see.
    fn disturb(&mut self) {
        self.clean = false;
    }

    fn stage(&mut self, s: RequestSpec) {
        let mut rng = Rng::new(u64::from(s.seed) | u64::from(s.shape) << 8 | u64::from(s.blocks) << 16);
        let len = 16 * (1 + u64::from(s.blocks % 1024));
        let session = if s.session < 0xF0 && !self.sessions.is_empty() {
            Some(self.sessions[usize::from(s.session) % self.sessions.len()].clone())
        } else {
            None
        };
        let id = session.as_ref().map_or(1000 + u64::from(s.session), |x| x.0);
        let session_enc = session.as_ref().is_none_or(|x| x.1 == Direction::Encrypt);
        let opcode = match s.opcode % 4 {
            0 if session_enc => ENCRYPT,
            0 => DECRYPT,
            1 => ENCRYPT,
            2 => DECRYPT,
            _ => AKCIPHER_ENCRYPT,
        };
        let in_place = s.shape & 2 != 0;
        let merged = s.shape & 4 != 0;
        let extra = u64::from(s.shape >> 4 & 7);
        let foot = 88 + len + if in_place { 1 } else { 16 + len + 1 };
        let base = self.resolve(s.at, foot);

        let hdr = OpDataReq {
            opcode,
            algo: 0,
            session_id: id,
            op_type: VIRTIO_CRYPTO_SYM_OP_CIPHER,
            iv_len: 16,
            src_data_len: len as u32,
            dst_data_len: len as u32,
        };
        let iv: [u8; 16] = rng.bytes(16).try_into().unwrap_or_default();
        let data = rng.bytes(len as usize);
        let mut readable = hdr.to_bytes().to_vec();
        readable.extend_from_slice(&iv);
        readable.extend_from_slice(&data);
        let src_at = base.wrapping_add(88);
        let dst_at = if in_place {
            src_at
        } else {
            src_at.wrapping_add(len + 16)
        };
        let status_at = dst_at.wrapping_add(len);
        self.poke(base, &readable);

        let mut bufs = Vec::new();
        for (a, b) in rng.cuts(88 + len, extra, None) {
            bufs.push(Buf::readable(base.wrapping_add(a), (b - a) as u32));
        }
        let must = if merged { None } else { Some(len) };
        for (a, b) in rng.cuts(len + 1, extra, must) {
            bufs.push(Buf::writable(dst_at.wrapping_add(a), (b - a) as u32));
        }
        // Ring slots: a direct chain if it fits, else one indirect table.
        let n = bufs.len() as u16;
        let indirect = s.shape & 1 != 0 || n > self.descs.left();
        if self.descs.left() == 0 {
            // Its bytes are written but it is not pushed.
            self.disturb();
            return;
        }
        let table = match indirect.then(|| self.tables.take(bufs.len())) {
            Some(None) => {
                // No indirect slot left: not pushed either.
                self.disturb();
                return;
            }
            t => t.flatten(),
        };
        let Some(head) = self.descs.take(if indirect { 1 } else { n }) else {
            self.disturb();
            return;
        };
        let table_range = table.map(|t| (t, t + DESC_SIZE as u64 * u64::from(n)));
        match table {
            Some(t) => self.driver.write_indirect(&self.guest, head, t, &bufs),
            None => self.driver.write_chain(&self.guest, head, &bufs),
        };
        let avail_pos = self.push(head);

        // What it must give.
        let known = session.filter(|x| x.0 == id);
        let status = match (opcode, &known) {
            (AKCIPHER_ENCRYPT, _) => NOTSUPP,
            (_, None) => INVSESS,
            (ENCRYPT, Some(x)) if x.1 != Direction::Encrypt => ERR,
            (DECRYPT, Some(x)) if x.1 != Direction::Decrypt => ERR,
            // A plain cipher request naming a chaining session.
            (_, Some(x)) if x.3 => ERR,
            _ => OK,
        };
        let mut out = data.clone();
        if let (OK, Some(x)) = (status, &known) {
            if !(self.reference)(x.1, &x.2, &iv, &mut out) {
                self.disturb();
                return;
            }
        }
        let mut footprint = vec![
            (base, base.wrapping_add(88 + len)),
            (dst_at, status_at.wrapping_add(1)),
        ];
        // Its own indirect table written over its bytes: not predicted.
        let self_overlap =
            table_range.is_some_and(|(ts, te)| footprint.iter().any(|&(s, e)| ts < e && s < te));
        footprint.extend(table_range);
        if self_overlap || footprint.iter().any(|&(s, e)| e <= s || !self.mapped(s, e - s)) {
            // Runs off memory or wraps: not predicted here, and what it
            // writes may land on the requests that are.
            self.disturb();
            return;
        }
        let dst = bufs
            .iter()
            .filter(|b| b.write)
            .map(|b| (b.addr, u64::from(b.len)))
            .collect();
        self.pending.push(Expect {
            avail_pos,
            head,
            footprint,
            dst,
            status_at,
            status,
            out,
        });
    }

    /// Byte ranges `process` may write, or `None` when the writable buffers
    /// overlap the ring structures (then writes can create new descriptors
    /// mid-batch and no static set is exact).
    fn allowed_writes(&self) -> Option<Vec<(u64, u64)>> {
        let a = self.driver.ring();
        let n = u64::from(a.size);
        if a.size == 0 || a.size > 32768 || !a.size.is_power_of_two() {
            return Some(Vec::new());
        }
        let desc = (a.desc, a.desc.saturating_add(16 * n));
        let avail = (a.avail, a.avail.saturating_add(6 + 2 * n));
        let used = (a.used, a.used.saturating_add(6 + 8 * n));
        let mut structures = vec![desc, avail];
        let mut writable = vec![used];
        if !self.mapped(a.desc, 16 * n) || !self.mapped(a.avail, 6 + 2 * n) || !self.mapped(a.used, 6 + 8 * n)
        {
            // The ring cannot be mapped: process must write nothing.
            return Some(Vec::new());
        }
        let table = self.peek(a.desc, (16 * n) as usize);
        let mut budget: u64 = 16 * 1024;
        let desc = |b: &[u8]| decode(b.try_into().unwrap_or([0; DESC_SIZE]));
        for d in table.chunks_exact(DESC_SIZE).map(desc) {
            let addr = d.addr().0;
            if d.refers_to_indirect_table() {
                let len = u64::from(d.len()) / 16 * 16;
                let t = (addr, addr.saturating_add(len));
                if len == 0 || structures.contains(&t) || !self.mapped(addr, len) {
                    continue;
                }
                // Keep the harness fast on tables full of huge indirect
                // descriptors: past a budget, skip the check.
                budget = budget.checked_sub(len / 16)?;
                structures.push(t);
                for e in self.peek(addr, len as usize).chunks_exact(DESC_SIZE).map(desc) {
                    if e.is_write_only() && e.len() > 0 {
                        writable.push((e.addr().0, e.addr().0.saturating_add(e.len().into())));
                    }
                }
            } else if d.is_write_only() && d.len() > 0 {
                writable.push((addr, addr.saturating_add(d.len().into())));
            }
        }
        let overlap = |x: (u64, u64), y: (u64, u64)| x.0 < y.1 && y.0 < x.1;
        if writable
            .iter()
            .any(|&w| structures.iter().any(|&s| overlap(w, s)))
        {
            return None;
        }
        Some(writable)
    }

    /// Copies every region into `into` (buffers reused between calls).
    fn snapshot(&self, into: &mut Vec<Vec<u8>>) {
        into.resize_with(self.guest.ranges.len(), Vec::new);
        for (&(s, e), buf) in self.guest.ranges.iter().zip(into.iter_mut()) {
            buf.resize((e - s) as usize, 0);
            let _ = self.guest.mem.read_slice(buf, GuestAddress(s));
        }
    }

    fn process(&mut self, out: &mut Outcome) {
        let allowed = self.allowed_writes();
        let mut before = std::mem::take(&mut self.before);
        let mut after = std::mem::take(&mut self.after);
        self.snapshot(&mut before);
        let (na, nu) = (self.next_avail, self.next_used);
        let pushed = self.pushed;
        let a = self.driver.ring();
        let ring = RingAddrs {
            size: a.size,
            desc: a.desc,
            avail: a.avail,
            used: a.used,
        };
        let (count0, _) = alloc::counts();
        // One batch per `process` call, called again while it completes
        // any (as the daemon's worker does). The device's own output may
        // move the avail index (a dst over the avail ring), so the calls
        // are capped at two rings' worth of the largest queue.
        let r = alloc::counted(|| {
            let mut all = BatchResult::default();
            loop {
                let r = self
                    .worker
                    .process(&self.guest.mem, ring, &mut self.next_avail, &mut self.next_used);
                all.completed += r.completed;
                all.notify |= r.notify;
                if r.completed == 0 || all.completed >= 65536 {
                    return all;
                }
            }
        });
        let (count1, bytes) = alloc::counts();
        assert_eq!(
            count1 - count0,
            0,
            "process allocated {} times ({bytes} bytes in all so far)",
            count1 - count0
        );
        assert_eq!(
            self.next_avail.wrapping_sub(na),
            r.completed as u16,
            "next_avail moved by the completed count"
        );
        assert_eq!(
            self.next_used.wrapping_sub(nu),
            r.completed as u16,
            "next_used moved by the completed count"
        );
        assert!(r.completed <= 65536 * 2, "completed {}", r.completed);
        out.batches += 1;
        out.completed += r.completed;

        // Nothing written outside the used ring and declared writable bytes.
        self.snapshot(&mut after);
        if let Some(allowed) = &allowed {
            out.contained += 1;
            // Compare in chunks (memcmp), bytes only where a chunk differs.
            const CHUNK: usize = 64;
            for ((&(s, _), b), a) in self.guest.ranges.iter().zip(&before).zip(&after) {
                let chunks = b.chunks(CHUNK).zip(a.chunks(CHUNK)).enumerate();
                for (c, (bc, ac)) in chunks.filter(|(_, (bc, ac))| bc != ac) {
                    for (i, (x, y)) in bc.iter().zip(ac.iter()).enumerate().filter(|(_, (x, y))| x != y) {
                        let addr = s + (c * CHUNK + i) as u64;
                        assert!(
                            allowed.iter().any(|&(lo, hi)| lo <= addr && addr < hi),
                            "process wrote {addr:#x} ({x:#04x} -> {y:#04x}), outside every writable \
                             buffer and the used ring"
                        );
                    }
                }
            }
        }

        // Staged requests: status, used length, output.
        let pending = std::mem::take(&mut self.pending);
        let a = self.driver.ring();
        let n = u64::from(a.size);
        let structures = [
            (a.desc, a.desc.saturating_add(16 * n)),
            (a.avail, a.avail.saturating_add(6 + 2 * n)),
            (a.used, a.used.saturating_add(6 + 8 * n)),
        ];
        let overlap = |x: (u64, u64), y: (u64, u64)| x.0 < y.1 && y.0 < x.1;
        let disjoint = pending.iter().enumerate().all(|(i, p)| {
            p.footprint.iter().all(|&f| {
                structures.iter().all(|&s| !overlap(f, s))
                    && pending
                        .iter()
                        .enumerate()
                        .all(|(j, q)| i == j || q.footprint.iter().all(|&g| !overlap(f, g)))
            })
        });
        if self.clean && disjoint && u32::from(pushed) == r.completed && pushed as usize == pending.len() {
            for p in &pending {
                let at = nu.wrapping_add(p.avail_pos.wrapping_sub(na));
                let UsedElem { id, len } = self.driver.used_elem(&self.guest, at);
                let total: u64 = p.dst.iter().map(|d| d.1).sum::<u64>() - 1;
                let what = format!(
                    "staged request at avail {} (head {}, {total} bytes)",
                    p.avail_pos, p.head
                );
                assert_eq!(id, u32::from(p.head), "{what}: used id");
                assert_eq!(self.peek(p.status_at, 1)[0], p.status, "{what}: status");
                let want_len = if p.status == OK { total as u32 + 1 } else { 1 };
                assert_eq!(len, want_len, "{what}: used length");
                if p.status == OK {
                    let mut got = Vec::with_capacity(p.out.len());
                    for &(a, l) in &p.dst {
                        got.extend(self.peek(a, l as usize));
                    }
                    got.truncate(p.out.len());
                    assert!(got == p.out, "{what}: output differs from the reference cipher");
                    out.verified_ok += 1;
                }
                out.verified += 1;
            }
        }
        self.before = before;
        self.after = after;
        self.clean = true;
        self.pushed = 0;
        self.descs.reset();
        self.tables.reset();
    }
}

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
                let a = m.resolve(*at, 72);
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
