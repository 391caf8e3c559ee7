// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A vhost-user frontend for a virtio-crypto backend: negotiates like QEMU
//! (or like DPDK 22.11's vhost-crypto needs, see `--dpdk`), shares memfd
//! memory, drives split data rings as a guest driver would, and creates and
//! closes sessions with `VHOST_USER_CREATE/CLOSE_CRYPTO_SESSION`.
//!
//! The vhost-user protocol itself goes through rust-vmm `vhost`'s
//! [`Frontend`]; the crypto session messages, which it does not know, are
//! written on a clone of the same socket with the daemon's
//! `wire::session` module (messages are strictly sequential, so the two never
//! interleave).
//!
//! # DPDK 22.11 (`--dpdk`)
//!
//! What `examples/vhost_crypto` of DPDK 22.11 (Debian 12's `dpdk-doc` +
//! `libdpdk-dev` 22.11.11) does, read in the v22.11 sources
//! (`lib/vhost/vhost_crypto.c`, `lib/vhost/vhost_user.c`,
//! `examples/vhost_crypto/main.c`) and seen live with
//! `tools/bench/dpdk-vhost-crypto.sh`:
//!
//! * The session handler for messages 26/27 is installed by the app's
//!   `new_device` callback, which `vhost_user.c` calls only once every ring
//!   set up is enabled (`virtio_is_ready`); a CREATE before that is "not
//!   handled" and drops the connection. So the rings are set up and enabled
//!   with `SET_VRING_ENABLE(1)` before the first CREATE, and F_STATUS is not
//!   acked (with it, readiness would also wait for DRIVER_OK).
//! * CREATE is answered like QEMU expects: request 26, flags 0x5
//!   (`send_vhost_reply`), the received payload and size echoed with the id
//!   at offset 0 (layout A, 632 bytes); ids count from 1 per connection; a
//!   bad key gives a negative id. No NEED_REPLY is needed.
//! * CLOSE of a live id gets no reply (as with QEMU), so the GET_FEATURES
//!   barrier works. CLOSE of an id DPDK does not know makes the post-handler
//!   fail without NEED_REPLY, and `vhost_user_msg_handler` then closes the
//!   connection ("vhost message handling failed"); [`CryptoFrontend`] never
//!   sends such a CLOSE in DPDK mode (see [`CryptoFrontend::close_session`]).
//!   A CLOSE does not reset DPDK's one-entry session cache
//!   (`vhost_crypto_close_sess`), so a request naming the session closed last
//!   still "succeeds", with the output left equal to the input.
//! * Requests: the head must be one indirect descriptor (a direct chain is
//!   refused), and completion writes `used->ring[avail->ring[h]]` with the
//!   id `avail->ring[avail->ring[h]]` for head `h`
//!   (`vhost_crypto_finalize_one_request`), which is right only if ring slot
//!   i holds head i; [`DriverQueue::next_slot`] keeps that. The used length
//!   is `dst_data_len + 1` (`prepare_sym_cipher_op`: `vc_req->len =
//!   dst_data_len + INHDR_LEN`), this project's convention too, so the
//!   replay check is unchanged (seen: 257 for 256-byte requests, 18 for a
//!   17-byte one, which DPDK completes as OK). A request DPDK rejects
//!   (unknown session, malformed descriptors, zero-length data, data over
//!   2176 bytes = `RTE_MBUF_DEFAULT_BUF_SIZE`) gets
//!   an error status written but is never put on the used ring, and the
//!   queue stops at it (see [`Error::DpdkStall`]).
//! * The worker polls the avail ring (kicks are never read) and, unless the
//!   app runs with `--guest-polling`, writes the call eventfd after every
//!   completion burst (`vhost_crypto_worker` in the example). The example
//!   serves data queue 0 only (`NB_VIRTIO_QUEUES` = 1).

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::num::NonZeroU16;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VringConfigData};
use vhost_user_crypto::wire::session::{
    close_request, create_request, reply_session_id, SessionAbi, SymSessionInfo,
};
use vhost_user_crypto::wire::vhost_user::{FrontendReq, Header, HDR_SIZE, MAX_PAYLOAD, REPLY, VERSION_1};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::driver_ring::{self, encode, indirect_head, Buf, Descriptor, DriverRing, SplitRing, UsedElem};
use crate::guest_mem::GuestMem;

/// `VHOST_USER_F_PROTOCOL_FEATURES` (QEMU `docs/interop/vhost-user.rst`).
const F_PROTOCOL_FEATURES: u64 = VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
/// `VIRTIO_F_VERSION_1` (VIRTIO 1.2 §6).
const F_VERSION_1: u64 = 1 << virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
/// `VIRTIO_F_INDIRECT_DESC` (VIRTIO 1.2 §6).
const F_INDIRECT_DESC: u64 = 1 << virtio_bindings::virtio_ring::VIRTIO_RING_F_INDIRECT_DESC;
/// `VIRTIO_F_EVENT_IDX` (VIRTIO 1.2 §6).
const F_EVENT_IDX: u64 = 1 << virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;

/// How long the handshake, and each session or ring message after it, may
/// wait for the backend's answer.
pub const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);

