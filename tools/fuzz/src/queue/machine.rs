// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The harness's guest: memory regions, the ring driven through the
//! shared driver ring, session bookkeeping, and requests staged with what
//! they must give.

use algorithms::Direction;
use vhost_crypto_replay::driver_ring::{
    Buf, DescAlloc, DriverMemory, DriverRing, SplitRing, TableArea, DESC_SIZE,
};
use vhost_crypto_replay::rng::{below, Rng as _, SeedableRng, SplitMix64};
use vhost_user_crypto::sessions::SessionRegistry;
use vhost_user_crypto::wire::virtio_crypto::{
    OpDataReq, AES_CBC_IV_LEN, OP_DATA_REQ_SIZE, VIRTIO_CRYPTO_SYM_OP_CIPHER,
};

/// Bytes of a request's readable stream before its src: header and IV.
const HEAD_LEN: u64 = OP_DATA_REQ_SIZE as u64 + AES_CBC_IV_LEN as u64;
use vhost_user_crypto::worker::QueueWorker;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::program::{Addr, Gap, LiveSession, RegionSpec, RequestSpec, RingPlace};
use super::{
    AKCIPHER_ENCRYPT, DATA_START, DECRYPT, ENCRYPT, ERR, INDIRECT_AREA, INDIRECT_SLOT, INVSESS, NOTSUPP, OK,
    REGION0_SIZE,
};

/// A request staged by [`QOp::Request`] and what it must give.
#[derive(Debug)]
pub(super) struct Expect {
    /// Avail position it was pushed at.
    pub(super) avail_pos: u16,
    pub(super) head: u16,
    /// Guest bytes it occupies (start, end), all mapped.
    pub(super) footprint: Vec<(u64, u64)>,
    /// Output pieces in stream order.
    pub(super) dst: Vec<(u64, u64)>,
    pub(super) status_at: u64,
    pub(super) status: u8,
    /// Expected output (for OK).
    pub(super) out: Vec<u8>,
}

/// Guest memory and its mapped ranges (start, end exclusive, sorted), as
/// the driver ring writes it: a write covers whatever part of it is
/// mapped, a read of unmapped bytes gives zeroes.
pub(super) struct Guest {
    pub(super) mem: GuestMemoryMmap<()>,
    pub(super) ranges: Vec<(u64, u64)>,
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

pub(super) struct Machine {
    pub(super) guest: Guest,
    pub(super) reg: SessionRegistry,
    pub(super) worker: QueueWorker,
    /// The ring and the driver's avail index.
    pub(super) driver: DriverRing,
    /// The device's indices (`process` moves them).
    pub(super) next_avail: u16,
    pub(super) next_used: u16,
    /// Live sessions.
    pub(super) sessions: Vec<LiveSession>,
    pub(super) cursor: u64,
    /// Ring descriptors for staged requests (freed by `process`).
    pub(super) descs: DescAlloc,
    /// Indirect tables for staged requests: 8 slots of
    /// [`INDIRECT_SLOT`] bytes from [`INDIRECT_AREA`] (freed by `process`).
    pub(super) tables: TableArea,
    pub(super) pending: Vec<Expect>,
    /// Pushes since the last process call.
    pub(super) pushed: u16,
    /// Whether the requests staged since the last process are still as staged.
    pub(super) clean: bool,
    /// Memory snapshots around a process call (kept for their buffers).
    pub(super) before: Vec<Vec<u8>>,
    pub(super) after: Vec<Vec<u8>>,
    pub(super) reference: Reference,
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
pub(super) type Memory = (GuestMemoryMmap<()>, Vec<(u64, u64)>);

pub(super) fn build_memory(regions: &[RegionSpec]) -> Option<Memory> {
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

pub(super) fn ring_addrs(size: u16, place: RingPlace, ranges: &[(u64, u64)]) -> SplitRing {
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

/// Request contents and cut points: `rand_xoshiro`'s SplitMix64 started
/// at state `seed` (`vhost_crypto_replay::rng`, the replay tool's and the
/// tests' generator).
pub(super) struct Rng(SplitMix64);

impl Rng {
    pub(super) fn new(seed: u64) -> Rng {
        Rng(SplitMix64::seed_from_u64(seed))
    }

    pub(super) fn below(&mut self, n: u64) -> u64 {
        below(&mut self.0, n.max(1))
    }

    /// `n` bytes, each the low byte of one output.
    pub(super) fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.0.next_u64() as u8).collect()
    }

    /// Cuts 0..len into pieces with `extra` random cut points (plus `must`).
    pub(super) fn cuts(&mut self, len: u64, extra: u64, must: Option<u64>) -> Vec<(u64, u64)> {
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
    pub(super) fn mapped(&self, a: u64, len: u64) -> bool {
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
    pub(super) fn poke(&self, a: u64, bytes: &[u8]) {
        self.guest.write(a, bytes);
    }

    pub(super) fn peek(&self, a: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.guest.read(a, &mut v);
        v
    }

    pub(super) fn resolve(&mut self, at: Addr, size: u64) -> u64 {
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
    pub(super) fn push(&mut self, head: u16) -> u16 {
        let pos = self.driver.push(&self.guest, head);
        self.driver.publish(&self.guest);
        self.pushed = self.pushed.wrapping_add(1);
        pos
    }

    /// A staged request invalidates nothing; every other guest write may
    /// change what staged requests see.
    pub(super) fn disturb(&mut self) {
        self.clean = false;
    }

    pub(super) fn stage(&mut self, s: RequestSpec) {
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
        let foot = HEAD_LEN + len + if in_place { 1 } else { 16 + len + 1 };
        let base = self.resolve(s.at, foot);

        let hdr = OpDataReq {
            opcode,
            algo: 0,
            session_id: id,
            op_type: VIRTIO_CRYPTO_SYM_OP_CIPHER,
            iv_len: AES_CBC_IV_LEN,
            src_data_len: len as u32,
            dst_data_len: len as u32,
        };
        let iv: [u8; 16] = rng.bytes(16).try_into().unwrap_or_default();
        let data = rng.bytes(len as usize);
        let mut readable = hdr.to_bytes().to_vec();
        readable.extend_from_slice(&iv);
        readable.extend_from_slice(&data);
        let src_at = base.wrapping_add(HEAD_LEN);
        let dst_at = if in_place {
            src_at
        } else {
            src_at.wrapping_add(len + 16)
        };
        let status_at = dst_at.wrapping_add(len);
        self.poke(base, &readable);

        let mut bufs = Vec::new();
        for (a, b) in rng.cuts(HEAD_LEN + len, extra, None) {
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
            (base, base.wrapping_add(HEAD_LEN + len)),
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
}
