// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A run of requests laid out for replaying: per request a compact
//! record ([`Hot`]), its bytes in one arena and the block signatures of
//! its expected output (and src) in another, and the request header it
//! gets.

use vhost_user_crypto::wire::virtio_crypto::{
    AlgChainPara, OpDataReq, OP_DATA_REQ_SIZE, VIRTIO_CRYPTO_CIPHER_DECRYPT, VIRTIO_CRYPTO_CIPHER_ENCRYPT,
    VIRTIO_CRYPTO_SYM_OP_ALGORITHM_CHAINING, VIRTIO_CRYPTO_SYM_OP_CIPHER,
};

use super::check::block_signature;
use crate::frontend::Error;
use crate::trace::{AlgChainReq, Dir, ExpectStatus, Req};

/// The request header (`virtio_crypto_op_data_req`) this tool puts in
/// front of `req`, for session `sid`.
pub(super) fn request_header(req: &Req, sid: u64) -> [u8; OP_DATA_REQ_SIZE] {
    let mut hdr = OpDataReq {
        opcode: match req.opcode {
            Dir::Encrypt => VIRTIO_CRYPTO_CIPHER_ENCRYPT,
            Dir::Decrypt => VIRTIO_CRYPTO_CIPHER_DECRYPT,
        },
        algo: 0,
        session_id: sid,
        op_type: if req.alg_chain.is_some() {
            VIRTIO_CRYPTO_SYM_OP_ALGORITHM_CHAINING
        } else {
            VIRTIO_CRYPTO_SYM_OP_CIPHER
        },
        iv_len: req.iv.len() as u32,
        src_data_len: req.src.len() as u32,
        dst_data_len: req.src.len() as u32,
    }
    .to_bytes();
    if let Some(c) = &req.alg_chain {
        AlgChainPara {
            cipher_start_src_offset: c.cipher_offset,
            len_to_cipher: c.cipher_len,
            hash_start_src_offset: c.hash_offset,
            len_to_hash: c.hash_len,
            aad_len: 0,
            hash_result_len: c.digest_len,
        }
        .write_to(&mut hdr);
    }
    hdr
}

/// Everything [`request_header`] builds `req`'s header from but the
/// session id, plus what the session id is looked up from (the session's
/// name or the raw id): two requests of a run of requests with equal keys
/// get the same header bytes (the names' ids do not change inside a run).
pub(super) type HeaderKey<'a> = (Option<&'a str>, Option<u64>, bool, Option<[u32; 5]>, usize, usize);

pub(super) fn header_key(req: &Req) -> HeaderKey<'_> {
    (
        req.session.as_deref(),
        req.session_id,
        req.opcode == Dir::Encrypt,
        req.alg_chain.as_ref().map(|c| {
            [
                c.cipher_offset,
                c.cipher_len,
                c.hash_offset,
                c.hash_len,
                c.digest_len,
            ]
        }),
        req.iv.len(),
        req.src.len(),
    )
}

/// [`Hot::flags`]: the dst descriptor points at src.
const IN_PLACE: u8 = 1;
/// [`Hot::flags`]: the trace gives the output and expects status OK; the
/// output is in the arena and its block signature in the signature arena.
const HAS_DST: u8 = 2;
/// [`Hot::flags`]: an algorithm-chaining request (its chaining fields are
/// read from the [`Req`]).
const ALG_CHAIN: u8 = 4;
/// [`Hot::flags`]: the request is pinned to queue [`Hot::queue`].
const HAS_QUEUE: u8 = 8;
/// [`Hot::flags`]: the request's [`header_key`] is the previous request's
/// (in the run of requests), so are its header bytes.
const SAME_HEADER: u8 = 16;
/// [`Hot::flags`]: the request has [`HAS_DST`], its output does not end
/// in a block of 1 to 3 bytes ([`super::check::short_last_block`]: such a
/// block's word is zero-padded), and no other request of the run has the
/// same block signature word at the same block index in its expected
/// output, nor any request with a src signature ([`Hot::has_src_sig`],
/// this one included) in its src ([`mark_distinct`]): no block of
/// another request's expected output, or of such a src, that holds at
/// least 4 bytes equals this one's at its place.
const SIG_DISTINCT: u8 = 32;
/// [`Hot::flags`]: the request is out of place and at least
/// [`ALTERNATE_MIN_LEN`] bytes long, so it may alternate between its
/// buffer set's two data buffers (`DriverQueue::placement`).
const ALTERNATE: u8 = 64;

