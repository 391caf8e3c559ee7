// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The descriptors a [`DriverQueue`] lays out: a request's shape written
//! once per buffer set and reused while it does not change, the check
//! that they are still as written after a run, and raw requests'
//! descriptors written exactly as a trace gives them.

use super::queue::{Placement, Shape, SlotLayout};
use super::{DescMode, DriverQueue, DESCS_PER_REQUEST, MAX_RAW_DESCS};
use crate::driver_ring::{self, encode, indirect_head, Buf, Descriptor};
use vhost_user_crypto::wire::virtio_crypto::OP_DATA_REQ_SIZE;

impl DriverQueue {
    /// [`DriverQueue::submit_request_in`]'s descriptors for `slot` when
    /// some are (re)written for `shape` (`unchanged`: the indirect table
    /// of the shape's placement holds that shape already). What is
    /// rewritten must still be as this tool left it, or a backend's write
    /// to it would be repaired unseen before [`DriverQueue::check_descs`]
    /// looks: it is checked first (the first change found is kept for
    /// `check_descs`).
    /// Returns the head. (Out of line: the usual request rewrites nothing,
    /// and its path stays short.)
    #[cold]
    #[inline(never)]
    pub(super) fn rewrite_descs(&mut self, slot: u16, shape: Shape, unchanged: bool) -> u16 {
        let t = Self::table_index(self.buf(slot), shape);
        if self.desc_fault.is_none() {
            let old_table = self.shape.get(t).copied().flatten().filter(|_| !unchanged);
            let old_head = self.head_shape.get(usize::from(slot)).copied().flatten();
            self.desc_fault = match self.desc_mode {
                DescMode::Indirect => old_table
                    .and_then(|o| self.table_fault(t, o))
                    .or_else(|| old_head.and_then(|o| self.head_fault(slot, o))),
                DescMode::Chain => old_table.and_then(|o| self.chain_fault(slot, o)),
            };
        }
        if let Some(s) = self.shape.get_mut(t) {
            *s = Some(shape);
        }
        self.write_descs(slot, shape, unchanged)
    }

    /// Writes [`DriverQueue::submit_request`]'s descriptors for `slot`
    /// and `shape` (iv_len, len, digest_len, placement): in indirect mode
    /// the buffer set's table for that placement unless `unchanged` (it
    /// holds them already) and the slot's head descriptor, in chain mode
    /// the chain. Returns the head.
    #[inline(never)]
    fn write_descs(&mut self, slot: u16, shape: Shape, unchanged: bool) -> u16 {
        let l = self.shape_layout(self.buf(slot), shape);
        let (bufs, n) = Self::shape_bufs(l, shape);
        let mem = &*self.mem;
        match self.desc_mode {
            DescMode::Indirect => {
                if !unchanged {
                    driver_ring::write_table(mem, l.table, &bufs[..n]);
                }
                // The slot's head descriptor may point at the set's table
                // for another shape (another slot of the set changed it), or
                // not at all yet.
                self.ring.write_desc(mem, slot, &indirect_head(l.table, n));
                self.head_shape[usize::from(slot)] = Some(shape);
                slot
            }
            DescMode::Chain => self.ring.write_chain(mem, slot * DESCS_PER_REQUEST, &bufs[..n]),
        }
    }

    /// The buffers of a request of `shape` (iv_len, len, digest_len,
    /// placement) laid out at `l`, in the order [`DriverQueue::write_descs`]
    /// links them ([`driver_ring::chain`]): header ([`OP_DATA_REQ_SIZE`] bytes), IV, src,
    /// dst (src when in place), the hash result when it has bytes, status.
    /// Returns them and how many.
    fn shape_bufs(l: SlotLayout, shape: Shape) -> ([Buf; DESCS_PER_REQUEST as usize], usize) {
        let (iv_len, len, digest_len, placement) = shape;
        let dst = if placement == Placement::InPlace {
            l.src
        } else {
            l.dst
        };
        let all = [
            Buf::readable(l.hdr, OP_DATA_REQ_SIZE as u32),
            Buf::readable(l.iv, iv_len),
            Buf::readable(l.src, len),
            Buf::writable(dst, len),
            Buf::writable(l.digest, digest_len),
            Buf::writable(l.status, 1),
        ];
        let mut out = [Buf::readable(0, 0); DESCS_PER_REQUEST as usize];
        let mut n = 0;
        for buf in all {
            if buf.len > 0 || buf.addr != l.digest {
                out[n] = buf;
                n += 1;
            }
        }
        (out, n)
    }

