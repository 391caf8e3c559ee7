// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! One `process` call of the harness and the checks after it: index
//! movement, no allocation, writes only to the used ring and declared
//! writable buffers, and the staged requests' results.

use vhost_crypto_replay::driver_ring::{decode, UsedElem, DESC_SIZE};
use vhost_user_crypto::virtq::ring::RingAddrs;
use vhost_user_crypto::worker::BatchResult;
use vm_memory::{Bytes, GuestAddress};

use super::super::alloc;
use super::machine::{Machine, Outcome};
use super::OK;

impl Machine {
    /// Byte ranges `process` may write, or `None` when the writable buffers
    /// overlap the ring structures (then writes can create new descriptors
    /// mid-batch and no static set is exact).
    pub(super) fn allowed_writes(&self) -> Option<Vec<(u64, u64)>> {
        let a = self.driver.ring();
        let n = u64::from(a.size);
        if a.size == 0 || a.size > 32768 || !a.size.is_power_of_two() {
            return Some(Vec::new());
        }
        let desc = (a.desc, a.desc.saturating_add(16 * n));
        let avail = (a.avail, a.avail.saturating_add(6 + 2 * n));
        let used = (a.used, a.used.saturating_add(6 + 8 * n));
        let mut structures = vec![desc, avail];
        let mut writable = vec![used];
        if !self.mapped(a.desc, 16 * n) || !self.mapped(a.avail, 6 + 2 * n) || !self.mapped(a.used, 6 + 8 * n)
        {
            // The ring cannot be mapped: process must write nothing.
            return Some(Vec::new());
        }
        let table = self.peek(a.desc, (16 * n) as usize);
        let mut budget: u64 = 16 * 1024;
        let desc = |b: &[u8]| decode(b.try_into().unwrap_or([0; DESC_SIZE]));
        for d in table.chunks_exact(DESC_SIZE).map(desc) {
            let addr = d.addr().0;
            if d.refers_to_indirect_table() {
                let len = u64::from(d.len()) / 16 * 16;
                let t = (addr, addr.saturating_add(len));
                if len == 0 || structures.contains(&t) || !self.mapped(addr, len) {
                    continue;
                }
                // Keep the harness fast on tables full of huge indirect
                // descriptors: past a budget, skip the check.
                budget = budget.checked_sub(len / 16)?;
                structures.push(t);
                for e in self.peek(addr, len as usize).chunks_exact(DESC_SIZE).map(desc) {
                    if e.is_write_only() && e.len() > 0 {
                        writable.push((e.addr().0, e.addr().0.saturating_add(e.len().into())));
                    }
                }
            } else if d.is_write_only() && d.len() > 0 {
                writable.push((addr, addr.saturating_add(d.len().into())));
            }
        }
        let overlap = |x: (u64, u64), y: (u64, u64)| x.0 < y.1 && y.0 < x.1;
        if writable
            .iter()
            .any(|&w| structures.iter().any(|&s| overlap(w, s)))
        {
            return None;
        }
        Some(writable)
    }

    /// Copies every region into `into` (buffers reused between calls).
    pub(super) fn snapshot(&self, into: &mut Vec<Vec<u8>>) {
        into.resize_with(self.guest.ranges.len(), Vec::new);
        for (&(s, e), buf) in self.guest.ranges.iter().zip(into.iter_mut()) {
            buf.resize((e - s) as usize, 0);
            let _ = self.guest.mem.read_slice(buf, GuestAddress(s));
        }
    }

