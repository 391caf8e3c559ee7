// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The daemon for the replay package's socket tests.

use std::path::{Path, PathBuf};

use vhost_crypto_replay::spawn::SpawnedDaemon;

/// The daemon binary a workspace build puts next to the replay binary
/// (`cargo test --workspace` builds both).
///
/// # Panics
/// When it is not there: the tests need the daemon, and do not pass
/// without it.
pub fn daemon_bin() -> PathBuf {
    let bin = Path::new(env!("CARGO_BIN_EXE_vhost-crypto-replay")).with_file_name("vhost-user-crypto");
    assert!(
        bin.exists(),
        "{} not found: these tests run the daemon binary; build it first \
         (cargo build --workspace, or cargo test --workspace, with the same profile)",
        bin.display()
    );
    bin
}

/// Starts the daemon on a private socket with the options `args` (killed
/// when dropped).
pub fn spawn_daemon(args: &[&str]) -> SpawnedDaemon {
    SpawnedDaemon::start_with(Some(&daemon_bin()), args).expect("start the daemon")
}
