// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A vhost-user frontend for a virtio-crypto backend: negotiates like QEMU
//! (or like DPDK 22.11's vhost-crypto needs, see `--dpdk`), shares memfd
//! memory, drives split data rings as a guest driver would, and creates and
//! closes sessions with `VHOST_USER_CREATE/CLOSE_CRYPTO_SESSION`.
//!
//! The vhost-user protocol itself goes through rust-vmm `vhost`'s
//! [`vhost::vhost_user::Frontend`]; the crypto session messages, which it does not know, are
//! written on a clone of the same socket with the daemon's
//! `wire::session` module (messages are strictly sequential, so the two never
//! interleave).
//!
//! This file holds the settings, limits and errors; `connection.rs` the
//! connection ([`CryptoFrontend`]: handshake, memory and ring set-up,
//! session messages), `queue.rs` a data queue's request slots,
//! submission and reaping ([`DriverQueue`]), `descs.rs` the descriptors
//! a queue lays out and their check.
//!
//! # DPDK 22.11 (`--dpdk`)
//!
//! What `examples/vhost_crypto` of DPDK 22.11 (Debian 12's `dpdk-doc` +
//! `libdpdk-dev` 22.11.11) does, read in the v22.11 sources
//! (`lib/vhost/vhost_crypto.c`, `lib/vhost/vhost_user.c`,
//! `examples/vhost_crypto/main.c`) and seen live with
//! `tools/bench/dpdk-vhost-crypto.sh`:
//!
//! * The session handler for messages 26/27 is installed by the app's
//!   `new_device` callback, which `vhost_user.c` calls only once every ring
//!   set up is enabled (`virtio_is_ready`); a CREATE before that is "not
//!   handled" and drops the connection. So the rings are set up and enabled
//!   with `SET_VRING_ENABLE(1)` before the first CREATE, and F_STATUS is not
//!   acked (with it, readiness would also wait for DRIVER_OK).
//! * CREATE is answered like QEMU expects: request 26, flags 0x5
//!   (`send_vhost_reply`), the received payload and size echoed with the id
//!   at offset 0 (layout A, 632 bytes); ids count from 1 per connection; a
//!   bad key gives a negative id. No NEED_REPLY is needed.
//! * CLOSE of a live id gets no reply (as with QEMU), so the GET_FEATURES
//!   barrier works. CLOSE of an id DPDK does not know makes the post-handler
//!   fail without NEED_REPLY, and `vhost_user_msg_handler` then closes the
//!   connection ("vhost message handling failed"); [`CryptoFrontend`] never
//!   sends such a CLOSE in DPDK mode (see [`CryptoFrontend::close_session`]).
//!   A CLOSE does not reset DPDK's one-entry session cache
//!   (`vhost_crypto_close_sess`), so a request naming the session closed last
//!   still "succeeds", with the output left equal to the input.
//! * Requests: the head must be one indirect descriptor (a direct chain is
//!   refused), and completion writes `used->ring[avail->ring[h]]` with the
//!   id `avail->ring[avail->ring[h]]` for head `h`
//!   (`vhost_crypto_finalize_one_request`), which is right only if ring slot
//!   i holds head i; [`DriverQueue::next_slot`] keeps that. The used length
//!   is `dst_data_len + 1` (`prepare_sym_cipher_op`: `vc_req->len =
//!   dst_data_len + INHDR_LEN`), this project's convention too, so the
//!   replay check is unchanged (seen: 257 for 256-byte requests, 18 for a
//!   17-byte one, which DPDK completes as OK). A request DPDK rejects
//!   (unknown session, malformed descriptors, zero-length data, data over
//!   2176 bytes = `RTE_MBUF_DEFAULT_BUF_SIZE`) gets
//!   an error status written but is never put on the used ring, and the
//!   queue stops at it (see [`Error::DpdkStall`]).
//! * The worker polls the avail ring (kicks are never read) and, unless the
//!   app runs with `--guest-polling`, writes the call eventfd after every
//!   completion burst (`vhost_crypto_worker` in the example). The example
//!   serves data queue 0 only (`NB_VIRTIO_QUEUES` = 1).

mod connection;
mod descs;
mod queue;

use std::io;
use std::time::Duration;

use vhost_user_crypto::wire::session::SessionAbi;

pub use connection::CryptoFrontend;
pub use queue::{DriverQueue, Placement, SlotLayout, Used};

/// How long the handshake, and each session or ring message after it, may
/// wait for the backend's answer.
pub const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);

