// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! QEMU's vhost-user backend program conventions
//! (`docs/interop/vhost-user.rst`, "Backend program conventions"):
//! `--print-capabilities` and the discovery file of `tools/packaging/`,
//! whose `type` must be `crypto` (QEMU's `docs/interop/vhost-user.json`).

use std::process::Command;

/// `--print-capabilities` prints `{"type": "crypto"}` as JSON and exits
/// 0, whatever other options come with it (even invalid ones), and
/// without listening on anything.
#[test]
fn print_capabilities_prints_the_crypto_type_and_ignores_other_options() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("s");
    for extra in [
        &[][..],
        &["--queues", "0", "--no-such-option"][..],
        &["--socket-path", sock.to_str().unwrap()][..],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_vhost-user-crypto"))
            .args(extra)
            .arg("--print-capabilities")
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{extra:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
        assert_eq!(v, serde_json::json!({"type": "crypto"}), "{extra:?}");
        assert!(!sock.exists(), "it listened");
    }
}

/// The discovery file has the schema's required members: a description,
/// the type `crypto` and the binary as an absolute path.
#[test]
fn the_discovery_file_names_a_crypto_backend_binary() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tools/packaging/50-vhost-user-crypto.json"
    );
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(v["type"], "crypto");
    assert!(v["description"].as_str().is_some_and(|d| !d.is_empty()));
    assert!(v["binary"].as_str().is_some_and(|b| b.starts_with('/')), "{v}");
}
