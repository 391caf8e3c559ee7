// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! `vhost-crypto-replay soak`: millions of mixed requests generated on the
//! fly from a seed, every completion checked, with sessions closed and
//! re-created ("rekeyed") while other requests are in flight.
//!
//! Each request gets, from one splitmix64 stream ([`crate::rng`])
//! consumed in submission order: a session among `sessions` slots (AES-128/192/256, encrypt or
//! decrypt), a data queue, a size (a multiple of 16 from 16 bytes up to
//! `max_size`, most of them small), a descriptor layout (a direct chain or
//! an indirect table, in the five natural pieces or cut at random byte
//! offsets), an IV and the data. The seed and the options decide
//! everything: the same ones give the same requests whatever the backend's
//! timing.
//!
//! Every `rekey_every` requests one session slot stops getting new
//! requests; once its last ones have completed it is closed and re-created
//! with a new key and direction, right after a batch of requests of the
//! other sessions has been handed to the backend (so those are in flight
//! meanwhile). About one request in `stale_every` names a session closed
//! earlier and must complete with `VIRTIO_CRYPTO_INVSESS`, its output
//! untouched.
//!
//! Every completion is checked: the used element names the request's head
//! descriptor, the request was in flight and completes only once (a ledger
//! by sequence number; nothing may be missing at the end), the status is
//! OK, the used length is `len + 1`, the output equals the tool's
//! reference cipher ([`crate::reference`], pinned by the NIST vectors), the
//! 16 bytes after the output and the source are unchanged.
//! Callers that want a second, independent oracle get every checked request
//! through an observer (the CI soak, `tests/soak.rs`, checks them with
//! OpenSSL).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use algorithms::Direction;
use clap::ValueEnum;
use serde::Serialize;
use vhost_user_crypto::wire::session::{SessionAbi, SymSessionInfo};
use vhost_user_crypto::wire::virtio_crypto::{
    OpDataReq, Status, OP_DATA_REQ_SIZE, VIRTIO_CRYPTO_CIPHER_DECRYPT, VIRTIO_CRYPTO_CIPHER_ENCRYPT,
    VIRTIO_CRYPTO_OP_DECRYPT, VIRTIO_CRYPTO_OP_ENCRYPT, VIRTIO_CRYPTO_SYM_OP_CIPHER,
};
use zeroize::Zeroizing;

use crate::driver_ring::{self, Buf, Descriptor};
use crate::frontend::{
    CryptoFrontend, DescMode, Error, FrontendConfig, SlotLayout, Used, DESCS_PER_REQUEST, MAX_QUEUE_SIZE,
    MAX_RAW_DESCS,
};
use crate::replay::{put_status_area, status_and_guard};
use crate::rng::{self, below, Rng as _, SplitMix64};
use crate::trace::ExpectStatus;

/// Written over each output buffer (and the 16 bytes after it) before submission.
pub const DST_CANARY: u8 = 0x5A;
/// Canary bytes between the pieces of a cut dst (so a device that writes
/// dst as one run from its first descriptor, ignoring the others'
/// addresses, is caught) and after its last piece.
const DST_GAP: u32 = 16;
/// Most pieces a dst is cut into ([`Layout::IndirectCut`]).
const MAX_DST_PIECES: usize = 8;
/// Room in a slot's dst area past `max_size`: the gaps and the tail.
const DST_SLACK: usize = DST_GAP as usize * MAX_DST_PIECES;
const MAX_REPORTED: usize = 10;

/// The header of a soak request: a plain cipher request of `len` bytes
/// (IV 16 bytes, dst as long as src) in session `sid`.
fn request_header(dir: Direction, sid: u64, len: u32) -> [u8; OP_DATA_REQ_SIZE] {
    OpDataReq {
        opcode: match dir {
            Direction::Encrypt => VIRTIO_CRYPTO_CIPHER_ENCRYPT,
            Direction::Decrypt => VIRTIO_CRYPTO_CIPHER_DECRYPT,
        },
        algo: 0,
        session_id: sid,
        op_type: VIRTIO_CRYPTO_SYM_OP_CIPHER,
        iv_len: 16,
        src_data_len: len,
        dst_data_len: len,
    }
    .to_bytes()
}

/// Where a soak request's contiguous readable stream (header, IV, src)
/// starts: 88 bytes before the slot's src, inside the slot's header area.
fn readable_start(l: SlotLayout) -> u64 {
    debug_assert!(l.src - l.hdr >= 88);
    l.src - 88
}

/// Which descriptor layouts a soak uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Layouts {
    /// Direct chains and indirect tables, per request.
    Mixed,
    /// Indirect tables only (as Linux sends them).
    Indirect,
    /// Direct chains only.
    Chain,
}

