// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Helpers all suites share; each suite's `main.rs` includes this folder
//! with `#[path = "../common/mod.rs"] mod common;`.
//!
//! * [`vm`]: a guest driver, a split ring in real guest memory written
//!   with the replay tool's driver ring and driven through
//!   `QueueWorker::process`;
//! * [`daemon`]: the daemon binary on a private socket;
//! * [`frontend_config`]: the replay tool's frontend configurations;
//! * [`skip`]: tests skipped for want of what they need, recorded;
//! * [`codes`]: vhost-user request codes and feature bits, virtio-crypto
//!   statuses and opcodes;
//! * [`nist`]: the NIST SP 800-38A F.2.1 / F.2.2 vectors;
//! * [`oracle`]: OpenSSL's AES-CBC and HMAC, the independent reference;
//! * [`rng`]: seeded PRNGs;
//! * [`fds`]: memfds to share as guest memory;
//! * [`stats`]: the daemon's stats socket, read as a client.
//!
//! `daemon.rs`, `frontend_config.rs`, `skip.rs` and `oracle.rs` use
//! nothing else of this folder: test crates outside `tests/` include them
//! one by one (`#[path]`).
#![allow(dead_code)]

pub mod codes;
pub mod daemon;
pub mod fds;
pub mod frontend_config;
pub mod nist;
pub mod oracle;
pub mod rng;
pub mod skip;
pub mod stats;
pub mod vm;

// (Each suite uses some of these.)
#[allow(unused_imports)]
pub use {codes::*, fds::*, nist::*, oracle::*, rng::*, skip::skipped, vm::*};
