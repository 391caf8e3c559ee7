// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Replays the fuzz corpus (`tools/fuzz/corpus/<target>/*`) through the
//! same decoding and checking code as the libFuzzer targets, without a
//! fuzzer: the harness library of `tools/fuzz` is included here as a module.
//!
//! Also checks that the seed files are exactly the encoded seed programs
//! (`FUZZ_CORPUS_REGEN=1` rewrites them) and that every seed decodes back
//! to itself. Expected outputs of the `queue` target's valid requests come
//! from OpenSSL here (`corpus::openssl_reference`), not from the
//! `algorithms` crate the fuzz target itself uses.
//!
//! This binary installs the harness's counting allocator as its
//! `#[global_allocator]`, so the zero-allocation check of the `queue`
//! target is live here too. That is why the replay is a binary of its own:
//! the guest-memory suite installs an allocator of its own for the same
//! purpose, and a binary has one. The allocator counts only the calls of a
//! thread inside `harness::alloc::counted`.

#[allow(dead_code)]
#[path = "../../tools/fuzz/src/lib.rs"]
mod harness;

#[path = "../common/mod.rs"]
mod common;

mod corpus;

use harness::alloc::CountingAlloc;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;
