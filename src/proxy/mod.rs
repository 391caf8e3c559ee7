// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The frontend compatibility layer: sits between the frontend's socket and
//! `vhost-user-backend`, which cannot serve QEMU's crypto device on its own:
//! it ends the connection on messages 26/27, and QEMU never sends
//! `SET_VRING_ENABLE` for this device (`docs/PROTOCOL.md` §4.3, §8).
//!
//! Per frontend message:
//! * `CREATE_CRYPTO_SESSION` (26): answered here, in the payload's layout
//!   (A, B or C, detected or forced), from the connection's session
//!   registry ([`session_messages`]);
//! * `CLOSE_CRYPTO_SESSION` (27): handled here; unknown ids are ignored.
//!   Answered only when the frontend negotiated `REPLY_ACK` and sets
//!   `NEED_REPLY` on it: then with the u64 ack the vhost-user spec gives
//!   such messages (0 = closed, 1 = unknown id or malformed payload). QEMU
//!   does not set the flag and reads no reply (one would desynchronise
//!   the channel, `docs/PROTOCOL.md` §2.3);
//! * `SET_VRING_KICK` (12) and `SET_VRING_CALL` (13) with fds on a data
//!   ring, once `VHOST_USER_F_PROTOCOL_FEATURES` was acked: forwarded, and
//!   when the ring has both, followed by an injected
//!   `SET_VRING_ENABLE(index, 1)` without NEED_REPLY, so the ring is live
//!   once the frontend has set it up, whether or not the frontend ever
//!   enables it ([`ring_enable`]; after `GET_VRING_BASE` stops a ring, it
//!   is enabled again once set up again). A real `SET_VRING_ENABLE` is
//!   forwarded as is, and from then on that ring's enable state is the
//!   frontend's: nothing is injected for it any more (a ring it disabled
//!   stays disabled when it sends a new call fd);
//! * `SET_VRING_NUM` and `SET_VRING_BASE` values no split ring can have end
//!   the connection (the library would accept or truncate them), and so do
//!   memory regions larger than the file behind them (SIGBUS on access);
//! * `SET_VRING_KICK`, `SET_VRING_CALL` and `SET_VRING_ERR` descriptors
//!   that are not eventfds, or are eventfds in semaphore mode, end the
//!   connection; the others are made non-blocking before the library gets
//!   them ([`crate::eventfd::check_ring_eventfd`]);
//! * `SET_VRING_KICK` of a data ring, given a [`KickWatch`] (the daemon
//!   always gives one): the frontend's kick eventfd goes to the watch (the
//!   queue's worker thread watches it itself) and the library gets a fresh
//!   eventfd of the daemon's own instead, which only it reads and nobody
//!   writes. vhost-user-backend 0.24 reads a ring's *current* kick eventfd
//!   whenever its epoll reports one of the ring's, and a failed read
//!   (`EAGAIN`: the frontend read the count first, two rings share the
//!   eventfd, or the ring's earlier eventfd, left in the epoll, was
//!   written) ends that queue's worker thread for the rest of the
//!   connection (`docs/PROTOCOL.md` §8); without an eventfd
//!   (`VRING_NOFD_MASK`), the watch is told so (it has the ring polled,
//!   [`crate::kick_poll`]) and the library gets an eventfd of the daemon's
//!   own with the flag cleared, since it starts a ring only once it has
//!   one;
//! * `SET_MEM_TABLE` / `ADD_MEM_REG`: the regions' files are checked
//!   first ([`crate::memory_check`]): sealed against shrinking where
//!   possible (or refused with `--require-sealed-memory`), regular files
//!   large enough for their regions, hugetlbfs pages reserved, all within
//!   2 s, in a helper process;
//! * `SET_PROTOCOL_FEATURES` with a bit the daemon did not offer ends the
//!   connection (the library would take it);
//! * descriptors: one per region of `SET_MEM_TABLE`, one with
//!   `ADD_MEM_REG`, at most one with a ring's eventfd message (another
//!   count ends the connection); those of other messages are closed, not
//!   forwarded. Every descriptor the frontend sends is closed on the
//!   connection's closer thread ([`Closer`]), and so is the frontend's
//!   socket at the end;
//! * everything else: forwarded unchanged ([`pump`]).
//!
//! Backend-to-frontend bytes (replies) are forwarded unchanged with their
//! file descriptors ([`replies`]). Messages are framed by [`framing`].

pub mod closer;
pub mod framing;
pub mod pump;
pub mod replies;
pub mod ring_enable;
pub mod session_messages;

use std::fs::File;
use std::io;
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use log::info;

use crate::eventfd::EventFdCopies;
use crate::sessions::SessionRegistry;
use crate::wire::session::SessionAbi;
use pump::Pump;
use replies::{relay_replies, Owed};

