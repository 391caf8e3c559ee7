// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Cipher engines: single-stream AES-128-CBC encrypt and decrypt against
//! multi-buffer encrypt (8 messages interleaved), 64 B to 16 KiB per message.
//! Throughput is reported per message byte.

use algorithms::{cbc_encrypt_multi, AesCbcKey, Direction, Lane, MAX_LANES};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

const SIZES: [usize; 6] = [64, 256, 1024, 2048, 4096, 16384];

fn engines(c: &mut Criterion) {
    let key = AesCbcKey::new(&[0x2b; 16]).unwrap();
    let iv = [7u8; 16];
    let mut g = c.benchmark_group("aes128-cbc");
    for size in SIZES {
        g.throughput(Throughput::Bytes((size * MAX_LANES) as u64));
        let mut bufs = vec![vec![0x5au8; size]; MAX_LANES];
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
            |b, _| {
                b.iter(|| {
                    let mut lanes: Vec<Lane> = bufs
                        .iter_mut()
                        .map(|buf| Lane {
                            iv,
                            buf: buf.as_mut_slice().into(),
                        })
                        .collect();
                    cbc_encrypt_multi(&key, &mut lanes).unwrap();
                })
            },
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
}

criterion_group!(benches, engines);
criterion_main!(benches);
