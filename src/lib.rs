// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! vhost-user backend for the virtio-crypto device.
//!
//! A QEMU guest (`-object cryptodev-vhost-user -device virtio-crypto-pci`)
//! sends symmetric crypto requests through virtqueues; this daemon maps the
//! guest's memory, parses each request from its descriptor chain, runs
//! AES-CBC directly on the mapped guest buffers, writes the status byte and
//! returns the chain through a batched used ring.
//!
//! Modules: [`args`] (CLI), [`wire`] (virtio-crypto structs), [`session_msg`]
//! (vhost-user session messages), [`sessions`] (session tables),
//! [`request`] (descriptor chains and requests), [`queue`] (ring
//! processing), [`backend`] (the vhost-user-backend device),
//! [`frontend_proxy`] (the frontend compatibility layer), [`daemon`].

#![deny(missing_docs)]

pub mod args;
pub mod backend;
pub mod daemon;
pub mod frontend_proxy;
pub mod queue;
pub mod request;
pub mod seccomp;
pub mod session_msg;
pub mod sessions;
pub mod wire;
