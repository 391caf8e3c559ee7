// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The daemon's descriptor walk against virtio-queue's, on the same ring.
//!
//! One split ring of 256 entries in `GuestMemoryMmap`, holding 256
//! AES-128-CBC encrypt requests of 256 bytes, each one indirect table as
//! Linux's virtio_crypto driver sends them (header 72 B | IV 16 | src |
//! dst (W) | status 1 (W)). Each variant serves all 256 per iteration:
//!
//! - `a-ours-process`: `QueueWorker::process` until the 256 are done
//!   (batches of `MAX_BATCH`), as `benches/queue.rs` does;
//! - `b-virtio-queue-reader-writer`: what a vhost-device backend does with
//!   virtio-queue 0.18: the chains from `Queue::iter` collected into a
//!   `Vec` (as `add_used` needs the queue back), then per chain
//!   `Reader::new` and `Writer::new`, the header read and checked, the
//!   session looked up (in the daemon's session table), IV and src read
//!   into a reused local buffer, AES-128-CBC single-stream in that buffer,
//!   dst and the status byte (the last writable byte) written through the
//!   `Writer`, `Queue::add_used` per chain, one `needs_notification` per
//!   batch;
//! - `c-ours-walk`: the avail ring read and `ChainWalker::walk` per chain,
//!   nothing else;
//! - `d-virtio-queue-walk`: `Queue::iter` collected, `Reader::new` and
//!   `Writer::new` per chain, nothing else;
//! - `e-ours-walk-single-stream`: the walk and `crypto::prepare` without
//!   lanes (single-stream cipher from src to dst on guest memory, the
//!   daemon's path for decrypt), the used elements and one used-index
//!   store: (a) without multi-buffer AES, in the cipher mode of (b).
//!
//! The ring is offered again before each iteration (untimed,
//! `iter_batched`): every iteration does the same 256 requests. Before
//! measuring, one batch of each of (a), (b) and (e) is checked against
//! AES-128-CBC from the `aes` and `cbc` crates and from OpenSSL, both used
//! directly: same ciphertext, status `VIRTIO_CRYPTO_OK`, used length 257.
//!
//! `RING_WALK_BATCHES=<variant>:<n>` runs `n` batches of one variant (after
//! one warm-up batch) and prints the heap allocations per request, without
//! criterion: the mode to run under `valgrind --tool=callgrind`, whose
//! instruction count difference between two `n` gives instructions per
//! request.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::RefCell;
use std::hint::black_box;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};

use algorithms::Direction;
use cbc::cipher::generic_array::GenericArray;
use cbc::cipher::{BlockEncryptMut, KeyIvInit};
use criterion::measurement::WallTime;
use criterion::{BatchSize, BenchmarkGroup, Criterion, Throughput};
use virtio_queue::{Queue, QueueOwnedT, QueueT, Reader, Writer};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use vhost_crypto_replay::driver_ring::{encode, Descriptor, F_INDIRECT, F_NEXT, F_WRITE};
use vhost_user_crypto::crypto::{prepare, Prepared, RequestLimits};
use vhost_user_crypto::sessions::{session_set, SessionRegistry, SessionTable, Sessions};
use vhost_user_crypto::virtq::descriptor::ChainWalker;
use vhost_user_crypto::virtq::map_contiguous;
use vhost_user_crypto::wire::session::SymSessionInfo;
use vhost_user_crypto::wire::virtio_crypto::{
    OpDataReq, Status, OP_DATA_REQ_SIZE, VIRTIO_CRYPTO_CIPHER_AES_CBC, VIRTIO_CRYPTO_CIPHER_ENCRYPT,
    VIRTIO_CRYPTO_SYM_OP_CIPHER,
};
use vhost_user_crypto::worker::QueueWorker;

/// Counts heap allocations (and reallocations) while `COUNTING` is set.
struct CountingAlloc;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicU64 = AtomicU64::new(0);