/// Errors talking to a backend.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Connecting failed.
    #[error("cannot connect to {0}: {1}")]
    Connect(String, io::Error),
    /// A vhost-user request failed.
    #[error("vhost-user {0} failed: {1}")]
    Vhost(&'static str, vhost::Error),
    /// Socket I/O failed.
    #[error("socket: {0}")]
    Io(#[from] io::Error),
    /// The backend does not offer what is needed.
    #[error("backend lacks {0}")]
    Missing(&'static str),
    /// A CREATE reply was malformed.
    #[error("bad CREATE_CRYPTO_SESSION reply: {0}")]
    BadReply(String),
    /// A raw request of the trace cannot be laid out.
    #[error("raw request: {0}")]
    Raw(String),
    /// The tool's own options do not fit together.
    #[error("{0}")]
    Options(String),
    /// The backend stopped answering.
    #[error("timed out waiting for completions")]
    Timeout,
    /// The backend did not answer a vhost-user message in time. The
    /// connection is shut down then: the frontend is unusable.
    #[error(
        "the backend did not answer {0} within {secs} s (is it serving another frontend?)",
        secs = CONTROL_TIMEOUT.as_secs()
    )]
    NoAnswer(&'static str),
    /// DPDK mode: the backend stopped answering.
    #[error(
        "timed out waiting for completions (DPDK 22.11 never completes a request it rejects \
         (unknown session, malformed descriptors, zero-length or oversized data) and stops the \
         queue at it; its vhost_crypto example serves data queue 0 only)"
    )]
    DpdkStall,
}

/// How requests are laid out in descriptors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DescMode {
    /// One indirect table per request (what Linux does).
    Indirect,
    /// A direct chain in the ring's descriptor table.
    Chain,
}

/// Frontend settings.
#[derive(Debug, Clone)]
pub struct FrontendConfig {
    /// Number of data queues.
    pub queues: u16,
    /// Entries per ring (power of two).
    pub queue_size: u16,
    /// Requests in flight per queue.
    pub queue_depth: u16,
    /// Largest request payload (src = dst) in bytes.
    pub max_payload: usize,
    /// Largest IV in bytes (16 for AES-CBC; more for malformed requests).
    pub max_iv: usize,
    /// Guest memory size; 0 = sized to fit.
    pub memory_bytes: usize,
    /// Session payload layout.
    pub session_abi: SessionAbi,
    /// Descriptor layout.
    pub desc_mode: DescMode,
    /// Drive DPDK 22.11's vhost-crypto (protocol reference §5.7).
    pub dpdk: bool,
}

/// The largest ring this tool sets up (entries; a power of two).
pub const MAX_QUEUE_SIZE: u16 = 32768;

/// Whether `n` is a ring size this tool accepts: a power of two up to
/// [`MAX_QUEUE_SIZE`].
pub fn queue_size_ok(n: u16) -> bool {
    n.is_power_of_two() && n <= MAX_QUEUE_SIZE
}

impl FrontendConfig {
    /// Checks the options against each other.
    ///
    /// # Errors
    /// [`Error::Options`] with what to change.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |m: String| Err(Error::Options(m));
        if self.queues == 0 {
            return bad("--queues must be at least 1".into());
        }
        if !queue_size_ok(self.queue_size) {
            return bad(format!(
                "--queue-size {} is not a power of two in 1..={MAX_QUEUE_SIZE}",
                self.queue_size
            ));
        }
        let slots = DriverQueue::slots_for(self.queue_size, self.desc_mode);
        if self.queue_depth == 0 || self.queue_depth > slots {
            return bad(format!(
                "--queue-depth {} must be 1..={slots} with --queue-size {} ({})",
                self.queue_depth,
                self.queue_size,
                if self.desc_mode == DescMode::Chain {
                    format!("up to {DESCS_PER_REQUEST} ring descriptors per request with --descriptors chain")
                } else {
                    "one ring descriptor per request".to_string()
                }
            ));
        }
        Ok(())
    }
}

/// Descriptors a direct-chain request uses (header, IV, src, dst, status).
pub const DESCS_PER_REQUEST: u16 = 6;
/// How long [`DriverQueue::reap`] busy-polls the used ring before it
/// sleeps on the call eventfd.
pub const REAP_POLL: Duration = Duration::from_micros(50);
/// Bytes of a slot's hash-result area (digests of chained requests).
pub const DIGEST_AREA: usize = 64;

/// [`Used::slot`] of a used element whose id names no request in flight
/// (slots are below the queue size, at most 32,768).
pub const NO_SLOT: u16 = u16::MAX;
/// Most descriptors of a raw request's indirect table.
pub const MAX_RAW_DESCS: usize = 16;
const SLOT_ALIGN: usize = 64;
const RING_AREA_ALIGN: u64 = 4096;

