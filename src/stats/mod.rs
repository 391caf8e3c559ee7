// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Live statistics: counters of the data queues and of the session
//! registry since the daemon started, and the JSON object the stats
//! socket (`--stats-socket`, [`server`]) gives each client.
//!
//! QEMU counts cryptodev operations only in
//! `cryptodev_backend_crypto_operation()` (`backends/cryptodev.c`), which
//! vhost-user bypasses, so its `query-stats` counters stay at 0 with this
//! daemon: the daemon counts on its own.
//!
//! Counting on the data path costs no shared atomic per request: a queue
//! worker adds each completion to a plain [`BatchCounts`] on its stack,
//! and once per batch adds that to its queue's [`QueueStats`] (a handful
//! of `Relaxed` additions to a cache line only that worker writes). The
//! per-queue counters are process-wide and outlive connections (each
//! connection's backend and workers are made anew,
//! `crate::daemon::serve_stream`), so nothing is reset when a frontend
//! disconnects. Readers sum the queues when they read.
//!
//! Units and meanings (`docs/OPERATING.md`):
//!
//! * `requests`: completed requests, i.e. used elements written, with or
//!   without a status byte (one without counts under no `status`);
//! * `bytes_in`: `src_data_len` of the requests completed with status OK,
//!   the length QEMU's cryptodev counts per symmetric operation
//!   (`sym-encrypt-bytes`, `sym-decrypt-bytes`: `len = sym_op_info->src_len`
//!   in `cryptodev_backend_account()`, `backends/cryptodev.c`);
//! * `bytes_out`: bytes the device wrote to device-writable buffers before
//!   the status byte (dst and digest: the used length less the status
//!   byte);
//! * `batches`: batches that completed at least one request;
//! * `notifications`: used-buffer notifications signalled on the call
//!   eventfd;
//! * `throttled_s`: time the queue's worker spent throttled by the rate
//!   limits, in seconds ([`QueueStats::throttled_ns`]).

pub mod server;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::Instant;

use serde::Serialize;

use crate::wire::virtio_crypto::Status;

/// Most data queues the daemon serves (`--queues`).
pub const MAX_QUEUES: usize = 64;

/// Status values counted, indexed by `virtio_crypto_inhdr.status` (OK,
/// ERR, BADMSG, NOTSUPP, INVSESS, NOSPC; spec §5.9.7.1).
const STATUSES: usize = 6;

/// One queue's counters since the daemon started. Aligned to 128 bytes
/// (two cache lines, the unit the adjacent-line prefetcher pulls in) so
/// that queues never share a line.
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct QueueStats {
    requests: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    status: [AtomicU64; STATUSES],
    batches: AtomicU64,
    notifications: AtomicU64,
    /// Nanoseconds the queue's worker spent throttled (not taking requests
    /// from the avail ring because the rate limits' budget was spent); the
    /// rate limiter adds to it, the stats report it in seconds.
    pub throttled_ns: AtomicU64,
}

/// What a worker counts over one batch: plain integers on its stack,
/// added to its [`QueueStats`] once at the end ([`QueueStats::publish`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BatchCounts {
    /// `src_data_len` of the requests completed OK.
    pub bytes_in: u64,
    /// Used lengths less the status byte.
    pub bytes_out: u64,
    /// Completions by status byte written.
    pub status: [u64; STATUSES],
}

impl BatchCounts {
    /// Counts one completion: its used length, the status byte written
    /// (none: the chain had no status byte) and the request's validated
    /// `src_data_len`, counted when it completed OK
    /// (`crate::crypto::Completion`'s fields).
    #[inline]
    pub fn record(&mut self, used_len: u32, status: Option<Status>, src_len: u64) {
        if status == Some(Status::Ok) {
            self.bytes_in += src_len;
        }
        // (0 without a status byte: nothing was written.)
        self.bytes_out += u64::from(used_len.saturating_sub(1));
        if let Some(s) = status {
            self.status[s as usize] += 1;
        }
    }
}

/// Adds `n` to `a` unless it is 0 (most batches have no error statuses).
#[inline]
fn add(a: &AtomicU64, n: u64) {
    if n != 0 {
        a.fetch_add(n, Relaxed);
    }
}

impl QueueStats {
    /// Adds a batch of `requests` completions, counted in `c`.
    #[inline]
    pub fn publish(&self, requests: u32, c: &BatchCounts) {
        self.requests.fetch_add(u64::from(requests), Relaxed);
        self.batches.fetch_add(1, Relaxed);
        add(&self.bytes_in, c.bytes_in);
        add(&self.bytes_out, c.bytes_out);
        for (a, &n) in self.status.iter().zip(&c.status) {
            add(a, n);
        }
    }

