// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! AES-CBC over the segments of a descriptor chain, in place on guest
//! memory.

use algorithms::CbcStream;

use crate::virtq::segments::{Cursor, Segment};

/// Runs the cipher from the readable stream at `src_off` into the writable
/// stream at `dst_off` for `len` bytes (a multiple of 16), in place on guest memory.
///
/// Where a source piece and a destination piece are both contiguous, the
/// cipher runs directly on them (same memory: in place; disjoint: buffer to
/// buffer). A block that straddles a descriptor or region boundary, or
/// source and destination pieces that partly overlap, go through a 16-byte
/// local block, read before it is written.
///
/// Source and destination that are the same bytes at the same stream
/// offsets (Linux's in-place requests, however the descriptors cut them)
/// give exact AES-CBC. Buffers that overlap at *different* offsets are not
/// a supported request: the result stays inside the request's writable
/// buffers, but output written early may be read back as later input, so
/// the bytes are not AES-CBC of the original source (the guest only harms
/// its own data; no driver sends this).
pub(super) fn run_cipher(
    stream: &mut CbcStream,
    readable: &[Segment],
    src_off: usize,
    writable: &[Segment],
    dst_off: usize,
    len: usize,
) {
    let mut src = Cursor::new(readable, src_off);
    let mut dst = Cursor::new(writable, dst_off);
    let mut left = len;
    while left > 0 {
        let (sp, sl) = src.chunk();
        let (dp, dl) = dst.chunk();
        let n = sl.min(dl).min(left) & !15;
        let disjoint =
            (sp as usize).saturating_add(n) <= dp as usize || (dp as usize).saturating_add(n) <= sp as usize;
        if n >= 16 && (sp == dp || disjoint) {
            if sp == dp {
                // SAFETY: dp is mapped for n (≤ dl) bytes of a device-writable
                // buffer that stays mapped while the memory guard is held. No
                // other Rust reference to it exists; the guest may write it
                // concurrently, which can only change the output bytes.
                let data = unsafe { std::slice::from_raw_parts_mut(dp, n) };
                let _ = stream.process_in_place(data);
            } else {
                // SAFETY: as above for dst; src is mapped for n (≤ sl) bytes
                // and does not overlap dst (checked), so the shared and the
                // mutable slice do not alias.
                let (input, output) = unsafe {
                    (
                        std::slice::from_raw_parts(sp as *const u8, n),
                        std::slice::from_raw_parts_mut(dp, n),
                    )
                };
                let _ = stream.process_b2b(input, output);
            }
            src.advance(n);
            dst.advance(n);
            left -= n;
        } else {
            let mut blk = [0u8; 16];
            src.read(&mut blk);
            stream.process_block(&mut blk);
            dst.write(&blk);
            left -= 16;
        }
    }
}
