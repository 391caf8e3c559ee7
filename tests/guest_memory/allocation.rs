// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The data path allocates nothing: after one warm-up batch, ≥ 100,000
//! valid requests (256-byte AES-128-CBC: encrypt through the multi-buffer
//! lanes, decrypt, split buffers through the block-by-block path, in place,
//! indirect tables and direct chains) plus error requests of every status
//! go through `QueueWorker::process` in batches, and the allocator is not
//! called once while `process` runs. The worker counts as in the daemon
//! (`vhost_user_crypto::stats`), and its counters end equal to the
//! statuses and lengths of the requests staged.
//!
//! Its `#[global_allocator]` is the one of the whole `guest_memory`
//! binary: it counts the allocations a thread makes while that thread's
//! flag is set, so the other tests of the binary, on threads of their
//! own, are never counted (see `main.rs`).
//!
//! Outputs are checked against OpenSSL (status bytes and used lengths of
//! every request of every batch, output bytes of a rotating sample cleared
//! before its batch), so the test cannot pass by doing nothing.
//!
//! Indirect tables that straddle a region seam, copied into the worker's
//! table buffer, allocate nothing either (counted on the test's own thread).
//!
//! With `HOT_PATH_ALLOC_TRACE=1` each counted allocation prints a backtrace
//! (the first 8), to find where the data path allocates.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::common::*;
use vhost_user_crypto::stats::QueueStats;
use vhost_user_crypto::virtq::ring::RingAddrs;
use vhost_user_crypto::worker::QueueWorker;
use vm_memory::GuestMemoryMmap;

/// Forwards to the system allocator and counts the calls made by a thread
/// while its `COUNTING` flag is set.
struct CountingAlloc;

thread_local! {
    // Const-initialised and without a destructor: reading it never
    // allocates and never registers a thread-exit hook, so it is usable
    // inside the allocator.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    // Allocations this thread made while counting.
    static THREAD_ALLOCS: Cell<u64> = const { Cell::new(0) };
}

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static ALLOC_BYTES: AtomicU64 = AtomicU64::new(0);
static DEALLOCS: AtomicU64 = AtomicU64::new(0);
static TRACE: AtomicBool = AtomicBool::new(false);
const TRACE_MAX: u64 = 8;

fn counting() -> bool {
    COUNTING.try_with(Cell::get).unwrap_or(false)
}

fn note_alloc(size: usize) {
    if !counting() {
        return;
    }
    let _ = THREAD_ALLOCS.try_with(|c| c.set(c.get() + 1));
    let n = ALLOCS.fetch_add(1, Ordering::Relaxed);
    ALLOC_BYTES.fetch_add(size as u64, Ordering::Relaxed);
    if TRACE.load(Ordering::Relaxed) && n < TRACE_MAX {
        // Stop counting while the backtrace (which allocates) is taken.
        COUNTING.set(false);
        eprintln!(
            "hot-path allocation #{n} of {size} bytes:\n{}",
            std::backtrace::Backtrace::force_capture()
        );
        COUNTING.set(true);
    }
}

// SAFETY: every method forwards to `System` with the same arguments; the
// bookkeeping only touches atomics and a const thread-local, and never
// allocates itself (except the opt-in trace, which runs with counting off
// and re-enters this allocator like any other caller).
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_alloc(layout.size());
        // SAFETY: forwarded with the caller's layout (GlobalAlloc contract).
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_alloc(layout.size());
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_alloc(new_size);
        // SAFETY: ptr was allocated by System (every allocation of this
        // binary goes through it) with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if counting() {
            DEALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

/// Runs `f` with allocation counting on for this thread.
fn counted<T>(f: impl FnOnce() -> T) -> T {
    COUNTING.set(true);
    let r = f();
    COUNTING.set(false);
    r
}

/// Request size of the test (bytes).
const LEN: usize = 256;
/// Batches counted (after the warm-up batch).
const BATCHES: usize = 900;
/// Where request k's buffers live.
const DATA_BASE: u64 = 0x100_0000;
const SLOT: u64 = 0x1000;

