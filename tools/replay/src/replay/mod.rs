// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Replays a [`Trace`] through a [`CryptoFrontend`]: keeps up to the queue
//! depth of requests in flight per queue, checks every completion (status,
//! used length, output bytes, and that a failed request left its output
//! untouched) and measures throughput and latency.
//!
//! This file holds the entry point ([`replay`]) and its options;
//! `prepared.rs` lays a run of requests out for replaying, `run.rs` keeps
//! requests in flight (submission, draining), `check.rs` checks each
//! completion and owns the canaries and guards, `report.rs` the report
//! and the comparison of two backends' outcomes, `threads.rs` the
//! replay with one thread per queue ([`replay_threads`]).

mod check;
mod prepared;
mod report;
mod run;
mod threads;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use vhost_user_crypto::wire::virtio_crypto::OP_DATA_REQ_SIZE;

pub use check::{block_signature, DST_CANARY, GUARD_LEN, SRC_CHECK_ALL, SRC_CHECK_EVERY, STATUS_CANARY};
pub(crate) use check::{put_status_area, status_and_guard};
pub(crate) use report::throughput_line;
pub use report::{compare_outcomes, Comparison, Mismatch, Outcome, Report};
pub use threads::replay_threads;

use crate::frontend::{CryptoFrontend, DriverQueue, Error};
use crate::trace::{ExpectStatus, Step, Trace};
use prepared::{prepare, Prepared};
use run::{cpu_seconds, InFlight, Run};
use threads::Ctl;

/// Runs of at most this many requests (the trace's requests times
/// `--repeat`: the known-answer and policy traces) have every request's
/// latency measured; longer ones (benchmarks, where reading the clock
/// would slow the tool) one in 64 ([`check::in_hash_sample`]), evenly over the run.
const LATENCY_ALL_UP_TO: u64 = 4096;

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
    // The queues are handed to the run apart from the connection's
    // session messages (and back to the frontend for a raw request).
    let mut queues = std::mem::take(&mut fe.queues);
    let cpu0 = cpu_seconds();
    let out = replay_on(Ctl::Own(fe), &mut queues, trace, opts);
    fe.queues = queues;
    let Replayed {
        report: mut r,
        latencies,
        ..
    } = out?;
    r.cpu_s = cpu_seconds() - cpu0;
    set_percentiles(&mut r, latencies);
    Ok(r)
}

/// [`replay`] on `queues`, with session messages through `ctl`.
fn replay_on(
    ctl: Ctl<'_>,
    queues: &mut Vec<DriverQueue>,
    trace: &Trace,
    opts: &ReplayOptions,
) -> Result<Replayed, Error> {
    let total = trace.requests() as u64 * u64::from(opts.repeat);
    let slots: Vec<Vec<Option<InFlight>>> = queues.iter().map(|q| vec![None; usize::from(q.size)]).collect();
    let now = Instant::now();
    let started = queues.iter().map(|q| vec![now; usize::from(q.size)]).collect();
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
    let mems: Vec<_> = queues.iter().map(|q| q.mem_handle()).collect();
    let dst_known = queues
        .iter()
        .map(|q| vec![[None; 2]; usize::from(q.buffer_sets())])
        .collect();
    let hdr_put = queues
        .iter()
        .map(|q| vec![[0; OP_DATA_REQ_SIZE]; usize::from(q.buffer_sets())])
        .collect();
    // Started once the requests are laid out (see `crate::progress`).
    let bar = (opts.progress && total >= 10_000).then(|| crate::progress::bar(total));
    let mut run = Run {
        ctl,
        queues,
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
    let mut busy = Duration::ZERO;
    // When the first run of requests started and the last one ended.
    let mut window: Option<(Instant, Instant)> = None;
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
                if let Err(e) = run.ctl.close_session(id) {
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
                        alg_chain,
                    } => run.create(*line, name, key, *direction, *expect_err, alg_chain.as_ref())?,
                    Step::Raw(r) => {
                        let ids = &run.ids;
                        let lookup = |name: &str| ids.get(name).copied().unwrap_or(0) as u64;
                        let fe = run.ctl.frontend()?;
                        let t = Instant::now();
                        std::mem::swap(&mut fe.queues, run.queues);
                        let out = crate::raw::run_raw(fe, r, lookup, opts.timeout);
                        std::mem::swap(&mut fe.queues, run.queues);
                        busy += t.elapsed();
                        let out = out?;
                        // A raw request writes its buffer set's whole area.
                        for known in run.dst_known.iter_mut().flatten() {
                            *known = [None; 2];
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
                            run.ctl.close_session(id as u64)?;
                            run.live.retain(|&l| l != id as u64);
                        }
                    }
                    Step::Requests(v) => {
                        let Some(p) = &prepared[si] else {
                            return Ok(());
                        };
                        let t = Instant::now();
                        let done = run.requests(p, &mut rr);
                        let end = Instant::now();
                        busy += end - t;
                        window = Some((window.map_or(t, |w| w.0), end));
                        done?;
                        // Drained: the descriptors the requests used must
                        // still be as this tool wrote them.
                        let line = v.first().map_or(0, |r| r.line);
                        for q in 0..run.queues.len() {
                            if let Err(at) = run.queues[q].check_descs() {
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
    r.elapsed_s = busy.as_secs_f64();
    if r.elapsed_s > 0.0 {
        r.ops_per_sec = r.requests as f64 / r.elapsed_s;
        r.mib_per_sec = r.bytes as f64 / (1 << 20) as f64 / r.elapsed_s;
    }
    Ok(Replayed {
        report: r,
        latencies: run.latencies,
        window,
    })
}

/// What [`replay_on`] returns.
struct Replayed {
    /// The report, without `cpu_s` and the latency percentiles.
    report: Report,
    /// The latencies measured (µs).
    latencies: Vec<u32>,
    /// When the first run of requests started and the last one ended.
    window: Option<(Instant, Instant)>,
}

/// Sets `r.p50_us` and `r.p99_us` from the latencies measured (µs).
fn set_percentiles(r: &mut Report, mut lat: Vec<u32>) {
    if let Some(last) = lat.len().checked_sub(1) {
        // The values a full sort would put at these ranks, got by
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
}