/// Soak settings.
#[derive(Debug, Clone)]
pub struct SoakOptions {
    /// PRNG seed: the same seed gives the same requests.
    pub seed: u64,
    /// Requests to submit.
    pub count: u64,
    /// Requests in flight per queue.
    pub queue_depth: u16,
    /// Session slots kept open (each rekeyed from time to time).
    pub sessions: u16,
    /// A rekey every this many requests (0: never).
    pub rekey_every: u64,
    /// About one request in this many names a closed session (0: none).
    pub stale_every: u64,
    /// Largest request in bytes (a multiple of 16).
    pub max_size: usize,
    /// Descriptor layouts.
    pub layouts: Layouts,
    /// How long to wait for a completion before giving up.
    pub timeout: Duration,
    /// Show a progress bar.
    pub progress: bool,
}

impl Default for SoakOptions {
    fn default() -> Self {
        SoakOptions {
            seed: 1,
            count: 100_000,
            queue_depth: 64,
            sessions: 8,
            rekey_every: 1000,
            stale_every: 500,
            max_size: 16384,
            layouts: Layouts::Mixed,
            timeout: Duration::from_secs(10),
            progress: false,
        }
    }
}

impl SoakOptions {
    /// Checks the options.
    ///
    /// # Errors
    /// What to change.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_size < 16 || self.max_size % 16 != 0 {
            return Err(format!(
                "--max-size {} is not a positive multiple of 16",
                self.max_size
            ));
        }
        if self.max_size > 1 << 20 {
            return Err(format!(
                "--max-size {} is above the daemon's default limit of 1 MiB",
                self.max_size
            ));
        }
        if self.sessions < 2 {
            return Err("--sessions must be at least 2 (one is drained while the others run)".into());
        }
        if self.queue_depth == 0 {
            return Err("--queue-depth must be at least 1".into());
        }
        let (per_req, layouts) = match self.layouts {
            Layouts::Indirect => (1, "indirect"),
            Layouts::Mixed => (u32::from(DESCS_PER_REQUEST), "mixed"),
            Layouts::Chain => (u32::from(DESCS_PER_REQUEST), "chain"),
        };
        let max = u32::from(MAX_QUEUE_SIZE);
        if u32::from(self.queue_depth) * per_req > max {
            return Err(format!(
                "--queue-depth {} is above {}: with --descriptors {layouts} a request takes up to {per_req} of the largest ring's {max} entries",
                self.queue_depth,
                max / per_req
            ));
        }
        Ok(())
    }

    /// The frontend settings a soak on `queues` queues needs: rings large
    /// enough for `queue_depth` direct chains of `DESCS_PER_REQUEST` (unless
    /// indirect only), room for the largest request.
    pub fn frontend_config(&self, queues: u16, abi: SessionAbi) -> FrontendConfig {
        let (desc_mode, per_req) = match self.layouts {
            Layouts::Indirect => (DescMode::Indirect, 1),
            Layouts::Mixed | Layouts::Chain => (DescMode::Chain, u32::from(DESCS_PER_REQUEST)),
        };
        let size = (u32::from(self.queue_depth) * per_req)
            .next_power_of_two()
            .clamp(256, u32::from(MAX_QUEUE_SIZE));
        FrontendConfig {
            queues,
            queue_size: size as u16,
            queue_depth: self.queue_depth,
            // Room for the gaps between a cut dst's pieces and after it.
            max_payload: self.max_size + DST_SLACK,
            max_iv: 16,
            memory_bytes: 0,
            session_abi: abi,
            desc_mode,
            dpdk: false,
        }
    }
}

/// A completed request that passed through the checks, for an observer.
#[derive(Debug)]
pub struct Checked<'a> {
    /// Sequence number (submission order, from 0).
    pub seq: u64,
    /// Data queue.
    pub queue: u16,
    /// Encrypt (else decrypt).
    pub encrypt: bool,
    /// The session's key (empty for a request naming a closed session).
    pub key: &'a [u8],
    /// The IV.
    pub iv: &'a [u8; 16],
    /// The source bytes submitted.
    pub src: &'a [u8],
    /// The output bytes the backend wrote (as long as `src`).
    pub dst: &'a [u8],
    /// Status byte.
    pub status: u8,
    /// Used length.
    pub used_len: u32,
    /// The request named a closed session.
    pub stale: bool,
}

/// Result of a soak.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SoakReport {
    /// The seed.
    pub seed: u64,
    /// Requests submitted.
    pub requests: u64,
    /// Requests completed (each at most once).
    pub completed: u64,
    /// Completions whose status, used length, head, output or untouched
    /// bytes were wrong.
    pub mismatches: u64,
    /// Used elements for a request not in flight (or completed already).
    pub duplicates: u64,
    /// Requests submitted but never completed.
    pub missing: u64,
    /// Sessions closed and re-created during the run.
    pub rekeys: u64,
    /// Rekeys done while requests of other sessions were in flight.
    pub rekeys_with_requests_in_flight: u64,
    /// Requests naming a closed session (expected INVSESS).
    pub stale_requests: u64,
    /// Sessions created.
    pub sessions_created: u64,
    /// Completions per status.
    pub status_counts: BTreeMap<String, u64>,
    /// Requests per descriptor layout.
    pub layouts: BTreeMap<String, u64>,
    /// Requests per key size (bits).
    pub key_bits: BTreeMap<u32, u64>,
    /// Encrypt requests.
    pub encrypt: u64,
    /// Decrypt requests.
    pub decrypt: u64,
    /// Requests per data queue.
    pub per_queue: Vec<u64>,
    /// Payload bytes submitted.
    pub bytes: u64,
    /// Wall-clock seconds.
    pub elapsed_s: f64,
    /// Completed requests per second.
    pub ops_per_sec: f64,
    /// Payload MiB per second.
    pub mib_per_sec: f64,
    /// Why the run stopped early (a timeout or a transport failure).
    pub error: Option<String>,
    /// The first mismatches.
    pub first_mismatches: Vec<String>,
}

