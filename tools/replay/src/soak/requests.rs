// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! One soak request from the stream: its session, queue, size, layout,
//! IV and data, its header, and its descriptors (the five natural pieces
//! or cut at random offsets, in a direct chain or an indirect table).

use algorithms::Direction;
use vhost_user_crypto::wire::virtio_crypto::{
    OpDataReq, AES_CBC_IV_LEN, OP_DATA_REQ_SIZE, VIRTIO_CRYPTO_CIPHER_DECRYPT, VIRTIO_CRYPTO_CIPHER_ENCRYPT,
    VIRTIO_CRYPTO_SYM_OP_CIPHER,
};

use super::run::{Pending, Soak};
use super::{Layouts, DST_CANARY, DST_GAP, MAX_DST_PIECES};
use crate::driver_ring::{self, Buf, Descriptor};
use crate::frontend::{Error, SlotLayout, MAX_RAW_DESCS};
use crate::replay::put_status_area;
use crate::rng::{below, Rng as _, SplitMix64};

/// The header of a soak request: a plain cipher request of `len` bytes
/// (IV 16 bytes, dst as long as src) in session `sid`.
pub(super) fn request_header(dir: Direction, sid: u64, len: u32) -> [u8; OP_DATA_REQ_SIZE] {
    OpDataReq {
        opcode: match dir {
            Direction::Encrypt => VIRTIO_CRYPTO_CIPHER_ENCRYPT,
            Direction::Decrypt => VIRTIO_CRYPTO_CIPHER_DECRYPT,
        },
        algo: 0,
        session_id: sid,
        op_type: VIRTIO_CRYPTO_SYM_OP_CIPHER,
        iv_len: AES_CBC_IV_LEN,
        src_data_len: len,
        dst_data_len: len,
    }
    .to_bytes()
}

/// Bytes of a request's readable stream before its src: header and IV.
const HEAD_LEN: u32 = OP_DATA_REQ_SIZE as u32 + AES_CBC_IV_LEN;

/// Where a soak request's contiguous readable stream (header, IV, src)
/// starts: [`HEAD_LEN`] bytes before the slot's src, inside the slot's
/// header area.
pub(super) fn readable_start(l: SlotLayout) -> u64 {
    debug_assert!(l.src - l.hdr >= u64::from(HEAD_LEN));
    l.src - u64::from(HEAD_LEN)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Layout {
    /// Direct chain: header, IV, src, dst, status.
    Direct,
    /// Direct chain, readable and dst bytes cut at random offsets (≤ 5 descriptors).
    DirectCut,
    /// Indirect table: header, IV, src, dst, status.
    Indirect,
    /// Indirect table, readable and dst bytes cut at random offsets (≤ 16 descriptors).
    IndirectCut,
}

impl Layout {
    pub(super) fn name(self) -> &'static str {
        match self {
            Layout::Direct => "direct",
            Layout::DirectCut => "direct-cut",
            Layout::Indirect => "indirect",
            Layout::IndirectCut => "indirect-cut",
        }
    }
}

/// Cuts `total` into `pieces` lengths of at least one byte each, at random offsets.
pub(super) fn cuts(rng: &mut SplitMix64, total: u32, pieces: usize) -> Vec<u32> {
    let pieces = pieces.clamp(1, total as usize);
    let mut points: Vec<u32> = (1..pieces)
        .map(|_| 1 + (rng.next_u64() % u64::from(total - 1)) as u32)
        .collect();
    points.push(0);
    points.push(total);
    points.sort_unstable();
    points.dedup();
    points.windows(2).map(|p| p[1] - p[0]).collect()
}

impl Soak<'_, '_> {
    pub(super) fn pick_layout(&mut self) -> Layout {
        let r = below(&mut self.rng, 4);
        match (self.o.layouts, r) {
            (Layouts::Mixed, 0) | (Layouts::Chain, 0 | 1) => Layout::Direct,
            (Layouts::Mixed, 1) | (Layouts::Chain, _) => Layout::DirectCut,
            (Layouts::Mixed, 2) | (Layouts::Indirect, 0 | 1) => Layout::Indirect,
            _ => Layout::IndirectCut,
        }
    }

