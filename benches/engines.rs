// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Cipher engines: single-stream AES-128-CBC encrypt and decrypt against
//! multi-buffer encrypt on the process-wide engine (8 messages), 64 B to
//! 16 KiB per message; then multi-buffer encrypt of [`MAX_LANES`] messages
//! on every engine this CPU runs ([`AesEngine::available`]), the engines
//! alternating at each size. Throughput is reported per message byte.
//!
//! Single-stream decryption runs on VAES-512 when that is the process-wide
//! engine; `VHOST_USER_CRYPTO_AES_ENGINE=aesni` measures the `aes` crate's.

use algorithms::{
    cbc_encrypt_multi, cbc_encrypt_multi_with, AesCbcKey, AesEngine, Direction, Lane, MAX_LANES,
};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

const SIZES: [usize; 6] = [64, 256, 1024, 2048, 4096, 16384];

/// Messages per iteration of the first group (`tools/bench/compare.sh`
/// reads its `encrypt-single-stream-x8` results).
const MESSAGES: usize = 8;

/// Message sizes of the per-engine comparison.
const ENGINE_SIZES: [usize; 4] = [256, 1024, 2048, 16384];

fn lanes(bufs: &mut [Vec<u8>], iv: [u8; 16]) -> Vec<Lane<'_>> {
    bufs.iter_mut()
        .map(|buf| Lane {
            iv,
            buf: buf.as_mut_slice().into(),
        })
        .collect()
}

fn engines(c: &mut Criterion) {
    let key = AesCbcKey::new(&[0x2b; 16]).unwrap();
    let iv = [7u8; 16];
    let mut g = c.benchmark_group("aes128-cbc");
    for size in SIZES {
        g.throughput(Throughput::Bytes((size * MESSAGES) as u64));
        let mut bufs = vec![vec![0x5au8; size]; MESSAGES];
        g.bench_with_input(
            BenchmarkId::new("encrypt-single-stream-x8", size),
            &size,
            |b, _| {
                b.iter(|| {
                    for buf in bufs.iter_mut() {
                        key.start(Direction::Encrypt, &iv).process_in_place(buf).unwrap();
                    }
                })
            },
        );
        g.bench_with_input(
            BenchmarkId::new("encrypt-multi-buffer-8-lanes", size),
            &size,
            |b, _| b.iter(|| cbc_encrypt_multi(&key, &mut lanes(&mut bufs, iv)).unwrap()),
        );
        g.bench_with_input(
            BenchmarkId::new("decrypt-single-stream-x8", size),
            &size,
            |b, _| {
                b.iter(|| {
                    for buf in bufs.iter_mut() {
                        key.start(Direction::Decrypt, &iv).process_in_place(buf).unwrap();
                    }
                })
            },
        );
    }
    g.finish();

    // Each engine on MAX_LANES lanes, the engines alternating at each size.
    let mut g = c.benchmark_group(format!("aes128-cbc-encrypt-{MAX_LANES}-lanes"));
    for size in ENGINE_SIZES {
        g.throughput(Throughput::Bytes((size * MAX_LANES) as u64));
        let mut bufs = vec![vec![0x5au8; size]; MAX_LANES];
        for engine in AesEngine::available() {
            g.bench_with_input(BenchmarkId::new(engine.name(), size), &size, |b, _| {
                b.iter(|| cbc_encrypt_multi_with(engine, &key, &mut lanes(&mut bufs, iv)).unwrap())
            });
        }
    }
    g.finish();

    // The same with every lane at the start of its own 4 KiB page (as
    // guest buffers often are): block j of all lanes in one L1 set.
    let mut g = c.benchmark_group(format!("aes128-cbc-encrypt-{MAX_LANES}-page-aligned-lanes"));
    const PAGE: usize = 4096;
    let mut area = vec![0x5au8; (MAX_LANES + 1) * 4 * PAGE];
    let base = (PAGE - area.as_ptr() as usize % PAGE) % PAGE;
    for size in [1024, 2048] {
        g.throughput(Throughput::Bytes((size * MAX_LANES) as u64));
        for engine in AesEngine::available() {
            g.bench_with_input(BenchmarkId::new(engine.name(), size), &size, |b, _| {
                b.iter(|| {
                    let mut lanes: Vec<Lane> = area[base..]
                        .chunks_mut(PAGE)
                        .take(MAX_LANES)
                        .map(|p| Lane {
                            iv,
                            buf: (&mut p[..size]).into(),
                        })
                        .collect();
                    cbc_encrypt_multi_with(engine, &key, &mut lanes).unwrap()
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, engines);
criterion_main!(benches);
