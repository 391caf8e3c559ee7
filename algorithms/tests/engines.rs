// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Every multi-buffer AES-CBC engine this CPU runs
//! ([`AesEngine::available`]): NIST SP 800-38A F.2.1/F.2.3/F.2.5 known
//! answers, and random batches against RustCrypto's `aes` + `cbc` used
//! directly (1 to `MAX_LANES` lanes, 0 to 64 KiB each, equal and ragged
//! lengths, all key sizes, in place and buffer to buffer).

mod common;
use common::*;

use algorithms::cipher::inout::InOutBuf;
use algorithms::{cbc_encrypt_multi_with, AesCbcKey, AesEngine, AesEngineChoice, Error, Lane, MAX_LANES};
use cbc::cipher::{BlockEncryptMut, KeyIvInit};
use rand_core::SeedableRng;
use rand_xoshiro::SplitMix64;

/// AES-CBC encryption of `data` (whole blocks) by RustCrypto's `cbc` over
/// `aes`, one message alone.
fn reference(key: &[u8], iv: &[u8; 16], data: &[u8]) -> Vec<u8> {
    fn run<C: BlockEncryptMut>(mut c: C, data: &[u8]) -> Vec<u8> {
        let mut out = data.to_vec();
        for b in out.chunks_exact_mut(16) {
            c.encrypt_block_mut(b.into());
        }
        out
    }
    match key.len() {
        16 => run(
            cbc::Encryptor::<aes::Aes128>::new_from_slices(key, iv).unwrap(),
            data,
        ),
        24 => run(
            cbc::Encryptor::<aes::Aes192>::new_from_slices(key, iv).unwrap(),
            data,
        ),
        32 => run(
            cbc::Encryptor::<aes::Aes256>::new_from_slices(key, iv).unwrap(),
            data,
        ),
        n => panic!("key of {n} bytes"),
    }
}

/// Messages of one batch and where each lane writes.
struct Batch {
    msgs: Vec<Vec<u8>>,
    ivs: Vec<[u8; 16]>,
    in_place: Vec<bool>,
}

/// Runs `batch` through `engine`; returns each lane's output, its IV
/// afterwards, and its input buffer afterwards.
#[allow(clippy::type_complexity)]
fn encrypt(engine: AesEngine, key: &AesCbcKey, batch: &Batch) -> (Vec<Vec<u8>>, Vec<[u8; 16]>, Vec<Vec<u8>>) {
    let mut ins = batch.msgs.clone();
    let mut outs: Vec<Vec<u8>> = batch.msgs.iter().map(|m| vec![0xee; m.len()]).collect();
    let ivs = {
        let mut lanes: Vec<Lane> = ins
            .iter_mut()
            .zip(outs.iter_mut())
            .zip(&batch.ivs)
            .zip(&batch.in_place)
            .map(|(((i, o), iv), &inpl)| Lane {
                iv: *iv,
                buf: if inpl {
                    i.as_mut_slice().into()
                } else {
                    InOutBuf::new(i, o).unwrap()
                },
            })
            .collect();
        cbc_encrypt_multi_with(engine, key, &mut lanes).unwrap();
        lanes.iter().map(|l| l.iv).collect::<Vec<_>>()
    };
    let got = ins
        .iter()
        .zip(&outs)
        .zip(&batch.in_place)
        .map(|((i, o), &inpl)| if inpl { i.clone() } else { o.clone() })
        .collect();
    (got, ivs, ins)
}