    pub(super) fn pick_size(&mut self) -> u32 {
        let max_blocks = (self.o.max_size / 16) as u64;
        let (lo, hi) = match below(&mut self.rng, 100) {
            0..50 => (1, 16),
            50..80 => (17, 128),
            80..95 => (129, 512),
            _ => (513, 1024),
        };
        let hi = hi.min(max_blocks);
        let lo = lo.min(hi);
        (16 * (lo + below(&mut self.rng, hi - lo + 1))) as u32
    }

    /// The descriptors of a request of `len` bytes in `slot`'s buffers: the
    /// readable stream header | IV | src is one contiguous area (ending at
    /// the slot's src, see [`readable_start`]), cut anywhere; dst is cut
    /// into pieces `DST_GAP` bytes apart (returned too).
    pub(super) fn descs(&mut self, l: SlotLayout, len: u32, layout: Layout) -> (Vec<Descriptor>, Vec<u32>) {
        let readable = HEAD_LEN + len;
        let (r_cuts, d_cuts) = match layout {
            Layout::Direct | Layout::Indirect => {
                (vec![OP_DATA_REQ_SIZE as u32, AES_CBC_IV_LEN, len], vec![len])
            }
            Layout::DirectCut => {
                let r = 1 + below(&mut self.rng, 3) as usize;
                let d = 1 + below(&mut self.rng, (4 - r) as u64) as usize;
                (cuts(&mut self.rng, readable, r), cuts(&mut self.rng, len, d))
            }
            Layout::IndirectCut => {
                let r = 1 + below(&mut self.rng, 7) as usize;
                let d = 1 + below(&mut self.rng, 8) as usize;
                (cuts(&mut self.rng, readable, r), cuts(&mut self.rng, len, d))
            }
        };
        let mut out = Vec::with_capacity(r_cuts.len() + d_cuts.len() + 1);
        let mut at = readable_start(l);
        for n in r_cuts {
            out.push(Buf::readable(at, n));
            at += u64::from(n);
        }
        debug_assert!(d_cuts.len() <= MAX_DST_PIECES);
        let mut at = l.dst;
        for &n in &d_cuts {
            out.push(Buf::writable(at, n));
            at += u64::from(n + DST_GAP);
        }
        out.push(Buf::writable(l.status, 1));
        debug_assert!(out.len() <= MAX_RAW_DESCS);
        (driver_ring::chain(&out, 0).collect(), d_cuts)
    }

