// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The queue worker: one data queue's batches, from the avail ring to the
//! used ring (VIRTIO 1.2 §2.7).
//!
//! One batch per [`QueueWorker::process`] call: read the avail index once,
//! walk and execute every new chain (at most [`MAX_BATCH`]), write the used
//! elements, publish the used index with one store, then publish
//! `avail_event`. The caller signals the call eventfd once per batch that
//! completed anything and calls again; a call that finds the ring empty
//! with kicks wanted publishes `avail_event` and reads the avail index once
//! more before the caller sleeps.
//!
//! The backend is never told whether the guest negotiated
//! `VIRTIO_RING_F_EVENT_IDX` (QEMU's cryptodev-vhost-user only sends
//! `SET_FEATURES` = `VHOST_USER_F_PROTOCOL_FEATURES`, `docs/PROTOCOL.md`
//! §4.2, §7), so `avail_event` is always kept current: a guest that uses
//! it keeps kicking, one that does not ignores it.
//!
//! Ring memory is translated once per batch. Ring fields are read with
//! volatile or atomic accesses, each exactly once.
//!
//! Notification suppression (VIRTIO 1.2 §2.7.7, §2.7.10): while the caller
//! busy-polls the ring ([`QueueWorker::set_polling`]), kicks are not
//! wanted: `avail_event` is set half the ring index space ahead and the
//! used ring's `VRING_USED_F_NO_NOTIFY` flag is set, so neither kind of
//! driver kicks; when polling ends both are reset and the avail index read
//! again. In the other direction, [`BatchResult::notify`] says whether the
//! driver asked to be told about this batch: with `VIRTIO_RING_F_EVENT_IDX`
//! acked by the frontend, only when the batch's used entries cross
//! `used_event`; without, unless the driver set `VRING_AVAIL_F_NO_INTERRUPT`
//! (a QEMU guest that negotiated EVENT_IDX with QEMU never sets that flag,
//! so it is always notified). With `VIRTIO_F_NOTIFY_ON_EMPTY` acked, a
//! batch after which the avail ring is empty is always notified, whatever
//! the flag or `used_event` say (VIRTIO 1.2 §6.3; QEMU's
//! `virtio_split_should_notify`, hw/virtio/virtio.c).

use std::sync::atomic::{fence, Ordering};

use log::{debug, error};

use algorithms::MAX_LANES;
use vm_memory::GuestMemoryMmap;

use crate::crypto::{prepare, run_lanes, LaneReq, Prepared, RequestLimits};
use crate::sessions::{wipe_stack, SessionTable, WORKER_STACK_WIPE_BYTES};
use crate::stats::{BatchCounts, QueueStats};
use crate::virtq::descriptor::ChainWalker;
use crate::virtq::ring::{
    vring_need_event, QueueError, Ring, RingAddrs, VRING_AVAIL_F_NO_INTERRUPT, VRING_USED_F_NO_NOTIFY,
};
use crate::wire::split_ring::MAX_QUEUE_SIZE;

/// Most chains taken from the avail ring before their used elements are
/// published (one used-index store each): a driver that keeps the ring
/// full gets completions while the rest of a long batch is still being
/// processed, so driver and device work at the same time (DPDK's
/// vhost-crypto bursts are 64 too).
pub const MAX_BATCH: u16 = 64;

/// A batch also ends once its requests have gone through this many bytes
/// of guest data ([`crate::crypto::Completion::work`], plus
/// [`DESCRIPTOR_WORK`] for each descriptor of a long chain; checked after
/// each request or group of lanes): with 16 KiB requests, the driver gets
/// each group of lanes (16) as soon as it is done, and a batch holds the worker's
/// locks for about this many bytes of cipher and MAC work plus one
/// request and one group of lanes (lanes count when they run), whatever
/// the used lengths (a failed digest check hashes all of its src and
/// completes with 1 byte) and however long the chains.
pub const MAX_BATCH_BYTES: u64 = 64 * 1024;

