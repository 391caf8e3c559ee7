// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Replays a [`Trace`] through a [`CryptoFrontend`]: keeps up to the queue
//! depth of requests in flight per queue, checks every completion (status,
//! used length, output bytes, and that a failed request left its output
//! untouched) and measures throughput and latency.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use serde::Serialize;
use vhost_user_crypto::wire::session::SymSessionInfo;
use vhost_user_crypto::wire::virtio_crypto::{
    AlgChainPara, OpDataReq, OP_DATA_REQ_SIZE, VIRTIO_CRYPTO_CIPHER_DECRYPT, VIRTIO_CRYPTO_CIPHER_ENCRYPT,
    VIRTIO_CRYPTO_OP_DECRYPT, VIRTIO_CRYPTO_OP_ENCRYPT, VIRTIO_CRYPTO_SYM_HASH_MODE_AUTH,
    VIRTIO_CRYPTO_SYM_OP_ALGORITHM_CHAINING, VIRTIO_CRYPTO_SYM_OP_CIPHER,
};

use crate::frontend::{CryptoFrontend, Error, SlotLayout, Used, DIGEST_AREA};
use crate::guest_mem::GuestMem;
use crate::trace::{hex, ChainReq, ChainSession, Dir, ExpectStatus, Req, Step, Trace};

/// Canary written over every output buffer before a request is submitted.
pub const DST_CANARY: u8 = 0xA5;

/// The first this many requests of a run have their src and request header
/// compared with what this tool put there after they complete (so every
/// request of the shipped known-answer traces), and after them one in
/// [`SRC_CHECK_EVERY`].
pub const SRC_CHECK_ALL: u64 = 4096;

/// One request in this many has its src and header compared after it
/// completes, after the first [`SRC_CHECK_ALL`]. By then the src lines have
/// usually left this CPU's caches for the backend's, and reading them all
/// back for every request cost 10-40 % of the 256-byte throughput here (the
/// sampled ones are prefetched with the request's output); a
/// backend that writes device-readable buffers does so on a code path,
/// which a sample finds as surely (the soak checker compares src on every
/// request).
pub const SRC_CHECK_EVERY: u64 = 64;
const _: () = assert!(SRC_CHECK_EVERY.is_power_of_two());

/// Whether the request with sequence number `seq` in its run has its src
/// checked ([`SRC_CHECK_ALL`], [`SRC_CHECK_EVERY`]). The sample is a hash
/// of `seq`, not `seq % SRC_CHECK_EVERY`: requests go to the queues round
/// robin, so a multiple of the queue count would always pick queue 0 (and
/// a trace repeating with a period that divides it, the same requests).
fn src_checked(seq: u64) -> bool {
    seq < SRC_CHECK_ALL || in_hash_sample(seq)
}

/// Whether `seq` is in the sample of one in [`SRC_CHECK_EVERY`] (64)
/// sequence numbers, chosen by a hash of it (not the multiples of
/// anything, see [`src_checked`]).
fn in_hash_sample(seq: u64) -> bool {
    // Fibonacci hashing: the top bits of seq * 2^64 / phi.
    seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SRC_CHECK_EVERY.trailing_zeros()) == 0
}

/// Runs of at most this many requests (the trace's requests times
/// `--repeat`: the known-answer and policy traces) have every request's
/// latency measured; longer ones (benchmarks, where reading the clock
/// would slow the tool) one in 64 ([`in_hash_sample`]), evenly over the run.
const LATENCY_ALL_UP_TO: u64 = 4096;

/// Bytes of canary put right after a request's output where they are not
/// another field of the slot (see `dst_guard`), and checked afterwards.
pub const GUARD_LEN: usize = 16;

/// Where the guard after a request's output goes, if anywhere: after dst
/// when the request is shorter than the slot's dst area (a full-length
/// dst is followed by the IV, which is checked anyway), or after src for
/// an in-place request (the dst area is then unused).
fn dst_guard(l: SlotLayout, len: u32, in_place: bool) -> Option<u64> {
    let len = u64::from(len);
    if in_place {
        return Some(l.src + len);
    }
    let area = l.dst - l.src;
    (len + GUARD_LEN as u64 <= area).then_some(l.dst + len)
}

/// The status byte's canary and the bytes after it up to `STATUS_AREA`
/// (checked afterwards: the device writes one byte). Written as one piece
/// where the slot has room before its descriptor table.
const STATUS_AREA: usize = 8;
const STATUS_AREA_PUT: [u8; STATUS_AREA] = [STATUS_CANARY, 0x5A, 0x5A, 0x5A, 0x5A, 0x5A, 0x5A, 0x5A];

/// Whether slot `l` has room for the whole status area before its
/// descriptor table.
fn status_area_fits(l: SlotLayout) -> bool {
    l.status + STATUS_AREA as u64 <= l.table
}

/// Puts the status canary in slot `l`'s status byte and, where the slot
/// has room, the guard bytes after it ([`STATUS_AREA_PUT`]); see
/// [`status_and_guard`].
pub(crate) fn put_status_area(mem: &GuestMem, l: SlotLayout) {
    if status_area_fits(l) {
        mem.write(l.status, &STATUS_AREA_PUT);
    } else {
        mem.write(l.status, &[STATUS_CANARY]);
    }
}

/// Slot `l`'s status byte, and whether the bytes after it are as
/// [`put_status_area`] put them (true where it put none): one 8-byte load.
pub(crate) fn status_and_guard(mem: &GuestMem, l: SlotLayout) -> (u8, bool) {
    let area = if status_area_fits(l) {
        mem.view(l.status, STATUS_AREA)
    } else {
        &[]
    };
    match <[u8; STATUS_AREA]>::try_from(area) {
        Ok(w) => {
            let w = u64::from_le_bytes(w);
            (w as u8, w >> 8 == u64::from_le_bytes(STATUS_AREA_PUT) >> 8)
        }
        Err(_) => (mem.read_u8(l.status), true),
    }
}

/// The request header (`virtio_crypto_op_data_req`) this tool puts in
/// front of `req`, for session `sid`.
fn request_header(req: &Req, sid: u64) -> [u8; OP_DATA_REQ_SIZE] {
    let mut hdr = OpDataReq {
        opcode: match req.opcode {
            Dir::Encrypt => VIRTIO_CRYPTO_CIPHER_ENCRYPT,
            Dir::Decrypt => VIRTIO_CRYPTO_CIPHER_DECRYPT,
        },
        algo: 0,
        session_id: sid,
        op_type: if req.chain.is_some() {
            VIRTIO_CRYPTO_SYM_OP_ALGORITHM_CHAINING
        } else {
            VIRTIO_CRYPTO_SYM_OP_CIPHER
        },
        iv_len: req.iv.len() as u32,
        src_data_len: req.src.len() as u32,
        dst_data_len: req.src.len() as u32,
    }
    .to_bytes();
    if let Some(c) = &req.chain {
        AlgChainPara {
            cipher_start_src_offset: c.cipher_offset,
            len_to_cipher: c.cipher_len,
            hash_start_src_offset: c.hash_offset,
            len_to_hash: c.hash_len,
            aad_len: 0,
            hash_result_len: c.digest_len,
        }
        .write_to(&mut hdr);
    }
    hdr
}

