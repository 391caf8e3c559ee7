// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A guest driver: a split ring built by hand in real guest memory
//! (`GuestMemoryMmap`), driven through `QueueWorker::process`.
//!
//! Everything here plays the guest driver: it writes descriptors, avail
//! entries and request bytes, then reads the used ring, status bytes and
//! output back. The layout follows the conventions of the hostile-guest
//! cases (docs/RELIABILITY.md): a queue of 256 entries, the baseline
//! request D0..D4 at 0x10000..0x14000, sessions E and D with the NIST key.
//! Expected values come from the tests (NIST vectors, the OpenSSL oracle,
//! the status policy of docs/PROTOCOL.md §6), never from the code under
//! test.

use std::time::{Duration, Instant};

use super::codes::{ENCRYPT, OK};
use super::nist::{NIST_IV, NIST_KEY, NIST_PT};
use vhost_user_crypto::crypto::RequestLimits;
use vhost_user_crypto::sessions::{session_set, SessionRegistry, SessionTable};
use vhost_user_crypto::virtq::descriptor::{
    Desc, DESC_SIZE, VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE,
};
use vhost_user_crypto::virtq::ring::RingAddrs;
use vhost_user_crypto::wire::session::SymSessionInfo;
use vhost_user_crypto::wire::virtio_crypto::OpDataReq;
use vhost_user_crypto::worker::{BatchResult, QueueWorker};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

pub const MIB: u64 = 1 << 20;

/// Queue size of the data ring (docs/RELIABILITY.md, hostile-guest conventions).
pub const QSIZE: u16 = 256;
/// Descriptor table, avail ring and used ring of the default ring.
pub const RING_DESC: u64 = 0x1000;
pub const RING_AVAIL: u64 = 0x3000;
pub const RING_USED: u64 = 0x4000;
/// Where indirect tables are written.
pub const INDIRECT_BASE: u64 = 0x20_0000;

/// Baseline buffer addresses (docs/RELIABILITY.md): D0 header, D1 IV, D2 src, D3 dst, D4 status.
pub const HDR: u64 = 0x10000;
pub const IV_ADDR: u64 = 0x11000;
pub const SRC: u64 = 0x12000;
pub const DST: u64 = 0x13000;
pub const STATUS: u64 = 0x14000;
/// Bytes around D3 / D4 filled with the canary before each request.
pub const DST_AREA: usize = 0x1000;
pub const STATUS_AREA: usize = 0x100;

/// Filler for memory the device must not write.
pub const CANARY: u8 = 0xA5;

/// Session ids created by [`Vm::new`]: E (encrypt) and D (decrypt), NIST key.
pub const E: u64 = 1;
pub const D: u64 = 2;

/// A buffer of a chain: guest address, length, device-writable or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buf {
    pub addr: u64,
    pub len: u32,
    pub write: bool,
}

/// Device-readable buffer.
pub fn r(addr: u64, len: u32) -> Buf {
    Buf {
        addr,
        len,
        write: false,
    }
}

/// Device-writable buffer.
pub fn w(addr: u64, len: u32) -> Buf {
    Buf {
        addr,
        len,
        write: true,
    }
}

/// A plain-cipher request header (iv_len 16, op_type CIPHER, algo 0).
pub fn hdr(opcode: u32, session_id: u64, src: u32, dst: u32) -> OpDataReq {
    OpDataReq {
        opcode,
        algo: 0,
        session_id,
        op_type: 1,
        iv_len: 16,
        src_data_len: src,
        dst_data_len: dst,
    }
}

/// One used-ring element.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Used {
    pub id: u32,
    pub len: u32,
}

/// Session parameters for `SessionRegistry::create`.
pub fn session_info(key: &[u8], direction: u8) -> SymSessionInfo {
    SymSessionInfo::aes_cbc(key, direction)
}

