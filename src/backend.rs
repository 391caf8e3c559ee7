// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The `vhost-user-backend` device implementation: feature bits, memory,
//! and one worker thread per data queue running [`QueueWorker`].
//!
//! The worker threads are `vhost-user-backend`'s (`VringEpollHandler::run`,
//! spawned when the daemon object is made); our code first runs on one in
//! [`VhostUserBackend::handle_event`]. With a [`WorkerFilter`], that first
//! call installs it on the thread before anything else (see
//! [`crate::seccomp`]).

use std::cell::Cell;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use log::{debug, error, warn};
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackend, VringRwLock, VringT};
use virtio_bindings::virtio_config::{VIRTIO_F_NOTIFY_ON_EMPTY, VIRTIO_F_VERSION_1};
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use virtio_queue::QueueT;
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier};

use crate::crypto::RequestLimits;
use crate::eventfd::read_eventfd_nowait;
use crate::seccomp::WorkerFilter;
use crate::sessions::SessionTable;
use crate::throttle::Throttle;
use crate::virtq::ring::RingAddrs;
use crate::wire::split_ring::MAX_QUEUE_SIZE;
use crate::worker::QueueWorker;

/// Virtio features the backend offers: `VERSION_1`, `RING_F_INDIRECT_DESC`,
/// `RING_F_EVENT_IDX`, `NOTIFY_ON_EMPTY` (as DPDK's vhost-crypto offers it;
/// honoured when acked, `crate::worker`) and
/// `VHOST_USER_F_PROTOCOL_FEATURES`. QEMU acks only the last one for this
/// device (`docs/PROTOCOL.md` §4.2); other frontends may ack the others.
pub const FEATURES: u64 = (1 << VIRTIO_F_VERSION_1)
    | (1 << VIRTIO_RING_F_INDIRECT_DESC)
    | (1 << VIRTIO_RING_F_EVENT_IDX)
    | (1 << VIRTIO_F_NOTIFY_ON_EMPTY)
    | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();

/// vhost-user protocol features the backend offers: `MQ`, `REPLY_ACK` and
/// `CRYPTO_SESSION`. The frontend compatibility layer refuses a
/// `SET_PROTOCOL_FEATURES` with any other bit.
pub const PROTOCOL_FEATURES: u64 = VhostUserProtocolFeatures::MQ
    .union(VhostUserProtocolFeatures::REPLY_ACK)
    .union(VhostUserProtocolFeatures::CRYPTO_SESSION)
    .bits();

/// How long a queue worker serves a busy ring, batch after batch, before
/// it stays away from its locks for [`LOCK_GAP`], so that a control
/// message waiting for them gets them (see `process_vring`): 0.5 % of a
/// busy worker's time.
const LOCK_GAP_EVERY: Duration = Duration::from_millis(10);

/// How long the worker then leaves its locks alone.
const LOCK_GAP: Duration = Duration::from_micros(50);

/// Sleeps until queue `queue` may take requests again under the rate
/// limits ([`Throttle::sleep_until_ready`]) and adds the time slept to the
/// queue's `throttled_s` ([`crate::stats::QueueStats::throttled_ns`]).
/// `None`: the frontend is gone (`stop`).
fn throttle_wait(t: &Throttle, queue: usize, stop: &AtomicBool) -> Option<Duration> {
    let slept = t.sleep_until_ready(queue, stop)?;
    if !slept.is_zero() {
        if let Some(q) = crate::stats::daemon().queue(queue) {
            let ns = u64::try_from(slept.as_nanos()).unwrap_or(u64::MAX);
            q.throttled_ns.fetch_add(ns, Ordering::Relaxed);
        }
    }
    Some(slept)
}

/// The lock gap, if due: when [`LOCK_GAP_EVERY`] has passed from `since`
/// to `now` (the worker having taken its locks batch after batch, or look
/// after look, all that time), stays away from them for [`LOCK_GAP`] and
/// starts `since` anew. The worker must not hold them.
///
/// The locks are let go after every batch, but std's locks are not fair:
/// a control message that waits for them (GET_VRING_BASE,
/// SET_VRING_ENABLE) would lose every race to the worker taking them
/// again at once, for as long as the guest keeps the ring busy. The gap
/// spins on the CPU: a waiter on another CPU, woken when the locks were
/// let go, takes them meanwhile, and one on this CPU preempts the worker
/// when woken.
/// (Not a sleep: a vCPU that halts takes far longer to come back than the
/// gap.)
fn lock_gap_if_due(now: Instant, since: &mut Instant) {
    if now.duration_since(*since) < LOCK_GAP_EVERY {
        return;
    }
    let until = Instant::now() + LOCK_GAP;
    while Instant::now() < until {
        std::hint::spin_loop();
    }
    *since = Instant::now();
}