/// Everything [`request_header`] builds `req`'s header from but the
/// session id, plus what the session id is looked up from (the session's
/// name or the raw id): two requests of a run of requests with equal keys
/// get the same header bytes (the names' ids do not change inside a run).
type HeaderKey<'a> = (Option<&'a str>, Option<u64>, bool, Option<[u32; 5]>, usize, usize);

fn header_key(req: &Req) -> HeaderKey<'_> {
    (
        req.session.as_deref(),
        req.session_id,
        req.opcode == Dir::Encrypt,
        req.chain.as_ref().map(|c| {
            [
                c.cipher_offset,
                c.cipher_len,
                c.hash_offset,
                c.hash_len,
                c.digest_len,
            ]
        }),
        req.iv.len(),
        req.src.len(),
    )
}

/// Status byte value before completion.
pub const STATUS_CANARY: u8 = 0xFF;

/// One failed expectation.
#[derive(Debug, Clone, Serialize)]
pub struct Mismatch {
    /// 1-based trace line.
    pub line: usize,
    /// What differed.
    pub field: String,
    /// Expected value.
    pub expected: String,
    /// Observed value.
    pub got: String,
}

/// Result of a replay.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// Requests completed.
    pub requests: u64,
    /// Requests (and session operations) whose result did not match.
    pub mismatches: u64,
    /// Completions per status.
    pub status_counts: BTreeMap<String, u64>,
    /// Sessions created.
    pub sessions_created: u64,
    /// Payload bytes processed (src).
    pub bytes: u64,
    /// Wall-clock seconds spent on requests.
    pub elapsed_s: f64,
    /// Requests per second.
    pub ops_per_sec: f64,
    /// Payload MiB per second.
    pub mib_per_sec: f64,
    /// Median latency, µs (submit to reap, measured on every request of a
    /// run of at most 4,096 requests, on one in 64 of a longer one).
    pub p50_us: f64,
    /// 99th percentile latency, µs.
    pub p99_us: f64,
    /// CPU seconds used by this tool (user + system).
    pub cpu_s: f64,
    /// The first few mismatches.
    pub first_mismatches: Vec<Mismatch>,
    /// Why the run stopped early: the backend did not complete a request
    /// within the timeout, or the connection failed. Counted as one
    /// mismatch.
    pub error: Option<String>,
    /// Requests submitted but never completed (when the run stopped
    /// early).
    pub missing: u64,
    /// What each request produced, in trace order (only with
    /// [`ReplayOptions::record`]; for comparing two backends).
    #[serde(skip)]
    pub outcomes: Vec<Outcome>,
}

/// What one request produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// 1-based trace line.
    pub line: usize,
    /// Status byte.
    pub status: u8,
    /// Used length.
    pub used_len: u32,
    /// The dst bytes after completion.
    pub dst: Vec<u8>,
    /// The hash-result bytes after completion (chained requests).
    pub digest: Vec<u8>,
}

/// Replay settings.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    /// Replay the trace this many times.
    pub repeat: u32,
    /// Requests in flight per queue.
    pub queue_depth: u16,
    /// How long to wait for a completion before giving up.
    pub timeout: Duration,
    /// Show a progress bar.
    pub progress: bool,
    /// Keep every request's [`Outcome`] in the report.
    pub record: bool,
}

const MAX_REPORTED: usize = 10;

/// Requests submitted before the avail index is published (and the
/// backend kicked if it asks for it), when the ring is not full first; at
/// most a quarter of the queue depth.
const PUBLISH_EVERY: u16 = 32;

/// A request in flight: its sequence number in the run, its index in the
/// run of requests being replayed ([`Prepared`]), and whether its latency
/// is measured (its submit time is in [`Run::started`]). 16 bytes.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    seq: u64,
    idx: u32,
    timed: bool,
}
const _: () = assert!(std::mem::size_of::<Option<InFlight>>() == 16);

/// [`Hot::flags`]: the dst descriptor points at src.
const IN_PLACE: u8 = 1;
/// [`Hot::flags`]: the trace gives the output and expects status OK; the
/// output is in the arena and its block signature in the signature arena.
const HAS_DST: u8 = 2;
/// [`Hot::flags`]: an algorithm-chaining request (its chaining fields are
/// read from the [`Req`]).
const CHAIN: u8 = 4;
/// [`Hot::flags`]: the request is pinned to queue [`Hot::queue`].
const HAS_QUEUE: u8 = 8;
/// [`Hot::flags`]: the request's [`header_key`] is the previous request's
/// (in the run of requests), so are its header bytes.
const SAME_HEADER: u8 = 16;

/// What the submit loop and the checks read of one trace request on the
/// common path, 32 bytes in one array (the full [`Req`], 200 bytes with
/// its bytes in four heap allocations of their own, is read only for rare
/// work: header building, chaining fields, mismatch messages, recorded
/// outcomes). Its bytes are one entry of the run's arena, back to back,
/// each from a 16-byte boundary: the IV, src, and the expected output
/// (with [`HAS_DST`] only); the block signature of the expected output
/// ([`block_signature`]) is in the signature arena.
#[derive(Debug, Clone, Copy)]
struct Hot {
    /// Where the IV (the entry) starts in the arena, in 16-byte units.
    iv: u32,
    /// Where src starts in the arena, in 16-byte units.
    src: u32,
    /// Where the expected output starts in the arena, in 16-byte units.
    dst: u32,
    /// Where the block signature starts in the signature arena (words).
    sig: u32,
    /// src (= dst) bytes.
    len: u32,
    iv_len: u32,
    /// The expected output's bytes (0 without [`HAS_DST`]).
    dst_len: u32,
    /// The queue it is pinned to (with [`HAS_QUEUE`]).
    queue: u16,
    flags: u8,
    /// The expected status byte.
    status: u8,
}
const _: () = assert!(std::mem::size_of::<Hot>() == 32);

impl Hot {
    fn in_place(&self) -> bool {
        self.flags & IN_PLACE != 0
    }

    fn has_dst(&self) -> bool {
        self.flags & HAS_DST != 0
    }

    fn chain(&self) -> bool {
        self.flags & CHAIN != 0
    }

    /// The queue the request is pinned to, if any.
    fn queue(&self) -> Option<u16> {
        (self.flags & HAS_QUEUE != 0).then_some(self.queue)
    }

    fn same_header(&self) -> bool {
        self.flags & SAME_HEADER != 0
    }
}

/// A run of requests ([`Step::Requests`]) laid out for replaying: per
/// request a [`Hot`] record, its bytes in one arena and its expected
/// output's block signature in another, so that a request streams its IV,
/// src, expected output and signature from memory (9.25 cache lines for
/// 256 bytes) and half a line of records, not those bytes in five
/// allocations of their own, its `Req` record and a pointer to its
/// signature.
struct Prepared<'t> {
    reqs: &'t [Req],
    hot: Vec<Hot>,
    arena: Vec<u8>,
    sigs: Vec<u32>,
}

