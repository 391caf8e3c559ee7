// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The process-wide engine honours `VHOST_USER_CRYPTO_AES_ENGINE`. One
//! test in this binary: the choice is made once per process.

use algorithms::{aes_engine, aes_engine_choice, AesEngine, AES_ENGINE_ENV};

#[test]
fn the_environment_variable_picks_the_process_wide_engine() {
    assert_eq!(AES_ENGINE_ENV, "VHOST_USER_CRYPTO_AES_ENGINE");
    // Set before the first use of the choice, by the only test here.
    std::env::set_var(AES_ENGINE_ENV, "Soft");
    assert_eq!(aes_engine(), AesEngine::Soft);
    let choice = aes_engine_choice();
    assert_eq!(choice.requested.as_deref(), Some("Soft"));
    assert!(!choice.ignored);
    // Made once: a later change of the variable changes nothing.
    std::env::set_var(AES_ENGINE_ENV, "aesni");
    assert_eq!(aes_engine(), AesEngine::Soft);
}