impl SoakReport {
    /// No mismatch, no duplicate, nothing missing, every request completed.
    pub fn passed(&self) -> bool {
        self.mismatches == 0
            && self.duplicates == 0
            && self.missing == 0
            && self.error.is_none()
            && self.completed == self.requests
    }

    /// Human-readable summary.
    pub fn summary(&self) -> String {
        let join = |m: &BTreeMap<String, u64>| {
            m.iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let bits: Vec<String> = self.key_bits.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let mut s = String::new();
        s += &format!("seed:        {}\n", self.seed);
        s += &format!(
            "requests:    {} submitted, {} completed ({} encrypt, {} decrypt; {} naming a closed session)\n",
            self.requests, self.completed, self.encrypt, self.decrypt, self.stale_requests
        );
        s += &format!("mismatches:  {}\n", self.mismatches);
        s += &format!("duplicates:  {}\n", self.duplicates);
        s += &format!("missing:     {}\n", self.missing);
        s += &format!(
            "rekeys:      {} ({} with requests in flight), {} sessions created\n",
            self.rekeys, self.rekeys_with_requests_in_flight, self.sessions_created
        );
        s += &format!("statuses:    {}\n", join(&self.status_counts));
        s += &format!("layouts:     {}\n", join(&self.layouts));
        s += &format!("key bits:    {}\n", bits.join(", "));
        s += &format!("per queue:   {:?}\n", self.per_queue);
        s += &format!(
            "throughput:  {:.0} ops/s, {:.2} MiB/s ({} bytes in {:.3} s)\n",
            self.ops_per_sec, self.mib_per_sec, self.bytes, self.elapsed_s
        );
        if let Some(e) = &self.error {
            s += &format!("STOPPED:     {e}\n");
        }
        for m in &self.first_mismatches {
            s += &format!("MISMATCH {m}\n");
        }
        s
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// Direct chain: header, IV, src, dst, status.
    Direct,
    /// Direct chain, readable and dst bytes cut at random offsets (≤ 5 descriptors).
    DirectCut,
    /// Indirect table: header, IV, src, dst, status.
    Indirect,
    /// Indirect table, readable and dst bytes cut at random offsets (≤ 16 descriptors).
    IndirectCut,
}

impl Layout {
    fn name(self) -> &'static str {
        match self {
            Layout::Direct => "direct",
            Layout::DirectCut => "direct-cut",
            Layout::Indirect => "indirect",
            Layout::IndirectCut => "indirect-cut",
        }
    }
}

struct SessSlot {
    id: u64,
    key: Zeroizing<Vec<u8>>,
    dir: Direction,
    /// In flight per queue.
    inflight: Vec<u32>,
    draining: bool,
}

#[derive(Clone, Copy)]
struct Pending {
    seq: u64,
    /// Session slot, or `None` for a request naming a closed session.
    sess: Option<u16>,
    dir: Direction,
    iv: [u8; 16],
    len: u32,
    head: u32,
    /// The session id the header names.
    sid: u64,
    /// dst's pieces (bytes each), `DST_GAP` bytes apart.
    dst_cuts: [u32; MAX_DST_PIECES],
    dst_pieces: u8,
}

struct Soak<'a, 'o> {
    fe: &'a mut CryptoFrontend,
    o: &'a SoakOptions,
    rng: SplitMix64,
    sess: Vec<SessSlot>,
    closed: Vec<u64>,
    pending: Vec<Vec<Option<Pending>>>,
    /// Source bytes per (queue, slot), kept for the check.
    srcs: Vec<Vec<Vec<u8>>>,
    /// Per (queue, slot): the request's descriptors as this tool put them
    /// (see [`DescsPut`]), kept for the check.
    descs_put: Vec<Vec<DescsPut>>,
    /// One bit per sequence number: completed.
    ledger: Vec<u64>,
    report: SoakReport,
    observer: Option<&'o mut dyn FnMut(&Checked<'_>)>,
    used: Vec<Used>,
    expect: Vec<u8>,
    got: Vec<u8>,
    bar: Option<indicatif::ProgressBar>,
}

