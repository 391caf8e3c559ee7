// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Frontend messages through `recv_message`, `takes_descriptors`,
//! `check_descriptor_count` and `check_memory_regions` (see `src/socket.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    vhost_user_crypto_fuzz::socket::run(data);
});
