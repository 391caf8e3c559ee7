// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A data queue as the frontend drives it: request slots and the buffer
//! sets they use in guest memory, submission through the shared driver
//! ring ([`crate::driver_ring`]), publication with notification
//! suppression, and reaping completions off the used ring.

use std::io;
use std::num::NonZeroU16;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use vmm_sys_util::eventfd::EventFd;

use super::{
    DescMode, Error, FrontendConfig, DESCS_PER_REQUEST, DIGEST_AREA, MAX_RAW_DESCS, NO_SLOT, REAP_POLL,
};
use crate::driver_ring::{DriverRing, SplitRing, UsedElem};
use crate::guest_mem::GuestMem;

const SLOT_ALIGN: usize = 64;
/// Alignment of each queue's area in guest memory, and of its used ring
/// and request slots in it.
pub(super) const RING_AREA_ALIGN: u64 = 4096;

/// How long a wait that saw the backend hang up gives the backend's queue
/// workers to publish what they were running (the end of its connection
/// and its workers' last batch are not ordered).
const HANGUP_GRACE: Duration = Duration::from_millis(20);

/// One data queue as a driver sees it.
pub struct DriverQueue {
    pub(super) mem: Arc<GuestMem>,
    /// Ring size.
    pub size: u16,
    /// The ring's addresses and the driver's avail and used indices.
    pub(super) ring: DriverRing,
    pub(super) event_idx: bool,
    pub(super) dpdk: bool,
    pub(super) kick: EventFd,
    pub(super) call: EventFd,
    /// The vhost-user socket (a duplicate of the connection's): watched
    /// for the backend hanging up while completions are waited for.
    pub(super) peer: UnixStream,
    /// Set when this tool shut the socket down itself (`CryptoFrontend`'s
    /// flag): its end is then not the backend's doing.
    pub(super) shut_here: Arc<AtomicBool>,
    pub(super) slots_base: u64,
    pub(super) slot_size: usize,
    /// (Non-zero, [`FrontendConfig::validate`]: as a divisor it needs no
    /// zero test.)
    pub(super) nslots: NonZeroU16,
    /// Buffer sets (header, two data buffers for src and dst, IV, status,
    /// two indirect tables, hash result): slot s uses set `s % nbufs` (see
    /// [`DriverQueue::layout`]).
    pub(super) nbufs: NonZeroU16,
    /// The bit of a slot number that says whether an alternating request
    /// there is [`Placement::Swapped`] ([`DriverQueue::placement`]): the
    /// set count, when sets and slots are powers of two and each set has
    /// at least two slots (then `(slot / sets) & 1` is 1 exactly when
    /// `slot & sets` is not 0, for a slot or any number equal to it modulo
    /// the slot count); else 0, never swapped.
    pub(super) swap_bit: u16,
    /// Per buffer set: in use by a request in flight.
    pub(super) busy: Vec<bool>,
    /// Per slot: a request is in flight there (a used element naming
    /// another slot frees no buffer set).
    pub(super) in_flight_slot: Vec<bool>,
    /// How many slots have a request in flight: what is still owed, not
    /// the avail index minus the used index, which a backend that puts an
    /// unknown or repeated id on the used ring would move.
    pub(super) outstanding: u16,
    /// The [`Shape`] whose descriptors each indirect table holds (two per
    /// buffer set: `2 * set`, and `2 * set + 1` for [`Placement::Swapped`]),
    /// so a table reused with the same shape is not rewritten; in chain
    /// mode, at `2 * slot`, the shape of the slot's chain (odd entries stay
    /// `None`: chain mode never swaps).
    pub(super) shape: Vec<Option<Shape>>,
    /// Per slot (indirect mode): the shape of the set's table its head
    /// descriptor was last written for.
    pub(super) head_shape: Vec<Option<Shape>>,
    /// The first descriptor found changed when it was about to be
    /// rewritten for a new shape, for [`DriverQueue::check_descs`].
    pub(super) desc_fault: Option<String>,
    pub(super) desc_mode: DescMode,
    /// [`set_offsets`] for this queue's largest payload and IV.
    pub(super) offsets: SlotLayout,
}

