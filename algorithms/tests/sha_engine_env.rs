// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The process-wide MAC engine honours `VHOST_USER_CRYPTO_SHA_ENGINE`.
//! One test in this binary: the choice is made once per process.

use algorithms::{
    mac_multi, sha_engine, sha_engine_choice, MacAlg, MacJob, MacKey, ShaEngine, SHA_ENGINE_ENV,
};

#[test]
fn the_environment_variable_picks_the_process_wide_mac_engine() {
    assert_eq!(SHA_ENGINE_ENV, "VHOST_USER_CRYPTO_SHA_ENGINE");
    // Set before the first use of the choice, by the only test here; the
    // portable engine runs on every CPU, and names ignore ASCII case.
    std::env::set_var(SHA_ENGINE_ENV, " Portable ");
    assert_eq!(sha_engine(), ShaEngine::Portable);
    let choice = sha_engine_choice();
    assert_eq!(choice.requested.as_deref(), Some(" Portable "));
    assert!(!choice.ignored);
    // Made once: a later change of the variable changes nothing.
    std::env::set_var(SHA_ENGINE_ENV, "shani");
    assert_eq!(sha_engine(), ShaEngine::Portable);
    // And mac_multi runs on it: RFC 2202 test case 2 (HMAC-SHA1, key
    // "Jefe", "what do ya want for nothing?").
    let key = MacKey::new(MacAlg::HmacSha1, b"Jefe", 20).unwrap();
    let mut jobs = [MacJob::new(&key, b"what do ya want for nothing?")];
    mac_multi(&mut jobs);
    let want = [
        0xef, 0xfc, 0xdf, 0x6a, 0xe5, 0xeb, 0x2f, 0xa2, 0xd2, 0x74, 0x16, 0xd5, 0xf1, 0x84, 0xdf, 0x9c, 0x25,
        0x9a, 0x7c, 0x79,
    ];
    assert_eq!(jobs[0].tag[..20], want);
}
