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
//! The modules, in data-path order:

#![deny(missing_docs)]

pub mod args; // the command line
pub mod backend; // the vhost-user-backend device: features, memory, worker threads
pub mod crypto; // one request: validation, status policy, cipher, lanes, AlgChain
pub mod daemon; // the listener; one connection's set-up and teardown
pub mod eventfd; // checks and copies of the frontend's ring eventfds
pub mod memory_check; // checks of the guest memory the frontend shares
pub mod proxy; // the frontend compatibility layer in front of vhost-user-backend
pub mod seccomp; // the queue workers' system-call allow-list
pub mod sessions; // the session registry and the per-queue session tables
pub mod virtq; // the device side of a split ring: ring, descriptor walk, segments
pub mod wire;
pub mod worker; // one data queue's batches: avail ring to used ring // wire facts shared with the tools: virtio-crypto, vhost-user, sessions
