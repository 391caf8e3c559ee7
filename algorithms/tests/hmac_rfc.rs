// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! HMAC known answers typed in from RFC 2202 §3 (HMAC-SHA1, test cases
//! 1–7) and RFC 4231 §4 (HMAC-SHA-256, test cases 1–7, including the
//! truncated case 5), plus a differential test against the RustCrypto
//! `hmac`/`sha1`/`sha2` crates (an implementation sharing no code with
//! `ring`) over random keys, messages, truncations and piece boundaries.

mod common;
use common::*;

use algorithms::{MacAlg, MacError, MacKey};
use rand_core::SeedableRng as _;
use rand_xoshiro::SplitMix64;

struct Case {
    name: &'static str,
    key: Vec<u8>,
    data: Vec<u8>,
    /// Expected tag (possibly truncated, as in the RFC).
    tag: &'static str,
}

fn rfc2202_sha1() -> Vec<Case> {
    vec![
        Case {
            name: "RFC 2202 test 1",
            key: vec![0x0b; 20],
            data: b"Hi There".to_vec(),
            tag: "b617318655057264e28bc0b6fb378c8ef146be00",
        },
        Case {
            name: "RFC 2202 test 2",
            key: b"Jefe".to_vec(),
            data: b"what do ya want for nothing?".to_vec(),
            tag: "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79",
        },
        Case {
            name: "RFC 2202 test 3",
            key: vec![0xaa; 20],
            data: vec![0xdd; 50],
            tag: "125d7342b9ac11cd91a39af48aa17b4f63f175d3",
        },
        Case {
            name: "RFC 2202 test 4",
            key: (1..=25).collect(),
            data: vec![0xcd; 50],
            tag: "4c9007f4026250c6bc8414f9bf50c86c2d7235da",
        },
        Case {
            name: "RFC 2202 test 5 (truncated to 96 bits)",
            key: vec![0x0c; 20],
            data: b"Test With Truncation".to_vec(),
            tag: "4c1a03424b55e07fe7f27be1",
        },
        Case {
            name: "RFC 2202 test 6 (80-byte key, hashed first)",
            key: vec![0xaa; 80],
            data: b"Test Using Larger Than Block-Size Key - Hash Key First".to_vec(),
            tag: "aa4ae5e15272d00e95705637ce8a3b55ed402112",
        },
        Case {
            name: "RFC 2202 test 7",
            key: vec![0xaa; 80],
            data: b"Test Using Larger Than Block-Size Key and Larger Than One Block-Size Data".to_vec(),
            tag: "e8e99d0f45237d786d6bbaa7965c7808bbff1a91",
        },
    ]
}

fn rfc4231_sha256() -> Vec<Case> {
    vec![
        Case {
            name: "RFC 4231 4.2",
            key: vec![0x0b; 20],
            data: b"Hi There".to_vec(),
            tag: "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7",
        },
        Case {
            name: "RFC 4231 4.3",
            key: b"Jefe".to_vec(),
            data: b"what do ya want for nothing?".to_vec(),
            tag: "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
        },
        Case {
            name: "RFC 4231 4.4",
            key: vec![0xaa; 20],
            data: vec![0xdd; 50],
            tag: "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe",
        },
        Case {
            name: "RFC 4231 4.5",
            key: (1..=25).collect(),
            data: vec![0xcd; 50],
            tag: "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b",
        },
        Case {
            name: "RFC 4231 4.6 (truncated to 128 bits)",
            key: vec![0x0c; 20],
            data: b"Test With Truncation".to_vec(),
            tag: "a3b6167473100ee06e0c796c2955552b",
        },
        Case {
            name: "RFC 4231 4.7 (131-byte key, hashed first)",
            key: vec![0xaa; 131],
            data: b"Test Using Larger Than Block-Size Key - Hash Key First".to_vec(),
            tag: "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54",
        },
        Case {
            name: "RFC 4231 4.8",
            key: vec![0xaa; 131],
            data: b"This is a test using a larger than block-size key and a larger than block-size data. \
The key needs to be hashed before being used by the HMAC algorithm."
                .to_vec(),
            tag: "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2",
        },
    ]
}