/// The shortest out-of-place request that alternates between its buffer
/// set's data buffers, its src written where this tool has just read the
/// previous request's output (`DriverQueue::placement`). Bytes. Shorter
/// requests save too few cache-line round trips to pay for it: 256-byte
/// ones ran about 10 % slower alternating, 1 KiB ones 7 % faster
/// (docs/PERFORMANCE.md, "Techniques and what each bought").
const ALTERNATE_MIN_LEN: usize = 1024;

/// The most block signature words a run of requests may have for
/// [`mark_distinct`] to look at it (64 MiB of expected output, and of
/// src where [`Hot::has_src_sig`]; the sort takes 16 bytes per word). A
/// longer run marks no request distinct, and each submission compares
/// the two signatures instead.
const DISTINCT_MAX_WORDS: usize = 1 << 22;

/// What the submit loop and the checks read of one trace request on the
/// common path, 32 bytes in one array (the full [`Req`], 200 bytes with
/// its bytes in four heap allocations of their own, is read only for rare
/// work: header building, chaining fields, mismatch messages, recorded
/// outcomes). Its bytes are one entry of the run's arena, back to back,
/// each from a 16-byte boundary: the IV, src, and the expected output
/// (with [`HAS_DST`] only); the block signature of the expected output
/// ([`block_signature`]) is in the signature arena, followed by src's when
/// [`Hot::has_src_sig`].
#[derive(Debug, Clone, Copy)]
pub(super) struct Hot {
    /// Where the IV (the entry) starts in the arena, in 16-byte units.
    pub(super) iv: u32,
    /// Where src starts in the arena, in 16-byte units.
    pub(super) src: u32,
    /// Where the expected output starts in the arena, in 16-byte units.
    pub(super) dst: u32,
    /// Where the block signatures start in the signature arena (words).
    pub(super) sig: u32,
    /// src (= dst) bytes.
    pub(super) len: u32,
    pub(super) iv_len: u32,
    /// The expected output's bytes (0 without [`HAS_DST`]).
    pub(super) dst_len: u32,
    /// The queue it is pinned to (with [`HAS_QUEUE`]).
    pub(super) queue: u16,
    pub(super) flags: u8,
    /// The expected status byte.
    pub(super) status: u8,
}
const _: () = assert!(std::mem::size_of::<Hot>() == 32);

impl Hot {
    pub(super) fn in_place(&self) -> bool {
        self.flags & IN_PLACE != 0
    }

    pub(super) fn has_dst(&self) -> bool {
        self.flags & HAS_DST != 0
    }

    pub(super) fn alg_chain(&self) -> bool {
        self.flags & ALG_CHAIN != 0
    }

    /// The queue the request is pinned to, if any.
    pub(super) fn queue(&self) -> Option<u16> {
        (self.flags & HAS_QUEUE != 0).then_some(self.queue)
    }

    pub(super) fn same_header(&self) -> bool {
        self.flags & SAME_HEADER != 0
    }

    pub(super) fn alternates(&self) -> bool {
        self.flags & ALTERNATE != 0
    }

    /// Whether the signature arena holds src's block signature after the
    /// expected output's: [`ALTERNATE`], with [`HAS_DST`].
    pub(super) fn has_src_sig(&self) -> bool {
        self.flags & (HAS_DST | ALTERNATE) == HAS_DST | ALTERNATE
    }

    pub(super) fn sig_distinct(&self) -> bool {
        self.flags & SIG_DISTINCT != 0
    }