/// A guest: memory, one data ring, the session registry and a queue worker.
pub struct Vm {
    pub mem: GuestMemoryMmap<()>,
    pub reg: SessionRegistry,
    pub worker: QueueWorker,
    /// Tables of further queues (for "other queues unaffected").
    pub spare_tables: Vec<SessionTable>,
    pub ring: RingAddrs,
    /// Device-side indices, owned by the "frontend" (passed to process).
    pub next_avail: u16,
    pub next_used: u16,
    /// Driver-side avail index.
    pub avail_idx: u16,
    next_desc: u16,
    next_indirect: u64,
}

impl Default for Vm {
    fn default() -> Self {
        Self::new()
    }
}

impl Vm {
    /// One region 0..256 MiB, sessions E = 1 and D = 2 with the NIST key.
    pub fn new() -> Vm {
        Vm::with_ranges(&[(0, 256 << 20)])
    }

    /// Guest memory made of `ranges` (start, size); the ring lives at the
    /// default addresses, which must be mapped.
    pub fn with_ranges(ranges: &[(u64, usize)]) -> Vm {
        Vm::build(ranges, 2)
    }

    /// `queues` session tables; the first one feeds `worker`.
    pub fn build(ranges: &[(u64, usize)], queues: usize) -> Vm {
        let r: Vec<(GuestAddress, usize)> = ranges.iter().map(|&(a, l)| (GuestAddress(a), l)).collect();
        let mem = GuestMemoryMmap::<()>::from_ranges(&r).expect("guest memory");
        let (mut reg, mut tables) = session_set(1024, queues);
        assert_eq!(reg.create(&session_info(&NIST_KEY, 1)), E as i64);
        assert_eq!(reg.create(&session_info(&NIST_KEY, 2)), D as i64);
        let first = tables.remove(0);
        let worker = QueueWorker::new(
            first,
            RequestLimits {
                max_request_bytes: 1 << 20,
            },
        );
        let ring = RingAddrs {
            size: QSIZE,
            desc: RING_DESC,
            avail: RING_AVAIL,
            used: RING_USED,
        };
        let vm = Vm {
            mem,
            reg,
            worker,
            spare_tables: tables,
            ring,
            next_avail: 0,
            next_used: 0,
            avail_idx: 0,
            next_desc: 0,
            next_indirect: INDIRECT_BASE,
        };
        vm.fill(RING_AVAIL, 6 + 2 * usize::from(QSIZE), 0);
        vm.fill(RING_USED, 6 + 8 * usize::from(QSIZE), 0);
        vm
    }

    // ---- raw guest memory ----

    pub fn write(&self, addr: u64, bytes: &[u8]) {
        self.mem
            .write_slice(bytes, GuestAddress(addr))
            .expect("test write in RAM");
    }

    pub fn read(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.mem
            .read_slice(&mut v, GuestAddress(addr))
            .expect("test read in RAM");
        v
    }

    pub fn fill(&self, addr: u64, len: usize, byte: u8) {
        self.write(addr, &vec![byte; len]);
    }

    pub fn byte(&self, addr: u64) -> u8 {
        self.read(addr, 1)[0]
    }

    pub fn u16_at(&self, addr: u64) -> u16 {
        let b = self.read(addr, 2);
        u16::from_le_bytes([b[0], b[1]])
    }

    pub fn u32_at(&self, addr: u64) -> u32 {
        let b = self.read(addr, 4);
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }

    /// Asserts that `len` bytes at `addr` still hold the canary.
    #[track_caller]
    pub fn assert_canary(&self, addr: u64, len: usize) {
        let v = self.read(addr, len);
        if let Some(i) = v.iter().position(|&b| b != CANARY) {
            panic!(
                "byte {:#x} (offset {i} of {addr:#x}+{len}) was written: {:#04x}",
                addr + i as u64,
                v[i]
            );
        }
    }

    // ---- ring building ----

