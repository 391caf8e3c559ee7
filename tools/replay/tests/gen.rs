// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! `vhost-crypto-replay gen`: the default trace is compact (one `generate`
//! line per session used, whatever the count), and replaying it gives the
//! same requests as the `--expanded` trace, whose expected outputs OpenSSL
//! confirms.

mod common;
// OpenSSL's AES-CBC, the expected outputs' reference (its HMAC and the
// `Mac` helpers are not used).
#[path = "../../../tests/common/oracle.rs"]
#[allow(dead_code)]
mod oracle;

use std::collections::HashMap;
use std::path::Path;

use vhost_crypto_replay::trace::{Dir, ExpectStatus, Req, Step, Trace};

const TOOL: &str = env!("CARGO_BIN_EXE_vhost-crypto-replay");

fn gen(args: &[&str], out: &Path) -> Vec<u8> {
    let mut all = vec!["gen"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--out", out.to_str().unwrap()]);
    let (code, stdout, stderr) = common::run_binary(TOOL, &all);
    assert_eq!(code, Some(0), "gen {args:?}: {stdout}{stderr}");
    std::fs::read(out).unwrap()
}

/// Session name → key and direction.
type Keys = HashMap<String, (Vec<u8>, Dir)>;

/// The trace's session keys and directions by name, and its requests.
fn keys_and_requests(t: &Trace) -> (Keys, Vec<Req>) {
    let mut keys = HashMap::new();
    let mut reqs = Vec::new();
    for s in &t.steps {
        match s {
            Step::Create {
                name, key, direction, ..
            } => {
                keys.insert(name.clone(), (key.to_vec(), *direction));
            }
            Step::Requests(v) => reqs.extend(v.iter().cloned()),
            _ => {}
        }
    }
    (keys, reqs)
}

#[test]
fn the_default_trace_is_compact() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t.jsonl");
    // 100,000 requests of 16 KiB: 6.5 GB as explicit request lines.
    let text = gen(&["--size", "16384", "--count", "100000"], &out);
    assert!(text.len() < 1024, "{} bytes", text.len());
    let text = String::from_utf8(text).unwrap();
    let mut requests = 0;
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        match v["op"].as_str().unwrap() {
            "generate" => {
                assert_eq!(v["size"], 16384, "{line}");
                assert_eq!(v["opcode"], "encrypt", "{line}");
                requests += v["count"].as_u64().unwrap();
            }
            "create_session" | "close_session" => {}
            op => panic!("unexpected {op} line: {line}"),
        }
    }
    assert_eq!(requests, 100_000);
    // Mixed requests over 7 keys: still a few lines.
    let text = gen(
        &["--opcode", "mixed", "--sessions", "7", "--count", "1000000"],
        &out,
    );
    assert!(text.len() < 4096, "{} bytes", text.len());
}

#[test]
fn the_compact_and_expanded_traces_hold_the_same_requests() {
    let dir = tempfile::tempdir().unwrap();
    for (opcode, sessions, key_bits, size, count) in [
        ("mixed", "3", "192", "48", 41u64),
        ("mixed", "4", "128", "32", 10),
        ("encrypt", "1", "128", "16", 5),
        ("decrypt", "2", "256", "1024", 9),
    ] {
        let args = [
            "--opcode",
            opcode,
            "--sessions",
            sessions,
            "--key-bits",
            key_bits,
            "--size",
            size,
            "--count",
            &count.to_string(),
            "--seed",
            "5",
        ];
        let compact = gen(&args, &dir.path().join("c.jsonl"));
        let mut expanded_args = args.to_vec();
        expanded_args.push("--expanded");
        let expanded = gen(&expanded_args, &dir.path().join("e.jsonl"));
        assert!(
            String::from_utf8_lossy(&expanded)
                .lines()
                .all(|l| !l.contains("generate")),
            "the expanded trace has no generate line"
        );
        let (keys_c, reqs_c) = keys_and_requests(&Trace::parse(&compact[..]).unwrap());
        let (keys_e, reqs_e) = keys_and_requests(&Trace::parse(&expanded[..]).unwrap());
        assert_eq!(keys_c, keys_e, "{opcode}: sessions");
        assert_eq!(reqs_c.len() as u64, count, "{opcode}");
        assert_eq!(reqs_e.len() as u64, count, "{opcode}");
        // Request i uses key i % sessions, and with mixed decrypts when
        // i / sessions is odd: how many requests each key and opcode gets.
        let n: u64 = sessions.parse().unwrap();
        // (Keyed by key number and whether the request encrypts.)
        let mut want: HashMap<(u64, bool), u64> = HashMap::new();
        for i in 0..count {
            let d = match opcode {
                "encrypt" => Dir::Encrypt,
                "decrypt" => Dir::Decrypt,
                _ if (i / n).is_multiple_of(2) => Dir::Encrypt,
                _ => Dir::Decrypt,
            };
            *want.entry((i % n, d == Dir::Encrypt)).or_default() += 1;
        }
        let mut got: HashMap<(u64, bool), u64> = HashMap::new();
        for (c, e) in reqs_c.iter().zip(&reqs_e) {
            // The same request, in the same place.
            assert_eq!(c.session, e.session, "{opcode}");
            assert_eq!(c.opcode, e.opcode, "{opcode}");
            assert_eq!(c.iv, e.iv, "{opcode}");
            assert_eq!(c.src, e.src, "{opcode}");
            assert_eq!(c.dst, e.dst, "{opcode}");
            assert_eq!((c.status, e.status), (ExpectStatus::Ok, ExpectStatus::Ok));
            assert_eq!(c.src.len().to_string(), size);
            // Its session has the opcode's direction, and OpenSSL gives its
            // expected output.
            let name = c.session.clone().unwrap();
            let (key, direction) = &keys_c[&name];
            assert_eq!(key.len() * 8, key_bits.parse::<usize>().unwrap());
            assert_eq!(*direction, c.opcode, "{name}");
            assert_eq!(
                c.dst.as_deref(),
                Some(&oracle::oracle(c.opcode == Dir::Encrypt, key, &c.iv, &c.src)[..]),
                "{opcode} {name}"
            );
            let k: u64 = name
                .trim_start_matches(|ch: char| ch.is_alphabetic())
                .parse()
                .unwrap();
            *got.entry((k, c.opcode == Dir::Encrypt)).or_default() += 1;
        }
        assert_eq!(got, want, "{opcode}: requests per key and opcode");
        // Different requests: no two share an IV.
        let mut ivs: Vec<_> = reqs_c.iter().map(|r| r.iv.clone()).collect();
        ivs.sort();
        ivs.dedup();
        assert_eq!(ivs.len() as u64, count, "{opcode}");
    }
}
