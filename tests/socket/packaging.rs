// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The files of `tools/packaging/` against the daemon they install: the
//! man page generated from the command line (clap_mangen).

use std::path::{Path, PathBuf};

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