/// The virtio-crypto device backend for one frontend connection.
pub struct CryptoBackend {
    queues: usize,
    mem: RwLock<Option<GuestMemoryAtomic<GuestMemoryMmap>>>,
    workers: Vec<Mutex<QueueWorker>>,
    /// Per queue: the library's ring, kept from the first event that
    /// reaches the queue's `process_vring` (the library makes one per queue
    /// per connection, as this backend is), so that `stop_vring` sees where
    /// the ring is now.
    rings: Vec<OnceLock<VringRwLock>>,
    exit: Vec<(EventConsumer, EventNotifier)>,
    /// Per queue: an eventfd in its worker thread's epoll
    /// ([`CryptoBackend::wake_listener`]) that makes the worker look at
    /// its ring without a kick (after a memory table change).
    wake: Vec<(EventConsumer, EventNotifier)>,
    /// Per queue: a copy of the frontend's current kick eventfd of its
    /// ring, which the queue's worker thread watches itself (event id
    /// [`CryptoBackend::kick_event_id`], registered by the daemon,
    /// `crate::daemon::serve_stream`); the library gets an eventfd of the
    /// daemon's own (`crate::proxy::KickWatch`). Shared with the
    /// worker as an `Arc` (loaded without a lock), so that a replacement
    /// never waits for a worker reading the old one, and the old one stays
    /// open while a worker reads it.
    kick: Vec<ArcSwapOption<File>>,
    /// Whether an event set without `IN` was logged on this connection.
    odd_event_logged: AtomicBool,
    /// Whether a ring started without its SET_VRING_ADDR addresses was
    /// logged (once per connection).
    unaddressed_logged: AtomicBool,
    handed_out: Mutex<Vec<RawFd>>,
    poll: Duration,
    seccomp: Option<WorkerFilter>,
    event_idx: AtomicBool,
    /// Whether the frontend acked `VIRTIO_F_NOTIFY_ON_EMPTY` (SET_FEATURES).
    notify_on_empty: AtomicBool,
    disconnected: Arc<AtomicBool>,
    signal_failures: AtomicU64,
    /// The device-wide rate limits, shared by every connection (`None`:
    /// no limit, one branch per batch).
    throttle: Option<Arc<Throttle>>,
}

thread_local! {
    /// Whether this thread has installed the worker filter (a `const`
    /// thread-local of a `Cell<bool>`: no allocation, no destructor).
    static FILTERED: Cell<bool> = const { Cell::new(false) };
}

impl CryptoBackend {
    /// A backend with one data queue per table in `tables`, busy-polling
    /// each queue for `poll` after its last request (zero: not after the
    /// last request; while requests come the worker always polls).
    ///
    /// # Errors
    /// Creating the exit or wake eventfds failed.
    pub fn new(tables: Vec<SessionTable>, limits: RequestLimits, poll: Duration) -> io::Result<Self> {
        let queues = tables.len();
        let disconnected = Arc::new(AtomicBool::new(false));
        let stats = crate::stats::daemon();
        let workers = tables
            .into_iter()
            .enumerate()
            .map(|(i, t)| {
                let mut w = QueueWorker::new(t, limits);
                w.set_stats(stats.queue(i));
                Mutex::new(w)
            })
            .collect();
        let exit = (0..queues)
            .map(|_| new_event_consumer_and_notifier(EventFlag::NONBLOCK))
            .collect::<io::Result<Vec<_>>>()?;
        let wake = (0..queues)
            .map(|_| new_event_consumer_and_notifier(EventFlag::NONBLOCK))
            .collect::<io::Result<Vec<_>>>()?;
        Ok(CryptoBackend {
            queues,
            mem: RwLock::new(None),
            workers,
            rings: (0..queues).map(|_| OnceLock::new()).collect(),
            exit,
            wake,
            kick: (0..queues).map(|_| ArcSwapOption::empty()).collect(),
            odd_event_logged: AtomicBool::new(false),
            unaddressed_logged: AtomicBool::new(false),
            handed_out: Mutex::new(Vec::new()),
            poll,
            seccomp: None,
            event_idx: AtomicBool::new(false),
            notify_on_empty: AtomicBool::new(false),
            disconnected,
            signal_failures: AtomicU64::new(0),
            throttle: None,
        })
    }