/// Where a request's descriptors are and their bytes as they were put
/// there: the ring's descriptors (the head, or the whole direct chain) and,
/// for an indirect request, its table. The device only reads them (virtio
/// 1.2 §2.7.5: the descriptor table is driver-written), so they must be
/// unchanged when the request completes.
#[derive(Default)]
struct DescsPut {
    /// (guest address, length in bytes); the second is empty for a direct chain.
    areas: [(u64, usize); 2],
    bytes: Vec<u8>,
}

/// Cuts `total` into `pieces` lengths of at least one byte each, at random offsets.
fn cuts(rng: &mut SplitMix64, total: u32, pieces: usize) -> Vec<u32> {
    let pieces = pieces.clamp(1, total as usize);
    let mut points: Vec<u32> = (1..pieces)
        .map(|_| 1 + (rng.next_u64() % u64::from(total - 1)) as u32)
        .collect();
    points.push(0);
    points.push(total);
    points.sort_unstable();
    points.dedup();
    points.windows(2).map(|p| p[1] - p[0]).collect()
}

impl Soak<'_, '_> {
    fn mismatch(&mut self, what: String) {
        self.report.mismatches += 1;
        if self.report.first_mismatches.len() < MAX_REPORTED {
            self.report.first_mismatches.push(what);
        }
    }

    fn info(key: &[u8], dir: Direction) -> SymSessionInfo {
        SymSessionInfo::aes_cbc(
            key,
            match dir {
                Direction::Encrypt => VIRTIO_CRYPTO_OP_ENCRYPT,
                Direction::Decrypt => VIRTIO_CRYPTO_OP_DECRYPT,
            },
        )
    }

    /// Creates a session with a fresh key from the stream.
    fn new_session(&mut self) -> Result<SessSlot, Error> {
        let len = [16usize, 24, 32][below(&mut self.rng, 3) as usize];
        let mut key = Zeroizing::new(vec![0u8; len]);
        self.rng.fill_bytes(&mut key);
        let dir = if below(&mut self.rng, 2) == 0 {
            Direction::Encrypt
        } else {
            Direction::Decrypt
        };
        let id = self.fe.create_session(&Self::info(&key, dir))?;
        if id <= 0 {
            return Err(Error::BadReply(format!(
                "CREATE of a valid {}-bit session gave id {id}",
                len * 8
            )));
        }
        self.report.sessions_created += 1;
        Ok(SessSlot {
            id: id as u64,
            key,
            dir,
            inflight: vec![0; self.fe.queues.len()],
            draining: false,
        })
    }

    fn in_flight_total(&self) -> u32 {
        self.fe.queues.iter().map(|q| u32::from(q.in_flight())).sum()
    }

    fn publish_all(&mut self) -> Result<(), Error> {
        for q in &mut self.fe.queues {
            q.publish_and_kick()?;
        }
        Ok(())
    }

    fn reap_ready(&mut self, q: usize) {
        let mut used = std::mem::take(&mut self.used);
        used.clear();
        self.fe.queues[q].try_reap(&mut used);
        for &u in &used {
            self.complete(q, u);
        }
        self.used = used;
    }

    fn reap_ready_all(&mut self) {
        for q in 0..self.fe.queues.len() {
            self.reap_ready(q);
        }
    }

    fn reap_blocking(&mut self, q: usize) -> Result<(), Error> {
        let mut used = std::mem::take(&mut self.used);
        used.clear();
        let r = self.fe.queues[q].reap(&mut used, self.o.timeout);
        for &u in &used {
            self.complete(q, u);
        }
        self.used = used;
        r
    }

    /// A free slot on queue `q`, reaping as needed.
    fn room(&mut self, q: usize) -> Result<u16, Error> {
        loop {
            let dq = &self.fe.queues[q];
            if dq.in_flight() < self.o.queue_depth {
                if let Some(s) = dq.next_slot() {
                    return Ok(s);
                }
            }
            self.publish_all()?;
            self.reap_ready_all();
            let dq = &self.fe.queues[q];
            if dq.in_flight() >= self.o.queue_depth || dq.next_slot().is_none() {
                self.reap_blocking(q)?;
            }
        }
    }

    fn pick_layout(&mut self) -> Layout {
        let r = below(&mut self.rng, 4);
        match (self.o.layouts, r) {
            (Layouts::Mixed, 0) | (Layouts::Chain, 0 | 1) => Layout::Direct,
            (Layouts::Mixed, 1) | (Layouts::Chain, _) => Layout::DirectCut,
            (Layouts::Mixed, 2) | (Layouts::Indirect, 0 | 1) => Layout::Indirect,
            _ => Layout::IndirectCut,
        }
    }

    fn pick_size(&mut self) -> u32 {
        let max_blocks = (self.o.max_size / 16) as u64;
        let (lo, hi) = match below(&mut self.rng, 100) {
            0..50 => (1, 16),
            50..80 => (17, 128),
            80..95 => (129, 512),
            _ => (513, 1024),
        };
        let hi = hi.min(max_blocks);
        let lo = lo.min(hi);
        (16 * (lo + below(&mut self.rng, hi - lo + 1))) as u32
    }

