// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Keys leave nothing behind on the heap: after CLOSE, no heap block the
//! session code allocated — still in use or already freed — holds the
//! cipher key's bytes (for AES-128 the first round key is the key itself;
//! for AES-256 the first two are), and neither does any block the session
//! message channel used for a CREATE (its payload and its reply).
//!
//! Its `#[global_allocator]` (the `security_heap` binary's) records every
//! block the test thread allocates while a thread-local flag is set, looks
//! for the key in each block when it is freed, and can look for it in
//! every block still in use. The test first checks that the key
//! is found while the sessions are live, so that it cannot pass by not
//! looking in the right place.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use vhost_user_crypto::proxy;
use vhost_user_crypto::proxy::{AbiChoice, ProxyConfig};
use vhost_user_crypto::sessions::session_set;
use vhost_user_crypto::wire::session::{
    close_request, create_request, reply_session_id, SessionAbi, SymSessionInfo,
};

/// The tests share the block table and counters: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The secret keys (no heap copy of them is made by the test itself).
const KEY128: [u8; 16] = *b"\xc3\x5a\x11\x99zeroize-m\x7e\x42\x24";
const KEY256: [u8; 32] = *b"\x9d\x01\xe4\x77another-key-to-zeroize!!\x13\x37\xa5\x5a";

/// Tracked blocks: (address, size), an open-addressing table keyed by
/// address; address 0 = never used, `GONE` = freed.
const SLOTS: usize = 1 << 16;
const GONE: usize = usize::MAX;
static BLOCKS: [(AtomicUsize, AtomicUsize); SLOTS] =
    [const { (AtomicUsize::new(0), AtomicUsize::new(0)) }; SLOTS];
/// Blocks that still held a key when they were freed.
static FREED_WITH_KEY: AtomicU64 = AtomicU64::new(0);
/// Blocks that could not be tracked (the table was full).
static UNTRACKED: AtomicU64 = AtomicU64::new(0);

thread_local! {
    // Const-initialised, no destructor: usable inside the allocator.
    static TRACKING: Cell<bool> = const { Cell::new(false) };
}

fn tracking() -> bool {
    TRACKING.try_with(Cell::get).unwrap_or(false)
}

/// Whether `len` bytes at `p` contain either key.
///
/// The bytes are looked at as the memory holds them, including ones the
/// program never initialised as far as Rust is concerned (padding, the
/// unused part of a union, a vector's spare room, what a reused block held
/// before): key bytes there are just what this test is after. (Reading
/// them as `u8` is outside Rust's rules for uninitialised memory; it is
/// confined to this test.)
///
/// # Safety
/// `p` must point to `len` allocated bytes.
unsafe fn holds_key(p: *const u8, len: usize) -> bool {
    // SAFETY: the caller's contract.
    let b = unsafe { std::slice::from_raw_parts(p, len) };
    b.windows(16).any(|w| w == KEY128) || b.windows(16).any(|w| w == &KEY256[..16] || w == &KEY256[16..])
}

/// Where the probe for address `p` starts.
fn home(p: usize) -> usize {
    ((p >> 4).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 48) % SLOTS
}

fn track(p: *mut u8, size: usize) {
    if p.is_null() || !tracking() {
        return;
    }
    let h = home(p as usize);
    for i in (h..SLOTS).chain(0..h) {
        let (a, s) = &BLOCKS[i];
        let cur = a.load(Ordering::Relaxed);
        if (cur == 0 || cur == GONE)
            && a.compare_exchange(cur, p as usize, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            s.store(size, Ordering::Relaxed);
            return;
        }
    }
    UNTRACKED.fetch_add(1, Ordering::Relaxed);
}

/// Forgets block `p` (any thread may free it); counts it if it still
/// holds a key.
fn untrack(p: *mut u8) {
    let h = home(p as usize);
    for i in (h..SLOTS).chain(0..h) {
        let (a, s) = &BLOCKS[i];
        match a.load(Ordering::Relaxed) {
            0 => return,
            cur if cur == p as usize => {
                // SAFETY: a tracked block, not freed yet (this is its
                // dealloc), of the recorded size.
                if unsafe { holds_key(p, s.load(Ordering::Relaxed)) } {
                    FREED_WITH_KEY.fetch_add(1, Ordering::Relaxed);
                }
                a.store(GONE, Ordering::Relaxed);
                return;
            }
            _ => {}
        }
    }
}

/// Number of tracked blocks in use that hold a key.
fn live_blocks_with_key() -> usize {
    BLOCKS
        .iter()
        .filter(|(a, s)| {
            let p = a.load(Ordering::Relaxed);
            // SAFETY: a tracked block is in use until its dealloc marks
            // the entry; nothing frees memory concurrently in this test.
            p != 0 && p != GONE && unsafe { holds_key(p as *const u8, s.load(Ordering::Relaxed)) }
        })
        .count()
}

struct TrackingAlloc;

