// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! HMAC-SHA1 and HMAC-SHA-256 on every SHA engine this CPU runs, 16
//! messages of 256 B and of 1500 B per batch, with the engines taking
//! turns: each round times 200 batches on every engine in a row, so load
//! from other processes hits all engines alike. Prints the median and the
//! best round in MB/s (message bytes), and, with both engines available,
//! how many messages one 16-lane AVX-512 call is worth on two SHA-NI
//! streams (best rounds: the call's time over SHA-NI's per message; the
//! 16-lane call costs about the same for fewer live lanes, so fewer
//! messages than that are faster on SHA-NI: `x16_min_jobs`). Then one
//! message at a time, `MacKey` against `ring::hmac`, taking turns the
//! same way.
//! `cargo bench -p algorithms --bench mac_alternate [-- ROUNDS]` (default 30).

use algorithms::{mac_multi_with, MacAlg, MacJob, MacKey, ShaEngine, MAX_MAC_LANES};
use std::time::Instant;
fn main() {
    // `cargo bench` passes `--bench`; a number sets the rounds.
    let rounds: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(30);
    let engines: Vec<ShaEngine> = ShaEngine::available().collect();
    for alg in [MacAlg::HmacSha1, MacAlg::HmacSha256] {
        let key = MacKey::new(alg, &[0x0b; 20], alg.output_len()).unwrap();
        for size in [256usize, 1500] {
            let bufs = vec![vec![0x5au8; size]; MAX_MAC_LANES];
            let mut best = vec![Vec::new(); engines.len()];
            for _ in 0..rounds {
                for (e, engine) in engines.iter().enumerate() {
                    let iters = 200;
                    let t = Instant::now();
                    for _ in 0..iters {
                        let mut jobs: [MacJob<'_>; MAX_MAC_LANES] =
                            std::array::from_fn(|i| MacJob::new(&key, &bufs[i]));
                        mac_multi_with(*engine, &mut jobs);
                        std::hint::black_box(&jobs[0].tag);
                    }
                    best[e].push(t.elapsed().as_nanos() as f64 / iters as f64);
                }
            }
            for (e, engine) in engines.iter().enumerate() {
                let v = &mut best[e];
                v.sort_by(|a, b| a.partial_cmp(b).unwrap());
                let med = v[v.len() / 2];
                let min = v[0];
                let mb = |ns: f64| (size * MAX_MAC_LANES) as f64 / ns * 1e3;
                println!(
                    "{alg:?} {size:5} {:11} median {:6.0} MB/s  best {:6.0} MB/s",
                    engine.name(),
                    mb(med),
                    mb(min)
                );
            }
            let at = |e: ShaEngine| engines.iter().position(|&x| x == e).map(|i| best[i][0]);
            if let (Some(x16), Some(ni)) = (at(ShaEngine::Avx512X16), at(ShaEngine::ShaNiX2)) {
                println!(
                    "{alg:?} {size:5} one avx512-x16 call = {:.1} messages on shani-x2",
                    x16 / (ni / MAX_MAC_LANES as f64)
                );
            }
        }
    }
    single(rounds);
}

/// One message at a time: `MacKey::sign_into` against `ring::hmac::sign`.
fn single(rounds: usize) {
    for alg in [MacAlg::HmacSha1, MacAlg::HmacSha256] {
        let key = MacKey::new(alg, &[0x0b; 20], alg.output_len()).unwrap();
        let ring_alg = match alg {
            MacAlg::HmacSha1 => ring::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY,
            MacAlg::HmacSha256 => ring::hmac::HMAC_SHA256,
        };
        let rkey = ring::hmac::Key::new(ring_alg, &[0x0b; 20]);
        for size in [64usize, 256, 1500, 16384] {
            let buf = vec![0x5au8; size];
            let iters = (1 << 22) / (size + 256);
            let mut t = [Vec::new(), Vec::new()];
            for _ in 0..rounds {
                let start = Instant::now();
                for _ in 0..iters {
                    std::hint::black_box(ring::hmac::sign(&rkey, std::hint::black_box(&buf)));
                }
                t[0].push(start.elapsed().as_nanos() as f64 / iters as f64);
                let start = Instant::now();
                for _ in 0..iters {
                    let mut out = [0u8; 32];
                    key.sign_into(std::hint::black_box(&buf), &mut out);
                    std::hint::black_box(out);
                }
                t[1].push(start.elapsed().as_nanos() as f64 / iters as f64);
            }
            for (name, v) in ["ring", "mackey"].iter().zip(t.iter_mut()) {
                v.sort_by(|a, b| a.partial_cmp(b).unwrap());
                let mb = |ns: f64| size as f64 / ns * 1e3;
                println!(
                    "{alg:?} single {size:5} {name:11} median {:6.0} MB/s  best {:6.0} MB/s",
                    mb(v[v.len() / 2]),
                    mb(v[0])
                );
            }
        }
    }
}
