// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The files of `tools/packaging/` against the daemon they install: the
//! man page generated from the command line (clap_mangen), and the
//! systemd units, checked by `systemd-analyze verify`.

use std::path::{Path, PathBuf};
use std::process::Command;

use clap::CommandFactory;
use vhost_user_crypto::args::Args;

fn packaging(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tools/packaging")
        .join(file)
}

/// The man page as clap_mangen renders it from the daemon's arguments.
fn rendered_man_page() -> Vec<u8> {
    let mut out = Vec::new();
    clap_mangen::Man::new(Args::command()).render(&mut out).unwrap();
    out
}

/// `tools/packaging/vhost-user-crypto.1` is what clap_mangen renders from
/// the command line; with `UPDATE_MAN_PAGE=1` the test writes it instead.
#[test]
fn the_man_page_is_generated_from_the_command_line() {
    let path = packaging("vhost-user-crypto.1");
    let want = rendered_man_page();
    if std::env::var_os("UPDATE_MAN_PAGE").is_some_and(|v| v == "1") {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read(&path).unwrap_or_default();
    assert!(
        have == want,
        "{} is not what the command line renders: run `UPDATE_MAN_PAGE=1 cargo test --test socket packaging::the_man_page`",
        path.display()
    );
    let text = String::from_utf8(have).unwrap();
    for option in ["socket\\-path", "\\-\\-fd", "print\\-capabilities", "queues"] {
        assert!(text.contains(option), "{option} is not in the man page");
    }
}

/// The template units instantiated as `vhost-user-crypto@test`, with
/// `ExecStart` on the built binary, pass `systemd-analyze verify` with no
/// warning about them (unknown keys, bad values, a binary that is not
/// executable, a man page that `Documentation=` names and `man` cannot
/// find: the page of `tools/packaging/` is put on `MANPATH`). The
/// service runs the binary the discovery file names, with `--fd 3`, and
/// the socket is the 0600 listening socket it inherits. Fails when
/// `systemd-analyze` cannot run (Debian package `systemd`, installed by
/// `tools/test.sh`).
#[test]
fn the_systemd_units_pass_systemd_analyze_verify() {
    let service = std::fs::read_to_string(packaging("vhost-user-crypto@.service")).unwrap();
    let socket = std::fs::read_to_string(packaging("vhost-user-crypto@.socket")).unwrap();
    let discovery: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(packaging("50-vhost-user-crypto.json")).unwrap())
            .unwrap();
    let binary = discovery["binary"].as_str().unwrap();
    let exec = format!("ExecStart={binary} --fd 3");
    assert_eq!(
        service
            .lines()
            .filter(|l| l.starts_with("ExecStart="))
            .collect::<Vec<_>>(),
        [exec.as_str()],
        "the service runs another binary than the discovery file's"
    );
    for line in [
        "ListenStream=/run/vhost-user-crypto/%i.sock",
        "SocketMode=0600",
        "Accept=no",
    ] {
        assert!(socket.lines().any(|l| l == line), "no {line} in the socket unit");
    }

    let dir = tempfile::tempdir().unwrap();
    let built = format!("ExecStart={} --fd 3", env!("CARGO_BIN_EXE_vhost-user-crypto"));
    let units = [
        (dir.path().join("vhost-user-crypto@test.socket"), socket),
        (
            dir.path().join("vhost-user-crypto@test.service"),
            service.replace(&exec, &built),
        ),
    ];
    for (path, text) in &units {
        std::fs::write(path, text).unwrap();
    }
    let man1 = dir.path().join("man/man1");
    std::fs::create_dir_all(&man1).unwrap();
    std::fs::copy(packaging("vhost-user-crypto.1"), man1.join("vhost-user-crypto.1")).unwrap();

    let out = Command::new("systemd-analyze")
        .arg("verify")
        .args(units.iter().map(|(p, _)| p))
        .env("MANPATH", dir.path().join("man"))
        .current_dir(dir.path())
        .output()
        .unwrap_or_else(|e| panic!("systemd-analyze (Debian package systemd) cannot run: {e}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "systemd-analyze verify: {}\n{stderr}",
        out.status
    );
    let about_ours: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("vhost-user-crypto"))
        .collect();
    assert!(
        about_ours.is_empty(),
        "warnings about the units:\n{}",
        about_ours.join("\n")
    );
}