fn count() {
    if COUNTING.load(Ordering::Relaxed) {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every call is passed on unchanged to the system allocator.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract for `alloc`, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract for `alloc_zeroed`, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: the caller's contract for `realloc`, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract for `dealloc`, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

const QSIZE: u16 = 256;
const SIZE: usize = 256;
const DESC: u64 = 0x1000;
const AVAIL: u64 = 0x3000;
const USED: u64 = 0x4000;
const BUFS: u64 = 0x10_0000;
const SLOT: u64 = 4096;
const KEY: [u8; 16] = [0x2b; 16];
/// Used length of a completed request: dst and the status byte.
const USED_LEN: u32 = SIZE as u32 + 1;

/// Where request `i`'s buffers are (guest addresses).
struct Bufs {
    hdr: u64,
    iv: u64,
    src: u64,
    dst: u64,
    status: u64,
    table: u64,
}

fn bufs(i: u16) -> Bufs {
    let base = BUFS + u64::from(i) * SLOT;
    Bufs {
        hdr: base,
        iv: base + 72,
        src: base + 88,
        dst: base + 88 + SIZE as u64,
        status: base + 88 + 2 * SIZE as u64,
        table: (base + 89 + 2 * SIZE as u64).next_multiple_of(16),
    }
}

fn iv_of(i: u16) -> [u8; 16] {
    std::array::from_fn(|j| (i as u8) ^ (j as u8).wrapping_mul(17))
}

fn src_of(i: u16) -> Vec<u8> {
    (0..SIZE)
        .map(|j| (j as u8).wrapping_mul(7) ^ (i >> 1) as u8)
        .collect()
}

/// Guest memory holding the ring and its 256 requests, and the session
/// (AES-128-CBC encrypt, [`KEY`]) they name.
struct Guest {
    mem: GuestMemoryMmap<()>,
    _registry: SessionRegistry,
    table: SessionTable,
    avail_idx: u16,
}

impl Guest {
    fn new() -> Self {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(
            GuestAddress(0),
            (BUFS + SLOT * u64::from(QSIZE)) as usize,
        )])
        .unwrap();
        let (mut registry, mut tables) = session_set(16, 1);
        let sid = registry.create(&SymSessionInfo::aes_cbc(&KEY, 1));
        assert!(sid > 0);
        for i in 0..QSIZE {
            let b = bufs(i);
            let hdr = OpDataReq {
                opcode: VIRTIO_CRYPTO_CIPHER_ENCRYPT,
                algo: 0,
                session_id: sid as u64,
                op_type: VIRTIO_CRYPTO_SYM_OP_CIPHER,
                iv_len: 16,
                src_data_len: SIZE as u32,
                dst_data_len: SIZE as u32,
            };
            mem.write_slice(&hdr.to_bytes(), GuestAddress(b.hdr)).unwrap();
            mem.write_slice(&iv_of(i), GuestAddress(b.iv)).unwrap();
            mem.write_slice(&src_of(i), GuestAddress(b.src)).unwrap();
            // Not the OK status: the check sees that it was written.
            mem.write_obj(0xffu8, GuestAddress(b.status)).unwrap();
            let descs = [
                (b.hdr, 72, 0),
                (b.iv, 16, 0),
                (b.src, SIZE as u32, 0),
                (b.dst, SIZE as u32, F_WRITE),
                (b.status, 1, F_WRITE),
            ];
            for (j, &(addr, len, flags)) in descs.iter().enumerate() {
                let last = j == descs.len() - 1;
                let d = Descriptor::new(
                    addr,
                    len,
                    flags | if last { 0 } else { F_NEXT },
                    if last { 0 } else { j as u16 + 1 },
                );
                mem.write_slice(&encode(&d), GuestAddress(b.table + 16 * j as u64))
                    .unwrap();
            }
            let head = Descriptor::new(b.table, 16 * descs.len() as u32, F_INDIRECT, 0);
            mem.write_slice(&encode(&head), GuestAddress(DESC + 16 * u64::from(i)))
                .unwrap();
            mem.write_obj(i, GuestAddress(AVAIL + 4 + 2 * u64::from(i)))
                .unwrap();
        }
        Guest {
            mem,
            _registry: registry,
            table: tables.pop().unwrap(),
            avail_idx: 0,
        }
    }

    /// Makes all 256 requests available again (the driver's avail index
    /// moves on by the queue size).
    fn offer_all(&mut self) {
        self.avail_idx = self.avail_idx.wrapping_add(QSIZE);
        self.mem
            .write_obj(self.avail_idx, GuestAddress(AVAIL + 2))
            .unwrap();
    }

    /// The avail and used rings mapped: (avail ring, used ring) host
    /// addresses.
    fn rings(&self) -> (*mut u8, *mut u8) {
        let q = usize::from(QSIZE);
        (
            map_contiguous(&self.mem, AVAIL, 6 + 2 * q).unwrap(),
            map_contiguous(&self.mem, USED, 6 + 8 * q).unwrap(),
        )
    }

    /// A virtio-queue `Queue` on this ring, as a vhost-user backend sets
    /// it up from SET_VRING_NUM / SET_VRING_ADDR / SET_VRING_ENABLE.
    fn vq(&self) -> Queue {
        let mut q = Queue::new(QSIZE).unwrap();
        q.set_size(QSIZE);
        q.try_set_desc_table_address(GuestAddress(DESC)).unwrap();
        q.try_set_avail_ring_address(GuestAddress(AVAIL)).unwrap();
        q.try_set_used_ring_address(GuestAddress(USED)).unwrap();
        q.set_ready(true);
        assert!(q.is_valid(&self.mem));
        q
    }
}

