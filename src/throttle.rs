// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Device-wide rate limits: `--max-ops-per-sec N` and
//! `--max-bytes-per-sec N`.
//!
//! QEMU limits a cryptodev with `throttle-ops` and `throttle-bps`, but only
//! in `cryptodev_backend_crypto_operation()` (`backends/cryptodev.c`),
//! which a vhost-user device bypasses: the daemon limits on its own. As in
//! QEMU, each request counts as one operation and its bytes are its
//! `src_data_len` (QEMU's `cryptodev_backend_account` returns
//! `sym_op_info->src_len`, which `throttle_account` charges). Here a
//! request refused before its cipher ran (bad header, unknown session,
//! over `--max-request-bytes`, …) counts as one operation of 0 bytes, so a
//! guest cannot charge the device's byte budget with lengths it never
//! sends.
//!
//! # The bucket
//!
//! Both limits share one generic cell rate algorithm (GCRA) state, the
//! *theoretical arrival time* `tat` in nanoseconds since the throttle was
//! made, in one `AtomicU64`. A batch of `ops` requests and `bytes` bytes
//! costs `max(ops / ops_rate, bytes / bytes_rate)` seconds (a limit not
//! set costs nothing), and taking it moves `tat` to
//! `max(tat, now) + cost` with one compare-and-swap loop: one atomic
//! read-modify-write per attempt, one attempt unless another queue's
//! worker charged in between. A batch's bytes are known only once its
//! requests are parsed, so a worker charges *after* its batch (debt),
//! and then, if it is ahead, sleeps until its tokens are back
//! ([`Throttle::sleep_until_ready`]) before it takes its next batch. Its
//! batches are capped ([`Throttle::batch_caps`]) so that the debt of one
//! batch stays small.
//!
//! # Fairness
//!
//! Each queue also has its own arrival time, which each of its batches
//! moves by the batch's cost times the number of busy queues (workers
//! serving their rings or waiting for tokens, [`Throttle::busy`]; read
//! with one load per batch). A queue waits until both its own arrival time
//! and `tat` are within [`TOLERANCE`] of the clock. With N queues busy,
//! each queue can so take at most 1/N of the budget (plus the tolerance),
//! whatever its request sizes; `tat` keeps the sum at the rate, so each of
//! N backlogged queues gets about 1/N; and a queue alone (busy count 1)
//! gets the whole rate. A worker counts as busy from the kick (or wake-up)
//! that starts it until its ring is empty and it goes back to waiting for
//! kicks; a queue that is busy without being backlogged holds its share
//! back from the others only while its worker runs. A queue's own arrival
//! time may lag the clock by up to [`CATCH_UP`] (1 s): a queue that could
//! not go because `tat` was ahead (another queue's large request, charged
//! as debt, holds every queue back) catches up afterwards, while the
//! queue that made the debt waits for its own pace; so a guest cannot take
//! the other queues' share by sending requests larger than a batch on one
//! (each of two queues gets at least 45 % of the budget against 1 MiB
//! requests at 1.28 MB/s, in the unit tests' model).
//!
//! # Burst
//!
//! Beyond the rate, the device serves at most [`BURST`] (100 ms) worth of
//! the limits: [`TOLERANCE`] (75 ms) of admission tolerance, plus the batch
//! each queue may run before it is charged, capped at [`BATCH_SHARE`]
//! (25 ms) divided by the number of queues. (The tolerance is the larger
//! part so that a worker woken late on a busy host still finds its
//! tokens: the rate is lost only once it is 75 ms late.) One request whose
//! `src_data_len` alone exceeds its batch's byte cap still runs whole (it
//! cannot be split, and refusing it would stall the ring): its excess is
//! charged as debt, which the queue, and through `tat` the device, waits
//! off.
//!
//! # Throttled time
//!
//! [`Throttle::sleep_until_ready`] returns the time a queue's worker
//! waited for tokens; the worker adds it to the queue's `throttled_s` in
//! the statistics (`crate::stats`, from daemon start). The throttle lives
//! for the whole process, across frontend connections.
//!
//! While a worker waits it holds no lock and takes no request from the
//! avail ring: the guest sees backpressure (its requests wait in the
//! ring), never an error status. It sleeps in slices of at most
//! [`SLEEP_SLICE`], checking the connection's disconnect flag between
//! them, and looks at the ring again after the wait whether or not a kick
//! came. The sleep is `std::thread::park_timeout`, a futex wait with a
//! timeout on Linux, which the worker seccomp filter allows
//! ([`crate::seccomp`]); `nanosleep` is not in it.

