// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! `vhost-crypto-replay`: a vhost-user frontend that replays virtio-crypto
//! request traces against a backend, checks every result and measures.

#![deny(missing_docs)]

pub mod frontend;
pub mod guest_mem;
