// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A guest that rewrites descriptors, indirect tables, request headers and
//! avail entries *while* the device works on them: every guest field is
//! read once.
//!
//! The racing test runs `QueueWorker::process` on batches of 32 requests in
//! real guest memory while a second thread keeps flipping guest-controlled
//! fields between a few versions each: header fields (opcode, session id,
//! op_type, iv_len, src/dst lengths, the AlgChain offsets and lengths, the
//! IV), every field of the descriptors of direct chains (addr, len, flags,
//! next), the ring descriptor that points at an indirect table (which table,
//! its length, its flags), the entries of both indirect tables, and avail
//! ring entries. Most flips are single atomic stores, some are written byte
//! by byte, so the device may also see a mix of two versions; the allowed
//! sets below take every byte-wise mix into account. Every version of every
//! field stays inside the request's own 64 KiB area, `next` values only
//! point forward (or out of the table), and canary memory surrounds every
//! buffer. Each batch is processed 16 times in a row (on whatever memory the
//! previous rounds and the flipping thread left) before memory is checked
//! and reset. After each round:
//!
//! * `process` returned (no panic), completed all 32 chains and published
//!   the used index; each used element names a head the avail entry held in
//!   some version (exactly the submitted heads, once each, when avail
//!   entries are not flipped);
//! * each used length is 0, 1, or at most the largest total writable length
//!   any version of the request's descriptors declared (a header length
//!   version of 4096 is larger than all of them);
//!
//! and after each batch:
//!
//! * every byte outside the writable buffers of all versions is unchanged
//!   (flipped fields hold one of their versions, byte by byte), in the
//!   whole 4 MiB of guest memory;
//! * every status buffer holds its canary or a virtio-crypto status;
//! * requests nobody flips (a quarter of each batch) give exactly OpenSSL's
//!   output, status OK and used length `len + 1`.
//!
//! The requests and their versions are in [`model`]; the deterministic
//! tests at the library's seams in [`seams`].

mod model;
mod seams;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use crate::common::*;
use model::*;
use vhost_user_crypto::wire::virtio_crypto::Status;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// Sub-runs (request sets), batches per sub-run, and times each batch is
/// processed before memory is checked and reset.
const SEEDS: u64 = 8;
const BATCHES: u32 = 200;
const ROUNDS: u32 = 16;

fn mutator(mem: &GuestMemoryMmap<()>, fields: &[Field], seed: u64, stop: &AtomicBool, flips: &AtomicU64) {
    if fields.is_empty() {
        return;
    }
    let mut rng = Rng::new(seed);
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..64 {
            let f = &fields[rng.range(0, fields.len() as u64 - 1) as usize];
            let v = f.versions[rng.range(0, f.versions.len() as u64 - 1) as usize];
            let at = GuestAddress(f.addr);
            if rng.next_u64().is_multiple_of(8) {
                // Byte by byte, lowest or highest first.
                let bytes = v.to_le_bytes();
                let up = rng.next_u64().is_multiple_of(2);
                for k in 0..f.width {
                    let k = if up { k } else { f.width - 1 - k };
                    mem.store(bytes[k], GuestAddress(f.addr + k as u64), Ordering::Relaxed)
                        .unwrap();
                }
            } else {
                match f.width {
                    2 => mem.store(v as u16, at, Ordering::Relaxed),
                    4 => mem.store(v as u32, at, Ordering::Relaxed),
                    _ => mem.store(v, at, Ordering::Relaxed),
                }
                .unwrap();
            }
            n += 1;
        }
    }
    flips.fetch_add(n, Ordering::Relaxed);
}

#[derive(Debug, Default)]
struct Tally {
    batches: u64,
    requests: u64,
    consumed: u64,
    errors: u64,
    ok: u64,
    control_ok: u64,
    status_values: Vec<u64>,
}

