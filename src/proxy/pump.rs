// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The request pump: takes each frontend message, checks it, answers the
//! crypto session messages itself and forwards the rest to the library
//! (the module documentation of [`crate::proxy`] lists what happens to
//! each message).

use std::io;
use std::os::unix::net::UnixStream;
use std::sync::Mutex;

use log::debug;
use vhost::vhost_user::message::VhostUserVirtioFeatures;

use crate::backend::PROTOCOL_FEATURES;
use crate::eventfd::{check_ring_eventfd, own_eventfd, EventFdCopies};
use crate::memory_check::check_memory_regions_bounded;
use crate::sessions::SessionRegistry;
use crate::wire::split_ring::MAX_QUEUE_SIZE;
use crate::wire::vhost_user::{FrontendReq, Header, NEED_REPLY, VRING_IDX_MASK, VRING_NOFD_MASK};

use super::closer::{Closer, MAX_PENDING_CLOSES};
use super::framing::{recv_message, send_all, Message};
use super::replies::{ack_message, expects_reply, reply_ack_on, Owed};
use super::ring_enable::{enable_message, track_ring_setup, RingAction, RingSetup};
use super::session_messages::{handle_close, handle_create};
use super::{KickWatch, ProxyConfig};

/// One connection's request pump: where it reads and writes, and what it
/// hands messages and descriptors on to.
pub(super) struct Pump<'a, 'k> {
    /// The frontend's socket, read here.
    pub frontend: &'a UnixStream,
    /// The library's end of the private socket, written here.
    pub backend: &'a UnixStream,
    /// The frontend's socket for writing, shared with the reply relay.
    pub frontend_w: &'a Mutex<UnixStream>,
    /// Replies the library still owes the frontend.
    pub owed: &'a Owed,
    /// The connection's session registry.
    pub registry: &'a mut SessionRegistry,
    /// What the layer enforces.
    pub config: ProxyConfig,
    /// Copies of the rings' eventfds, for the teardown.
    pub copies: &'a mut EventFdCopies,
    /// Where the data rings' kick eventfds go.
    pub kicks: Option<&'a mut (dyn KickWatch + 'k)>,
    /// Where the frontend's descriptors are closed.
    pub closer: &'a Closer,
}

/// What the pump has learnt of the connection from the frontend's
/// messages.
#[derive(Default)]
struct Negotiated {
    /// `SET_FEATURES` value (0 again after `RESET_OWNER`).
    acked_features: u64,
    /// `SET_PROTOCOL_FEATURES` value.
    acked_protocol: u64,
    /// Whether the library has answered `GET_FEATURES`: from then on it
    /// counts its offered features (which always include
    /// `VHOST_USER_F_PROTOCOL_FEATURES`) for REPLY_ACK, not the acked ones.
    features_offered: bool,
}

impl Negotiated {
    /// Whether REPLY_ACK is in force (see [`reply_ack_on`]).
    fn reply_ack(&self) -> bool {
        reply_ack_on(self.features_offered, self.acked_protocol)
    }

    /// Whether the frontend acked `VHOST_USER_F_PROTOCOL_FEATURES`, without
    /// which the library enables rings itself.
    fn protocol_features(&self) -> bool {
        self.acked_features & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits() != 0
    }

