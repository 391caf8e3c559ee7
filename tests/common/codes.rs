// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The wire values the tests name.
//!
//! vhost-user request codes and header flags come from the crate's
//! `wire::vhost_user` (rust-vmm `vhost`'s `FrontendReq`, QEMU
//! `docs/interop/vhost-user.rst`), statuses and opcodes from
//! `wire::virtio_crypto` (VIRTIO 1.2 §5.9); the crate's unit tests pin
//! both to the specifications' literals. The codes are `u32` here so that
//! raw messages can carry any code and `match` patterns can name them.

use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_crypto::wire::vhost_user::FrontendReq;
use vhost_user_crypto::wire::virtio_crypto::{
    Status, VIRTIO_CRYPTO_CIPHER_DECRYPT, VIRTIO_CRYPTO_CIPHER_ENCRYPT,
};

#[allow(unused_imports)]
pub use vhost_user_crypto::wire::vhost_user::{NEED_REPLY, REPLY, VERSION_1, VRING_NOFD_MASK};

pub const GET_FEATURES: u32 = FrontendReq::GET_FEATURES as u32;
pub const SET_FEATURES: u32 = FrontendReq::SET_FEATURES as u32;
pub const SET_OWNER: u32 = FrontendReq::SET_OWNER as u32;
pub const RESET_OWNER: u32 = FrontendReq::RESET_OWNER as u32;
pub const SET_MEM_TABLE: u32 = FrontendReq::SET_MEM_TABLE as u32;
pub const SET_VRING_NUM: u32 = FrontendReq::SET_VRING_NUM as u32;
pub const SET_VRING_ADDR: u32 = FrontendReq::SET_VRING_ADDR as u32;
pub const SET_VRING_BASE: u32 = FrontendReq::SET_VRING_BASE as u32;
pub const GET_VRING_BASE: u32 = FrontendReq::GET_VRING_BASE as u32;
pub const SET_VRING_KICK: u32 = FrontendReq::SET_VRING_KICK as u32;
pub const SET_VRING_CALL: u32 = FrontendReq::SET_VRING_CALL as u32;
pub const SET_VRING_ERR: u32 = FrontendReq::SET_VRING_ERR as u32;
pub const GET_PROTOCOL_FEATURES: u32 = FrontendReq::GET_PROTOCOL_FEATURES as u32;
pub const SET_PROTOCOL_FEATURES: u32 = FrontendReq::SET_PROTOCOL_FEATURES as u32;
pub const SET_VRING_ENABLE: u32 = FrontendReq::SET_VRING_ENABLE as u32;
pub const CREATE_CRYPTO_SESSION: u32 = FrontendReq::CREATE_CRYPTO_SESSION as u32;
pub const CLOSE_CRYPTO_SESSION: u32 = FrontendReq::CLOSE_CRYPTO_SESSION as u32;
pub const GET_MAX_MEM_SLOTS: u32 = FrontendReq::GET_MAX_MEM_SLOTS as u32;
pub const ADD_MEM_REG: u32 = FrontendReq::ADD_MEM_REG as u32;

/// `VHOST_USER_F_PROTOCOL_FEATURES`, bit 30 of the virtio feature set
/// (vhost-user spec, "Feature bits").
pub const F_PROTOCOL_FEATURES: u64 = VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
/// `VHOST_USER_PROTOCOL_F_*` bits (vhost-user spec, "Protocol features"):
/// the two the daemon offers and needs here, and three it does not offer.
pub const PF_REPLY_ACK: u64 = VhostUserProtocolFeatures::REPLY_ACK.bits();
pub const PF_CRYPTO_SESSION: u64 = VhostUserProtocolFeatures::CRYPTO_SESSION.bits();
pub const PF_CONFIG: u64 = VhostUserProtocolFeatures::CONFIG.bits();
pub const PF_INFLIGHT_SHMFD: u64 = VhostUserProtocolFeatures::INFLIGHT_SHMFD.bits();
pub const PF_CONFIGURE_MEM_SLOTS: u64 = VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS.bits();

/// virtio-crypto status bytes (VIRTIO 1.2 §5.9.7.1; docs/PROTOCOL.md §6).
pub const OK: u8 = Status::Ok as u8;
pub const ERR: u8 = Status::Err as u8;
pub const NOTSUPP: u8 = Status::NotSupp as u8;
pub const INVSESS: u8 = Status::InvSess as u8;

/// Session ids of refused CREATEs: the status, negated (docs/PROTOCOL.md
/// §2.2).
pub const ID_ERR: i64 = -(Status::Err as i64);
pub const ID_NOSPC: i64 = -(Status::NoSpc as i64);

/// Data opcodes of the cipher service (VIRTIO 1.2 §5.9.7.2).
pub const ENCRYPT: u32 = VIRTIO_CRYPTO_CIPHER_ENCRYPT;
pub const DECRYPT: u32 = VIRTIO_CRYPTO_CIPHER_DECRYPT;