    /// This request's block signature in `sigs`, its run's signature
    /// arena (one word per 16-byte block of the expected output).
    #[inline(always)]
    fn sig_in<'s>(&self, sigs: &'s [u32]) -> &'s [u32] {
        let at = self.sig as usize;
        &sigs[at..at + self.dst_len.div_ceil(16) as usize]
    }
}

/// A run of requests ([`crate::trace::Step::Requests`]) laid out for replaying: per
/// request a [`Hot`] record, its bytes in one arena and its block
/// signatures in another, so that a request streams its IV,
/// src, expected output and signature from memory (9.25 cache lines for
/// 256 bytes) and half a line of records, not those bytes in five
/// allocations of their own, its `Req` record and a pointer to its
/// signature.
pub(super) struct Prepared<'t> {
    pub(super) reqs: &'t [Req],
    pub(super) hot: Vec<Hot>,
    pub(super) arena: Arena,
    pub(super) sigs: Vec<u32>,
}

impl Prepared<'_> {
    #[inline(always)]
    pub(super) fn iv(&self, h: &Hot) -> &[u8] {
        let at = 16 * h.iv as usize;
        &self.arena[at..at + h.iv_len as usize]
    }

    #[inline(always)]
    pub(super) fn src(&self, h: &Hot) -> &[u8] {
        let at = 16 * h.src as usize;
        &self.arena[at..at + h.len as usize]
    }

    /// The expected output (empty without [`HAS_DST`]).
    #[inline(always)]
    pub(super) fn want(&self, h: &Hot) -> &[u8] {
        let at = 16 * h.dst as usize;
        &self.arena[at..at + h.dst_len as usize]
    }

    /// The expected output's block signature (empty without [`HAS_DST`]).
    #[inline(always)]
    pub(super) fn sig(&self, h: &Hot) -> &[u32] {
        h.sig_in(&self.sigs)
    }

    /// What a buffer holds once request `h`'s output was found right in
    /// it, for the canaries of the next request there: `h`'s signature
    /// without a zero-padded last word ([`super::check::known_sig`]), or
    /// `None` when the output is not compared or is written over src (in
    /// place).
    pub(super) fn known_after(&self, h: &Hot) -> Option<&[u32]> {
        (h.has_dst() && !h.in_place()).then(|| super::check::known_sig(self.sig(h), h.dst_len as usize))
    }

    /// What request `h`'s src buffer holds once it completed, for the
    /// canaries of a later request whose dst is that buffer
    /// (`DriverQueue::placement`): its src, as the block signature of src
    /// without a zero-padded last word. `None` unless [`Hot::has_src_sig`].
    ///
    /// This trusts the device not to have written src, which it may only
    /// read. A device that does is reported on the requests whose src is
    /// compared (`check_untouched`: the run's first 4,096, then one in
    /// 64); until then, a block of a later output that equals what it
    /// wrote there could be left without its canary. (Reading src's
    /// signature words back on every request instead cost 41–52 % of the
    /// tool's requests/s at 1–16 KiB, pair medians 0.59 to 0.48: by then
    /// src's lines have left this CPU.)
    pub(super) fn src_known_after(&self, h: &Hot) -> Option<&[u32]> {
        h.has_src_sig().then(|| {
            let at = h.sig as usize + h.dst_len.div_ceil(16) as usize;
            let words = &self.sigs[at..at + h.len.div_ceil(16) as usize];
            super::check::known_sig(words, h.len as usize)
        })
    }

    /// Whether no 16-byte block of the expected output of `h` can be in a
    /// buffer known to hold `known` ([`Prepared::known_after`] or
    /// [`Prepared::src_known_after`] of a request) at the same place:
    /// `known` is a signature of this run other than `h`'s expected
    /// output's, covers every block of that output, and `h` is
    /// [`SIG_DISTINCT`]. Then no block needs a canary, and the two
    /// signatures are not read ([`super::check::canary_where_same`]
    /// compares them word by word: 8 KiB per 16 KiB request).
    #[inline(always)]
    pub(super) fn differs_everywhere(&self, known: &[u32], h: &Hot) -> bool {
        h.sig_distinct()
            && known.len() >= h.dst_len.div_ceil(16) as usize
            && self.sigs.as_ptr_range().contains(&known.as_ptr())
            && known.as_ptr() != self.sig(h).as_ptr()
    }

    /// Request `i`'s chaining fields, read from its [`Req`] only when it
    /// has some ([`ALG_CHAIN`]).
    #[inline(always)]
    pub(super) fn alg_chain(&self, i: usize, h: &Hot) -> Option<&AlgChainReq> {
        if h.alg_chain() {
            self.reqs[i].alg_chain.as_ref()
        } else {
            None
        }
    }

    /// Request `i`'s trace line (for a mismatch: not on the common path).
    #[cold]
    #[inline(never)]
    pub(super) fn line(&self, i: u32) -> usize {
        self.reqs[i as usize].line
    }

    /// Starts loading what submitting the request reads of the arena: the
    /// IV and src. (Not its signature: the signature arena is read in
    /// order, a stream the hardware prefetcher follows; prefetching each
    /// request's signature costs 14 instructions per request and is
    /// no faster.)
    #[inline(always)]
    pub(super) fn prefetch_submit(&self, h: &Hot) {
        let (iv, end) = (16 * h.iv as usize, 16 * h.src as usize + h.len as usize);
        crate::guest_mem::prefetch(&self.arena[iv..end]);
    }
}

