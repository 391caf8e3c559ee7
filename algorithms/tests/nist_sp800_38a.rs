// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! NIST SP 800-38A Appendix F.2 (CBC-AES128/192/256 encrypt and decrypt)
//! known answers, typed in from the standard.

mod common;
use common::*;

use algorithms::{aes_cbc, AesCbcKey, Direction, Error};

const IV: &str = "000102030405060708090a0b0c0d0e0f";
const PLAIN: &str = "6bc1bee22e409f96e93d7e117393172a ae2d8a571e03ac9c9eb76fac45af8e51
                     30c81c46a35ce411e5fbc1191a0a52ef f69f2445df4f9b17ad2b417be66c3710";

/// (section, key, ciphertext)
const CASES: [(&str, &str, &str); 3] = [
    (
        "F.2.1/F.2.2 CBC-AES128",
        "2b7e151628aed2a6abf7158809cf4f3c",
        "7649abac8119b246cee98e9b12e9197d 5086cb9b507219ee95db113a917678b2
         73bed6b8e3c1743b7116e69e22229516 3ff1caa1681fac09120eca307586e1a7",
    ),
    (
        "F.2.3/F.2.4 CBC-AES192",
        "8e73b0f7da0e6452c810f32b809079e562f8ead2522c6b7b",
        "4f021db243bc633d7178183a9fa071e8 b4d9ada9ad7dedf4e5e738763f69145a
         571b242012fb7ae07fa9baac3df102e0 08b0e27988598881d920a9e64f5615cd",
    ),
    (
        "F.2.5/F.2.6 CBC-AES256",
        "603deb1015ca71be2b73aef0857d77811f352c073b6108d72d9810a30914dff4",
        "f58c4c04d6e5f1ba779eabfb5f7bfbd6 9cfc4e967edb808d679f777bc6702c7d
         39f23369a9d9bacfa530e26304231461 b2eb05e2c39be9fcda6c19078c6a9d1b",
    ),
];

fn iv() -> [u8; 16] {
    hex(IV).try_into().unwrap()
}

#[test]
fn encrypt_known_answers() {
    for (name, key, ct) in CASES {
        let mut data = hex(PLAIN);
        aes_cbc(Direction::Encrypt, &hex(key), &iv(), &mut data).unwrap();
        assert_eq!(data, hex(ct), "{name} encrypt");
    }
}

#[test]
fn decrypt_known_answers() {
    for (name, key, ct) in CASES {
        let mut data = hex(ct);
        aes_cbc(Direction::Decrypt, &hex(key), &iv(), &mut data).unwrap();
        assert_eq!(data, hex(PLAIN), "{name} decrypt");
    }
}

/// The stream gives the same bytes however the message is cut, in place
/// or buffer to buffer.
#[test]
fn streaming_matches_known_answers_for_every_split() {
    for (name, key, ct) in CASES {
        let key = AesCbcKey::new(&hex(key)).unwrap();
        for (dir, input, expect) in [
            (Direction::Encrypt, hex(PLAIN), hex(ct)),
            (Direction::Decrypt, hex(ct), hex(PLAIN)),
        ] {
            for cut in [0, 16, 32, 48, 64] {
                let mut s = key.start(dir, &iv());
                let mut out = vec![0u8; 64];
                let (o1, o2) = out.split_at_mut(cut);
                s.process_b2b(&input[..cut], o1).unwrap();
                s.process_b2b(&input[cut..], o2).unwrap();
                assert_eq!(out, expect, "{name} {dir:?} b2b cut {cut}");

                let mut s = key.start(dir, &iv());
                let mut data = input.clone();
                let (d1, d2) = data.split_at_mut(cut);
                s.process_in_place(d1).unwrap();
                s.process_in_place(d2).unwrap();
                assert_eq!(data, expect, "{name} {dir:?} in place cut {cut}");

                let mut s = key.start(dir, &iv());
                let mut data = input.clone();
                for b in data.chunks_exact_mut(16) {
                    s.process_block(b.try_into().unwrap());
                }
                assert_eq!(data, expect, "{name} {dir:?} block by block");
            }
        }
    }
}

#[test]
fn rejects_bad_lengths() {
    assert_eq!(
        AesCbcKey::new(&[0u8; 17]).unwrap_err(),
        Error::InvalidKeyLength(17)
    );
    assert_eq!(AesCbcKey::new(&[]).unwrap_err(), Error::InvalidKeyLength(0));
    let key = AesCbcKey::new(&[0u8; 16]).unwrap();
    let mut s = key.start(Direction::Encrypt, &[0u8; 16]);
    let mut data = [7u8; 17];
    assert_eq!(s.process_in_place(&mut data), Err(Error::InvalidBufferLength(17)));
    assert_eq!(data, [7u8; 17], "nothing processed on error");
    let mut out = [0u8; 32];
    assert!(s.process_b2b(&[0u8; 16], &mut out).is_err());
}

#[test]
fn debug_hides_key_material() {
    let key = AesCbcKey::new(&[0xAB; 32]).unwrap();
    let dbg = format!("{key:?} {:?}", key.start(Direction::Encrypt, &[0xCD; 16]));
    assert_eq!(dbg, "AesCbcKey { bits: 256 } CbcStream { .. }");
}