pub use closer::{pending_closes, Closer, MAX_PENDING_CLOSES};
pub use session_messages::handle_create;

/// What the layer enforces on one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProxyConfig {
    /// Layout of CREATE payloads.
    pub abi: AbiChoice,
    /// Data queues of the device (rings past them are never enabled).
    pub num_queues: usize,
    /// Refuse memory regions whose file cannot be sealed against shrinking.
    pub require_sealed_memory: bool,
}

/// Which session layout to use for CREATE messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AbiChoice {
    /// Detect from size and content (`docs/PROTOCOL.md` §3.4).
    #[default]
    Auto,
    /// Always this layout.
    Fixed(SessionAbi),
}

/// Takes the frontend's kick eventfds of the data rings (see the module
/// documentation): the daemon's queue workers watch them themselves.
pub trait KickWatch {
    /// Data ring `index` (below the number of data queues) now has `kick`
    /// as its kick eventfd (already checked,
    /// [`crate::eventfd::check_ring_eventfd`]), or none
    /// (`VRING_NOFD_MASK`). Keeps what it needs (a copy).
    ///
    /// # Errors
    /// Host-side failures (copying the descriptor, epoll); they end the
    /// connection.
    fn set_kick(&mut self, index: usize, kick: Option<&File>) -> io::Result<()>;
}

/// Serves one frontend connection: pumps messages between `frontend` and
/// `backend` (the library's end) until either side closes, then shuts both.
/// With `kicks`, the data rings' kick eventfds go to it and the library
/// gets eventfds of the daemon's own (see the module documentation).
/// Every descriptor the frontend sent, and the last copy of `frontend`
/// itself, is closed through `closer` (see [`Closer`]).
/// Keeps copies of the rings' kick and call eventfds in `copies` for the
/// teardown, and sets `frontend_gone` (the backend's disconnect flag) as
/// soon as the frontend has closed or its messages have ended, so that the
/// queue workers stop serving the rings.
///
/// # Errors
/// Socket errors; a malformed message from the frontend (payload over
/// 4096 bytes) ends the connection with an error.
#[allow(clippy::too_many_arguments)]
pub fn run(
    frontend: UnixStream,
    backend: UnixStream,
    mut registry: SessionRegistry,
    config: ProxyConfig,
    copies: &mut EventFdCopies,
    kicks: Option<&mut dyn KickWatch>,
    frontend_gone: Arc<AtomicBool>,
    closer: &Closer,
) -> io::Result<()> {
    let frontend_w = Arc::new(Mutex::new(frontend.try_clone()?));
    let gone_r = frontend_gone.clone();
    let backend_r = backend.try_clone()?;
    let fw = frontend_w.clone();
    let front_shut = frontend.try_clone()?;
    let owed = Arc::new(Owed::default());
    let owed_r = owed.clone();
    let (relayed, relay_ended) = std::sync::mpsc::channel::<()>();
    let replies = thread::Builder::new().name("vuc-replies".into()).spawn(move || {
        relay_replies(&backend_r, &fw, &front_shut, &owed_r, &gone_r);
        owed_r.paid_all();
        // The library ended the connection, or the frontend is gone: end
        // both sides, so neither the library (blocked writing replies
        // nobody reads) nor the request pump (blocked writing to the
        // library) can stay stuck.
        let _ = front_shut.shutdown(Shutdown::Both);
        let _ = backend_r.shutdown(Shutdown::Both);
        let _ = relayed.send(());
    })?;

    let result = Pump {
        frontend: &frontend,
        backend: &backend,
        frontend_w: &frontend_w,
        owed: &owed,
        registry: &mut registry,
        config,
        copies,
        kicks,
        closer,
    }
    .run();
    // No more requests: the library answers what it has (a frontend that
    // only shut its sending side reads those replies; it has a second for
    // that), then closes, and the relay ends. A library that does not
    // finish within a second (its thread waits behind a blocked worker) is
    // cut off. The queue workers stop serving the rings now.
    frontend_gone.store(true, Ordering::Relaxed);
    let _ = backend.shutdown(Shutdown::Write);
    if relay_ended.recv_timeout(Duration::from_secs(1)).is_err() {
        let _ = backend.shutdown(Shutdown::Both);
        let _ = frontend.shutdown(Shutdown::Both);
    }
    let _ = replies.join();
    // The last copy of the frontend's socket is closed on the closer
    // thread: closing it releases the descriptors still queued on it
    // unread, which may be ones whose close blocks.
    closer.close(frontend.into());
    if let Ok(w) = Arc::try_unwrap(frontend_w) {
        closer.close(w.into_inner().unwrap_or_else(|e| e.into_inner()).into());
    }
    info!("frontend disconnected; {} sessions dropped", registry.len());
    result
}

#[cfg(test)]
mod tests;