/// One sub-run: a fresh set of 32 requests from `seed`, `batches` batches
/// raced by the flipping thread.
fn race(seed: u64, batches: u32, flip_avail: bool, tally: &mut Tally, flips: &AtomicU64) {
    let mut vm = Vm::with_ranges(&[(0, MEM)]);
    let sessions = create_sessions(&mut vm);
    let mut rng = Rng::new(seed);
    let slots: Vec<Slot> = (0..SLOTS)
        .map(|i| Slot::new(i, &mut rng, &sessions, i % 4 == 0))
        .collect();
    // Avail position p holds slot order[p].
    let mut order: Vec<usize> = (0..SLOTS).collect();
    for k in (1..SLOTS).rev() {
        order.swap(k, rng.range(0, k as u64) as usize);
    }

    let mut img = vec![0u8; MEM];
    let mut class = vec![STATIC; MEM];
    for (i, s) in slots.iter().enumerate() {
        s.lay_out(i, &mut img, &mut class);
    }
    let used = RING_USED as usize;
    class[used..used + USED_BYTES as usize].fill(DEVICE);
    img[RING_AVAIL as usize + 2..RING_AVAIL as usize + 4].copy_from_slice(&(SLOTS as u16).to_le_bytes());
    let mut fields: Vec<Field> = slots.iter().flat_map(Slot::fields).collect();
    // Avail entries: the head, another flipped request's head, or one
    // past the table (256 further: one byte apart).
    let mut avail_versions: Vec<Vec<u64>> = Vec::new();
    for (p, &s) in order.iter().enumerate() {
        let head = u64::from(slots[s].head);
        let at = RING_AVAIL + 4 + 2 * p as u64;
        img[at as usize..at as usize + 2].copy_from_slice(&(head as u16).to_le_bytes());
        let mut v = vec![head];
        if flip_avail && !slots[s].control && rng.next_u64().is_multiple_of(3) {
            let other = (0..SLOTS)
                .map(|k| (s + 1 + k) % SLOTS)
                .find(|&k| !slots[k].control)
                .unwrap();
            v.extend([u64::from(slots[other].head), head + 256]);
            fields.push(Field {
                addr: at,
                width: 2,
                versions: v.clone(),
            });
            class[at as usize..at as usize + 2].fill(FLIPPED);
        }
        avail_versions.push(mixes(&v, 2));
    }
    let max_used: Vec<u64> = slots.iter().map(Slot::max_used).collect();
    let expected: Vec<Option<Vec<u8>>> = slots
        .iter()
        .map(|s| s.control.then(|| s.expected_output()))
        .collect();
    let mut heads: Vec<u32> = slots.iter().map(|s| u32::from(s.head)).collect();
    heads.sort_unstable();

    let stop = AtomicBool::new(false);
    let ring = vm.ring();
    let Vm { mem, worker, .. } = &mut vm;
    let mem: &GuestMemoryMmap<()> = mem;
    let mut seen = vec![0u8; MEM];
    std::thread::scope(|sc| {
        sc.spawn(|| mutator(mem, &fields, seed ^ 0x5eed, &stop, flips));
        // A panic below must still stop the flipping thread.
        struct StopOnDrop<'a>(&'a AtomicBool);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let _stop = StopOnDrop(&stop);
        let mut used_reset = vec![0xFFu8; 4 + 8 * SLOTS];
        used_reset[..4].fill(0);
        let mut used_seen = vec![0u8; 4 + 8 * SLOTS];
        for batch in 0..batches {
            // Initial state (flipped fields start over from their first
            // version; the thread keeps flipping them meanwhile).
            mem.write_slice(&img, GuestAddress(0)).unwrap();
            // The same 32 chains, processed ROUNDS times on memory the
            // previous rounds (and the flipping thread) left behind.
            for round in 0..ROUNDS {
                mem.write_slice(&used_reset, GuestAddress(RING_USED)).unwrap();
                let (mut next_avail, mut next_used) = (0u16, 0u16);
                let r = worker.process(mem, ring, &mut next_avail, &mut next_used);
                let ctx = || format!("seed {seed} batch {batch} round {round}");
                assert_eq!(r.completed, SLOTS as u32, "{}: chains completed", ctx());
                assert_eq!((next_avail, next_used), (SLOTS as u16, SLOTS as u16), "{}", ctx());
                mem.read_slice(&mut used_seen, GuestAddress(RING_USED)).unwrap();
                let u32_at = |a: usize| u32::from_le_bytes(used_seen[a..a + 4].try_into().unwrap());
                assert_eq!(
                    u16::from_le_bytes([used_seen[2], used_seen[3]]),
                    SLOTS as u16,
                    "{}: used.idx",
                    ctx()
                );
                let mut ids = Vec::with_capacity(SLOTS);
                for (p, &s) in order.iter().enumerate() {
                    let id = u32_at(4 + 8 * p);
                    let len = u32_at(8 + 8 * p);
                    ids.push(id);
                    assert!(
                        avail_versions[p].contains(&u64::from(id)),
                        "{}: used element {p} names head {id}, avail held {:?}",
                        ctx(),
                        avail_versions[p]
                    );
                    tally.requests += 1;
                    match len {
                        0 => tally.consumed += 1,
                        1 => tally.errors += 1,
                        _ => tally.ok += 1,
                    }
                    if id >= u32::from(QSIZE) {
                        assert_eq!(len, 0, "{}: head {id} is outside the table", ctx());
                        continue;
                    }
                    let owner = usize::from(id as u16 / BLOCK);
                    assert!(
                        u64::from(len) <= max_used[owner].max(1),
                        "{}: used length {len} for head {id}, its descriptors never declared more than {} writable bytes",
                        ctx(),
                        max_used[owner]
                    );
                    if slots[s].control {
                        assert_eq!(
                            len,
                            slots[s].len + 1,
                            "{}: control request {s}: used length",
                            ctx()
                        );
                    }
                }
                if !flip_avail {
                    ids.sort_unstable();
                    assert_eq!(ids, heads, "{}: every head completed exactly once", ctx());
                }
            }
            mem.read_slice(&mut seen, GuestAddress(0)).unwrap();
            let ctx = format!("seed {seed} batch {batch}");
            for (s, want) in expected.iter().enumerate() {
                if let Some(want) = want {
                    let dst = box_addr(s, BOX_DST, OFF_A) as usize;
                    let st = seen[box_addr(s, BOX_ST, OFF_A) as usize];
                    assert_eq!(st, OK, "{ctx}: control request {s}: status");
                    assert!(
                        seen[dst..dst + want.len()] == want[..],
                        "{ctx}: control request {s}: output"
                    );
                    tally.control_ok += 1;
                }
            }

            // Bytes nobody may have written.
            if let Some(k) = (0..MEM).find(|&k| class[k] == STATIC && seen[k] != img[k]) {
                panic!(
                    "{ctx}: byte {k:#x} outside every writable buffer changed: {:#04x} -> {:#04x}",
                    img[k], seen[k]
                );
            }
            for f in &fields {
                for k in 0..f.width {
                    let a = f.addr as usize + k;
                    if class[a] == FLIPPED {
                        let b = u64::from(seen[a]);
                        assert!(
                            f.versions.iter().any(|v| (v >> (8 * k)) & 0xFF == b),
                            "{ctx}: flipped field at {:#x} byte {k} holds {b:#04x}, none of its versions",
                            f.addr
                        );
                    }
                }
            }
            for s in 0..SLOTS {
                for off in [OFF_A, OFF_B] {
                    let st = seen[box_addr(s, BOX_ST, off) as usize];
                    assert!(
                        st == ST_CANARY || st <= Status::NoSpc as u8,
                        "{ctx}: status buffer of request {s} holds {st:#04x}"
                    );
                    tally.status_values[usize::from(st)] += 1;
                }
            }
            tally.batches += 1;
        }
    });
}