use std::num::NonZeroU64;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Nanoseconds per second.
const NS: u128 = 1_000_000_000;

/// Most the device serves beyond the configured rates over any interval,
/// in time worth of the limits ([`TOLERANCE`] + [`BATCH_SHARE`]; see the
/// module documentation).
pub const BURST: Duration = Duration::from_millis(100);

/// How far ahead of the clock `tat` (and a queue's own arrival time) may
/// be when a batch starts.
pub const TOLERANCE: Duration = Duration::from_millis(75);

/// Worth of the limits that the batches of all queues together may hold
/// before they are charged: each queue's batch is capped at this divided
/// by the number of queues.
pub const BATCH_SHARE: Duration = Duration::from_millis(25);

/// How far a queue's own arrival time may lag the clock: a queue held
/// back by `tat` (other queues' debt) or idle may take up to this much
/// of its own pace at the device's full rate, so that it gets its share
/// of a window in which another queue paid off a large debt (see the
/// module documentation).
pub const CATCH_UP: Duration = Duration::from_secs(1);

/// Longest sleep between two looks at the disconnect flag while a worker
/// waits for tokens.
pub const SLEEP_SLICE: Duration = Duration::from_millis(5);

/// The configured limits (`None`: not limited).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateLimits {
    /// `--max-ops-per-sec`: requests per second, all queues together.
    pub ops_per_sec: Option<NonZeroU64>,
    /// `--max-bytes-per-sec`: `src_data_len` bytes per second, all queues
    /// together.
    pub bytes_per_sec: Option<NonZeroU64>,
}

impl RateLimits {
    /// Whether any limit is set.
    pub fn any(&self) -> bool {
        self.ops_per_sec.is_some() || self.bytes_per_sec.is_some()
    }
}

/// One queue's throttle state, on a cache line of its own: written only
/// by that queue's worker, once per batch (plain stores, no
/// read-modify-write).
#[derive(Debug, Default)]
#[repr(align(64))]
struct QueueState {
    /// When this queue's next batch may start (ns since the epoch): the
    /// later of `tat` and its own arrival time after its last charge,
    /// minus [`TOLERANCE`].
    ready_at: AtomicU64,
    /// The queue's own arrival time (ns since the epoch).
    own_tat: AtomicU64,
}

/// An `AtomicU64` on a cache line of its own.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Line(AtomicU64);

/// The device-wide token bucket of both limits, with per-queue state (see
/// the module documentation).
#[derive(Debug)]
pub struct Throttle {
    limits: RateLimits,
    epoch: Instant,
    tat: Line,
    /// Queues whose workers are busy now ([`Throttle::busy`]).
    busy: Line,
    queues: Box<[QueueState]>,
    batch_ops: u64,
    batch_bytes: u64,
}

/// `amount` at `rate` per second, in ns (saturating).
fn ns_for(amount: u64, rate: Option<NonZeroU64>) -> u64 {
    rate.map_or(0, |r| {
        u64::try_from(u128::from(amount) * NS / u128::from(r.get())).unwrap_or(u64::MAX)
    })
}

/// `rate` per second over `share` split among `queues`, at least 1.
fn per_queue(rate: Option<NonZeroU64>, share: Duration, queues: usize) -> u64 {
    rate.map_or(u64::MAX, |r| {
        let worth = u128::from(r.get()) * share.as_nanos() / NS / (queues.max(1) as u128);
        u64::try_from(worth).unwrap_or(u64::MAX).max(1)
    })
}

impl Throttle {
    /// A throttle for `queues` data queues, its clock starting now.
    pub fn new(limits: RateLimits, queues: usize) -> Self {
        Throttle {
            limits,
            epoch: Instant::now(),
            tat: Line::default(),
            busy: Line::default(),
            queues: (0..queues).map(|_| QueueState::default()).collect(),
            batch_ops: per_queue(limits.ops_per_sec, BATCH_SHARE, queues),
            batch_bytes: per_queue(limits.bytes_per_sec, BATCH_SHARE, queues),
        }
    }

    /// The limits this throttle applies.
    pub fn limits(&self) -> RateLimits {
        self.limits
    }

