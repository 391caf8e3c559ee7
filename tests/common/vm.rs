// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A guest driver: a split ring in real guest memory (`GuestMemoryMmap`),
//! driven through `QueueWorker::process`.
//!
//! Everything here plays the guest driver: it writes descriptors, avail
//! entries and request bytes, then reads the used ring, status bytes and
//! output back. Descriptors and ring accesses go through the replay
//! tool's driver ring (`vhost_crypto_replay::driver_ring`, written from
//! VIRTIO 1.2 §2.7 on rust-vmm `virtio-queue`'s descriptor type), never
//! through the daemon's own descriptor code. The layout follows the
//! conventions of the hostile-guest cases (docs/RELIABILITY.md): a queue
//! of 256 entries, the baseline request D0..D4 at 0x10000..0x14000,
//! sessions E and D with the NIST key.
//! Expected values come from the tests (NIST vectors, the OpenSSL oracle,
//! the status policy of docs/PROTOCOL.md §6), never from the code under
//! test.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::codes::{ENCRYPT, OK};
use super::nist::{NIST_IV, NIST_KEY, NIST_PT};
use vhost_crypto_replay::driver_ring::{
    self, DescAlloc, Descriptor, DriverMemory, DriverRing, SplitRing, TableArea, UsedElem,
};
use vhost_user_crypto::crypto::RequestLimits;
use vhost_user_crypto::sessions::{live_tables, session_set_in, LiveTables, SessionRegistry, SessionTable};
use vhost_user_crypto::virtq::ring::RingAddrs;
use vhost_user_crypto::wire::session::SymSessionInfo;
use vhost_user_crypto::wire::virtio_crypto::OpDataReq;
use vhost_user_crypto::worker::{BatchResult, QueueWorker};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

pub use vhost_crypto_replay::driver_ring::Buf;

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

/// Device-readable buffer.
pub fn r(addr: u64, len: u32) -> Buf {
    Buf::readable(addr, len)
}

/// Device-writable buffer.
pub fn w(addr: u64, len: u32) -> Buf {
    Buf::writable(addr, len)
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

/// One used-ring element (head id, used length), as the driver ring reads it.
pub type Used = UsedElem;

/// Session parameters for `SessionRegistry::create`.
pub fn session_info(key: &[u8], direction: u8) -> SymSessionInfo {
    SymSessionInfo::aes_cbc(key, direction)
}

/// A test's guest memory as the driver ring's [`DriverMemory`]: every
/// access must lie in RAM (one outside it is a bug in the test: panics).
#[derive(Clone, Copy)]
pub struct Ram<'a>(pub &'a GuestMemoryMmap<()>);

impl DriverMemory for Ram<'_> {
    fn write(&self, gpa: u64, bytes: &[u8]) {
        self.0
            .write_slice(bytes, GuestAddress(gpa))
            .expect("test write in RAM");
    }

    fn read(&self, gpa: u64, buf: &mut [u8]) {
        self.0
            .read_slice(buf, GuestAddress(gpa))
            .expect("test read in RAM");
    }
}

/// The daemon's view of the driver's ring.
fn ring_addrs(s: SplitRing) -> RingAddrs {
    RingAddrs {
        size: s.size,
        desc: s.desc,
        avail: s.avail,
        used: s.used,
    }
}

/// The driver's view of the daemon's ring addresses.
fn split_ring(r: RingAddrs) -> SplitRing {
    SplitRing {
        size: r.size,
        desc: r.desc,
        avail: r.avail,
        used: r.used,
    }
}

