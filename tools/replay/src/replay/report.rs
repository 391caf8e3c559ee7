// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The result of a replay ([`Report`]) and the request-by-request
//! comparison of two backends' outcomes ([`compare_outcomes`]).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::trace::{hex, ExpectStatus};

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
    /// [`super::ReplayOptions::record`]; for comparing two backends).
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
    /// verify too, this project 1; `docs/PROTOCOL.md` §6, §9).
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

/// The summaries' throughput line: the rates, then the bytes and the
/// time they took, in ms when that rounds to under a second (a short
/// run would read "0.000 s").
pub(crate) fn throughput_line(ops_per_sec: f64, mib_per_sec: f64, bytes: u64, elapsed_s: f64) -> String {
    let took = if elapsed_s < 0.999_999_5 {
        format!("{:.3} ms", elapsed_s * 1e3)
    } else {
        format!("{elapsed_s:.3} s")
    };
    format!("throughput:  {ops_per_sec:.0} ops/s, {mib_per_sec:.2} MiB/s ({bytes} bytes in {took})\n")
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
        s += &throughput_line(self.ops_per_sec, self.mib_per_sec, self.bytes, self.elapsed_s);
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
    use super::throughput_line;

    #[test]
    fn the_throughput_line_gives_short_runs_in_ms() {
        assert_eq!(
            throughput_line(2_427_184.4, 592.6, 256_000, 0.000_412),
            "throughput:  2427184 ops/s, 592.60 MiB/s (256000 bytes in 0.412 ms)\n"
        );
        // 256 requests of 4 KiB in 2.5 s.
        assert_eq!(
            throughput_line(102.4, 0.4, 1 << 20, 2.5),
            "throughput:  102 ops/s, 0.40 MiB/s (1048576 bytes in 2.500 s)\n"
        );
        // Around a second: the unit follows the rounded figure.
        let took = |s| {
            throughput_line(1.0, 1.0, 1, s)
                .split(" in ")
                .nth(1)
                .unwrap()
                .to_string()
        };
        assert_eq!(took(0.999_999_4), "999.999 ms)\n");
        assert_eq!(took(0.999_999_6), "1.000 s)\n");
        assert_eq!(took(1.0), "1.000 s)\n");
    }
}