/// Session ids: E and D (NIST key) come from `Vm::new`; E2 and D2 use a
/// second AES-128 key so consecutive lane requests change keys.
const E2: u64 = 3;
const D2: u64 = 4;
const KEY2: [u8; 16] = *b"hot-path-key-two";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// Header, IV, src, dst, status: five buffers.
    Plain,
    /// src in three pieces, dst in two: the block-by-block path.
    Split,
    /// src and dst are the same bytes (rewritten before each batch).
    InPlace,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    /// Unknown session: INVSESS.
    UnknownSession,
    /// Opcode of an unadvertised service: NOTSUPP.
    BadOpcode,
    /// src_data_len != dst_data_len: ERR.
    LengthMismatch,
    /// Encrypt on a decrypt session: ERR.
    WrongDirection,
    /// dst outside guest memory: ERR.
    UnmappedDst,
    /// No writable buffer: consumed, used 0.
    NoStatus,
}

#[derive(Debug, Clone, Copy)]
struct Spec {
    encrypt: bool,
    session: u64,
    indirect: bool,
    shape: Shape,
    fault: Fault,
}

/// One staged request: its head and what it must produce.
struct Staged {
    spec: Spec,
    head: u16,
    /// Plaintext/ciphertext input (rewritten for in-place requests).
    input: Vec<u8>,
    /// Expected output (OpenSSL).
    expect: Vec<u8>,
    /// Output pieces (guest address, length), in stream order.
    dst: Vec<(u64, usize)>,
    /// Status byte address (None for a consumed chain).
    status: Option<u64>,
}

impl Staged {
    fn want_status(&self) -> Option<u8> {
        self.status?;
        Some(match self.spec.fault {
            Fault::None => OK,
            Fault::UnknownSession => INVSESS,
            Fault::BadOpcode => NOTSUPP,
            Fault::LengthMismatch | Fault::WrongDirection | Fault::UnmappedDst => ERR,
            Fault::NoStatus => unreachable!(),
        })
    }

    fn want_used(&self) -> u32 {
        match self.want_status() {
            None => 0,
            Some(OK) => LEN as u32 + 1,
            Some(_) => 1,
        }
    }
}

/// The 128 requests of one batch (224 ring descriptors of 256).
fn batch_specs() -> Vec<Spec> {
    let mut specs = Vec::new();
    let spec = |encrypt, session, indirect, shape, fault| Spec {
        encrypt,
        session,
        indirect,
        shape,
        fault,
    };
    // 48 lane encrypts in indirect tables under two keys (shuffled with
    // the rest below: the lanes are flushed on key changes).
    for k in 0..48 {
        let session = if (k / 5) % 2 == 0 { E } else { E2 };
        specs.push(spec(true, session, true, Shape::Plain, Fault::None));
    }
    // 16 lane encrypts as direct chains.
    for k in 0..16 {
        let session = if k % 3 == 0 { E2 } else { E };
        specs.push(spec(true, session, false, Shape::Plain, Fault::None));
    }
    // 24 decrypts in indirect tables, 8 as direct chains.
    for k in 0..32 {
        let session = if k % 2 == 0 { D } else { D2 };
        specs.push(spec(false, session, k < 24, Shape::Plain, Fault::None));
    }
    // Split buffers (block-by-block path), both directions.
    for k in 0..8 {
        let (encrypt, session) = if k % 2 == 0 { (true, E) } else { (false, D2) };
        specs.push(spec(encrypt, session, true, Shape::Split, Fault::None));
    }
    // In place (lanes for both directions).
    for k in 0..8 {
        let (encrypt, session) = if k % 2 == 0 { (true, E2) } else { (false, D) };
        specs.push(spec(encrypt, session, true, Shape::InPlace, Fault::None));
    }
    // Errors of every status.
    for (k, fault) in [
        Fault::UnknownSession,
        Fault::BadOpcode,
        Fault::LengthMismatch,
        Fault::WrongDirection,
        Fault::UnmappedDst,
        Fault::NoStatus,
    ]
    .into_iter()
    .cycle()
    .take(16)
    .enumerate()
    {
        let (encrypt, session) = if k % 2 == 0 { (true, E) } else { (false, D) };
        specs.push(spec(encrypt, session, k % 4 != 3, Shape::Plain, fault));
    }
    // Mix the kinds: a fixed shuffle (avail order decides the lane batches).
    let mut rng = Rng::new(0xa110c);
    for i in (1..specs.len()).rev() {
        let j = rng.range(0, i as u64) as usize;
        specs.swap(i, j);
    }
    specs
}

