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
//! through an observer (the CI soak, the `end_to_end` suite, checks them with
//! OpenSSL).
//!
//! This file holds the options, the report and the entry point
//! ([`soak`]); `requests.rs` generates each request and lays out its
//! descriptors, `run.rs` runs the stream (sessions, rekeys, reaping) and
//! checks every completion.

mod requests;
mod run;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use clap::ValueEnum;
use serde::Serialize;
use vhost_user_crypto::wire::session::SessionAbi;

use crate::frontend::{CryptoFrontend, DescMode, Error, FrontendConfig, DESCS_PER_REQUEST, MAX_QUEUE_SIZE};
use crate::rng;
use run::{DescsPut, Soak};

/// Written over each output buffer (and the 16 bytes after it) before submission.
pub const DST_CANARY: u8 = 0x5A;
/// Canary bytes between the pieces of a cut dst (so a device that writes
/// dst as one run from its first descriptor, ignoring the others'
/// addresses, is caught) and after its last piece.
const DST_GAP: u32 = 16;
/// Most pieces a dst is cut into ([`requests::Layout::IndirectCut`]).
const MAX_DST_PIECES: usize = 8;
/// Room in a slot's dst area past `max_size`: the gaps and the tail.
const DST_SLACK: usize = DST_GAP as usize * MAX_DST_PIECES;

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
        if self.max_size < 16 || !self.max_size.is_multiple_of(16) {
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
        s += &crate::replay::throughput_line(self.ops_per_sec, self.mib_per_sec, self.bytes, self.elapsed_s);
        if let Some(e) = &self.error {
            s += &format!("STOPPED:     {e}\n");
        }
        for m in &self.first_mismatches {
            s += &format!("MISMATCH {m}\n");
        }
        s
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
        bar: None,
    };
    for _ in 0..o.sessions {
        let s = run.new_session()?;
        run.sess.push(s);
    }
    // Started with the first request (see `crate::progress`).
    run.bar = (o.progress && o.count >= 10_000).then(|| crate::progress::bar(o.count));
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
