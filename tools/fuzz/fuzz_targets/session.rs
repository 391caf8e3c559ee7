// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Session messages through `SessionAbi::detect`, `decode_create`,
//! `decode_close`, `handle_create` and `SessionRegistry` (see `src/session.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    vhost_user_crypto_fuzz::session::run(data);
});