/// One way of serving the ring.
trait Variant {
    fn guest(&mut self) -> &mut Guest;
    /// Serves the 256 available requests.
    fn run(&mut self);
}

/// (a) The daemon's queue worker.
struct Ours {
    g: Guest,
    worker: QueueWorker,
    next_avail: u16,
    next_used: u16,
}

impl Ours {
    fn new() -> Self {
        let g = Guest::new();
        let worker = QueueWorker::new(
            g.table.clone(),
            RequestLimits {
                max_request_bytes: 1 << 20,
            },
        );
        Ours {
            g,
            worker,
            next_avail: 0,
            next_used: 0,
        }
    }
}

impl Variant for Ours {
    fn guest(&mut self) -> &mut Guest {
        &mut self.g
    }

    fn run(&mut self) {
        let addrs = vhost_user_crypto::virtq::ring::RingAddrs {
            size: QSIZE,
            desc: DESC,
            avail: AVAIL,
            used: USED,
        };
        let mut done = 0;
        while done < u32::from(QSIZE) {
            let r = self
                .worker
                .process(&self.g.mem, addrs, &mut self.next_avail, &mut self.next_used);
            assert!(r.completed > 0, "no progress after {done} requests");
            done += r.completed;
            black_box(r.notify);
        }
    }
}

/// (b) A vhost-device style backend on virtio-queue.
struct Vq {
    g: Guest,
    queue: Queue,
    /// The request's data between reading src and writing dst; reused.
    buf: Vec<u8>,
}

impl Vq {
    fn new() -> Self {
        let g = Guest::new();
        let queue = g.vq();
        Vq {
            g,
            queue,
            buf: Vec::new(),
        }
    }
}

/// Reads, checks and encrypts one request into `w` (dst); the status to
/// write.
fn vq_cipher(
    r: &mut Reader<'_>,
    w: &mut Writer<'_>,
    sessions: &Sessions,
    buf: &mut Vec<u8>,
) -> Result<usize, Status> {
    let mut raw = [0u8; OP_DATA_REQ_SIZE];
    r.read_exact(&mut raw).map_err(|_| Status::Err)?;
    let h = OpDataReq::from_bytes(&raw);
    if h.opcode != VIRTIO_CRYPTO_CIPHER_ENCRYPT
        || h.op_type != VIRTIO_CRYPTO_SYM_OP_CIPHER
        || (h.algo != 0 && h.algo != VIRTIO_CRYPTO_CIPHER_AES_CBC)
    {
        return Err(Status::NotSupp);
    }
    let s = sessions.get(h.session_id).ok_or(Status::InvSess)?;
    let len = h.src_data_len as usize;
    if s.direction != Direction::Encrypt
        || s.mac.is_some()
        || h.iv_len != 16
        || h.dst_data_len != h.src_data_len
        || !len.is_multiple_of(16)
        || r.available_bytes() < 16 + len
        || w.available_bytes() < len + 1
    {
        return Err(Status::Err);
    }
    let mut iv = [0u8; 16];
    r.read_exact(&mut iv).map_err(|_| Status::Err)?;
    buf.resize(len, 0);
    r.read_exact(buf).map_err(|_| Status::Err)?;
    s.key
        .start(Direction::Encrypt, &iv)
        .process_in_place(buf)
        .map_err(|_| Status::Err)?;
    w.write_all(buf).map_err(|_| Status::Err)?;
    Ok(len)
}