    /// Most requests and `src_data_len` bytes one batch of a queue takes:
    /// [`BATCH_SHARE`] worth of each limit divided among the queues, at
    /// least 1 (`u64::MAX` for a limit not set). A batch ends once it
    /// reaches either (after the request that reaches the byte cap).
    pub fn batch_caps(&self) -> (u64, u64) {
        (self.batch_ops, self.batch_bytes)
    }

    /// What a batch of `ops` requests and `bytes` bytes costs, in ns of the
    /// bucket: the larger of the two limits' times.
    pub fn cost_ns(&self, ops: u64, bytes: u64) -> u64 {
        ns_for(ops, self.limits.ops_per_sec).max(ns_for(bytes, self.limits.bytes_per_sec))
    }

    /// Nanoseconds since the throttle was made (its clock).
    pub fn now_ns(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Charges queue `queue`'s batch of `ops` requests and `bytes` bytes at
    /// time `now` (ns, [`Throttle::now_ns`]) with `busy` queues busy (at
    /// least this one): one compare-and-swap loop on the shared `tat`,
    /// and the queue's own arrival time moved by the cost times `busy`.
    /// Returns the batch's cost in ns ([`Throttle::cost_ns`]); when the
    /// queue may start its next batch is then [`Throttle::wait_at`].
    pub fn charge_at(&self, queue: usize, ops: u64, bytes: u64, busy: u64, now: u64) -> u64 {
        let cost = self.cost_ns(ops, bytes);
        let mut tat = self.tat.0.load(Ordering::Relaxed);
        let new = loop {
            let new = tat.max(now).saturating_add(cost);
            match self
                .tat
                .0
                .compare_exchange_weak(tat, new, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => break new,
                Err(seen) => tat = seen,
            }
        };
        if let Some(q) = self.queues.get(queue) {
            let own = q.own_tat.load(Ordering::Relaxed);
            let floor = now.saturating_sub(CATCH_UP.as_nanos() as u64);
            let own = own.max(floor).saturating_add(cost.saturating_mul(busy.max(1)));
            q.own_tat.store(own, Ordering::Relaxed);
            let ready = new.max(own).saturating_sub(TOLERANCE.as_nanos() as u64);
            q.ready_at.store(ready, Ordering::Relaxed);
        }
        cost
    }

    /// [`Throttle::charge_at`] now, with the number of queues busy now
    /// (one atomic load).
    pub fn charge(&self, queue: usize, ops: u64, bytes: u64) -> u64 {
        let busy = self.busy.0.load(Ordering::Relaxed);
        self.charge_at(queue, ops, bytes, busy, self.now_ns())
    }

    /// Counts the calling worker as busy (serving its ring or waiting for
    /// tokens) until the guard is dropped: two atomic operations per
    /// wake-up of a worker, none per batch.
    pub fn busy(&self) -> Busy<'_> {
        self.busy.0.fetch_add(1, Ordering::Relaxed);
        Busy(self)
    }

    /// How long queue `queue` must still wait at time `now` before its next
    /// batch, in ns (0: it may go). No atomic read-modify-write: its own
    /// state, written by its own last charge.
    pub fn wait_at(&self, queue: usize, now: u64) -> u64 {
        self.queues
            .get(queue)
            .map_or(0, |q| q.ready_at.load(Ordering::Relaxed).saturating_sub(now))
    }

    /// Sleeps until queue `queue` may start its next batch, in slices of at
    /// most [`SLEEP_SLICE`], and returns the time slept (zero: it did not
    /// wait; a queue past the last does not). Returns `None`, sooner, once
    /// `stop` is set (the frontend is gone).
    pub fn sleep_until_ready(&self, queue: usize, stop: &AtomicBool) -> Option<Duration> {
        if queue >= self.queues.len() {
            return Some(Duration::ZERO);
        }
        let mut total = Duration::ZERO;
        loop {
            let start = Instant::now();
            let wait = self.wait_at(queue, self.now_ns());
            if wait == 0 {
                return Some(total);
            }
            if stop.load(Ordering::Relaxed) {
                return None;
            }
            // (May return early: the loop looks again.)
            std::thread::park_timeout(Duration::from_nanos(wait).min(SLEEP_SLICE));
            total += start.elapsed();
        }
    }
}

