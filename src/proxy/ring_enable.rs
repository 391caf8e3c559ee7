// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Ring enabling: the `SET_VRING_ENABLE` messages this layer sends the
//! library for a frontend that sends none (QEMU's cryptodev-vhost-user,
//! `docs/PROTOCOL.md` §4.3, §8).

use crate::wire::vhost_user::{self, FrontendReq, VERSION_1, VRING_IDX_MASK, VRING_NOFD_MASK};

/// What the frontend has set up for one data ring since it was last stopped.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct RingSetup {
    kick: bool,
    call: bool,
    enabled: bool,
    /// The frontend has sent `SET_VRING_ENABLE` for this ring on this
    /// connection (kept when the ring is stopped): it enables and disables
    /// the ring itself.
    frontend_enables: bool,
}

/// A `SET_VRING_ENABLE` this layer sends the library for a data ring whose
/// frontend does not send its own (QEMU's cryptodev-vhost-user does not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RingAction {
    /// The ring has both its kick and its call eventfd: serve it.
    Enable(u32),
    /// The frontend stopped the ring (GET_VRING_BASE) that this layer
    /// enabled.
    Disable(u32),
}

/// Updates `rings` for a forwarded message (`protocol_features`: the
/// frontend acked `VHOST_USER_F_PROTOCOL_FEATURES`, without which the
/// library enables rings itself) and says what to send the library after
/// it:
///
/// * Enable a ring once it has both its kick and its call eventfd (QEMU
///   sends KICK before CALL, and its kick eventfd may already be
///   signalled): a request done before the call fd is set would complete
///   without an interrupt, and the guest would wait for it forever.
/// * Disable it again when the frontend stops it. vhost-user-backend 0.24's
///   `get_vring_base` clears the ring's ready flag and eventfds but keeps
///   it enabled, so without this a restart (QEMU: `stop` then `cont`,
///   which sends NUM, BASE, ADDR, KICK, then CALL) would be served from
///   its KICK on, before its new call eventfd is set.
pub(super) fn track_ring_setup(
    rings: &mut [RingSetup],
    req: FrontendReq,
    payload: &[u8],
    protocol_features: bool,
) -> Option<RingAction> {
    let word = u64::from_le_bytes(payload.get(..8)?.try_into().ok()?);
    let index = match req {
        FrontendReq::SET_VRING_KICK | FrontendReq::SET_VRING_CALL => (word & VRING_IDX_MASK) as usize,
        // vhost_vring_state: index u32, num u32.
        FrontendReq::GET_VRING_BASE | FrontendReq::SET_VRING_ENABLE => (word & 0xffff_ffff) as usize,
        _ => return None,
    };
    let ring = rings.get_mut(index)?;
    // (index < rings.len(), the number of queues: it fits in u32.)
    let index = index as u32;
    let has_fd = word & VRING_NOFD_MASK == 0;
    match req {
        FrontendReq::SET_VRING_KICK => ring.kick = has_fd,
        FrontendReq::SET_VRING_CALL => ring.call = has_fd,
        // The library stops the ring and drops both fds.
        FrontendReq::GET_VRING_BASE => {
            // (Without PROTOCOL_FEATURES acked now, the library refuses
            // SET_VRING_ENABLE, ending the connection; it then enables
            // every ring itself anyway.)
            let enabled_here = ring.enabled && !ring.frontend_enables && protocol_features;
            *ring = RingSetup {
                frontend_enables: ring.frontend_enables,
                ..RingSetup::default()
            };
            return enabled_here.then_some(RingAction::Disable(index));
        }
        _ => {
            ring.enabled = word >> 32 != 0;
            ring.frontend_enables = true;
            return None;
        }
    }
    if ring.kick && ring.call && !ring.enabled && !ring.frontend_enables && protocol_features {
        ring.enabled = true;
        return Some(RingAction::Enable(index));
    }
    None
}

/// `SET_VRING_ENABLE(index, enable)`, flags = version 1 (no NEED_REPLY).
pub(super) fn enable_message(index: u32, enable: bool) -> Vec<u8> {
    vhost_user::message(
        FrontendReq::SET_VRING_ENABLE,
        VERSION_1,
        &vhost_user::vring_state(index, u32::from(enable)),
    )
}
