// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Keeping requests in flight: sessions created per pass, each request
//! written into a free slot of its queue and submitted, completions
//! drained and handed to the checks.

use std::collections::HashMap;
use std::time::Instant;

use vhost_user_crypto::wire::session::SymSessionInfo;
use vhost_user_crypto::wire::virtio_crypto::{
    OP_DATA_REQ_SIZE, VIRTIO_CRYPTO_OP_DECRYPT, VIRTIO_CRYPTO_OP_ENCRYPT, VIRTIO_CRYPTO_SYM_HASH_MODE_AUTH,
    VIRTIO_CRYPTO_SYM_OP_ALGORITHM_CHAINING,
};

use super::check::{
    canary_where_same, data_buffers, dst_guard, in_hash_sample, put_status_area, src_checked, DST_CANARY,
    GUARD_LEN,
};
use super::prepared::{request_header, Prepared};
use super::report::{Mismatch, Outcome, Report};
use super::threads::Ctl;
use super::ReplayOptions;
use crate::frontend::{DriverQueue, Error, Placement, Used, DIGEST_AREA};
use crate::trace::{AlgChainSession, Dir, Req};

pub(super) const MAX_REPORTED: usize = 10;

/// Requests submitted before the avail index is published (and the
/// backend kicked if it asks for it), when the ring is not full first; at
/// most a quarter of the queue depth.
const PUBLISH_EVERY: u16 = 32;

/// A request in flight: its sequence number in the run, its index in the
/// run of requests being replayed ([`Prepared`]), and whether its latency
/// is measured (its submit time is in [`Run::started`]). 16 bytes.
#[derive(Debug, Clone, Copy)]
pub(super) struct InFlight {
    pub(super) seq: u64,
    pub(super) idx: u32,
    pub(super) timed: bool,
    /// Its placement is [`Placement::Swapped`].
    pub(super) swapped: bool,
    /// It alternates between its buffer set's data buffers
    /// ([`DriverQueue::placement`]): the set's next request, if it
    /// alternates too, writes its src where this one's output is.
    pub(super) alternating: bool,
}
const _: () = assert!(std::mem::size_of::<Option<InFlight>>() == 16);

/// Completions whose buffers are prefetched ahead of the one being checked.
const PREFETCH_AHEAD: usize = 4;

pub(super) struct Run<'a> {
    /// The connection's session messages.
    pub(super) ctl: Ctl<'a>,
    /// The data queues this run drives (all of the frontend's, or one per
    /// thread with [`super::replay_threads`]).
    pub(super) queues: &'a mut Vec<DriverQueue>,
    pub(super) opts: &'a ReplayOptions,
    pub(super) report: Report,
    pub(super) ids: HashMap<String, i64>,
    /// Sessions created in this pass over the trace and not closed by it
    /// (closed before the next pass: see [`super::replay`]).
    pub(super) live: Vec<u64>,
    pub(super) latencies: Vec<u32>,
    /// Whether every request's latency is measured ([`super::LATENCY_ALL_UP_TO`]).
    pub(super) time_all: bool,
    /// Per queue and slot: the request in flight there.
    pub(super) inflight: Vec<Vec<Option<InFlight>>>,
    /// Per queue and slot: when its request was submitted (set for the
    /// requests whose latency is measured, [`InFlight::timed`]).
    pub(super) started: Vec<Vec<Instant>>,
    /// Per queue and buffer set: the request header put there for the
    /// request in flight, if its header is checked ([`src_checked`]).
    pub(super) hdr_put: Vec<Vec<[u8; OP_DATA_REQ_SIZE]>>,
    /// The run of requests being replayed (all requests in flight are
    /// its: each run ends drained).
    pub(super) cur: Option<&'a Prepared<'a>>,
    /// Per queue, buffer set and data buffer ([`data_buffers`]): the
    /// block signature of what the buffer is known to hold (the expected
    /// output of the last request checked there and found right, or the
    /// src of the last out-of-place request that read it), or None when
    /// not known.
    pub(super) dst_known: Vec<Vec<[Option<&'a [u32]>; 2]>>,
    pub(super) seq: u64,
    /// Completions per status byte (turned into `status_counts` at the end).
    pub(super) status_counts: [u64; 256],
    /// Each queue's guest memory (cloned once, not per completion; held
    /// by `replay`, so a completion's `&GuestMem` borrows nothing of the
    /// run).
    pub(super) mems: &'a [std::sync::Arc<crate::guest_mem::GuestMem>],
    pub(super) outcomes: Vec<(u64, Outcome)>,
    pub(super) bar: Option<indicatif::ProgressBar>,
    /// The completions [`Run::drain`] collects, kept between calls (one
    /// allocation per run, not one per drain).
    pub(super) done: Vec<Used>,
}

pub(super) fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the zeroed struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to a rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