/// What one descriptor past a chain's first [`FREE_DESCRIPTORS`] counts
/// towards [`MAX_BATCH_BYTES`], in bytes: walking a descriptor took 2.5–10
/// ns here (an uncached region lookup for some), about what hashing 4–14
/// bytes takes. The walker accepts a chain of up to the queue size of
/// descriptors, or an indirect table of up to 32,768 entries
/// ([`ChainWalker::descriptors`]): 64 such chains took
/// 5–10 ms before they were counted.
pub const DESCRIPTOR_WORK: u64 = 16;

/// Descriptors of a chain that count nothing towards the batch byte cap:
/// more than any driver's request needs (QEMU's and DPDK's layouts use 5
/// or 6), so batches of honest requests are not cut shorter.
pub const FREE_DESCRIPTORS: u32 = 16;

/// Per-queue worker: session table and reusable scratch.
#[derive(Debug)]
pub struct QueueWorker {
    /// The sessions this queue can use.
    pub sessions: SessionTable,
    /// Whether the frontend acked `VIRTIO_RING_F_EVENT_IDX` (then the
    /// driver's `used_event` decides [`BatchResult::notify`]).
    pub event_idx: bool,
    /// Whether the frontend acked `VIRTIO_F_NOTIFY_ON_EMPTY` (then a
    /// batch that leaves the avail ring empty is always notified).
    pub notify_on_empty: bool,
    polling: bool,
    walker: ChainWalker,
    /// (head, used length) of the batch, in avail order; allocated once.
    done: Vec<(u16, u32)>,
    limits: RequestLimits,
    stopped: Option<RingAddrs>,
    /// The last ring whose memory did not map, logged once.
    unmapped: Option<RingAddrs>,
    /// The session table's close count when this worker last wiped its
    /// stack.
    closes_seen: u64,
    /// Requests completed on this queue.
    pub completed: u64,
    /// Where each batch's counts are added ([`crate::stats`]); none for
    /// a worker outside the daemon (benches, tests).
    stats: Option<&'static QueueStats>,
    /// Whether the last batch turned the driver's kicks off (polling),
    /// until they are turned on again
    /// ([`QueueWorker::enable_suppressed_kicks`]).
    kicks_off: bool,
    /// Most chains per batch: [`MAX_BATCH`], or less under a rate limit
    /// ([`QueueWorker::set_batch_caps`]).
    max_batch: u16,
    /// A batch ends once its requests' `src_data_len` reach this
    /// (`u64::MAX`: no byte limit).
    max_batch_src: u64,
}

/// Runs the waiting lanes, records their used lengths and counts them in
/// `counts`; returns the bytes they went through
/// ([`crate::crypto::Completion::work`]).
fn flush_lanes(
    lanes: &mut [Option<LaneReq<'_>>; MAX_LANES],
    slots: &[usize; MAX_LANES],
    n: &mut usize,
    done: &mut [(u16, u32)],
    counts: &mut BatchCounts,
) -> u64 {
    run_lanes(&mut lanes[..*n]);
    let mut bytes = 0;
    for (l, &slot) in lanes[..*n].iter_mut().zip(slots) {
        if let (Some(l), Some(d)) = (l.take(), done.get_mut(slot)) {
            let c = l.completion();
            d.1 = c.used_len;
            bytes += c.work;
            counts.record(c.used_len, c.status, c.src_len);
        }
    }
    *n = 0;
    bytes
}

/// Result of one call to [`QueueWorker::process`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BatchResult {
    /// Chains put on the used ring.
    pub completed: u32,
    /// Whether the driver wants a used-buffer notification for them (see
    /// the module documentation); false when nothing completed.
    pub notify: bool,
    /// `src_data_len` of the chains put on the used ring that passed
    /// validation ([`crate::crypto::Completion::src_len`]): what the rate
    /// limit charges ([`crate::throttle`]).
    pub src_bytes: u64,
}

impl QueueWorker {
    /// A worker using `sessions`, applying `limits` to every request.
    pub fn new(sessions: SessionTable, limits: RequestLimits) -> Self {
        // The process-wide engine choices read the environment, which
        // allocates: make them here, not on the first batch.
        let _ = (algorithms::aes_engine(), algorithms::sha_engine());
        QueueWorker {
            sessions,
            event_idx: false,
            notify_on_empty: false,
            polling: false,
            walker: ChainWalker::new(),
            done: Vec::with_capacity(usize::from(MAX_QUEUE_SIZE)),
            limits,
            stopped: None,
            unmapped: None,
            closes_seen: 0,
            completed: 0,
            stats: None,
            kicks_off: false,
            max_batch: MAX_BATCH,
            max_batch_src: u64::MAX,
        }
    }

