// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Daemon + replay tool over a real socket: the shipped known-answer and
//! hostile-guest traces in all three session layouts, with direct chains
//! and indirect tables, several queues, many connections in a row against
//! one daemon, and a trace whose expectation is wrong (the check can fail).

use std::path::Path;
use std::time::Duration;

use vhost_crypto_replay::frontend::{CryptoFrontend, DescMode, FrontendConfig};
use vhost_crypto_replay::replay::{replay, replay_threads, ReplayOptions, Report};
use vhost_crypto_replay::trace::Trace;
use vhost_user_crypto::wire::session::SessionAbi;

#[path = "common/daemon.rs"]
mod daemon;
#[path = "../../../tests/common/frontend_config.rs"]
mod frontend_config;
use daemon::spawn_daemon;
use frontend_config::one_queue;

fn trace(name: &str) -> Trace {
    Trace::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../traces").join(name)).unwrap()
}

fn run(sock: &Path, t: &Trace, abi: SessionAbi, mode: DescMode, queues: u16) -> Report {
    let cfg = FrontendConfig {
        queues,
        queue_size: 256,
        queue_depth: 32,
        max_payload: t.max_payload().max(16),
        max_iv: t.max_iv().max(16),
        memory_bytes: 0,
        session_abi: abi,
        desc_mode: mode,
        dpdk: false,
    };
    let mut fe = CryptoFrontend::connect(sock, &cfg).unwrap();
    let opts = ReplayOptions {
        repeat: 1,
        queue_depth: 32,
        timeout: Duration::from_secs(10),
        progress: false,
        record: false,
    };
    replay(&mut fe, t, &opts).unwrap()
}

#[test]
fn known_answer_and_hostile_traces_in_every_layout() {
    let daemon = spawn_daemon(&[]);
    for (name, requests) in [
        ("nist-sp800-38a.jsonl", 18),
        ("wycheproof-aes-cbc.jsonl", 144),
        ("status-policy.jsonl", 8),
        ("hostile-guest.jsonl", 42),
        ("chaining.jsonl", 85),
        ("chaining-dpdk.jsonl", 39),
    ] {
        let t = trace(name);
        for abi in [SessionAbi::A, SessionAbi::B, SessionAbi::C] {
            for mode in [DescMode::Indirect, DescMode::Chain] {
                if name == "hostile-guest.jsonl" && mode == DescMode::Indirect {
                    // It has direct-chain raw requests: those need a queue
                    // in chain mode (its other requests are indirect tables).
                    continue;
                }
                // Every run is a new connection to the same daemon.
                let r = run(daemon.socket(), &t, abi, mode, 1);
                assert_eq!(
                    r.mismatches, 0,
                    "{name} {abi:?} {mode:?}: {:?}",
                    r.first_mismatches
                );
                assert_eq!(r.requests, requests, "{name} {abi:?} {mode:?}");
            }
        }
    }
}