fn key_of(session: u64) -> &'static [u8] {
    match session {
        E | D => &NIST_KEY,
        _ => &KEY2,
    }
}

/// Writes request `k` into guest memory and its descriptors into the ring.
fn stage(vm: &mut Vm, rng: &mut Rng, k: usize, spec: Spec) -> Staged {
    let base = DATA_BASE + k as u64 * SLOT;
    let (h_at, iv_at, src_at, dst_at, st_at) = (base, base + 0x80, base + 0x100, base + 0x400, base + 0x800);
    let iv: [u8; 16] = rng.bytes(16).try_into().unwrap();
    let input = rng.bytes(LEN);
    let (opcode, session) = match spec.fault {
        Fault::UnknownSession => (ENCRYPT, 999),
        Fault::BadOpcode => (0x0400, spec.session),
        Fault::WrongDirection => (ENCRYPT, D),
        _ => (if spec.encrypt { ENCRYPT } else { DECRYPT }, spec.session),
    };
    let encrypt = opcode == ENCRYPT;
    let mut h = hdr(opcode, session, LEN as u32, LEN as u32);
    if spec.fault == Fault::LengthMismatch {
        h.dst_data_len = LEN as u32 - 16;
    }
    vm.write(h_at, &h.to_bytes());
    vm.write(iv_at, &iv);
    vm.fill(base + 0x300, 0x100, CANARY);
    vm.fill(dst_at, 0x400, CANARY);
    vm.fill(st_at, 16, CANARY);

    let expect = if spec.fault == Fault::None {
        oracle(encrypt, key_of(session), &iv, &input)
    } else {
        Vec::new()
    };
    let mut bufs = vec![r(h_at, 72), r(iv_at, 16)];
    let dst: Vec<(u64, usize)> = match spec.shape {
        Shape::Plain => {
            vm.write(src_at, &input);
            bufs.push(r(src_at, LEN as u32));
            vec![(dst_at, LEN)]
        }
        Shape::Split => {
            // src: 40 | 100 | 116 at separate places; dst: 8 | 248.
            let cuts = [(src_at, 40usize), (src_at + 0x80, 100), (src_at + 0x100, 116)];
            let mut o = 0;
            for (a, n) in cuts {
                vm.write(a, &input[o..o + n]);
                bufs.push(r(a, n as u32));
                o += n;
            }
            vec![(dst_at, 8), (dst_at + 0x100, LEN - 8)]
        }
        Shape::InPlace => {
            vm.write(src_at, &input);
            bufs.push(r(src_at, LEN as u32));
            vec![(src_at, LEN)]
        }
    };
    for &(a, n) in &dst {
        let a = if spec.fault == Fault::UnmappedDst {
            0xFFFF_FFFF_0000
        } else {
            a
        };
        bufs.push(w(a, n as u32));
    }
    let status = if spec.fault == Fault::NoStatus {
        bufs.retain(|b| !b.write);
        None
    } else {
        bufs.push(w(st_at, 1));
        Some(st_at)
    };
    let head = if spec.indirect {
        vm.indirect(&bufs)
    } else {
        vm.chain(&bufs)
    };
    Staged {
        spec,
        head,
        input,
        expect,
        dst,
        status,
    }
}

