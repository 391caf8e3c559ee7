// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The guest-memory suite: what a guest writes into guest memory, driven
//! through `QueueWorker::process` on split rings built by hand in real
//! guest memory (`common::vm`), without a daemon or a socket. The
//! hostile-guest cases H01–H15 and H17 of docs/RELIABILITY.md, the status
//! policy of docs/PROTOCOL.md §6, AlgChain requests (§5.2), notification
//! suppression (§7), indirect tables across region seams, batching, guest
//! fields rewritten while the device works, and the data path's
//! allocations.
//!
//! Expected values come from NIST SP 800-38A, OpenSSL (`common::oracle`)
//! and the specifications, never from the code under test.
//!
//! Process-wide state of this binary:
//!
//! * [`allocation`] installs the binary's `#[global_allocator]`. It counts
//!   only the calls of a thread whose flag is set, and only that test sets
//!   it, on its own thread, around `process`: the tests running beside it
//!   allocate on threads of their own and are not counted; they pay one
//!   thread-local read per allocation.
//! * [`concurrent_rewrite`]'s racing test keeps two threads busy for
//!   several seconds (the device and the flipping guest). The time limits
//!   of the other tests (100 ms to 4 s on work of microseconds to tens of
//!   milliseconds) leave room for sharing the CPUs with it.

#[path = "../common/mod.rs"]
mod common;

mod alg_chain;
mod allocation;
mod batching;
mod concurrent_rewrite;
mod descriptor_faults;
mod descriptor_layouts;
mod descriptor_splits;
mod headers;
mod indirect_seams;
mod notification;
mod rings;
mod sessions;
