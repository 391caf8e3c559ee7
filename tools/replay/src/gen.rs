// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! `vhost-crypto-replay gen`: benchmark traces whose expected outputs come
//! from the tool's reference cipher ([`crate::reference`]: RustCrypto's
//! `cbc` and `aes` crates, pinned by NIST SP 800-38A vectors, not through
//! the daemon's `algorithms` crate), never from a backend.
//!
//! A trace is compact by default: `create_session` lines, one `generate`
//! line per session used (its requests' IVs and data come from the line's
//! seed, their expected outputs are computed when the trace is loaded),
//! then `close_session` lines: a few hundred bytes however many requests.
//! [`GenOptions::expanded`] writes each request of those `generate` lines
//! as an explicit `request` line instead (hex IV, source and expected
//! output), the same requests in the same order.

use std::io::{self, Write};

use algorithms::Direction;
use clap::ValueEnum;

use crate::reference::aes_cbc;
use crate::rng::{self, Rng as _};
use crate::trace::hex;

/// Which opcodes a generated trace uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GenOpcode {
    /// All requests encrypt.
    Encrypt,
    /// All requests decrypt.
    Decrypt,
    /// Both directions for every key: request i decrypts when i /
    /// sessions (rounded down) is odd.
    Mixed,
}

/// Generator settings.
#[derive(Debug, Clone)]
pub struct GenOptions {
    /// Opcodes.
    pub opcode: GenOpcode,
    /// Bytes per request.
    pub size: usize,
    /// Number of requests.
    pub count: u64,
    /// Number of keys.
    pub sessions: u32,
    /// Key size in bits.
    pub key_bits: u32,
    /// PRNG seed.
    pub seed: u64,
    /// Explicit `request` lines instead of `generate` lines.
    pub expanded: bool,
}

/// Largest generated request (bytes): the daemon's default
/// `--max-request-bytes` (1 MiB), which `--spawn-daemon` runs it with.
pub const MAX_GENERATED_SIZE: usize = 1 << 20;

/// The two session directions, in the order of a key's sessions.
const DIRECTIONS: [(Direction, &str); 2] = [(Direction::Encrypt, "encrypt"), (Direction::Decrypt, "decrypt")];

/// How many of the `count` requests go to each key and direction:
/// request i uses key `i % sessions`, and for [`GenOpcode::Mixed`]
/// decrypts when `i / sessions` is odd, so that every key has requests
/// in both directions once `count >= 2 * sessions`. Indexed `[key][0
/// encrypt, 1 decrypt]`.
fn shares(o: &GenOptions) -> Vec<[u64; 2]> {
    let keys = u64::from(o.sessions);
    let mut n = vec![[0u64; 2]; o.sessions as usize];
    // Key and direction repeat every 2 * keys requests.
    let period = 2 * keys;
    let (full, rest) = (o.count / period, o.count % period);
    for i in 0..period.min(o.count) {
        let dir = match o.opcode {
            GenOpcode::Encrypt => 0,
            GenOpcode::Decrypt => 1,
            GenOpcode::Mixed => ((i / keys) % 2) as usize,
        };
        n[(i % keys) as usize][dir] += full + u64::from(i < rest);
    }
    n
}

