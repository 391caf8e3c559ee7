// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Multi-buffer HMAC (`mac_multi_with`) on every engine this CPU runs:
//! RFC 2202 §3 and RFC 4231 §4 known answers typed in, and random batches
//! (mixed algorithms, keys and lengths, every length around the padding
//! boundaries) checked against the RustCrypto `hmac`/`sha1`/`sha2` crates
//! used directly.

mod common;
use common::*;

use algorithms::{mac_multi, mac_multi_with, sha_engine, MacAlg, MacJob, MacKey, ShaEngine, MAX_MAC_LANES};
use rand_core::SeedableRng as _;
use rand_xoshiro::SplitMix64;

fn engines() -> Vec<ShaEngine> {
    let e: Vec<_> = ShaEngine::available().collect();
    assert_eq!(e.first(), Some(&ShaEngine::Portable));
    e
}

/// One message of a batch: algorithm, key, data.
struct Msg {
    alg: MacAlg,
    key: Vec<u8>,
    data: Vec<u8>,
}

impl Msg {
    /// A message of `alg` with `len` random bytes under a random key of 0
    /// to 200 bytes (its length drawn first, then its bytes, then the
    /// data's).
    fn random(rng: &mut SplitMix64, alg: MacAlg, len: usize) -> Msg {
        let key_len = below(rng, 201);
        Msg {
            alg,
            key: bytes(rng, key_len),
            data: bytes(rng, len),
        }
    }
}

/// Runs `msgs` as one batch on `engine` and checks every tag (and the
/// zero bytes after it) against RustCrypto.
fn check_batch(engine: ShaEngine, msgs: &[Msg], what: &str) {
    let keys: Vec<MacKey> = msgs
        .iter()
        .map(|m| MacKey::new(m.alg, &m.key, m.alg.output_len()).unwrap())
        .collect();
    let mut jobs: Vec<MacJob<'_>> = msgs
        .iter()
        .zip(&keys)
        .map(|(m, k)| MacJob::new(k, &m.data))
        .collect();
    for j in &mut jobs {
        j.tag = [0xa5; 32];
    }
    mac_multi_with(engine, &mut jobs);
    for (i, (m, j)) in msgs.iter().zip(&jobs).enumerate() {
        let n = m.alg.output_len();
        let want = hmac_oracle(m.alg, &m.key, &m.data);
        assert_eq!(
            &j.tag[..n],
            &want[..],
            "{what}: {} job {i} of {}, {:?}, key {} B, data {} B",
            engine.name(),
            msgs.len(),
            m.alg,
            m.key.len(),
            m.data.len()
        );
        assert!(j.tag[n..].iter().all(|&b| b == 0), "{what}: bytes after the tag");
    }
}