    /// Takes note of a forwarded message's effect on the negotiation.
    ///
    /// # Errors
    /// `InvalidData` for a `SET_PROTOCOL_FEATURES` that acks a bit the
    /// daemon did not offer: the library takes any bits
    /// (vhost-user-backend 0.24 `set_protocol_features`) and would then
    /// serve messages of features never offered, e.g. `ADD_MEM_REG` without
    /// a region limit under `CONFIGURE_MEM_SLOTS`.
    fn note(&mut self, req: FrontendReq, payload: &[u8]) -> io::Result<()> {
        let value = || u64::from_le_bytes(payload.try_into().unwrap_or_default());
        match req {
            FrontendReq::SET_FEATURES if payload.len() == 8 => self.acked_features = value(),
            // The library forgets the acked features too
            // (vhost-user-backend 0.24 `reset_owner`), and refuses
            // SET_VRING_ENABLE until they include PROTOCOL_FEATURES again:
            // none is sent to it till then.
            FrontendReq::RESET_OWNER => self.acked_features = 0,
            FrontendReq::SET_PROTOCOL_FEATURES if payload.len() == 8 => {
                self.acked_protocol = value();
                let unoffered = self.acked_protocol & !PROTOCOL_FEATURES;
                if unoffered != 0 {
                    return Err(invalid(format!(
                        "SET_PROTOCOL_FEATURES acks {unoffered:#x}, which was not offered"
                    )));
                }
            }
            FrontendReq::GET_FEATURES => self.features_offered = true,
            _ => {}
        }
        Ok(())
    }
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

impl Pump<'_, '_> {
    /// Takes the frontend's messages until it closes its socket (see the
    /// module documentation of [`crate::proxy`]).
    ///
    /// # Errors
    /// Socket errors, and a message the layer refuses (`InvalidData`):
    /// either ends the connection.
    pub(super) fn run(mut self) -> io::Result<()> {
        let mut negotiated = Negotiated::default();
        let mut rings = vec![RingSetup::default(); self.config.num_queues];
        while let Some(mut msg) = recv_message(self.frontend, Some(self.closer))? {
            if self.closer.pending() > MAX_PENDING_CLOSES {
                // Closing this frontend's descriptors blocks (see `Fds`):
                // taking more would only pile them up open in the daemon.
                return Err(io::Error::other(format!(
                    "{} of the frontend's descriptors wait to be closed (a close blocks)",
                    self.closer.pending()
                )));
            }
            let hdr = Header::from_bytes(&msg.hdr);
            let reply = match hdr.frontend_req() {
                Some(FrontendReq::CREATE_CRYPTO_SESSION) => {
                    Some(handle_create(self.registry, &msg.payload, self.config.abi))
                }
                Some(req @ FrontendReq::CLOSE_CRYPTO_SESSION) => {
                    let closed = handle_close(self.registry, &msg.payload);
                    // Answered only when asked for under REPLY_ACK
                    // (docs/PROTOCOL.md §2.3).
                    (hdr.flags & NEED_REPLY != 0 && negotiated.reply_ack())
                        .then(|| ack_message(req, u64::from(!closed)).to_vec().into())
                }
                req => {
                    self.forward(&mut msg, hdr, req, &mut negotiated)?;
                    let action = req.and_then(|req| {
                        track_ring_setup(&mut rings, req, &msg.payload, negotiated.protocol_features())
                    });
                    match action {
                        Some(RingAction::Enable(index)) => {
                            debug!("enabling data ring {index} (frontend set it up)");
                            send_all(self.backend, &enable_message(index, true), &[])?;
                        }
                        Some(RingAction::Disable(index)) => {
                            debug!("disabling data ring {index} (frontend stopped it)");
                            send_all(self.backend, &enable_message(index, false), &[])?;
                        }
                        None => {}
                    }
                    None
                }
            };
            if let Some(reply) = reply {
                // After every reply the library owes for earlier messages.
                self.owed.wait_settled();
                let w = self.frontend_w.lock().unwrap_or_else(|e| e.into_inner());
                send_all(&w, &reply, &[])?;
            }
        }
        Ok(())
    }

    /// Checks a message for the library ([`Pump::check_forwarded`]), notes
    /// its effect on the negotiation, and sends it on, counting the reply
    /// the library will owe for it.
    fn forward(
        &mut self,
        msg: &mut Message,
        hdr: Header,
        req: Option<FrontendReq>,
        negotiated: &mut Negotiated,
    ) -> io::Result<()> {
        debug!(
            "forwarding request {} (flags {:#x}, {} fds)",
            hdr.request,
            hdr.flags,
            msg.fds.len()
        );
        if !req.is_some_and(takes_descriptors) && !msg.fds.is_empty() {
            // Only descriptors checked here reach the library, which would
            // close the others on its own threads.
            debug!(
                "request {} takes no descriptors: {} dropped",
                hdr.request,
                msg.fds.len()
            );
            for f in std::mem::take(&mut msg.fds.files) {
                self.closer.close(f.into());
            }
        }
        if let Some(req) = req {
            self.check_forwarded(msg, req)?;
            negotiated.note(req, &msg.payload)?;
        }
        // The library's rule (vhost 0.18 `update_reply_ack_flag`): REPLY_ACK
        // is on once the features it *offered* in its last GET_FEATURES
        // reply include PROTOCOL_FEATURES and the frontend acked REPLY_ACK;
        // SET_FEATURES does not matter, so a NEED_REPLY message sent before
        // it (e.g. SET_OWNER) is acked too.
        if expects_reply(req, hdr.flags, negotiated.reply_ack()) {
            self.owed.owe();
        }
        msg.send_to(self.backend)
    }

