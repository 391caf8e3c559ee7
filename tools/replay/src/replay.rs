// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Replays a [`Trace`] through a [`CryptoFrontend`]: keeps up to the queue
//! depth of requests in flight per queue, checks every completion (status,
//! used length, output bytes, and that a failed request left its output
//! untouched) and measures throughput and latency.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use serde::Serialize;
use vhost_user_crypto::session_msg::SymSessionInfo;
use vhost_user_crypto::wire::{OpDataReq, VIRTIO_CRYPTO_CIPHER_AES_CBC};

use crate::frontend::{CryptoFrontend, Error, Used};
use crate::trace::{hex, Dir, ExpectStatus, Req, Step, Trace};

/// Canary written over every output buffer before a request is submitted.
pub const DST_CANARY: u8 = 0xA5;
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
    /// Median latency, µs (submit to reap).
    pub p50_us: f64,
    /// 99th percentile latency, µs.
    pub p99_us: f64,
    /// CPU seconds used by this tool (user + system).
    pub cpu_s: f64,
    /// The first few mismatches.
    pub first_mismatches: Vec<Mismatch>,
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
}

const MAX_REPORTED: usize = 10;

struct Run<'a> {
    fe: &'a mut CryptoFrontend,
    opts: &'a ReplayOptions,
    report: Report,
    ids: HashMap<String, i64>,
    latencies: Vec<u32>,
    inflight: Vec<Vec<Option<(&'a Req, Instant)>>>,
    bar: Option<indicatif::ProgressBar>,
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
    ) -> Result<(), Error> {
        let mut info = SymSessionInfo {
            cipher_alg: VIRTIO_CRYPTO_CIPHER_AES_CBC,
            key_len: key.len() as u32,
            op_type: 1,
            direction: match direction {
                Dir::Encrypt => 1,
                Dir::Decrypt => 2,
            },
            ..Default::default()
        };
        let n = key.len().min(info.cipher_key.len());
        info.cipher_key[..n].copy_from_slice(&key[..n]);
        let id = self.fe.create_session(&info)?;
        self.report.sessions_created += u64::from(id > 0);
        match (expect_err, id < 0) {
            (false, true) => self.mismatch(line, "session id", "≥ 1".into(), id.to_string()),
            (true, false) => self.mismatch(line, "session id", "< 0".into(), id.to_string()),
            _ => {}
        }
        if id > 0 {
            self.ids.insert(name.to_string(), id);
        }
        Ok(())
    }

    fn check(&mut self, q: usize, u: Used) {
        let Some((req, t0)) = self.inflight[q]
            .get_mut(usize::from(u.slot))
            .and_then(Option::take)
        else {
            self.mismatch(
                0,
                "used id",
                "a request in flight".into(),
                format!("slot {}", u.slot),
            );
            return;
        };
        self.latencies
            .push(t0.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
        self.report.requests += 1;
        self.report.bytes += req.src.len() as u64;
        if let Some(b) = &self.bar {
            b.inc(1);
        }
        let l = self.fe.queues[q].layout(u.slot);
        let mut dst = vec![0u8; req.src.len()];
        let status = {
            let mem = self.fe.queues[q].mem();
            mem.read(l.dst, &mut dst);
            mem.read_u8(l.status)
        };
        *self
            .report
            .status_counts
            .entry(ExpectStatus::name(status))
            .or_default() += 1;
        if status != req.status.byte() {
            self.mismatch(
                req.line,
                "status",
                ExpectStatus::name(req.status.byte()),
                ExpectStatus::name(status),
            );
            return;
        }
        let want_len = if req.status == ExpectStatus::Ok {
            req.src.len() as u32 + 1
        } else {
            1
        };
        if u.len != want_len {
            self.mismatch(req.line, "used length", want_len.to_string(), u.len.to_string());
        }
        if req.status == ExpectStatus::Ok {
            if let Some(want) = &req.dst {
                if &dst != want {
                    let at = dst.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
                    let end = (at + 16).min(dst.len());
                    self.mismatch(
                        req.line,
                        &format!("dst[{at}..{end}]"),
                        hex(&want[at..end.min(want.len())]),
                        hex(&dst[at..end]),
                    );
                }
            }
        } else if dst.iter().any(|&b| b != DST_CANARY) {
            self.mismatch(
                req.line,
                "dst (must be untouched on error)",
                "unchanged".into(),
                "written".into(),
            );
        }
    }

    fn drain(&mut self, q: usize, wait_all: bool) -> Result<(), Error> {
        let mut done = Vec::with_capacity(64);
        loop {
            self.fe.queues[q].publish_and_kick()?;
            done.clear();
            self.fe.queues[q].reap(&mut done, self.opts.timeout)?;
            for &u in &done {
                self.check(q, u);
            }
            if !wait_all || self.fe.queues[q].in_flight() == 0 {
                return Ok(());
            }
        }
    }

    fn requests(&mut self, reqs: &'a [Req], rr: &mut usize) -> Result<(), Error> {
        let nq = self.fe.queues.len();
        for req in reqs {
            let q = match req.queue {
                Some(q) if usize::from(q) < nq => usize::from(q),
                Some(q) => {
                    self.mismatch(req.line, "queue", format!("< {nq}"), q.to_string());
                    continue;
                }
                None => {
                    *rr += 1;
                    (*rr - 1) % nq
                }
            };
            let slot = loop {
                let dq = &self.fe.queues[q];
                if dq.in_flight() < self.opts.queue_depth {
                    if let Some(s) = dq.next_slot() {
                        break s;
                    }
                }
                self.drain(q, false)?;
            };
            let sid = match (&req.session, req.session_id) {
                (_, Some(id)) => id,
                (Some(name), None) => self.ids.get(name).copied().unwrap_or(0) as u64,
                (None, None) => 0,
            };
            let hdr = OpDataReq {
                opcode: match req.opcode {
                    Dir::Encrypt => 0,
                    Dir::Decrypt => 1,
                },
                algo: 0,
                session_id: sid,
                op_type: 1,
                iv_len: req.iv.len() as u32,
                src_data_len: req.src.len() as u32,
                dst_data_len: req.src.len() as u32,
            };
            let dq = &mut self.fe.queues[q];
            let l = dq.layout(slot);
            let mem = dq.mem();
            mem.write(l.hdr, &hdr.to_bytes());
            mem.write(l.iv, &req.iv);
            mem.write(l.src, &req.src);
            mem.fill(l.dst, req.src.len(), DST_CANARY);
            mem.write(l.status, &[STATUS_CANARY]);
            dq.submit(slot, req.iv.len() as u32, req.src.len() as u32);
            self.inflight[q][usize::from(slot)] = Some((req, Instant::now()));
            if dq.next_slot().is_none() || dq.in_flight() >= self.opts.queue_depth {
                self.drain(q, false)?;
            }
        }
        for q in 0..nq {
            self.drain(q, true)?;
        }
        Ok(())
    }
}

