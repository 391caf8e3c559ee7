// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Replay-tool frontend configurations the tests share (others start
//! from these with `FrontendConfig { field: value, ..one_queue(n, d) }`).

use vhost_crypto_replay::frontend::{DescMode, FrontendConfig};
use vhost_user_crypto::wire::session::SessionAbi;

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