impl Prepared<'_> {
    #[inline(always)]
    fn iv(&self, h: &Hot) -> &[u8] {
        let at = 16 * h.iv as usize;
        &self.arena[at..at + h.iv_len as usize]
    }

    #[inline(always)]
    fn src(&self, h: &Hot) -> &[u8] {
        let at = 16 * h.src as usize;
        &self.arena[at..at + h.len as usize]
    }

    /// The expected output (empty without [`HAS_DST`]).
    #[inline(always)]
    fn want(&self, h: &Hot) -> &[u8] {
        let at = 16 * h.dst as usize;
        &self.arena[at..at + h.dst_len as usize]
    }

    /// The expected output's block signature (empty without [`HAS_DST`]).
    #[inline(always)]
    fn sig(&self, h: &Hot) -> &[u32] {
        let at = h.sig as usize;
        &self.sigs[at..at + h.dst_len.div_ceil(16) as usize]
    }

    /// Request `i`'s chaining fields, read from its [`Req`] only when it
    /// has some ([`CHAIN`]).
    #[inline(always)]
    fn chain(&self, i: usize, h: &Hot) -> Option<&ChainReq> {
        if h.chain() {
            self.reqs[i].chain.as_ref()
        } else {
            None
        }
    }

    /// Request `i`'s trace line (for a mismatch: not on the common path).
    #[cold]
    #[inline(never)]
    fn line(&self, i: u32) -> usize {
        self.reqs[i as usize].line
    }

    /// Starts loading what submitting the request reads of the arena: the
    /// IV and src. (Not its signature: the signature arena is read in
    /// order, a stream the hardware prefetcher follows; prefetching each
    /// request's signature cost 14 instructions per request and measured
    /// no faster.)
    #[inline(always)]
    fn prefetch_submit(&self, h: &Hot) {
        let (iv, end) = (16 * h.iv as usize, 16 * h.src as usize + h.len as usize);
        crate::guest_mem::prefetch(&self.arena[iv..end]);
    }
}

/// Lays out `reqs` for replaying ([`Prepared`]).
fn prepare(reqs: &[Req]) -> Result<Prepared<'_>, Error> {
    let too_big = || {
        Error::Options(
            "a run of requests of the trace is too large to replay (over 2^32 requests or 64 GiB)".into(),
        )
    };
    let fit = |n: usize| u32::try_from(n).map_err(|_| too_big());
    fit(reqs.len())?;
    // The expected output, where it is compared: given, and status OK.
    fn expected(r: &Req) -> Option<&[u8]> {
        r.dst.as_deref().filter(|_| r.status == ExpectStatus::Ok)
    }
    let pad = |v: &mut Vec<u8>| v.resize(v.len().next_multiple_of(16), 0);
    let (size, words) = reqs.iter().fold((0, 0), |(size, words), r| {
        let d = expected(r).map_or(0, <[u8]>::len);
        (
            size + r.iv.len().next_multiple_of(16)
                + r.src.len().next_multiple_of(16)
                + d.next_multiple_of(16),
            words + d.div_ceil(16),
        )
    });
    let mut arena = Vec::with_capacity(size);
    let mut sigs = Vec::with_capacity(words);
    let mut hot = Vec::with_capacity(reqs.len());
    let mut prev = None;
    for r in reqs {
        let want = expected(r);
        let dst = want.unwrap_or_default();
        let sig = fit(sigs.len())?;
        sigs.extend(block_signature(dst));
        let mut put = |bytes: &[u8]| {
            let at = fit(arena.len() / 16);
            arena.extend_from_slice(bytes);
            pad(&mut arena);
            at
        };
        let (iv, src, dst_at) = (put(&r.iv)?, put(&r.src)?, put(dst)?);
        let key = Some(header_key(r));
        let flags = if r.in_place { IN_PLACE } else { 0 }
            | if want.is_some() { HAS_DST } else { 0 }
            | if r.chain.is_some() { CHAIN } else { 0 }
            | if r.queue.is_some() { HAS_QUEUE } else { 0 }
            | if key == prev { SAME_HEADER } else { 0 };
        prev = key;
        hot.push(Hot {
            iv,
            src,
            dst: dst_at,
            sig,
            len: fit(r.src.len())?,
            iv_len: fit(r.iv.len())?,
            dst_len: fit(dst.len())?,
            queue: r.queue.unwrap_or(0),
            flags,
            status: r.status.byte(),
        });
    }
    debug_assert_eq!((arena.len(), sigs.len()), (size, words));
    Ok(Prepared {
        reqs,
        hot,
        arena,
        sigs,
    })
}

/// Completions whose buffers are prefetched ahead of the one being checked.
const PREFETCH_AHEAD: usize = 4;

struct Run<'a> {
    fe: &'a mut CryptoFrontend,
    opts: &'a ReplayOptions,
    report: Report,
    ids: HashMap<String, i64>,
    /// Sessions created in this pass over the trace and not closed by it
    /// (closed before the next pass: see [`replay`]).
    live: Vec<u64>,
    latencies: Vec<u32>,
    /// Whether every request's latency is measured ([`LATENCY_ALL_UP_TO`]).
    time_all: bool,
    /// Per queue and slot: the request in flight there.
    inflight: Vec<Vec<Option<InFlight>>>,
    /// Per queue and slot: when its request was submitted (set for the
    /// requests whose latency is measured, [`InFlight::timed`]).
    started: Vec<Vec<Instant>>,
    /// Per queue and buffer set: the request header put there for the
    /// request in flight, if its header is checked ([`src_checked`]).
    hdr_put: Vec<Vec<[u8; OP_DATA_REQ_SIZE]>>,
    /// The run of requests being replayed (all requests in flight are
    /// its: each run ends drained).
    cur: Option<&'a Prepared<'a>>,
    /// Per queue and buffer set: the block signature of the output its dst
    /// buffer is known to hold (the expected output of the last request
    /// checked there and found right), or None when not known.
    dst_known: Vec<Vec<Option<&'a [u32]>>>,
    seq: u64,
    /// Completions per status byte (turned into `status_counts` at the end).
    status_counts: [u64; 256],
    /// Each queue's guest memory (cloned once, not per completion; held
    /// by `replay`, so a completion's `&GuestMem` borrows nothing of the
    /// run).
    mems: &'a [std::sync::Arc<crate::guest_mem::GuestMem>],
    outcomes: Vec<(u64, Outcome)>,
    bar: Option<indicatif::ProgressBar>,
    /// The completions [`Run::drain`] collects, kept between calls (one
    /// allocation per run, not one per drain).
    done: Vec<Used>,
}

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the zeroed struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to a rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

impl<'a> Run<'a> {
    fn mismatch(&mut self, line: usize, field: &str, expected: String, got: String) {
        self.report.mismatches += 1;
        if self.report.first_mismatches.len() < MAX_REPORTED {
            self.report.first_mismatches.push(Mismatch {
                line,
                field: field.into(),
                expected,
                got,
            });
        }
    }

