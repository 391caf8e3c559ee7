// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The multi-buffer AES-CBC and HMAC engines of the `algorithms` crate
//! against RustCrypto used directly (see `src/engines.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    vhost_user_crypto_fuzz::engines::run(data);
});