/// One data queue as a driver sees it.
pub struct DriverQueue {
    mem: Arc<GuestMem>,
    /// Ring size.
    pub size: u16,
    /// The ring's addresses and the driver's avail and used indices.
    ring: DriverRing,
    event_idx: bool,
    dpdk: bool,
    kick: EventFd,
    call: EventFd,
    slots_base: u64,
    slot_size: usize,
    /// (Non-zero, [`FrontendConfig::validate`]: as a divisor it needs no
    /// zero test.)
    nslots: NonZeroU16,
    /// Buffer sets (header, IV, src, dst, status, indirect table): slot s
    /// uses set `s % nbufs` (see [`DriverQueue::layout`]).
    nbufs: NonZeroU16,
    /// Per buffer set: in use by a request in flight.
    busy: Vec<bool>,
    /// Per slot: a request is in flight there (a used element naming
    /// another slot frees no buffer set).
    in_flight_slot: Vec<bool>,
    /// How many slots have a request in flight: what is still owed, not
    /// the avail index minus the used index, which a backend that puts an
    /// unknown or repeated id on the used ring would move.
    outstanding: u16,
    /// The (iv_len, len, digest_len, in_place) whose descriptors each
    /// buffer set holds, so a set reused with the same shape is not
    /// rewritten.
    shape: Vec<Option<Shape>>,
    /// Per slot (indirect mode): the shape of the set's table its head
    /// descriptor was last written for.
    head_shape: Vec<Option<Shape>>,
    /// The first descriptor found changed when it was about to be
    /// rewritten for a new shape, for [`DriverQueue::check_descs`].
    desc_fault: Option<String>,
    desc_mode: DescMode,
    max_payload: usize,
    max_iv: usize,
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
    /// Indirect table.
    pub table: u64,
    /// Hash result of a chained request ([`DIGEST_AREA`] bytes).
    pub digest: u64,
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

fn slot_size(max_payload: usize, max_iv: usize) -> usize {
    // Header | src | dst | IV + status | indirect table | hash result, each
    // from a cache-line boundary (see `DriverQueue::layout`).
    let p = max_payload.next_multiple_of(SLOT_ALIGN);
    SRC_OFFSET as usize
        + 2 * p
        + (max_iv + 1).next_multiple_of(SLOT_ALIGN)
        + 16 * MAX_RAW_DESCS
        + DIGEST_AREA.next_multiple_of(SLOT_ALIGN)
}

/// A request's descriptor shape: (IV bytes, src = dst bytes, hash result
/// bytes, in place). Requests of one shape in one buffer set have the same
/// descriptors.
type Shape = (u32, u32, u32, bool);

impl DriverQueue {
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
    pub fn layout(&self, slot: u16) -> SlotLayout {
        self.set_layout(self.buf(slot))
    }