impl<'a> Run<'a> {
    pub(super) fn mismatch(&mut self, line: usize, field: &str, expected: String, got: String) {
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

    pub(super) fn create(
        &mut self,
        line: usize,
        name: &str,
        key: &[u8],
        direction: Dir,
        expect_err: bool,
        alg_chain: Option<&AlgChainSession>,
    ) -> Result<(), Error> {
        let mut info = SymSessionInfo::aes_cbc(
            key,
            match direction {
                Dir::Encrypt => VIRTIO_CRYPTO_OP_ENCRYPT,
                Dir::Decrypt => VIRTIO_CRYPTO_OP_DECRYPT,
            },
        );
        if let Some(c) = alg_chain {
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
        let id = self.ctl.create_session(&info)?;
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
    pub(super) fn session_id(&self, req: &Req) -> u64 {
        match (&req.session, req.session_id) {
            (_, Some(id)) => id,
            (Some(name), None) => self.ids.get(name).copied().unwrap_or(0) as u64,
            (None, None) => 0,
        }
    }

    pub(super) fn drain(&mut self, q: usize, wait_all: bool) -> Result<(), Error> {
        // (Taken out of `self` for the loop, put back at the end; after an
        // error the next drain starts with a new one.)
        let mut done = std::mem::take(&mut self.done);
        loop {
            self.queues[q].publish_and_kick()?;
            done.clear();
            self.queues[q].reap(&mut done, self.opts.timeout)?;
            for &u in done.iter().take(PREFETCH_AHEAD) {
                self.prefetch(q, u);
            }
            for (k, &u) in done.iter().enumerate() {
                if let Some(&next) = done.get(k + PREFETCH_AHEAD) {
                    self.prefetch(q, next);
                }
                self.check(q, u);
            }
            if !wait_all || self.queues[q].in_flight() == 0 {
                self.done = done;
                return Ok(());
            }
        }
    }

    pub(super) fn requests(&mut self, p: &'a Prepared<'a>, rr: &mut usize) -> Result<(), Error> {
        self.cur = Some(p);
        let nq = self.queues.len();
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
                let dq = &self.queues[q];
                if let Some(l) = dq.layout_ahead(PREFETCH_AHEAD as u16, next.alternates()) {
                    dq.mem().prefetch_write(l.src, next.len as usize);
                    dq.mem().prefetch_write_byte(l.iv);
                }
            }
            let (slot, b) = loop {
                let dq = &self.queues[q];
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
            let alg_chain = p.alg_chain(i, h);
            let digest_len = alg_chain.map_or(0, |c| c.digest_len);
            let dq = &mut self.queues[q];
            let alternating = h.alternates() && dq.swaps();
            let placement = dq.placement(slot, h.in_place(), alternating);
            let swapped = placement == Placement::Swapped;
            let l = dq.set_layout(b).swapped_if(swapped);
            let (src_buf, dst_buf) = data_buffers(l);
            let mem = dq.mem();
            mem.write_array_if_changed(l.hdr, &hdr);
            mem.write(l.iv, p.iv(h));
            mem.write(l.src, p.src(h));
            if let Some(g) = dst_guard(l, h.len, h.in_place()) {
                mem.fill(g, GUARD_LEN, DST_CANARY);
            }
            // Not known again until this request is checked.
            let known = &mut self.dst_known[q][b];
            known[src_buf] = None;
            if !h.in_place() {
                let n = h.len as usize;
                let known = known[dst_buf].take();
                if h.has_dst() {
                    // Every output byte is compared with the expected one
                    // afterwards. A 16-byte block of dst that may already
                    // hold its expected bytes (going by what the buffer is
                    // known to hold, see `canary_where_same`) gets the
                    // canary, so a backend that does not write it is caught;
                    // the other blocks are left alone: writing them would
                    // pull their lines over to this CPU just before the
                    // backend writes them. When the buffer holds another
                    // output or a src of this run that covers every block
                    // of this one, and this one is marked distinct, no
                    // block can hold its expected bytes
                    // (`differs_everywhere`).
                    if !known.is_some_and(|k| p.differs_everywhere(k, h)) {
                        canary_where_same(mem, l.dst, known, p.sig(h), (h.dst_len as usize).min(n));
                    }
                } else {
                    mem.fill(l.dst, n, DST_CANARY);
                }
            }
            if let Some(c) = alg_chain {
                let n = c.digest_in.len().min(DIGEST_AREA);
                mem.write(l.digest, &c.digest_in[..n]);
                mem.fill(l.digest + n as u64, DIGEST_AREA - n, DST_CANARY);
            }
            put_status_area(mem, l);
            dq.submit_request_in(slot, b, h.iv_len, h.len, digest_len, placement);
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
            // one in 8 it is still 4 %.)
            let timed = self.time_all || in_hash_sample(seq);
            if timed {
                self.started[q][usize::from(slot)] = Instant::now();
            }
            self.inflight[q][usize::from(slot)] = Some(InFlight {
                seq,
                idx: i as u32,
                timed,
                swapped,
                alternating,
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