#[test]
fn rfc_2202_and_4231_vectors_in_one_mixed_batch_on_every_engine() {
    // (algorithm, key, data, tag or its leftmost bytes as the RFC gives it)
    let sha1 = MacAlg::HmacSha1;
    let sha256 = MacAlg::HmacSha256;
    let long_data = b"This is a test using a larger than block-size key and a larger than block-size data. \
The key needs to be hashed before being used by the HMAC algorithm.";
    let cases: Vec<(MacAlg, Vec<u8>, Vec<u8>, &str)> = vec![
        (
            sha1,
            vec![0x0b; 20],
            b"Hi There".to_vec(),
            "b617318655057264e28bc0b6fb378c8ef146be00",
        ),
        (
            sha1,
            b"Jefe".to_vec(),
            b"what do ya want for nothing?".to_vec(),
            "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79",
        ),
        (
            sha1,
            vec![0xaa; 20],
            vec![0xdd; 50],
            "125d7342b9ac11cd91a39af48aa17b4f63f175d3",
        ),
        (
            sha1,
            (1..=25).collect(),
            vec![0xcd; 50],
            "4c9007f4026250c6bc8414f9bf50c86c2d7235da",
        ),
        (
            sha1,
            vec![0x0c; 20],
            b"Test With Truncation".to_vec(),
            "4c1a03424b55e07fe7f27be1d58bb9324a9a5a04",
        ),
        (
            sha1,
            vec![0xaa; 80],
            b"Test Using Larger Than Block-Size Key - Hash Key First".to_vec(),
            "aa4ae5e15272d00e95705637ce8a3b55ed402112",
        ),
        (
            sha1,
            vec![0xaa; 80],
            b"Test Using Larger Than Block-Size Key and Larger Than One Block-Size Data".to_vec(),
            "e8e99d0f45237d786d6bbaa7965c7808bbff1a91",
        ),
        (
            sha256,
            vec![0x0b; 20],
            b"Hi There".to_vec(),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7",
        ),
        (
            sha256,
            b"Jefe".to_vec(),
            b"what do ya want for nothing?".to_vec(),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
        ),
        (
            sha256,
            vec![0xaa; 20],
            vec![0xdd; 50],
            "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe",
        ),
        (
            sha256,
            (1..=25).collect(),
            vec![0xcd; 50],
            "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b",
        ),
        (
            sha256,
            vec![0x0c; 20],
            b"Test With Truncation".to_vec(),
            "a3b6167473100ee06e0c796c2955552b",
        ),
        (
            sha256,
            vec![0xaa; 131],
            b"Test Using Larger Than Block-Size Key - Hash Key First".to_vec(),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54",
        ),
        (
            sha256,
            vec![0xaa; 131],
            long_data.to_vec(),
            "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2",
        ),
    ];
    let keys: Vec<MacKey> = cases
        .iter()
        .map(|(alg, key, _, _)| MacKey::new(*alg, key, alg.output_len()).unwrap())
        .collect();
    for engine in engines() {
        let mut jobs: Vec<MacJob<'_>> = cases
            .iter()
            .zip(&keys)
            .map(|((_, _, data, _), k)| MacJob::new(k, data))
            .collect();
        mac_multi_with(engine, &mut jobs);
        for (j, (_, _, _, tag)) in jobs.iter().zip(&cases) {
            let want = hex(tag);
            assert_eq!(&j.tag[..want.len()], &want[..], "{}: {tag}", engine.name());
        }
        // Each vector alone too (a batch of one).
        for ((_, _, data, tag), k) in cases.iter().zip(&keys) {
            let mut one = [MacJob::new(k, data)];
            mac_multi_with(engine, &mut one);
            let want = hex(tag);
            assert_eq!(
                &one[0].tag[..want.len()],
                &want[..],
                "{} alone: {tag}",
                engine.name()
            );
        }
    }
}

#[test]
fn every_truncated_length_is_the_leftmost_bytes_of_the_tag() {
    let data = b"what do ya want for nothing?";
    for alg in [MacAlg::HmacSha1, MacAlg::HmacSha256] {
        let want = hmac_oracle(alg, b"Jefe", data);
        for n in 1..=alg.output_len() {
            let k = MacKey::new(alg, b"Jefe", n).unwrap();
            let mut out = [0u8; 40];
            assert_eq!(k.sign_into(data, &mut out), n);
            assert_eq!(&out[..n], &want[..n], "{alg:?} {n}");
            assert!(out[n..].iter().all(|&b| b == 0));
            let mut s = k.start();
            s.update(data);
            assert!(s.verify_truncated(&want[..n]), "{alg:?} {n}");
        }
    }
}

#[test]
fn every_length_around_the_padding_boundaries_on_every_engine() {
    let mut rng = SplitMix64::seed_from_u64(0x5eed_0001);
    // 0..=200 covers 55/56/64 (one or two final blocks) and their
    // multiples up to three blocks; then around 1500 B and 64 KiB.
    let lens: Vec<usize> = (0..=200).chain(1470..=1530).chain(65_470..=65_536).collect();
    for engine in engines() {
        for (b, chunk) in lens.chunks(MAX_MAC_LANES).enumerate() {
            let msgs: Vec<Msg> = chunk
                .iter()
                .enumerate()
                .map(|(i, &len)| {
                    let alg = if (b + i) % 2 == 0 {
                        MacAlg::HmacSha1
                    } else {
                        MacAlg::HmacSha256
                    };
                    Msg::random(&mut rng, alg, len)
                })
                .collect();
            check_batch(engine, &msgs, "boundary");
        }
    }
}