    /// Guest addresses of buffer set `b`'s buffers (`layout(slot)` is
    /// `set_layout(buf(slot))`; for a caller that needs both).
    pub fn set_layout(&self, b: usize) -> SlotLayout {
        let base = self.slots_base + b as u64 * self.slot_size as u64;
        let p = (self.max_payload as u64).next_multiple_of(SLOT_ALIGN as u64);
        // The header (unchanged while the slot keeps its session and
        // shape), src and dst each start a cache line, as a driver's buffers
        // usually do: a 256-byte payload is 4 lines, not 5, and no line
        // holds bytes the driver writes for a request next to bytes the
        // device writes (src end and dst start). The IV and the status byte
        // share one line, the only one besides src and dst that both sides
        // touch for every request (driver: IV and status canary; device:
        // reads the IV, writes the status). The table has its own line: it
        // changes only when the slot changes shape.
        let src = base + SRC_OFFSET;
        let dst = src + p;
        let iv = dst + p;
        let status = iv + self.max_iv as u64;
        let table = align(status + 1, SLOT_ALIGN as u64);
        SlotLayout {
            hdr: base,
            iv,
            src,
            dst,
            status,
            table,
            digest: table + 16 * MAX_RAW_DESCS as u64,
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
    fn take_slot(&mut self, slot: u16) {
        self.take_slot_in(slot, self.buf(slot));
    }

    /// [`DriverQueue::take_slot`] for a caller that has `slot`'s buffer
    /// set `b` at hand already.
    fn take_slot_in(&mut self, slot: u16, b: usize) {
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
            DescMode::Chain if id % u32::from(DESCS_PER_REQUEST) == 0 => id / u32::from(DESCS_PER_REQUEST),
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
        self.submit_request_in(slot, self.buf(slot), iv_len, len, digest_len, in_place);
    }

    /// [`DriverQueue::submit_request`] for a caller that has `slot`'s
    /// buffer set `b` (= [`DriverQueue::buf`]`(slot)`) at hand already.
    #[inline(always)]
    pub fn submit_request_in(
        &mut self,
        slot: u16,
        b: usize,
        iv_len: u32,
        len: u32,
        digest_len: u32,
        in_place: bool,
    ) {
        debug_assert_eq!(b, self.buf(slot));
        let shape = (iv_len, len, digest_len, in_place);
        // The usual case, a slot reused with the same shape, writes no
        // descriptor: the descriptors are laid out only when some are
        // (re)written (the set's table for a new shape; in indirect mode
        // also the slot's head when it was written for another shape).
        let unchanged = self.shape.get(b) == Some(&Some(shape));
        let rewrite = !unchanged
            || (self.desc_mode == DescMode::Indirect
                && self.head_shape.get(usize::from(slot)) != Some(&Some(shape)));
        let head = match self.desc_mode {
            _ if rewrite => self.rewrite_descs(slot, b, shape, unchanged),
            DescMode::Chain => slot * DESCS_PER_REQUEST,
            DescMode::Indirect => slot,
        };
        self.take_slot_in(slot, b);
        self.ring.push(&*self.mem, head);
    }

    /// [`DriverQueue::submit_request_in`]'s descriptors for `slot`, of
    /// buffer set `b`, when some are (re)written for `shape` (`unchanged`:
    /// the set's table holds that shape already). What is rewritten must
    /// still be as this tool left it, or a backend's write to it would be
    /// repaired unseen before [`DriverQueue::check_descs`] looks: it is
    /// checked first (the first change found is kept for `check_descs`).
    /// Returns the head. (Out of line: the usual request rewrites nothing,
    /// and its path stays as short as before this check.)
    #[cold]
    #[inline(never)]
    fn rewrite_descs(&mut self, slot: u16, b: usize, shape: Shape, unchanged: bool) -> u16 {
        if self.desc_fault.is_none() {
            let old_table = self.shape.get(b).copied().flatten().filter(|_| !unchanged);
            let old_head = self.head_shape.get(usize::from(slot)).copied().flatten();
            self.desc_fault = match self.desc_mode {
                DescMode::Indirect => old_table
                    .and_then(|o| self.table_fault(b, o))
                    .or_else(|| old_head.and_then(|o| self.head_fault(slot, o))),
                DescMode::Chain => old_table.and_then(|o| self.chain_fault(slot, o)),
            };
        }
        if let Some(s) = self.shape.get_mut(b) {
            *s = Some(shape);
        }
        self.write_descs(slot, shape, unchanged)
    }

    /// Writes [`DriverQueue::submit_request`]'s descriptors for `slot`
    /// and `shape` (iv_len, len, digest_len, in_place): in indirect mode
    /// the buffer set's table unless `unchanged` (it holds them already)
    /// and the slot's head descriptor, in chain mode the chain. Returns
    /// the head.
    #[inline(never)]
    fn write_descs(&mut self, slot: u16, shape: Shape, unchanged: bool) -> u16 {
        let (bufs, n) = self.shape_bufs(self.buf(slot), shape);
        let mem = &*self.mem;
        match self.desc_mode {
            DescMode::Indirect => {
                let l = self.layout(slot);
                if !unchanged {
                    driver_ring::write_table(mem, l.table, &bufs[..n]);
                }
                // The slot's head descriptor may point at the set's table
                // for another shape (another slot of the set changed it), or
                // not at all yet.
                self.ring.write_desc(mem, slot, &indirect_head(l.table, n));
                self.head_shape[usize::from(slot)] = Some(shape);
                slot
            }
            DescMode::Chain => self.ring.write_chain(mem, slot * DESCS_PER_REQUEST, &bufs[..n]),
        }
    }

    /// The buffers of a request of `shape` (iv_len, len, digest_len,
    /// in_place) in buffer set `b`, in the order [`DriverQueue::write_descs`]
    /// links them ([`driver_ring::chain`]): header (72 bytes), IV, src,
    /// dst (src when in place), the hash result when it has bytes, status.
    /// Returns them and how many.
    fn shape_bufs(&self, b: usize, shape: Shape) -> ([Buf; DESCS_PER_REQUEST as usize], usize) {
        let (iv_len, len, digest_len, in_place) = shape;
        let l = self.set_layout(b);
        let dst = if in_place { l.src } else { l.dst };
        let all = [
            Buf::readable(l.hdr, 72),
            Buf::readable(l.iv, iv_len),
            Buf::readable(l.src, len),
            Buf::writable(dst, len),
            Buf::writable(l.digest, digest_len),
            Buf::writable(l.status, 1),
        ];
        let mut out = [Buf::readable(0, 0); DESCS_PER_REQUEST as usize];
        let mut n = 0;
        for buf in all {
            if buf.len > 0 || buf.addr != l.digest {
                out[n] = buf;
                n += 1;
            }
        }
        (out, n)
    }

    /// Checks that the descriptors this queue laid out for the trace's
    /// requests (every set's indirect table and every slot's head in
    /// indirect mode, every slot's chain in chain mode) still hold what it
    /// wrote: the descriptor table is the driver's part of the split
    /// virtqueue (VIRTIO 1.2 §2.7: each part is written by the driver or by
    /// the device, not both) and an indirect table is a device-readable
    /// buffer, which a device must not write (§2.7.5.1), so a change is a
    /// backend's write. Raw requests' descriptors
    /// ([`DriverQueue::submit_descs`]) are not covered. Call it with no
    /// request in flight.
    ///
    /// # Errors
    /// Where the first changed descriptor is (ring index, or buffer set
    /// and table entry). The queue then forgets what it laid out, so the
    /// next requests write their descriptors again.
    pub fn check_descs(&mut self) -> Result<(), String> {
        let mut bad = self.desc_fault.take();
        match self.desc_mode {
            DescMode::Indirect => {
                for (b, shape) in self.shape.iter().enumerate() {
                    if bad.is_some() {
                        break;
                    }
                    bad = shape.and_then(|o| self.table_fault(b, o));
                }
                for (slot, shape) in self.head_shape.iter().enumerate() {
                    if bad.is_some() {
                        break;
                    }
                    bad = shape.and_then(|o| self.head_fault(slot as u16, o));
                }
            }
            DescMode::Chain => {
                // Every slot has its own buffer set here.
                for (slot, shape) in self.shape.iter().enumerate() {
                    if bad.is_some() {
                        break;
                    }
                    bad = shape.and_then(|o| self.chain_fault(slot as u16, o));
                }
            }
        }
        match bad {
            None => Ok(()),
            Some(at) => {
                self.shape.iter_mut().for_each(|s| *s = None);
                self.head_shape.iter_mut().for_each(|s| *s = None);
                Err(at)
            }
        }
    }

    /// The 16 bytes of the descriptor at `gpa`.
    fn desc_at(&self, gpa: u64) -> [u8; 16] {
        let mut b = [0u8; 16];
        self.mem.read(gpa, &mut b);
        b
    }

    /// Where buffer set `b`'s indirect table differs from what
    /// [`DriverQueue::write_descs`] put there for `shape`.
    #[cold]
    #[inline(never)]
    fn table_fault(&self, b: usize, shape: Shape) -> Option<String> {
        let (bufs, n) = self.shape_bufs(b, shape);
        let table = self.set_layout(b).table;
        let bad = driver_ring::chain(&bufs[..n], 0)
            .enumerate()
            .find(|(i, d)| self.desc_at(table + 16 * *i as u64) != encode(d));
        bad.map(|(i, _)| format!("buffer set {b}'s indirect table, entry {i}"))
    }

    /// Whether slot `slot`'s ring descriptor differs from the indirect
    /// head written for `shape`.
    #[cold]
    #[inline(never)]
    fn head_fault(&self, slot: u16, shape: Shape) -> Option<String> {
        let n = self.shape_bufs(self.buf(slot), shape).1;
        let d = indirect_head(self.layout(slot).table, n);
        (self.desc_at(self.ring.ring().desc_at(slot)) != encode(&d))
            .then(|| format!("ring descriptor {slot} (indirect head)"))
    }

    /// Where slot `slot`'s direct chain differs from the one written for
    /// `shape` (chain mode: the slot's buffer set is the slot's own).
    #[cold]
    #[inline(never)]
    fn chain_fault(&self, slot: u16, shape: Shape) -> Option<String> {
        let (bufs, n) = self.shape_bufs(usize::from(slot), shape);
        let base = slot * DESCS_PER_REQUEST;
        let ring = self.ring.ring();
        let bad = driver_ring::chain(&bufs[..n], base)
            .zip(base..)
            .find(|(d, i)| self.desc_at(ring.desc_at(*i)) != encode(d));
        bad.map(|(_, i)| format!("ring descriptor {i} (chain of slot {slot})"))
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
    /// completes in time.
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
            if spins % 32 != 0 || start.elapsed() < REAP_POLL {
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
                fd: self.call_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut pfd, 1, if self.dpdk { 1 } else { 100 }) };
            let _ = self.call.read();
        }
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

    /// Makes a raw request available in `slot`, its descriptors written
    /// exactly as given (flags and `next` included): as the slot's indirect
    /// table (at most [`MAX_RAW_DESCS`]), or, on a queue in chain mode, as a
    /// direct chain in the slot's block of the ring's table (at most
    /// [`DESCS_PER_REQUEST`]; `next` values are then offset by the block's
    /// first index, so they stay relative to the request). Returns the
    /// head descriptor's index in the ring's table (the used id the
    /// request must come back with).
    ///
    /// # Errors
    /// Too many descriptors, or a direct chain on a queue in indirect mode.
    pub fn submit_descs(&mut self, slot: u16, descs: &[Descriptor], indirect: bool) -> Result<u16, String> {
        let b = self.buf(slot);
        if let Some(s) = self.shape.get_mut(b) {
            *s = None;
        }
        if let Some(s) = self.head_shape.get_mut(usize::from(slot)) {
            *s = None;
        }
        let head = self.raw_desc_images(slot, descs, indirect, |gpa, d| self.mem.write(gpa, &d))?;
        self.take_slot(slot);
        self.ring.push(&*self.mem, head);
        Ok(head)
    }

    /// The descriptors [`DriverQueue::submit_descs`]`(slot, descs,
    /// indirect)` writes, each handed to `put` as (guest address, its 16
    /// bytes) in the order written: for an indirect request (`indirect`,
    /// on a queue in either mode) the table's entries, then the head in
    /// the ring's table; for a direct chain the chain. Nothing is written
    /// here. Returns the head's index in the ring's table.
    ///
    /// # Errors
    /// As [`DriverQueue::submit_descs`], before anything is handed to `put`.
    pub fn raw_desc_images(
        &self,
        slot: u16,
        descs: &[Descriptor],
        indirect: bool,
        mut put: impl FnMut(u64, [u8; 16]),
    ) -> Result<u16, String> {
        if indirect {
            if descs.len() > MAX_RAW_DESCS {
                return Err(format!(
                    "at most {MAX_RAW_DESCS} descriptors in a raw indirect table"
                ));
            }
            let table = self.layout(slot).table;
            for (i, d) in descs.iter().enumerate() {
                put(table + 16 * i as u64, encode(d));
            }
            let d = indirect_head(table, descs.len());
            let head = match self.desc_mode {
                DescMode::Indirect => slot,
                DescMode::Chain => slot * DESCS_PER_REQUEST,
            };
            put(self.ring.ring().desc_at(head), encode(&d));
            Ok(head)
        } else {
            if self.desc_mode != DescMode::Chain {
                return Err("raw direct chains need --descriptors chain".into());
            }
            if descs.len() > usize::from(DESCS_PER_REQUEST) || descs.is_empty() {
                return Err(format!(
                    "1 to {DESCS_PER_REQUEST} descriptors in a raw direct chain"
                ));
            }
            let base = slot * DESCS_PER_REQUEST;
            for (i, d) in descs.iter().enumerate() {
                let d = Descriptor::new(d.addr().0, d.len(), d.flags(), d.next().wrapping_add(base));
                put(self.ring.ring().desc_at(base + i as u16), encode(&d));
            }
            Ok(base)
        }
    }

    /// Whether this queue lays requests out as direct chains.
    pub fn desc_mode(&self) -> DescMode {
        self.desc_mode
    }

    fn call_fd(&self) -> i32 {
        use std::os::fd::AsRawFd;
        self.call.as_raw_fd()
    }
}

/// A connected frontend.
pub struct CryptoFrontend {
    frontend: Frontend,
    sock: UnixStream,
    abi: SessionAbi,
    /// Guest memory.
    pub mem: Arc<GuestMem>,
    /// Data queues.
    pub queues: Vec<DriverQueue>,
    /// DPDK mode: the session ids the backend holds (created, not closed).
    dpdk_live: Option<std::collections::HashSet<u64>>,
}

impl CryptoFrontend {
    /// Connects to `path` and sets everything up.
    ///
    /// # Errors
    /// Connection or negotiation failures.
    pub fn connect(path: &Path, cfg: &FrontendConfig) -> Result<Self, Error> {
        // A backend that has just bound its socket may not listen yet
        // (connect then fails with ECONNREFUSED): retry briefly, as rust-vmm
        // vhost's Frontend::connect does.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        let sock = loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                Err(e)
                    if e.kind() == io::ErrorKind::ConnectionRefused
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(e) => return Err(Error::Connect(path.display().to_string(), e)),
            }
        };
        Self::from_stream(sock, cfg)
    }

