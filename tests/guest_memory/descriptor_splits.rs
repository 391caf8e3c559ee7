// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Property: how a valid request's buffers are cut into descriptors never
//! changes its result.
//!
//! For random valid requests (AES-128/192/256-CBC, encrypt or decrypt,
//! 16 B..64 KiB in whole blocks, random key, IV and data), each request is
//! submitted once unsplit (header, IV, src, dst, status: five descriptors
//! in one memory region) and in several random layouts, all in one batch:
//! direct chain or indirect table; the readable stream (header | IV | src)
//! and the writable stream (dst | status) cut at random points, across the
//! field boundaries too; zero-length descriptors with wild addresses and
//! random flags between the pieces; pieces placed in random order, with
//! gaps, over guest memory made of hundreds of adjacent regions of random
//! (odd) sizes, some pieces deliberately straddling a region boundary; and
//! in place (src and dst the same guest bytes, cut differently) or not.
//!
//! Every layout must give status OK, used length `len + 1`, and output
//! bytes equal to the unsplit request's and to OpenSSL's, and nothing
//! outside the declared writable bytes may change (the whole span the batch
//! uses is compared with its expected image).
//!
//! Seeded PRNG (`common::Rng`): `SPLIT_PROPERTY_SEED` and
//! `SPLIT_PROPERTY_CASES` override the seed and the number of requests.

use std::time::Instant;

use crate::common::*;

/// Ring, indirect tables and the unsplit requests live in region 0.
const REGION0: u64 = 4 * MIB;
/// The split layouts live in adjacent regions of random sizes from here.
const DATA_START: u64 = REGION0;
const DATA_END: u64 = 16 * MIB;
/// Largest region of the data area.
const MAX_REGION: u64 = 8 << 10;
/// Where the unsplit request of a batch is staged (region 0).
const UNSPLIT: u64 = 0x10_0000;
/// Layouts per request, besides the unsplit one.
const LAYOUTS: usize = 5;
const DEFAULT_CASES: u64 = 300;
const DEFAULT_SEED: u64 = 0x5911_7c0d_e5ee_d001;

/// Wild addresses for zero-length descriptors.
const WILD: [u64; 6] = [
    u64::MAX,
    0xFFFF_FFFF_FFFF_FF00,
    0xDEAD_BEEF_0000_0000,
    DATA_END,
    DATA_END - 1,
    0,
];

/// Guest memory: region 0 (0..4 MiB), then adjacent regions of random
/// sizes up to `DATA_END` (mostly 1 B..8 KiB, some of 1..32 bytes).
fn data_regions(rng: &mut Rng) -> (Vec<(u64, usize)>, Vec<u64>) {
    let mut ranges = vec![(0, REGION0 as usize)];
    let mut starts = Vec::new();
    let mut at = DATA_START;
    while at < DATA_END {
        let size = if rng.range(0, 9) == 0 {
            rng.range(1, 32)
        } else {
            rng.range(1, MAX_REGION)
        }
        .min(DATA_END - at);
        ranges.push((at, size as usize));
        starts.push(at);
        at += size;
    }
    starts.push(DATA_END);
    (ranges, starts)
}

/// Places pieces in the data area: a cursor moving forward with random
/// gaps, sometimes jumping so that the next piece straddles a region
/// boundary.
struct Placer<'a> {
    at: u64,
    /// Region starts of the data area (sorted), `DATA_END` last.
    starts: &'a [u64],
}

impl Placer<'_> {
    fn next_boundary(&self, addr: u64) -> u64 {
        let i = self.starts.partition_point(|&s| s <= addr);
        self.starts.get(i).copied().unwrap_or(DATA_END)
    }

    /// Reserves `len` bytes and returns their address.
    fn place(&mut self, rng: &mut Rng, len: u64) -> u64 {
        self.at += rng.range(0, 3) * rng.range(0, 24);
        if len >= 2 && rng.range(0, 2) == 0 {
            // Straddle the next boundary: k bytes before it, len - k after.
            let b = self.next_boundary(self.at + 1);
            let k = rng.range(1, len - 1);
            if b >= self.at + k && b - k - self.at <= 2048 {
                self.at = b - k;
            }
        }
        let a = self.at;
        self.at += len;
        assert!(self.at + 64 < DATA_END, "data area exhausted");
        a
    }
}