/// Driver side of one batch, outside the counted region: rewrite the
/// in-place inputs, clear the status bytes and the sample's outputs, put
/// every head on the avail ring.
fn refill(vm: &mut Vm, reqs: &[Staged], sample: &[usize]) {
    for (k, s) in reqs.iter().enumerate() {
        if s.spec.shape == Shape::InPlace {
            vm.write(s.dst[0].0, &s.input);
        } else if sample.contains(&k) {
            for &(a, n) in &s.dst {
                vm.fill(a, n, CANARY);
            }
        }
        if let Some(st) = s.status {
            vm.write(st, &[CANARY]);
        }
        vm.push(s.head);
    }
}

/// Checks every used element and status byte of the batch, and the output
/// bytes of the sample (and of every in-place request).
#[track_caller]
fn check(vm: &Vm, reqs: &[Staged], first_used: u16, sample: &[usize], batch: usize) {
    for (k, s) in reqs.iter().enumerate() {
        let u = vm.used(first_used.wrapping_add(k as u16));
        let what = format!("batch {batch}, request {k} {:?}", s.spec);
        assert_eq!(u.id, u32::from(s.head), "{what}: used id");
        assert_eq!(u.len, s.want_used(), "{what}: used length");
        if let Some(st) = s.status {
            assert_eq!(Some(vm.byte(st)), s.want_status(), "{what}: status byte");
        }
        let verify = s.spec.fault == Fault::None && (sample.contains(&k) || s.spec.shape == Shape::InPlace);
        if verify {
            let mut got = Vec::with_capacity(LEN);
            for &(a, n) in &s.dst {
                got.extend(vm.read(a, n));
            }
            assert!(got == s.expect, "{what}: output differs from OpenSSL");
        }
    }
}

/// Calls `process` (one batch each) until a call completes nothing, as
/// the daemon's worker does while requests come; how many it completed.
fn process_all(
    worker: &mut QueueWorker,
    mem: &GuestMemoryMmap<()>,
    ring: RingAddrs,
    next_avail: &mut u16,
    next_used: &mut u16,
) -> u32 {
    let mut done = 0;
    loop {
        let r = worker.process(mem, ring, next_avail, next_used);
        if r.completed == 0 {
            return done;
        }
        done += r.completed;
    }
}

