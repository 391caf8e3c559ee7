// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! vhost-user message framing: the 12-byte header, its flags, and the few
//! payload shapes the daemon and its frontends build by hand.
//!
//! Request codes, header flags and feature bits come from rust-vmm `vhost`
//! 0.18 (`vhost_user::message`: [`FrontendReq`], `VhostUserHeaderFlag`,
//! `VhostUserProtocolFeatures`, `VhostUserVirtioFeatures`), which follows
//! QEMU's `docs/interop/vhost-user.rst` ("Message Specification"). The
//! crate's own connection type is private, so the frontend compatibility
//! layer and the test frontends frame messages with this module
//! (`docs/PROTOCOL.md` §2.1, §8).
//!
//! A message is a header (request u32, flags u32, payload size u32, all
//! little-endian) followed by `size` payload bytes, with any file
//! descriptors attached to its first bytes.

pub use vhost::vhost_user::message::FrontendReq;
use vhost::vhost_user::message::{VhostUserHeaderFlag, MAX_ATTACHED_FD_ENTRIES, MAX_MSG_SIZE};

/// Size of the message header in bytes.
pub const HDR_SIZE: usize = 12;
/// Largest payload `vhost` 0.18 accepts, in bytes (`MAX_MSG_SIZE`, 4096).
pub const MAX_PAYLOAD: usize = MAX_MSG_SIZE;
/// Most file descriptors one message may carry (`MAX_ATTACHED_FD_ENTRIES`).
pub const MAX_FDS: usize = MAX_ATTACHED_FD_ENTRIES;

/// Header flags: protocol version 1 (bits 0–1 hold the version).
pub const VERSION_1: u32 = 0x1;
/// Header flags: the mask of the version bits.
pub const VERSION_MASK: u32 = VhostUserHeaderFlag::VERSION.bits();
/// Header flags: the message is a reply.
pub const REPLY: u32 = VhostUserHeaderFlag::REPLY.bits();
/// Header flags: the sender wants a reply (under `REPLY_ACK`).
pub const NEED_REPLY: u32 = VhostUserHeaderFlag::NEED_REPLY.bits();

/// Bit 8 of the u64 payload of `SET_VRING_KICK` / `_CALL` / `_ERR`: no
/// descriptor comes with the message ("invalid FD flag").
pub const VRING_NOFD_MASK: u64 = 0x100;
/// Bits 0–7 of that u64: the ring index.
pub const VRING_IDX_MASK: u64 = 0xff;

/// A decoded message header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Request code: a [`FrontendReq`] value from a frontend, or any u32
    /// a hostile peer sent.
    pub request: u32,
    /// `VERSION_1`, `REPLY`, `NEED_REPLY`.
    pub flags: u32,
    /// Payload bytes that follow.
    pub size: u32,
}

impl Header {
    /// A header for `request` with `flags` and a payload of `size` bytes.
    pub fn new(request: FrontendReq, flags: u32, size: u32) -> Self {
        Header {
            request: u32::from(request),
            flags,
            size,
        }
    }

    /// Decodes the 12 little-endian header bytes.
    pub fn from_bytes(b: &[u8; HDR_SIZE]) -> Self {
        let word = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        Header {
            request: word(0),
            flags: word(4),
            size: word(8),
        }
    }

    /// Encodes the header.
    pub fn to_bytes(&self) -> [u8; HDR_SIZE] {
        let mut h = [0u8; HDR_SIZE];
        h[0..4].copy_from_slice(&self.request.to_le_bytes());
        h[4..8].copy_from_slice(&self.flags.to_le_bytes());
        h[8..12].copy_from_slice(&self.size.to_le_bytes());
        h
    }

    /// The request as a [`FrontendReq`], when it is one.
    pub fn frontend_req(&self) -> Option<FrontendReq> {
        FrontendReq::try_from(self.request).ok()
    }
}