#[test]
fn one_thread_per_queue_checks_every_queue() {
    let daemon = spawn_daemon(&["--queues", "4"]);
    // NIST SP 800-38A F.2.5 (AES-256-CBC encrypt) block 1 pinned to queue
    // 3, and F.2.1's (AES-128) first block with a wrong expected dst (its
    // last byte changed) on queue 2: that one must be reported.
    let t = Trace::parse(
        r#"{"op":"create_session","name":"e","algo":"aes-cbc","key":"603deb1015ca71be2b73aef0857d77811f352c073b6108d72d9810a30914dff4","direction":"encrypt"}
{"op":"create_session","name":"d","algo":"aes-cbc","key":"603deb1015ca71be2b73aef0857d77811f352c073b6108d72d9810a30914dff4","direction":"decrypt"}
{"op":"create_session","name":"h","algo":"aes-cbc","key":"000102030405060708090a0b0c0d0e0f","direction":"decrypt","mac":"hmac-sha1","auth_key":"0b0b","digest_len":12}
{"op":"create_session","name":"k","algo":"aes-cbc","key":"2b7e151628aed2a6abf7158809cf4f3c","direction":"encrypt"}
{"op":"generate","session":"e","opcode":"encrypt","size":1024,"count":2000,"seed":5}
{"op":"generate","session":"d","opcode":"decrypt","size":64,"count":2000,"seed":6}
{"op":"generate","session":"h","opcode":"decrypt","size":1500,"count":400,"seed":7,"in_place":true}
{"op":"request","session":"e","queue":3,"opcode":"encrypt","iv":"000102030405060708090a0b0c0d0e0f","src":"6bc1bee22e409f96e93d7e117393172a","expect":{"status":"ok","dst":"f58c4c04d6e5f1ba779eabfb5f7bfbd6"}}
{"op":"request","session":"k","queue":2,"opcode":"encrypt","iv":"000102030405060708090a0b0c0d0e0f","src":"6bc1bee22e409f96e93d7e117393172a","expect":{"status":"ok","dst":"7649abac8119b246cee98e9b12e9197e"}}
"#
        .as_bytes(),
    )
    .unwrap();
    let cfg = FrontendConfig {
        queues: 4,
        queue_size: 256,
        queue_depth: 32,
        max_payload: t.max_payload(),
        max_iv: 16,
        memory_bytes: 0,
        session_abi: SessionAbi::C,
        desc_mode: DescMode::Indirect,
        dpdk: false,
    };
    let mut fe = CryptoFrontend::connect(daemon.socket(), &cfg).unwrap();
    let opts = ReplayOptions {
        repeat: 2,
        queue_depth: 32,
        timeout: Duration::from_secs(10),
        progress: false,
        record: false,
    };
    let r = replay_threads(&mut fe, &t, &opts).unwrap();
    assert_eq!(
        (r.requests, r.mismatches),
        (2 * 4402, 2),
        "{:?}",
        r.first_mismatches
    );
    assert_eq!(r.status_counts.get("ok"), Some(&(2 * 4402)));
    assert!(
        r.first_mismatches
            .iter()
            .all(|m| m.line == 9 && m.field.contains("dst")),
        "{:?}",
        r.first_mismatches
    );
    assert!(r.error.is_none());
    // Each of the 4 threads creates the 4 sessions in each of the 2 passes.
    assert_eq!(r.sessions_created, 2 * 4 * 4);
    // The frontend has its queues back: a plain replay on it still works.
    assert_eq!(fe.queues.len(), 4);
    let r = replay(&mut fe, &t, &ReplayOptions { repeat: 1, ..opts }).unwrap();
    assert_eq!((r.requests, r.mismatches), (4402, 1), "{:?}", r.first_mismatches);
}

#[test]
fn several_queues() {
    let daemon = spawn_daemon(&["--queues", "4"]);
    let t = Trace::parse(
        r#"{"op":"create_session","name":"e","algo":"aes-cbc","key":"603deb1015ca71be2b73aef0857d77811f352c073b6108d72d9810a30914dff4","direction":"encrypt"}
{"op":"create_session","name":"d","algo":"aes-cbc","key":"603deb1015ca71be2b73aef0857d77811f352c073b6108d72d9810a30914dff4","direction":"decrypt"}
{"op":"generate","session":"e","opcode":"encrypt","size":1024,"count":2000,"seed":5}
{"op":"generate","session":"d","opcode":"decrypt","size":64,"count":2000,"seed":6}
{"op":"request","session":"e","queue":3,"opcode":"encrypt","iv":"000102030405060708090a0b0c0d0e0f","src":"6bc1bee22e409f96e93d7e117393172a","expect":{"status":"ok","dst":"f58c4c04d6e5f1ba779eabfb5f7bfbd6"}}
"#
        .as_bytes(),
    )
    .unwrap();
    for mode in [DescMode::Indirect, DescMode::Chain] {
        let r = run(daemon.socket(), &t, SessionAbi::C, mode, 4);
        assert_eq!(
            (r.requests, r.mismatches),
            (4001, 0),
            "{mode:?}: {:?}",
            r.first_mismatches
        );
        assert_eq!(r.status_counts.get("ok"), Some(&4001));
    }
}