    fn create(
        &mut self,
        line: usize,
        name: &str,
        key: &[u8],
        direction: Dir,
        expect_err: bool,
        chain: Option<&ChainSession>,
    ) -> Result<(), Error> {
        let mut info = SymSessionInfo::aes_cbc(
            key,
            match direction {
                Dir::Encrypt => VIRTIO_CRYPTO_OP_ENCRYPT,
                Dir::Decrypt => VIRTIO_CRYPTO_OP_DECRYPT,
            },
        );
        if let Some(c) = chain {
            // ALGORITHM_CHAINING, hash_mode AUTH (VIRTIO 1.2 §5.9.7.2.1).
            info.op_type = VIRTIO_CRYPTO_SYM_OP_ALGORITHM_CHAINING as u8;
            info.hash_mode = VIRTIO_CRYPTO_SYM_HASH_MODE_AUTH;
            info.hash_alg = c.mac.virtio();
            info.hash_result_len = c.digest_len;
            info.alg_chain_order = c.order.virtio();
            info.auth_key_len = c.auth_key.len() as u32;
            let n = c.auth_key.len().min(info.auth_key.len());
            info.auth_key[..n].copy_from_slice(&c.auth_key[..n]);
        }
        let id = self.fe.create_session(&info)?;
        self.report.sessions_created += u64::from(id > 0);
        match (expect_err, id < 0) {
            (false, true) => self.mismatch(line, "session id", "≥ 1".into(), id.to_string()),
            (true, false) => self.mismatch(line, "session id", "< 0".into(), id.to_string()),
            _ => {}
        }
        if id > 0 {
            self.ids.insert(name.to_string(), id);
            self.live.push(id as u64);
        }
        Ok(())
    }

    /// The session id `req`'s header names: its raw id, or the id its
    /// session's name got (0 for a name with none).
    fn session_id(&self, req: &Req) -> u64 {
        match (&req.session, req.session_id) {
            (_, Some(id)) => id,
            (Some(name), None) => self.ids.get(name).copied().unwrap_or(0) as u64,
            (None, None) => 0,
        }
    }

