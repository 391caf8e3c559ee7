// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A soak run: session slots created, drained and rekeyed while requests
//! of the others are in flight, requests reaped from every queue, and
//! each completion checked against the reference cipher, its used
//! element, and everything the device may not write.

use algorithms::Direction;
use vhost_user_crypto::wire::session::SymSessionInfo;
use vhost_user_crypto::wire::virtio_crypto::{
    Status, AES_CBC_IV_LEN, OP_DATA_REQ_SIZE, VIRTIO_CRYPTO_OP_DECRYPT, VIRTIO_CRYPTO_OP_ENCRYPT,
};
use zeroize::Zeroizing;

use super::requests::{readable_start, request_header};
use super::{Checked, SoakOptions, SoakReport, DST_CANARY, DST_GAP, MAX_DST_PIECES};
use crate::frontend::{CryptoFrontend, Error, Used};
use crate::replay::status_and_guard;
use crate::rng::{below, Rng as _, SplitMix64};
use crate::trace::ExpectStatus;

const MAX_REPORTED: usize = 10;

pub(super) struct SessSlot {
    pub(super) id: u64,
    pub(super) key: Zeroizing<Vec<u8>>,
    pub(super) dir: Direction,
    /// In flight per queue.
    pub(super) inflight: Vec<u32>,
    pub(super) draining: bool,
}

#[derive(Clone, Copy)]
pub(super) struct Pending {
    pub(super) seq: u64,
    /// Session slot, or `None` for a request naming a closed session.
    pub(super) sess: Option<u16>,
    pub(super) dir: Direction,
    pub(super) iv: [u8; 16],
    pub(super) len: u32,
    pub(super) head: u32,
    /// The session id the header names.
    pub(super) sid: u64,
    /// dst's pieces (bytes each), `DST_GAP` bytes apart.
    pub(super) dst_cuts: [u32; MAX_DST_PIECES],
    pub(super) dst_pieces: u8,
}

pub(super) struct Soak<'a, 'o> {
    pub(super) fe: &'a mut CryptoFrontend,
    pub(super) o: &'a SoakOptions,
    pub(super) rng: SplitMix64,
    pub(super) sess: Vec<SessSlot>,
    pub(super) closed: Vec<u64>,
    pub(super) pending: Vec<Vec<Option<Pending>>>,
    /// Source bytes per (queue, slot), kept for the check.
    pub(super) srcs: Vec<Vec<Vec<u8>>>,
    /// Per (queue, slot): the request's descriptors as this tool put them
    /// (see [`DescsPut`]), kept for the check.
    pub(super) descs_put: Vec<Vec<DescsPut>>,
    /// One bit per sequence number: completed.
    pub(super) ledger: Vec<u64>,
    pub(super) report: SoakReport,
    pub(super) observer: Option<&'o mut dyn FnMut(&Checked<'_>)>,
    pub(super) used: Vec<Used>,
    pub(super) expect: Vec<u8>,
    pub(super) got: Vec<u8>,
    pub(super) bar: Option<indicatif::ProgressBar>,
}

/// Where a request's descriptors are and their bytes as they were put
/// there: the ring's descriptors (the head, or the whole direct chain) and,
/// for an indirect request, its table. The device only reads them (virtio
/// 1.2 §2.7.5: the descriptor table is driver-written), so they must be
/// unchanged when the request completes.
#[derive(Default)]
pub(super) struct DescsPut {
    /// (guest address, length in bytes); the second is empty for a direct chain.
    pub(super) areas: [(u64, usize); 2],
    pub(super) bytes: Vec<u8>,
}

impl Soak<'_, '_> {
    pub(super) fn mismatch(&mut self, what: String) {
        self.report.mismatches += 1;
        if self.report.first_mismatches.len() < MAX_REPORTED {
            self.report.first_mismatches.push(what);
        }
    }

    pub(super) fn info(key: &[u8], dir: Direction) -> SymSessionInfo {
        SymSessionInfo::aes_cbc(
            key,
            match dir {
                Direction::Encrypt => VIRTIO_CRYPTO_OP_ENCRYPT,
                Direction::Decrypt => VIRTIO_CRYPTO_OP_DECRYPT,
            },
        )
    }

    /// Creates a session with a fresh key from the stream.
    pub(super) fn new_session(&mut self) -> Result<SessSlot, Error> {
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

    pub(super) fn in_flight_total(&self) -> u32 {
        self.fe.queues.iter().map(|q| u32::from(q.in_flight())).sum()
    }

    pub(super) fn publish_all(&mut self) -> Result<(), Error> {
        for q in &mut self.fe.queues {
            q.publish_and_kick()?;
        }
        Ok(())
    }

    pub(super) fn reap_ready(&mut self, q: usize) {
        let mut used = std::mem::take(&mut self.used);
        used.clear();
        self.fe.queues[q].try_reap(&mut used);
        for &u in &used {
            self.complete(q, u);
        }
        self.used = used;
    }

    pub(super) fn reap_ready_all(&mut self) {
        for q in 0..self.fe.queues.len() {
            self.reap_ready(q);
        }
    }

    pub(super) fn reap_blocking(&mut self, q: usize) -> Result<(), Error> {
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
    pub(super) fn room(&mut self, q: usize) -> Result<u16, Error> {
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

    pub(super) fn complete(&mut self, q: usize, u: Used) {
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
        let iv_ok = mem.view(at + OP_DATA_REQ_SIZE as u64, AES_CBC_IV_LEN as usize) == p.iv.as_slice();
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
    pub(super) fn wait_idle(&mut self, s: usize) -> Result<(), Error> {
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
    pub(super) fn rekey(&mut self, s: usize) -> Result<(), Error> {
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

    pub(super) fn drain(&mut self) -> Result<(), Error> {
        self.publish_all()?;
        for q in 0..self.fe.queues.len() {
            while self.fe.queues[q].in_flight() > 0 {
                self.reap_blocking(q)?;
            }
        }
        Ok(())
    }

    pub(super) fn run(&mut self) -> Result<(), Error> {
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
