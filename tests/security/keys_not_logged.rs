// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Key material never reaches the daemon's log, at the most verbose level.
//!
//! The daemon runs with `RUST_LOG=trace` (every crate, vhost-user-backend
//! and vhost included) while a frontend creates cipher and chaining
//! sessions in all three layouts, with accepted and refused keys, runs
//! requests, and closes them. The test then looks for every key in the log:
//! as hex (either case), as decimal byte lists (`Debug` of a slice or
//! array), and as raw bytes. The check can fail: the same search finds the
//! key in a log line written on purpose (`key_search_finds_a_planted_key`).

use std::time::Duration;

use crate::common::daemon::spawn_daemon_logged;
use crate::common::frontend_config::one_queue;
use vhost_crypto_replay::frontend::{CryptoFrontend, FrontendConfig};
use vhost_crypto_replay::replay::{replay, ReplayOptions};
use vhost_crypto_replay::trace::{hex, Trace};
use vhost_user_crypto::wire::session::SessionAbi;

/// Distinctive keys: no run of them occurs by chance in a log.
fn keys() -> Vec<Vec<u8>> {
    vec![
        (0..16).map(|i| 0xC0 ^ (i * 7) as u8).collect(),  // AES-128
        (0..32).map(|i| 0x3A ^ (i * 13) as u8).collect(), // AES-256
        (0..17).map(|i| 0x5D ^ (i * 3) as u8).collect(),  // refused: 17 bytes
        (0..20).map(|i| 0xA7 ^ (i * 11) as u8).collect(), // HMAC key
        (0..100).map(|i| 0x1F ^ (i as u8).wrapping_mul(29)).collect(), // long HMAC key
    ]
}

/// Every way a key could show up in text: hex (lower, upper, with
/// separators), `Debug` of its bytes, or the bytes themselves. Only the
/// first 8 bytes are searched, so partial dumps are caught too.
fn needles(key: &[u8]) -> Vec<Vec<u8>> {
    let k = &key[..8.min(key.len())];
    let lower = hex(k);
    vec![
        lower.clone().into_bytes(),
        lower.to_uppercase().into_bytes(),
        k.iter()
            .map(|b| format!("{b:02x} "))
            .collect::<String>()
            .trim_end()
            .as_bytes()
            .to_vec(),
        k.iter()
            .map(|b| format!("{b:#04x}, "))
            .collect::<String>()
            .into_bytes(),
        k.iter()
            .map(|b| format!("{b:02x}, "))
            .collect::<String>()
            .into_bytes(),
        format!("{:?}", k).trim_end_matches(']').as_bytes().to_vec(),
        k.to_vec(),
    ]
}

fn find(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

fn trace_for(keys: &[Vec<u8>]) -> String {
    let (k128, k256, k17, a20, a100) = (&keys[0], &keys[1], &keys[2], &keys[3], &keys[4]);
    let iv = "000102030405060708090a0b0c0d0e0f";
    let src = "6bc1bee22e409f96e93d7e117393172aae2d8a571e03ac9c9eb76fac45af8e51";
    format!(
        r#"{{"op":"create_session","name":"e","algo":"aes-cbc","key":"{k128}","direction":"encrypt"}}
{{"op":"create_session","name":"d","algo":"aes-cbc","key":"{k256}","direction":"decrypt"}}
{{"op":"create_session","name":"bad","algo":"aes-cbc","key":"{k17}","direction":"encrypt","expect":{{"status":"err"}}}}
{{"op":"create_session","name":"ce","algo":"aes-cbc","key":"{k128}","direction":"encrypt","mac":"hmac-sha1","auth_key":"{a20}","digest_len":12}}
{{"op":"create_session","name":"cd","algo":"aes-cbc","key":"{k256}","direction":"decrypt","mac":"hmac-sha256","auth_key":"{a100}"}}
{{"op":"create_session","name":"cbad","algo":"aes-cbc","key":"{k128}","direction":"encrypt","mac":"hmac-sha1","auth_key":"{a100}","digest_len":21,"expect":{{"status":"err"}}}}
{{"op":"generate","session":"e","opcode":"encrypt","size":64,"count":20,"seed":1}}
{{"op":"generate","session":"d","opcode":"decrypt","size":64,"count":20,"seed":2}}
{{"op":"generate","session":"ce","opcode":"encrypt","size":100,"count":20,"seed":3}}
{{"op":"generate","session":"cd","opcode":"decrypt","size":96,"count":20,"seed":4}}
{{"op":"request","session":"e","opcode":"decrypt","iv":"{iv}","src":"{src}","expect":{{"status":"err"}}}}
{{"op":"close_session","name":"e"}}
{{"op":"close_session","name":"d"}}
{{"op":"close_session","name":"ce"}}
{{"op":"close_session","name":"cd"}}
"#,
        k128 = hex(k128),
        k256 = hex(k256),
        k17 = hex(k17),
        a20 = hex(a20),
        a100 = hex(a100),
    )
}

#[test]
fn keys_never_reach_the_trace_level_log() {
    let mut daemon = spawn_daemon_logged(&[], "trace");
    let sock = daemon.sock.clone();
    let keys = keys();
    let trace = Trace::parse(trace_for(&keys).as_bytes()).unwrap();
    for abi in [SessionAbi::A, SessionAbi::B, SessionAbi::C] {
        let cfg = FrontendConfig {
            max_payload: trace.max_payload().max(16),
            session_abi: abi,
            ..one_queue(64, 8)
        };
        let mut fe = CryptoFrontend::connect(&sock, &cfg).unwrap();
        let opts = ReplayOptions {
            repeat: 1,
            queue_depth: 8,
            timeout: Duration::from_secs(10),
            progress: false,
            record: false,
        };
        let r = replay(&mut fe, &trace, &opts).unwrap();
        assert_eq!(
            (r.requests, r.mismatches),
            (81, 0),
            "{abi:?}: {:?}",
            r.first_mismatches
        );
    }
    // Let the daemon log the last disconnect, then stop it.
    std::thread::sleep(Duration::from_millis(300));
    daemon.stop();
    let log_path = daemon.log().to_path_buf();
    let text = std::fs::read(&log_path).unwrap();
    assert!(
        text.len() > 1000 && (find(&text, b"TRACE") || find(&text, b"DEBUG")),
        "the log is not verbose ({} bytes)",
        text.len()
    );
    assert!(
        find(&text, b"CREATE_CRYPTO_SESSION refused"),
        "refused creates are logged"
    );
    for (i, key) in keys.iter().enumerate() {
        for n in needles(key) {
            assert!(
                !find(&text, &n),
                "key {i} found in the daemon log as {:?} (log: {})",
                String::from_utf8_lossy(&n),
                log_path.display()
            );
        }
    }
}

#[test]
fn key_search_finds_a_planted_key() {
    let key: Vec<u8> = (0..16).map(|i| 0xC0 ^ (i * 7) as u8).collect();
    for line in [
        format!("[INFO] session key {}", hex(&key)),
        format!("[INFO] key {:?}", key),
        format!("[INFO] KEY {}", hex(&key).to_uppercase()),
        format!("[TRACE] key {:02x?}", Some(&key[..])),
    ] {
        assert!(needles(&key).iter().any(|n| find(line.as_bytes(), n)), "{line}");
    }
    assert!(!needles(&key)
        .iter()
        .any(|n| find(b"[INFO] session 1 created (Encrypt, 128 bits)", n)));
}