    /// Adds each batch's counts to `stats` from the next batch on (none:
    /// counts nothing).
    pub fn set_stats(&mut self, stats: Option<&'static QueueStats>) {
        self.stats = stats;
    }

    /// Counts a used-buffer notification signalled for this queue.
    pub fn notified(&self) {
        if let Some(s) = self.stats {
            s.notified();
        }
    }

    /// Caps each batch at `ops` chains (at most [`MAX_BATCH`], at least 1)
    /// and ends it once its requests' `src_data_len` reach `src_bytes`
    /// (after the request that reaches it): the rate limit's batch caps
    /// ([`crate::throttle::Throttle::batch_caps`]).
    pub fn set_batch_caps(&mut self, ops: u64, src_bytes: u64) {
        self.max_batch = u16::try_from(ops).unwrap_or(MAX_BATCH).clamp(1, MAX_BATCH);
        self.max_batch_src = src_bytes.max(1);
    }

    /// Whether the caller busy-polls the ring after this call (kicks are
    /// then suppressed, see the module documentation). Turning it off takes
    /// effect at the next [`QueueWorker::process`], which re-enables kicks
    /// (and, finding the ring empty, reads the avail index again before
    /// returning).
    pub fn set_polling(&mut self, polling: bool) {
        self.polling = polling;
    }

    /// Turns the driver's notifications back on without processing
    /// anything (`used.flags` 0, `avail_event` at the current avail index):
    /// for a ring the frontend disabled while this worker polled it with
    /// kicks suppressed, so that the driver kicks again for its next
    /// request. A ring whose memory does not map is left alone.
    pub fn enable_notifications(&mut self, mem: &GuestMemoryMmap, addrs: RingAddrs) {
        if let Ok(ring) = Ring::map(mem, addrs) {
            ring.enable_kicks(ring.avail_idx());
        }
        self.polling = false;
        self.kicks_off = false;
    }

    /// Turns the driver's notifications back on if the last batch, polling,
    /// turned them off: for a ring being stopped (GET_VRING_BASE), so that
    /// whoever serves it next gets the driver's kicks. `current` is the
    /// ring as the frontend has it set up now, which is where they are
    /// turned on: a frontend may have moved or resized the ring since that
    /// batch without stopping it first, and the old place is then not a
    /// ring any more.
    pub fn enable_suppressed_kicks(&mut self, mem: &GuestMemoryMmap, current: RingAddrs) {
        if std::mem::take(&mut self.kicks_off) {
            self.enable_notifications(mem, current);
        }
    }

    /// Forgets a stopped ring (the frontend stopped the ring with
    /// GET_VRING_BASE; it may set it up again at the same addresses).
    pub fn reset(&mut self) {
        self.stopped = None;
        self.unmapped = None;
    }

    /// Processes one batch of what is available on the ring (at most
    /// [`MAX_BATCH`] chains, ending early at [`MAX_BATCH_BYTES`]), updating
    /// `next_avail` and `next_used`; the caller calls again while it
    /// completes any, and lets go of its locks in between, so that a
    /// control message waiting for them waits for one batch at most.
    ///
    /// A ring that is broken (bad size, or an avail index that jumped past
    /// the queue size, H10) is stopped: logged once, never processed again
    /// until the frontend sets it up anew (other addresses) or stops it
    /// ([`QueueWorker::reset`]). A ring whose memory does not map
    /// (unmapped, misaligned) is logged once and looked at again on each
    /// call: a later memory table may map it.
    ///
    /// When a session was closed in this queue's table since the last
    /// time, the worker's stack is wiped before returning
    /// ([`crate::sessions::wipe_stack`]): the batches before the CLOSE may
    /// have left copies of its key material there. (One atomic load per
    /// call otherwise.)
    pub fn process(
        &mut self,
        mem: &GuestMemoryMmap,
        addrs: RingAddrs,
        next_avail: &mut u16,
        next_used: &mut u16,
    ) -> BatchResult {
        let r = self.process_batches(mem, addrs, next_avail, next_used);
        let closes = self.sessions.closes();
        if closes != self.closes_seen {
            self.closes_seen = closes;
            wipe_stack::<WORKER_STACK_WIPE_BYTES>();
        }
        r
    }