    /// Counts a used-buffer notification signalled on the call eventfd.
    #[inline]
    pub fn notified(&self) {
        self.notifications.fetch_add(1, Relaxed);
    }

    /// The counters as they are when read.
    pub fn counters(&self) -> Counters {
        let status = |i: usize| self.status[i].load(Relaxed);
        Counters {
            requests: self.requests.load(Relaxed),
            bytes_in: self.bytes_in.load(Relaxed),
            bytes_out: self.bytes_out.load(Relaxed),
            status: StatusCounts {
                ok: status(0),
                err: status(1),
                badmsg: status(2),
                notsupp: status(3),
                invsess: status(4),
            },
            batches: self.batches.load(Relaxed),
            notifications: self.notifications.load(Relaxed),
            throttled_ns: self.throttled_ns.load(Relaxed),
        }
    }
}

/// Session registry counters since the daemon started, all connections
/// together (`crate::sessions::SessionRegistry` counts them, and the
/// frontend layer the CREATEs whose payload it cannot decode).
#[derive(Debug, Default)]
pub struct SessionStats {
    live: AtomicU64,
    created: AtomicU64,
    closed: AtomicU64,
    dropped: AtomicU64,
    create_failed: AtomicU64,
}

impl SessionStats {
    /// A CREATE answered with a session id.
    pub fn created(&self) {
        self.created.fetch_add(1, Relaxed);
        self.live.fetch_add(1, Relaxed);
    }

    /// A CREATE answered with a negative value.
    pub fn create_failed(&self) {
        self.create_failed.fetch_add(1, Relaxed);
    }

    /// A live session closed by a CLOSE (DESTROY_SESSION).
    pub fn closed(&self) {
        self.closed.fetch_add(1, Relaxed);
        self.live.fetch_sub(1, Relaxed);
    }

    /// `n` live sessions ended with their connection.
    pub fn dropped(&self, n: u64) {
        self.dropped.fetch_add(n, Relaxed);
        self.live.fetch_sub(n, Relaxed);
    }
}

/// The daemon's counters ([`daemon`]).
#[derive(Debug)]
pub struct DaemonStats {
    start: Instant,
    frontend_connected: AtomicBool,
    queues: [QueueStats; MAX_QUEUES],
    /// The session registry's counters.
    pub sessions: SessionStats,
}

/// The process's counters, made on first use (the daemon makes them at
/// start-up, which is where `uptime_s` counts from).
pub fn daemon() -> &'static DaemonStats {
    static STATS: OnceLock<DaemonStats> = OnceLock::new();
    STATS.get_or_init(|| DaemonStats {
        start: Instant::now(),
        frontend_connected: AtomicBool::new(false),
        queues: std::array::from_fn(|_| QueueStats::default()),
        sessions: SessionStats::default(),
    })
}

impl DaemonStats {
    /// Queue `index`'s counters; `None` past [`MAX_QUEUES`].
    pub fn queue(&self, index: usize) -> Option<&QueueStats> {
        self.queues.get(index)
    }

    /// Marks a frontend connected until the returned guard is dropped.
    pub fn frontend_connected(&'static self) -> ConnectedGuard {
        self.frontend_connected.store(true, Relaxed);
        ConnectedGuard(self)
    }

    /// The counters of the first `queues` queues, their totals, and the
    /// rest, as the stats socket gives them.
    pub fn snapshot(&self, queues: usize) -> Snapshot {
        let list: Vec<QueueEntry> = self
            .queues
            .iter()
            .take(queues)
            .enumerate()
            .map(|(index, q)| QueueEntry {
                index,
                counters: q.counters(),
            })
            .collect();
        let totals = list.iter().fold(Counters::default(), |t, q| t.plus(&q.counters));
        let s = &self.sessions;
        Snapshot {
            uptime_s: self.start.elapsed().as_secs_f64(),
            frontend_connected: self.frontend_connected.load(Relaxed),
            sessions: SessionCounts {
                live: s.live.load(Relaxed),
                created: s.created.load(Relaxed),
                closed: s.closed.load(Relaxed),
                create_failed: s.create_failed.load(Relaxed),
                dropped: s.dropped.load(Relaxed),
            },
            totals,
            queues: list,
        }
    }
}