    /// Sets up a frontend on an already-connected socket.
    ///
    /// # Errors
    /// Negotiation failures; [`Error::NoAnswer`] if the backend does not
    /// answer a message of the handshake within [`CONTROL_TIMEOUT`].
    pub fn from_stream(sock: UnixStream, cfg: &FrontendConfig) -> Result<Self, Error> {
        cfg.validate()?;
        // A backend that never answers must not hang the tool: the session
        // replies, read here, fail after the socket's read timeout; the
        // library's requests are bounded by `bounded`.
        sock.set_read_timeout(Some(CONTROL_TIMEOUT))?;
        let raw = sock.try_clone()?;
        let watch = sock.try_clone()?;
        bounded(&watch, "the vhost-user handshake", || {
            Self::handshake(sock, raw, cfg)
        })
    }

    fn handshake(sock: UnixStream, raw: UnixStream, cfg: &FrontendConfig) -> Result<Self, Error> {
        let mut fe = Frontend::from_stream(sock, u64::from(cfg.queues));
        let v = |what| move |e| Error::Vhost(what, e);

        let features = fe.get_features().map_err(v("GET_FEATURES"))?;
        if features & F_PROTOCOL_FEATURES == 0 {
            return Err(Error::Missing("VHOST_USER_F_PROTOCOL_FEATURES"));
        }
        let pf = fe.get_protocol_features().map_err(v("GET_PROTOCOL_FEATURES"))?;
        if !pf.contains(VhostUserProtocolFeatures::CRYPTO_SESSION) {
            return Err(Error::Missing("VHOST_USER_PROTOCOL_F_CRYPTO_SESSION"));
        }
        let mut want = VhostUserProtocolFeatures::CRYPTO_SESSION;
        if cfg.queues > 1 {
            if !pf.contains(VhostUserProtocolFeatures::MQ) {
                return Err(Error::Missing(
                    "VHOST_USER_PROTOCOL_F_MQ (needed for --queues > 1)",
                ));
            }
            want |= VhostUserProtocolFeatures::MQ;
        }
        fe.set_protocol_features(want)
            .map_err(v("SET_PROTOCOL_FEATURES"))?;
        if cfg.queues > 1 {
            let n = fe.get_queue_num().map_err(v("GET_QUEUE_NUM"))?;
            if n < u64::from(cfg.queues) {
                return Err(Error::Options(format!(
                    "--queues {}: the backend offers {n} (GET_QUEUE_NUM)",
                    cfg.queues
                )));
            }
        }
        fe.set_owner().map_err(v("SET_OWNER"))?;
        let acked = features & (F_PROTOCOL_FEATURES | F_VERSION_1 | F_INDIRECT_DESC | F_EVENT_IDX);
        let event_idx = acked & F_EVENT_IDX != 0;

        let nslots = DriverQueue::slots_for(cfg.queue_size, cfg.desc_mode);
        let nbufs = match cfg.desc_mode {
            // A power of two (nslots is one too), so that slot i always
            // maps to the same set and its head descriptor never changes.
            DescMode::Indirect => cfg.queue_depth.next_power_of_two().min(nslots),
            DescMode::Chain => nslots,
        };
        // DriverQueue::set_ahead relies on this.
        assert!(nbufs > 0 && nslots % nbufs == 0, "buffer sets divide the slots");
        let ssize = slot_size(cfg.max_payload, cfg.max_iv);
        let ring_bytes = SplitRing::contiguous_bytes(cfg.queue_size, RING_AREA_ALIGN);
        let per_queue = ring_bytes + align(u64::from(nbufs) * ssize as u64, RING_AREA_ALIGN);
        let need = (u64::from(cfg.queues) * per_queue + RING_AREA_ALIGN) as usize;
        let size = cfg.memory_bytes.max(need).next_multiple_of(2 << 20);
        let mem = Arc::new(GuestMem::new(size)?);

        fe.set_features(acked).map_err(v("SET_FEATURES"))?;
        fe.set_mem_table(&[mem.region_info()])
            .map_err(v("SET_MEM_TABLE"))?;

        let mut queues = Vec::new();
        let mut base = RING_AREA_ALIGN;
        for q in 0..usize::from(cfg.queues) {
            let ring = SplitRing::contiguous(base, cfg.queue_size, RING_AREA_ALIGN);
            let slots_base = base + ring_bytes;
            base += per_queue;
            let kick = EventFd::new(EFD_NONBLOCK)?;
            let call = EventFd::new(EFD_NONBLOCK)?;
            fe.set_vring_num(q, cfg.queue_size).map_err(v("SET_VRING_NUM"))?;
            fe.set_vring_base(q, 0).map_err(v("SET_VRING_BASE"))?;
            fe.set_vring_addr(q, &vring_config(&mem, ring))
                .map_err(v("SET_VRING_ADDR"))?;
            fe.set_vring_kick(q, &kick).map_err(v("SET_VRING_KICK"))?;
            fe.set_vring_call(q, &call).map_err(v("SET_VRING_CALL"))?;
            queues.push(DriverQueue {
                mem: mem.clone(),
                size: cfg.queue_size,
                ring: DriverRing::new(ring, 0),
                event_idx,
                dpdk: cfg.dpdk,
                kick,
                call,
                slots_base,
                slot_size: ssize,
                nslots: nonzero(nslots)?,
                nbufs: nonzero(nbufs)?,
                busy: vec![false; usize::from(nbufs)],
                in_flight_slot: vec![false; usize::from(nslots)],
                outstanding: 0,
                shape: vec![None; usize::from(nbufs)],
                head_shape: vec![None; usize::from(nslots)],
                desc_fault: None,
                desc_mode: cfg.desc_mode,
                max_payload: cfg.max_payload,
                max_iv: cfg.max_iv,
            });
        }
        if cfg.dpdk {
            // DPDK 22.11 installs its session handler only once every ring
            // is enabled (protocol reference §5.7).
            for q in 0..usize::from(cfg.queues) {
                fe.set_vring_enable(q, true).map_err(v("SET_VRING_ENABLE"))?;
            }
        }
        Ok(CryptoFrontend {
            frontend: fe,
            sock: raw,
            abi: cfg.session_abi,
            mem,
            queues,
            dpdk_live: cfg.dpdk.then(Default::default),
        })
    }