/// The bytes of a run's requests ([`Prepared::arena`]), zero-filled: on
/// the heap below [`HUGE_PAGE`] bytes, else in an anonymous mapping
/// advised for transparent huge pages (madvise(2) `MADV_HUGEPAGE`). Each
/// request streams its src and expected output from here, 32 KiB at
/// 16 KiB, and on 4 KiB pages every 4 KiB of each stream is a TLB miss.
/// (An arena below 2 MiB holds no huge page, nor may one below 4 MiB
/// whose mapping is not 2 MiB-aligned; and a mapping per run would let a
/// trace of many short runs reach `vm.max_map_count`.)
pub(super) enum Arena {
    Heap(Vec<u8>),
    Mapped(memmap2::MmapMut),
}

/// The size of a transparent huge page on x86-64 (a PMD entry), bytes.
const HUGE_PAGE: usize = 2 << 20;

impl Arena {
    /// `size` zero bytes.
    ///
    /// # Errors
    /// [`Error::Options`]: mapping `size` bytes failed.
    fn zeroed(size: usize) -> Result<Self, Error> {
        if size < HUGE_PAGE {
            return Ok(Arena::Heap(vec![0; size]));
        }
        let map = memmap2::MmapMut::map_anon(size)
            .map_err(|e| Error::Options(format!("cannot map {size} bytes for a run of requests: {e}")))?;
        // A hint: it takes effect where
        // `/sys/kernel/mm/transparent_hugepage/enabled` is `always` or
        // `madvise`; with `never` the arena stays on small pages.
        let _ = map.advise(memmap2::Advice::HugePage);
        Ok(Arena::Mapped(map))
    }
}

impl std::ops::Deref for Arena {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Arena::Heap(v) => v,
            Arena::Mapped(m) => m,
        }
    }
}

impl std::ops::DerefMut for Arena {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            Arena::Heap(v) => v,
            Arena::Mapped(m) => m,
        }
    }
}

