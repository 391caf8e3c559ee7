// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Structure-aware fuzz harness for vhost-user-crypto.
//!
//! Shared by the libFuzzer targets in `fuzz_targets/` and by the main
//! workspace's `fuzz_corpus` test suite (`tests/fuzz_corpus/`), which
//! includes this file as a module (`#[path]`) and replays the corpus
//! without a fuzzer. Module paths here
//! are therefore relative (`super::`), never `crate::`.
//!
//! * [`reader`]: byte decoding (any input is valid) and the matching encoder;
//! * [`engines`]: the `engines` target (the AES and SHA engines against RustCrypto);
//! * [`queue`]: the `queue` target (descriptor rings through `QueueWorker::process`);
//! * [`session`]: the `session` target (session messages, `handle_create`, the registry);
//! * [`socket`]: the `socket` target (message framing, descriptor counts, memory tables);
//! * [`seeds`]: the seed corpus, built from the hostile-guest cases;
//! * [`alloc`]: the counting allocator behind the zero-allocation check.

pub mod alloc;
pub mod engines;
pub mod queue;
pub mod reader;
pub mod seeds;
pub mod session;
pub mod socket;