    /// Sends CREATE_CRYPTO_SESSION and returns the backend's session id
    /// (negative on refusal).
    ///
    /// # Errors
    /// Socket failures or a malformed reply.
    pub fn create_session(&mut self, info: &SymSessionInfo) -> Result<i64, Error> {
        let msg = create_request(self.abi, info);
        self.sock.write_all(&msg)?;
        let mut hdr = [0u8; HDR_SIZE];
        let late = read_error(&self.sock, "CREATE_CRYPTO_SESSION");
        (&self.sock).read_exact(&mut hdr).map_err(late)?;
        let Header {
            request: req,
            flags,
            size,
        } = Header::from_bytes(&hdr);
        let size = size as usize;
        if req != u32::from(FrontendReq::CREATE_CRYPTO_SESSION)
            || flags != VERSION_1 | REPLY
            || size > MAX_PAYLOAD
        {
            return Err(Error::BadReply(format!(
                "request {req} flags {flags:#x} size {size}"
            )));
        }
        let mut payload = vec![0u8; size];
        (&self.sock).read_exact(&mut payload).map_err(late)?;
        if size != self.abi.size() {
            return Err(Error::BadReply(format!("size {size}, sent {}", self.abi.size())));
        }
        let id = reply_session_id(&payload, self.abi).ok_or_else(|| Error::BadReply("short".into()))?;
        if let (Some(live), true) = (&mut self.dpdk_live, id > 0) {
            live.insert(id as u64);
        }
        Ok(id)
    }