    /// The same backend, whose queue workers take their batches' tokens
    /// from `throttle` (and cap their batches to its
    /// [`Throttle::batch_caps`]); `None` leaves them unlimited.
    pub fn with_throttle(mut self, throttle: Option<Arc<Throttle>>) -> Self {
        if let Some(t) = &throttle {
            let (ops, bytes) = t.batch_caps();
            for w in &mut self.workers {
                w.get_mut()
                    .unwrap_or_else(|e| e.into_inner())
                    .set_batch_caps(ops, bytes);
            }
        }
        self.throttle = throttle;
        self
    }

    /// The same backend, whose queue worker threads each install `filter`
    /// on themselves the first time they run its code.
    pub fn with_seccomp(mut self, filter: WorkerFilter) -> Self {
        self.seccomp = Some(filter);
        self
    }

    /// Installs the worker filter on the calling worker thread, once.
    ///
    /// # Errors
    /// Installing failed; the caller then serves nothing on this thread
    /// (fail closed; the daemon checked the filter at start-up, so this
    /// takes a kernel that changed its mind).
    fn confine_worker_thread(&self) -> io::Result<()> {
        let Some(filter) = &self.seccomp else {
            return Ok(());
        };
        if FILTERED.get() {
            return Ok(());
        }
        filter.apply().map_err(|e| {
            error!("queue worker not started: {e}");
            io::Error::other(e.to_string())
        })?;
        FILTERED.set(true);
        Ok(())
    }