/// Where a request's buffers live in guest memory.
#[derive(Debug, Clone, Copy)]
pub struct SlotLayout {
    /// Header (72 bytes).
    pub hdr: u64,
    /// IV (16 bytes).
    pub iv: u64,
    /// Source buffer.
    pub src: u64,
    /// Destination buffer.
    pub dst: u64,
    /// Status byte.
    pub status: u64,
    /// Indirect table: a set has room for [`MAX_RAW_DESCS`] entries, all
    /// of which a raw request may use; a request this tool lays out uses
    /// the first 128 bytes, or, in a swapped layout (where this field
    /// already points there), the next 128.
    pub table: u64,
    /// Hash result of a chained request ([`DIGEST_AREA`] bytes).
    pub digest: u64,
    /// src and dst are exchanged ([`SlotLayout::swapped_if`]): src is the
    /// set's second data buffer and dst its first.
    pub swapped: bool,
}

/// Bytes between a buffer set's two indirect tables for the requests this
/// tool lays out: room for a request's descriptors, from a cache-line
/// boundary.
const TABLE_STRIDE: u64 = (16 * DESCS_PER_REQUEST as u64).next_multiple_of(SLOT_ALIGN as u64);
const _: () = assert!(2 * TABLE_STRIDE <= 16 * MAX_RAW_DESCS as u64);

impl SlotLayout {
    /// The set's first indirect table, the one [`SlotLayout::table`] is in
    /// a layout that is not swapped. It starts at the cache line after the
    /// status byte's.
    pub fn first_table(&self) -> u64 {
        if self.swapped {
            self.table - TABLE_STRIDE
        } else {
            self.table
        }
    }

    /// With `swap`, the layout of a [`Placement::Swapped`] request: src
    /// and dst exchanged, and the set's second indirect table; else this
    /// one.
    pub fn swapped_if(self, swap: bool) -> SlotLayout {
        if !swap {
            return self;
        }
        debug_assert!(!self.swapped, "a layout swapped twice");
        SlotLayout {
            src: self.dst,
            dst: self.src,
            table: self.table + TABLE_STRIDE,
            swapped: true,
            ..self
        }
    }
}

/// Which of its buffer set's two data buffers a request reads src from
/// and writes its output to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// The output over src, in the first (the dst descriptor points at
    /// src, as DPDK's driver does).
    InPlace,
    /// src in the first, the output in the second.
    Apart,
    /// src in the second, the output in the first
    /// ([`SlotLayout::swapped_if`]).
    Swapped,
}

/// A completed request.
#[derive(Debug, Clone, Copy)]
pub struct Used {
    /// The slot of the request the used element completed, or [`NO_SLOT`]
    /// when its id is not the head of a request in flight.
    pub slot: u16,
    /// Used length.
    pub len: u32,
    /// The head descriptor id exactly as the used element gave it.
    pub id: u32,
}

/// A slot or buffer set count as a divisor; [`FrontendConfig::validate`]
/// has made sure it is not 0 (a queue depth of at least 1 fits).
fn nonzero(n: u16) -> Result<NonZeroU16, Error> {
    NonZeroU16::new(n).ok_or_else(|| Error::Options("no request slots".into()))
}