fn check(alg: MacAlg, cases: Vec<Case>) {
    for c in cases {
        let want = hex(c.tag);
        let key = MacKey::new(alg, &c.key, want.len()).unwrap();
        let mut out = [0u8; 64];
        assert_eq!(key.sign_into(&c.data, &mut out), want.len(), "{}", c.name);
        assert_eq!(&out[..want.len()], &want[..], "{}: generate", c.name);
        assert!(
            out[want.len()..].iter().all(|&b| b == 0),
            "{}: wrote past the tag",
            c.name
        );

        // The same message fed byte by byte.
        let mut s = key.start();
        for b in &c.data {
            s.update(std::slice::from_ref(b));
        }
        assert!(s.verify_truncated(&want), "{}: verify", c.name);

        // Any single flipped bit, and a wrong length, fail verification.
        for bit in [0, 7, want.len() * 8 - 1] {
            let mut bad = want.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            let mut s = key.start();
            s.update(&c.data);
            assert!(!s.verify_truncated(&bad), "{}: bit {bit} flipped", c.name);
        }
        let mut s = key.start();
        s.update(&c.data);
        assert!(
            !s.verify_truncated(&want[..want.len() - 1]),
            "{}: short tag",
            c.name
        );
    }
}

#[test]
fn hmac_sha1_rfc2202() {
    check(MacAlg::HmacSha1, rfc2202_sha1());
}

#[test]
fn hmac_sha256_rfc4231() {
    check(MacAlg::HmacSha256, rfc4231_sha256());
}

#[test]
fn digest_length_bounds() {
    for (alg, max) in [(MacAlg::HmacSha1, 20), (MacAlg::HmacSha256, 32)] {
        assert_eq!(alg.output_len(), max);
        assert_eq!(
            MacKey::new(alg, b"k", 0).unwrap_err(),
            MacError::InvalidDigestLength { got: 0, max }
        );
        assert_eq!(
            MacKey::new(alg, b"k", max + 1).unwrap_err(),
            MacError::InvalidDigestLength { got: max + 1, max }
        );
        assert!(MacKey::new(alg, b"k", 1).is_ok());
        assert!(MacKey::new(alg, b"k", max).is_ok());
        // A tag buffer shorter than the digest: nothing written.
        let k = MacKey::new(alg, b"k", max).unwrap();
        let mut short = vec![0x5a; max - 1];
        assert_eq!(k.sign_into(b"m", &mut short), 0);
        assert!(short.iter().all(|&b| b == 0x5a));
    }
}

#[test]
fn debug_hides_key_material() {
    let k = MacKey::new(MacAlg::HmacSha256, &[0x42; 40], 16).unwrap();
    let s = format!("{k:?} {:?}", k.start());
    assert!(!s.contains("42") && !s.contains("66"), "{s}");
    assert!(s.contains("HmacSha256") && s.contains("16"), "{s}");
}

#[test]
fn matches_rustcrypto_hmac_over_random_inputs() {
    let mut rng = SplitMix64::seed_from_u64(0x9e37_79b9_7f4a_7c15);
    for i in 0..2000 {
        let alg = if i % 2 == 0 {
            MacAlg::HmacSha1
        } else {
            MacAlg::HmacSha256
        };
        // Keys up to the 512 bytes a session may carry, messages up to 5 KiB.
        let key_len = below(&mut rng, 513);
        let key = bytes(&mut rng, key_len);
        let data_len = below(&mut rng, 5000);
        let data = bytes(&mut rng, data_len);
        let digest_len = 1 + below(&mut rng, alg.output_len());
        let want = hmac_oracle(alg, &key, &data);
        let k = MacKey::new(alg, &key, digest_len).unwrap();
        let mut s = k.start();
        let mut at = 0;
        while at < data.len() {
            let n = (1 + below(&mut rng, 300)).min(data.len() - at);
            s.update(&data[at..at + n]);
            at += n;
        }
        let mut out = [0u8; 32];
        assert_eq!(s.finish_into(&mut out), digest_len);
        assert_eq!(&out[..digest_len], &want[..digest_len], "case {i}");
        let mut s = k.start();
        s.update(&data);
        assert!(s.verify_truncated(&want[..digest_len]), "case {i}");
    }
}