    /// The checks of a message the library will get, by request; see the
    /// module documentation of [`crate::proxy`]. Ring eventfds are checked,
    /// copied for the teardown, and a data ring's kick eventfd goes to `kicks`
    /// (the library gets one of the daemon's own instead).
    ///
    /// # Errors
    /// `InvalidData` for a message that ends the connection; host-side
    /// failures (`dup`, `eventfd`, epoll).
    fn check_forwarded(&mut self, msg: &mut Message, req: FrontendReq) -> io::Result<()> {
        let config = self.config;
        check_descriptor_count(req, &msg.payload, msg.fds.len())?;
        // `struct vhost_vring_state`'s u32 value, for NUM and BASE.
        let state_num = || {
            msg.payload
                .get(4..8)
                .filter(|_| msg.payload.len() == 8)
                .map(|b| u32::from_le_bytes(b.try_into().unwrap_or_default()))
        };
        match req {
            FrontendReq::SET_VRING_NUM => {
                // vhost-user-backend only checks 1..=max; virtio-queue then
                // silently keeps the old size for a non-power of two. A split
                // ring's size is a power of two (VIRTIO 1.2 §2.7).
                if let Some(num) = state_num() {
                    if num == 0 || num > u32::from(MAX_QUEUE_SIZE) || !num.is_power_of_two() {
                        return Err(invalid(format!(
                            "SET_VRING_NUM {num} is not a power of two in 1..=32768"
                        )));
                    }
                }
            }
            FrontendReq::SET_VRING_BASE => {
                // A split ring's index is 16 bits; the library would truncate a
                // larger value silently.
                if let Some(num) = state_num().filter(|&n| n > u32::from(u16::MAX)) {
                    return Err(invalid(format!(
                        "SET_VRING_BASE {num} does not fit a split ring's 16-bit index"
                    )));
                }
            }
            FrontendReq::SET_MEM_TABLE | FrontendReq::ADD_MEM_REG => {
                check_memory_regions_bounded(req, &msg.payload, &msg.fds, config.require_sealed_memory)?;
            }
            FrontendReq::SET_VRING_KICK | FrontendReq::SET_VRING_CALL | FrontendReq::SET_VRING_ERR => {
                for file in msg.fds.iter() {
                    check_ring_eventfd(req, file)?;
                }
                // The data ring the message is for, if any.
                let data_ring = msg
                    .payload
                    .get(..8)
                    .map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default()))
                    .map(|w| (w & VRING_IDX_MASK) as usize)
                    .filter(|&index| index < config.num_queues);
                if let (Some(index), [file]) = (data_ring, &msg.fds[..]) {
                    self.copies.keep(req, index, file)?;
                }
                if let (FrontendReq::SET_VRING_KICK, Some(index), Some(watch)) =
                    (req, data_ring, self.kicks.as_deref_mut())
                {
                    if let Some(theirs) = msg.fds.files.first_mut() {
                        watch.set_kick(index, Some(theirs))?;
                        let theirs = std::mem::replace(theirs, own_eventfd()?);
                        self.closer.close(theirs.into());
                    } else {
                        // `VRING_NOFD_MASK`: no eventfd; the ring is to be
                        // polled (`crate::kick_poll`). The library marks a
                        // ring started only once it has a kick eventfd
                        // (vhost-user-backend 0.24 `vring_needs_init`):
                        // it gets one of the daemon's own, which nobody
                        // writes, and the flag cleared.
                        watch.set_kick(index, None)?;
                        if let Some(w) = msg.payload.get_mut(..8) {
                            let word = u64::from_le_bytes(w.try_into().unwrap_or_default());
                            w.copy_from_slice(&(word & !VRING_NOFD_MASK).to_le_bytes());
                        }
                        msg.fds.files.push(own_eventfd()?);
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// Whether the daemon takes descriptors with `req`: the memory table and
/// region, and the rings' eventfds. Other messages that carry descriptors
/// in the vhost-user spec (SET_LOG_BASE, SET_LOG_FD, SET_BACKEND_REQ_FD,
/// SET_INFLIGHT_FD, SET_DEVICE_STATE_FD, REM_MEM_REG) belong to features
/// the daemon does not offer.
pub fn takes_descriptors(req: FrontendReq) -> bool {
    matches!(
        req,
        FrontendReq::SET_MEM_TABLE
            | FrontendReq::ADD_MEM_REG
            | FrontendReq::SET_VRING_KICK
            | FrontendReq::SET_VRING_CALL
            | FrontendReq::SET_VRING_ERR
    )
}

/// Checks how many descriptors a message that takes them carries: one per
/// region of a SET_MEM_TABLE (u32 count at the start of its payload), one
/// with ADD_MEM_REG, at most one with a ring's eventfd message. Each one
/// the library gets has been checked here, and it gets no others.
///
/// # Errors
/// `InvalidData` (the connection ends) for any other count.
pub fn check_descriptor_count(req: FrontendReq, payload: &[u8], fds: usize) -> io::Result<()> {
    let expected = match req {
        FrontendReq::SET_MEM_TABLE => {
            let Some(n) = payload.get(..4) else {
                return Ok(()); // the memory check refuses it
            };
            let n = u32::from_le_bytes(n.try_into().unwrap_or_default()) as usize;
            n..=n
        }
        FrontendReq::ADD_MEM_REG => 1..=1,
        FrontendReq::SET_VRING_KICK | FrontendReq::SET_VRING_CALL | FrontendReq::SET_VRING_ERR => 0..=1,
        _ => return Ok(()),
    };
    if expected.contains(&fds) {
        return Ok(());
    }
    Err(invalid(format!(
        "request {req:?} carries {fds} descriptors, not {expected:?}"
    )))
}