    /// Sends CLOSE_CRYPTO_SESSION (which has no reply), then a GET_FEATURES
    /// round trip: a backend handles messages in order, so once that reply
    /// is back the close has taken effect and later requests see it.
    ///
    /// In DPDK mode an id this connection did not get from CREATE, or has
    /// closed already, is not sent: DPDK 22.11 would close the connection
    /// (`vhost_crypto_close_sess` fails, and without NEED_REPLY
    /// `vhost_user_msg_handler` treats that as fatal); the session is gone
    /// either way.
    ///
    /// # Errors
    /// Socket failures.
    pub fn close_session(&mut self, id: u64) -> Result<(), Error> {
        if let Some(live) = &mut self.dpdk_live {
            if !live.remove(&id) {
                return Ok(());
            }
        }
        self.sock.write_all(&close_request(id))?;
        let fe = &mut self.frontend;
        bounded(&self.sock, "GET_FEATURES", || {
            fe.get_features().map_err(|e| Error::Vhost("GET_FEATURES", e))
        })?;
        Ok(())
    }

    /// Sends raw bytes on the vhost-user socket (for malformed-message tests).
    ///
    /// # Errors
    /// Socket failures.
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<(), Error> {
        self.sock.write_all(bytes)?;
        Ok(())
    }

    /// Reads one whole message (header + payload) from the socket, e.g. the
    /// reply to a message sent with [`CryptoFrontend::send_raw`].
    ///
    /// # Errors
    /// Socket failures or a payload over 4096 bytes.
    pub fn recv_raw_reply(&mut self) -> Result<Vec<u8>, Error> {
        let mut msg = vec![0u8; HDR_SIZE];
        self.sock.read_exact(&mut msg)?;
        let size = Header::from_bytes(msg[..HDR_SIZE].try_into().unwrap_or(&[0; HDR_SIZE])).size;
        if size as usize > MAX_PAYLOAD {
            return Err(Error::BadReply(format!("size {size}")));
        }
        msg.resize(HDR_SIZE + size as usize, 0);
        self.sock.read_exact(&mut msg[HDR_SIZE..])?;
        Ok(msg)
    }