    /// Writes descriptor `idx` of a table at `table`.
    pub fn put_desc(&self, table: u64, idx: u16, d: Desc) {
        self.write(table + u64::from(idx) * DESC_SIZE as u64, &d.to_bytes());
    }

    /// Writes descriptor `idx` of the ring's table.
    pub fn set_desc(&self, idx: u16, d: Desc) {
        self.put_desc(self.ring.desc, idx, d);
    }

    fn alloc_desc(&mut self) -> u16 {
        let i = self.next_desc;
        assert!(i < self.ring.size, "test uses more descriptors than the ring has");
        self.next_desc += 1;
        i
    }

    /// Writes `bufs` as a direct chain in free slots; returns the head.
    pub fn chain(&mut self, bufs: &[Buf]) -> u16 {
        assert!(!bufs.is_empty());
        let idx: Vec<u16> = bufs.iter().map(|_| self.alloc_desc()).collect();
        for (k, b) in bufs.iter().enumerate() {
            let last = k + 1 == bufs.len();
            let mut flags = if b.write { VRING_DESC_F_WRITE } else { 0 };
            if !last {
                flags |= VRING_DESC_F_NEXT;
            }
            let next = if last { 0 } else { idx[k + 1] };
            self.set_desc(
                idx[k],
                Desc {
                    addr: b.addr,
                    len: b.len,
                    flags,
                    next,
                },
            );
        }
        idx[0]
    }

    /// Writes `bufs` as one indirect table (entries linked i → i+1, as
    /// Linux does) and a ring descriptor pointing at it; returns the head.
    pub fn indirect(&mut self, bufs: &[Buf]) -> u16 {
        let table = self.next_indirect;
        self.next_indirect += (bufs.len() as u64 * DESC_SIZE as u64).next_multiple_of(0x100);
        for (k, b) in bufs.iter().enumerate() {
            let last = k + 1 == bufs.len();
            let mut flags = if b.write { VRING_DESC_F_WRITE } else { 0 };
            if !last {
                flags |= VRING_DESC_F_NEXT;
            }
            let next = if last { 0 } else { k as u16 + 1 };
            self.put_desc(
                table,
                k as u16,
                Desc {
                    addr: b.addr,
                    len: b.len,
                    flags,
                    next,
                },
            );
        }
        let head = self.alloc_desc();
        let len = (bufs.len() * DESC_SIZE) as u32;
        self.set_desc(
            head,
            Desc {
                addr: table,
                len,
                flags: VRING_DESC_F_INDIRECT,
                next: 0,
            },
        );
        head
    }

    /// Puts `head` on the avail ring and publishes the new avail index.
    pub fn push(&mut self, head: u16) {
        let slot = u64::from(self.avail_idx % self.ring.size);
        self.write(self.ring.avail + 4 + 2 * slot, &head.to_le_bytes());
        self.avail_idx = self.avail_idx.wrapping_add(1);
        self.set_avail_idx(self.avail_idx);
    }

    /// Writes avail.idx (without touching the driver-side counter).
    pub fn set_avail_idx(&self, idx: u16) {
        self.write(self.ring.avail + 2, &idx.to_le_bytes());
    }

    /// Starts the driver and device indices at `idx` (wrap tests).
    pub fn start_at(&mut self, idx: u16) {
        self.avail_idx = idx;
        self.next_avail = idx;
        self.next_used = idx;
        self.set_avail_idx(idx);
        self.write(self.ring.used + 2, &idx.to_le_bytes());
    }

    /// One call to `QueueWorker::process`; descriptor slots are free again afterwards.
    pub fn run(&mut self) -> BatchResult {
        let r = self
            .worker
            .process(&self.mem, self.ring, &mut self.next_avail, &mut self.next_used);
        self.next_desc = 0;
        self.next_indirect = INDIRECT_BASE;
        r
    }

