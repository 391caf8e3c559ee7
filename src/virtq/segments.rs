// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The segments a descriptor walk produced, read and written as byte
//! streams: fixed-size fields copied out once, bytes copied in, and a
//! cursor over the pieces.

use std::ptr;

/// A mapped piece of guest memory.
#[derive(Debug, Clone, Copy)]
pub struct Segment {
    pub(crate) ptr: *mut u8,
    pub(crate) len: usize,
}

/// Reads `buf.len()` bytes at `offset` of a segment stream into `buf`.
/// Returns false if the stream is too short.
pub(crate) fn gather(segs: &[Segment], offset: usize, buf: &mut [u8]) -> bool {
    Cursor::new(segs, offset).read(buf) == buf.len()
}

/// [`gather`] of a fixed-size field (header, IV) into `out`; false if the
/// stream is too short (`out` then holds a partial copy). When the `N`
/// bytes lie in one segment, as they almost always do, one fixed-size copy
/// the compiler inlines instead of a call to `memcpy`. (An out parameter,
/// not an `Option<[u8; N]>`: a copy inside an option is re-read at other
/// offsets, which stalls store forwarding; docs/PERFORMANCE.md.)
#[inline(always)]
pub(crate) fn gather_array<const N: usize>(c: Cursor<'_>, out: &mut [u8; N]) -> bool {
    let (p, n) = c.chunk();
    if n >= N && N.is_multiple_of(8) && (p as usize).is_multiple_of(8) {
        // The guest may rewrite the field at any time: it is read once,
        // with loads the compiler may neither repeat nor replace by
        // re-reading guest memory later (relaxed atomics, as in
        // `read_desc`: a volatile copy goes byte by byte), and only the
        // copy is used.
        let word = |i: usize| {
            // SAFETY: p is mapped for n >= N bytes of a readable buffer
            // (see `Cursor::chunk`) and 8-aligned, and 8 * i + 8 <= N;
            // guest memory the guest may write concurrently.
            unsafe { std::sync::atomic::AtomicU64::from_ptr(p.add(8 * i) as *mut u64) }
                .load(std::sync::atomic::Ordering::Relaxed)
        };
        if let Ok(out) = <&mut [u8; 16]>::try_from(&mut out[..]) {
            // (N == 16.) The IV: written with one 16-byte store, because
            // it is read back as one 16-byte value right away, and a load
            // that spans two narrower stores is not forwarded from them
            // but waits for them to reach the cache. The header's fields
            // are read back one by one, each inside one 8-byte store.
            store16(out, word(0), word(1));
        } else {
            for (i, w) in out.chunks_exact_mut(8).enumerate() {
                w.copy_from_slice(&word(i).to_ne_bytes());
            }
        }
        return true;
    }
    let mut c = c;
    c.read(out) == N
}

/// Writes the 16 bytes `lo`, `hi` (native byte order) into `out` with one
/// 16-byte store where the target has one.
#[inline(always)]
pub(crate) fn store16(out: &mut [u8; 16], lo: u64, hi: u64) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_set_epi64x, _mm_storeu_si128};
        // SAFETY: SSE2 is part of the x86_64 baseline; `out` is 16
        // writable bytes (its type), and the store has no alignment
        // requirement.
        unsafe {
            _mm_storeu_si128(
                out.as_mut_ptr() as *mut __m128i,
                _mm_set_epi64x(hi as i64, lo as i64),
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let (a, b) = out.split_at_mut(8);
        a.copy_from_slice(&lo.to_ne_bytes());
        b.copy_from_slice(&hi.to_ne_bytes());
    }
}

/// Writes `data` into a segment stream at `off` (the caller has checked
/// the stream is long enough).
pub(crate) fn scatter(segs: &[Segment], off: usize, data: &[u8]) {
    Cursor::new(segs, off).write(data);
}

/// Position in a segment stream.
#[derive(Clone, Copy)]
pub(crate) struct Cursor<'a> {
    segs: &'a [Segment],
    idx: usize,
    off: usize,
}

impl<'a> Cursor<'a> {
    /// The start of the stream (no segment is empty: zero-length
    /// descriptors are skipped, see [`super::descriptor::ChainWalker::add_buffer`]).
    pub(crate) fn start(segs: &'a [Segment]) -> Self {
        debug_assert!(segs.first().is_none_or(|s| s.len > 0), "an empty segment");
        Cursor { segs, idx: 0, off: 0 }
    }

    pub(crate) fn new(segs: &'a [Segment], mut offset: usize) -> Self {
        let mut idx = 0;
        while idx < segs.len() && offset >= segs[idx].len {
            offset -= segs[idx].len;
            idx += 1;
        }
        Cursor {
            segs,
            idx,
            off: offset,
        }
    }

    /// The contiguous piece at the cursor: (pointer, bytes left in it).
    pub(crate) fn chunk(&self) -> (*mut u8, usize) {
        match self.segs.get(self.idx) {
            // SAFETY: off < len for the current segment.
            Some(s) => (unsafe { s.ptr.add(self.off) }, s.len - self.off),
            None => (ptr::null_mut(), 0),
        }
    }

    #[inline(always)]
    pub(crate) fn advance(&mut self, mut n: usize) {
        while n > 0 && self.idx < self.segs.len() {
            let left = self.segs[self.idx].len - self.off;
            if n < left {
                self.off += n;
                return;
            }
            n -= left;
            self.idx += 1;
            self.off = 0;
        }
    }

    /// Copies bytes out into `buf` until it is full or the stream ends;
    /// returns how many.
    pub(crate) fn read(&mut self, buf: &mut [u8]) -> usize {
        let mut done = 0;
        while done < buf.len() {
            let (p, n) = self.chunk();
            let n = n.min(buf.len() - done);
            if n == 0 {
                break;
            }
            // SAFETY: p is mapped for n bytes; buf is a distinct local buffer.
            unsafe { ptr::copy_nonoverlapping(p, buf[done..].as_mut_ptr(), n) };
            self.advance(n);
            done += n;
        }
        done
    }

    /// Copies `data` in until it is written or the stream ends; returns how
    /// many bytes were written.
    pub(crate) fn write(&mut self, data: &[u8]) -> usize {
        let mut done = 0;
        while done < data.len() {
            let (p, n) = self.chunk();
            let n = n.min(data.len() - done);
            if n == 0 {
                break;
            }
            // SAFETY: p is mapped for n bytes of a device-writable buffer;
            // data is a distinct local buffer.
            unsafe { ptr::copy_nonoverlapping(data[done..].as_ptr(), p, n) };
            self.advance(n);
            done += n;
        }
        done
    }
}
