// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! `vhost-crypto-replay`: a vhost-user frontend that replays virtio-crypto
//! request traces against a backend, checks every result and measures.
//!
//! Modules: [`guest_mem`] (memfd guest memory), [`driver_ring`] (the
//! driver side of a split ring, shared with the fuzz harness),
//! [`frontend`] (vhost-user negotiation, request slots on the data rings,
//! session messages), [`trace`] (the JSON
//! Lines format), [`replay`] (pipelined replay and checks), [`gen`]
//! (benchmark traces), [`raw`] (descriptor-level requests), [`soak`]
//! (seeded soak runs), [`progress`] (the progress bar), [`spawn`]
//! (`--spawn-daemon`), [`rng`] (the seeded
//! generator), [`reference`](mod@reference) (the cipher expected outputs
//! come from).

#![deny(missing_docs)]

pub mod driver_ring;
pub mod frontend;
pub mod gen;
pub mod guest_mem;
pub mod progress;
pub mod raw;
pub mod reference;
pub mod replay;
pub mod rng;
pub mod soak;
pub mod spawn;
pub mod trace;
