// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Multi-buffer CBC encryption: NIST SP 800-38A known answers, and a
//! differential test against the single-stream path over random batches
//! (lane counts, lengths, key sizes, in place and buffer to buffer).

mod common;
use common::hex;

use algorithms::cipher::inout::InOutBuf;
use algorithms::{cbc_encrypt_multi, AesCbcKey, Direction, Error, Lane, MAX_LANES};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

#[test]
fn nist_f21_f23_f25_in_every_lane() {
    let iv: [u8; 16] = hex("000102030405060708090a0b0c0d0e0f").try_into().unwrap();
    let pt = hex("6bc1bee22e409f96e93d7e117393172aae2d8a571e03ac9c9eb76fac45af8e51
                  30c81c46a35ce411e5fbc1191a0a52eff69f2445df4f9b17ad2b417be66c3710");
    for (key, ct) in [
        ("2b7e151628aed2a6abf7158809cf4f3c",
         "7649abac8119b246cee98e9b12e9197d5086cb9b507219ee95db113a917678b273bed6b8e3c1743b7116e69e222295163ff1caa1681fac09120eca307586e1a7"),
        ("8e73b0f7da0e6452c810f32b809079e562f8ead2522c6b7b",
         "4f021db243bc633d7178183a9fa071e8b4d9ada9ad7dedf4e5e738763f69145a571b242012fb7ae07fa9baac3df102e008b0e27988598881d920a9e64f5615cd"),
        ("603deb1015ca71be2b73aef0857d77811f352c073b6108d72d9810a30914dff4",
         "f58c4c04d6e5f1ba779eabfb5f7bfbd69cfc4e967edb808d679f777bc6702c7d39f23369a9d9bacfa530e26304231461b2eb05e2c39be9fcda6c19078c6a9d1b"),
    ] {
        let k = AesCbcKey::new(&hex(key)).unwrap();
        let ct = hex(ct);
        // MAX_LANES lanes holding the vector and its 16/32/48-byte
        // prefixes (lanes of different lengths), then MAX_LANES whole
        // vectors (equal lengths), in place and from one buffer into
        // another, on the process-wide engine.
        for (layout, in_place) in [("prefixes", true), ("whole", true), ("whole", false)] {
            let len = |i: usize| if layout == "whole" { pt.len() } else { 16 * (1 + i % 4) };
            let src: Vec<Vec<u8>> = (0..MAX_LANES).map(|i| pt[..len(i)].to_vec()).collect();
            let mut bufs = src.clone();
            let mut outs: Vec<Vec<u8>> = src.iter().map(|b| vec![0u8; b.len()]).collect();
            let mut lanes: Vec<Lane> = if in_place {
                bufs.iter_mut().map(|b| Lane { iv, buf: b.as_mut_slice().into() }).collect()
            } else {
                src.iter()
                    .zip(outs.iter_mut())
                    .map(|(i, o)| Lane { iv, buf: InOutBuf::new(i, o).unwrap() })
                    .collect()
            };
            cbc_encrypt_multi(&k, &mut lanes).unwrap();
            let ivs: Vec<[u8; 16]> = lanes.iter().map(|l| l.iv).collect();
            drop(lanes);
            let got = if in_place { &bufs } else { &outs };
            for (i, b) in got.iter().enumerate() {
                assert_eq!(b.len(), len(i));
                assert_eq!(b[..], ct[..b.len()], "{key} {layout} in place {in_place}: lane {i}");
                assert_eq!(ivs[i][..], ct[b.len() - 16..b.len()], "chaining value of lane {i}");
            }
            if !in_place {
                assert_eq!(bufs, src, "inputs untouched");
            }
        }
    }
}

#[test]
fn matches_single_stream_on_random_batches() {
    let mut rng = Rng(0x0123_4567_89ab_cdef);
    for round in 0..400 {
        let keylen = [16, 24, 32][round % 3];
        let key = AesCbcKey::new(&rng.bytes(keylen)).unwrap();
        let lanes_n = 1 + (rng.next() as usize % MAX_LANES);
        let in_place = rng.next().is_multiple_of(2);
        // Every fourth round all lanes have one length (the equal-length
        // loop); otherwise lengths differ.
        let same = (round % 4 == 3).then(|| 1 + rng.next() as usize % 39);
        let msgs: Vec<(Vec<u8>, [u8; 16])> = (0..lanes_n)
            .map(|_| {
                let blocks = same.unwrap_or(rng.next() as usize % 40); // 0..=39 blocks
                (rng.bytes(16 * blocks), rng.bytes(16).try_into().unwrap())
            })
            .collect();
        // Reference: each message alone through the single-stream path.
        let expect: Vec<Vec<u8>> = msgs
            .iter()
            .map(|(m, iv)| {
                let mut d = m.clone();
                key.start(Direction::Encrypt, iv)
                    .process_in_place(&mut d)
                    .unwrap();
                d
            })
            .collect();
        let mut bufs: Vec<Vec<u8>> = msgs.iter().map(|(m, _)| m.clone()).collect();
        let mut outs: Vec<Vec<u8>> = msgs.iter().map(|(m, _)| vec![0u8; m.len()]).collect();
        let chaining: Vec<[u8; 16]>;
        {
            let mut lanes: Vec<Lane> = if in_place {
                bufs.iter_mut()
                    .zip(&msgs)
                    .map(|(b, (_, iv))| Lane {
                        iv: *iv,
                        buf: b.as_mut_slice().into(),
                    })
                    .collect()
            } else {
                bufs.iter()
                    .zip(outs.iter_mut())
                    .zip(&msgs)
                    .map(|((i, o), (_, iv))| Lane {
                        iv: *iv,
                        buf: InOutBuf::new(i, o).unwrap(),
                    })
                    .collect()
            };
            cbc_encrypt_multi(&key, &mut lanes).unwrap();
            chaining = lanes.iter().map(|l| l.iv).collect();
        }
        // Each lane's IV afterwards: its last ciphertext block (the IV
        // itself for an empty message).
        for (i, ((e, (_, iv)), c)) in expect.iter().zip(&msgs).zip(&chaining).enumerate() {
            let want = e.last_chunk::<16>().unwrap_or(iv);
            assert_eq!(c, want, "round {round}: chaining value of lane {i} of {lanes_n}");
        }
        let got = if in_place { &bufs } else { &outs };
        assert_eq!(
            got, &expect,
            "round {round}: {lanes_n} lanes, in place {in_place}"
        );
        if !in_place {
            let inputs: Vec<&Vec<u8>> = msgs.iter().map(|(m, _)| m).collect();
            assert_eq!(bufs.iter().collect::<Vec<_>>(), inputs, "inputs untouched");
        }
    }
}

/// Long messages (32 blocks and more) whose buffers are 4 KiB apart, so
/// that every lane's block j falls in the same L1 cache set (the skewed
/// schedule of the `aesni` engine), and the same shifted by one cache line
/// per lane (no skew), on the process-wide engine:
/// both give what the single-stream path gives, in place and not.
#[test]
fn matches_single_stream_with_page_strided_lanes() {
    const PAGE: usize = 4096;
    let mut rng = Rng(0x5eed_cafe_f00d_0001);
    for round in 0..120 {
        let key = AesCbcKey::new(&rng.bytes([16, 24, 32][round % 3])).unwrap();
        let lanes_n = 1 + (rng.next() as usize % MAX_LANES);
        let in_place = round % 2 == 0;
        // 0: page-aligned lanes; 64: lane i starts i cache lines later.
        let shift = if round % 4 < 2 { 0 } else { 64 };
        let stride = PAGE + shift;
        let lens: Vec<usize> = (0..lanes_n)
            .map(|_| 16 * (32 + rng.next() as usize % 200))
            .collect();
        let ivs: Vec<[u8; 16]> = (0..lanes_n).map(|_| rng.bytes(16).try_into().unwrap()).collect();
        let mut src = rng.bytes(stride * lanes_n + PAGE);
        let mut dst = vec![0u8; stride * lanes_n + PAGE];
        // Lane i's buffers at a 4 KiB boundary of each area, plus i * shift.
        let base = |v: &[u8]| (PAGE - v.as_ptr() as usize % PAGE) % PAGE;
        let (sb, db) = (base(&src), base(&dst));
        let expect: Vec<Vec<u8>> = (0..lanes_n)
            .map(|i| {
                let mut d = src[sb + i * stride..][..lens[i]].to_vec();
                key.start(Direction::Encrypt, &ivs[i])
                    .process_in_place(&mut d)
                    .unwrap();
                d
            })
            .collect();
        {
            let mut lanes: Vec<Lane> = Vec::new();
            let (mut s_rest, mut d_rest) = (&mut src[sb..], &mut dst[db..]);
            for i in 0..lanes_n {
                let (s_lane, s_next) = std::mem::take(&mut s_rest).split_at_mut(stride);
                let (d_lane, d_next) = std::mem::take(&mut d_rest).split_at_mut(stride);
                s_rest = s_next;
                d_rest = d_next;
                let buf = if in_place {
                    InOutBuf::from(&mut s_lane[..lens[i]])
                } else {
                    InOutBuf::new(&s_lane[..lens[i]], &mut d_lane[..lens[i]]).unwrap()
                };
                lanes.push(Lane { iv: ivs[i], buf });
            }
            cbc_encrypt_multi(&key, &mut lanes).unwrap();
        }
        let out = if in_place { (&src, sb) } else { (&dst, db) };
        for i in 0..lanes_n {
            assert_eq!(
                &out.0[out.1 + i * stride..][..lens[i]],
                &expect[i][..],
                "round {round}: lane {i} of {lanes_n}, shift {shift}, in place {in_place}"
            );
        }
    }
}

#[test]
fn rejects_too_many_lanes_and_partial_blocks() {
    let key = AesCbcKey::new(&[7; 16]).unwrap();
    let mut bufs = vec![vec![0u8; 16]; MAX_LANES + 1];
    let mut lanes: Vec<Lane> = bufs
        .iter_mut()
        .map(|b| Lane {
            iv: [0; 16],
            buf: b.as_mut_slice().into(),
        })
        .collect();
    assert_eq!(
        cbc_encrypt_multi(&key, &mut lanes),
        Err(Error::InvalidBufferLength(MAX_LANES + 1))
    );
    let mut odd = vec![1u8; 17];
    let mut lanes = vec![Lane {
        iv: [0; 16],
        buf: odd.as_mut_slice().into(),
    }];
    assert_eq!(
        cbc_encrypt_multi(&key, &mut lanes),
        Err(Error::InvalidBufferLength(17))
    );
    drop(lanes);
    assert_eq!(odd, vec![1u8; 17], "nothing processed");
}

/// A full batch of equal-length lanes ([`MAX_LANES`]), each lane in place
/// or into a separate buffer at random, 0 to 80 blocks, page-strided or
/// packed, all key sizes, on the process-wide engine: outputs and chaining
/// values equal the single-stream path's, inputs of separate-buffer lanes
/// untouched.
#[test]
fn full_batches_of_equal_lanes_in_place_or_not_match_single_stream() {
    let mut rng = Rng(0x7e57_0000_1111_2222);
    for round in 0..600 {
        let key = AesCbcKey::new(&rng.bytes([16, 24, 32][round % 3])).unwrap();
        let blocks = rng.next() as usize % 81;
        let n = 16 * blocks;
        let msgs: Vec<Vec<u8>> = (0..MAX_LANES).map(|_| rng.bytes(n)).collect();
        let ivs: Vec<[u8; 16]> = (0..MAX_LANES)
            .map(|_| rng.bytes(16).try_into().unwrap())
            .collect();
        let inpl: Vec<bool> = (0..MAX_LANES).map(|_| rng.next().is_multiple_of(2)).collect();
        // Page-strided sometimes (the `aesni` engine's skew path when
        // >= 32 blocks).
        let stride = if round % 2 == 0 { 4096 } else { n + 48 };
        let mut src = vec![0u8; stride * MAX_LANES + 4096];
        let mut dst = vec![0u8; stride * MAX_LANES + 4096];
        let base = |v: &[u8]| (4096 - v.as_ptr() as usize % 4096) % 4096;
        let (sb, db) = (base(&src), base(&dst));
        for i in 0..MAX_LANES {
            src[sb + i * stride..][..n].copy_from_slice(&msgs[i]);
        }
        let expect: Vec<Vec<u8>> = (0..MAX_LANES)
            .map(|i| {
                let mut d = msgs[i].clone();
                key.start(Direction::Encrypt, &ivs[i])
                    .process_in_place(&mut d)
                    .unwrap();
                d
            })
            .collect();
        let chaining: Vec<[u8; 16]>;
        {
            let mut lanes: Vec<Lane> = Vec::new();
            let (mut s_rest, mut d_rest) = (&mut src[sb..], &mut dst[db..]);
            for i in 0..MAX_LANES {
                let (s_lane, s_next) = std::mem::take(&mut s_rest).split_at_mut(stride);
                let (d_lane, d_next) = std::mem::take(&mut d_rest).split_at_mut(stride);
                s_rest = s_next;
                d_rest = d_next;
                let buf = if inpl[i] {
                    InOutBuf::from(&mut s_lane[..n])
                } else {
                    InOutBuf::new(&s_lane[..n], &mut d_lane[..n]).unwrap()
                };
                lanes.push(Lane { iv: ivs[i], buf });
            }
            cbc_encrypt_multi(&key, &mut lanes).unwrap();
            chaining = lanes.iter().map(|l| l.iv).collect();
        }
        for i in 0..MAX_LANES {
            let got = if inpl[i] {
                &src[sb + i * stride..][..n]
            } else {
                &dst[db + i * stride..][..n]
            };
            assert_eq!(got, &expect[i][..], "round {round} lane {i} blocks {blocks}");
            if !inpl[i] {
                assert_eq!(
                    &src[sb + i * stride..][..n],
                    &msgs[i][..],
                    "round {round} lane {i} input"
                );
            }
            let want = expect[i].last_chunk::<16>().unwrap_or(&ivs[i]);
            assert_eq!(&chaining[i], want, "round {round} lane {i} chaining");
        }
    }
}