/// Serves one chain; its used length.
fn vq_serve<'m>(
    mem: &'m GuestMemoryMmap<()>,
    chain: virtio_queue::DescriptorChain<&'m GuestMemoryMmap<()>>,
    sessions: &Sessions,
    buf: &mut Vec<u8>,
) -> u32 {
    let (Ok(mut r), Ok(mut w)) = (Reader::new(mem, chain.clone()), Writer::new(mem, chain)) else {
        return 0;
    };
    let (status, written) = match vq_cipher(&mut r, &mut w, sessions, buf) {
        Ok(n) => (Status::Ok, n),
        Err(s) => (s, 0),
    };
    // The status byte is the last writable byte.
    let left = w.available_bytes();
    if left == 0 {
        return 0;
    }
    if left > 1 {
        match w.split_at(left - 1) {
            Ok(tail) => w = tail,
            Err(_) => return 0,
        }
    }
    if w.write_all(&[status as u8]).is_err() {
        return 0;
    }
    written as u32 + 1
}

impl Variant for Vq {
    fn guest(&mut self) -> &mut Guest {
        &mut self.g
    }

    fn run(&mut self) {
        let mem = &self.g.mem;
        let sessions = self.g.table.lock();
        let chains: Vec<_> = self.queue.iter(mem).unwrap().collect();
        for chain in chains {
            let head = chain.head_index();
            let len = vq_serve(mem, chain, &sessions, &mut self.buf);
            self.queue.add_used(mem, head, len).unwrap();
        }
        black_box(self.queue.needs_notification(mem).unwrap());
    }
}

/// (c) The daemon's walk alone.
struct OursWalk {
    g: Guest,
    walker: ChainWalker,
    next_avail: u16,
}

impl Variant for OursWalk {
    fn guest(&mut self) -> &mut Guest {
        &mut self.g
    }

    fn run(&mut self) {
        let mem = &self.g.mem;
        let (avail, _) = self.g.rings();
        let table = map_contiguous(mem, DESC, 16 * usize::from(QSIZE)).unwrap();
        // SAFETY: `rings` mapped the avail ring (6 + 2 * QSIZE bytes, at
        // an even address) in `mem`, which outlives this call.
        let avail16 = |i: u16| unsafe { AtomicU16::from_ptr(avail.add(2 * usize::from(i)) as *mut u16) };
        self.walker.begin_batch();
        let end = u16::from_le(avail16(1).load(Ordering::Acquire));
        while self.next_avail != end {
            let head = u16::from_le(avail16(2 + self.next_avail % QSIZE).load(Ordering::Relaxed));
            self.next_avail = self.next_avail.wrapping_add(1);
            // SAFETY: `table` is the mapped descriptor table of QSIZE
            // entries, and `mem` (the map of every walk of this batch)
            // outlives the walker's use of its segments.
            unsafe { self.walker.walk(mem, table, QSIZE, head) };
            black_box((
                self.walker.readable_len(),
                self.walker.writable_len(),
                self.walker.has_status(),
                self.walker.fault(),
            ));
        }
    }
}

/// (d) virtio-queue's walk alone.
struct VqWalk {
    g: Guest,
    queue: Queue,
}

impl Variant for VqWalk {
    fn guest(&mut self) -> &mut Guest {
        &mut self.g
    }

