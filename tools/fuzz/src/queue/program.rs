// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A `queue` program ([`QueueProgram`]): guest memory, the ring, the
//! sessions and the operations, decoded from any byte string and encoded
//! back ([`QueueProgram::encode`], for the seed corpus).

use algorithms::Direction;
use vhost_user_crypto::wire::session::SymSessionInfo;
use vhost_user_crypto::wire::virtio_crypto::{
    OpDataReq, VIRTIO_CRYPTO_CIPHER_AES_CBC, VIRTIO_CRYPTO_MAC_HMAC_SHA1, VIRTIO_CRYPTO_MAC_HMAC_SHA_256,
    VIRTIO_CRYPTO_OP_ENCRYPT, VIRTIO_CRYPTO_SYM_ALG_CHAIN_ORDER_CIPHER_THEN_HASH,
    VIRTIO_CRYPTO_SYM_ALG_CHAIN_ORDER_HASH_THEN_CIPHER, VIRTIO_CRYPTO_SYM_HASH_MODE_AUTH,
    VIRTIO_CRYPTO_SYM_OP_ALGORITHM_CHAINING, VIRTIO_CRYPTO_SYM_OP_CIPHER,
};

use super::super::reader::{Reader, Writer};
use super::{MAX_OPS, MAX_REGION};

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
pub(super) type LiveSession = (u64, Direction, Vec<u8>, bool);

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
    pub(super) fn live(&self, id: u64) -> LiveSession {
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

    pub(super) fn info(&self) -> SymSessionInfo {
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

pub(super) fn decode_header(r: &mut Reader<'_>) -> OpDataReq {
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

pub(super) fn encode_header(h: &OpDataReq, w: &mut Writer) {
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
