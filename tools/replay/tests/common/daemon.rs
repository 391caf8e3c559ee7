// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The daemon for the replay package's socket tests, and the frontend
//! configuration they share.

use std::path::{Path, PathBuf};

use vhost_crypto_replay::frontend::{DescMode, FrontendConfig};
use vhost_crypto_replay::spawn::SpawnedDaemon;
use vhost_user_crypto::wire::session::SessionAbi;

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

/// One queue of `queue_size` entries, `queue_depth` requests of up to 64
/// bytes in flight, layout C, indirect tables.
pub fn one_queue(queue_size: u16, queue_depth: u16) -> FrontendConfig {
    FrontendConfig {
        queues: 1,
        queue_size,
        queue_depth,
        max_payload: 64,
        max_iv: 16,
        memory_bytes: 0,
        session_abi: SessionAbi::C,
        desc_mode: DescMode::Indirect,
        dpdk: false,
    }
}