#[test]
fn guest_flipping_fields_during_processing_cannot_widen_the_snapshot() {
    let t = Instant::now();
    let flips = AtomicU64::new(0);
    let mut tally = Tally {
        status_values: vec![0; 256],
        ..Default::default()
    };
    for seed in 1..=SEEDS {
        race(seed, BATCHES, seed % 2 == 0, &mut tally, &flips);
    }
    let flips = flips.load(Ordering::Relaxed);
    eprintln!(
        "{} batches, {} requests ({} ok, {} errors, {} consumed; {} exact control results), {flips} flips, {:?}",
        tally.batches,
        tally.requests,
        tally.ok,
        tally.errors,
        tally.consumed,
        tally.control_ok,
        t.elapsed()
    );
    let s = &tally.status_values;
    eprintln!(
        "status buffers: untouched {}, OK {}, ERR {}, NOTSUPP {}, INVSESS {}",
        s[usize::from(ST_CANARY)],
        s[0],
        s[1],
        s[3],
        s[4]
    );
    assert_eq!(tally.requests, SEEDS * u64::from(BATCHES * ROUNDS) * SLOTS as u64);
    assert!(flips > 100_000, "the guest thread flipped only {flips} times");
    // The flips reached the device: every kind of outcome occurred.
    assert!(
        tally.ok > 0 && tally.errors > 0 && tally.consumed > 0,
        "{tally:?}"
    );
    assert!(
        s[0] > 0 && s[1] > 0 && s[3] > 0 && s[4] > 0,
        "status values seen: {s:?}"
    );
    assert_eq!(tally.control_ok, SEEDS * u64::from(BATCHES) * SLOTS as u64 / 4);
}

#[test]
fn mixes_cover_byte_wise_tears() {
    assert_eq!(mixes(&[0x0100, 0x0900], 2), vec![0x0100, 0x0900]);
    let mut m = mixes(&[0x40, 0x1000], 4);
    m.sort_unstable();
    assert_eq!(m, vec![0, 0x40, 0x1000, 0x1040]);
    assert_eq!(mixes(&[7], 8), vec![7]);
}