/// A guest: memory, one data ring, the session registry and a queue worker.
pub struct Vm {
    pub mem: GuestMemoryMmap<()>,
    pub reg: SessionRegistry,
    pub worker: QueueWorker,
    /// Tables of further queues (for "other queues unaffected").
    pub spare_tables: Vec<SessionTable>,
    /// The driver's side of the data ring: its addresses, the avail index
    /// it fills next, the used index it reads next.
    pub driver: DriverRing,
    /// Device-side indices, owned by the "frontend" (passed to process).
    pub next_avail: u16,
    pub next_used: u16,
    /// Free ring descriptors and indirect table space (all freed by [`Vm::run`]).
    descs: DescAlloc,
    tables: TableArea,
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
        Vm::build_in(ranges, queues, live_tables())
    }

    /// [`Vm::build`] with the session tables in the list `live` (a test
    /// that wipes its tables as the exit does must not wipe the process's).
    pub fn build_in(ranges: &[(u64, usize)], queues: usize, live: &'static LiveTables) -> Vm {
        let r: Vec<(GuestAddress, usize)> = ranges.iter().map(|&(a, l)| (GuestAddress(a), l)).collect();
        let mem = GuestMemoryMmap::<()>::from_ranges(&r).expect("guest memory");
        let ids = Arc::new(AtomicU64::new(1));
        let (mut reg, mut tables) = session_set_in(1024, queues, ids, live);
        assert_eq!(reg.create(&session_info(&NIST_KEY, 1)), E as i64);
        assert_eq!(reg.create(&session_info(&NIST_KEY, 2)), D as i64);
        let first = tables.remove(0);
        let worker = QueueWorker::new(
            first,
            RequestLimits {
                max_request_bytes: 1 << 20,
            },
        );
        let ring = SplitRing {
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
            driver: DriverRing::new(ring, 0),
            next_avail: 0,
            next_used: 0,
            descs: DescAlloc::new(QSIZE),
            tables: TableArea::new(INDIRECT_BASE, u64::MAX, 0x100),
        };
        vm.fill(RING_AVAIL, SplitRing::avail_bytes(QSIZE) as usize, 0);
        vm.fill(RING_USED, SplitRing::used_bytes(QSIZE) as usize, 0);
        vm
    }

    /// The guest memory as the driver ring writes and reads it.
    pub fn ram(&self) -> Ram<'_> {
        Ram(&self.mem)
    }

    /// The data ring's addresses, as the frontend gives them to the daemon.
    pub fn ring(&self) -> RingAddrs {
        ring_addrs(self.driver.ring())
    }

    // ---- raw guest memory ----

    pub fn write(&self, addr: u64, bytes: &[u8]) {
        self.ram().write(addr, bytes);
    }

    pub fn read(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.ram().read(addr, &mut v);
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
    pub fn put_desc(&self, table: u64, idx: u16, d: Descriptor) {
        driver_ring::write_desc(&self.ram(), table, idx, &d);
    }

    /// Writes descriptor `idx` of the ring's table.
    pub fn set_desc(&self, idx: u16, d: Descriptor) {
        self.driver.write_desc(&self.ram(), idx, &d);
    }

    /// `n` consecutive free ring descriptors; the first one.
    fn take_descs(&mut self, n: u16) -> u16 {
        self.descs
            .take(n)
            .expect("test uses more descriptors than the ring has")
    }

    /// Writes `bufs` as a direct chain in free slots; returns the head.
    pub fn chain(&mut self, bufs: &[Buf]) -> u16 {
        assert!(!bufs.is_empty());
        let head = self.take_descs(bufs.len() as u16);
        self.driver.write_chain(&Ram(&self.mem), head, bufs)
    }

    /// Writes `bufs` as one indirect table (entries linked i → i+1, as
    /// Linux does) and a ring descriptor pointing at it; returns the head.
    pub fn indirect(&mut self, bufs: &[Buf]) -> u16 {
        let table = self.tables.take(bufs.len()).expect("indirect table space");
        let head = self.take_descs(1);
        self.driver.write_indirect(&Ram(&self.mem), head, table, bufs)
    }

    /// Puts `head` on the avail ring and publishes the new avail index.
    pub fn push(&mut self, head: u16) {
        let ram = Ram(&self.mem);
        self.driver.push(&ram, head);
        self.driver.publish(&ram);
    }

    /// Writes avail.idx (without touching the driver-side counter).
    pub fn set_avail_idx(&self, idx: u16) {
        self.write(self.driver.ring().avail_idx(), &idx.to_le_bytes());
    }

    /// Starts the driver and device indices at `idx` (wrap tests).
    pub fn start_at(&mut self, idx: u16) {
        self.driver = DriverRing::new(self.driver.ring(), idx);
        self.next_avail = idx;
        self.next_used = idx;
        self.set_avail_idx(idx);
        self.write(self.driver.ring().used_idx(), &idx.to_le_bytes());
    }

    /// One call to `QueueWorker::process`; descriptor slots are free again afterwards.
    pub fn run(&mut self) -> BatchResult {
        let ring = self.ring();
        let r = self
            .worker
            .process(&self.mem, ring, &mut self.next_avail, &mut self.next_used);
        self.descs.reset();
        self.tables.reset();
        r
    }

    /// Polls (`set_polling(true)`): calls `process` until every chain
    /// pushed is done, and returns how many each call completed, asserting
    /// each call's batch was published before it returned.
    #[track_caller]
    pub fn polling_batch_sizes(&mut self) -> Vec<u32> {
        self.worker.set_polling(true);
        let mut seen = Vec::new();
        while self.next_avail != self.driver.avail_idx() {
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
        self.driver.used_idx(&self.ram())
    }

    /// Used element written at used index `i`.
    pub fn used(&self, i: u16) -> Used {
        self.driver.used_elem(&self.ram(), i)
    }

    /// `avail_event`: the u16 after the used ring's `size` elements.
    pub fn avail_event(&self) -> u16 {
        self.driver.avail_event(&self.ram())
    }

    /// Processes the chains pushed so far, one batch per call until a call
    /// completes nothing, and returns their used elements, asserting the
    /// calls completed exactly them.
    #[track_caller]
    pub fn run_batch(&mut self) -> Vec<Used> {
        let first = self.next_used;
        let avail_idx = self.driver.avail_idx();
        let pending = avail_idx.wrapping_sub(self.next_avail);
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
        assert_eq!(self.next_avail, avail_idx, "next_avail after the batch");
        assert_eq!(self.used_idx(), avail_idx, "used.idx published");
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
        self.driver = DriverRing::new(split_ring(ring), 0);
        self.next_avail = 0;
        self.next_used = 0;
        self.descs = DescAlloc::new(ring.size);
        self.fill(ring.avail, SplitRing::avail_bytes(ring.size) as usize, 0);
        self.fill(ring.used, SplitRing::used_bytes(ring.size) as usize, 0);
    }

    /// Points the driver at `ring` as it is in memory (a ring the frontend
    /// resized in place): the rings' bytes and every index stay.
    pub fn resize_in_place(&mut self, ring: RingAddrs) {
        let mut driver = DriverRing::new(split_ring(ring), self.driver.avail_idx());
        driver.set_last_used(self.driver.last_used());
        self.driver = driver;
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
