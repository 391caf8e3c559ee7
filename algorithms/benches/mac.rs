// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! HMAC-SHA1 and HMAC-SHA-256: 16 messages of 256 B and of 1500 B per
//! iteration on every SHA engine this CPU runs (`mac_multi_with`), and one
//! message at a time through `MacKey` against `ring::hmac`, 64 B to
//! 16 KiB. Throughput is reported per message byte.

use algorithms::{mac_multi_with, MacAlg, MacJob, MacKey, ShaEngine, MAX_MAC_LANES};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::time::Duration;

const ALGS: [(MacAlg, &str); 2] = [
    (MacAlg::HmacSha1, "hmac-sha1"),
    (MacAlg::HmacSha256, "hmac-sha256"),
];

fn multi(c: &mut Criterion) {
    for (alg, name) in ALGS {
        let mut g = c.benchmark_group(format!("{name}-x16"));
        let key = MacKey::new(alg, &[0x0b; 20], alg.output_len()).unwrap();
        for size in [256, 1500] {
            g.throughput(Throughput::Bytes((size * MAX_MAC_LANES) as u64));
            let bufs = vec![vec![0x5au8; size]; MAX_MAC_LANES];
            for engine in ShaEngine::available() {
                g.bench_with_input(BenchmarkId::new(engine.name(), size), &size, |b, _| {
                    b.iter(|| {
                        let mut jobs: [MacJob<'_>; MAX_MAC_LANES] =
                            std::array::from_fn(|i| MacJob::new(&key, &bufs[i]));
                        mac_multi_with(engine, &mut jobs);
                        jobs[0].tag[0]
                    })
                });
            }
        }
        g.finish();
    }
}

fn single(c: &mut Criterion) {
    for (alg, name) in ALGS {
        let mut g = c.benchmark_group(format!("{name}-single"));
        let key = MacKey::new(alg, &[0x0b; 20], alg.output_len()).unwrap();
        let rkey = ring::hmac::Key::new(
            match alg {
                MacAlg::HmacSha1 => ring::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY,
                MacAlg::HmacSha256 => ring::hmac::HMAC_SHA256,
            },
            &[0x0b; 20],
        );
        for size in [64, 256, 1500, 16384] {
            g.throughput(Throughput::Bytes(size as u64));
            let buf = vec![0x5au8; size];
            g.bench_with_input(BenchmarkId::new("ring", size), &size, |b, _| {
                b.iter(|| ring::hmac::sign(&rkey, &buf).as_ref()[0])
            });
            g.bench_with_input(BenchmarkId::new("mackey", size), &size, |b, _| {
                b.iter(|| {
                    let mut out = [0u8; 32];
                    key.sign_into(&buf, &mut out);
                    out[0]
                })
            });
        }
        g.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20);
    targets = multi, single
}
criterion_main!(benches);
