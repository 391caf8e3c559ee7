// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! vhost-user backend for the virtio-crypto device.
//!
//! A QEMU guest (`-object cryptodev-vhost-user -device virtio-crypto-pci`)
//! sends symmetric crypto requests through virtqueues; this daemon maps the
//! guest's memory, parses each request from its descriptor chain, runs
//! AES-CBC (or AES-CBC chained with HMAC) directly on the mapped guest
//! buffers, writes the status byte and returns the chain through a batched
//! used ring. `docs/ARCHITECTURE.md` draws the data path.
//!
//! Without the default `backend` feature the crate is the [`wire`] module
//! set alone: the wire facts the replay tool and the tests share with the
//! daemon, without the daemon's dependencies.
//!
//! The modules, in data-path order, from the frontend's socket to the
//! cipher:
//!
//! - [`args`]: the command line;
//! - [`daemon`]: the listener, and one connection's set-up and teardown;
//! - [`listen`]: the socket path or the inherited socket (`--fd`);
//! - [`signals`]: the exit on SIGTERM and SIGINT;
//! - [`proxy`]: the frontend compatibility layer in front of vhost-user-backend;
//! - [`memory_check`]: checks of the guest memory the frontend shares;
//! - [`eventfd`]: checks and copies of the frontend's ring eventfds;
//! - [`kick_poll`]: polling the data rings that have no kick eventfd;
//! - [`backend`]: the vhost-user-backend device: features, memory, worker threads;
//! - [`worker`]: one data queue's batches, from the avail ring to the used ring;
//! - [`virtq`]: the device side of a split ring: ring, descriptor walk, segments;
//! - [`crypto`]: one request: validation, status policy, cipher, lanes, AlgChain;
//! - [`sessions`]: the session registry and the per-queue session tables;
//! - [`seccomp`]: the queue workers' system-call allow-list;
//! - [`stats`]: live statistics and the stats socket;
//! - [`throttle`]: the device-wide rate limits (ops and bytes per second);
//! - [`wire`]: the wire facts shared with the tools: virtio-crypto, vhost-user,
//!   session payloads.

#![deny(missing_docs)]

#[cfg(feature = "backend")]
pub mod args;
#[cfg(feature = "backend")]
pub mod daemon;
#[cfg(feature = "backend")]
pub mod listen;
#[cfg(feature = "backend")]
pub mod signals;
#[cfg(feature = "backend")]
pub mod proxy;
#[cfg(feature = "backend")]
pub mod memory_check;
#[cfg(feature = "backend")]
pub mod eventfd;
#[cfg(feature = "backend")]
pub mod kick_poll;
#[cfg(feature = "backend")]
pub mod backend;
#[cfg(feature = "backend")]
pub mod worker;
#[cfg(feature = "backend")]
pub mod virtq;
#[cfg(feature = "backend")]
pub mod crypto;
#[cfg(feature = "backend")]
pub mod sessions;
#[cfg(feature = "backend")]
pub mod seccomp;
#[cfg(feature = "backend")]
pub mod stats;
pub mod throttle;
pub mod wire;
