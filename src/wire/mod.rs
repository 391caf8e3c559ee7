// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Wire facts, defined once and shared by the daemon, the replay tool, the
//! fuzz targets and the tests. This module set needs none of the backend's
//! dependencies: the replay tool uses it with `default-features = false`.
//!
//! Each definition is pinned to the literal value of its source (VIRTIO 1.2
//! §5.9, QEMU's `hw/virtio/vhost-user.c`, QEMU's `docs/interop/vhost-user.rst`)
//! by a test beside it, so that a wrong shared value cannot hide behind the
//! fact that every side uses it.

pub mod session;
pub mod split_ring;
pub mod vhost_user;
pub mod virtio_crypto;
