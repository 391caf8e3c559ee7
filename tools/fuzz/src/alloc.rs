// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! An allocator that counts the calls a thread makes while counting is on.
//!
//! A binary that installs it (`#[global_allocator] static A: CountingAlloc =
//! CountingAlloc;`) makes [`counted`] sections observable; without it the
//! counts stay zero and the harness's zero-allocation check is vacuous.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

thread_local! {
    // Const-initialised, no destructor: usable inside the allocator.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

/// Forwards to [`System`], counting allocations made inside [`counted`].
#[derive(Debug)]
pub struct CountingAlloc;

fn note(size: usize) {
    if COUNTING.try_with(Cell::get).unwrap_or(false) {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(size as u64, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments;
// the bookkeeping touches only atomics and a const thread-local.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: forwarded unchanged (GlobalAlloc contract).
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: ptr came from System (all allocations go through it).
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Runs `f` with counting on for this thread.
pub fn counted<T>(f: impl FnOnce() -> T) -> T {
    let was = COUNTING.replace(true);
    let r = f();
    COUNTING.set(was);
    r
}

/// (allocations, bytes) counted so far.
pub fn counts() -> (u64, u64) {
    (ALLOCS.load(Ordering::Relaxed), BYTES.load(Ordering::Relaxed))
}
