// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! One thread per data queue (`--queue-threads`): each queue is driven by
//! its own thread, as a multi-queue guest driver submits from several
//! vCPUs, while the session messages share the one connection.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use vhost_user_crypto::wire::session::SymSessionInfo;

use super::report::Report;
use super::run::cpu_seconds;
use super::{replay, replay_on, set_percentiles, ReplayOptions, Replayed};
use crate::frontend::{CryptoFrontend, DriverQueue, Error};
use crate::trace::{Req, Step, Trace};

/// How a run sends session messages: on a frontend it holds alone, or on
/// one that threads share (one message and its reply at a time).
pub(super) enum Ctl<'a> {
    /// The run's own frontend (raw requests are sent through it too).
    Own(&'a mut CryptoFrontend),
    /// A frontend shared with other threads.
    Shared(&'a dyn SharedSessions),
}

/// Session messages on a frontend that threads share.
pub(super) trait SharedSessions: Sync {
    fn create_session(&self, info: &SymSessionInfo) -> Result<i64, Error>;
    fn close_session(&self, id: u64) -> Result<(), Error>;
}

impl SharedSessions for Mutex<&mut CryptoFrontend> {
    fn create_session(&self, info: &SymSessionInfo) -> Result<i64, Error> {
        self.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .create_session(info)
    }

    fn close_session(&self, id: u64) -> Result<(), Error> {
        self.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .close_session(id)
    }
}

impl Ctl<'_> {
    pub(super) fn create_session(&mut self, info: &SymSessionInfo) -> Result<i64, Error> {
        match self {
            Ctl::Own(fe) => fe.create_session(info),
            Ctl::Shared(m) => m.create_session(info),
        }
    }

    pub(super) fn close_session(&mut self, id: u64) -> Result<(), Error> {
        match self {
            Ctl::Own(fe) => fe.close_session(id),
            Ctl::Shared(m) => m.close_session(id),
        }
    }

    /// The frontend, for a raw request: only a run's own.
    pub(super) fn frontend(&mut self) -> Result<&mut CryptoFrontend, Error> {
        match self {
            Ctl::Own(fe) => Ok(fe),
            Ctl::Shared(_) => Err(Error::Options(
                "raw requests cannot be replayed with one thread per queue".into(),
            )),
        }
    }
}

/// The part of `trace` that queue `q` of `nq` replays: every session step,
/// and the requests pinned to `q` or dealt to it round robin (request k of
/// the trace that names no queue goes to queue k % nq).
///
/// # Errors
/// [`Error::Options`] for a raw request or a request pinned to a queue
/// the frontend does not have.
fn split(trace: &Trace, nq: usize) -> Result<Vec<Trace>, Error> {
    let mut parts = vec![Trace::default(); nq];
    let mut rr = 0;
    for step in &trace.steps {
        match step {
            Step::Raw(r) => {
                return Err(Error::Options(format!(
                    "trace line {}: raw requests cannot be replayed with one thread per queue",
                    r.line
                )))
            }
            Step::Requests(v) => {
                let mut per: Vec<Vec<Req>> = vec![Vec::new(); nq];
                for r in v {
                    let q = match r.queue {
                        Some(q) if usize::from(q) < nq => usize::from(q),
                        Some(q) => {
                            return Err(Error::Options(format!(
                                "trace line {}: queue {q} with {nq} queues",
                                r.line
                            )))
                        }
                        None => {
                            let q = rr;
                            rr = (rr + 1) % nq;
                            q
                        }
                    };
                    per[q].push(Req {
                        queue: None,
                        ..r.clone()
                    });
                }
                for (p, v) in parts.iter_mut().zip(per) {
                    if !v.is_empty() {
                        p.steps.push(Step::Requests(v));
                    }
                }
            }
            other => parts.iter_mut().for_each(|p| p.steps.push(other.clone())),
        }
    }
    Ok(parts)
}