fn align(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

/// Bytes from a slot's start to its src buffer: the header, rounded up to
/// a cache line.
const SRC_OFFSET: u64 = 72u64.next_multiple_of(SLOT_ALIGN as u64);

/// The layout of a buffer set that starts at guest address 0, for
/// payloads of up to `max_payload` bytes and IVs of up to `max_iv`: each
/// buffer's offset in the set.
fn set_offsets(max_payload: usize, max_iv: usize) -> SlotLayout {
    let p = max_payload.next_multiple_of(SLOT_ALIGN) as u64;
    // Header | src | dst | IV + status | indirect tables | hash result.
    // The header (unchanged while the slot keeps its session and shape),
    // src and dst each start a cache line, as a driver's buffers usually
    // do: a 256-byte payload is 4 lines, not 5, and no line holds bytes
    // the driver writes for a request next to bytes the device writes
    // (src end and dst start). The IV and the status byte share one line,
    // the only one besides src and dst that both sides touch for every
    // request (driver: IV and status canary; device: reads the IV, writes
    // the status). The tables have their own lines: they change only when
    // the slot changes shape.
    let src = SRC_OFFSET;
    let dst = src + p;
    let iv = dst + p;
    let status = iv + max_iv as u64;
    let table = align(status + 1, SLOT_ALIGN as u64);
    SlotLayout {
        hdr: 0,
        iv,
        src,
        dst,
        status,
        table,
        digest: table + 16 * MAX_RAW_DESCS as u64,
        swapped: false,
    }
}

fn slot_size(max_payload: usize, max_iv: usize) -> usize {
    let end = set_offsets(max_payload, max_iv).digest + DIGEST_AREA.next_multiple_of(SLOT_ALIGN) as u64;
    end as usize
}

/// A request's descriptor shape: (IV bytes, src = dst bytes, hash result
/// bytes, placement). Requests of one shape in one buffer set have the
/// same descriptors.
pub(super) type Shape = (u32, u32, u32, Placement);

impl DriverQueue {
    /// Request slots and buffer sets of a queue set up with `cfg`: with
    /// indirect tables a power of two of sets (the slots are a power of
    /// two too), so that slot i always maps to the same set and its head
    /// descriptor never changes; with direct chains one set per slot.
    fn slots_and_sets(cfg: &FrontendConfig) -> (u16, u16) {
        let nslots = DriverQueue::slots_for(cfg.queue_size, cfg.desc_mode);
        let nbufs = match cfg.desc_mode {
            DescMode::Indirect => cfg.queue_depth.next_power_of_two().min(nslots),
            DescMode::Chain => nslots,
        };
        (nslots, nbufs)
    }

    /// Guest memory bytes a queue set up with `cfg` takes: its ring, then
    /// its buffer sets, each rounded up to [`RING_AREA_ALIGN`].
    pub(super) fn area_bytes(cfg: &FrontendConfig) -> u64 {
        let nbufs = Self::slots_and_sets(cfg).1;
        let ssize = slot_size(cfg.max_payload, cfg.max_iv) as u64;
        SplitRing::contiguous_bytes(cfg.queue_size, RING_AREA_ALIGN)
            + align(u64::from(nbufs) * ssize, RING_AREA_ALIGN)
    }

    /// A queue on `ring` in `mem` (its buffer sets right after the ring,
    /// [`DriverQueue::area_bytes`]), set up as `cfg` says; `event_idx`:
    /// `VIRTIO_F_EVENT_IDX` was negotiated.
    ///
    /// # Errors
    /// [`Error::Options`] when `cfg` leaves no request slot.
    pub(super) fn new(
        mem: Arc<GuestMem>,
        ring: SplitRing,
        cfg: &FrontendConfig,
        event_idx: bool,
        kick: EventFd,
        call: EventFd,
        (peer, shut_here): (UnixStream, Arc<AtomicBool>),
    ) -> Result<DriverQueue, Error> {
        let (nslots, nbufs) = Self::slots_and_sets(cfg);
        // DriverQueue::set_ahead relies on this.
        assert!(nbufs > 0 && nslots % nbufs == 0, "buffer sets divide the slots");
        Ok(DriverQueue {
            mem,
            size: cfg.queue_size,
            ring: DriverRing::new(ring, 0),
            event_idx,
            dpdk: cfg.dpdk,
            kick,
            call,
            peer,
            shut_here,
            slots_base: ring.desc + SplitRing::contiguous_bytes(cfg.queue_size, RING_AREA_ALIGN),
            slot_size: slot_size(cfg.max_payload, cfg.max_iv),
            nslots: nonzero(nslots)?,
            nbufs: nonzero(nbufs)?,
            swap_bit: if nbufs.is_power_of_two() && nslots.is_power_of_two() && nslots > nbufs {
                nbufs
            } else {
                0
            },
            busy: vec![false; usize::from(nbufs)],
            in_flight_slot: vec![false; usize::from(nslots)],
            outstanding: 0,
            shape: vec![None; 2 * usize::from(nbufs)],
            head_shape: vec![None; usize::from(nslots)],
            desc_fault: None,
            desc_mode: cfg.desc_mode,
            offsets: set_offsets(cfg.max_payload, cfg.max_iv),
        })
    }

    /// Slot count for a ring of `size` in `mode`.
    pub fn slots_for(size: u16, mode: DescMode) -> u16 {
        match mode {
            DescMode::Indirect => size,
            DescMode::Chain => size / DESCS_PER_REQUEST,
        }
    }

    /// Slot `slot`'s buffer set, `0..buffer_sets()` (see
    /// [`DriverQueue::layout`]).
    pub fn buf(&self, slot: u16) -> usize {
        usize::from(slot % self.nbufs)
    }

    /// Number of buffer sets.
    pub fn buffer_sets(&self) -> u16 {
        self.nbufs.get()
    }

    /// Guest addresses of slot `slot`'s buffers. With indirect tables the
    /// slots (one per ring entry, so that head = ring position as DPDK
    /// needs) share `depth` rounded up to a power of two buffer sets, as a
    /// driver with that many requests in flight reuses its buffers: slot s
    /// uses set `s % sets`, and a set is used by one request at a time
    /// ([`DriverQueue::next_slot`]). With direct chains every slot has its
    /// own set. A set stays taken until its request completes: with
    /// completions out of order, a late one keeps the other slots of its
    /// set waiting, so fewer than `depth` requests may be in flight.
    /// ([`Placement::Swapped`] requests use
    /// [`SlotLayout::swapped_if`]`(true)` of it.)
    pub fn layout(&self, slot: u16) -> SlotLayout {
        self.set_layout(self.buf(slot))
    }

    /// The [`Placement`] of a request in `slot`: in place or not, and
    /// when not, [`Placement::Swapped`] if it may `alternate` and `slot`
    /// is in every other slot of those that share its buffer set
    /// (`(slot / sets)` odd). The slots that share a set take it in turn,
    /// so such requests alternate between the set's two data buffers, one
    /// request's output buffer being the next one's src. Never swapped
    /// where sets and slots are not powers of two or a set has one slot
    /// (chain mode).
    pub fn placement(&self, slot: u16, in_place: bool, alternate: bool) -> Placement {
        if in_place {
            Placement::InPlace
        } else if alternate && slot & self.swap_bit != 0 {
            Placement::Swapped
        } else {
            Placement::Apart
        }
    }

    /// Whether this queue swaps any request's placement: whether requests
    /// that may alternate do ([`DriverQueue::placement`]).
    pub fn swaps(&self) -> bool {
        self.swap_bit != 0
    }

    /// The layout of a request of `shape` in buffer set `b`.
    pub(super) fn shape_layout(&self, b: usize, shape: Shape) -> SlotLayout {
        self.set_layout(b).swapped_if(shape.3 == Placement::Swapped)
    }

    /// Which of its buffer set `b`'s two indirect tables a request of
    /// `shape` uses: an index into [`DriverQueue::shape`].
    pub(super) fn table_index(b: usize, shape: Shape) -> usize {
        2 * b + usize::from(shape.3 == Placement::Swapped)
    }

    /// Guest addresses of buffer set `b`'s buffers (`layout(slot)` is
    /// `set_layout(buf(slot))`; for a caller that needs both).
    pub fn set_layout(&self, b: usize) -> SlotLayout {
        // (The sets start at cache-line boundaries: `slots_base` is
        // aligned, and every part of a set is whole lines.)
        let base = self.slots_base + b as u64 * self.slot_size as u64;
        let o = self.offsets;
        SlotLayout {
            hdr: base,
            iv: base + o.iv,
            src: base + o.src,
            dst: base + o.dst,
            status: base + o.status,
            table: base + o.table,
            digest: base + o.digest,
            swapped: false,
        }
    }

    /// The memory.
    pub fn mem(&self) -> &GuestMem {
        &self.mem
    }

    /// Guest addresses of this ring (size, descriptor table, avail and
    /// used rings).
    pub fn ring_addrs(&self) -> SplitRing {
        self.ring.ring()
    }

    /// A shared handle on the memory.
    pub fn mem_handle(&self) -> Arc<GuestMem> {
        self.mem.clone()
    }

    /// Number of request slots (the most requests in flight).
    pub fn slots(&self) -> u16 {
        self.nslots.get()
    }

    /// Requests made available but not yet published to the backend.
    pub fn unpublished(&self) -> u16 {
        self.ring.unpublished()
    }

    /// Requests in flight: submitted and not yet completed by a used
    /// element that names their head.
    pub fn in_flight(&self) -> u16 {
        self.outstanding
    }

    /// Marks `slot` in flight.
    pub(super) fn take_slot(&mut self, slot: u16) {
        self.take_slot_in(slot, self.buf(slot));
    }

    /// [`DriverQueue::take_slot`] for a caller that has `slot`'s buffer
    /// set `b` at hand already.
    pub(super) fn take_slot_in(&mut self, slot: u16, b: usize) {
        self.busy[b] = true;
        if let Some(f) = self.in_flight_slot.get_mut(usize::from(slot)) {
            if !*f {
                *f = true;
                self.outstanding += 1;
            }
        }
    }

    /// The slot whose request has head descriptor `id`, if one is in
    /// flight there: in indirect mode slot s has head s, in chain mode
    /// head s * [`DESCS_PER_REQUEST`]. Any other id (another descriptor of
    /// a chain, an index beyond the table, a request already completed)
    /// names no request.
    fn slot_of_head(&self, id: u32) -> Option<u16> {
        let slot = match self.desc_mode {
            DescMode::Indirect => id,
            DescMode::Chain if id.is_multiple_of(u32::from(DESCS_PER_REQUEST)) => {
                id / u32::from(DESCS_PER_REQUEST)
            }
            DescMode::Chain => return None,
        };
        let slot = u16::try_from(slot).ok()?;
        self.in_flight_slot
            .get(usize::from(slot))
            .copied()
            .unwrap_or(false)
            .then_some(slot)
    }

    /// The slot the next request must use (ring position modulo slots, so
    /// DPDK's "avail slot i holds head i" holds in indirect mode), if free.
    pub fn next_slot(&self) -> Option<u16> {
        self.slot_ahead(0)
    }

    /// [`DriverQueue::next_slot`] and its buffer set
    /// ([`DriverQueue::buf`]), for a caller that needs both.
    pub fn next_slot_set(&self) -> Option<(u16, usize)> {
        let s = self.ring.avail_idx() % self.nslots;
        let b = self.buf(s);
        (!self.busy[b]).then_some((s, b))
    }

    /// The slot the request `k` places after the next one will use, if its
    /// buffer set is free now (for prefetching).
    pub fn slot_ahead(&self, k: u16) -> Option<u16> {
        let s = self.ring.avail_idx().wrapping_add(k) % self.nslots;
        (!self.busy[self.buf(s)]).then_some(s)
    }

    /// The buffer set of [`DriverQueue::slot_ahead`]`(k)`, if that is
    /// free (for a caller that wants its [`DriverQueue::set_layout`]).
    pub fn set_ahead(&self, k: u16) -> Option<usize> {
        // `buf(x % nslots)` is `x % nbufs`, one division: the set count
        // divides the slot count (a power of two no larger than the
        // slots' power of two with indirect tables, equal with direct
        // chains; checked where the queue is set up).
        let b = usize::from(self.ring.avail_idx().wrapping_add(k) % self.nbufs);
        (!self.busy[b]).then_some(b)
    }

    /// The layout of the slot request `k` places after the next one will
    /// use, for a request that may `alternate` ([`DriverQueue::placement`]),
    /// if its buffer set is free now (for prefetching). One division, as
    /// in [`DriverQueue::set_ahead`].
    pub fn layout_ahead(&self, k: u16, alternate: bool) -> Option<SlotLayout> {
        let x = self.ring.avail_idx().wrapping_add(k);
        let b = usize::from(x % self.nbufs);
        // (x's swap bit is its slot's: `swap_bit`.)
        (!self.busy[b]).then(|| self.set_layout(b).swapped_if(alternate && x & self.swap_bit != 0))
    }

    /// Makes a plain cipher request available in `slot`, whose header, IV
    /// and src the caller has written; `iv_len` IV bytes, `len` = src = dst bytes.
    pub fn submit(&mut self, slot: u16, iv_len: u32, len: u32) {
        self.submit_request(slot, iv_len, len, 0, false);
    }

    /// Makes a request available in `slot` (header, IV and src written by
    /// the caller): readable header | IV | src, writable dst | hash result
    /// (`digest_len` bytes, none when 0) | status, the layout of the spec's
    /// `virtio_crypto_alg_chain_data_vlf`. With `in_place` the dst
    /// descriptor points at src, as DPDK's guest driver does.
    pub fn submit_request(&mut self, slot: u16, iv_len: u32, len: u32, digest_len: u32, in_place: bool) {
        let placement = if in_place {
            Placement::InPlace
        } else {
            Placement::Apart
        };
        self.submit_request_in(slot, self.buf(slot), iv_len, len, digest_len, placement);
    }

    /// [`DriverQueue::submit_request`] for a caller that has `slot`'s
    /// buffer set `b` (= [`DriverQueue::buf`]`(slot)`) at hand already, and
    /// has written src where `placement` puts it
    /// ([`DriverQueue::placement`]).
    #[inline(always)]
    pub fn submit_request_in(
        &mut self,
        slot: u16,
        b: usize,
        iv_len: u32,
        len: u32,
        digest_len: u32,
        placement: Placement,
    ) {
        debug_assert_eq!(b, self.buf(slot));
        let shape = (iv_len, len, digest_len, placement);
        // The usual case, a slot reused with the same shape, writes no
        // descriptor: the descriptors are laid out only when some are
        // (re)written (the set's table for a new shape; in indirect mode
        // also the slot's head when it was written for another shape).
        let unchanged = self.shape.get(Self::table_index(b, shape)) == Some(&Some(shape));
        let rewrite = !unchanged
            || (self.desc_mode == DescMode::Indirect
                && self.head_shape.get(usize::from(slot)) != Some(&Some(shape)));
        let head = match self.desc_mode {
            _ if rewrite => self.rewrite_descs(slot, shape, unchanged),
            DescMode::Chain => slot * DESCS_PER_REQUEST,
            DescMode::Indirect => slot,
        };
        self.take_slot_in(slot, b);
        self.ring.push(&*self.mem, head);
    }

    /// Publishes the avail index and kicks the backend unless it asked not
    /// to be (avail_event with EVENT_IDX, else `VIRTQ_USED_F_NO_NOTIFY`).
    pub fn publish_and_kick(&mut self) -> io::Result<()> {
        let Some((old, new)) = self.ring.publish(&*self.mem) else {
            return Ok(());
        };
        if self.ring.needs_kick(&*self.mem, self.event_idx, old, new) {
            self.kick.write(1)?;
        }
        Ok(())
    }

    /// Collects completed requests into `out`; waits up to `timeout` for
    /// at least one when none is ready, on the call eventfd. Used elements
    /// that name no request in flight ([`NO_SLOT`]) go into `out` too, but
    /// do not count as a completion: a backend that keeps putting them on
    /// the ring and never completes what is owed still times out. In DPDK mode
    /// the used ring is also re-read every millisecond: the 22.11 example
    /// signals the call eventfd after each completion burst, but not when
    /// started with `--guest-polling`.
    ///
    /// # Errors
    /// [`Error::Timeout`] ([`Error::DpdkStall`] in DPDK mode) if nothing
    /// completes in time; [`Error::BackendClosed`] if the backend closes
    /// the vhost-user connection first (looked for after each sleep of
    /// 100 ms, 1 ms in DPDK mode, that no call notification cut short);
    /// [`Error::ShutHere`] if this tool shut it down after an earlier
    /// failure.
    pub fn reap(&mut self, out: &mut Vec<Used>, timeout: Duration) -> Result<(), Error> {
        let start = std::time::Instant::now();
        let mut spins: u32 = 0;
        let first = out.len();
        let completed = |out: &Vec<Used>| out[first..].iter().any(|u| u.slot != NO_SLOT);
        loop {
            self.try_reap(out);
            if completed(out) || self.in_flight() == 0 {
                return Ok(());
            }
            // Busy-poll the used ring for a while before sleeping (as a
            // polling guest driver does): a completion that is about to come
            // costs neither a notification nor a wake-up. While we poll,
            // used_event stays behind, so the backend need not notify.
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(32) || start.elapsed() < REAP_POLL {
                std::hint::spin_loop();
                continue;
            }
            // Going to sleep: ask for a notification at the next used entry
            // (used_event, VIRTIO 1.2 §2.7.7.2), then look once more.
            self.ring.set_used_event(&*self.mem, self.ring.last_used());
            self.try_reap(out);
            if completed(out) {
                return Ok(());
            }
            if start.elapsed() > timeout {
                return Err(if self.dpdk {
                    Error::DpdkStall
                } else {
                    Error::Timeout
                });
            }
            let mut pfd = libc::pollfd {
                fd: self.call.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let woken = unsafe { libc::poll(&mut pfd, 1, if self.dpdk { 1 } else { 100 }) };
            let _ = self.call.read();
            // Nothing signalled for the whole poll (or the poll was
            // interrupted): has the backend gone?
            // (Looked at only then, so that a wait that is signalled makes
            // one system call, on one descriptor.)
            if woken <= 0 && self.peer_hung_up() {
                // The backend may still publish what its queue workers
                // were running when its end of the socket closed.
                std::thread::sleep(HANGUP_GRACE);
                self.try_reap(out);
                if completed(out) {
                    return Ok(());
                }
                return Err(if self.shut_here.load(Ordering::SeqCst) {
                    Error::ShutHere
                } else {
                    Error::BackendClosed(self.outstanding)
                });
            }
        }
    }

    /// Whether the vhost-user socket has ended (the backend closed it, or
    /// this tool shut it down): POLLRDHUP, POLLHUP or POLLERR, without
    /// waiting. The backend sends nothing on it unasked, so readable data
    /// is not looked for.
    fn peer_hung_up(&self) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.peer.as_raw_fd(),
            events: libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, 0) };
        n > 0 && pfd.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
    }

    /// Collects the completed requests already on the used ring into `out`,
    /// without waiting.
    pub fn try_reap(&mut self, out: &mut Vec<Used>) {
        let used_idx = self.ring.used_idx(&*self.mem);
        // The next used index in a local, stored once after the loop.
        let mut next = self.ring.last_used();
        while next != used_idx {
            let UsedElem { id, len } = self.ring.used_elem(&*self.mem, next);
            // A used id that names no request in flight (a backend bug the
            // caller reports) frees nothing and leaves what is owed as it
            // was: the request it should have named times out.
            let slot = match self.slot_of_head(id) {
                Some(slot) => {
                    self.in_flight_slot[usize::from(slot)] = false;
                    self.outstanding -= 1;
                    let b = self.buf(slot);
                    self.busy[b] = false;
                    slot
                }
                None => NO_SLOT,
            };
            out.push(Used { slot, len, id });
            next = next.wrapping_add(1);
        }
        self.ring.set_last_used(next);
    }

    /// Whether this queue lays requests out as direct chains.
    pub fn desc_mode(&self) -> DescMode {
        self.desc_mode
    }
}