// SAFETY: every method forwards to `System` with the same arguments; the
// bookkeeping only uses atomics and a const thread-local, never allocates,
// and reads a block only before handing it back to `System`.
unsafe impl GlobalAlloc for TrackingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout (GlobalAlloc contract).
        let p = unsafe { System.alloc(layout) };
        track(p, layout.size());
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as above.
        let p = unsafe { System.alloc_zeroed(layout) };
        track(p, layout.size());
        p
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // A realloc may move the block and free the old one unseen: do it
        // as alloc + copy + dealloc so the old block is looked at.
        // SAFETY: a valid layout for new_size (GlobalAlloc contract).
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        // SAFETY: as above.
        let p = unsafe { self.alloc(new_layout) };
        if !p.is_null() {
            // SAFETY: both blocks are valid for the smaller size, distinct.
            unsafe { std::ptr::copy_nonoverlapping(ptr, p, layout.size().min(new_size)) };
            // SAFETY: ptr was allocated with `layout`.
            unsafe { self.dealloc(ptr, layout) };
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        untrack(ptr);
        // SAFETY: ptr was allocated by System (every allocation of this
        // binary goes through it) with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: TrackingAlloc = TrackingAlloc;

/// Sessions to create after the secret ones: more than a table holds
/// without growing (it reserves room for 4,096 entries, which the hash
/// table rounds up to 7,168), so every table grows, moving its entries,
/// while the secret sessions are live.
const FILLER: usize = 7300;

#[test]
fn closed_sessions_leave_no_key_on_the_heap() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    FREED_WITH_KEY.store(0, Ordering::Relaxed);
    TRACKING.set(true);
    let (mut reg, tables) = session_set(FILLER + 2, 2);
    let enc = SymSessionInfo::aes_cbc(&KEY128, 1);
    let dec = SymSessionInfo::aes_cbc(&KEY256, 2);
    let (a, b) = (reg.create(&enc), reg.create(&dec));
    assert_eq!((a, b), (1, 2));
    drop((enc, dec));
    for i in 0..FILLER {
        let mut k = [0u8; 16];
        k[..8].copy_from_slice(&(i as u64).to_le_bytes());
        assert!(reg.create(&SymSessionInfo::aes_cbc(&k, 1)) > 0);
    }
    // Precondition: each queue table's box of each of the two sessions
    // holds its key (two tables, two sessions).
    let live = live_blocks_with_key();
    assert!(
        live >= 4,
        "the live sessions' keys are not where the test looks ({live} blocks)"
    );
    assert_eq!(UNTRACKED.load(Ordering::Relaxed), 0, "tracking table too small");
    assert_eq!(
        FREED_WITH_KEY.load(Ordering::Relaxed),
        0,
        "a freed block held a live session's key (a table that grew moved a session and left the old bytes)"
    );
    assert!(reg.close(1));
    assert!(reg.close(2));
    for t in &tables {
        let t = t.lock();
        assert!(t.get(1).is_none() && t.get(2).is_none());
        assert_eq!(t.len(), FILLER);
    }
    let live = live_blocks_with_key();
    let freed = FREED_WITH_KEY.load(Ordering::Relaxed);
    TRACKING.set(false);
    assert_eq!(live, 0, "blocks in use still holding a closed session's key");
    assert_eq!(freed, 0, "blocks freed without zeroizing a closed session's key");
    drop((reg, tables));
}

/// A CREATE (layout C, the AES-128 key) and a CLOSE through the session
/// message channel (`proxy::run` on this thread, between two
/// socket pairs): the received payload, the reply and everything else the
/// channel allocated hold no key once the connection is over.
#[test]
fn session_messages_leave_no_key_on_the_heap() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    FREED_WITH_KEY.store(0, Ordering::Relaxed);
    let (mut front, front_peer) = UnixStream::pair().unwrap();
    let (lib, lib_peer) = UnixStream::pair().unwrap();
    TRACKING.set(true);
    let (registry, tables) = session_set(8, 1);
    {
        let create = create_request(SessionAbi::C, &SymSessionInfo::aes_cbc(&KEY128, 1));
        // SAFETY: a live Vec's bytes.
        let holds = unsafe { holds_key(create.as_ptr(), create.len()) };
        assert!(holds, "precondition: the CREATE message holds the key");
        front.write_all(&create).unwrap();
    }
    front.write_all(&close_request(1)).unwrap();
    front.shutdown(Shutdown::Write).unwrap();
    let config = ProxyConfig {
        abi: AbiChoice::Auto,
        num_queues: 1,
        require_sealed_memory: false,
    };
    proxy::run(
        front_peer,
        lib_peer,
        registry,
        config,
        &mut Default::default(),
        None,
        Default::default(),
        &proxy::Closer::start().unwrap(),
    )
    .unwrap();
    let live = live_blocks_with_key();
    let freed = FREED_WITH_KEY.load(Ordering::Relaxed);
    TRACKING.set(false);
    let mut reply = Vec::new();
    front.read_to_end(&mut reply).unwrap();
    assert_eq!(reply.len(), 12 + 1072, "one CREATE reply");
    assert_eq!(reply_session_id(&reply[12..], SessionAbi::C), Some(1));
    assert!(tables[0].lock().is_empty(), "the session was closed");
    assert_eq!(live, 0, "blocks in use holding the key after the connection");
    assert_eq!(
        freed, 0,
        "blocks of the session message channel freed with the key in them"
    );
    drop(lib);
}