    fn run(&mut self) {
        let mem = &self.g.mem;
        let chains: Vec<_> = self.queue.iter(mem).unwrap().collect();
        for chain in chains {
            let r = Reader::new(mem, chain.clone());
            let w = Writer::new(mem, chain);
            black_box((
                r.map(|r| r.available_bytes()).ok(),
                w.map(|w| w.available_bytes()).ok(),
            ));
        }
    }
}

/// (e) The daemon's walk and single-stream request path, used ring written
/// directly with one index store.
struct OursSingle {
    g: Guest,
    walker: ChainWalker,
    next_avail: u16,
    next_used: u16,
}

impl Variant for OursSingle {
    fn guest(&mut self) -> &mut Guest {
        &mut self.g
    }

    fn run(&mut self) {
        let mem = &self.g.mem;
        let (avail, used) = self.g.rings();
        let table = map_contiguous(mem, DESC, 16 * usize::from(QSIZE)).unwrap();
        // SAFETY: as in `OursWalk::run`.
        let avail16 = |i: u16| unsafe { AtomicU16::from_ptr(avail.add(2 * usize::from(i)) as *mut u16) };
        let sessions = self.g.table.lock();
        let limits = RequestLimits {
            max_request_bytes: 1 << 20,
        };
        self.walker.begin_batch();
        let end = u16::from_le(avail16(1).load(Ordering::Acquire));
        while self.next_avail != end {
            let head = u16::from_le(avail16(2 + self.next_avail % QSIZE).load(Ordering::Relaxed));
            self.next_avail = self.next_avail.wrapping_add(1);
            // SAFETY: as in `OursWalk::run`.
            unsafe { self.walker.walk(mem, table, QSIZE, head) };
            let len = match prepare(&self.walker, &sessions, limits, false) {
                Prepared::Done(c) => c.used_len,
                Prepared::Lane(_) => unreachable!("lanes not allowed"),
            };
            let elem = u64::from(head) | (u64::from(len) << 32);
            let at = 4 + 8 * usize::from(self.next_used % QSIZE);
            // SAFETY: `rings` mapped the used ring (6 + 8 * QSIZE bytes, at
            // an address aligned to 8) in `mem`; `at` is an element in it.
            unsafe { std::ptr::write_volatile(used.add(at) as *mut u64, elem.to_le()) };
            self.next_used = self.next_used.wrapping_add(1);
        }
        // SAFETY: the used ring's index, as above.
        unsafe { AtomicU16::from_ptr(used.add(2) as *mut u16) }
            .store(self.next_used.to_le(), Ordering::Release);
    }
}

fn ours_walk() -> OursWalk {
    OursWalk {
        g: Guest::new(),
        walker: ChainWalker::new(),
        next_avail: 0,
    }
}

fn vq_walk() -> VqWalk {
    let g = Guest::new();
    let queue = g.vq();
    VqWalk { g, queue }
}

fn ours_single() -> OursSingle {
    OursSingle {
        g: Guest::new(),
        walker: ChainWalker::new(),
        next_avail: 0,
        next_used: 0,
    }
}

/// AES-128-CBC of request `i`'s src from two sources other than the daemon's
/// `algorithms` crate: RustCrypto's `aes` + `cbc` used directly, and
/// OpenSSL; they must agree.
fn expected(i: u16) -> Vec<u8> {
    let mut rc = src_of(i);
    let mut enc = cbc::Encryptor::<aes::Aes128>::new(&KEY.into(), &iv_of(i).into());
    for block in rc.chunks_exact_mut(16) {
        enc.encrypt_block_mut(GenericArray::from_mut_slice(block));
    }
    let mut c = openssl::symm::Crypter::new(
        openssl::symm::Cipher::aes_128_cbc(),
        openssl::symm::Mode::Encrypt,
        &KEY,
        Some(&iv_of(i)),
    )
    .unwrap();
    c.pad(false);
    let mut ossl = vec![0u8; SIZE + 16];
    let mut n = c.update(&src_of(i), &mut ossl).unwrap();
    n += c.finalize(&mut ossl[n..]).unwrap();
    ossl.truncate(n);
    assert_eq!(rc, ossl, "aes+cbc and OpenSSL disagree for request {i}");
    rc
}