/// Writes the trace.
///
/// # Errors
/// Bad options (`InvalidInput`) or write failures.
pub fn generate(o: &GenOptions, w: &mut impl Write) -> io::Result<()> {
    let bad = |m: String| io::Error::new(io::ErrorKind::InvalidInput, m);
    if o.size == 0 || !o.size.is_multiple_of(16) {
        return Err(bad(format!("--size {} is not a positive multiple of 16", o.size)));
    }
    if o.size > MAX_GENERATED_SIZE {
        return Err(bad(format!(
            "--size {} is above the daemon's default limit of 1 MiB",
            o.size
        )));
    }
    if !matches!(o.key_bits, 128 | 192 | 256) {
        return Err(bad(format!("--key-bits {} is not 128, 192 or 256", o.key_bits)));
    }
    if o.sessions == 0 {
        return Err(bad("--sessions must be at least 1".into()));
    }
    // The keys, then one seed per key and direction, from --seed.
    let mut rng = rng::seeded(o.seed);
    let mut keys = Vec::new();
    for s in 0..o.sessions {
        let mut key = vec![0u8; o.key_bits as usize / 8];
        rng.fill_bytes(&mut key);
        for (_, dir) in DIRECTIONS {
            writeln!(
                w,
                r#"{{"op":"create_session","name":"{dir}{s}","algo":"aes-cbc","key":"{}","direction":"{dir}"}}"#,
                hex(&key)
            )?;
        }
        keys.push(key);
    }
    let seeds: Vec<[u64; 2]> = (0..o.sessions)
        .map(|_| [rng.next_u64(), rng.next_u64()])
        .collect();
    let size = o.size;
    let mut iv = [0u8; 16];
    let mut src = vec![0u8; size];
    let mut dst = vec![0u8; size];
    for (s, n) in shares(o).iter().enumerate() {
        for (d, &(direction, dir)) in DIRECTIONS.iter().enumerate() {
            let (count, seed) = (n[d], seeds[s][d]);
            if count == 0 {
                continue;
            }
            if !o.expanded {
                writeln!(
                    w,
                    r#"{{"op":"generate","session":"{dir}{s}","opcode":"{dir}","size":{size},"count":{count},"seed":{seed}}}"#
                )?;
                continue;
            }
            // What the `generate` line stands for (`crate::trace`): per
            // request the IV, then the source, from the line's seed.
            let mut rng = rng::seeded(seed);
            for _ in 0..count {
                rng.fill_bytes(&mut iv);
                rng.fill_bytes(&mut src);
                dst.copy_from_slice(&src);
                aes_cbc(direction, &keys[s], &iv, &mut dst).map_err(|e| bad(e.to_string()))?;
                writeln!(
                    w,
                    r#"{{"op":"request","session":"{dir}{s}","opcode":"{dir}","iv":"{}","src":"{}","expect":{{"status":"ok","dst":"{}"}}}}"#,
                    hex(&iv),
                    hex(&src),
                    hex(&dst)
                )?;
            }
        }
    }
    for s in 0..o.sessions {
        for (_, dir) in DIRECTIONS {
            writeln!(w, r#"{{"op":"close_session","name":"{dir}{s}"}}"#)?;
        }
    }
    w.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{Step, Trace};

    #[test]
    fn generated_trace_parses_and_roundtrips() {
        let mut out = Vec::new();
        let o = GenOptions {
            opcode: GenOpcode::Mixed,
            size: 32,
            count: 4,
            sessions: 2,
            key_bits: 192,
            seed: 3,
            expanded: false,
        };
        generate(&o, &mut out).unwrap();
        let t = Trace::parse(&out[..]).unwrap();
        assert_eq!(t.requests(), 4);
        let creates = t
            .steps
            .iter()
            .filter(|s| matches!(s, Step::Create { .. }))
            .count();
        assert_eq!(creates, 4);
        for size in [0, 17] {
            let mut out = Vec::new();
            let e = generate(&GenOptions { size, ..o.clone() }, &mut out).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("--size {size} is not a positive multiple of 16")
            );
            assert!(out.is_empty(), "--size {size}: nothing written");
        }
    }

    #[test]
    fn mixed_requests_give_every_key_both_directions() {
        let o = |sessions, count| GenOptions {
            opcode: GenOpcode::Mixed,
            size: 16,
            count,
            sessions,
            key_bits: 128,
            seed: 1,
            expanded: false,
        };
        // Request i: key i % sessions, decrypt when i / sessions is odd.
        // 4 keys, 10 requests: k0 E, k1 E, k2 E, k3 E, k0 D, k1 D, k2 D,
        // k3 D, k0 E, k1 E.
        assert_eq!(shares(&o(4, 10)), [[2, 1], [2, 1], [1, 1], [1, 1]]);
        assert_eq!(shares(&o(2, 8)), [[2, 2], [2, 2]]);
        assert_eq!(shares(&o(3, 6)), [[1, 1], [1, 1], [1, 1]]);
        assert_eq!(shares(&o(1, 5)), [[3, 2]]);
    }

    #[test]
    fn sizes_above_the_daemon_default_limit_are_refused() {
        let o = GenOptions {
            opcode: GenOpcode::Encrypt,
            size: 1 << 20,
            count: 0,
            sessions: 1,
            key_bits: 128,
            seed: 1,
            expanded: false,
        };
        assert!(generate(&o, &mut Vec::new()).is_ok());
        for size in [(1 << 20) + 16, 1 << 40] {
            let e = generate(&GenOptions { size, ..o.clone() }, &mut Vec::new()).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("--size {size} is above the daemon's default limit of 1 MiB")
            );
        }
        let t = |size: usize| {
            Trace::parse(
                format!(
                    "{{\"op\":\"create_session\",\"name\":\"s\",\"algo\":\"aes-cbc\",\"key\":\"000102030405060708090a0b0c0d0e0f\",\"direction\":\"encrypt\"}}\n\
                     {{\"op\":\"generate\",\"session\":\"s\",\"opcode\":\"encrypt\",\"size\":{size},\"count\":1,\"seed\":1}}\n"
                )
                .as_bytes(),
            )
        };
        assert_eq!(t(1 << 20).unwrap().requests(), 1);
        let e = t(1 << 40).err().unwrap().to_string();
        assert!(
            e.contains("generate size 1099511627776 is above the daemon's default limit of 1 MiB"),
            "{e}"
        );
    }
}