/// Errors talking to a backend.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Connecting failed.
    #[error("cannot connect to {0}: {1}")]
    Connect(String, io::Error),
    /// A vhost-user request failed.
    #[error("vhost-user {0} failed: {1}")]
    Vhost(&'static str, vhost::Error),
    /// Socket I/O failed.
    #[error("socket: {0}")]
    Io(#[from] io::Error),
    /// The backend does not offer what is needed.
    #[error("backend lacks {0}")]
    Missing(&'static str),
    /// A CREATE reply was malformed.
    #[error("bad CREATE_CRYPTO_SESSION reply: {0}")]
    BadReply(String),
    /// A raw request of the trace cannot be laid out.
    #[error("raw request: {0}")]
    Raw(String),
    /// The tool's own options do not fit together, or a run of requests
    /// of the trace is too large to lay out in memory.
    #[error("{0}")]
    Options(String),
    /// The backend stopped answering.
    #[error("timed out waiting for completions")]
    Timeout,
    /// The backend closed the vhost-user connection while requests were
    /// in flight.
    #[error("the backend closed the connection with {0} requests in flight")]
    BackendClosed(u16),
    /// The connection was shut down by this tool after an earlier failure
    /// (what a queue's wait or a session message on another thread gets
    /// then; that thread reports the reason).
    #[error("the connection was shut down after an earlier failure")]
    ShutHere,
    /// The backend did not answer a vhost-user message in time. The
    /// connection is shut down then: the frontend is unusable.
    #[error(
        "the backend did not answer {0} within {secs} s (is it serving another frontend?)",
        secs = CONTROL_TIMEOUT.as_secs()
    )]
    NoAnswer(&'static str),
    /// DPDK mode: the backend stopped answering.
    #[error(
        "timed out waiting for completions (DPDK 22.11 never completes a request it rejects \
         (unknown session, malformed descriptors, zero-length or oversized data) and stops the \
         queue at it; its vhost_crypto example serves data queue 0 only)"
    )]
    DpdkStall,
}

/// How requests are laid out in descriptors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DescMode {
    /// One indirect table per request (what Linux does).
    Indirect,
    /// A direct chain in the ring's descriptor table.
    Chain,
}

/// Frontend settings.
#[derive(Debug, Clone)]
pub struct FrontendConfig {
    /// Number of data queues.
    pub queues: u16,
    /// Entries per ring (power of two).
    pub queue_size: u16,
    /// Requests in flight per queue.
    pub queue_depth: u16,
    /// Largest request payload (src = dst) in bytes.
    pub max_payload: usize,
    /// Largest IV in bytes (16 for AES-CBC; more for malformed requests).
    pub max_iv: usize,
    /// Guest memory size; 0 = sized to fit.
    pub memory_bytes: usize,
    /// Session payload layout.
    pub session_abi: SessionAbi,
    /// Descriptor layout.
    pub desc_mode: DescMode,
    /// Drive DPDK 22.11's vhost-crypto (`docs/PROTOCOL.md` §9; the notes
    /// above).
    pub dpdk: bool,
}

/// The largest ring this tool sets up (entries): the spec's maximum.
pub use vhost_user_crypto::wire::split_ring::MAX_QUEUE_SIZE;

/// Whether `n` is a ring size this tool accepts: a power of two up to
/// [`MAX_QUEUE_SIZE`].
pub fn queue_size_ok(n: u16) -> bool {
    n.is_power_of_two() && n <= MAX_QUEUE_SIZE
}

impl FrontendConfig {
    /// Checks the options against each other.
    ///
    /// # Errors
    /// [`Error::Options`] with what to change.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |m: String| Err(Error::Options(m));
        if self.queues == 0 {
            return bad("--queues must be at least 1".into());
        }
        if !queue_size_ok(self.queue_size) {
            return bad(format!(
                "--queue-size {} is not a power of two in 1..={MAX_QUEUE_SIZE}",
                self.queue_size
            ));
        }
        let slots = DriverQueue::slots_for(self.queue_size, self.desc_mode);
        if self.queue_depth == 0 || self.queue_depth > slots {
            return bad(format!(
                "--queue-depth {} must be 1..={slots} with --queue-size {} ({})",
                self.queue_depth,
                self.queue_size,
                if self.desc_mode == DescMode::Chain {
                    format!("up to {DESCS_PER_REQUEST} ring descriptors per request with --descriptors chain")
                } else {
                    "one ring descriptor per request".to_string()
                }
            ));
        }
        Ok(())
    }
}

/// Descriptors a direct-chain request uses (header, IV, src, dst, status).
pub const DESCS_PER_REQUEST: u16 = 6;
/// How long [`DriverQueue::reap`] busy-polls the used ring before it
/// sleeps on the call eventfd.
pub const REAP_POLL: Duration = Duration::from_micros(50);
/// Bytes of a slot's hash-result area (digests of chained requests).
pub const DIGEST_AREA: usize = 64;

/// [`Used::slot`] of a used element whose id names no request in flight
/// (slots are below the queue size, at most 32,768).
pub const NO_SLOT: u16 = u16::MAX;
/// Most descriptors of a raw request's indirect table.
pub const MAX_RAW_DESCS: usize = 16;