#[test]
fn generated_chained_requests_and_wrong_digests() {
    let daemon = spawn_daemon(&[]);
    // Generated chained requests (expected values from the tool's reference
    // cipher, RustCrypto cbc + aes, and RustCrypto hmac) in both directions, out of place and in place,
    // with a cipher range starting at 1500 % 16 = 12.
    let t = Trace::parse(
        r#"{"op":"create_session","name":"e","algo":"aes-cbc","key":"000102030405060708090a0b0c0d0e0f","direction":"encrypt","mac":"hmac-sha256","auth_key":"0b0b","digest_len":16}
{"op":"create_session","name":"d","algo":"aes-cbc","key":"000102030405060708090a0b0c0d0e0f","direction":"decrypt","mac":"hmac-sha256","auth_key":"0b0b","digest_len":16}
{"op":"generate","session":"e","opcode":"encrypt","size":1500,"count":300,"seed":1}
{"op":"generate","session":"d","opcode":"decrypt","size":1500,"count":300,"seed":2,"in_place":true}
{"op":"generate","session":"e","opcode":"encrypt","size":64,"count":300,"seed":3,"in_place":true}
"#
        .as_bytes(),
    )
    .unwrap();
    let r = run(daemon.socket(), &t, SessionAbi::A, DescMode::Indirect, 1);
    assert_eq!((r.requests, r.mismatches), (900, 0), "{:?}", r.first_mismatches);
    assert_eq!(r.status_counts.get("ok"), Some(&900));

    // RFC 4231 §4.2's key and data as a MAC-only request (len_to_cipher 0):
    // the expected digest is the RFC's, one with its last byte changed must
    // be reported, and so must a wrong digest supplied on decrypt.
    let t = Trace::parse(
        r#"{"op":"create_session","name":"e","algo":"aes-cbc","key":"000102030405060708090a0b0c0d0e0f","direction":"encrypt","mac":"hmac-sha256","auth_key":"0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b"}
{"op":"create_session","name":"d","algo":"aes-cbc","key":"000102030405060708090a0b0c0d0e0f","direction":"decrypt","mac":"hmac-sha256","auth_key":"0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b"}
{"op":"request","session":"e","opcode":"encrypt","iv":"000102030405060708090a0b0c0d0e0f","src":"4869205468657265","cipher_len":0,"expect":{"status":"ok","dst":"4869205468657265","digest":"b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"}}
{"op":"request","session":"e","opcode":"encrypt","iv":"000102030405060708090a0b0c0d0e0f","src":"4869205468657265","cipher_len":0,"expect":{"status":"ok","dst":"4869205468657265","digest":"b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff8"}}
{"op":"request","session":"d","opcode":"decrypt","iv":"000102030405060708090a0b0c0d0e0f","src":"4869205468657265","cipher_len":0,"digest":"b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7","expect":{"status":"ok","dst":"4869205468657265"}}
{"op":"request","session":"d","opcode":"decrypt","iv":"000102030405060708090a0b0c0d0e0f","src":"4869205468657265","cipher_len":0,"digest":"b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff6","expect":{"status":"ok","dst":"4869205468657265"}}
"#
        .as_bytes(),
    )
    .unwrap();
    let r = run(daemon.socket(), &t, SessionAbi::C, DescMode::Chain, 1);
    assert_eq!(r.requests, 4);
    assert_eq!(r.mismatches, 2, "{:?}", r.first_mismatches);
    assert_eq!(
        (r.first_mismatches[0].line, r.first_mismatches[0].field.as_str()),
        (4, "hash result")
    );
    assert_eq!(
        (r.first_mismatches[1].line, r.first_mismatches[1].field.as_str()),
        (6, "status")
    );
}

#[test]
fn a_wrong_expectation_is_reported_with_its_line() {
    let daemon = spawn_daemon(&[]);
    // F.2.1's first block with its last ciphertext byte changed.
    let t = Trace::parse(
        r#"{"op":"create_session","name":"s1","algo":"aes-cbc","key":"2b7e151628aed2a6abf7158809cf4f3c","direction":"encrypt"}
{"op":"request","session":"s1","opcode":"encrypt","iv":"000102030405060708090a0b0c0d0e0f","src":"6bc1bee22e409f96e93d7e117393172a","expect":{"status":"ok","dst":"7649abac8119b246cee98e9b12e9197e"}}
{"op":"request","session":"s1","opcode":"encrypt","iv":"000102030405060708090a0b0c0d0e0f","src":"6bc1bee22e409f96e93d7e117393172a","expect":{"status":"err"}}
"#
        .as_bytes(),
    )
    .unwrap();
    let r = run(daemon.socket(), &t, SessionAbi::B, DescMode::Indirect, 1);
    assert_eq!(r.mismatches, 2);
    assert_eq!(r.first_mismatches[0].line, 2);
    assert_eq!(r.first_mismatches[0].field, "dst[15..16]");
    assert_eq!(
        (
            r.first_mismatches[0].expected.as_str(),
            r.first_mismatches[0].got.as_str()
        ),
        ("7e", "7d")
    );
    assert_eq!(r.first_mismatches[1].line, 3);
    assert_eq!(r.first_mismatches[1].field, "status");
}