/// Lays out `reqs` for replaying ([`Prepared`]).
pub(super) fn prepare(reqs: &[Req]) -> Result<Prepared<'_>, Error> {
    let too_big = || {
        Error::Options(
            "a run of requests of the trace is too large to replay (over 2^32 requests or 64 GiB)".into(),
        )
    };
    let fit = |n: usize| u32::try_from(n).map_err(|_| too_big());
    fit(reqs.len())?;
    // The expected output, where it is compared: given, and status OK.
    pub(super) fn expected(r: &Req) -> Option<&[u8]> {
        r.dst.as_deref().filter(|_| r.status == ExpectStatus::Ok)
    }
    let alternates = |r: &Req| !r.in_place && r.src.len() >= ALTERNATE_MIN_LEN;
    // The block signatures of src too, where a later request's dst may be
    // this one's src buffer (`Prepared::src_known_after`).
    let src_sig = |r: &Req| expected(r).is_some() && alternates(r);
    let (size, words) = reqs.iter().fold((0, 0), |(size, words), r| {
        let d = expected(r).map_or(0, <[u8]>::len);
        let s = if src_sig(r) { r.src.len() } else { 0 };
        (
            size + r.iv.len().next_multiple_of(16)
                + r.src.len().next_multiple_of(16)
                + d.next_multiple_of(16),
            words + d.div_ceil(16) + s.div_ceil(16),
        )
    });
    // (Checked before mapping: a run too large gets that error.)
    fit(size / 16)?;
    let mut arena = Arena::zeroed(size)?;
    let mut filled = 0;
    let mut sigs = Vec::with_capacity(words);
    let mut hot = Vec::with_capacity(reqs.len());
    let mut prev = None;
    for r in reqs {
        let want = expected(r);
        let dst = want.unwrap_or_default();
        let sig = fit(sigs.len())?;
        sigs.extend(block_signature(dst));
        if src_sig(r) {
            sigs.extend(block_signature(&r.src));
        }
        let mut put = |bytes: &[u8]| {
            let at = fit(filled / 16);
            arena[filled..filled + bytes.len()].copy_from_slice(bytes);
            filled += bytes.len().next_multiple_of(16);
            at
        };
        let (iv, src, dst_at) = (put(&r.iv)?, put(&r.src)?, put(dst)?);
        let key = Some(header_key(r));
        let flags = if r.in_place { IN_PLACE } else { 0 }
            | if want.is_some() { HAS_DST } else { 0 }
            | if r.alg_chain.is_some() { ALG_CHAIN } else { 0 }
            | if r.queue.is_some() { HAS_QUEUE } else { 0 }
            | if key == prev { SAME_HEADER } else { 0 }
            | if alternates(r) { ALTERNATE } else { 0 };
        prev = key;
        hot.push(Hot {
            iv,
            src,
            dst: dst_at,
            sig,
            len: fit(r.src.len())?,
            iv_len: fit(r.iv.len())?,
            dst_len: fit(dst.len())?,
            queue: r.queue.unwrap_or(0),
            flags,
            status: r.status.byte(),
        });
    }
    debug_assert_eq!((filled, sigs.len()), (size, words));
    mark_distinct(&mut hot, &sigs);
    Ok(Prepared {
        reqs,
        hot,
        arena,
        sigs,
    })
}