/// A whole message: header (`size` = `payload.len()`) and payload.
///
/// # Panics
/// If the payload is longer than `u32::MAX` bytes.
pub fn message(request: FrontendReq, flags: u32, payload: &[u8]) -> Vec<u8> {
    let size = u32::try_from(payload.len()).expect("payload over 4 GiB");
    let mut m = Vec::with_capacity(HDR_SIZE + payload.len());
    m.extend_from_slice(&Header::new(request, flags, size).to_bytes());
    m.extend_from_slice(payload);
    m
}

/// A whole message whose payload is one u64 (feature sets, vring fd
/// messages, REPLY_ACK acks, CLOSE_CRYPTO_SESSION).
pub fn u64_message(request: FrontendReq, flags: u32, value: u64) -> [u8; HDR_SIZE + 8] {
    let mut m = [0u8; HDR_SIZE + 8];
    m[..HDR_SIZE].copy_from_slice(&Header::new(request, flags, 8).to_bytes());
    m[HDR_SIZE..].copy_from_slice(&value.to_le_bytes());
    m
}

/// The payload of `struct vhost_vring_state`: ring index, then a u32
/// value (`SET_VRING_NUM`, `SET_VRING_BASE`, `GET_VRING_BASE`,
/// `SET_VRING_ENABLE`).
pub fn vring_state(index: u32, num: u32) -> [u8; 8] {
    let mut p = [0u8; 8];
    p[0..4].copy_from_slice(&index.to_le_bytes());
    p[4..8].copy_from_slice(&num.to_le_bytes());
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};

    #[test]
    fn codes_and_flags_match_the_vhost_user_spec() {
        // QEMU docs/interop/vhost-user.rst: "Front-end message types" and
        // the header's flags; the crypto messages are 26 and 27.
        let codes = [
            (FrontendReq::GET_FEATURES, 1u32),
            (FrontendReq::SET_FEATURES, 2),
            (FrontendReq::SET_MEM_TABLE, 5),
            (FrontendReq::SET_VRING_NUM, 8),
            (FrontendReq::GET_VRING_BASE, 11),
            (FrontendReq::SET_VRING_KICK, 12),
            (FrontendReq::SET_VRING_CALL, 13),
            (FrontendReq::SET_PROTOCOL_FEATURES, 16),
            (FrontendReq::SET_VRING_ENABLE, 18),
            (FrontendReq::CREATE_CRYPTO_SESSION, 26),
            (FrontendReq::CLOSE_CRYPTO_SESSION, 27),
            (FrontendReq::ADD_MEM_REG, 37),
        ];
        for (req, literal) in codes {
            assert_eq!(u32::from(req), literal, "{req:?}");
        }
        assert_eq!((VERSION_1, REPLY, NEED_REPLY), (0x1, 0x4, 0x8));
        assert_eq!(VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits(), 1 << 30);
        assert_eq!(VhostUserProtocolFeatures::REPLY_ACK.bits(), 1 << 3);
        assert_eq!(VhostUserProtocolFeatures::CRYPTO_SESSION.bits(), 1 << 7);
        assert_eq!((HDR_SIZE, MAX_PAYLOAD, MAX_FDS), (12, 4096, 32));
    }

    #[test]
    fn header_bytes_are_request_flags_size_little_endian() {
        let h = Header::new(FrontendReq::CREATE_CRYPTO_SESSION, VERSION_1 | REPLY, 1072);
        assert_eq!(h.to_bytes(), [26, 0, 0, 0, 5, 0, 0, 0, 0x30, 0x04, 0, 0]);
        assert_eq!(Header::from_bytes(&h.to_bytes()), h);
        assert_eq!(h.frontend_req(), Some(FrontendReq::CREATE_CRYPTO_SESSION));
        assert_eq!(
            Header::from_bytes(&[0xff, 0xff, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]).frontend_req(),
            None
        );
        assert_eq!(
            u64_message(FrontendReq::CLOSE_CRYPTO_SESSION, VERSION_1, 7),
            [27, 0, 0, 0, 1, 0, 0, 0, 8, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(vring_state(1, 256), [1, 0, 0, 0, 0, 1, 0, 0]);
    }
}