#[test]
fn every_engine_passes_nist_f21_f23_f25_in_every_lane() {
    let iv: [u8; 16] = hex("000102030405060708090a0b0c0d0e0f").try_into().unwrap();
    let pt = hex("6bc1bee22e409f96e93d7e117393172a ae2d8a571e03ac9c9eb76fac45af8e51
                  30c81c46a35ce411e5fbc1191a0a52ef f69f2445df4f9b17ad2b417be66c3710");
    let cases = [
        (
            "F.2.1 CBC-AES128.Encrypt",
            "2b7e151628aed2a6abf7158809cf4f3c",
            "7649abac8119b246cee98e9b12e9197d 5086cb9b507219ee95db113a917678b2
             73bed6b8e3c1743b7116e69e22229516 3ff1caa1681fac09120eca307586e1a7",
        ),
        (
            "F.2.3 CBC-AES192.Encrypt",
            "8e73b0f7da0e6452c810f32b809079e562f8ead2522c6b7b",
            "4f021db243bc633d7178183a9fa071e8 b4d9ada9ad7dedf4e5e738763f69145a
             571b242012fb7ae07fa9baac3df102e0 08b0e27988598881d920a9e64f5615cd",
        ),
        (
            "F.2.5 CBC-AES256.Encrypt",
            "603deb1015ca71be2b73aef0857d77811f352c073b6108d72d9810a30914dff4",
            "f58c4c04d6e5f1ba779eabfb5f7bfbd6 9cfc4e967edb808d679f777bc6702c7d
             39f23369a9d9bacfa530e26304231461 b2eb05e2c39be9fcda6c19078c6a9d1b",
        ),
    ];
    for engine in AesEngine::available() {
        for (name, key, ct) in cases {
            let k = AesCbcKey::new(&hex(key)).unwrap();
            let ct = hex(ct);
            for n in 1..=MAX_LANES {
                // The whole vector in every lane, then its 16/32/48/64-byte
                // prefixes (lanes of different lengths), each in place or
                // into a separate buffer, alternating.
                for prefixes in [false, true] {
                    let len = |i: usize| if prefixes { 16 * (1 + i % 4) } else { pt.len() };
                    let batch = Batch {
                        msgs: (0..n).map(|i| pt[..len(i)].to_vec()).collect(),
                        ivs: vec![iv; n],
                        in_place: (0..n).map(|i| (i + n) % 2 == 0).collect(),
                    };
                    let (got, ivs, ins) = encrypt(engine, &k, &batch);
                    for i in 0..n {
                        let l = len(i);
                        let what = format!("{engine} {name}: lane {i} of {n}, prefixes {prefixes}");
                        assert_eq!(got[i], ct[..l], "{what}");
                        assert_eq!(ivs[i][..], ct[l - 16..l], "{what}: chaining value");
                        if !batch.in_place[i] {
                            assert_eq!(ins[i], pt[..l], "{what}: input untouched");
                        }
                    }
                }
            }
        }
    }
}

/// A random length in whole blocks, 0 to 64 KiB, small ones more likely
/// (a power-of-two scale, then uniform below it).
fn random_len(rng: &mut SplitMix64) -> usize {
    let scale = 1usize << below(rng, 13); // 1..=4096 blocks
    16 * below(rng, scale + 1)
}

#[test]
fn every_engine_matches_rustcrypto_cbc_on_random_batches() {
    let mut rng = SplitMix64::seed_from_u64(0x5eed_0a35_cbc0_0016);
    for round in 0..240 {
        let keylen = [16, 24, 32][round % 3];
        let key_bytes = bytes(&mut rng, keylen);
        let key = AesCbcKey::new(&key_bytes).unwrap();
        let n = 1 + below(&mut rng, MAX_LANES);
        // Every third round all lanes have one length (no lane drops
        // out); otherwise lengths differ, and some lanes are empty.
        let equal = (round % 3 == 0).then(|| random_len(&mut rng));
        let msgs: Vec<Vec<u8>> = (0..n)
            .map(|_| {
                let len = match equal {
                    Some(len) => len,
                    None if below(&mut rng, 8) == 0 => 0,
                    None => random_len(&mut rng),
                };
                bytes(&mut rng, len)
            })
            .collect();
        let batch = Batch {
            ivs: (0..n).map(|_| bytes(&mut rng, 16).try_into().unwrap()).collect(),
            in_place: (0..n).map(|_| below(&mut rng, 2) == 0).collect(),
            msgs,
        };
        let expect: Vec<Vec<u8>> = batch
            .msgs
            .iter()
            .zip(&batch.ivs)
            .map(|(m, iv)| reference(&key_bytes, iv, m))
            .collect();
        for engine in AesEngine::available() {
            let (got, ivs, ins) = encrypt(engine, &key, &batch);
            for i in 0..n {
                let what = format!(
                    "round {round} {engine}: lane {i} of {n}, {} bytes, key {keylen}, in place {}",
                    batch.msgs[i].len(),
                    batch.in_place[i]
                );
                assert!(got[i] == expect[i], "{what}: ciphertext differs");
                let want = expect[i].last_chunk::<16>().unwrap_or(&batch.ivs[i]);
                assert_eq!(&ivs[i], want, "{what}: chaining value");
                if !batch.in_place[i] {
                    assert!(ins[i] == batch.msgs[i], "{what}: input changed");
                }
            }
        }
    }
}

/// Lanes cut from one buffer, back to back, so that a kernel reading or
/// writing past a lane's end would change its neighbour.
#[test]
fn every_engine_keeps_within_adjacent_lanes() {
    let mut rng = SplitMix64::seed_from_u64(0xad1a_ce47_0000_0001);
    for round in 0..60 {
        let keylen = [16, 24, 32][round % 3];
        let key_bytes = bytes(&mut rng, keylen);
        let key = AesCbcKey::new(&key_bytes).unwrap();
        let n = 1 + below(&mut rng, MAX_LANES);
        let lens: Vec<usize> = (0..n).map(|_| 16 * below(&mut rng, 40)).collect();
        let ivs: Vec<[u8; 16]> = (0..n).map(|_| bytes(&mut rng, 16).try_into().unwrap()).collect();
        let total: usize = lens.iter().sum();
        let src = bytes(&mut rng, total);
        let mut expect = Vec::new();
        let mut at = 0;
        for (len, iv) in lens.iter().zip(&ivs) {
            expect.extend(reference(&key_bytes, iv, &src[at..at + len]));
            at += len;
        }
        for engine in AesEngine::available() {
            let mut buf = src.clone();
            {
                let mut rest = buf.as_mut_slice();
                let mut lanes = Vec::new();
                for (len, iv) in lens.iter().zip(&ivs) {
                    let (lane, next) = std::mem::take(&mut rest).split_at_mut(*len);
                    rest = next;
                    lanes.push(Lane {
                        iv: *iv,
                        buf: lane.into(),
                    });
                }
                cbc_encrypt_multi_with(engine, &key, &mut lanes).unwrap();
            }
            assert!(buf == expect, "round {round} {engine}: lengths {lens:?}");
        }
    }
}

/// Lanes of 32 to 231 blocks whose buffers start 4 KiB apart (every
/// lane's block j in one L1 cache set: the `aesni` engine skews them), or
/// 4 KiB plus one cache line apart, in place or not, on every engine.
#[test]
fn every_engine_matches_rustcrypto_cbc_with_page_strided_lanes() {
    const PAGE: usize = 4096;
    let mut rng = SplitMix64::seed_from_u64(0x5eed_cafe_f00d_0016);
    for round in 0..48 {
        let keylen = [16, 24, 32][round % 3];
        let key_bytes = bytes(&mut rng, keylen);
        let key = AesCbcKey::new(&key_bytes).unwrap();
        let n = 1 + below(&mut rng, MAX_LANES);
        let in_place = round % 2 == 0;
        let stride = PAGE + if round % 4 < 2 { 0 } else { 64 };
        let lens: Vec<usize> = (0..n).map(|_| 16 * (32 + below(&mut rng, 200))).collect();
        let ivs: Vec<[u8; 16]> = (0..n).map(|_| bytes(&mut rng, 16).try_into().unwrap()).collect();
        let src = bytes(&mut rng, stride * n + PAGE);
        let base = |v: &[u8]| (PAGE - v.as_ptr() as usize % PAGE) % PAGE;
        for engine in AesEngine::available() {
            let mut s = src.clone();
            let mut d = vec![0u8; stride * n + PAGE];
            let (sb, db) = (base(&s), base(&d));
            let expect: Vec<Vec<u8>> = (0..n)
                .map(|i| reference(&key_bytes, &ivs[i], &s[sb + i * stride..][..lens[i]]))
                .collect();
            {
                let (mut s_rest, mut d_rest) = (&mut s[sb..], &mut d[db..]);
                let mut lanes = Vec::new();
                for i in 0..n {
                    let (s_lane, s_next) = std::mem::take(&mut s_rest).split_at_mut(stride);
                    let (d_lane, d_next) = std::mem::take(&mut d_rest).split_at_mut(stride);
                    (s_rest, d_rest) = (s_next, d_next);
                    let buf = if in_place {
                        InOutBuf::from(&mut s_lane[..lens[i]])
                    } else {
                        InOutBuf::new(&s_lane[..lens[i]], &mut d_lane[..lens[i]]).unwrap()
                    };
                    lanes.push(Lane { iv: ivs[i], buf });
                }
                cbc_encrypt_multi_with(engine, &key, &mut lanes).unwrap();
            }
            let (out, ob) = if in_place { (&s, sb) } else { (&d, db) };
            for i in 0..n {
                assert!(
                    out[ob + i * stride..][..lens[i]] == expect[i][..],
                    "round {round} {engine}: lane {i} of {n}, stride {stride}, in place {in_place}"
                );
            }
        }
    }
}

#[test]
fn engines_reject_too_many_lanes_and_partial_blocks() {
    let key = AesCbcKey::new(&[7; 16]).unwrap();
    for engine in AesEngine::available() {
        let mut bufs = vec![vec![0u8; 16]; MAX_LANES + 1];
        let mut lanes: Vec<Lane> = bufs
            .iter_mut()
            .map(|b| Lane {
                iv: [0; 16],
                buf: b.as_mut_slice().into(),
            })
            .collect();
        assert_eq!(
            cbc_encrypt_multi_with(engine, &key, &mut lanes),
            Err(Error::InvalidBufferLength(MAX_LANES + 1))
        );
        drop(lanes);
        assert!(
            bufs.iter().all(|b| b == &[0u8; 16]),
            "{engine}: nothing processed"
        );
        let mut odd = vec![1u8; 33];
        let mut lanes = vec![Lane {
            iv: [0; 16],
            buf: odd.as_mut_slice().into(),
        }];
        assert_eq!(
            cbc_encrypt_multi_with(engine, &key, &mut lanes),
            Err(Error::InvalidBufferLength(33))
        );
    }
}

#[test]
fn engines_this_cpu_cannot_run_are_refused() {
    let key = AesCbcKey::new(&[7; 16]).unwrap();
    for engine in AesEngine::ALL {
        let mut buf = [3u8; 32];
        let mut lanes = [Lane {
            iv: [0; 16],
            buf: buf.as_mut_slice().into(),
        }];
        let r = cbc_encrypt_multi_with(engine, &key, &mut lanes);
        if engine.is_supported() {
            assert_eq!(r, Ok(()));
        } else {
            assert_eq!(r, Err(Error::EngineUnavailable(engine.name())));
            assert_eq!(buf, [3u8; 32], "{engine}: nothing processed");
        }
    }
}

#[test]
fn engine_names_round_trip_and_detect_is_the_fastest_available() {
    let names: Vec<&str> = AesEngine::ALL.iter().map(|e| e.name()).collect();
    assert_eq!(names, ["soft", "aesni", "vaes256", "vaes512"]);
    for e in AesEngine::ALL {
        assert_eq!(AesEngine::from_name(e.name()), Some(e));
        assert_eq!(AesEngine::from_name(&e.name().to_uppercase()), Some(e));
    }
    assert_eq!(AesEngine::from_name("vaes1024"), None);
    let available = AesEngine::available();
    assert!(available.contains(&AesEngine::Soft));
    assert_eq!(Some(&AesEngine::detect()), available.last());
}

#[test]
fn an_engine_request_the_cpu_cannot_honour_falls_back_to_detect() {
    let none = AesEngineChoice::from_request(None);
    assert_eq!((none.engine, none.ignored), (AesEngine::detect(), false));
    let soft = AesEngineChoice::from_request(Some("soft"));
    assert_eq!((soft.engine, soft.ignored), (AesEngine::Soft, false));
    assert_eq!(soft.requested.as_deref(), Some("soft"));
    let bogus = AesEngineChoice::from_request(Some("rot13"));
    assert_eq!((bogus.engine, bogus.ignored), (AesEngine::detect(), true));
    for e in AesEngine::ALL {
        let c = AesEngineChoice::from_request(Some(e.name()));
        let want = if e.is_supported() { e } else { AesEngine::detect() };
        assert_eq!((c.engine, c.ignored), (want, !e.is_supported()), "{e}");
    }
}

#[test]
fn key_debug_output_shows_no_key_material() {
    let k = AesCbcKey::new(&[0x42; 32]).unwrap();
    let s = format!("{k:?}");
    assert_eq!(s, "AesCbcKey { bits: 256 }");
}

/// AES-CBC decryption of `data` (whole blocks) by RustCrypto's `cbc` over
/// `aes`, one message alone.
fn reference_decrypt(key: &[u8], iv: &[u8; 16], data: &[u8]) -> Vec<u8> {
    use cbc::cipher::BlockDecryptMut;
    fn run<C: BlockDecryptMut>(mut c: C, data: &[u8]) -> Vec<u8> {
        let mut out = data.to_vec();
        for b in out.chunks_exact_mut(16) {
            c.decrypt_block_mut(b.into());
        }
        out
    }
    match key.len() {
        16 => run(
            cbc::Decryptor::<aes::Aes128>::new_from_slices(key, iv).unwrap(),
            data,
        ),
        24 => run(
            cbc::Decryptor::<aes::Aes192>::new_from_slices(key, iv).unwrap(),
            data,
        ),
        32 => run(
            cbc::Decryptor::<aes::Aes256>::new_from_slices(key, iv).unwrap(),
            data,
        ),
        n => panic!("key of {n} bytes"),
    }
}

/// Decryption streams on the process-wide engine (VAES-512 where the CPU
/// has it) against RustCrypto's `cbc`: 0 to 64 KiB, cut into random pieces
/// of whole blocks, in place and buffer to buffer, all key sizes.
#[test]
fn decrypt_streams_match_rustcrypto_cbc_however_the_message_is_cut() {
    let mut rng = SplitMix64::seed_from_u64(0xdec0_de00_cbc0_0512);
    for round in 0..300 {
        let keylen = [16, 24, 32][round % 3];
        let key_bytes = bytes(&mut rng, keylen);
        let key = AesCbcKey::new(&key_bytes).unwrap();
        let iv: [u8; 16] = bytes(&mut rng, 16).try_into().unwrap();
        let len = random_len(&mut rng);
        let ct = bytes(&mut rng, len);
        let expect = reference_decrypt(&key_bytes, &iv, &ct);
        let in_place = round % 2 == 0;
        let mut buf = ct.clone();
        let mut out = vec![0u8; ct.len()];
        let mut stream = key.start(algorithms::Direction::Decrypt, &iv);
        let mut at = 0;
        while at < ct.len() {
            let n = (16 * (1 + below(&mut rng, 40))).min(ct.len() - at);
            if in_place {
                stream.process_in_place(&mut buf[at..at + n]).unwrap();
            } else {
                stream
                    .process_b2b(&buf[at..at + n], &mut out[at..at + n])
                    .unwrap();
            }
            at += n;
        }
        let got = if in_place { &buf } else { &out };
        assert!(
            got == &expect,
            "round {round}: {} bytes, key {keylen}, in place {in_place}",
            ct.len()
        );
        if !in_place {
            assert!(buf == ct, "round {round}: input changed");
        }
    }
}