/// Sets [`SIG_DISTINCT`] on the requests with [`HAS_DST`], not ending in a
/// block of 1 to 3 bytes, whose expected output's block signature shares
/// no word at the same block index with another request's output or with
/// any src signature (`sigs`: the run's signature arena, every word of
/// which counts). Sorts (index, word) keys: 16 bytes and O(n log n) per
/// word, once per run of requests; a run of over [`DISTINCT_MAX_WORDS`]
/// words is left unmarked.
fn mark_distinct(hot: &mut [Hot], sigs: &[u32]) {
    if sigs.len() > DISTINCT_MAX_WORDS {
        return;
    }
    // Each key's owner: 2 * request for an output's word, + 1 for a src's.
    let mut keys: Vec<(u64, u64)> = Vec::with_capacity(sigs.len());
    for (i, h) in hot.iter_mut().enumerate() {
        if !h.has_dst() {
            continue;
        }
        if !super::check::short_last_block(h.dst_len as usize) {
            h.flags |= SIG_DISTINCT;
        }
        let out = h.dst_len.div_ceil(16) as usize;
        let words = out
            + if h.has_src_sig() {
                h.len.div_ceil(16) as usize
            } else {
                0
            };
        let at = h.sig as usize;
        keys.extend(sigs[at..at + words].iter().enumerate().map(|(j, &w)| {
            let (index, of_src) = if j < out { (j, 0) } else { (j - out, 1) };
            (((index as u64) << 32) | u64::from(w), 2 * i as u64 + of_src)
        }));
    }
    keys.sort_unstable();
    for same in keys.chunk_by(|a, b| a.0 == b.0).filter(|g| g.len() > 1) {
        for &(_, owner) in same.iter().filter(|(_, owner)| owner % 2 == 0) {
            hot[(owner / 2) as usize].flags &= !SIG_DISTINCT;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{prepare, Arena, HUGE_PAGE};
    use crate::replay::check::block_signature;
    use crate::trace::{AlgChainReq, Dir, ExpectStatus, Req};

    #[test]
    fn arenas_are_zero_filled_on_the_heap_below_a_huge_page_and_mapped_from_there() {
        for (size, mapped) in [
            (0, false),
            (48, false),
            (HUGE_PAGE - 16, false),
            (HUGE_PAGE, true),
            (3 * HUGE_PAGE + 16, true),
        ] {
            let a = Arena::zeroed(size).unwrap();
            assert_eq!(matches!(a, Arena::Mapped(_)), mapped, "{size}");
            assert_eq!(a.len(), size);
            assert!(a.iter().all(|&b| b == 0), "{size}");
            // The advice is on the mapping (`hg` in its VmFlags, proc(5)),
            // on a kernel with transparent huge pages.
            if mapped && std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists() {
                let flags = vm_flags(a.as_ptr() as usize).expect("the arena's mapping in /proc/self/smaps");
                assert!(
                    flags.split_whitespace().any(|f| f == "hg"),
                    "{size}: VmFlags {flags}"
                );
            }
        }
    }

    /// The `VmFlags` line of the mapping that holds `addr`
    /// (/proc/self/smaps), if there is one.
    fn vm_flags(addr: usize) -> Option<String> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut inside = false;
        for line in smaps.lines() {
            // A mapping's first line starts with its range: "lo-hi perms ...".
            let range = line.split_whitespace().next().and_then(|r| r.split_once('-'));
            if let Some((Ok(lo), Ok(hi))) =
                range.map(|(lo, hi)| (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16)))
            {
                inside = (lo..hi).contains(&addr);
            } else if let Some(flags) = line.strip_prefix("VmFlags:").filter(|_| inside) {
                return Some(flags.trim().to_string());
            }
        }
        None
    }

    #[test]
    fn prepared_runs_give_back_every_request_as_the_trace_has_it() {
        let bytes = |n: usize, seed: u8| {
            (0..n)
                .map(|i| (i as u8).wrapping_mul(31) ^ seed)
                .collect::<Vec<u8>>()
        };
        let req = |line: usize, iv: usize, src: usize, dst: Option<usize>, status: ExpectStatus| Req {
            line,
            session: Some("s".into()),
            session_id: None,
            opcode: Dir::Encrypt,
            iv: bytes(iv, 1),
            src: bytes(src, 2),
            queue: None,
            status,
            dst: dst.map(|n| bytes(n, line as u8)),
            alg_chain: None,
            in_place: false,
        };
        let mut reqs = vec![
            req(1, 16, 256, Some(256), ExpectStatus::Ok),
            req(2, 16, 256, Some(256), ExpectStatus::Ok),
            // Odd lengths: an 8-byte IV, 17 bytes, a shorter expected output.
            req(3, 8, 17, Some(5), ExpectStatus::Ok),
            // An output given with an error expected is not compared.
            req(4, 16, 32, Some(32), ExpectStatus::Err),
            req(5, 0, 0, None, ExpectStatus::Invsess),
            req(6, 16, 48, Some(48), ExpectStatus::Ok),
            req(7, 16, 48, Some(48), ExpectStatus::Ok),
            req(8, 16, 48, Some(48), ExpectStatus::Ok),
        ];
        reqs[5].queue = Some(3);
        reqs[5].in_place = true;
        reqs[7].alg_chain = Some(AlgChainReq {
            cipher_offset: 0,
            cipher_len: 48,
            hash_offset: 0,
            hash_len: 48,
            digest_len: 12,
            digest_in: Vec::new(),
            expect_digest: None,
        });
        let p = prepare(&reqs).unwrap();
        gives_back(&reqs, &p);
        // The same header key as the previous request: 2 (as 1) and 7 (as
        // 6: the queue and in_place are not in the header); not 8
        // (chained, 7 is not).
        let same: Vec<bool> = p.hot.iter().map(|h| h.same_header()).collect();
        assert_eq!(same, [false, true, false, false, false, false, true, false]);
        // Past 2 MiB of bytes the arena is a mapping: the same holds.
        reqs.push(req(9, 16, (1 << 20) + 17, Some((1 << 20) + 17), ExpectStatus::Ok));
        let p = prepare(&reqs).unwrap();
        assert!(matches!(p.arena, Arena::Mapped(_)));
        gives_back(&reqs, &p);
    }

    /// Checks that `p` gives back each request of `reqs` as it is.
    fn gives_back(reqs: &[Req], p: &super::Prepared<'_>) {
        assert_eq!(p.hot.len(), reqs.len());
        for (i, (r, h)) in reqs.iter().zip(&p.hot).enumerate() {
            assert_eq!(p.iv(h), r.iv.as_slice(), "{i}");
            assert_eq!(p.src(h), r.src.as_slice(), "{i}");
            let want = r.dst.as_deref().filter(|_| r.status == ExpectStatus::Ok);
            assert_eq!(h.has_dst(), want.is_some(), "{i}");
            assert_eq!(p.want(h), want.unwrap_or_default(), "{i}");
            assert_eq!(p.sig(h), block_signature(want.unwrap_or_default()), "{i}");
            assert_eq!(
                (h.len, h.iv_len, h.status),
                (r.src.len() as u32, r.iv.len() as u32, r.status.byte())
            );
            assert_eq!(h.in_place(), r.in_place, "{i}");
            assert_eq!(h.alg_chain(), r.alg_chain.is_some(), "{i}");
            assert_eq!(p.alg_chain(i, h), r.alg_chain.as_ref(), "{i}");
            assert_eq!(h.queue(), r.queue, "{i}");
            assert_eq!(p.line(i as u32), r.line);
        }
    }

    #[test]
    fn distinct_means_no_other_output_has_an_equal_block_at_its_place() {
        let req = |line: usize, dst: Vec<u8>, status: ExpectStatus| Req {
            line,
            session: Some("s".into()),
            session_id: None,
            opcode: Dir::Encrypt,
            iv: vec![0; 16],
            src: vec![0; dst.len()],
            queue: None,
            status,
            dst: Some(dst),
            alg_chain: None,
            in_place: false,
        };
        // Outputs of 16-byte blocks, each block filled with one byte.
        let out = |blocks: &[u8]| blocks.iter().flat_map(|&b| [b; 16]).collect::<Vec<u8>>();
        let reqs = [
            // 1 and 2 share block 1 (0x22); 3 has 0x22 as its block 0,
            // another place; 4 expects an error (its output is not
            // compared, and it is not marked); 6 is 5 with a block more.
            req(1, out(&[0x11, 0x22]), ExpectStatus::Ok),
            req(2, out(&[0x33, 0x22, 0x44]), ExpectStatus::Ok),
            req(3, out(&[0x22, 0x55]), ExpectStatus::Ok),
            req(4, out(&[0x66]), ExpectStatus::Err),
            req(5, out(&[0x66]), ExpectStatus::Ok),
            req(6, out(&[0x66, 0x77]), ExpectStatus::Ok),
            // Equal in bytes 4..16 of block 0 only: the signature word
            // (bytes 0..4) differs, so they are distinct.
            req(7, [&[1u8, 0, 0, 0][..], &[9; 12]].concat(), ExpectStatus::Ok),
            req(8, [&[2u8, 0, 0, 0][..], &[9; 12]].concat(), ExpectStatus::Ok),
            // Words unlike any other's, but a last block of 2 bytes: not
            // distinct (its word is zero-padded).
            req(9, [&out(&[0x88])[..], &[0x99, 0x99]].concat(), ExpectStatus::Ok),
            // 20 bytes: a last block of 4 bytes, distinct.
            req(10, [&out(&[0xaa])[..], &[0xbb; 4]].concat(), ExpectStatus::Ok),
        ];
        let p = prepare(&reqs).unwrap();
        let distinct: Vec<bool> = p.hot.iter().map(|h| h.sig_distinct()).collect();
        assert_eq!(
            distinct,
            [false, false, true, false, false, false, true, true, false, true]
        );
        let h = &p.hot;
        // Another request's signature: distinct 3 differs everywhere from
        // 1's; 1 (not distinct) does not, nor 3 from itself, nor 3 from a
        // shorter known output, nor from a signature of another run.
        assert!(p.differs_everywhere(p.sig(&h[0]), &h[2]));
        assert!(!p.differs_everywhere(p.sig(&h[2]), &h[0]));
        assert!(!p.differs_everywhere(p.sig(&h[2]), &h[2]));
        assert!(!p.differs_everywhere(&p.sig(&h[0])[..1], &h[2]));
        let other = [0x1111_1111u32, 0x2222_2222];
        assert!(!p.differs_everywhere(&other, &h[2]));
        // What a buffer is known to hold after each: nothing for an output
        // not compared; the 18-byte output's first word only.
        assert_eq!(p.known_after(&h[0]), Some(p.sig(&h[0])));
        assert_eq!(p.known_after(&h[3]), None);
        assert_eq!(p.known_after(&h[8]), Some(&p.sig(&h[8])[..1]));
        assert_eq!(p.known_after(&h[9]), Some(p.sig(&h[9])));
    }

    #[test]
    fn alternating_requests_keep_their_src_signature_and_count_it_against_outputs() {
        // 1 KiB of 16-byte blocks, block k starting with four bytes k + f.
        let data = |f: u8| -> Vec<u8> {
            (0..1024)
                .map(|i| if i % 16 < 4 { (i / 16) as u8 + f } else { 0 })
                .collect()
        };
        let word = |k: u8| u32::from_le_bytes([k; 4]);
        let req = |line: usize, src: Vec<u8>, dst: Vec<u8>, status: ExpectStatus, in_place: bool| Req {
            line,
            session: Some("s".into()),
            session_id: None,
            opcode: Dir::Encrypt,
            iv: vec![0; 16],
            src,
            queue: None,
            status,
            dst: Some(dst),
            alg_chain: None,
            in_place,
        };
        let reqs = [
            // Alternates; its output (blocks 100..) is like no other
            // output or src at its place: distinct.
            req(1, data(0), data(100), ExpectStatus::Ok, false),
            // In place, 256 bytes out of place, an expected error: none
            // alternates with a src signature.
            req(2, data(1), data(101), ExpectStatus::Ok, true),
            req(
                3,
                data(2)[..256].to_vec(),
                data(102)[..256].to_vec(),
                ExpectStatus::Ok,
                false,
            ),
            req(4, data(3), data(103), ExpectStatus::Err, false),
            // Its output is request 1's src: not distinct.
            req(5, data(4), data(0), ExpectStatus::Ok, false),
        ];
        let p = prepare(&reqs).unwrap();
        let h = &p.hot;
        let alternates: Vec<bool> = h.iter().map(|h| h.alternates()).collect();
        assert_eq!(alternates, [true, false, false, true, true]);
        let src_words: Vec<u32> = (0..64).map(word).collect();
        assert_eq!(p.src_known_after(&h[0]), Some(&src_words[..]));
        for (i, h) in h.iter().enumerate().take(4).skip(1) {
            assert_eq!(p.src_known_after(h), None, "{i}");
        }
        let distinct: Vec<bool> = h.iter().map(|h| h.sig_distinct()).collect();
        assert_eq!(distinct, [true, true, true, false, false]);
        // Request 5's src against request 1's output: different in every
        // block.
        let src5 = p.src_known_after(&h[4]).unwrap();
        assert!(p.differs_everywhere(src5, &h[0]));
        // Not when the src covers only some of the output's blocks.
        assert!(!p.differs_everywhere(&src5[..63], &h[0]));
    }
}