    fn check(&mut self, q: usize, u: Used) {
        let Some(f) = self.inflight[q]
            .get_mut(usize::from(u.slot))
            .and_then(Option::take)
        else {
            self.mismatch(
                0,
                "used id",
                "the head of a request in flight".into(),
                format!("{} (used length {})", u.id, u.len),
            );
            return;
        };
        // (A request in flight is one of the current run's.)
        let Some(p) = self.cur else {
            return;
        };
        if f.timed {
            let t0 = self.started[q][usize::from(u.slot)];
            self.latencies
                .push(t0.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
        }
        let h = &p.hot[f.idx as usize];
        self.report.requests += 1;
        self.report.bytes += u64::from(h.len);
        if let Some(b) = &self.bar {
            b.inc(1);
        }
        let b = self.fe.queues[q].buf(u.slot);
        let l = self.fe.queues[q].set_layout(b);
        // The output is compared where the backend wrote it (no copy).
        let mem: &'a GuestMem = &self.mems[q];
        let dst = mem.view(if h.in_place() { l.src } else { l.dst }, h.len as usize);
        let chain = p.chain(f.idx as usize, h);
        let digest_len = chain.map_or(0, |c| c.digest_len as usize);
        // The hash result is compared where the backend wrote it too
        // (plain cipher requests have none: no bytes, no bounds check).
        let digest: &[u8] = if digest_len == 0 {
            &[]
        } else {
            mem.view(l.digest, digest_len.min(DIGEST_AREA))
        };
        // The status byte and, where the slot has room, the bytes after it
        // that must stay as this tool put them.
        let (status, after_status_ok) = status_and_guard(mem, l);
        let before = self.report.mismatches;
        self.check_outcome(p, f, h, chain, u, status, dst, digest);
        self.check_untouched(p, f, h, chain, (q, b), mem, l, after_status_ok);
        self.dst_known[q][b] =
            (h.has_dst() && self.report.mismatches == before && status == 0 && !h.in_place())
                .then(|| p.sig(h));
    }

    /// The device may write only the dst and hash result bytes and the
    /// status byte; everything else of the slot that this tool put there
    /// must be as it was. On every request: the IV (whose line follows a
    /// full-length dst, so a write past dst's end lands there), the guard
    /// after a shorter dst or an in-place src ([`dst_guard`]), the bytes
    /// after the status byte (`after_status_ok`, read with the status) and
    /// the hash result area past `hash_result_len`. On each of the run's
    /// first [`SRC_CHECK_ALL`] requests and then on one in
    /// [`SRC_CHECK_EVERY`] ([`src_checked`]): the request header and src
    /// (unless the request is in place, where src is dst).
    #[allow(clippy::too_many_arguments)]
    fn check_untouched(
        &mut self,
        p: &Prepared<'_>,
        f: InFlight,
        h: &Hot,
        chain: Option<&ChainReq>,
        (q, b): (usize, usize),
        mem: &GuestMem,
        l: SlotLayout,
        after_status_ok: bool,
    ) {
        if src_checked(f.seq) {
            if !h.in_place() && mem.view(l.src, h.len as usize) != p.src(h) {
                self.mismatch(
                    p.line(f.idx),
                    "src (device-readable)",
                    "unchanged".into(),
                    "written".into(),
                );
            }
            // The header as it was put there.
            let want = self.hdr_put[q][b];
            if mem.view(l.hdr, OP_DATA_REQ_SIZE) != want.as_slice() {
                self.mismatch(
                    p.line(f.idx),
                    "request header (device-readable)",
                    hex(&want),
                    hex(mem.view(l.hdr, OP_DATA_REQ_SIZE)),
                );
            }
        }
        if let Some(g) = dst_guard(l, h.len, h.in_place()) {
            if mem.view(g, GUARD_LEN).iter().any(|&x| x != DST_CANARY) {
                self.mismatch(
                    p.line(f.idx),
                    &format!("the {GUARD_LEN} bytes after dst (not the request's)"),
                    "untouched".into(),
                    "written".into(),
                );
            }
        }
        let put_iv = p.iv(h);
        let iv = mem.view(l.iv, put_iv.len());
        // (16 bytes compared inline, not through a call to memcmp.)
        let same = match (<&[u8; 16]>::try_from(iv), <&[u8; 16]>::try_from(put_iv)) {
            (Ok(a), Ok(b)) => u128::from_ne_bytes(*a) == u128::from_ne_bytes(*b),
            _ => iv == put_iv,
        };
        if !same {
            self.mismatch(p.line(f.idx), "IV (device-readable)", hex(put_iv), hex(iv));
        }
        if !after_status_ok {
            self.mismatch(
                p.line(f.idx),
                &format!("the {} bytes after the status byte", STATUS_AREA - 1),
                "untouched".into(),
                "written".into(),
            );
        }
        if let Some(c) = chain {
            let digest_len = c.digest_len as usize;
            let area = mem.view(l.digest, DIGEST_AREA);
            let past = digest_len.min(DIGEST_AREA);
            let put = |i: usize| c.digest_in.get(i).copied().unwrap_or(DST_CANARY);
            if (past..DIGEST_AREA).any(|i| area[i] != put(i)) {
                self.mismatch(
                    p.line(f.idx),
                    &format!("hash result area past hash_result_len {digest_len}"),
                    "untouched".into(),
                    "written".into(),
                );
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn check_outcome(
        &mut self,
        p: &Prepared<'_>,
        f: InFlight,
        h: &Hot,
        chain: Option<&ChainReq>,
        u: Used,
        status: u8,
        dst: &[u8],
        digest: &[u8],
    ) {
        let digest_len = digest.len();
        if self.opts.record {
            self.outcomes.push((
                f.seq,
                Outcome {
                    line: p.line(f.idx),
                    status,
                    used_len: u.len,
                    dst: dst.to_vec(),
                    digest: digest.to_vec(),
                },
            ));
        }
        self.status_counts[usize::from(status)] += 1;
        if status != h.status {
            self.mismatch(
                p.line(f.idx),
                "status",
                ExpectStatus::name(h.status),
                ExpectStatus::name(status),
            );
            return;
        }
        let ok = h.status == ExpectStatus::Ok.byte();
        let want_len = if ok {
            (h.len as usize + digest_len) as u32 + 1
        } else {
            1
        };
        if u.len != want_len {
            self.mismatch(
                p.line(f.idx),
                "used length",
                want_len.to_string(),
                u.len.to_string(),
            );
        }
        if let Some(c) = chain {
            // Encrypt: the expected MAC; otherwise (decrypt, errors) the
            // hash result keeps what the driver put there.
            let expect_mac = c.expect_digest.as_ref().filter(|_| ok);
            let good = match expect_mac {
                Some(d) => digest == d.as_slice(),
                None => holds_digest_in(digest, &c.digest_in),
            };
            if !good {
                let want = match expect_mac {
                    Some(d) => d.clone(),
                    None => digest_in_area(&c.digest_in, digest_len),
                };
                self.mismatch(p.line(f.idx), "hash result", hex(&want), hex(digest));
            }
        }
        if ok {
            if h.has_dst() {
                let want = p.want(h);
                if dst != want {
                    let at = dst.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
                    let end = (at + 16).min(dst.len());
                    self.mismatch(
                        p.line(f.idx),
                        &format!("dst[{at}..{end}]"),
                        hex(&want[at..end.min(want.len())]),
                        hex(&dst[at..end]),
                    );
                }
            }
        } else if (h.in_place() && dst != p.src(h)) || (!h.in_place() && dst.iter().any(|&b| b != DST_CANARY))
        {
            self.mismatch(
                p.line(f.idx),
                "dst (must be untouched on error)",
                "unchanged".into(),
                "written".into(),
            );
        }
    }

    /// Starts loading what checking completion `u` reads: its output and
    /// status (written by the backend's CPU) and the expected output.
    #[inline(always)]
    fn prefetch(&self, q: usize, u: Used) {
        let (Some(p), Some(Some(f))) = (self.cur, self.inflight[q].get(usize::from(u.slot))) else {
            return;
        };
        let h = &p.hot[f.idx as usize];
        let l = self.fe.queues[q].layout(u.slot);
        let mem = &self.mems[q];
        mem.prefetch(if h.in_place() { l.src } else { l.dst }, h.len as usize);
        mem.prefetch_byte(l.status);
        if src_checked(f.seq) {
            mem.prefetch(l.hdr, OP_DATA_REQ_SIZE);
            if !h.in_place() {
                mem.prefetch(l.src, h.len as usize);
                crate::guest_mem::prefetch(p.src(h));
            }
        }
        crate::guest_mem::prefetch(p.want(h));
    }

    fn drain(&mut self, q: usize, wait_all: bool) -> Result<(), Error> {
        // (Taken out of `self` for the loop, put back at the end; after an
        // error the next drain starts with a new one.)
        let mut done = std::mem::take(&mut self.done);
        loop {
            self.fe.queues[q].publish_and_kick()?;
            done.clear();
            self.fe.queues[q].reap(&mut done, self.opts.timeout)?;
            for &u in done.iter().take(PREFETCH_AHEAD) {
                self.prefetch(q, u);
            }
            for (k, &u) in done.iter().enumerate() {
                if let Some(&next) = done.get(k + PREFETCH_AHEAD) {
                    self.prefetch(q, next);
                }
                self.check(q, u);
            }
            if !wait_all || self.fe.queues[q].in_flight() == 0 {
                self.done = done;
                return Ok(());
            }
        }
    }

    fn requests(&mut self, p: &'a Prepared<'a>, rr: &mut usize) -> Result<(), Error> {
        self.cur = Some(p);
        let nq = self.fe.queues.len();
        // Per run of requests, not per request (and in locals: the stores
        // into guest memory would make the compiler load them again).
        let depth = self.opts.queue_depth;
        let publish_every = PUBLISH_EVERY.min(depth / 4).max(1);
        // The header of the previous request (when `hdr_prev`: not for the
        // first request, nor after a request that was not sent).
        // Kept in place and compared with guest memory from there (not
        // copied out per request).
        let mut hdr = [0u8; OP_DATA_REQ_SIZE];
        let mut hdr_prev = false;
        for (i, h) in p.hot.iter().enumerate() {
            let ahead = p.hot.get(i + PREFETCH_AHEAD);
            if let Some(next) = ahead {
                // The trace's bytes of a request a few ahead (they stream
                // from memory: a long trace does not fit the caches).
                p.prefetch_submit(next);
            }
            let q = if let Some(q) = h.queue() {
                if usize::from(q) >= nq {
                    self.mismatch(p.line(i as u32), "queue", format!("< {nq}"), q.to_string());
                    hdr_prev = false;
                    continue;
                }
                usize::from(q)
            } else {
                // `rr` is the next queue (below `nq`, which is the same
                // for the whole run), not a count: no division per request.
                let q = *rr;
                *rr = if q + 1 == nq { 0 } else { q + 1 };
                q
            };
            if let Some(next) = ahead {
                // Take the lines that the request four places ahead on this
                // queue will write (src, and the IV + status line) for
                // writing: the backend's CPU touched them last, and the
                // stores would otherwise wait for those lines one after the
                // other (+4-10 % requests/s at 256 bytes, depth 256). Its
                // size is taken from the trace's request four ahead, which
                // is that request only with one queue; with several it is a
                // guess, and a hint either way.
                let dq = &self.fe.queues[q];
                if let Some(b) = dq.set_ahead(PREFETCH_AHEAD as u16) {
                    let l = dq.set_layout(b);
                    dq.mem().prefetch_write(l.src, next.len as usize);
                    dq.mem().prefetch_write_byte(l.iv);
                }
            }
            let (slot, b) = loop {
                let dq = &self.fe.queues[q];
                if dq.in_flight() < depth {
                    if let Some(sb) = dq.next_slot_set() {
                        break sb;
                    }
                }
                self.drain(q, false)?;
            };
            // The header: the previous request's bytes when its header key
            // is this one's (equal keys, equal headers: `header_key`).
            if !hdr_prev || !h.same_header() {
                let req = &p.reqs[i];
                hdr = request_header(req, self.session_id(req));
                hdr_prev = true;
            }
            let chain = p.chain(i, h);
            let digest_len = chain.map_or(0, |c| c.digest_len);
            let dq = &mut self.fe.queues[q];
            let l = dq.set_layout(b);
            let mem = dq.mem();
            mem.write_array_if_changed(l.hdr, &hdr);
            mem.write(l.iv, p.iv(h));
            mem.write(l.src, p.src(h));
            if let Some(g) = dst_guard(l, h.len, h.in_place()) {
                mem.fill(g, GUARD_LEN, DST_CANARY);
            }
            if !h.in_place() {
                let n = h.len as usize;
                // Not known again until this request is checked.
                let known = self.dst_known[q][b].take();
                if h.has_dst() {
                    // Every output byte is compared with the expected one
                    // afterwards. A 16-byte block of dst that may already
                    // hold its expected bytes (going by what the buffer is
                    // known to hold, see `canary_where_same`) gets the
                    // canary, so a backend that does not write it is caught;
                    // the other blocks are left alone: writing them would
                    // pull their lines over to this CPU just before the
                    // backend writes them.
                    canary_where_same(mem, l.dst, known, p.sig(h), (h.dst_len as usize).min(n));
                } else {
                    mem.fill(l.dst, n, DST_CANARY);
                }
            }
            if let Some(c) = chain {
                let n = c.digest_in.len().min(DIGEST_AREA);
                mem.write(l.digest, &c.digest_in[..n]);
                mem.fill(l.digest + n as u64, DIGEST_AREA - n, DST_CANARY);
            }
            put_status_area(mem, l);
            dq.submit_request_in(slot, b, h.iv_len, h.len, digest_len, h.in_place());
            let seq = self.seq;
            self.seq += 1;
            if src_checked(seq) {
                self.hdr_put[q][b] = hdr;
            }
            // Latency: every request of a short run, else one in 64
            // chosen by a hash, evenly over the run (not its first requests
            // more than the rest: they include the warm-up) and not always
            // the same queue's. (Reading the clock twice per request is a
            // tenth of the tool's time at a million requests per second; at
            // one in 8 it was still 4 %.)
            let timed = self.time_all || in_hash_sample(seq);
            if timed {
                self.started[q][usize::from(slot)] = Instant::now();
            }
            self.inflight[q][usize::from(slot)] = Some(InFlight {
                seq,
                idx: i as u32,
                timed,
            });
            // (set_ahead(0) is None exactly when next_slot() is: the
            // next slot's buffer set is busy.)
            if dq.set_ahead(0).is_none() || dq.in_flight() >= depth {
                self.drain(q, false)?;
            } else if dq.unpublished() >= publish_every {
                // Hand requests over in groups rather than only when the
                // ring is full, so the backend works while we submit.
                dq.publish_and_kick()?;
            }
        }
        for q in 0..nq {
            self.drain(q, true)?;
        }
        Ok(())
    }
}

/// The block signature of an expected output: the first 4 bytes of each
/// of its 16-byte blocks as one word (fewer, zero-padded, in a shorter
/// last block). Two outputs whose signatures differ at block j differ in
/// block j; unrelated blocks have equal words once in 2^32.
pub fn block_signature(out: &[u8]) -> Vec<u32> {
    out.chunks(16)
        .map(|b| {
            let mut w = [0u8; 4];
            let n = b.len().min(4);
            w[..n].copy_from_slice(&b[..n]);
            u32::from_le_bytes(w)
        })
        .collect()
}

/// Puts the canary in every 16-byte block of the `want_len` bytes at `dst`
/// (the last block may be shorter) that may already hold its bytes of the
/// expected output (whose signature is `want_sig`), going by `known`, the
/// signature of what the buffer is known to hold: the blocks whose
/// signature words are equal, those past `known`'s end, or all of them
/// when nothing is known. A backend that left such a block alone would
/// look right; the other blocks differ from the expected output already
/// and are not written (writing them would pull their lines over to this
/// CPU just before the backend writes them). Only the two signatures are
/// read, not the outputs.
fn canary_where_same(
    mem: &crate::guest_mem::GuestMem,
    dst: u64,
    known: Option<&[u32]>,
    want_sig: &[u32],
    want_len: usize,
) {
    let Some(known) = known else {
        mem.fill(dst, want_len, DST_CANARY);
        return;
    };
    // The usual case, checked without a branch per block (vectorised): the
    // known output covers the expected one and no block signature is
    // equal.
    let any_equal = known
        .iter()
        .zip(want_sig)
        .fold(false, |acc, (k, w)| acc | (k == w));
    if !any_equal && known.len() >= want_sig.len() {
        return;
    }
    for j in 0..want_len.div_ceil(16) {
        if known.get(j).is_none_or(|k| want_sig.get(j) == Some(k)) {
            mem.fill(dst + 16 * j as u64, (want_len - 16 * j).min(16), DST_CANARY);
        }
    }
}

/// Replays `trace` `opts.repeat` times.
///
/// A backend that does not complete a request within `opts.timeout` or
/// answer a session message, or a connection that fails, ends the run
/// early: the report says why ([`Report::error`], one mismatch) and how
/// many requests never completed ([`Report::missing`]).
///
/// # Errors
/// [`Error::Options`] or [`Error::Raw`]: the options or a raw request of
/// the trace do not fit the frontend (a mismatch is not an error: see
/// [`Report`]).
pub fn replay(fe: &mut CryptoFrontend, trace: &Trace, opts: &ReplayOptions) -> Result<Report, Error> {
    let total = trace.requests() as u64 * u64::from(opts.repeat);
    let slots: Vec<Vec<Option<InFlight>>> = fe
        .queues
        .iter()
        .map(|q| vec![None; usize::from(q.size)])
        .collect();
    let now = Instant::now();
    let started = fe.queues.iter().map(|q| vec![now; usize::from(q.size)]).collect();
    let bar = (opts.progress && total >= 10_000).then(|| {
        let b = indicatif::ProgressBar::new(total);
        b.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} requests {per_sec} eta {eta}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    });
    // Every run of requests laid out for replaying ([`Prepared`]: the
    // bytes of each request back to back in one arena, the block
    // signatures of the expected outputs in another, and a compact record
    // per request), made before the run. The records say whether a
    // request's [`header_key`] is the previous request's: then it reuses
    // that request's header bytes instead of building them again.
    let prepared: Vec<Option<Prepared<'_>>> = trace
        .steps
        .iter()
        .map(|s| match s {
            Step::Requests(v) => prepare(v).map(Some),
            _ => Ok(None),
        })
        .collect::<Result<_, _>>()?;
    let mems: Vec<_> = fe.queues.iter().map(|q| q.mem_handle()).collect();
    let dst_known = fe
        .queues
        .iter()
        .map(|q| vec![None; usize::from(q.buffer_sets())])
        .collect();
    let hdr_put = fe
        .queues
        .iter()
        .map(|q| vec![[0; OP_DATA_REQ_SIZE]; usize::from(q.buffer_sets())])
        .collect();
    let mut run = Run {
        fe,
        opts,
        report: Report::default(),
        ids: HashMap::new(),
        live: Vec::new(),
        latencies: Vec::with_capacity(total.min(50_000_000) as usize),
        time_all: total <= LATENCY_ALL_UP_TO,
        inflight: slots,
        started,
        hdr_put,
        cur: None,
        dst_known,
        seq: 0,
        status_counts: [0; 256],
        mems: &mems,
        outcomes: Vec::new(),
        bar,
        done: Vec::with_capacity(usize::from(opts.queue_depth).max(64)),
    };
    let cpu0 = cpu_seconds();
    let mut busy = Duration::ZERO;
    let mut rr = 0usize;
    let mut failure = None;
    'run: for pass in 0..opts.repeat {
        // Every pass creates the trace's sessions again: the previous
        // pass's (those the trace did not close itself, with no request of
        // theirs in flight: each run of requests ends drained) are closed
        // first, as a driver closes the sessions it no longer uses, or a
        // long --repeat would run into the backend's limit of live
        // sessions (1,024 per connection for ours, --max-sessions).
        if pass > 0 {
            for id in std::mem::take(&mut run.live) {
                if let Err(e) = run.fe.close_session(id) {
                    failure = Some((e, false));
                    break 'run;
                }
            }
        }
        for (si, step) in trace.steps.iter().enumerate() {
            let done = (|| -> Result<(), Error> {
                match step {
                    Step::Create {
                        line,
                        name,
                        key,
                        direction,
                        expect_err,
                        chain,
                    } => run.create(*line, name, key, *direction, *expect_err, chain.as_ref())?,
                    Step::Raw(r) => {
                        let ids = &run.ids;
                        let lookup = |name: &str| ids.get(name).copied().unwrap_or(0) as u64;
                        let t = Instant::now();
                        let out = crate::raw::run_raw(run.fe, r, lookup, opts.timeout);
                        busy += t.elapsed();
                        let out = out?;
                        // A raw request writes its buffer set's whole area.
                        for known in run.dst_known.iter_mut().flatten() {
                            *known = None;
                        }
                        run.report.requests += 1;
                        let name = out
                            .status
                            .map_or_else(|| "consumed".to_string(), ExpectStatus::name);
                        *run.report.status_counts.entry(name).or_default() += 1;
                        for (field, expected, got) in out.mismatches {
                            run.mismatch(r.line, &field, expected, got);
                        }
                    }
                    Step::Close { name, .. } => {
                        if let Some(&id) = run.ids.get(name) {
                            run.fe.close_session(id as u64)?;
                            run.live.retain(|&l| l != id as u64);
                        }
                    }
                    Step::Requests(v) => {
                        let Some(p) = &prepared[si] else {
                            return Ok(());
                        };
                        let t = Instant::now();
                        let done = run.requests(p, &mut rr);
                        busy += t.elapsed();
                        done?;
                        // Drained: the descriptors the requests used must
                        // still be as this tool wrote them.
                        let line = v.first().map_or(0, |r| r.line);
                        for q in 0..run.fe.queues.len() {
                            if let Err(at) = run.fe.queues[q].check_descs() {
                                run.mismatch(
                                    line,
                                    "descriptors",
                                    "as the driver wrote them (VIRTIO 1.2 §2.7, §2.7.5.1)".into(),
                                    format!("queue {q}: {at} changed"),
                                );
                            }
                        }
                    }
                }
                Ok(())
            })();
            match done {
                Ok(()) => {}
                // The trace or the options: not the backend's fault.
                Err(e @ (Error::Options(_) | Error::Raw(_))) => return Err(e),
                Err(e) => {
                    failure = Some((e, matches!(step, Step::Raw(_))));
                    break 'run;
                }
            }
        }
    }
    if let Some(b) = &run.bar {
        b.finish_and_clear();
    }
    let missing = run.inflight.iter().flatten().filter(|s| s.is_some()).count() as u64;
    let mut r = run.report;
    if let Some((e, raw)) = failure {
        r.error = Some(e.to_string());
        r.mismatches += 1;
        // A raw request is not tracked in flight: when the run stopped at
        // one, it is the one that never completed.
        r.missing = missing + u64::from(raw);
    }
    for (b, &n) in run.status_counts.iter().enumerate() {
        if n > 0 {
            *r.status_counts.entry(ExpectStatus::name(b as u8)).or_default() += n;
        }
    }
    let mut outcomes = run.outcomes;
    outcomes.sort_unstable_by_key(|o| o.0);
    r.outcomes = outcomes.into_iter().map(|o| o.1).collect();
    r.cpu_s = cpu_seconds() - cpu0;
    r.elapsed_s = busy.as_secs_f64();
    if r.elapsed_s > 0.0 {
        r.ops_per_sec = r.requests as f64 / r.elapsed_s;
        r.mib_per_sec = r.bytes as f64 / (1 << 20) as f64 / r.elapsed_s;
    }
    let mut lat = run.latencies;
    if let Some(last) = lat.len().checked_sub(1) {
        // The values a full sort would put at these ranks, found by
        // selection (linear, not n log n): after the first, the ranks
        // below it hold the smallest values, among which the second is.
        let rank = |p: f64| (last as f64 * p).round() as usize;
        let (i50, i99) = (rank(0.50), rank(0.99));
        let p99 = *lat.select_nth_unstable(i99).1;
        let p50 = if i50 < i99 {
            *lat[..i99].select_nth_unstable(i50).1
        } else {
            p99
        };
        r.p50_us = f64::from(p50);
        r.p99_us = f64::from(p99);
    }
    Ok(r)
}

/// Whether a hash-result area still holds what the driver put there: its
/// digest, then the canary (no allocation: called per completion).
fn holds_digest_in(area: &[u8], digest_in: &[u8]) -> bool {
    let n = digest_in.len().min(area.len());
    area[..n] == digest_in[..n] && area[n..].iter().all(|&b| b == DST_CANARY)
}

/// The hash-result area a driver hands over: its digest, then the canary
/// (for reporting a mismatch).
fn digest_in_area(digest_in: &[u8], len: usize) -> Vec<u8> {
    let mut v = vec![DST_CANARY; len];
    let n = digest_in.len().min(len);
    v[..n].copy_from_slice(&digest_in[..n]);
    v
}

/// How two backends' outcomes of the same trace compare.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Comparison {
    /// Requests compared.
    pub compared: u64,
    /// Differences in status, dst or hash result (and in the number of
    /// completions).
    pub differences: u64,
    /// Requests whose used lengths differ (reported, not counted as
    /// differences: DPDK 22.11 reports dst + digest + 1 for a failed
    /// verify too, this project 1; protocol reference §5.7).
    pub used_len_differences: u64,
    /// The first differences (field, first backend, second backend).
    pub first_differences: Vec<Mismatch>,
}

/// Compares the outcomes of the same trace on two backends request by
/// request: status, dst and hash result byte for byte, and used lengths
/// (separately); keeps the first `max` differences.
pub fn compare_outcomes(a: &[Outcome], b: &[Outcome], max: usize) -> Comparison {
    let mut n = 0u64;
    let mut used = 0u64;
    let mut first = Vec::new();
    let mut note = |line: usize, field: &str, x: String, y: String| {
        n += 1;
        if first.len() < max {
            first.push(Mismatch {
                line,
                field: field.into(),
                expected: x,
                got: y,
            });
        }
    };
    if a.len() != b.len() {
        note(0, "requests completed", a.len().to_string(), b.len().to_string());
    }
    for (x, y) in a.iter().zip(b) {
        if x.status != y.status {
            note(
                x.line,
                "status",
                ExpectStatus::name(x.status),
                ExpectStatus::name(y.status),
            );
        }
        if x.used_len != y.used_len {
            used += 1;
        }
        if x.dst != y.dst {
            note(x.line, "dst", hex(&x.dst), hex(&y.dst));
        }
        if x.digest != y.digest {
            note(x.line, "hash result", hex(&x.digest), hex(&y.digest));
        }
    }
    Comparison {
        compared: a.len().min(b.len()) as u64,
        differences: n,
        used_len_differences: used,
        first_differences: first,
    }
}

impl Report {
    /// Human-readable summary.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let statuses: Vec<String> = self
            .status_counts
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        s += &format!("requests:    {}\n", self.requests);
        s += &format!("mismatches:  {}\n", self.mismatches);
        s += &format!("statuses:    {}\n", statuses.join(", "));
        s += &format!("sessions:    {} created\n", self.sessions_created);
        s += &format!(
            "throughput:  {:.0} ops/s, {:.2} MiB/s ({} bytes in {:.3} s)\n",
            self.ops_per_sec, self.mib_per_sec, self.bytes, self.elapsed_s
        );
        s += &format!(
            "latency:     p50 {:.0} µs, p99 {:.0} µs\n",
            self.p50_us, self.p99_us
        );
        s += &format!("tool CPU:    {:.3} s\n", self.cpu_s);
        if let Some(e) = &self.error {
            s += &format!(
                "STOPPED:     {e}; {} requests submitted and never completed\n",
                self.missing
            );
        }
        for m in &self.first_mismatches {
            s += &format!(
                "MISMATCH trace line {}: {}: expected {}, got {}\n",
                m.line, m.field, m.expected, m.got
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::{block_signature, canary_where_same, prepare, DST_CANARY};
    use crate::guest_mem::GuestMem;
    use crate::trace::{ChainReq, Dir, ExpectStatus, Req};

    #[test]
    fn prepared_runs_give_back_every_request_as_the_trace_has_it() {
        let bytes = |n: usize, seed: u8| {
            (0..n)
                .map(|i| (i as u8).wrapping_mul(31) ^ seed)
                .collect::<Vec<u8>>()
        };
        let req = |line: usize, iv: usize, src: usize, dst: Option<usize>, status: ExpectStatus| Req {
            line,
            session: Some("s".into()),
            session_id: None,
            opcode: Dir::Encrypt,
            iv: bytes(iv, 1),
            src: bytes(src, 2),
            queue: None,
            status,
            dst: dst.map(|n| bytes(n, line as u8)),
            chain: None,
            in_place: false,
        };
        let mut reqs = vec![
            req(1, 16, 256, Some(256), ExpectStatus::Ok),
            req(2, 16, 256, Some(256), ExpectStatus::Ok),
            // Odd lengths: an 8-byte IV, 17 bytes, a shorter expected output.
            req(3, 8, 17, Some(5), ExpectStatus::Ok),
            // An output given with an error expected is not compared.
            req(4, 16, 32, Some(32), ExpectStatus::Err),
            req(5, 0, 0, None, ExpectStatus::Invsess),
            req(6, 16, 48, Some(48), ExpectStatus::Ok),
            req(7, 16, 48, Some(48), ExpectStatus::Ok),
            req(8, 16, 48, Some(48), ExpectStatus::Ok),
        ];
        reqs[5].queue = Some(3);
        reqs[5].in_place = true;
        reqs[7].chain = Some(ChainReq {
            cipher_offset: 0,
            cipher_len: 48,
            hash_offset: 0,
            hash_len: 48,
            digest_len: 12,
            digest_in: Vec::new(),
            expect_digest: None,
        });
        let p = prepare(&reqs).unwrap();
        assert_eq!(p.hot.len(), reqs.len());
        for (i, (r, h)) in reqs.iter().zip(&p.hot).enumerate() {
            assert_eq!(p.iv(h), r.iv.as_slice(), "{i}");
            assert_eq!(p.src(h), r.src.as_slice(), "{i}");
            let want = r.dst.as_deref().filter(|_| r.status == ExpectStatus::Ok);
            assert_eq!(h.has_dst(), want.is_some(), "{i}");
            assert_eq!(p.want(h), want.unwrap_or_default(), "{i}");
            assert_eq!(p.sig(h), block_signature(want.unwrap_or_default()), "{i}");
            assert_eq!(
                (h.len, h.iv_len, h.status),
                (r.src.len() as u32, r.iv.len() as u32, r.status.byte())
            );
            assert_eq!(h.in_place(), r.in_place, "{i}");
            assert_eq!(h.chain(), r.chain.is_some(), "{i}");
            assert_eq!(p.chain(i, h), r.chain.as_ref(), "{i}");
            assert_eq!(h.queue(), r.queue, "{i}");
            assert_eq!(p.line(i as u32), r.line);
        }
        // The same header key as the previous request: 2 (as 1) and 7 (as
        // 6: the queue and in_place are not in the header); not 8
        // (chained, 7 is not).
        let same: Vec<bool> = p.hot.iter().map(|h| h.same_header()).collect();
        assert_eq!(same, [false, true, false, false, false, false, true, false]);
    }

    #[test]
    fn canary_goes_where_dst_may_already_hold_the_expected_bytes() {
        let mem = GuestMem::new(1 << 20).unwrap();
        let want: Vec<u8> = (0..40).collect();
        let want_sig = block_signature(&want);
        let word = |b: [u8; 4]| u32::from_le_bytes(b);
        assert_eq!(
            want_sig,
            vec![word([0, 1, 2, 3]), word([16, 17, 18, 19]), word([32, 33, 34, 35])]
        );
        // What the canaries leave in a buffer that held 0xEE everywhere,
        // when it is known to hold an output with signature `known`.
        let run = |known: Option<&[u32]>| {
            mem.fill(0x100, 48, 0xEE);
            canary_where_same(&mem, 0x100, known, &want_sig, want.len());
            let mut got = vec![0u8; 48];
            mem.read(0x100, &mut got);
            got
        };
        // The buffer with the canary in the (start, end) byte ranges.
        let blocks = |canaried: &[(usize, usize)]| {
            let mut v = vec![0xEE; 48];
            for &(a, b) in canaried {
                v[a..b].fill(DST_CANARY);
            }
            v
        };
        // Nothing known: the whole output, nothing past it.
        assert_eq!(run(None), blocks(&[(0, 40)]));
        // Different in every block: nothing.
        assert_eq!(run(Some(&[1, 2, 3])), blocks(&[]));
        // The same output: every block, the short last one too.
        assert_eq!(run(Some(&want_sig)), blocks(&[(0, 16), (16, 32), (32, 40)]));
        // Equal in the middle block only.
        assert_eq!(run(Some(&[1, want_sig[1], 3])), blocks(&[(16, 32)]));
        // A shorter known output: the blocks past its end are unknown.
        assert_eq!(run(Some(&[1])), blocks(&[(16, 32), (32, 40)]));
        // The signature tells blocks apart by their first 4 bytes; a short
        // last block is zero-padded.
        let mut other = want.clone();
        other[19] ^= 1;
        assert_ne!(block_signature(&other)[1], want_sig[1]);
        assert_eq!(block_signature(&[9, 8]), vec![word([9, 8, 0, 0])]);
    }
}