/// Serves one batch with `v` and checks every request's dst, status and
/// used element against [`expected`].
fn check(name: &str, v: &mut dyn Variant) {
    v.guest().offer_all();
    v.run();
    let mem = &v.guest().mem;
    let used_idx: u16 = mem.read_obj(GuestAddress(USED + 2)).unwrap();
    assert_eq!(used_idx, QSIZE, "{name}: used index");
    for i in 0..QSIZE {
        let b = bufs(i);
        let mut dst = vec![0u8; SIZE];
        mem.read_slice(&mut dst, GuestAddress(b.dst)).unwrap();
        assert!(dst == expected(i), "{name}: dst of request {i}");
        let status: u8 = mem.read_obj(GuestAddress(b.status)).unwrap();
        assert_eq!(status, Status::Ok as u8, "{name}: status of request {i}");
        let id: u32 = mem.read_obj(GuestAddress(USED + 4 + 8 * u64::from(i))).unwrap();
        let len: u32 = mem.read_obj(GuestAddress(USED + 8 + 8 * u64::from(i))).unwrap();
        assert_eq!((id, len), (u32::from(i), USED_LEN), "{name}: used element {i}");
    }
}

fn check_all() {
    check("a", &mut Ours::new());
    check("b", &mut Vq::new());
    check("e", &mut ours_single());
}

fn variant(name: &str) -> Box<dyn Variant> {
    match name {
        "a" => Box::new(Ours::new()),
        "b" => Box::new(Vq::new()),
        "c" => Box::new(ours_walk()),
        "d" => Box::new(vq_walk()),
        "e" => Box::new(ours_single()),
        _ => panic!("variant {name}: one of a, b, c, d, e"),
    }
}

const NAMES: [(&str, &str); 5] = [
    ("a", "a-ours-process"),
    ("b", "b-virtio-queue-reader-writer"),
    ("c", "c-ours-walk"),
    ("d", "d-virtio-queue-walk"),
    ("e", "e-ours-walk-single-stream"),
];

fn bench(g: &mut BenchmarkGroup<'_, WallTime>, name: &str, v: Box<dyn Variant>) {
    let v = RefCell::new(v);
    g.bench_function(name, |b| {
        b.iter_batched(
            || v.borrow_mut().guest().offer_all(),
            |()| v.borrow_mut().run(),
            BatchSize::PerIteration,
        )
    });
}

fn ring_walk(c: &mut Criterion) {
    check_all();
    let mut g = c.benchmark_group("ring-walk-256x256B");
    g.throughput(Throughput::Elements(u64::from(QSIZE)));
    for (short, long) in NAMES {
        bench(&mut g, long, variant(short));
    }
    g.finish();
}

/// `RING_WALK_BATCHES=<variant>:<n>`: see the module documentation.
fn count_mode(spec: &str) {
    let (name, n) = spec
        .split_once(':')
        .expect("RING_WALK_BATCHES=<a|b|c|d|e>:<batches>");
    let n: u64 = n.parse().expect("a number of batches");
    check_all();
    let mut v = variant(name);
    v.guest().offer_all();
    v.run();
    ALLOCS.store(0, Ordering::Relaxed);
    for _ in 0..n {
        v.guest().offer_all();
        COUNTING.store(true, Ordering::Relaxed);
        v.run();
        COUNTING.store(false, Ordering::Relaxed);
    }
    let allocs = ALLOCS.load(Ordering::Relaxed);
    let requests = n * u64::from(QSIZE);
    println!(
        "{name}: {n} batches of {QSIZE}, {allocs} allocations ({:.2} per request)",
        allocs as f64 / requests.max(1) as f64
    );
}

fn main() {
    if let Ok(spec) = std::env::var("RING_WALK_BATCHES") {
        count_mode(&spec);
        return;
    }
    let mut c = Criterion::default().configure_from_args();
    ring_walk(&mut c);
    c.final_summary();
}