/// Replays `trace` `opts.repeat` times with one thread per data queue: the
/// requests are dealt to the queues as [`replay`] deals them (round robin
/// unless a request names its queue), and each thread creates and closes
/// its own sessions (the trace's session steps, on the shared connection)
/// and keeps up to `opts.queue_depth` requests in flight on its queue.
/// With one queue this is [`replay`].
///
/// The report sums the threads' counts; `elapsed_s` runs from the first
/// thread's first request to the last thread's last completion (ops/s
/// and MiB/s are over it: session messages of later passes included), the latency
/// percentiles are over every thread's measured requests, and `cpu_s` is
/// the whole process's.
///
/// # Errors
/// As [`replay`]; also [`Error::Options`] for a trace with raw requests or
/// with [`ReplayOptions::record`] (outcomes are kept per thread only).
pub fn replay_threads(fe: &mut CryptoFrontend, trace: &Trace, opts: &ReplayOptions) -> Result<Report, Error> {
    let nq = fe.queues.len();
    if nq < 2 {
        return replay(fe, trace, opts);
    }
    if opts.record {
        return Err(Error::Options(
            "outcomes are not recorded with one thread per queue".into(),
        ));
    }
    let parts = split(trace, nq)?;
    let opts = ReplayOptions {
        progress: false,
        ..opts.clone()
    };
    let mut per: Vec<Vec<DriverQueue>> = std::mem::take(&mut fe.queues)
        .into_iter()
        .map(|q| vec![q])
        .collect();
    let cpu0 = cpu_seconds();
    let ctl: Mutex<&mut CryptoFrontend> = Mutex::new(&mut *fe);
    let results: Vec<Result<Replayed, Error>> = std::thread::scope(|s| {
        let handles: Vec<_> = per
            .iter_mut()
            .zip(&parts)
            .map(|(queues, part)| {
                let (ctl, opts) = (&ctl, &opts);
                s.spawn(move || replay_on(Ctl::Shared(ctl), queues, part, opts))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    fe.queues = per.into_iter().flatten().collect();
    let mut r = Report::default();
    let mut lat = Vec::new();
    let mut window: Option<(Instant, Instant)> = None;
    let shut_here = Error::ShutHere.to_string();
    for res in results {
        let Replayed {
            report: t,
            latencies,
            window: w,
        } = res?;
        r.requests += t.requests;
        r.mismatches += t.mismatches;
        r.sessions_created += t.sessions_created;
        r.bytes += t.bytes;
        r.missing += t.missing;
        for (k, n) in t.status_counts {
            *r.status_counts.entry(k).or_default() += n;
        }
        let room = super::run::MAX_REPORTED.saturating_sub(r.first_mismatches.len());
        r.first_mismatches
            .extend(t.first_mismatches.into_iter().take(room));
        // The first queue's reason, unless it only says that another
        // queue's failure shut the connection down.
        if r.error.is_none() || (r.error.as_deref() == Some(shut_here.as_str()) && t.error.is_some()) {
            r.error = t.error;
        }
        lat.extend(latencies);
        if let Some((a, b)) = w {
            window = Some(window.map_or((a, b), |(wa, wb)| (wa.min(a), wb.max(b))));
        }
    }
    r.elapsed_s = window.map_or(Duration::ZERO, |(a, b)| b - a).as_secs_f64();
    if r.elapsed_s > 0.0 {
        r.ops_per_sec = r.requests as f64 / r.elapsed_s;
        r.mib_per_sec = r.bytes as f64 / (1 << 20) as f64 / r.elapsed_s;
    }
    r.cpu_s = cpu_seconds() - cpu0;
    set_percentiles(&mut r, lat);
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::unhex;

    #[test]
    fn requests_are_dealt_round_robin_and_session_steps_go_to_every_queue() {
        let t = Trace::parse(
            r#"{"op":"create_session","name":"s","algo":"aes-cbc","key":"000102030405060708090a0b0c0d0e0f","direction":"encrypt"}
{"op":"generate","session":"s","opcode":"encrypt","size":16,"count":5,"seed":1}
{"op":"request","session":"s","opcode":"encrypt","iv":"000102030405060708090a0b0c0d0e0f","src":"6bc1bee22e409f96e93d7e117393172a","queue":0,"expect":{"status":"ok","dst":"7649abac8119b246cee98e9b12e9197d"}}
{"op":"close_session","name":"s"}
"#
            .as_bytes(),
        )
        .unwrap();
        let parts = split(&t, 2).unwrap();
        let counts: Vec<usize> = parts.iter().map(Trace::requests).collect();
        // Requests 0, 2, 4 and the pinned one on queue 0; 1 and 3 on queue 1.
        assert_eq!(counts, [4, 2]);
        for p in &parts {
            assert!(matches!(p.steps.first(), Some(Step::Create { .. })));
            assert!(matches!(p.steps.last(), Some(Step::Close { .. })));
            for s in &p.steps {
                if let Step::Requests(v) = s {
                    assert!(v.iter().all(|r| r.queue.is_none()));
                }
            }
        }
        // The NIST SP 800-38A F.2.1 block stays on queue 0, the last request there.
        let Some(Step::Requests(q0)) = parts[0].steps.get(1) else {
            panic!("queue 0 has no requests")
        };
        assert_eq!(
            q0.last().unwrap().src,
            unhex("6bc1bee22e409f96e93d7e117393172a").unwrap()
        );
        let e = split(&t, 1).map(|p| p.len()).unwrap();
        assert_eq!(e, 1);
    }

    #[test]
    fn a_request_pinned_past_the_queues_is_refused() {
        let t = Trace::parse(
            r#"{"op":"create_session","name":"s","algo":"aes-cbc","key":"000102030405060708090a0b0c0d0e0f","direction":"encrypt"}
{"op":"request","session":"s","opcode":"encrypt","iv":"000102030405060708090a0b0c0d0e0f","src":"6bc1bee22e409f96e93d7e117393172a","queue":3,"expect":{"status":"ok","dst":"7649abac8119b246cee98e9b12e9197d"}}
"#
            .as_bytes(),
        )
        .unwrap();
        let e = split(&t, 2).unwrap_err().to_string();
        assert!(e.contains("trace line 2: queue 3 with 2 queues"), "{e}");
    }
}