    /// Checks that the descriptors this queue laid out for the trace's
    /// requests (both indirect tables of every set and every slot's head in
    /// indirect mode, every slot's chain in chain mode) still hold what it
    /// wrote: the descriptor table is the driver's part of the split
    /// virtqueue (VIRTIO 1.2 §2.7: each part is written by the driver or by
    /// the device, not both) and an indirect table is a device-readable
    /// buffer, which a device must not write (§2.7.5.1), so a change is a
    /// backend's write. Raw requests' descriptors
    /// ([`DriverQueue::submit_descs`]) are not covered. Call it with no
    /// request in flight.
    ///
    /// # Errors
    /// Where the first changed descriptor is (ring index, or buffer set,
    /// table (0 or 1) and entry). The queue then forgets what it laid out,
    /// so the next requests write their descriptors again.
    pub fn check_descs(&mut self) -> Result<(), String> {
        let mut bad = self.desc_fault.take();
        match self.desc_mode {
            DescMode::Indirect => {
                for (t, shape) in self.shape.iter().enumerate() {
                    if bad.is_some() {
                        break;
                    }
                    bad = shape.and_then(|o| self.table_fault(t, o));
                }
                for (slot, shape) in self.head_shape.iter().enumerate() {
                    if bad.is_some() {
                        break;
                    }
                    bad = shape.and_then(|o| self.head_fault(slot as u16, o));
                }
            }
            DescMode::Chain => {
                // Every slot has its own buffer set here, never swapped:
                // slot s's shape is at 2 * s.
                for (t, shape) in self.shape.iter().enumerate() {
                    if bad.is_some() {
                        break;
                    }
                    bad = shape.and_then(|o| self.chain_fault((t / 2) as u16, o));
                }
            }
        }
        match bad {
            None => Ok(()),
            Some(at) => {
                self.shape.iter_mut().for_each(|s| *s = None);
                self.head_shape.iter_mut().for_each(|s| *s = None);
                Err(at)
            }
        }
    }

    /// The 16 bytes of the descriptor at `gpa`.
    fn desc_at(&self, gpa: u64) -> [u8; 16] {
        let mut b = [0u8; 16];
        self.mem.read(gpa, &mut b);
        b
    }

    /// Where indirect table `t` (an index into [`DriverQueue::shape`])
    /// differs from what [`DriverQueue::write_descs`] put there for
    /// `shape`.
    #[cold]
    #[inline(never)]
    fn table_fault(&self, t: usize, shape: Shape) -> Option<String> {
        let l = self.shape_layout(t / 2, shape);
        let (bufs, n) = Self::shape_bufs(l, shape);
        let bad = driver_ring::chain(&bufs[..n], 0)
            .enumerate()
            .find(|(i, d)| self.desc_at(l.table + 16 * *i as u64) != encode(d));
        let (b, k) = (t / 2, t % 2);
        bad.map(|(i, _)| format!("buffer set {b}'s indirect table {k}, entry {i}"))
    }

    /// Whether slot `slot`'s ring descriptor differs from the indirect
    /// head written for `shape`.
    #[cold]
    #[inline(never)]
    fn head_fault(&self, slot: u16, shape: Shape) -> Option<String> {
        let l = self.shape_layout(self.buf(slot), shape);
        let d = indirect_head(l.table, Self::shape_bufs(l, shape).1);
        (self.desc_at(self.ring.ring().desc_at(slot)) != encode(&d))
            .then(|| format!("ring descriptor {slot} (indirect head)"))
    }