/// A request skipped because it names a queue the frontend does not have
/// must not leave the replay tool's reused header behind: the request
/// after it has the same header key as the skipped one (same session and
/// length) but gets a header built for itself, not the previous request's
/// (64 bytes: the daemon would then encrypt the wrong length). Expected
/// ciphertexts from `openssl enc -aes-128-cbc -nopad`.
#[test]
fn a_request_after_a_skipped_one_gets_its_own_header() {
    let daemon = spawn_daemon(&[]);
    let t = Trace::parse(
        r#"{"op":"create_session","name":"e","algo":"aes-cbc","key":"000102030405060708090a0b0c0d0e0f","direction":"encrypt"}
{"op":"request","session":"e","opcode":"encrypt","iv":"00000000000000000000000000000000","src":"00000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000","expect":{"status":"ok","dst":"c6a13b37878f5b826f4f8162a1c8d879af9d9926f7dac87192b1c4143ad989581d2bd041b903bc5fa2dca1378dc1f3e21a5dc985cd7ef056004b9377cb3aaad0"}}
{"op":"request","session":"e","opcode":"encrypt","iv":"00000000000000000000000000000000","src":"000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f","queue":7,"expect":{"status":"ok","dst":"0a940bb5416ef045f1c39458c653ea5a3cf456b4ca488aa383c79c98b34797cb"}}
{"op":"request","session":"e","opcode":"encrypt","iv":"00000000000000000000000000000000","src":"000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f","expect":{"status":"ok","dst":"0a940bb5416ef045f1c39458c653ea5a3cf456b4ca488aa383c79c98b34797cb"}}
"#
        .as_bytes(),
    )
    .unwrap();
    let r = run(daemon.socket(), &t, SessionAbi::B, DescMode::Indirect, 1);
    assert_eq!(r.requests, 2);
    assert_eq!(r.mismatches, 1, "{:?}", r.first_mismatches);
    assert_eq!(r.first_mismatches[0].line, 3);
    assert_eq!(r.first_mismatches[0].field, "queue");
}

#[test]
fn a_backend_that_stops_completing_ends_the_run_with_a_report() {
    use vhost_crypto_replay::gen::{generate, GenOpcode, GenOptions};
    let daemon = spawn_daemon(&[]);
    let mut text = Vec::new();
    generate(
        &GenOptions {
            opcode: GenOpcode::Encrypt,
            size: 64,
            count: 20_000,
            sessions: 1,
            key_bits: 128,
            seed: 1,
            expanded: false,
        },
        &mut text,
    )
    .unwrap();
    let t = Trace::parse(&text[..]).unwrap();
    let cfg = one_queue(256, 32);
    let mut fe = CryptoFrontend::connect(daemon.socket(), &cfg).unwrap();
    let opts = ReplayOptions {
        repeat: 100_000,
        queue_depth: 32,
        timeout: Duration::from_secs(1),
        progress: false,
        record: false,
    };
    // The daemon stops (SIGSTOP) while the requests run, and goes on after
    // the report (so it can be killed).
    let pid = daemon.pid() as libc::pid_t;
    let stopper = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        // SAFETY: kill(2) of our child, not reaped yet.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
    });
    let r = replay(&mut fe, &t, &opts).unwrap();
    stopper.join().unwrap();
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let error = r.error.as_deref().unwrap_or_default();
    // Stopped in the middle of the requests (nearly always: 20,000 of them
    // per repeat) or, rarely, of a session message (the CREATE, or the
    // GET_FEATURES after a CLOSE).
    assert!(
        error == "timed out waiting for completions" && r.missing > 0
            || error.starts_with("the backend did not answer ") && r.missing == 0,
        "error {error:?}, {} missing",
        r.missing
    );
    assert!(
        r.requests > 0 && r.requests < 20_000 * 100_000,
        "{} requests",
        r.requests
    );
    assert_eq!(r.mismatches, 1, "{:?}", r.first_mismatches);
    assert!(r.summary().contains("STOPPED:     timed out") || r.missing == 0);
}

