// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The progress bar of long runs (replay and `soak`, on a terminal):
//! requests completed of the run's total, the rate and the time left.
//!
//! The rate is the requests completed since the bar started, over the
//! time since then, in requests/s with three significant digits
//! ([`rate`]). The bar starts when the run's requests are laid out, just
//! before the first one is sent, so loading the trace and laying out its
//! requests count neither as time nor as requests; the position moves
//! only when a request completes.

use std::fmt::Write as _;

use indicatif::{ProgressBar, ProgressState, ProgressStyle};

/// A bar of `total` requests, its clock started by this call.
pub fn bar(total: u64) -> ProgressBar {
    let b = ProgressBar::new(total);
    b.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} requests, {rate} requests/s, eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .with_key("rate", |s: &ProgressState, w: &mut dyn std::fmt::Write| {
                let secs = s.elapsed().as_secs_f64();
                let per_sec = if secs > 0.0 { s.pos() as f64 / secs } else { 0.0 };
                let _ = w.write_str(&rate(per_sec));
            }),
    );
    b
}

/// `per_sec` with three significant digits: `987`, `12.3 k`, `5.86 M`
/// (0 for a rate that is not finite or not positive).
pub fn rate(per_sec: f64) -> String {
    if !per_sec.is_finite() || per_sec <= 0.0 {
        return "0".into();
    }
    let three = |v: f64| match v {
        v if v >= 100.0 => format!("{v:.0}"),
        v if v >= 10.0 => format!("{v:.1}"),
        v => format!("{v:.2}"),
    };
    let mut s = String::new();
    let _ = match per_sec {
        r if r < 1e3 => write!(s, "{r:.0}"),
        r if r < 1e6 => write!(s, "{} k", three(r / 1e3)),
        r => write!(s, "{} M", three(r / 1e6)),
    };
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_have_three_significant_digits() {
        for (r, want) in [
            (0.0, "0"),
            (f64::NAN, "0"),
            (f64::INFINITY, "0"),
            (7.25, "7"),
            (987.4, "987"),
            (1_234.567_8, "1.23 k"),
            (12_345.6, "12.3 k"),
            (253_000.0, "253 k"),
            (5_860_000.0, "5.86 M"),
            (17_400_000.0, "17.4 M"),
        ] {
            assert_eq!(rate(r), want, "{r}");
        }
    }

    #[test]
    fn the_bar_counts_completions_only() {
        let b = bar(1000);
        b.set_draw_target(indicatif::ProgressDrawTarget::hidden());
        assert_eq!(b.position(), 0);
        b.inc(3);
        assert_eq!((b.position(), b.length()), (3, Some(1000)));
    }
}