    /// Where slot `slot`'s direct chain differs from the one written for
    /// `shape` (chain mode: the slot's buffer set is the slot's own).
    #[cold]
    #[inline(never)]
    fn chain_fault(&self, slot: u16, shape: Shape) -> Option<String> {
        let (bufs, n) = Self::shape_bufs(self.shape_layout(usize::from(slot), shape), shape);
        let base = slot * DESCS_PER_REQUEST;
        let ring = self.ring.ring();
        let bad = driver_ring::chain(&bufs[..n], base)
            .zip(base..)
            .find(|(d, i)| self.desc_at(ring.desc_at(*i)) != encode(d));
        bad.map(|(_, i)| format!("ring descriptor {i} (chain of slot {slot})"))
    }

    /// Makes a raw request available in `slot`, its descriptors written
    /// exactly as given (flags and `next` included): as the slot's indirect
    /// table (at most [`MAX_RAW_DESCS`]), or, on a queue in chain mode, as a
    /// direct chain in the slot's block of the ring's table (at most
    /// [`DESCS_PER_REQUEST`]; `next` values are then offset by the block's
    /// first index, so they stay relative to the request). Returns the
    /// head descriptor's index in the ring's table (the used id the
    /// request must come back with).
    ///
    /// # Errors
    /// Too many descriptors, or a direct chain on a queue in indirect mode.
    pub fn submit_descs(&mut self, slot: u16, descs: &[Descriptor], indirect: bool) -> Result<u16, String> {
        // The raw table may cover both of the set's tables.
        let b = self.buf(slot);
        for s in self.shape.iter_mut().skip(2 * b).take(2) {
            *s = None;
        }
        if let Some(s) = self.head_shape.get_mut(usize::from(slot)) {
            *s = None;
        }
        let head = self.raw_desc_images(slot, descs, indirect, |gpa, d| self.mem.write(gpa, &d))?;
        self.take_slot(slot);
        self.ring.push(&*self.mem, head);
        Ok(head)
    }

    /// The descriptors [`DriverQueue::submit_descs`]`(slot, descs,
    /// indirect)` writes, each handed to `put` as (guest address, its 16
    /// bytes) in the order written: for an indirect request (`indirect`,
    /// on a queue in either mode) the table's entries, then the head in
    /// the ring's table; for a direct chain the chain. Nothing is written
    /// here. Returns the head's index in the ring's table.
    ///
    /// # Errors
    /// As [`DriverQueue::submit_descs`], before anything is handed to `put`.
    pub fn raw_desc_images(
        &self,
        slot: u16,
        descs: &[Descriptor],
        indirect: bool,
        mut put: impl FnMut(u64, [u8; 16]),
    ) -> Result<u16, String> {
        if indirect {
            if descs.len() > MAX_RAW_DESCS {
                return Err(format!(
                    "at most {MAX_RAW_DESCS} descriptors in a raw indirect table"
                ));
            }
            let table = self.layout(slot).table;
            for (i, d) in descs.iter().enumerate() {
                put(table + 16 * i as u64, encode(d));
            }
            let d = indirect_head(table, descs.len());
            let head = match self.desc_mode {
                DescMode::Indirect => slot,
                DescMode::Chain => slot * DESCS_PER_REQUEST,
            };
            put(self.ring.ring().desc_at(head), encode(&d));
            Ok(head)
        } else {
            if self.desc_mode != DescMode::Chain {
                return Err("raw direct chains need --descriptors chain".into());
            }
            if descs.len() > usize::from(DESCS_PER_REQUEST) || descs.is_empty() {
                return Err(format!(
                    "1 to {DESCS_PER_REQUEST} descriptors in a raw direct chain"
                ));
            }
            let base = slot * DESCS_PER_REQUEST;
            for (i, d) in descs.iter().enumerate() {
                let d = Descriptor::new(d.addr().0, d.len(), d.flags(), d.next().wrapping_add(base));
                put(self.ring.ring().desc_at(base + i as u16), encode(&d));
            }
            Ok(base)
        }
    }
}