#[test]
fn a_backend_that_never_answers_the_handshake_is_an_error_after_the_control_timeout() {
    use vhost_crypto_replay::frontend::{Error, CONTROL_TIMEOUT};
    // Accepts connections (the backlog does) and never reads or answers,
    // like a daemon busy with another frontend.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("silent.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let cfg = one_queue(64, 8);
    let t0 = std::time::Instant::now();
    let r = CryptoFrontend::connect(&path, &cfg);
    let took = t0.elapsed();
    match r {
        Err(e @ Error::NoAnswer("the vhost-user handshake")) => assert_eq!(
            e.to_string(),
            "the backend did not answer the vhost-user handshake within 10 s (is it serving another frontend?)"
        ),
        Err(e) => panic!("error {e}"),
        Ok(_) => panic!("connected to a backend that never answers"),
    }
    assert!(
        took >= CONTROL_TIMEOUT && took < CONTROL_TIMEOUT + Duration::from_secs(5),
        "gave up after {took:?}"
    );
}

/// A wait for completions after this tool shut the connection down itself
/// (a control message the backend did not answer within the control
/// timeout) ends at once, saying so: the end of the connection is not
/// reported as the backend's doing, nor waited out to the timeout.
#[test]
fn a_wait_after_the_tool_shut_the_connection_down_says_so() {
    use vhost_crypto_replay::frontend::Error;
    let daemon = spawn_daemon(&[]);
    let mut fe = CryptoFrontend::connect(daemon.socket(), &one_queue(64, 8)).unwrap();
    let pid = daemon.pid() as libc::pid_t;
    // SAFETY: kill(2) of our child, not reaped yet.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    // Stopped before the request goes out (kill(2) returns before the
    // stop takes effect); WUNTRACED reports the stop and reaps nothing.
    let mut status = 0;
    // SAFETY: waitpid(2) of our child with a valid status pointer.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, libc::WUNTRACED) }, pid);
    assert!(libc::WIFSTOPPED(status), "status {status:#x}");
    // One request in flight that the stopped daemon does not complete.
    let q = &mut fe.queues[0];
    let slot = q.next_slot().expect("a free slot");
    q.submit(slot, 16, 64);
    q.publish_and_kick().unwrap();
    // Unanswered: the tool shuts the socket down after the timeout.
    let e = fe.get_vring_base(0).unwrap_err();
    assert!(matches!(e, Error::NoAnswer("GET_VRING_BASE")), "{e}");
    let t0 = std::time::Instant::now();
    let r = fe.queues[0].reap(&mut Vec::new(), Duration::from_secs(30));
    let took = t0.elapsed();
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    match r {
        Err(e @ Error::ShutHere) => assert_eq!(
            e.to_string(),
            "the connection was shut down after an earlier failure"
        ),
        other => panic!("{other:?}"),
    }
    assert!(took < Duration::from_secs(2), "{took:?}");
}

#[test]
fn a_long_repeat_closes_each_pass_sessions_before_creating_them_again() {
    // Each pass creates the trace's session again. Without the close before
    // the next pass, the daemon's 1,024 live sessions per connection ran
    // out: from pass 1,025 on, CREATE answered a negative id (a mismatch
    // each) and requests named a closed-over id.
    let daemon = spawn_daemon(&[]);
    let t = Trace::parse(
        &br#"{"op":"create_session","name":"s","algo":"aes-cbc","key":"2b7e151628aed2a6abf7158809cf4f3c","direction":"encrypt"}
{"op":"request","session":"s","opcode":"encrypt","iv":"000102030405060708090a0b0c0d0e0f","src":"6bc1bee22e409f96e93d7e117393172a","expect":{"status":"ok","dst":"7649abac8119b246cee98e9b12e9197d"}}
"#[..],
    )
    .unwrap();
    let mut fe = CryptoFrontend::connect(daemon.socket(), &one_queue(256, 16)).unwrap();
    let opts = ReplayOptions {
        repeat: 1_100,
        queue_depth: 1,
        timeout: Duration::from_secs(10),
        progress: false,
        record: false,
    };
    let r = replay(&mut fe, &t, &opts).unwrap();
    assert_eq!(
        (r.mismatches, r.requests, r.sessions_created),
        (0, 1_100, 1_100),
        "{:?}",
        r.first_mismatches
    );
}