    /// The descriptors of a request of `len` bytes in `slot`'s buffers: the
    /// readable stream header | IV | src is one contiguous area (ending at
    /// the slot's src, see [`readable_start`]), cut anywhere; dst is cut
    /// into pieces `DST_GAP` bytes apart (returned too).
    fn descs(&mut self, l: SlotLayout, len: u32, layout: Layout) -> (Vec<Descriptor>, Vec<u32>) {
        let readable = 72 + 16 + len;
        let (r_cuts, d_cuts) = match layout {
            Layout::Direct | Layout::Indirect => (vec![72, 16, len], vec![len]),
            Layout::DirectCut => {
                let r = 1 + below(&mut self.rng, 3) as usize;
                let d = 1 + below(&mut self.rng, (4 - r) as u64) as usize;
                (cuts(&mut self.rng, readable, r), cuts(&mut self.rng, len, d))
            }
            Layout::IndirectCut => {
                let r = 1 + below(&mut self.rng, 7) as usize;
                let d = 1 + below(&mut self.rng, 8) as usize;
                (cuts(&mut self.rng, readable, r), cuts(&mut self.rng, len, d))
            }
        };
        let mut out = Vec::with_capacity(r_cuts.len() + d_cuts.len() + 1);
        let mut at = readable_start(l);
        for n in r_cuts {
            out.push(Buf::readable(at, n));
            at += u64::from(n);
        }
        debug_assert!(d_cuts.len() <= MAX_DST_PIECES);
        let mut at = l.dst;
        for &n in &d_cuts {
            out.push(Buf::writable(at, n));
            at += u64::from(n + DST_GAP);
        }
        out.push(Buf::writable(l.status, 1));
        debug_assert!(out.len() <= MAX_RAW_DESCS);
        (driver_ring::chain(&out, 0).collect(), d_cuts)
    }

    /// Generates and submits request `seq`.
    fn submit(&mut self, seq: u64) -> Result<(), Error> {
        let nq = self.fe.queues.len();
        let stale = self.o.stale_every > 0
            && !self.closed.is_empty()
            && below(&mut self.rng, self.o.stale_every) == 0;
        let (sess, sid, dir) = if stale {
            let id = self.closed[below(&mut self.rng, self.closed.len() as u64) as usize];
            let dir = if below(&mut self.rng, 2) == 0 {
                Direction::Encrypt
            } else {
                Direction::Decrypt
            };
            (None, id, dir)
        } else {
            // A uniform pick among the slots not being drained.
            let live = self.sess.iter().filter(|s| !s.draining).count();
            let mut k = below(&mut self.rng, live as u64) as usize;
            let s = self
                .sess
                .iter()
                .position(|s| {
                    if s.draining {
                        return false;
                    }
                    k = k.wrapping_sub(1);
                    k == usize::MAX
                })
                .unwrap_or(0);
            let ss = &self.sess[s];
            (Some(s as u16), ss.id, ss.dir)
        };
        let q = below(&mut self.rng, nq as u64) as usize;
        let len = self.pick_size();
        let layout = self.pick_layout();
        let mut iv = [0u8; 16];
        self.rng.fill_bytes(&mut iv);

        let slot = self.room(q)?;
        let src = &mut self.srcs[q][usize::from(slot)];
        self.rng.fill_bytes(&mut src[..len as usize]);
        let hdr = request_header(dir, sid, len);
        let l = self.fe.queues[q].layout(slot);
        let (descs, d_cuts) = self.descs(l, len, layout);
        let mut dst_cuts = [0u32; MAX_DST_PIECES];
        dst_cuts[..d_cuts.len()].copy_from_slice(&d_cuts);
        let dq = &mut self.fe.queues[q];
        {
            let mem = dq.mem();
            let at = readable_start(l);
            mem.write(at, &hdr);
            mem.write(at + 72, &iv);
            mem.write(l.src, &self.srcs[q][usize::from(slot)][..len as usize]);
            // The pieces, the gaps between them and DST_GAP bytes after.
            let fill = len as usize + DST_GAP as usize * d_cuts.len();
            mem.fill(l.dst, fill, DST_CANARY);
            // The status canary and guard bytes after it (the replay's).
            put_status_area(mem, l);
        }
        let indirect = matches!(layout, Layout::Indirect | Layout::IndirectCut);
        let head = dq.submit_descs(slot, &descs, indirect).map_err(Error::Raw)?;
        let ring = dq.ring_addrs().desc + 16 * u64::from(head);
        let n = 16 * descs.len();
        let put = &mut self.descs_put[q][usize::from(slot)];
        put.areas = if indirect {
            [(ring, 16), (l.table, n)]
        } else {
            [(ring, n), (0, 0)]
        };
        // The bytes this tool wrote, as it wrote them (not read back from
        // guest memory, where a device's write could already be).
        let [(a0, n0), (a1, n1)] = put.areas;
        put.bytes.clear();
        put.bytes.resize(n0 + n1, 0);
        let bytes = &mut put.bytes;
        dq.raw_desc_images(slot, &descs, indirect, |gpa, d| {
            // (Every image lies in one of the two areas, by construction.)
            let at = if gpa.wrapping_sub(a0) < n0 as u64 {
                Some((gpa - a0) as usize)
            } else if gpa.wrapping_sub(a1) < n1 as u64 {
                Some(n0 + (gpa - a1) as usize)
            } else {
                None
            };
            debug_assert!(
                at.is_some(),
                "descriptor image at {gpa:#x} outside its request's areas"
            );
            if let Some(b) = at
                .and_then(|at| bytes.get_mut(at..))
                .and_then(|b| b.get_mut(..16))
            {
                b.copy_from_slice(&d);
            }
        })
        .map_err(Error::Raw)?;
        self.pending[q][usize::from(slot)] = Some(Pending {
            seq,
            sess,
            dir,
            iv,
            len,
            head: u32::from(head),
            sid,
            dst_cuts,
            dst_pieces: d_cuts.len() as u8,
        });
        if let Some(s) = sess {
            self.sess[usize::from(s)].inflight[q] += 1;
            *self
                .report
                .key_bits
                .entry(self.sess[usize::from(s)].key.len() as u32 * 8)
                .or_default() += 1;
        } else {
            self.report.stale_requests += 1;
        }
        let r = &mut self.report;
        r.requests += 1;
        r.bytes += u64::from(len);
        r.per_queue[q] += 1;
        match dir {
            Direction::Encrypt => r.encrypt += 1,
            Direction::Decrypt => r.decrypt += 1,
        }
        *r.layouts.entry(layout.name().into()).or_default() += 1;
        Ok(())
    }