    /// Polls (`set_polling(true)`): calls `process` until every chain
    /// pushed is done, and returns how many each call completed, asserting
    /// each call's batch was published before it returned.
    #[track_caller]
    pub fn polling_batch_sizes(&mut self) -> Vec<u32> {
        self.worker.set_polling(true);
        let mut seen = Vec::new();
        while self.next_avail != self.avail_idx {
            let r = self.run();
            assert!(r.completed > 0, "no progress after {seen:?}");
            assert_eq!(self.used_idx(), self.next_used, "used.idx published");
            seen.push(r.completed);
        }
        seen
    }

    /// Like [`Vm::run`] and asserts it returns within `limit`.
    #[track_caller]
    pub fn run_within(&mut self, limit: Duration) -> BatchResult {
        let t = Instant::now();
        let r = self.run();
        assert!(t.elapsed() < limit, "process took {:?}", t.elapsed());
        r
    }

    pub fn used_idx(&self) -> u16 {
        self.u16_at(self.ring.used + 2)
    }

    /// Used element written at used index `i`.
    pub fn used(&self, i: u16) -> Used {
        let p = self.ring.used + 4 + 8 * u64::from(i % self.ring.size);
        Used {
            id: self.u32_at(p),
            len: self.u32_at(p + 4),
        }
    }

    /// `avail_event`: the u16 after the used ring's `size` elements.
    pub fn avail_event(&self) -> u16 {
        self.u16_at(self.ring.used + 4 + 8 * u64::from(self.ring.size))
    }