/// Replays `trace` `opts.repeat` times.
///
/// # Errors
/// Transport failures (a mismatch is not an error: see [`Report`]).
pub fn replay(fe: &mut CryptoFrontend, trace: &Trace, opts: &ReplayOptions) -> Result<Report, Error> {
    let total = trace.requests() as u64 * u64::from(opts.repeat);
    let slots: Vec<Vec<Option<(&Req, Instant)>>> = fe
        .queues
        .iter()
        .map(|q| vec![None; usize::from(q.size)])
        .collect();
    let bar = (opts.progress && total >= 10_000).then(|| {
        let b = indicatif::ProgressBar::new(total);
        b.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} requests {per_sec} eta {eta}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    });
    let mut run = Run {
        fe,
        opts,
        report: Report::default(),
        ids: HashMap::new(),
        latencies: Vec::with_capacity(total.min(50_000_000) as usize),
        inflight: slots,
        bar,
    };
    let cpu0 = cpu_seconds();
    let mut busy = Duration::ZERO;
    let mut rr = 0usize;
    for _ in 0..opts.repeat {
        for step in &trace.steps {
            match step {
                Step::Create {
                    line,
                    name,
                    key,
                    direction,
                    expect_err,
                } => run.create(*line, name, key, *direction, *expect_err)?,
                Step::Raw(r) => {
                    let ids = &run.ids;
                    let lookup = |name: &str| ids.get(name).copied().unwrap_or(0) as u64;
                    let t = Instant::now();
                    let out = crate::raw::run_raw(run.fe, r, lookup, opts.timeout)?;
                    busy += t.elapsed();
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
                    }
                }
                Step::Requests(reqs) => {
                    let t = Instant::now();
                    run.requests(reqs, &mut rr)?;
                    busy += t.elapsed();
                }
            }
        }
    }
    if let Some(b) = &run.bar {
        b.finish_and_clear();
    }
    let mut r = run.report;
    r.cpu_s = cpu_seconds() - cpu0;
    r.elapsed_s = busy.as_secs_f64();
    if r.elapsed_s > 0.0 {
        r.ops_per_sec = r.requests as f64 / r.elapsed_s;
        r.mib_per_sec = r.bytes as f64 / (1 << 20) as f64 / r.elapsed_s;
    }
    let mut lat = run.latencies;
    lat.sort_unstable();
    let pct = |p: f64| -> f64 {
        if lat.is_empty() {
            0.0
        } else {
            f64::from(lat[((lat.len() - 1) as f64 * p).round() as usize])
        }
    };
    r.p50_us = pct(0.50);
    r.p99_us = pct(0.99);
    Ok(r)
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
        for m in &self.first_mismatches {
            s += &format!(
                "MISMATCH trace line {}: {}: expected {}, got {}\n",
                m.line, m.field, m.expected, m.got
            );
        }
        s
    }
}