    fn complete(&mut self, q: usize, u: Used) {
        let Some(p) = self.pending[q]
            .get_mut(usize::from(u.slot))
            .and_then(Option::take)
        else {
            self.report.duplicates += 1;
            let m = format!(
                "queue {q}: used id {} (len {}) for no request in flight",
                u.id, u.len
            );
            self.mismatch(m);
            return;
        };
        let word = &mut self.ledger[(p.seq / 64) as usize];
        let bit = 1u64 << (p.seq % 64);
        if *word & bit != 0 {
            self.report.duplicates += 1;
            self.mismatch(format!("request {} completed twice", p.seq));
            return;
        }
        *word |= bit;
        self.report.completed += 1;
        if let Some(b) = &self.bar {
            b.inc(1);
        }
        if let Some(s) = p.sess {
            self.sess[usize::from(s)].inflight[q] -= 1;
        }
        let len = p.len as usize;
        let l = self.fe.queues[q].layout(u.slot);
        let mem = self.fe.queues[q].mem();
        let (status, status_guard_ok) = status_and_guard(mem, l);
        // dst from its pieces; the gap after each must hold the canary.
        let mut gaps_ok = true;
        let (mut at, mut done) = (l.dst, 0usize);
        for &n in &p.dst_cuts[..usize::from(p.dst_pieces)] {
            let n = n as usize;
            mem.read(at, &mut self.got[done..done + n]);
            gaps_ok &= mem
                .view(at + n as u64, DST_GAP as usize)
                .iter()
                .all(|&b| b == DST_CANARY);
            at += (n + DST_GAP as usize) as u64;
            done += n;
        }
        mem.read(l.src, &mut self.expect[..len]);
        let src_ok = self.expect[..len] == self.srcs[q][usize::from(u.slot)][..len];
        // Header and IV (readable, right before src) as they were put there.
        let hdr = request_header(p.dir, p.sid, p.len);
        let at = readable_start(l);
        let hdr_ok = mem.view(at, OP_DATA_REQ_SIZE) == hdr.as_slice();
        let iv_ok = mem.view(at + 72, 16) == p.iv.as_slice();
        let put = &self.descs_put[q][usize::from(u.slot)];
        let [(a0, n0), (a1, n1)] = put.areas;
        let descs_ok = mem.view(a0, n0) == &put.bytes[..n0] && mem.view(a1, n1) == &put.bytes[n0..n0 + n1];
        *self
            .report
            .status_counts
            .entry(ExpectStatus::name(status))
            .or_default() += 1;

        let mut bad: Vec<String> = Vec::new();
        if u.id != p.head {
            bad.push(format!("used id {} (head {})", u.id, p.head));
        }
        let (want_status, want_len) = if p.sess.is_some() {
            (Status::Ok as u8, p.len + 1)
        } else {
            (Status::InvSess as u8, 1)
        };
        if status != want_status {
            bad.push(format!(
                "status {} (expected {})",
                ExpectStatus::name(status),
                ExpectStatus::name(want_status)
            ));
        }
        if u.len != want_len {
            bad.push(format!("used length {} (expected {want_len})", u.len));
        }
        // What the device may not write, as this tool put it.
        for (ok, what) in [
            (src_ok, "source bytes changed"),
            (hdr_ok, "request header changed"),
            (iv_ok, "IV changed"),
            (descs_ok, "descriptors (ring or indirect table) changed"),
            (gaps_ok, "bytes between or after the output's pieces written"),
            (status_guard_ok, "bytes after the status byte written"),
        ] {
            if !ok {
                bad.push(what.into());
            }
        }
        match p.sess {
            Some(s) => {
                let ss = &self.sess[usize::from(s)];
                self.expect[..len].copy_from_slice(&self.srcs[q][usize::from(u.slot)][..len]);
                // Lengths are whole blocks and keys 16, 24 or 32 bytes:
                // the reference cannot fail.
                let _ = crate::reference::aes_cbc(p.dir, &ss.key, &p.iv, &mut self.expect[..len]);
                if self.got[..len] != self.expect[..len] {
                    let at = self.got[..len]
                        .iter()
                        .zip(&self.expect[..len])
                        .position(|(a, b)| a != b)
                        .unwrap_or(0);
                    bad.push(format!("output differs from the reference from byte {at}"));
                }
            }
            None => {
                if self.got[..len].iter().any(|&b| b != DST_CANARY) {
                    bad.push("output written for a closed session".into());
                }
            }
        }
        if let Some(obs) = self.observer.as_mut() {
            let key: &[u8] = match p.sess {
                Some(s) => &self.sess[usize::from(s)].key,
                None => &[],
            };
            obs(&Checked {
                seq: p.seq,
                queue: q as u16,
                encrypt: p.dir == Direction::Encrypt,
                key,
                iv: &p.iv,
                src: &self.srcs[q][usize::from(u.slot)][..len],
                dst: &self.got[..len],
                status,
                used_len: u.len,
                stale: p.sess.is_none(),
            });
        }
        if !bad.is_empty() {
            let kind = match p.sess {
                Some(_) => format!("{:?}", p.dir).to_lowercase(),
                None => "closed-session".into(),
            };
            self.mismatch(format!(
                "request {} ({kind}, {} bytes, queue {q}): {}",
                p.seq,
                p.len,
                bad.join("; ")
            ));
        }
    }

