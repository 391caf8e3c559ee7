// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Replies: relaying the library's to the frontend, and keeping count of
//! those it still owes so that a reply made by this layer (CREATE, a CLOSE
//! ack) never overtakes one of them.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use log::warn;
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};

use crate::backend::FEATURES;
use crate::wire::vhost_user::{self, FrontendReq, HDR_SIZE, NEED_REPLY, REPLY, VERSION_1};

use super::framing::recv_message;

/// Relays the library's replies from `library` to the frontend
/// (`frontend_w`), whole messages so that a CREATE reply can never land
/// inside one, until the library closes its end.
///
/// It also watches `frontend` for the frontend closing its socket
/// (`POLLHUP`, `POLLERR`; a frontend that only shuts its sending side still
/// gets its replies). From then on replies are read and dropped, and the
/// relay gives up once the request pump has taken none of the frontend's
/// unread bytes (`FIONREAD`) for a second: the pump is then blocked writing
/// to a library that stopped reading (its thread waits behind a blocked
/// worker, see [`crate::eventfd::EventFdCopies`]) and would never see the end of the
/// connection. While the pump still takes the frontend's last messages,
/// the relay lets it.
pub(super) fn relay_replies(
    library: &UnixStream,
    frontend_w: &Mutex<UnixStream>,
    frontend: &UnixStream,
    owed: &Owed,
    frontend_gone: &AtomicBool,
) {
    // (When the frontend was seen gone, when its unread bytes last went
    // down, and how many there were then.)
    let mut gone: Option<(Instant, Instant, usize)> = None;
    let mut relaying = true;
    loop {
        let mut fds = [
            libc::pollfd {
                fd: library.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                // Once it is gone, POLLHUP would end every poll at once:
                // -1 leaves it out.
                fd: if gone.is_some() { -1 } else { frontend.as_raw_fd() },
                events: 0,
                revents: 0,
            },
        ];
        let timeout = if gone.is_some() { 20 } else { -1 };
        // SAFETY: poll(2) on an array of two pollfds of ours.
        if unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout) } < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        if gone.is_none() && fds[1].revents & (libc::POLLHUP | libc::POLLERR) != 0 {
            // The queue workers stop now, not when the last messages are
            // taken (the library's thread then gets the rings' locks
            // within a batch, and takes them quickly).
            frontend_gone.store(true, Ordering::Relaxed);
            let now = Instant::now();
            gone = Some((now, now, unread(frontend)));
            relaying = false;
        }
        if fds[0].revents != 0 {
            let Ok(Some(msg)) = recv_message(library, None) else {
                return;
            };
            if relaying {
                let w = frontend_w.lock().unwrap_or_else(|e| e.into_inner());
                // A frontend that takes no more replies gets none; the
                // pump sees the end of the connection.
                relaying = msg.send_to(&w).is_ok();
            }
            owed.paid();
        }
        if let Some((seen, since, last)) = &mut gone {
            let left = unread(frontend);
            if left < *last {
                (*since, *last) = (Instant::now(), left);
            } else if since.elapsed() >= Duration::from_secs(1) {
                return;
            }
            if seen.elapsed() >= GONE_LIMIT {
                return;
            }
        }
    }
}

/// How long, once the frontend has closed its socket, the request pump may
/// go on taking its last messages before the connection is cut.
const GONE_LIMIT: Duration = Duration::from_secs(2);

/// Bytes waiting unread on `sock` (`FIONREAD`; 0 if that fails).
fn unread(sock: &UnixStream) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: ioctl(FIONREAD) writes one int, ours.
    let r = unsafe { libc::ioctl(sock.as_raw_fd(), libc::FIONREAD, &mut n) };
    if r < 0 {
        0
    } else {
        usize::try_from(n).unwrap_or(0)
    }
}

/// Replies the library still owes the frontend for forwarded messages.
/// A reply made here (CREATE) waits until they are relayed, so replies
/// reach the frontend in the order of its requests even when it sends
/// several before reading (QEMU does not, other frontends may).
#[derive(Default)]
pub(super) struct Owed {
    count: Mutex<u64>,
    changed: Condvar,
}

impl Owed {
    /// One more reply is owed (a forwarded message the library answers).
    pub(super) fn owe(&self) {
        *self.count.lock().unwrap_or_else(|e| e.into_inner()) += 1;
    }

    /// The library sent one reply.
    pub(super) fn paid(&self) {
        let mut c = self.count.lock().unwrap_or_else(|e| e.into_inner());
        *c = c.saturating_sub(1);
        self.changed.notify_all();
    }

    /// Nothing more will come (the library's end closed).
    pub(super) fn paid_all(&self) {
        *self.count.lock().unwrap_or_else(|e| e.into_inner()) = 0;
        self.changed.notify_all();
    }

    /// Waits until nothing is owed. A library that does not answer a
    /// message the way this layer expects only delays the reply (by at most
    /// a second), it cannot block it.
    pub(super) fn wait_settled(&self) {
        let c = self.count.lock().unwrap_or_else(|e| e.into_inner());
        let (c, timeout) = self
            .changed
            .wait_timeout_while(c, Duration::from_secs(1), |c| *c > 0)
            .unwrap_or_else(|e| e.into_inner());
        if timeout.timed_out() {
            warn!(
                "{} replies still owed by the backend library; answering CREATE anyway",
                *c
            );
        }
    }
}

/// Whether the library answers a forwarded message (rust-vmm vhost 0.18
/// `backend_req_handler.rs`): the GET_* requests and a few others always
/// do; the rest, and codes that are no `FrontendReq` (`None`), only with
/// NEED_REPLY once REPLY_ACK is negotiated.
pub(super) fn expects_reply(req: Option<FrontendReq>, flags: u32, reply_ack: bool) -> bool {
    let always = req.is_some_and(|req| {
        matches!(
            req,
            FrontendReq::GET_FEATURES
                | FrontendReq::SET_LOG_BASE
                | FrontendReq::GET_VRING_BASE
                | FrontendReq::GET_PROTOCOL_FEATURES
                | FrontendReq::GET_QUEUE_NUM
                | FrontendReq::GET_CONFIG
                | FrontendReq::POSTCOPY_ADVISE
                | FrontendReq::GET_INFLIGHT_FD
                | FrontendReq::GET_MAX_MEM_SLOTS
                | FrontendReq::GET_STATUS
                | FrontendReq::SET_DEVICE_STATE_FD
                | FrontendReq::CHECK_DEVICE_STATE
        )
    });
    always || (reply_ack && flags & NEED_REPLY != 0)
}

/// Whether REPLY_ACK is in force, by the library's rule (vhost 0.18
/// `update_reply_ack_flag`): the features it offered in its last
/// GET_FEATURES reply include `VHOST_USER_F_PROTOCOL_FEATURES` (ours always
/// do) and the frontend acked `REPLY_ACK`.
pub(super) fn reply_ack_on(features_offered: bool, acked_protocol: u64) -> bool {
    features_offered
        && FEATURES & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits() != 0
        && acked_protocol & VhostUserProtocolFeatures::REPLY_ACK.bits() != 0
}

/// The ack of a `NEED_REPLY` message under REPLY_ACK: the request's own
/// code, flags REPLY | version 1, a u64 payload (0 = success).
pub(super) fn ack_message(req: FrontendReq, value: u64) -> [u8; HDR_SIZE + 8] {
    vhost_user::u64_message(req, VERSION_1 | REPLY, value)
}