    /// Closes the exit-event descriptors handed to vhost-user-backend.
    ///
    /// # Safety
    /// Call only after the library's worker threads have been joined (the
    /// `VhostUserDaemon` of this backend is dropped): they watch these
    /// descriptors until then.
    pub unsafe fn close_handed_out_fds(&self) {
        let fds = std::mem::take(&mut *self.handed_out.lock().unwrap_or_else(|e| e.into_inner()));
        for fd in fds {
            // SAFETY: the library took ownership of this descriptor with
            // into_raw_fd and never closes it; its only user (the worker's
            // epoll) is gone per the caller's contract, so we own it now.
            drop(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) });
        }
    }

    /// The wake eventfd of queue `queue`'s worker thread and the event id
    /// to register it under in that thread's epoll
    /// (`VringEpollHandler::register_listener`; the ids up to the number
    /// of queues are the library's: the rings and the exit event). A write
    /// to it makes the worker look at its ring as a kick would
    /// ([`VhostUserBackend::update_memory`] writes it). `None` past the
    /// last queue.
    ///
    /// The descriptor stays owned by the backend, which outlives the
    /// library's threads (`crate::daemon::serve_stream`).
    pub fn wake_listener(&self, queue: usize) -> Option<(RawFd, u64)> {
        let (c, _) = self.wake.get(queue)?;
        Some((c.as_raw_fd(), self.wake_event_id()))
    }

    /// Makes queue `queue`'s worker look at its ring once, as a kick would
    /// (a write to its wake eventfd, [`CryptoBackend::wake_listener`]).
    pub fn wake(&self, queue: usize) {
        if let Some((_, n)) = self.wake.get(queue) {
            if let Err(e) = n.notify() {
                warn!("waking queue worker {queue} failed: {e}");
            }
        }
    }

    /// The event id of the wake eventfds: the first one past the library's
    /// (rings `0..queues`, exit event `queues`).
    fn wake_event_id(&self) -> u64 {
        self.queues as u64 + 1
    }

    /// The event id under which each queue's worker thread watches the
    /// frontend's kick eventfd of its ring (the one after the wake
    /// eventfds').
    pub fn kick_event_id(&self) -> u64 {
        self.queues as u64 + 2
    }

    /// Makes `kick` (a copy of the frontend's kick eventfd, or none) the
    /// one queue `queue`'s worker reads when its epoll reports
    /// [`CryptoBackend::kick_event_id`], and returns the one it replaces,
    /// for the caller to take out of that epoll. `None` past the last
    /// queue too.
    pub fn replace_kick(&self, queue: usize, kick: Option<Arc<File>>) -> Option<Arc<File>> {
        self.kick.get(queue)?.swap(kick)
    }

    /// Used-buffer notifications (writes to a call eventfd) that failed
    /// so far, on all queues. Only the first is logged: a frontend can make
    /// every one fail, e.g. by filling its call eventfd's counter (the
    /// write then fails with `EAGAIN`, the descriptor being non-blocking,
    /// see [`crate::eventfd::check_ring_eventfd`]).
    pub fn signal_failures(&self) -> u64 {
        self.signal_failures.load(Ordering::Relaxed)
    }

    /// Requests completed on each queue so far.
    pub fn completed(&self) -> Vec<u64> {
        self.workers
            .iter()
            .map(|w| w.lock().map(|w| w.completed).unwrap_or(0))
            .collect()
    }

    /// Serves the ring until it is empty and the poll time has passed (or
    /// it stops). Out of line: see [`crate::sessions::wipe_stack`].
    #[inline(never)]
    fn process_vring(&self, queue: usize, vring: &VringRwLock) -> io::Result<()> {
        // Rate limit: this queue competes for tokens until it returns.
        let _busy = self.throttle.as_ref().map(|t| t.busy());
        // Over the rate limit (its last batch, maybe on an earlier
        // connection, left debt): no request is taken before the tokens
        // are back.
        if let Some(t) = &self.throttle {
            if throttle_wait(t, queue, &self.disconnected).is_none() {
                return Ok(());
            }
        }
        let Some(atomic) = self.mem.read().ok().and_then(|m| m.clone()) else {
            debug!("kick on queue {queue} before SET_MEM_TABLE");
            return Ok(());
        };
        // Adaptive busy-polling: after the last request, keep looking at
        // the avail ring for `poll` before going back to sleeping on kicks,
        // so a busy guest's next requests are taken without a wake-up. While
        // polling the worker asks the driver not to kick (`crate::worker`); when
        // polling ends it asks for kicks again and looks once more.
        //
        // While requests come the worker always polls: `process` returns
        // after each batch (with `--poll-us 0` too, which only means not
        // to wait once the ring is empty), so that the locks are let go
        // between batches.
        let mut polling = true;
        let mut last_work = Instant::now();
        let mut idle_spins: u32 = 0;
        // Since when the worker has taken its locks batch after batch
        // without a gap (`lock_gap_if_due`).
        let mut busy_since = last_work;
        loop {
            // The frontend is gone: stop at once, however busy the guest
            // keeps the ring, so that the connection can be torn down and
            // the next frontend served.
            if self.disconnected.load(Ordering::Relaxed) {
                return Ok(());
            }
            // The locks and the ring's state are taken anew for each batch
            // (or empty look), not for the whole busy period: a control
            // message that needs them (GET_VRING_BASE, memory or ring
            // changes) waits for one batch at most, not for a guest that
            // stops sending requests.
            let mem = atomic.memory();
            // A poisoned lock means an earlier batch panicked; the worker
            // state is still consistent (it holds no partial updates), so
            // carry on.
            let mut worker = self.workers[queue].lock().unwrap_or_else(|e| e.into_inner());
            let mut state = vring.get_mut();
            let enabled = state.is_enabled();
            let q = state.get_queue_mut();
            if !q.ready() {
                // Stopped (GET_VRING_BASE): the ring is not touched any
                // more; `stop_vring` turns the driver's kicks back on
                // if this worker had them off.
                return Ok(());
            }
            let addrs = ring_addrs(q);
            if addrs.desc == 0 || addrs.avail == 0 || addrs.used == 0 {
                // Started (SET_VRING_KICK) without its addresses: the
                // library leaves all three at 0 until SET_VRING_ADDR, and a
                // SET_VRING_ADDR it refuses half way (an address that
                // translates to a misaligned guest address) leaves the ones
                // after it at 0 until the connection ends. No ring is read
                // or written at guest address 0 that the frontend never
                // named; the ring is served once it has all three and is
                // kicked. As in QEMU, which does not start a queue whose
                // descriptor table is at 0 (`vhost_virtqueue_start`,
                // hw/virtio/vhost.c), and DPDK, which needs all three
                // (`vq_is_ready`, lib/vhost/vhost_user.c): a ring with any
                // of them at guest address 0 is not served.
                if !self.unaddressed_logged.swap(true, Ordering::Relaxed) {
                    warn!(
                        "data queue {queue} has no SET_VRING_ADDR addresses (one is at guest \
                         address 0): not served until it has them (further ones on this \
                         connection are not logged)"
                    );
                }
                return Ok(());
            }
            if !enabled {
                // Disabled by the frontend (SET_VRING_ENABLE 0): nothing
                // more is processed; kicks are turned back on in case this
                // worker had them suppressed while polling, so the driver
                // kicks for its next request.
                worker.enable_notifications(&mem, addrs);
                return Ok(());
            }
            let mut next_avail = q.next_avail();
            let mut next_used = q.next_used();
            worker.event_idx = self.event_idx.load(Ordering::Relaxed);
            worker.notify_on_empty = self.notify_on_empty.load(Ordering::Relaxed);
            worker.set_polling(polling);
            let r = worker.process(&mem, addrs, &mut next_avail, &mut next_used);
            if r.completed > 0 {
                q.set_next_avail(next_avail);
                q.set_next_used(next_used);
                // At most one notification per batch, and none when the
                // driver said it does not want one (used_event, or the
                // NO_INTERRUPT flag; see `crate::worker`).
                if r.notify {
                    if let Err(e) = state.signal_used_queue() {
                        // A frontend can make every one fail (a call
                        // eventfd whose counter it filled up): the first
                        // is logged, the others counted.
                        if self.signal_failures.fetch_add(1, Ordering::Relaxed) == 0 {
                            warn!(
                                "queue {queue}: signalling the call eventfd failed: {e} \
                                 (further failures on this connection are counted, not logged)"
                            );
                        }
                    } else if state.get_call().is_some() {
                        // (Without a call eventfd nothing was signalled.)
                        worker.notified();
                    }
                }
                polling = true;
                idle_spins = 0;
                drop(state);
                drop(worker);
                // Rate limit: the batch's tokens are taken now (one atomic
                // read-modify-write), and while they are owed the worker
                // sleeps (no lock held, kicks still off: the guest's
                // requests wait in the avail ring), then looks at the ring
                // again, kicked or not (`crate::throttle`).
                if let Some(t) = &self.throttle {
                    t.charge(queue, u64::from(r.completed), r.src_bytes);
                    match throttle_wait(t, queue, &self.disconnected) {
                        None => return Ok(()),
                        // (The locks were free meanwhile.)
                        Some(slept) if !slept.is_zero() => busy_since = Instant::now(),
                        Some(_) => {}
                    }
                }
                last_work = Instant::now();
                lock_gap_if_due(last_work, &mut busy_since);
                continue;
            }
            if !polling {
                // Kicks are enabled again and the ring was empty after that.
                return Ok(());
            }
            drop(state);
            drop(worker);
            idle_spins = idle_spins.wrapping_add(1);
            if self.poll.is_zero() {
                // The next look re-enables kicks (`set_polling(false)`).
                polling = false;
            } else if idle_spins.is_multiple_of(64) {
                // The clock is read every 64 empty looks, not on each.
                let now = Instant::now();
                if now.duration_since(last_work) >= self.poll {
                    polling = false;
                } else {
                    // Empty looks take the locks back to back too (a long
                    // `--poll-us`).
                    lock_gap_if_due(now, &mut busy_since);
                }
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// The flag [`CryptoBackend::disconnect`] sets, for a caller that learns
    /// of the disconnect first (the frontend proxy).
    pub fn disconnect_flag(&self) -> Arc<AtomicBool> {
        self.disconnected.clone()
    }

    /// Tells the queue workers that the frontend has disconnected: each
    /// returns from its current batch or poll instead of serving the ring
    /// further (a guest may keep its ring busy after its frontend is gone).
    pub fn disconnect(&self) {
        self.disconnected.store(true, Ordering::Relaxed);
    }
}

impl VhostUserBackend for CryptoBackend {
    type Bitmap = ();
    type Vring = VringRwLock;

    fn num_queues(&self) -> usize {
        self.queues
    }

    fn max_queue_size(&self) -> usize {
        usize::from(MAX_QUEUE_SIZE)
    }

    fn features(&self) -> u64 {
        FEATURES
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::from_bits_truncate(PROTOCOL_FEATURES)
    }

    fn set_event_idx(&self, enabled: bool) {
        // avail_event is kept current whatever the frontend says; used_event
        // is honoured only when it acked EVENT_IDX (see `crate::worker`).
        debug!("frontend says EVENT_IDX = {enabled}");
        self.event_idx.store(enabled, Ordering::Relaxed);
    }

    fn acked_features(&self, features: u64) {
        // SET_FEATURES (QEMU's cryptodev-vhost-user sends only bit 30,
        // docs/PROTOCOL.md §4.2; other frontends may ack more).
        self.notify_on_empty
            .store(features & (1 << VIRTIO_F_NOTIFY_ON_EMPTY) != 0, Ordering::Relaxed);
    }

    fn update_memory(&self, mem: GuestMemoryAtomic<GuestMemoryMmap>) -> io::Result<()> {
        if let Ok(mut m) = self.mem.write() {
            *m = Some(mem);
        }
        // Each worker looks at its ring again under the new map: a ring
        // the old one left out (`data queue not served`) holds requests
        // the guest kicked for once and now waits on, and a worker that had
        // kicks suppressed while polling could not turn them back on in
        // memory that was gone. A look at a ring with nothing new, or one
        // not set up, costs one empty batch. (The library calls this after
        // the new map is in place: SET_MEM_TABLE, ADD_MEM_REG,
        // REM_MEM_REG.)
        for (_, n) in &self.wake {
            if let Err(e) = n.notify() {
                warn!("waking a queue worker after a memory table change failed: {e}");
            }
        }
        Ok(())
    }

    fn stop_vring(&self, queue_index: u32) -> io::Result<()> {
        // GET_VRING_BASE: the ring is stopped; a queue stopped for a broken
        // ring may be set up again at the same addresses afterwards.
        if let Some(w) = self.workers.get(queue_index as usize) {
            let mut w = w.lock().unwrap_or_else(|e| e.into_inner());
            w.reset();
            // A worker stopped while polling left the driver's kicks off
            // in guest memory: turned back on before the reply, so that
            // whoever serves the ring next (after a stop and start) hears
            // from the driver. (The queue is not ready any more, so the
            // worker writes nothing after this.) Where the ring is now: the
            // frontend may have moved or resized it since, without stopping
            // it first. (Worker, then ring: the order the worker takes them
            // in; the library holds neither while it calls this.)
            let current = self.rings.get(queue_index as usize).and_then(OnceLock::get);
            if let (Some(atomic), Some(ring)) = (self.mem.read().ok().and_then(|m| m.clone()), current) {
                let addrs = ring_addrs(ring.get_ref().get_queue());
                w.enable_suppressed_kicks(&atomic.memory(), addrs);
            }
        }
        Ok(())
    }

    fn queues_per_thread(&self) -> Vec<u64> {
        // One worker thread per data queue.
        (0..self.queues).map(|q| 1u64 << q).collect()
    }

    fn exit_event(&self, thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        let (c, n) = self.exit.get(thread_index)?;
        let consumer = c.try_clone().ok()?;
        // vhost-user-backend 0.24 turns this consumer into a raw fd for its
        // epoll and never closes it (event_loop.rs); remember it so the
        // daemon can close it once the worker threads are gone.
        if let Ok(mut fds) = self.handed_out.lock() {
            fds.push(consumer.as_raw_fd());
        }
        Some((consumer, n.try_clone().ok()?))
    }

    fn handle_event(
        &self,
        device_event: u16,
        evset: EventSet,
        vrings: &[VringRwLock],
        thread_id: usize,
    ) -> io::Result<()> {
        self.confine_worker_thread()?;
        let event = u64::from(device_event);
        if event == self.kick_event_id() {
            // The frontend's kick eventfd (the library reads one of ours,
            // which nobody writes). Its count is taken first, whatever else
            // the epoll reports: an eventfd whose count the frontend took to
            // u64::MAX reports IN and ERR, and only the read ends that (the
            // event would come back at once, for ever). The count may be
            // found taken already (the frontend read it, or another ring
            // shares the eventfd): the ring is looked at anyway, and a read
            // that fails ends nothing. The read never waits, even when the
            // frontend has cleared O_NONBLOCK on the eventfd (it shares the
            // open file) and takes the count first: `RWF_NOWAIT`. Only a
            // kernel whose eventfds refuse that (`EOPNOTSUPP`) gets a plain
            // read, which may then wait for the next kick, holding no lock;
            // the teardown kicks such a worker free, see
            // `EventFdCopies::wake_workers`.
            if let Some(k) = self.kick.get(thread_id).and_then(ArcSwapOption::load_full) {
                if let Err(e) = read_eventfd_nowait(k.as_raw_fd()) {
                    if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
                        let _ = (&*k).read(&mut [0u8; 8]);
                    }
                }
            }
        } else if event == self.wake_event_id() {
            // Our wake eventfd (after a memory table change). (Non-blocking;
            // empty when an earlier event already took the count.)
            if let Some((c, _)) = self.wake.get(thread_id) {
                let _ = c.consume();
            }
        }
        if !evset.contains(EventSet::IN) {
            // (Once per connection: whatever reports it may report it
            // again at once.)
            if !self.odd_event_logged.swap(true, Ordering::Relaxed) {
                warn!(
                    "unexpected event set {evset:?} for event {device_event} on thread {thread_id} \
                     (further ones on this connection are not logged)"
                );
            }
            return Ok(());
        }
        // Each thread owns exactly one queue, whose worker index is the
        // thread index; the library hands each thread only its own rings
        // (`vrings` holds one, and a kick is event 0).
        let ring = if event == self.wake_event_id() || event == self.kick_event_id() {
            // The thread's ring, if enabled. (The library took a stopped
            // or disabled ring's kick eventfd out of its epoll and never
            // read it; the frontend's stays in this one until the next
            // SET_VRING_KICK replaces it, so such kicks are read here, a
            // few µs of this thread each, and the ring is left alone.) A
            // kick taken here while the ring is stopped or disabled is not
            // kept: the ring is looked at again when it is started or
            // enabled, because vhost-user-backend 0.24 then registers its
            // kick eventfd (ours) in this thread's epoll, and
            // `register_event` puts the ring on its pending list and wakes
            // the thread, which calls this function for the ring
            // (event_loop.rs, `register_event` and
            // `handle_num_queues_event`; tests `a_ring_started_again_*`).
            match vrings.first() {
                Some(v) if v.get_ref().is_enabled() => 0,
                _ => return Ok(()),
            }
        } else {
            usize::from(device_event)
        };
        match vrings.get(ring) {
            Some(vring) if thread_id < self.queues => {
                if let Some(kept) = self.rings.get(thread_id) {
                    let _ = kept.get_or_init(|| vring.clone());
                }
                let r = self.process_vring(thread_id, vring);
                // Back to waiting for kicks, maybe for long: no copy of a
                // key stays on this thread's stack meanwhile, whatever
                // CLOSE comes before the next kick (while the worker runs,
                // `QueueWorker::process` wipes after a CLOSE).
                crate::sessions::wipe_stack::<{ crate::sessions::WORKER_STACK_WIPE_BYTES }>();
                r
            }
            _ => {
                warn!("event {device_event} on thread {thread_id} matches no queue");
                Ok(())
            }
        }
    }
}

/// Where the frontend has set up `q` (guest-physical addresses).
fn ring_addrs(q: &virtio_queue::Queue) -> RingAddrs {
    RingAddrs {
        size: q.size(),
        desc: q.desc_table(),
        avail: q.avail_ring(),
        used: q.used_ring(),
    }
}

/// Shared handle type used by the daemon.
pub type SharedBackend = Arc<CryptoBackend>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offered_features_are_the_spec_bits() {
        // VIRTIO 1.2 §6: VERSION_1 (32), RING_INDIRECT_DESC (28),
        // RING_EVENT_IDX (29), NOTIFY_ON_EMPTY (24); vhost-user:
        // VHOST_USER_F_PROTOCOL_FEATURES (30).
        assert_eq!(
            FEATURES,
            (1 << 32) | (1 << 30) | (1 << 29) | (1 << 28) | (1 << 24)
        );
    }

    #[test]
    fn offered_protocol_features_are_mq_reply_ack_and_crypto_session() {
        // Bits 0, 3 and 7 of the vhost-user spec's "Protocol features".
        assert_eq!(PROTOCOL_FEATURES, 0x89);
        assert_eq!(
            VhostUserProtocolFeatures::from_bits_truncate(PROTOCOL_FEATURES),
            VhostUserProtocolFeatures::MQ
                | VhostUserProtocolFeatures::REPLY_ACK
                | VhostUserProtocolFeatures::CRYPTO_SESSION
        );
    }
}