/// A worker counted as busy ([`Throttle::busy`]) while this lives.
#[derive(Debug)]
pub struct Busy<'a>(&'a Throttle);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.busy.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn limits(ops: u64, bytes: u64) -> RateLimits {
        RateLimits {
            ops_per_sec: NonZeroU64::new(ops),
            bytes_per_sec: NonZeroU64::new(bytes),
        }
    }

    #[test]
    fn cost_is_the_larger_of_the_two_limits() {
        let t = Throttle::new(limits(5000, 1_280_000), 1);
        // 1 / 5000 s = 200 µs per request; 256 B / 1.28 MB/s = 200 µs.
        assert_eq!(t.cost_ns(1, 0), 200_000);
        assert_eq!(t.cost_ns(0, 256), 200_000);
        assert_eq!(t.cost_ns(64, 64 * 256), 12_800_000);
        // 4 KiB requests: the byte limit decides (3.2 ms each).
        assert_eq!(t.cost_ns(10, 10 * 4096), 32_000_000);
        // 16 B requests: the op limit decides.
        assert_eq!(t.cost_ns(10, 160), 2_000_000);
        // Only one limit set: the other costs nothing.
        assert_eq!(Throttle::new(limits(1000, 0), 1).cost_ns(3, 1 << 30), 3_000_000);
        assert_eq!(Throttle::new(limits(0, 1000), 1).cost_ns(1 << 20, 500), 500 * MS);
        // Saturates instead of overflowing.
        assert_eq!(Throttle::new(limits(1, 0), 1).cost_ns(u64::MAX, 0), u64::MAX);
    }

    #[test]
    fn batch_caps_split_25_ms_among_the_queues() {
        // 5000/s × 25 ms = 125 requests; 1.28 MB/s × 25 ms = 32,000 bytes.
        assert_eq!(
            Throttle::new(limits(5000, 1_280_000), 1).batch_caps(),
            (125, 32_000)
        );
        assert_eq!(
            Throttle::new(limits(5000, 1_280_000), 2).batch_caps(),
            (62, 16_000)
        );
        assert_eq!(Throttle::new(limits(5000, 0), 64).batch_caps(), (1, u64::MAX));
        // Never below one request.
        assert_eq!(Throttle::new(limits(1, 1), 4).batch_caps(), (1, 1));
        assert_eq!(Throttle::new(limits(0, 0), 4).batch_caps(), (u64::MAX, u64::MAX));
    }

    /// Per queue: requests, bytes and cost (ns) served.
    #[derive(Debug, Clone, Copy, Default)]
    struct Served {
        ops: u64,
        bytes: u64,
        cost: u64,
    }

    /// Serves one backlogged queue per entry of `sizes` (its requests'
    /// size) from `start` for `span` ns of simulated time, each worker as
    /// `CryptoBackend::process_vring` runs it: a full batch (the caps, at
    /// most 64 requests = `MAX_BATCH`, until the byte cap is reached),
    /// charged as it ends with every queue busy, then a wait until
    /// [`Throttle::wait_at`] says it may go. Batches take no time: the
    /// worker that may go first goes.
    fn serve(t: &Throttle, sizes: &[u64], start: u64, span: u64) -> Vec<Served> {
        let (ops_cap, bytes_cap) = t.batch_caps();
        let mut got = vec![Served::default(); sizes.len()];
        let mut ready = vec![start; sizes.len()];
        loop {
            let (q, &at) = ready.iter().enumerate().min_by_key(|&(i, &r)| (r, i)).unwrap();
            if at >= start + span {
                return got;
            }
            assert_eq!(t.wait_at(q, at), 0, "a batch starts when the queue may go");
            let size = sizes[q];
            let n = ops_cap.min(64).min(bytes_cap.div_ceil(size)).max(1);
            let cost = t.charge_at(q, n, n * size, sizes.len() as u64, at);
            got[q].ops += n;
            got[q].bytes += n * size;
            got[q].cost += cost;
            ready[q] = at + t.wait_at(q, at);
        }
    }

    #[test]
    fn a_backlogged_queue_gets_the_rate_plus_at_most_the_burst() {
        for (ops, bytes, size) in [
            (5000, 0, 256),
            (0, 1_280_000, 256),
            (5000, 1_280_000, 4096),
            (20, 0, 16),
        ] {
            let t = Throttle::new(limits(ops, bytes), 1);
            // Requests per second: the tighter limit (256 B at 1.28 MB/s:
            // 5000; 4 KiB: 312.5).
            let rate = [ops as f64, bytes as f64 / size as f64]
                .into_iter()
                .filter(|&r| r > 0.0)
                .fold(f64::INFINITY, f64::min);
            let got = serve(&t, &[size], 0, 10_000 * MS)[0].ops as f64;
            // 10 s at the rate plus at most 100 ms worth; at least the
            // rate.
            let (lo, hi) = (rate * 10.0, rate * 10.1 + 1.0);
            assert!(
                got >= lo && got <= hi,
                "{ops} {bytes} {size}: {got} not in {lo}..={hi}"
            );
        }
    }

    #[test]
    fn an_idle_device_banks_no_more_than_the_burst() {
        let t = Throttle::new(limits(5000, 0), 1);
        // Busy for 1 s, then idle for 100 s.
        serve(&t, &[256], 0, 1000 * MS);
        let at = 101_000 * MS;
        // Every batch that starts without waiting, at the same instant.
        let mut free = 0;
        while t.wait_at(0, at) == 0 {
            free += 64;
            t.charge_at(0, 64, 0, 1, at);
            assert!(free < 10_000, "no limit after idling");
        }
        // At least the 75 ms of tolerance (375 requests), at most 100 ms
        // worth (500).
        assert!((375..=500).contains(&free), "{free}");
    }

    #[test]
    fn a_batch_over_its_cap_is_charged_as_debt() {
        let t = Throttle::new(limits(0, 1_000_000), 1);
        // One 1 MiB request at 1 MB/s: 1.048576 s of debt, of which 75 ms
        // are the tolerance.
        assert_eq!(t.charge_at(0, 1, 1 << 20, 1, 0), 1_048_576_000);
        let ready = 1_048_576_000 - 75 * MS;
        assert_eq!(t.wait_at(0, 0), ready);
        assert_eq!(t.wait_at(0, 500 * MS), ready - 500 * MS);
        assert_eq!(t.wait_at(0, ready), 0);
        // Another queue that charges meanwhile waits behind that debt
        // (`tat`), more than its own pace asks.
        let t = Throttle::new(limits(0, 1_000_000), 2);
        t.charge_at(0, 1, 1 << 20, 2, 0);
        assert_eq!(t.charge_at(1, 1, 1000, 2, 10 * MS), 1_000_000);
        assert_eq!(t.wait_at(1, 10 * MS), 1_048_576_000 + 1_000_000 - 85 * MS);
    }

    #[test]
    fn a_queue_paces_itself_at_its_share_of_the_busy_queues() {
        // 100 requests at 1000/s: 100 ms. Alone, the queue may go again
        // once `tat` is within the tolerance (25 ms on); with 2 queues
        // busy its own arrival time moves 200 ms (125 ms on).
        for (busy, wait) in [(1, 25 * MS), (2, 125 * MS), (4, 325 * MS)] {
            let t = Throttle::new(limits(1000, 0), 4);
            t.charge_at(0, 100, 0, busy, 0);
            assert_eq!(t.wait_at(0, 0), wait, "{busy} busy");
        }
        // After 5 s of idling the queue has 1 s (CATCH_UP) of its own
        // pace in hand, not more: with 2 busy, 500 ms worth of batches
        // go as `tat` allows (its tolerance: 75 ms), then its own pace
        // holds it.
        let t = Throttle::new(limits(1000, 0), 2);
        t.charge_at(0, 10, 0, 2, 0);
        let at = 5000 * MS;
        t.charge_at(0, 400, 0, 2, at);
        // `tat` at 5.4 s: 325 ms to wait; own at 4 s + 800 ms: none.
        assert_eq!(t.wait_at(0, at), 325 * MS);
        t.charge_at(0, 100, 0, 2, at + 325 * MS);
        // own at 5 s: `tat` (5.5 s) decides.
        assert_eq!(t.wait_at(0, at + 325 * MS), 100 * MS);
        // The busy count is what the guards say, the caller's own
        // included.
        let t = Throttle::new(limits(1000, 0), 4);
        let (a, b) = (t.busy(), t.busy());
        let now = t.now_ns();
        t.charge(0, 100, 0);
        let wait = t.wait_at(0, now);
        assert!((124 * MS..=126 * MS).contains(&wait), "{wait}");
        drop((a, b));
        assert_eq!(t.busy.0.load(Ordering::Relaxed), 0);
    }

    /// Asserts that each queue got at least `min` of its fair share
    /// (1/N) of the cost served.
    fn assert_fair(got: &[Served], min: f64, what: &str) {
        let total: u64 = got.iter().map(|s| s.cost).sum();
        let fair = total as f64 / got.len() as f64;
        for (q, s) in got.iter().enumerate() {
            assert!(
                s.cost as f64 >= min * fair,
                "{what}: queue {q} got {s:?} of {total} ns ({got:?})"
            );
        }
    }

    #[test]
    fn backlogged_queues_share_the_budget_evenly() {
        for queues in [2usize, 3, 8] {
            for (ops, bytes, size) in [(5000u64, 0u64, 256u64), (0, 1_280_000, 256), (20_000, 0, 16)] {
                let t = Throttle::new(limits(ops, bytes), queues);
                let got = serve(&t, &vec![size; queues], 0, 4000 * MS);
                assert_fair(
                    &got,
                    0.9,
                    &format!("{queues} queues, {ops} ops/s {bytes} B/s {size} B"),
                );
                // And the device's rate holds: 4 s plus the burst.
                let total: u64 = got.iter().map(|s| s.cost).sum();
                assert!(total <= 4100 * MS, "{total}");
            }
        }
    }

    #[test]
    fn queues_of_large_and_small_requests_share_the_budget_evenly() {
        // 16 KiB requests (one per batch) against 256-byte ones (64 per
        // batch at most) at a byte limit, 16-byte ones against 16 KiB
        // ones at both limits, 1 MiB requests (0.82 s of budget each)
        // against 256-byte ones: each queue gets about half of the
        // budget, not half of the batches.
        for (ops, bytes, sizes) in [
            (0, 1_280_000, [16_384u64, 256]),
            (0, 1_280_000, [256, 16_384]),
            (20_000, 10_000_000, [16, 16_384]),
            (0, 1_280_000, [1 << 20, 256]),
        ] {
            let t = Throttle::new(limits(ops, bytes), 2);
            let got = serve(&t, &sizes, 0, 30_000 * MS);
            assert_fair(&got, 0.9, &format!("{ops} ops/s {bytes} B/s {sizes:?}"));
        }
        let t = Throttle::new(limits(5000, 1_280_000), 4);
        let got = serve(&t, &[1 << 20, 256, 1 << 20, 4096], 0, 60_000 * MS);
        assert_fair(&got, 0.8, "4 queues, two of 1 MiB requests");
        // The device's rate still holds (plus the burst and the two
        // requests in progress).
        let total: u64 = got.iter().map(|s| s.cost).sum();
        assert!(total <= 60_100 * MS + 2 * 820 * MS, "{total}");
    }

    #[test]
    fn the_wait_is_slept_off_and_counted_and_a_stop_ends_it() {
        let t = Throttle::new(limits(1000, 0), 2);
        let stop = AtomicBool::new(false);
        // 200 requests at 1000/s: 200 ms of debt, 125 ms past the
        // tolerance.
        t.charge(0, 200, 0);
        let start = Instant::now();
        let slept = t.sleep_until_ready(0, &stop).expect("not stopped");
        let took = start.elapsed();
        assert!(
            slept >= Duration::from_millis(115) && slept <= took,
            "{slept:?} {took:?}"
        );
        // 10 s of debt on queue 1: a stop ends the wait within a slice.
        t.charge(1, 10_000, 0);
        let (r, took) = std::thread::scope(|s| {
            let h = s.spawn(|| {
                let start = Instant::now();
                (t.sleep_until_ready(1, &stop), start.elapsed())
            });
            std::thread::sleep(Duration::from_millis(30));
            stop.store(true, Ordering::Relaxed);
            h.join().unwrap()
        });
        assert_eq!(r, None);
        assert!(took < Duration::from_secs(1), "{took:?}");
        // A queue past the last has no state, and never waits; a ready
        // queue does not wait.
        assert_eq!(t.sleep_until_ready(9, &stop), Some(Duration::ZERO));
        assert_eq!(
            t.sleep_until_ready(0, &AtomicBool::new(false)),
            Some(Duration::ZERO)
        );
    }
}