    pub(super) fn process(&mut self, out: &mut Outcome) {
        let allowed = self.allowed_writes();
        let mut before = std::mem::take(&mut self.before);
        let mut after = std::mem::take(&mut self.after);
        self.snapshot(&mut before);
        let (na, nu) = (self.next_avail, self.next_used);
        let pushed = self.pushed;
        let a = self.driver.ring();
        let ring = RingAddrs {
            size: a.size,
            desc: a.desc,
            avail: a.avail,
            used: a.used,
        };
        let (count0, _) = alloc::counts();
        // One batch per `process` call, called again while it completes
        // any (as the daemon's worker does). The device's own output may
        // move the avail index (a dst over the avail ring), so the calls
        // are capped at two rings' worth of the largest queue.
        let r = alloc::counted(|| {
            let mut all = BatchResult::default();
            loop {
                let r = self
                    .worker
                    .process(&self.guest.mem, ring, &mut self.next_avail, &mut self.next_used);
                all.completed += r.completed;
                all.notify |= r.notify;
                if r.completed == 0 || all.completed >= 65536 {
                    return all;
                }
            }
        });
        let (count1, bytes) = alloc::counts();
        assert_eq!(
            count1 - count0,
            0,
            "process allocated {} times ({bytes} bytes in all so far)",
            count1 - count0
        );
        assert_eq!(
            self.next_avail.wrapping_sub(na),
            r.completed as u16,
            "next_avail moved by the completed count"
        );
        assert_eq!(
            self.next_used.wrapping_sub(nu),
            r.completed as u16,
            "next_used moved by the completed count"
        );
        assert!(r.completed <= 65536 * 2, "completed {}", r.completed);
        out.batches += 1;
        out.completed += r.completed;

        // Nothing written outside the used ring and declared writable bytes.
        self.snapshot(&mut after);
        if let Some(allowed) = &allowed {
            out.contained += 1;
            // Compare in chunks (memcmp), bytes only where a chunk differs.
            const CHUNK: usize = 64;
            for ((&(s, _), b), a) in self.guest.ranges.iter().zip(&before).zip(&after) {
                let chunks = b.chunks(CHUNK).zip(a.chunks(CHUNK)).enumerate();
                for (c, (bc, ac)) in chunks.filter(|(_, (bc, ac))| bc != ac) {
                    for (i, (x, y)) in bc.iter().zip(ac.iter()).enumerate().filter(|(_, (x, y))| x != y) {
                        let addr = s + (c * CHUNK + i) as u64;
                        assert!(
                            allowed.iter().any(|&(lo, hi)| lo <= addr && addr < hi),
                            "process wrote {addr:#x} ({x:#04x} -> {y:#04x}), outside every writable \
                             buffer and the used ring"
                        );
                    }
                }
            }
        }

        // Staged requests: status, used length, output.
        let pending = std::mem::take(&mut self.pending);
        let a = self.driver.ring();
        let n = u64::from(a.size);
        let structures = [
            (a.desc, a.desc.saturating_add(16 * n)),
            (a.avail, a.avail.saturating_add(6 + 2 * n)),
            (a.used, a.used.saturating_add(6 + 8 * n)),
        ];
        let overlap = |x: (u64, u64), y: (u64, u64)| x.0 < y.1 && y.0 < x.1;
        let disjoint = pending.iter().enumerate().all(|(i, p)| {
            p.footprint.iter().all(|&f| {
                structures.iter().all(|&s| !overlap(f, s))
                    && pending
                        .iter()
                        .enumerate()
                        .all(|(j, q)| i == j || q.footprint.iter().all(|&g| !overlap(f, g)))
            })
        });
        if self.clean && disjoint && u32::from(pushed) == r.completed && pushed as usize == pending.len() {
            for p in &pending {
                let at = nu.wrapping_add(p.avail_pos.wrapping_sub(na));
                let UsedElem { id, len } = self.driver.used_elem(&self.guest, at);
                let total: u64 = p.dst.iter().map(|d| d.1).sum::<u64>() - 1;
                let what = format!(
                    "staged request at avail {} (head {}, {total} bytes)",
                    p.avail_pos, p.head
                );
                assert_eq!(id, u32::from(p.head), "{what}: used id");
                assert_eq!(self.peek(p.status_at, 1)[0], p.status, "{what}: status");
                let want_len = if p.status == OK { total as u32 + 1 } else { 1 };
                assert_eq!(len, want_len, "{what}: used length");
                if p.status == OK {
                    let mut got = Vec::with_capacity(p.out.len());
                    for &(a, l) in &p.dst {
                        got.extend(self.peek(a, l as usize));
                    }
                    got.truncate(p.out.len());
                    assert!(got == p.out, "{what}: output differs from the reference cipher");
                    out.verified_ok += 1;
                }
                out.verified += 1;
            }
        }
        self.before = before;
        self.after = after;
        self.clean = true;
        self.pushed = 0;
        self.descs.reset();
        self.tables.reset();
    }
}