    /// Waits until session slot `s` (which gets no new requests) has
    /// nothing in flight.
    fn wait_idle(&mut self, s: usize) -> Result<(), Error> {
        self.publish_all()?;
        loop {
            self.reap_ready_all();
            let Some(q) = self.sess[s].inflight.iter().position(|&n| n > 0) else {
                return Ok(());
            };
            self.reap_blocking(q)?;
        }
    }

    /// Closes session slot `s`, idle since [`Soak::wait_idle`], and creates
    /// a new session in its place. The requests submitted since it went
    /// idle are published just before the CLOSE, so the backend is working
    /// on other sessions meanwhile.
    fn rekey(&mut self, s: usize) -> Result<(), Error> {
        debug_assert!(self.sess[s].inflight.iter().all(|&n| n == 0));
        self.publish_all()?;
        if self.in_flight_total() > 0 {
            self.report.rekeys_with_requests_in_flight += 1;
        }
        let old = self.sess[s].id;
        self.fe.close_session(old)?;
        self.closed.push(old);
        self.sess[s] = self.new_session()?;
        self.report.rekeys += 1;
        Ok(())
    }

    fn drain(&mut self) -> Result<(), Error> {
        self.publish_all()?;
        for q in 0..self.fe.queues.len() {
            while self.fe.queues[q].in_flight() > 0 {
                self.reap_blocking(q)?;
            }
        }
        Ok(())
    }

    fn run(&mut self) -> Result<(), Error> {
        // A rekey of slot s decided at request d: s gets no new requests
        // from d on; at d + gap (the rings have turned over once) we wait
        // until its last requests have completed; at d + gap + gap/2 (after
        // gap/2 more requests of the other sessions) it is closed and
        // re-created, while those are in flight. Each point is a request
        // index, so the request stream depends on the seed only.
        let gap = (u64::from(self.o.queue_depth) * self.fe.queues.len() as u64)
            .min(self.o.rekey_every.div_ceil(3))
            .max(2);
        let mut rekey: Option<(usize, u64, u64)> = None;
        for seq in 0..self.o.count {
            if let Some((s, idle_at, close_at)) = rekey {
                if seq == idle_at {
                    self.wait_idle(s)?;
                }
                if seq == close_at {
                    self.rekey(s)?;
                    rekey = None;
                }
            }
            if rekey.is_none() && self.o.rekey_every > 0 && seq > 0 && seq % self.o.rekey_every == 0 {
                let s = below(&mut self.rng, self.sess.len() as u64) as usize;
                self.sess[s].draining = true;
                rekey = Some((s, seq + gap, seq + gap + gap / 2));
            }
            self.submit(seq)?;
        }
        self.drain()?;
        if let Some((s, _, _)) = rekey {
            // A rekey decided near the end: done on the idle rings.
            self.wait_idle(s)?;
            self.rekey(s)?;
        }
        Ok(())
    }
}