/// Batches whose messages' inner hashes take the same number of blocks
/// (the AVX-512 engine hashes inner and outer blocks in one kernel call
/// then), with different keys, 1 to 16 messages of one algorithm, the
/// blocks split differently between whole data blocks and padded final
/// blocks from message to message, and now and then one message of
/// another block count among them.
#[test]
fn batches_of_equal_block_counts_match_rustcrypto_on_every_engine() {
    let mut rng = SplitMix64::seed_from_u64(0x5eed_0004);
    for engine in engines() {
        for alg in [MacAlg::HmacSha1, MacAlg::HmacSha256] {
            for n in 1..=MAX_MAC_LANES {
                for whole in [0, 1, 3, 4, 23, 1023] {
                    let odd = n > 1 && below(&mut rng, 3) == 0;
                    let msgs: Vec<Msg> = (0..n)
                        .map(|i| {
                            // whole + 2 blocks to hash: `whole` data blocks
                            // and a tail of 55..=63 bytes (two padded final
                            // blocks), or one more data block and a tail of
                            // 0..=54 bytes (one).
                            let len = if below(&mut rng, 2) == 0 {
                                whole * 64 + 55 + below(&mut rng, 9)
                            } else {
                                (whole + 1) * 64 + below(&mut rng, 55)
                            };
                            let len = if odd && i == n / 2 { len + 128 } else { len };
                            Msg::random(&mut rng, alg, len)
                        })
                        .collect();
                    check_batch(engine, &msgs, &format!("{n} of {whole} blocks, odd {odd}"));
                }
            }
        }
    }
}

#[test]
fn random_batches_match_rustcrypto_on_every_engine() {
    let mut rng = SplitMix64::seed_from_u64(0x5eed_0002);
    for engine in engines() {
        for round in 0..200 {
            let n = 1 + below(&mut rng, MAX_MAC_LANES);
            // Per batch: one algorithm, or both mixed.
            let mode = below(&mut rng, 3);
            let msgs: Vec<Msg> = (0..n)
                .map(|_| {
                    let alg = match mode {
                        0 => MacAlg::HmacSha1,
                        1 => MacAlg::HmacSha256,
                        _ if below(&mut rng, 2) == 0 => MacAlg::HmacSha1,
                        _ => MacAlg::HmacSha256,
                    };
                    // Mostly packet sizes, now and then up to 64 KiB.
                    let len = match below(&mut rng, 10) {
                        0 => below(&mut rng, 65_537),
                        1..=3 => below(&mut rng, 130),
                        _ => below(&mut rng, 2049),
                    };
                    Msg::random(&mut rng, alg, len)
                })
                .collect();
            check_batch(engine, &msgs, &format!("round {round}"));
        }
    }
}

#[test]
fn batches_longer_than_max_lanes_and_the_process_engine_match_rustcrypto() {
    let mut rng = SplitMix64::seed_from_u64(0x5eed_0003);
    let msgs: Vec<Msg> = (0..MAX_MAC_LANES * 2 + 3)
        .map(|i| Msg {
            alg: if i % 3 == 0 {
                MacAlg::HmacSha256
            } else {
                MacAlg::HmacSha1
            },
            key: bytes(&mut rng, 20),
            data: bytes(&mut rng, 256 + i * 37),
        })
        .collect();
    for engine in engines() {
        check_batch(engine, &msgs, "long batch");
    }
    let keys: Vec<MacKey> = msgs
        .iter()
        .map(|m| MacKey::new(m.alg, &m.key, 12).unwrap())
        .collect();
    let mut jobs: Vec<MacJob<'_>> = msgs
        .iter()
        .zip(&keys)
        .map(|(m, k)| MacJob::new(k, &m.data))
        .collect();
    mac_multi(&mut jobs);
    for (m, j) in msgs.iter().zip(&jobs) {
        // Full-length tags whatever the key's digest length.
        assert_eq!(
            &j.tag[..m.alg.output_len()],
            &hmac_oracle(m.alg, &m.key, &m.data)[..]
        );
    }
    assert!(sha_engine().is_available());
    assert!(ShaEngine::detect().is_available());
}

#[test]
fn engine_names_round_trip_and_unknown_names_are_none() {
    for e in [
        ShaEngine::Portable,
        ShaEngine::ShaNi,
        ShaEngine::ShaNiX2,
        ShaEngine::ShaNiX4,
    ] {
        assert_eq!(ShaEngine::from_name(e.name()), Some(e));
    }
    assert_eq!(ShaEngine::from_name("shani"), Some(ShaEngine::ShaNi));
    assert_eq!(ShaEngine::from_name("portable"), Some(ShaEngine::Portable));
    assert_eq!(ShaEngine::from_name("avx512-x16"), Some(ShaEngine::Avx512X16));
    assert_eq!(ShaEngine::from_name("avx9000"), None);
    assert_eq!(ShaEngine::from_name(""), None);
}

#[test]
fn an_empty_batch_does_nothing() {
    for engine in engines() {
        mac_multi_with(engine, &mut []);
    }
}