    /// Asks the backend for ring `q`'s base (stops the ring), as a frontend
    /// does on shutdown.
    ///
    /// # Errors
    /// Protocol failures.
    pub fn get_vring_base(&mut self, q: usize) -> Result<u32, Error> {
        let fe = &mut self.frontend;
        bounded(&self.sock, "GET_VRING_BASE", || {
            fe.get_vring_base(q)
                .map_err(|e| Error::Vhost("GET_VRING_BASE", e))
        })
    }

    /// Sets data ring `q` up again after [`CryptoFrontend::get_vring_base`]
    /// stopped it, as QEMU does when it restarts a device: SET_VRING_NUM,
    /// SET_VRING_BASE (`base`), SET_VRING_ADDR, SET_VRING_KICK and
    /// SET_VRING_CALL with the same memory and eventfds. The guest side of
    /// the ring (descriptors, avail and used rings) is left as it is.
    ///
    /// # Errors
    /// Protocol failures.
    pub fn restart_ring(&mut self, q: usize, base: u16) -> Result<(), Error> {
        let v = |what: &'static str| move |e| Error::Vhost(what, e);
        let dq = &self.queues[q];
        let addr = vring_config(&self.mem, dq.ring_addrs());
        let fe = &mut self.frontend;
        bounded(&self.sock, "the ring set-up", || {
            fe.set_vring_num(q, dq.size).map_err(v("SET_VRING_NUM"))?;
            fe.set_vring_base(q, base).map_err(v("SET_VRING_BASE"))?;
            fe.set_vring_addr(q, &addr).map_err(v("SET_VRING_ADDR"))?;
            fe.set_vring_kick(q, &dq.kick).map_err(v("SET_VRING_KICK"))?;
            fe.set_vring_call(q, &dq.call).map_err(v("SET_VRING_CALL"))?;
            Ok(())
        })
    }
}

/// `SET_VRING_ADDR`'s payload for `ring` in `mem`: our addresses of its
/// three parts (the backend translates them with the memory table).
fn vring_config(mem: &GuestMem, ring: SplitRing) -> VringConfigData {
    VringConfigData {
        queue_max_size: ring.size,
        queue_size: ring.size,
        flags: 0,
        desc_table_addr: mem.va(ring.desc),
        used_ring_addr: mem.va(ring.used),
        avail_ring_addr: mem.va(ring.avail),
        log_addr: None,
    }
}

/// Maps a failed read of `what`'s reply on `sock`: the socket's read
/// timeout ([`CONTROL_TIMEOUT`]) to [`Error::NoAnswer`], after shutting the
/// socket down (a late reply must not be taken for the answer to the next
/// message), anything else to [`Error::Io`].
fn read_error<'a>(sock: &'a UnixStream, what: &'static str) -> impl Fn(io::Error) -> Error + Copy + 'a {
    move |e| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            let _ = sock.shutdown(Shutdown::Both);
            Error::NoAnswer(what)
        }
        _ => Error::Io(e),
    }
}

/// Runs `f`, which sends vhost-user requests through rust-vmm's
/// [`Frontend`] on `sock`, and shuts the socket down if `f` has not
/// returned after [`CONTROL_TIMEOUT`]: the library retries a read that
/// timed out (`EAGAIN`) for ever (vhost 0.18 `connection.rs`), so the
/// socket's read timeout alone does not bound it.
///
/// # Errors
/// [`Error::NoAnswer`] (`what`) once the time ran out (the connection is
/// unusable then, whatever `f` returned), else `f`'s error.
fn bounded<T>(
    sock: &UnixStream,
    what: &'static str,
    f: impl FnOnce() -> Result<T, Error>,
) -> Result<T, Error> {
    let watch = sock.try_clone()?;
    let fired = Arc::new(AtomicBool::new(false));
    let (done, wait) = mpsc::channel::<()>();
    let t = {
        let fired = fired.clone();
        std::thread::spawn(move || {
            if wait.recv_timeout(CONTROL_TIMEOUT) == Err(mpsc::RecvTimeoutError::Timeout) {
                fired.store(true, Ordering::SeqCst);
                // The blocked read then sees the end of the stream.
                let _ = watch.shutdown(Shutdown::Both);
            }
        })
    };
    let r = f();
    let _ = done.send(());
    let _ = t.join();
    if fired.load(Ordering::SeqCst) {
        return Err(Error::NoAnswer(what));
    }
    r
}
