// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! `VIRTIO_F_NOTIFY_ON_EMPTY` (bit 24, VIRTIO 1.2 §6.3): once a frontend
//! acks it, the device notifies when the avail ring becomes empty, even
//! when the driver suppressed notifications with
//! `VRING_AVAIL_F_NO_INTERRUPT` or with `used_event` (EVENT_IDX), as
//! QEMU's `virtio_split_should_notify` (hw/virtio/virtio.c) does. Without
//! it, the suppression holds (the control that shows the driver's
//! suppression is in effect).

use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use crate::common::*;
use crate::support::*;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// `VIRTIO_F_NOTIFY_ON_EMPTY` (VIRTIO 1.2 §6.3).
const F_NOTIFY_ON_EMPTY: u64 = 1 << 24;
/// `VIRTIO_F_EVENT_IDX` (VIRTIO 1.2 §6.3).
const F_EVENT_IDX: u64 = 1 << 29;
/// `VIRTQ_AVAIL_F_NO_INTERRUPT` (VIRTIO 1.2 §2.7.6).
const AVAIL_F_NO_INTERRUPT: u16 = 1;
/// How long a notification is waited for after the used index moved.
const WINDOW: Duration = Duration::from_millis(300);

/// How the driver asks not to be notified.
#[derive(Debug, Clone, Copy)]
enum Suppress {
    /// `avail.flags` = `VRING_AVAIL_F_NO_INTERRUPT`, EVENT_IDX not acked.
    NoInterrupt,
    /// EVENT_IDX acked, `used_event` half the index space away.
    UsedEventFarAway,
}

/// Three NIST F.2.1 requests one after the other on a daemon whose
/// frontend acked `features` plus what `suppress` needs; each must be
/// served right. Returns, per request, whether the call eventfd was
/// signalled within [`WINDOW`] of its used index.
fn signalled(suppress: Suppress, notify_on_empty: bool) -> Vec<bool> {
    let mut daemon = Daemon::spawn(&[]);
    let mut features = F_PROTOCOL_FEATURES;
    if notify_on_empty {
        features |= F_NOTIFY_ON_EMPTY;
    }
    if let Suppress::UsedEventFarAway = suppress {
        features |= F_EVENT_IDX;
    }
    let c = Conn::negotiated_with(&daemon.sock, features);
    let mem = memfd(MEM_SIZE);
    let kick = EventFd::new(EFD_NONBLOCK).unwrap();
    let call = EventFd::new(EFD_NONBLOCK).unwrap();
    raw_ring(&c, &mem, &kick, &call);
    let sid = create_nist_session(&c);
    let ring = raw_split_ring(RAW_DESC);
    match suppress {
        Suppress::NoInterrupt => mem
            .write_all_at(&AVAIL_F_NO_INTERRUPT.to_le_bytes(), ring.avail)
            .unwrap(),
        Suppress::UsedEventFarAway => mem
            .write_all_at(&0x8000u16.to_le_bytes(), ring.used_event())
            .unwrap(),
    }
    let mut seen = Vec::new();
    for n in 1..=3u16 {
        submit_raw_nist(&mem, &kick, sid, n);
        let start = Instant::now();
        while used_idx_at(&mem, RAW_DESC) != n {
            assert!(start.elapsed() < TIMEOUT, "request {n} not served ({suppress:?})");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_raw_nist_ok(n, raw_nist_result(&mem, n));
        let start = Instant::now();
        let mut got = false;
        while !got && start.elapsed() < WINDOW {
            got = call.read().is_ok();
            std::thread::sleep(Duration::from_millis(1));
        }
        seen.push(got);
    }
    drop(c);
    daemon.assert_alive("requests with notifications suppressed");
    seen
}

/// Acked, with NO_INTERRUPT and with `used_event` far away: every
/// completion that leaves the ring empty is signalled.
#[test]
fn notify_on_empty_signals_completions_that_empty_the_ring() {
    for suppress in [Suppress::NoInterrupt, Suppress::UsedEventFarAway] {
        assert_eq!(
            signalled(suppress, true),
            [true; 3],
            "{suppress:?}: call eventfd signalled after each request"
        );
    }
}

/// Not acked: the same suppression holds, nothing is signalled.
#[test]
fn without_notify_on_empty_suppressed_completions_are_not_signalled() {
    for suppress in [Suppress::NoInterrupt, Suppress::UsedEventFarAway] {
        assert_eq!(
            signalled(suppress, false),
            [false; 3],
            "{suppress:?}: call eventfd not signalled"
        );
    }
}
