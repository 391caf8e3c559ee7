// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The end-to-end suite: the daemon binary against real frontends.
//!
//! * [`qemu`]: a Linux 6.1 guest under QEMU 7.2 and 10.0 (TCG) whose
//!   virtio-crypto-pci device the daemon serves; the guest's kernel
//!   self-test, NIST known answers through AF_ALG, a cross-check against
//!   the guest's own AES and rekeys;
//! * [`soak`]: the replay tool's soak, 100,000 mixed requests with rekeys
//!   in flight, every output checked against OpenSSL too;
//! * [`throttle`]: the rate limits, behaviour tests with wide bounds
//!   (20,000 requests in 3.6 to 4.8 s at each limit, two backlogged
//!   queues sharing the budget).
//!
//! The known-answer traces the replay tool sends are replayed by its own
//! tests (`tools/replay/tests`) and by `tools/test.sh`.
//!
//! Process-wide state: a QEMU guest under TCG is CPU-bound and its speed
//! loop is timed, so each guest runs alone in this binary ([`alone`]),
//! while the soaks may run beside each other ([`shared`]) but not beside
//! a guest.

use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

#[path = "../common/mod.rs"]
mod common;

mod qemu;
mod soak;
mod throttle;

/// Taken by every test of this binary: alone by a QEMU guest, shared by
/// the soaks.
static CPU: RwLock<()> = RwLock::new(());

/// Holds every other test of this binary off until dropped.
fn alone() -> RwLockWriteGuard<'static, ()> {
    CPU.write().unwrap_or_else(|e| e.into_inner())
}

/// Holds a QEMU guest off until dropped; other holders run beside.
fn shared() -> RwLockReadGuard<'static, ()> {
    CPU.read().unwrap_or_else(|e| e.into_inner())
}