    /// Generates and submits request `seq`.
    pub(super) fn submit(&mut self, seq: u64) -> Result<(), Error> {
        let nq = self.fe.queues.len();
        let stale = self.o.stale_every > 0
            && !self.closed.is_empty()
            && below(&mut self.rng, self.o.stale_every) == 0;
        let (sess, sid, dir) = if stale {
            let id = self.closed[below(&mut self.rng, self.closed.len() as u64) as usize];
            let dir = if below(&mut self.rng, 2) == 0 {
                Direction::Encrypt
            } else {
                Direction::Decrypt
            };
            (None, id, dir)
        } else {
            // A uniform pick among the slots not being drained.
            let live = self.sess.iter().filter(|s| !s.draining).count();
            let mut k = below(&mut self.rng, live as u64) as usize;
            let s = self
                .sess
                .iter()
                .position(|s| {
                    if s.draining {
                        return false;
                    }
                    k = k.wrapping_sub(1);
                    k == usize::MAX
                })
                .unwrap_or(0);
            let ss = &self.sess[s];
            (Some(s as u16), ss.id, ss.dir)
        };
        let q = below(&mut self.rng, nq as u64) as usize;
        let len = self.pick_size();
        let layout = self.pick_layout();
        let mut iv = [0u8; 16];
        self.rng.fill_bytes(&mut iv);

        let slot = self.room(q)?;
        let src = &mut self.srcs[q][usize::from(slot)];
        self.rng.fill_bytes(&mut src[..len as usize]);
        let hdr = request_header(dir, sid, len);
        let l = self.fe.queues[q].layout(slot);
        let (descs, d_cuts) = self.descs(l, len, layout);
        let mut dst_cuts = [0u32; MAX_DST_PIECES];
        dst_cuts[..d_cuts.len()].copy_from_slice(&d_cuts);
        let dq = &mut self.fe.queues[q];
        {
            let mem = dq.mem();
            let at = readable_start(l);
            mem.write(at, &hdr);
            mem.write(at + OP_DATA_REQ_SIZE as u64, &iv);
            mem.write(l.src, &self.srcs[q][usize::from(slot)][..len as usize]);
            // The pieces, the gaps between them and DST_GAP bytes after.
            let fill = len as usize + DST_GAP as usize * d_cuts.len();
            mem.fill(l.dst, fill, DST_CANARY);
            // The status canary and guard bytes after it (the replay's).
            put_status_area(mem, l);
        }
        let indirect = matches!(layout, Layout::Indirect | Layout::IndirectCut);
        let head = dq.submit_descs(slot, &descs, indirect).map_err(Error::Raw)?;
        let ring = dq.ring_addrs().desc + 16 * u64::from(head);
        let n = 16 * descs.len();
        let put = &mut self.descs_put[q][usize::from(slot)];
        put.areas = if indirect {
            [(ring, 16), (l.table, n)]
        } else {
            [(ring, n), (0, 0)]
        };
        // The bytes this tool wrote, as it wrote them (not read back from
        // guest memory, where a device's write could already be).
        let [(a0, n0), (a1, n1)] = put.areas;
        put.bytes.clear();
        put.bytes.resize(n0 + n1, 0);
        let bytes = &mut put.bytes;
        dq.raw_desc_images(slot, &descs, indirect, |gpa, d| {
            // (Every image lies in one of the two areas, by construction.)
            let at = if gpa.wrapping_sub(a0) < n0 as u64 {
                Some((gpa - a0) as usize)
            } else if gpa.wrapping_sub(a1) < n1 as u64 {
                Some(n0 + (gpa - a1) as usize)
            } else {
                None
            };
            debug_assert!(
                at.is_some(),
                "descriptor image at {gpa:#x} outside its request's areas"
            );
            if let Some(b) = at
                .and_then(|at| bytes.get_mut(at..))
                .and_then(|b| b.get_mut(..16))
            {
                b.copy_from_slice(&d);
            }
        })
        .map_err(Error::Raw)?;
        self.pending[q][usize::from(slot)] = Some(Pending {
            seq,
            sess,
            dir,
            iv,
            len,
            head: u32::from(head),
            sid,
            dst_cuts,
            dst_pieces: d_cuts.len() as u8,
        });
        if let Some(s) = sess {
            self.sess[usize::from(s)].inflight[q] += 1;
            *self
                .report
                .key_bits
                .entry(self.sess[usize::from(s)].key.len() as u32 * 8)
                .or_default() += 1;
        } else {
            self.report.stale_requests += 1;
        }
        let r = &mut self.report;
        r.requests += 1;
        r.bytes += u64::from(len);
        r.per_queue[q] += 1;
        match dir {
            Direction::Encrypt => r.encrypt += 1,
            Direction::Decrypt => r.decrypt += 1,
        }
        *r.layouts.entry(layout.name().into()).or_default() += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::cuts;
    use crate::rng;

    #[test]
    fn cuts_cover_the_length_with_non_empty_pieces() {
        let mut rng = rng::seeded(7);
        for total in [1u32, 2, 17, 104, 16384 + 88] {
            for pieces in 1..=8 {
                let c = cuts(&mut rng, total, pieces);
                assert_eq!(c.iter().sum::<u32>(), total);
                assert!(c.iter().all(|&n| n > 0));
                assert!(c.len() <= pieces.min(total as usize));
            }
        }
    }
}