    /// Processes the chains pushed so far, one batch per call until a call
    /// completes nothing, and returns their used elements, asserting the
    /// calls completed exactly them.
    #[track_caller]
    pub fn run_batch(&mut self) -> Vec<Used> {
        let first = self.next_used;
        let pending = self.avail_idx.wrapping_sub(self.next_avail);
        let mut completed = 0;
        let t = Instant::now();
        loop {
            let r = self.run();
            if r.completed == 0 {
                break;
            }
            completed += r.completed;
        }
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "process took {:?}",
            t.elapsed()
        );
        assert_eq!(completed, u32::from(pending), "chains completed");
        assert_eq!(self.next_avail, self.avail_idx, "next_avail after the batch");
        assert_eq!(self.used_idx(), self.avail_idx, "used.idx published");
        (0..pending).map(|k| self.used(first.wrapping_add(k))).collect()
    }

    /// Submits one direct chain and returns its used element.
    #[track_caller]
    pub fn submit(&mut self, bufs: &[Buf]) -> Used {
        let head = self.chain(bufs);
        self.push(head);
        let u = self.run_batch();
        assert_eq!(u[0].id, u32::from(head), "used id");
        u[0]
    }

    /// Submits one chain as an indirect table and returns its used element.
    #[track_caller]
    pub fn submit_indirect(&mut self, bufs: &[Buf]) -> Used {
        let head = self.indirect(bufs);
        self.push(head);
        let u = self.run_batch();
        assert_eq!(u[0].id, u32::from(head), "used id");
        u[0]
    }

    // ---- requests ----

    /// Writes a request in the baseline layout at `base`: header at +0
    /// (D0), the NIST IV at +0x1000 (D1), `src` at +0x2000 (D2); fills D3's
    /// area (+0x3000, 4 KiB) and D4's area (+0x4000) with the canary.
    /// Returns D0..D4 with D2 and D3 as long as `src`.
    pub fn stage_at(&self, base: u64, h: &OpDataReq, src: &[u8]) -> Vec<Buf> {
        let a = Addrs::at(base);
        self.write(a.hdr, &h.to_bytes());
        self.write(a.iv, &NIST_IV);
        self.write(a.src, src);
        self.fill(a.dst, DST_AREA, CANARY);
        self.fill(a.status, STATUS_AREA, CANARY);
        let n = src.len() as u32;
        vec![
            r(a.hdr, 72),
            r(a.iv, 16),
            r(a.src, n),
            w(a.dst, n),
            w(a.status, 1),
        ]
    }

    /// [`Vm::stage_at`] at the baseline addresses (D0 = 0x10000 …).
    pub fn stage(&self, h: &OpDataReq, src: &[u8]) -> Vec<Buf> {
        self.stage_at(HDR, h, src)
    }

    /// The baseline request of docs/RELIABILITY.md (encrypt with E, NIST
    /// plaintext).
    pub fn baseline(&self) -> Vec<Buf> {
        self.stage(&hdr(ENCRYPT, E, 64, 64), &NIST_PT)
    }

    /// Asserts a baseline-layout request at `base` failed with `status`:
    /// used 1, status at D4, D3 and the rest of D4's area untouched.
    #[track_caller]
    pub fn assert_failed_at(&self, base: u64, u: Used, status: u8) {
        let a = Addrs::at(base);
        assert_eq!(self.byte(a.status), status, "status byte");
        assert_eq!(u.len, 1, "used length");
        self.assert_canary(a.dst, DST_AREA);
        self.assert_canary(a.status + 1, STATUS_AREA - 1);
    }

    /// [`Vm::assert_failed_at`] at the default addresses.
    #[track_caller]
    pub fn assert_failed(&self, u: Used, status: u8) {
        self.assert_failed_at(HDR, u, status);
    }

    /// Asserts a baseline-layout request at `base` succeeded: status OK at
    /// D4, used `out.len() + 1`, D3 begins with `out` and nothing after it
    /// changed.
    #[track_caller]
    pub fn assert_done_at(&self, base: u64, u: Used, out: &[u8]) {
        let a = Addrs::at(base);
        assert_eq!(self.byte(a.status), OK, "status byte");
        assert_eq!(u.len, out.len() as u32 + 1, "used length");
        assert_eq!(self.read(a.dst, out.len()), out, "dst bytes");
        self.assert_canary(a.dst + out.len() as u64, DST_AREA - out.len());
        self.assert_canary(a.status + 1, STATUS_AREA - 1);
    }

    /// [`Vm::assert_done_at`] at the default addresses.
    #[track_caller]
    pub fn assert_done(&self, u: Used, out: &[u8]) {
        self.assert_done_at(HDR, u, out);
    }

    /// Asserts a chain at `base` was only consumed: used 0 and nothing
    /// written in D3's and D4's areas.
    #[track_caller]
    pub fn assert_consumed_at(&self, base: u64, u: Used) {
        let a = Addrs::at(base);
        assert_eq!(u.len, 0, "used length of a consumed chain");
        self.assert_canary(a.dst, DST_AREA);
        self.assert_canary(a.status, STATUS_AREA);
    }

    /// [`Vm::assert_consumed_at`] at the default addresses.
    #[track_caller]
    pub fn assert_consumed(&self, u: Used) {
        self.assert_consumed_at(HDR, u);
    }

    /// Moves the data ring to `ring` (the frontend set up a new ring):
    /// indices start at 0, avail and used rings zeroed.
    pub fn move_ring(&mut self, ring: RingAddrs) {
        self.ring = ring;
        self.next_avail = 0;
        self.next_used = 0;
        self.avail_idx = 0;
        self.next_desc = 0;
        self.fill(ring.avail, 6 + 2 * usize::from(ring.size), 0);
        self.fill(ring.used, 6 + 8 * usize::from(ring.size), 0);
    }
}

/// Addresses of the baseline layout relative to a base (D0 at base).
#[derive(Debug, Clone, Copy)]
pub struct Addrs {
    pub hdr: u64,
    pub iv: u64,
    pub src: u64,
    pub dst: u64,
    pub status: u64,
}

impl Addrs {
    pub fn at(base: u64) -> Addrs {
        Addrs {
            hdr: base,
            iv: base + 0x1000,
            src: base + 0x2000,
            dst: base + 0x3000,
            status: base + 0x4000,
        }
    }
}
