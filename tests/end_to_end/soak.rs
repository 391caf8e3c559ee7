// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The CI soak: the replay tool's soak (`vhost-crypto-replay
//! soak`, `tools/replay/src/soak.rs`) against the daemon binary with two
//! queues, 100,000 requests generated from a seed (mixed sizes up to
//! 16 KiB, encrypt and decrypt, AES-128/192/256, direct and indirect
//! layouts cut at random offsets, sessions rekeyed while other requests are
//! in flight, requests naming closed sessions). The soak checks every
//! completion against the replay tool's reference cipher (RustCrypto
//! `cbc`/`aes` used directly, not through `algorithms`); here every
//! output is checked a second time against OpenSSL, which shares no code
//! with the daemon, and the completions the observer sees are counted per
//! sequence number (each exactly once).
//!
//! The full run (10 million requests) is a command in docs/RELIABILITY.md.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::time::Instant;

use crate::common::daemon::spawn_daemon;
use crate::common::oracle;
use vhost_crypto_replay::frontend::CryptoFrontend;
use vhost_crypto_replay::soak::{soak, Checked, Layouts, SoakOptions, SoakReport, DST_CANARY};
use vhost_user_crypto::wire::session::SessionAbi;

fn run(
    sock: &std::path::Path,
    o: &SoakOptions,
    queues: u16,
    abi: SessionAbi,
    observer: &mut dyn FnMut(&Checked<'_>),
) -> SoakReport {
    let cfg = o.frontend_config(queues, abi);
    let mut fe = CryptoFrontend::connect(sock, &cfg).unwrap();
    soak(&mut fe, o, Some(observer)).unwrap()
}

/// Everything a request is made of, hashed in sequence order.
fn stream_digest(sock: &std::path::Path, o: &SoakOptions) -> u64 {
    let mut reqs: Vec<(u64, u64)> = Vec::new();
    let r = run(sock, o, 2, SessionAbi::C, &mut |c| {
        let mut h = DefaultHasher::new();
        (c.encrypt, c.key, c.iv, c.src, c.stale).hash(&mut h);
        reqs.push((c.seq, h.finish()));
    });
    assert!(r.passed(), "{}", r.summary());
    reqs.sort_unstable();
    let mut h = DefaultHasher::new();
    reqs.hash(&mut h);
    h.finish()
}

#[test]
fn soak_100k_mixed_requests_two_queues_every_output_checked_against_openssl() {
    let _beside_soaks_only = crate::shared();
    let daemon = spawn_daemon(&["--queues", "2"]);
    // The tool's defaults (depth 64, 8 sessions, a rekey every 1,000 and a
    // closed session named every 500 requests, up to 16 KiB, mixed layouts).
    let o = SoakOptions {
        seed: 0x5eed_0005,
        count: 100_000,
        ..SoakOptions::default()
    };
    let mut seen = vec![0u8; o.count as usize];
    let (mut openssl_checked, mut openssl_mismatches, mut stale_untouched) = (0u64, 0u64, 0u64);
    let t = Instant::now();
    let r = run(&daemon.sock, &o, 2, SessionAbi::C, &mut |c| {
        seen[c.seq as usize] += 1;
        if c.stale {
            stale_untouched += u64::from(c.dst.iter().all(|&b| b == DST_CANARY) && c.status == 4);
            return;
        }
        let iv: &[u8; 16] = c.iv;
        let want = oracle(c.encrypt, c.key, iv, c.src);
        openssl_checked += 1;
        if c.dst != want.as_slice() || c.status != 0 || c.used_len as usize != c.src.len() + 1 {
            openssl_mismatches += 1;
        }
    });
    eprintln!(
        "{}(wall time with the OpenSSL checks: {:?})",
        r.summary(),
        t.elapsed()
    );

    assert_eq!(r.error, None);
    assert_eq!(
        (r.requests, r.completed, r.mismatches, r.duplicates, r.missing),
        (100_000, 100_000, 0, 0, 0),
        "{:?}",
        r.first_mismatches
    );
    assert!(r.passed());
    // The observer saw each request exactly once.
    assert!(
        seen.iter().all(|&n| n == 1),
        "a request was seen {} times",
        seen.iter().max().unwrap()
    );
    // OpenSSL agrees on every output.
    assert_eq!(openssl_checked, 100_000 - r.stale_requests);
    assert_eq!(openssl_mismatches, 0);
    // Closed sessions: INVSESS, output untouched.
    assert!(r.stale_requests > 100, "{}", r.stale_requests);
    assert_eq!(stale_untouched, r.stale_requests);
    assert_eq!(r.status_counts.get("invsess"), Some(&r.stale_requests));
    assert_eq!(r.status_counts.get("ok"), Some(&(100_000 - r.stale_requests)));
    // Rekeys happened, with other requests in flight.
    assert_eq!(r.rekeys, 99);
    assert!(r.rekeys_with_requests_in_flight > 0);
    assert_eq!(r.sessions_created, 8 + 99);
    // The mix: both directions, all key sizes, all layouts, both queues.
    assert!(
        r.encrypt > 30_000 && r.decrypt > 30_000,
        "{} / {}",
        r.encrypt,
        r.decrypt
    );
    for bits in [128, 192, 256] {
        assert!(
            r.key_bits.get(&bits).is_some_and(|&n| n > 10_000),
            "{:?}",
            r.key_bits
        );
    }
    for l in ["direct", "direct-cut", "indirect", "indirect-cut"] {
        assert!(r.layouts.get(l).is_some_and(|&n| n > 10_000), "{:?}", r.layouts);
    }
    assert!(r.per_queue.iter().all(|&n| n > 40_000), "{:?}", r.per_queue);
    // Sizes from 16 bytes to 16 KiB, most of them small: 100,000 requests
    // average between 1 and 3 KiB.
    let avg = r.bytes / r.requests;
    assert!((1024..3072).contains(&avg), "average request {avg} bytes");
}

#[test]
fn the_same_seed_gives_the_same_requests_whatever_the_timing() {
    let _beside_soaks_only = crate::shared();
    // Two daemons that complete at different times: one polls after each
    // batch, one sleeps on the kick at once.
    let polling = spawn_daemon(&["--queues", "2"]);
    let sleeping = spawn_daemon(&["--queues", "2", "--poll-us", "0"]);
    let o = SoakOptions {
        seed: 42,
        count: 3000,
        queue_depth: 16,
        rekey_every: 100,
        ..SoakOptions::default()
    };
    let a = stream_digest(&polling.sock, &o);
    let b = stream_digest(&sleeping.sock, &o);
    let c = stream_digest(&polling.sock, &SoakOptions { seed: 43, ..o });
    assert_eq!(a, b, "the timing changed the generated requests");
    assert_ne!(a, c, "another seed gave the same requests");
}

#[test]
fn a_backend_that_fails_requests_fails_the_soak() {
    let _beside_soaks_only = crate::shared();
    // Requests over 4 KiB are refused with ERR by this daemon.
    let daemon = spawn_daemon(&["--queues", "2", "--max-request-bytes", "4096"]);
    let o = SoakOptions {
        seed: 3,
        count: 2000,
        layouts: Layouts::Indirect,
        ..SoakOptions::default()
    };
    let mut big = 0u64;
    let r = run(&daemon.sock, &o, 2, SessionAbi::A, &mut |c| {
        big += u64::from(c.src.len() > 4096 && !c.stale);
    });
    assert!(big > 0);
    assert_eq!(r.mismatches, big, "{:?}", r.first_mismatches);
    assert!(!r.passed());
    assert!(
        r.first_mismatches[0].contains("status err (expected ok)"),
        "{:?}",
        r.first_mismatches
    );
    assert_eq!((r.completed, r.missing, r.duplicates), (2000, 0, 0));
}