/// Cuts `len` bytes into pieces: up to `max_pieces`, with `must` cut
/// points added with probability 1/2 each.
fn cut(rng: &mut Rng, len: usize, max_pieces: usize, must: &[usize]) -> Vec<usize> {
    if len < 2 {
        return vec![len];
    }
    let mut points = vec![0, len];
    let extra = rng.range(0, max_pieces as u64 - 1);
    for _ in 0..extra {
        points.push(rng.range(1, len as u64 - 1) as usize);
    }
    for &m in must {
        if m < len && rng.range(0, 1) == 0 {
            points.push(m);
        }
    }
    points.sort_unstable();
    points.dedup();
    points.windows(2).map(|p| p[1] - p[0]).collect()
}

/// Random shuffle (Fisher-Yates).
fn shuffle<T>(rng: &mut Rng, v: &mut [T]) {
    for i in (1..v.len()).rev() {
        let j = rng.range(0, i as u64) as usize;
        v.swap(i, j);
    }
}

/// One random valid request.
struct Case {
    key: Vec<u8>,
    encrypt: bool,
    session: u64,
    iv: [u8; 16],
    data: Vec<u8>,
    expect: Vec<u8>,
}

/// One layout of a case in guest memory.
struct Layout {
    what: String,
    chain: Vec<Buf>,
    /// Output pieces in stream order (the status byte excluded).
    dst: Vec<(u64, usize)>,
    status: u64,
    head: u16,
}

/// Guest bytes: (address, bytes).
type Bytes = Vec<(u64, Vec<u8>)>;

/// Places a layout in the data area. Returns the chain (descriptors not
/// written yet) and its writable pieces; records the bytes to write before
/// the batch in `pre` and the expected image of every declared byte after
/// it in `post`.
fn split_layout(rng: &mut Rng, p: &mut Placer<'_>, case: &Case, pre: &mut Bytes, post: &mut Bytes) -> Layout {
    let len = case.data.len();
    let (opcode, session) = (if case.encrypt { ENCRYPT } else { DECRYPT }, case.session);
    let h = hdr(opcode, session, len as u32, len as u32).to_bytes();
    let mut readable: Vec<u8> = h.to_vec();
    readable.extend_from_slice(&case.iv);
    let in_place = rng.range(0, 2) == 0;
    let max_pieces = [1usize, 2, 4, 8, 24][rng.range(0, 4) as usize];

    let mut chain: Vec<Buf> = Vec::new();
    let mut dst: Vec<(u64, usize)> = Vec::new();
    let status: u64;
    // Places `pieces` of `bytes` in random order; returns their addresses
    // in stream order.
    let scatter = |rng: &mut Rng, p: &mut Placer<'_>, pieces: &[usize]| -> Vec<u64> {
        let mut order: Vec<usize> = (0..pieces.len()).collect();
        shuffle(rng, &mut order);
        let mut addrs = vec![0u64; pieces.len()];
        for i in order {
            addrs[i] = p.place(rng, pieces[i] as u64);
        }
        addrs
    };
    if in_place {
        // Header | IV cut anywhere; src = dst = the same bytes ("backing"),
        // cut into pieces placed anywhere, and each direction cuts the
        // backing pieces again at its own points.
        let cuts = cut(rng, 88, max_pieces, &[72]);
        let addrs = scatter(rng, p, &cuts);
        let mut o = 0;
        for (&a, &n) in addrs.iter().zip(&cuts) {
            chain.push(r(a, n as u32));
            pre.push((a, readable[o..o + n].to_vec()));
            post.push((a, readable[o..o + n].to_vec()));
            o += n;
        }
        let backing_cuts = cut(rng, len, max_pieces.min(8), &[]);
        let backing_addrs = scatter(rng, p, &backing_cuts);
        let mut o = 0;
        let mut src_bufs = Vec::new();
        let mut dst_bufs = Vec::new();
        for (&a, &n) in backing_addrs.iter().zip(&backing_cuts) {
            pre.push((a, case.data[o..o + n].to_vec()));
            post.push((a, case.expect[o..o + n].to_vec()));
            for (list, write) in [(&mut src_bufs, false), (&mut dst_bufs, true)] {
                let mut q = 0;
                for m in cut(rng, n, 3, &[]) {
                    list.push(Buf {
                        addr: a + q as u64,
                        len: m as u32,
                        write,
                    });
                    q += m;
                }
            }
            o += n;
        }
        chain.extend(src_bufs);
        dst = dst_bufs.iter().map(|b| (b.addr, b.len as usize)).collect();
        chain.extend(dst_bufs);
        status = p.place(rng, 1);
        chain.push(w(status, 1));
    } else {
        readable.extend_from_slice(&case.data);
        let cuts = cut(rng, readable.len(), max_pieces, &[72, 88]);
        let addrs = scatter(rng, p, &cuts);
        let mut o = 0;
        for (&a, &n) in addrs.iter().zip(&cuts) {
            chain.push(r(a, n as u32));
            pre.push((a, readable[o..o + n].to_vec()));
            post.push((a, readable[o..o + n].to_vec()));
            o += n;
        }
        // dst | status cut anywhere: the status may share a descriptor
        // with the end of dst.
        let cuts = cut(rng, len + 1, max_pieces, &[len]);
        let addrs = scatter(rng, p, &cuts);
        let mut o = 0;
        let mut last = 0;
        for (&a, &n) in addrs.iter().zip(&cuts) {
            chain.push(w(a, n as u32));
            let out_n = n.min(len - o.min(len));
            if out_n > 0 {
                dst.push((a, out_n));
                post.push((a, case.expect[o..o + out_n].to_vec()));
            }
            o += n;
            last = a + n as u64 - 1;
        }
        status = last;
    }
    post.push((status, vec![OK]));
    // Zero-length descriptors with wild addresses and random flags.
    let zeros = rng.range(0, 3);
    for _ in 0..zeros {
        let pos = rng.range(0, chain.len() as u64) as usize;
        chain.insert(
            pos,
            Buf {
                addr: WILD[rng.range(0, WILD.len() as u64 - 1) as usize],
                len: 0,
                write: rng.range(0, 1) == 0,
            },
        );
    }
    Layout {
        what: format!(
            "{} descriptors, max {max_pieces} pieces, in place {in_place}, {zeros} zero-length",
            chain.len()
        ),
        chain,
        dst,
        status,
        head: 0,
    }
}