#[test]
fn data_path_allocates_nothing() {
    // The counter itself works: one counted allocation is seen.
    counted(|| drop(std::hint::black_box(vec![0u8; 1])));
    assert_eq!(
        (
            ALLOCS.swap(0, Ordering::Relaxed),
            DEALLOCS.swap(0, Ordering::Relaxed)
        ),
        (1, 1)
    );
    ALLOC_BYTES.store(0, Ordering::Relaxed);
    TRACE.store(
        std::env::var_os("HOT_PATH_ALLOC_TRACE").is_some(),
        Ordering::Relaxed,
    );
    let mut vm = Vm::new();
    let stats: &'static QueueStats = Box::leak(Box::default());
    vm.worker.set_stats(Some(stats));
    assert_eq!(vm.reg.create(&session_info(&KEY2, 1)), E2 as i64);
    assert_eq!(vm.reg.create(&session_info(&KEY2, 2)), D2 as i64);
    let mut rng = Rng::new(0x0a11_0c47_2025);
    let reqs: Vec<Staged> = batch_specs()
        .into_iter()
        .enumerate()
        .map(|(k, spec)| stage(&mut vm, &mut rng, k, spec))
        .collect();
    let n = reqs.len();
    assert_eq!(n, 128);
    let valid = reqs.iter().filter(|s| s.spec.fault == Fault::None).count();
    let lane_encrypts = reqs
        .iter()
        .filter(|s| s.spec.fault == Fault::None && s.spec.encrypt && s.spec.shape != Shape::Split)
        .count();
    assert!(lane_encrypts >= 64);

    // Warm-up batch (not counted): first session sync, lazy CPU-feature
    // detection, anything done once. Every output is checked.
    let all: Vec<usize> = (0..n).collect();
    refill(&mut vm, &reqs, &all);
    let first = vm.next_used;
    let ring = vm.ring();
    let done = process_all(
        &mut vm.worker,
        &vm.mem,
        ring,
        &mut vm.next_avail,
        &mut vm.next_used,
    );
    assert_eq!(done as usize, n);
    check(&vm, &reqs, first, &all, 0);

    let (mut processed, mut valid_done) = (0u64, 0u64);
    for batch in 1..=BATCHES {
        let sample: Vec<usize> = (0..4).map(|j| (batch * 4 + j * 37) % n).collect();
        refill(&mut vm, &reqs, &sample);
        let first = vm.next_used;
        let Vm {
            worker,
            mem,
            next_avail,
            next_used,
            ..
        } = &mut vm;
        let done = counted(|| process_all(worker, mem, ring, next_avail, next_used));
        assert_eq!(done as usize, n, "batch {batch}");
        check(&vm, &reqs, first, &sample, batch);
        processed += u64::from(done);
        valid_done += valid as u64;
    }
    assert!(valid_done >= 100_000, "{valid_done} valid requests");
    assert_eq!(vm.worker.completed, processed + n as u64);

    // The counters: every request of every batch (the warm-up's too), by
    // the status staged; one without a status byte in `requests` only;
    // src_data_len (= dst bytes written) of the OK ones.
    let rounds = BATCHES as u64 + 1;
    let staged = |want: Option<u8>| reqs.iter().filter(|s| s.want_status() == want).count() as u64 * rounds;
    assert!(staged(None) > 0);
    let c = stats.counters();
    assert_eq!(c.requests, n as u64 * rounds);
    assert_eq!(
        [
            c.status.ok,
            c.status.err,
            c.status.badmsg,
            c.status.notsupp,
            c.status.invsess
        ],
        [
            staged(Some(OK)),
            staged(Some(ERR)),
            0,
            staged(Some(NOTSUPP)),
            staged(Some(INVSESS))
        ]
    );
    assert_eq!(c.bytes_in, staged(Some(OK)) * LEN as u64);
    assert_eq!(c.bytes_out, staged(Some(OK)) * LEN as u64);
    // (At most 64 requests a batch: at least two for each 128.)
    assert!(
        (2 * rounds..=c.requests).contains(&c.batches),
        "{} batches",
        c.batches
    );

    let allocs = ALLOCS.load(Ordering::Relaxed);
    let bytes = ALLOC_BYTES.load(Ordering::Relaxed);
    let deallocs = DEALLOCS.load(Ordering::Relaxed);
    eprintln!(
        "{processed} requests ({valid_done} valid) in {BATCHES} batches: \
         {allocs} allocations ({bytes} bytes), {deallocs} deallocations inside process"
    );
    assert_eq!(
        (allocs, deallocs),
        (0, 0),
        "the data path allocated (rerun with HOT_PATH_ALLOC_TRACE=1 for backtraces)"
    );
}

#[test]
fn indirect_tables_across_a_region_seam_allocate_nothing() {
    // Region 0 ends at 4 MiB, where a GPA-adjacent region begins; each
    // request's 5-entry table straddles the seam (3 entries before it).
    let seam = 4 * MIB;
    let mut vm = Vm::with_ranges(&[(0, seam as usize), (seam, MIB as usize)]);
    let one_request = |vm: &mut Vm, count: bool| {
        let bufs = vm.baseline();
        let head = vhost_crypto_replay::driver_ring::write_table(&vm.ram(), seam - 48, &bufs);
        vm.set_desc(0, head);
        vm.push(0);
        let ring = vm.ring();
        let Vm {
            worker,
            mem,
            next_avail,
            next_used,
            ..
        } = vm;
        let done = if count {
            counted(|| process_all(worker, mem, ring, next_avail, next_used))
        } else {
            process_all(worker, mem, ring, next_avail, next_used)
        };
        assert_eq!(done, 1);
        let u = vm.used(vm.next_used.wrapping_sub(1));
        vm.assert_done(u, &NIST_CT);
    };
    // Warm-up (not counted), then 200 counted requests.
    one_request(&mut vm, false);
    let before = THREAD_ALLOCS.get();
    for _ in 0..200 {
        one_request(&mut vm, true);
    }
    assert_eq!(THREAD_ALLOCS.get() - before, 0, "allocations in process");
}
