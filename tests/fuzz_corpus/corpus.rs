// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The checked-in corpus and the seed programs, replayed.

use std::fs;
use std::path::{Path, PathBuf};

use crate::common;
use crate::harness::{engines, queue, seeds, session, socket};
use algorithms::Direction;

/// OpenSSL's AES-CBC (no padding, [`common::oracle`]) as the `queue`
/// harness's reference.
fn openssl_reference(direction: Direction, key: &[u8], iv: &[u8; 16], data: &mut [u8]) -> bool {
    if !matches!(key.len(), 16 | 24 | 32) || !data.len().is_multiple_of(16) {
        return false;
    }
    let out = common::oracle(direction == Direction::Encrypt, key, iv, data);
    data.copy_from_slice(&out);
    true
}

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tools/fuzz/corpus")
        .join(target)
}

fn corpus_files(target: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(corpus_dir(target))
        .unwrap_or_else(|e| panic!("corpus/{target}: {e}"))
        .map(|e| e.expect("corpus entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

/// Each seed's file holds exactly its encoding (or is rewritten).
fn check_seed_files(target: &str, seeds: &[(&str, Vec<u8>)]) {
    let regen = std::env::var_os("FUZZ_CORPUS_REGEN").is_some();
    for (name, bytes) in seeds {
        let path = corpus_dir(target).join(name);
        if regen {
            fs::write(&path, bytes).expect("write seed");
            continue;
        }
        let on_disk = fs::read(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (run with FUZZ_CORPUS_REGEN=1 to write the seeds)",
                path.display()
            )
        });
        assert!(
            &on_disk == bytes,
            "{} is stale (run with FUZZ_CORPUS_REGEN=1)",
            path.display()
        );
    }
}

/// Each of `target`'s seed programs decodes from its own encoding to
/// itself, and its corpus file holds that encoding ([`check_seed_files`]).
fn check_seeds<P: PartialEq + std::fmt::Debug>(
    target: &str,
    seeds: &[(&'static str, P)],
    encode: impl Fn(&P) -> Vec<u8>,
    decode: impl Fn(&[u8]) -> P,
) {
    let mut encoded = Vec::new();
    for (name, p) in seeds {
        let bytes = encode(p);
        assert_eq!(&decode(&bytes), p, "seed {name} round trip");
        encoded.push((*name, bytes));
    }
    check_seed_files(target, &encoded);
}

#[test]
fn queue_seeds_are_in_the_corpus_and_round_trip() {
    let seeds = seeds::queue_seeds();
    assert!(seeds.len() >= 30, "{} queue seeds", seeds.len());
    check_seeds(
        "queue",
        &seeds,
        queue::QueueProgram::encode,
        queue::QueueProgram::decode,
    );
}

#[test]
fn session_seeds_are_in_the_corpus_and_round_trip() {
    check_seeds(
        "session",
        &seeds::session_seeds(),
        session::SessionProgram::encode,
        session::SessionProgram::decode,
    );
}

#[test]
fn engines_seeds_are_in_the_corpus_and_round_trip() {
    check_seeds(
        "engines",
        &seeds::engines_seeds(),
        engines::EnginesProgram::encode,
        engines::EnginesProgram::decode,
    );
}

#[test]
fn socket_seeds_are_in_the_corpus_and_round_trip() {
    check_seeds(
        "socket",
        &socket::seeds(),
        socket::SocketProgram::encode,
        socket::SocketProgram::decode,
    );
}

#[test]
fn replay_engines_corpus() {
    let mut total = engines::Outcome::default();
    let files = corpus_files("engines");
    for f in &files {
        let data = fs::read(f).expect("read corpus file");
        let o = engines::run(&data);
        total.lanes_encrypted += o.lanes_encrypted;
        total.lanes_decrypted += o.lanes_decrypted;
        total.bytes += o.bytes;
        total.tags += o.tags;
        total.vaes_decrypts += o.vaes_decrypts;
    }
    eprintln!("engines corpus: {} files, {total:?}", files.len());
    // Not vacuous: lanes and tags on every engine were checked against
    // RustCrypto.
    assert!(files.len() >= 4);
    let aes_engines = algorithms::AesEngine::available().len() as u64;
    let sha_engines = algorithms::ShaEngine::available().count() as u64;
    assert!(total.lanes_encrypted >= 28 * aes_engines, "{total:?}");
    assert!(total.lanes_decrypted >= 28, "{total:?}");
    assert!(total.tags >= 33 * (sha_engines + 1), "{total:?}");
}

#[test]
fn replay_queue_corpus() {
    let mut total = queue::Outcome::default();
    let files = corpus_files("queue");
    for f in &files {
        let data = fs::read(f).expect("read corpus file");
        let o = queue::run_with(&data, openssl_reference);
        total.batches += o.batches;
        total.completed += o.completed;
        total.verified += o.verified;
        total.verified_ok += o.verified_ok;
        total.contained += o.contained;
    }
    eprintln!("queue corpus: {} files, {total:?}", files.len());
    // The replay is not vacuous: requests ran, were checked against
    // OpenSSL, and the write-containment check ran.
    assert!(files.len() >= 30);
    assert!(total.verified_ok >= 50, "{total:?}");
    assert!(total.verified > total.verified_ok, "{total:?}");
    assert!(total.contained >= total.batches / 2, "{total:?}");
}

#[test]
fn replay_session_corpus() {
    let mut total = session::Outcome::default();
    let files = corpus_files("session");
    for f in &files {
        let data = fs::read(f).expect("read corpus file");
        let o = session::run(&data);
        total.creates += o.creates;
        total.created += o.created;
        total.closes += o.closes;
        total.closed += o.closed;
    }
    eprintln!("session corpus: {} files, {total:?}", files.len());
    assert!(files.len() >= 8);
    assert!(total.created >= 10 && total.closed >= 2, "{total:?}");
}

#[test]
fn replay_socket_corpus() {
    let mut total = socket::Outcome::default();
    let files = corpus_files("socket");
    for f in &files {
        let data = fs::read(f).expect("read corpus file");
        let o = socket::run(&data);
        total.pieces += o.pieces;
        total.messages += o.messages;
        total.fds += o.fds;
        total.ends += o.ends;
        total.truncated += o.truncated;
        total.refused += o.refused;
        total.count_refused += o.count_refused;
        total.tables += o.tables;
        total.tables_ok += o.tables_ok;
    }
    eprintln!("socket corpus: {} files, {total:?}", files.len());
    // Not vacuous: whole messages with descriptors, each way a stream ends,
    // and memory tables both accepted and refused.
    assert!(files.len() >= 12);
    assert!(total.messages >= 30 && total.fds >= 10, "{total:?}");
    assert!(
        total.ends >= 2 && total.truncated >= 2 && total.refused >= 2,
        "{total:?}"
    );
    assert!(total.count_refused >= 1, "{total:?}");
    assert!(
        total.tables_ok >= 3 && total.tables >= total.tables_ok + 4,
        "{total:?}"
    );
}

#[test]
fn arbitrary_bytes_decode_and_run() {
    // Any input is a program: short, empty and patterned inputs run clean.
    let mut inputs: Vec<Vec<u8>> = vec![Vec::new(), vec![0], vec![0xFF; 3], vec![0xAA; 200]];
    let mut rng = common::Rng::new(0x1234_5678_9abc_def1);
    for n in [17usize, 64, 300, 1000] {
        inputs.push(rng.bytes(n));
    }
    for i in &inputs {
        queue::run_with(i, openssl_reference);
        session::run(i);
        engines::run(i);
        socket::run(i);
    }
}

/// `FUZZ_REPLAY=<file> [FUZZ_TARGET=queue|session|engines|socket] cargo test --test
/// fuzz_corpus replay_one -- --ignored --nocapture` prints the decoded
/// program of one input (a crash artifact, say) and runs it. A tool, not a
/// check: ignored unless asked for.
#[test]
#[ignore = "a tool: run with FUZZ_REPLAY=<file> and --ignored"]
fn replay_one() {
    let path = std::env::var_os("FUZZ_REPLAY").expect("FUZZ_REPLAY=<file> names the input to replay");
    let data = fs::read(&path).expect("read FUZZ_REPLAY");
    if std::env::var("FUZZ_TARGET").as_deref() == Ok("engines") {
        eprintln!("{:#?}", engines::EnginesProgram::decode(&data));
        eprintln!("{:?}", engines::run(&data));
    } else if std::env::var("FUZZ_TARGET").as_deref() == Ok("socket") {
        eprintln!("{:#?}", socket::SocketProgram::decode(&data));
        eprintln!("{:?}", socket::run(&data));
    } else if std::env::var("FUZZ_TARGET").as_deref() == Ok("session") {
        eprintln!("{:#?}", session::SessionProgram::decode(&data));
        eprintln!("{:?}", session::run(&data));
    } else {
        eprintln!("{:#?}", queue::QueueProgram::decode(&data));
        eprintln!("{:?}", queue::run_with(&data, openssl_reference));
    }
}