/// Runs a soak on a connected frontend (set up with
/// [`SoakOptions::frontend_config`]). `observer` sees every completed
/// request after the checks.
///
/// A timeout or transport failure during the run stops it and is reported
/// in [`SoakReport::error`], with the requests never completed counted as
/// missing.
///
/// # Errors
/// Bad options, or the first sessions cannot be created.
pub fn soak(
    fe: &mut CryptoFrontend,
    o: &SoakOptions,
    observer: Option<&mut dyn FnMut(&Checked<'_>)>,
) -> Result<SoakReport, Error> {
    o.validate().map_err(Error::Options)?;
    if fe.queues.iter().any(|q| q.slots() < o.queue_depth) {
        return Err(Error::Options(
            "the frontend's rings are too small for --queue-depth (use SoakOptions::frontend_config)".into(),
        ));
    }
    let nq = fe.queues.len();
    let pending = fe
        .queues
        .iter()
        .map(|q| vec![None; usize::from(q.slots())])
        .collect();
    let srcs = fe
        .queues
        .iter()
        .map(|q| vec![vec![0u8; o.max_size]; usize::from(q.slots())])
        .collect();
    let descs_put = fe
        .queues
        .iter()
        .map(|q| (0..q.slots()).map(|_| DescsPut::default()).collect())
        .collect();
    let bar = (o.progress && o.count >= 10_000).then(|| {
        let b = indicatif::ProgressBar::new(o.count);
        b.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} requests {per_sec} eta {eta}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    });
    let mut run = Soak {
        fe,
        o,
        rng: rng::seeded(o.seed),
        sess: Vec::new(),
        closed: Vec::new(),
        pending,
        srcs,
        descs_put,
        ledger: vec![0u64; o.count.div_ceil(64) as usize],
        report: SoakReport {
            seed: o.seed,
            per_queue: vec![0; nq],
            ..Default::default()
        },
        observer,
        used: Vec::with_capacity(1024),
        expect: vec![0u8; o.max_size + 16],
        got: vec![0u8; o.max_size + 16],
        bar,
    };
    for _ in 0..o.sessions {
        let s = run.new_session()?;
        run.sess.push(s);
    }
    let t0 = Instant::now();
    if let Err(e) = run.run() {
        run.report.error = Some(e.to_string());
    }
    let elapsed = t0.elapsed().as_secs_f64();
    if let Some(b) = &run.bar {
        b.finish_and_clear();
    }
    let mut r = run.report;
    r.missing = r.requests - r.completed;
    r.elapsed_s = elapsed;
    if elapsed > 0.0 {
        r.ops_per_sec = r.completed as f64 / elapsed;
        r.mib_per_sec = r.bytes as f64 / f64::from(1 << 20) / elapsed;
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_depth_is_checked_against_the_largest_ring() {
        let o = |queue_depth, layouts| SoakOptions {
            queue_depth,
            layouts,
            ..SoakOptions::default()
        };
        assert_eq!(o(5461, Layouts::Mixed).validate(), Ok(()));
        assert_eq!(
            o(5462, Layouts::Chain).validate(),
            Err("--queue-depth 5462 is above 5461: with --descriptors chain a request takes up to 6 of the largest ring's 32768 entries".into())
        );
        assert_eq!(o(32768, Layouts::Indirect).validate(), Ok(()));
        assert!(o(32769, Layouts::Indirect).validate().is_err());
    }

    #[test]
    fn cuts_cover_the_length_with_non_empty_pieces() {
        let mut rng = rng::seeded(7);
        for total in [1u32, 2, 17, 104, 16384 + 88] {
            for pieces in 1..=8 {
                let c = cuts(&mut rng, total, pieces);
                assert_eq!(c.iter().sum::<u32>(), total);
                assert!(c.iter().all(|&n| n > 0));
                assert!(c.len() <= pieces.min(total as usize));
            }
        }
    }

    #[test]
    fn options_are_checked() {
        let o = SoakOptions::default();
        assert!(o.validate().is_ok());
        assert!(SoakOptions {
            max_size: 100,
            ..o.clone()
        }
        .validate()
        .is_err());
        assert!(SoakOptions {
            sessions: 1,
            ..o.clone()
        }
        .validate()
        .is_err());
        let c = SoakOptions {
            queue_depth: 128,
            ..o.clone()
        }
        .frontend_config(2, SessionAbi::C);
        assert_eq!((c.queue_size, c.desc_mode), (1024, DescMode::Chain));
        assert!(c.validate().is_ok());
        let c = SoakOptions {
            queue_depth: 128,
            layouts: Layouts::Indirect,
            ..o
        }
        .frontend_config(1, SessionAbi::C);
        assert_eq!((c.queue_size, c.desc_mode), (256, DescMode::Indirect));
    }
}
