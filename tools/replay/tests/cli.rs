// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The replay tool's `--dpdk-diff` command line: a trace DPDK cannot be
//! driven with is refused before anything runs, a DPDK side that cannot be
//! reached keeps our run's summary (and JSON), and one that can is
//! compared request by request.

#[path = "../../../tests/common/skip.rs"]
mod skip;

mod common;

use std::path::{Path, PathBuf};

const TOOL: &str = env!("CARGO_BIN_EXE_vhost-crypto-replay");

fn trace(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../traces").join(name)
}

/// The daemon binary next to the tool (`--spawn-daemon`'s default), if
/// the workspace's binaries are built.
fn daemon() -> Option<PathBuf> {
    let d = Path::new(TOOL).with_file_name("vhost-user-crypto");
    d.exists().then_some(d)
}

fn run(args: &[&str]) -> (Option<i32>, String, String) {
    common::run_binary(TOOL, args)
}

fn missing_socket(tag: &str) -> String {
    std::env::temp_dir()
        .join(format!("vuc-cli-{}-{tag}-none.sock", std::process::id()))
        .to_string_lossy()
        .into_owned()
}

#[test]
fn an_unreachable_dpdk_diff_socket_keeps_our_runs_result() {
    let Some(d) = daemon() else {
        skip::skipped(
            "vhost-user-crypto is not built next to the tool (test the workspace: cargo test --workspace)",
        );
        return;
    };
    let d = d.to_string_lossy().into_owned();
    let t = trace("nist-sp800-38a.jsonl");
    let t = t.to_str().unwrap();
    let sock = missing_socket("diff");
    let base = ["--spawn-daemon", "--daemon-bin", &d, "--dpdk-diff", &sock];

    let (code, out, err) = run(&[&base[..], &[t]].concat());
    assert_eq!(code, Some(2), "stdout {out}\nstderr {err}");
    // Our run: the 18 NIST requests, all right; then why DPDK's is missing.
    assert!(
        out.contains("requests:    18\n") && out.contains("mismatches:  0\n"),
        "{out}"
    );
    assert!(
        out.contains(&format!("--- DPDK ({sock}): not compared: ")),
        "{out}"
    );
    assert!(
        err.contains(&format!("--dpdk-diff: cannot connect to {sock}")),
        "{err}"
    );

    let (code, out, err) = run(&[&base[..], &["--json", t]].concat());
    assert_eq!(code, Some(2), "stdout {out}\nstderr {err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON object on stdout");
    assert_eq!(v["requests"], 18, "{v}");
    assert_eq!(v["mismatches"], 0, "{v}");
    assert!(v["dpdk"].is_null() && v["comparison"].is_null(), "{v}");
    assert!(v["dpdk_error"].as_str().is_some_and(|e| e.contains(&sock)), "{v}");
}

/// The comparison itself, with a second daemon of ours standing in for
/// DPDK (it takes layout A and the DPDK driving mode): exit 0, every
/// request compared, none different; in JSON the other side's report and
/// the comparison next to ours, and no `dpdk_error`.
#[test]
fn a_reachable_dpdk_diff_side_is_compared() {
    let Some(d) = daemon() else {
        skip::skipped(
            "vhost-user-crypto is not built next to the tool (test the workspace: cargo test --workspace)",
        );
        return;
    };
    let other = vhost_crypto_replay::spawn::SpawnedDaemon::start(Some(&d), 1).unwrap();
    let d = d.to_string_lossy().into_owned();
    let t = trace("nist-sp800-38a.jsonl");
    let t = t.to_str().unwrap();
    let sock = other.socket().to_str().unwrap();
    let base = ["--spawn-daemon", "--daemon-bin", &d, "--dpdk-diff", sock];

    let (code, out, err) = run(&[&base[..], &[t]].concat());
    assert_eq!(code, Some(0), "stdout {out}\nstderr {err}");
    assert!(
        out.contains(&format!("--- DPDK ({sock}), checked against the trace:\n"))
            && out.contains("--- compared 18 requests (status, dst, hash result): 0 differences; used lengths differ on 0\n"),
        "{out}"
    );

    let (code, out, err) = run(&[&base[..], &["--json", t]].concat());
    assert_eq!(code, Some(0), "stdout {out}\nstderr {err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON object on stdout");
    assert_eq!((&v["requests"], &v["mismatches"]), (&18.into(), &0.into()), "{v}");
    assert_eq!(
        (&v["dpdk"]["requests"], &v["dpdk"]["mismatches"]),
        (&18.into(), &0.into()),
        "{v}"
    );
    assert_eq!(
        (&v["comparison"]["compared"], &v["comparison"]["differences"]),
        (&18.into(), &0.into()),
        "{v}"
    );
    assert!(v.get("dpdk_error").is_none(), "{v}");
}

#[test]
fn a_trace_with_raw_direct_chains_is_refused_for_dpdk_before_anything_runs() {
    // The session lines and the one raw direct chain of the hostile-guest
    // trace (a 64-byte request: below DPDK's 2048-byte limit).
    let all = std::fs::read_to_string(trace("hostile-guest.jsonl")).unwrap();
    let lines: Vec<&str> = all
        .lines()
        .filter(|l| l.contains("\"create_session\"") || l.contains("\"indirect\":false"))
        .collect();
    let direct = lines
        .iter()
        .position(|l| l.contains("\"indirect\":false"))
        .expect("a raw direct chain in hostile-guest.jsonl");
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), lines.join("\n") + "\n").unwrap();
    let p = file.path().to_str().unwrap();
    // No backend at either socket: the check comes first.
    let (ours, dpdk) = (missing_socket("ours"), missing_socket("dpdk"));
    let diff = [
        "--socket",
        &ours,
        "--descriptors",
        "chain",
        "--dpdk-diff",
        &dpdk,
        p,
    ];
    let plain = ["--socket", &ours, "--dpdk", p];
    for (flag, args) in [("--dpdk-diff", &diff[..]), ("--dpdk", &plain[..])] {
        let (code, out, err) = run(args);
        assert_eq!(code, Some(2), "{args:?}: stdout {out}\nstderr {err}");
        assert!(out.is_empty(), "{args:?}: {out}");
        let want = format!(
            "{flag}: DPDK is driven with indirect tables only; trace line {} is a raw direct chain",
            direct + 1
        );
        assert!(err.contains(&want), "{args:?}: {err}");
    }
}
