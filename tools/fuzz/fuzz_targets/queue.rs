// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Descriptor rings, guest memory and sessions through `QueueWorker::process`
//! (see `src/queue/`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use vhost_user_crypto_fuzz::alloc::CountingAlloc;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

fuzz_target!(|data: &[u8]| {
    vhost_user_crypto_fuzz::queue::run(data);
});