fn cases() -> u64 {
    std::env::var("SPLIT_PROPERTY_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_CASES)
}

fn seed() -> u64 {
    std::env::var("SPLIT_PROPERTY_SEED")
        .ok()
        .and_then(|s| {
            s.strip_prefix("0x")
                .map_or_else(|| s.parse().ok(), |h| u64::from_str_radix(h, 16).ok())
        })
        .unwrap_or(DEFAULT_SEED)
}

#[test]
fn every_split_of_a_valid_request_gives_the_same_output() {
    let seed = seed();
    let mut rng = Rng::new(seed << 1);
    let (ranges, starts) = data_regions(&mut rng);
    let mut vm = Vm::with_ranges(&ranges);
    let started = Instant::now();
    let mut stats = [0usize; 4]; // layouts, in place, indirect, region crossings (pieces)
    for case_no in 0..cases() {
        // The request.
        let key_len = [16, 24, 32][rng.range(0, 2) as usize];
        let key = rng.bytes(key_len);
        let encrypt = rng.range(0, 1) == 0;
        let len = 16
            * match rng.range(0, 19) {
                0..=9 => rng.range(1, 64),
                10..=16 => rng.range(1, 512),
                _ => rng.range(1, 4096),
            } as usize;
        let id = vm.reg.create(&session_info(&key, if encrypt { 1 } else { 2 }));
        assert!(id > 0);
        let iv: [u8; 16] = rng.bytes(16).try_into().unwrap();
        let data = rng.bytes(len);
        let expect = oracle(encrypt, &key, &iv, &data);
        let case = Case {
            key,
            encrypt,
            session: id as u64,
            iv,
            data,
            expect,
        };
        let what = format!(
            "seed {seed:#x}, case {case_no}: {len} bytes, AES-{}, encrypt {encrypt}",
            case.key.len() * 8
        );

        // The unsplit request, in region 0.
        let h = hdr(
            if encrypt { ENCRYPT } else { DECRYPT },
            case.session,
            len as u32,
            len as u32,
        );
        let (uh, uiv, usrc, udst, ust) = (
            UNSPLIT,
            UNSPLIT + 0x100,
            UNSPLIT + 0x1000,
            UNSPLIT + 0x2_0000,
            UNSPLIT + 0x3_1000,
        );
        vm.write(uh, &h.to_bytes());
        vm.write(uiv, &case.iv);
        vm.write(usrc, &case.data);
        vm.fill(udst, len + 64, CANARY);
        vm.fill(ust, 16, CANARY);
        let unsplit_head = vm.chain(&[
            r(uh, 72),
            r(uiv, 16),
            r(usrc, len as u32),
            w(udst, len as u32),
            w(ust, 1),
        ]);
        vm.push(unsplit_head);
        let mut ring_descs = 5usize;

        // The split layouts, in the data area, all in the same batch.
        let span_start = DATA_START + rng.range(0, 2 * MAX_REGION);
        let mut placer = Placer {
            at: span_start,
            starts: &starts,
        };
        let (mut pre, mut post) = (Vec::new(), Vec::new());
        let mut layouts = Vec::new();
        for _ in 0..LAYOUTS {
            let mut l = split_layout(&mut rng, &mut placer, &case, &mut pre, &mut post);
            let direct = rng.range(0, 1) == 0 && ring_descs + l.chain.len() <= usize::from(QSIZE);
            l.head = if direct {
                ring_descs += l.chain.len();
                vm.chain(&l.chain)
            } else {
                stats[2] += 1;
                ring_descs += 1;
                vm.indirect(&l.chain)
            };
            l.what = format!(
                "{what}: {} {}",
                if direct { "direct" } else { "indirect" },
                l.what
            );
            stats[0] += 1;
            stats[1] += usize::from(l.what.contains("in place true"));
            stats[3] += l
                .chain
                .iter()
                .filter(|b| b.len > 1 && placer.next_boundary(b.addr) < b.addr + u64::from(b.len))
                .count();
            vm.push(l.head);
            layouts.push(l);
        }
        // The span the layouts use (and 4 KiB after it) holds the canary,
        // then their input bytes.
        let span_end = placer.at;
        vm.fill(span_start, (span_end - span_start + 4096) as usize, CANARY);
        for (a, bytes) in &pre {
            vm.write(*a, bytes);
        }

        let used = vm.run_batch();

        // Unsplit: OK, used len + 1, OpenSSL's bytes, nothing else written.
        assert_eq!(used[0].id, u32::from(unsplit_head), "{what}");
        assert_eq!(
            (vm.byte(ust), used[0].len),
            (OK, len as u32 + 1),
            "{what}: unsplit"
        );
        let unsplit_out = vm.read(udst, len);
        assert!(
            unsplit_out == case.expect,
            "{what}: unsplit output differs from OpenSSL"
        );
        vm.assert_canary(udst + len as u64, 64);
        vm.assert_canary(ust + 1, 15);

        // Every layout: OK, used len + 1, the same bytes.
        for (l, u) in layouts.iter().zip(&used[1..]) {
            assert_eq!(u.id, u32::from(l.head), "{}", l.what);
            assert_eq!((vm.byte(l.status), u.len), (OK, len as u32 + 1), "{}", l.what);
            let mut out = Vec::with_capacity(len);
            for &(a, n) in &l.dst {
                out.extend(vm.read(a, n));
            }
            assert!(
                out == unsplit_out,
                "{}: output differs from the unsplit request",
                l.what
            );
        }
        // Nothing outside the declared bytes changed: the whole span
        // against its expected image (canary, input, output, status).
        let mut want = vec![CANARY; (span_end - span_start) as usize];
        for (a, bytes) in &post {
            let o = (a - span_start) as usize;
            want[o..o + bytes.len()].copy_from_slice(bytes);
        }
        let got = vm.read(span_start, want.len());
        if got != want {
            let i = got.iter().zip(&want).position(|(g, w)| g != w).unwrap();
            panic!(
                "{what}: byte {:#x} is {:#04x}, expected {:#04x}",
                span_start + i as u64,
                got[i],
                want[i]
            );
        }
        vm.assert_canary(span_end, 4096);
        assert!(vm.reg.close(case.session));
    }
    eprintln!(
        "seed {seed:#x}: {} requests, {} layouts ({} in place, {} indirect, {} pieces crossing a \
         region boundary) over {} regions in {:?}",
        cases(),
        stats[0],
        stats[1],
        stats[2],
        stats[3],
        ranges.len(),
        started.elapsed()
    );
    assert!(stats[3] > 0 && stats[1] > 0 && stats[2] > 0);
}