/// Marks the frontend disconnected when dropped
/// ([`DaemonStats::frontend_connected`]).
#[derive(Debug)]
pub struct ConnectedGuard(&'static DaemonStats);

impl Drop for ConnectedGuard {
    fn drop(&mut self) {
        self.0.frontend_connected.store(false, Relaxed);
    }
}

/// The object each stats client gets (field meanings: the module
/// documentation).
#[derive(Debug, Clone, Serialize)]
pub struct Snapshot {
    /// Seconds since the daemon started.
    pub uptime_s: f64,
    /// Whether a frontend is connected.
    pub frontend_connected: bool,
    /// Session counters.
    pub sessions: SessionCounts,
    /// The queues' counters summed.
    pub totals: Counters,
    /// Each queue's counters.
    pub queues: Vec<QueueEntry>,
}

/// Session counters: `live` when read; the others since the daemon started.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct SessionCounts {
    /// Sessions live when read (0 with no frontend).
    pub live: u64,
    /// CREATEs answered with a session id.
    pub created: u64,
    /// Sessions closed by a CLOSE.
    pub closed: u64,
    /// CREATEs answered with a negative value (an error status).
    pub create_failed: u64,
    /// Sessions still live when their frontend disconnected (ended with
    /// the connection; `live = created - closed - dropped`).
    pub dropped: u64,
}

/// Requests completed, by status byte.
#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct StatusCounts {
    /// `VIRTIO_CRYPTO_OK`.
    pub ok: u64,
    /// `VIRTIO_CRYPTO_ERR`.
    pub err: u64,
    /// `VIRTIO_CRYPTO_BADMSG`.
    pub badmsg: u64,
    /// `VIRTIO_CRYPTO_NOTSUPP`.
    pub notsupp: u64,
    /// `VIRTIO_CRYPTO_INVSESS`.
    pub invsess: u64,
}

/// One queue's counters, or their totals.
#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct Counters {
    /// Completed requests (used elements written).
    pub requests: u64,
    /// `src_data_len` of the requests completed OK, in bytes.
    pub bytes_in: u64,
    /// Bytes written before the status byte (dst, digest).
    pub bytes_out: u64,
    /// Completions by status byte.
    pub status: StatusCounts,
    /// Batches that completed requests.
    pub batches: u64,
    /// Used-buffer notifications signalled.
    pub notifications: u64,
    /// Time throttled by the rate limits, in seconds.
    #[serde(rename = "throttled_s", serialize_with = "ns_as_seconds")]
    pub throttled_ns: u64,
}

fn ns_as_seconds<S: serde::Serializer>(ns: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(*ns as f64 / 1e9)
}

impl Counters {
    fn plus(self, o: &Counters) -> Counters {
        Counters {
            requests: self.requests + o.requests,
            bytes_in: self.bytes_in + o.bytes_in,
            bytes_out: self.bytes_out + o.bytes_out,
            status: StatusCounts {
                ok: self.status.ok + o.status.ok,
                err: self.status.err + o.status.err,
                badmsg: self.status.badmsg + o.status.badmsg,
                notsupp: self.status.notsupp + o.status.notsupp,
                invsess: self.status.invsess + o.status.invsess,
            },
            batches: self.batches + o.batches,
            notifications: self.notifications + o.notifications,
            throttled_ns: self.throttled_ns + o.throttled_ns,
        }
    }
}

/// A queue's counters with its index (`index` first in the object).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct QueueEntry {
    /// Data queue index (0 is the first data queue).
    pub index: usize,
    /// Its counters.
    #[serde(flatten)]
    pub counters: Counters,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_counts_by_status_and_lengths() {
        let mut b = BatchCounts::default();
        b.record(65, Some(Status::Ok), 64);
        b.record(1, Some(Status::InvSess), 0);
        b.record(0, None, 0);
        b.record(1, Some(Status::Err), 0);
        assert_eq!(b.bytes_in, 64);
        assert_eq!(b.bytes_out, 64);
        assert_eq!(b.status, [1, 1, 0, 0, 1, 0]);
        let q = QueueStats::default();
        q.publish(4, &b);
        q.publish(4, &b);
        q.notified();
        q.throttled_ns.fetch_add(1_500_000_000, Relaxed);
        let r = q.counters();
        assert_eq!((r.requests, r.bytes_in, r.bytes_out, r.batches), (8, 128, 128, 2));
        assert_eq!(
            (r.status.ok, r.status.err, r.status.invsess, r.status.badmsg),
            (2, 2, 2, 0)
        );
        let v = serde_json::to_value(QueueEntry {
            index: 3,
            counters: r,
        })
        .unwrap();
        assert_eq!(v["index"], 3);
        assert_eq!(v["throttled_s"], 1.5);
        assert_eq!(v["notifications"], 1);
        assert_eq!(v["status"]["notsupp"], 0);
    }

    #[test]
    fn queue_counters_keep_to_their_own_lines() {
        assert_eq!(std::mem::align_of::<QueueStats>(), 128);
        assert_eq!(std::mem::size_of::<QueueStats>(), 128);
    }
}