    /// [`QueueWorker::process`] without the stack wipe: kept out of line,
    /// so that everything that touches keys runs in frames below the one
    /// that wipes.
    #[inline(never)]
    fn process_batches(
        &mut self,
        mem: &GuestMemoryMmap,
        addrs: RingAddrs,
        next_avail: &mut u16,
        next_used: &mut u16,
    ) -> BatchResult {
        if self.stopped == Some(addrs) {
            return BatchResult::default();
        }
        self.stopped = None;
        match self.run(mem, addrs, next_avail, next_used) {
            Ok(r) => {
                self.unmapped = None;
                r
            }
            Err((QueueError::BadRingMemory, r)) => {
                // Nothing was done (the ring did not map). The frontend may
                // send a memory table that maps it (SET_MEM_TABLE): each
                // call maps it again, one translation per ring area.
                if self.unmapped != Some(addrs) {
                    error!("data queue not served: {}", QueueError::BadRingMemory);
                    self.unmapped = Some(addrs);
                }
                r
            }
            Err((e, r)) => {
                // (Nothing was completed: the errors come before a batch.)
                error!("data queue stopped: {e}");
                self.stopped = Some(addrs);
                r
            }
        }
    }

    fn run(
        &mut self,
        mem: &GuestMemoryMmap,
        addrs: RingAddrs,
        next_avail: &mut u16,
        next_used: &mut u16,
    ) -> Result<BatchResult, (QueueError, BatchResult)> {
        let mut result = BatchResult::default();
        let ring = Ring::map(mem, addrs).map_err(|e| (e, result))?;
        // `mem` may be a new memory map since the last call.
        self.walker.begin_batch();
        let first_used = *next_used;
        let mut avail = ring.avail_idx();
        if avail == *next_avail {
            // Nothing new: no session lock, no batch. Not polling: kicks
            // on, then one more look (a request made available meanwhile
            // may not have been kicked for).
            if self.polling {
                return Ok(result);
            }
            ring.enable_kicks(avail);
            self.kicks_off = false;
            avail = ring.avail_idx();
            if avail == *next_avail {
                return Ok(result);
            }
        }
        // One lock per batch; taking it applies what the session registry
        // posted meanwhile (a CREATE or CLOSE does not wait for this lock
        // while a batch holds it, `crate::sessions`).
        let sessions = self.sessions.lock();
        if self.sessions.is_wiped() {
            // The process is exiting (SIGTERM, SIGINT) and its keys are
            // being zeroized: take nothing more. A request taken now would
            // find its session gone and complete as INVSESS although the
            // driver never closed it; left on the avail ring, it ends with
            // the connection.
            return Ok(result);
        }
        let ahead = avail.wrapping_sub(*next_avail);
        if ahead > ring.size {
            // (Nothing was completed in this call.)
            return Err((
                QueueError::AvailIndexJump {
                    avail,
                    next_avail: *next_avail,
                    ahead,
                    size: ring.size,
                },
                result,
            ));
        }
        // Requests that take the lanes (`crate::crypto::lanes`) wait
        // here, up to MAX_LANES of one session, and run together.
        // Completions are put on the used ring in avail order at the
        // end of the batch; `slots` maps each waiting lane to its entry.
        let mut lanes: [Option<LaneReq<'_>>; MAX_LANES] = Default::default();
        let mut slots = [0usize; MAX_LANES];
        let mut n = 0;
        self.done.clear();
        let end = if ahead > self.max_batch {
            next_avail.wrapping_add(self.max_batch)
        } else {
            avail
        };
        // Bytes of guest data gone through in this batch (and long
        // chains walked): a batch of large requests ends after
        // MAX_BATCH_BYTES so the driver sees them, and the locks are
        // let go.
        let mut bytes: u64 = 0;
        // This batch's counts (plain integers; added to the queue's
        // counters once, below).
        let mut counts = BatchCounts::default();
        // The requests' `src_data_len`, for the rate limit: a throttled
        // batch also ends at its byte cap.
        let mut src: u64 = 0;
        while *next_avail != end && bytes < MAX_BATCH_BYTES && src < self.max_batch_src {
            let head = ring.avail_entry(*next_avail);
            *next_avail = next_avail.wrapping_add(1);
            result.completed += 1;
            // SAFETY: the descriptor table is mapped for `size` entries
            // and `mem` (borrowed for this call) keeps it mapped.
            unsafe { self.walker.walk(mem, ring.desc, ring.size, head) };
            if let Some(f) = self.walker.fault() {
                debug!("malformed descriptor chain at head {head}: {f:?}");
            }
            bytes += u64::from(self.walker.descriptors().saturating_sub(FREE_DESCRIPTORS)) * DESCRIPTOR_WORK;
            match prepare(&self.walker, &sessions, self.limits, true) {
                Prepared::Done(c) => {
                    bytes += c.work;
                    counts.record(c.used_len, c.status, c.src_len);
                    src += c.src_len;
                    self.done.push((head, c.used_len));
                }
                Prepared::Lane(l) => {
                    l.prefetch();
                    src += l.src_len();
                    let same_key = lanes[0].as_ref().is_none_or(|f| std::ptr::eq(f.key, l.key));
                    if !same_key {
                        bytes += flush_lanes(&mut lanes, &slots, &mut n, &mut self.done, &mut counts);
                    }
                    lanes[n] = Some(l);
                    slots[n] = self.done.len();
                    self.done.push((head, 0));
                    n += 1;
                    if n == MAX_LANES {
                        bytes += flush_lanes(&mut lanes, &slots, &mut n, &mut self.done, &mut counts);
                    }
                }
            }
        }
        flush_lanes(&mut lanes, &slots, &mut n, &mut self.done, &mut counts);
        for &(head, len) in &self.done {
            ring.put_used(*next_used, u32::from(head), len);
            *next_used = next_used.wrapping_add(1);
        }
        if result.completed > 0 {
            // Counted before the driver can see them: a stats client that
            // asks after a completion is seen finds it counted.
            if let Some(s) = self.stats {
                s.publish(result.completed, &counts);
            }
            // Used elements before the index (Release in the store).
            ring.publish_used_idx(*next_used);
        }
        if self.polling {
            // No kicks while the caller keeps looking (both kinds of
            // driver: event index far ahead, and the flag).
            ring.set_used_flags(VRING_USED_F_NO_NOTIFY);
            ring.set_avail_event(avail.wrapping_add(0x8000));
            self.kicks_off = true;
        } else {
            ring.set_used_flags(0);
            ring.set_avail_event(avail);
            self.kicks_off = false;
        }
        // The avail_event store must be visible before the avail index
        // is read again (by the caller's next call, which it makes
        // while calls complete any), or a kick could be lost
        // (driver/device race of VIRTIO 1.2 §2.7.10).
        fence(Ordering::SeqCst);
        if result.completed > 0 {
            result.notify = self.wants_notify(&ring, *next_avail, *next_used, first_used);
        }
        self.completed += u64::from(result.completed);
        result.src_bytes = src;
        Ok(result)
    }

    /// Whether the driver wants a notification for the used elements from
    /// `first_used` to `next_used` (see the module documentation). Read
    /// after the used index was published and fenced, so a driver that
    /// moves `used_event` concurrently is seen or sees us.
    fn wants_notify(&self, ring: &Ring, next_avail: u16, next_used: u16, first_used: u16) -> bool {
        if self.notify_on_empty && ring.avail_idx() == next_avail {
            // The ring is empty after these completions (nothing is in
            // flight between batches): VIRTIO 1.2 §6.3.
            return true;
        }
        if self.event_idx {
            vring_need_event(ring.used_event(), next_used, first_used)
        } else {
            ring.avail_flags() & VRING_AVAIL_F_NO_INTERRUPT == 0
        }
    }
}
