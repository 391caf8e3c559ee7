// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Multi-buffer HMAC: the tags of up to [`MAX_MAC_LANES`] messages in one
//! call, with the compressions of different messages interleaved.
//!
//! Each message is a sequence of 64-byte blocks for its hash: its whole
//! data blocks, then the one or two padded final blocks (built on the
//! stack), then the one block of the outer hash. A lane holds one message;
//! each kernel call runs every lane for as many blocks as the lane with the
//! fewest blocks left in its current part has, then lanes whose message is
//! done take the next message, and lanes without one drop out (the next
//! SHA-NI call is narrower; the 16-lane AVX-512 kernel hashes a live
//! lane's blocks again in their place). Messages are grouped by algorithm.
//!
//! On the 16-lane AVX-512 engine, when every message of one algorithm in
//! a call takes the same number of inner blocks (a daemon's lane group:
//! one session, mostly one size), one kernel call hashes them all, inner
//! blocks and then the outer block, which it builds in registers from the
//! inner digests (`run_x16_even`).

use std::sync::OnceLock;

use zeroize::Zeroize;

use super::avx512_x16::{self, Avx512};
use super::sha_lanes::ShaNi;
use super::{digest_into, outer_block, pad, MacAlg, MacKey, BLOCK, MAX_MAC_LEN};
use crate::EngineChoice;

/// Most messages one [`mac_multi`] call takes (the daemon's batch).
pub const MAX_MAC_LANES: usize = 16;

/// Environment variable that picks the engine of [`sha_engine`]: one of
/// the [`ShaEngine::name`]s (`portable`, `shani`, `shani-x2`, `shani-x4`,
/// `avx512-x16`).
/// Unset, unknown, or naming an engine this CPU cannot run: the engine of
/// [`ShaEngine::detect`].
pub const SHA_ENGINE_ENV: &str = "VHOST_USER_CRYPTO_SHA_ENGINE";

/// How [`mac_multi_with`] computes its hashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ShaEngine {
    /// RustCrypto's compression functions (which use SHA-NI themselves
    /// when the CPU has it), one message after another. Runs everywhere.
    /// ([`crate::MacStream`] uses the SHA-NI kernel of
    /// [`ShaEngine::ShaNi`] when the CPU has SHA-NI.)
    Portable,
    /// This crate's SHA-NI kernel, one message at a time.
    ShaNi,
    /// SHA-NI, two messages interleaved.
    ShaNiX2,
    /// SHA-NI, four messages interleaved.
    ShaNiX4,
    /// 16 messages in the 32-bit elements of AVX-512 registers, SHA-1 and
    /// SHA-256.
    Avx512X16,
}

impl ShaEngine {
    /// Every engine, in order of preference for measuring.
    const ALL: [ShaEngine; 5] = [
        ShaEngine::Portable,
        ShaEngine::ShaNi,
        ShaEngine::ShaNiX2,
        ShaEngine::ShaNiX4,
        ShaEngine::Avx512X16,
    ];

    /// The engine's name, as [`SHA_ENGINE_ENV`] takes it.
    pub const fn name(self) -> &'static str {
        match self {
            ShaEngine::Portable => "portable",
            ShaEngine::ShaNi => "shani",
            ShaEngine::ShaNiX2 => "shani-x2",
            ShaEngine::ShaNiX4 => "shani-x4",
            ShaEngine::Avx512X16 => "avx512-x16",
        }
    }

    /// The engine called `name` (see [`ShaEngine::name`]; ASCII case and
    /// surrounding blanks ignored).
    pub fn from_name(name: &str) -> Option<ShaEngine> {
        Self::ALL
            .into_iter()
            .find(|e| e.name().eq_ignore_ascii_case(name.trim()))
    }

    /// Most messages the engine interleaves.
    const fn width(self) -> usize {
        match self {
            ShaEngine::Portable | ShaEngine::ShaNi => 1,
            ShaEngine::ShaNiX2 | ShaEngine::Avx512X16 => 2,
            ShaEngine::ShaNiX4 => 4,
        }
    }

    /// Whether this CPU runs the engine.
    pub fn is_available(self) -> bool {
        match self {
            ShaEngine::Portable => true,
            ShaEngine::Avx512X16 => Avx512::detect().is_some(),
            _ => ShaNi::detect().is_some(),
        }
    }

    /// The engines this CPU runs, [`ShaEngine::Portable`] first.
    pub fn available() -> impl Iterator<Item = ShaEngine> {
        Self::ALL.into_iter().filter(|e| e.is_available())
    }

    /// The fastest engine this CPU runs: [`ShaEngine::Avx512X16`] with
    /// AVX-512 (with 16 messages of 256 or 1500 bytes, on a Sapphire
    /// Rapids class CPU about 3 times the best SHA-NI engine for HMAC-SHA1
    /// and 1.5 to 1.7 times for HMAC-SHA-256; not measured on AMD), else
    /// [`ShaEngine::ShaNiX2`] with SHA-NI (two streams beat one and four
    /// there), else [`ShaEngine::Portable`].
    pub fn detect() -> ShaEngine {
        if Avx512::detect().is_some() {
            ShaEngine::Avx512X16
        } else if ShaNi::detect().is_some() {
            ShaEngine::ShaNiX2
        } else {
            ShaEngine::Portable
        }
    }
}

impl EngineChoice<ShaEngine> {
    /// The choice for the value `requested` of [`SHA_ENGINE_ENV`].
    pub fn from_request(requested: Option<&str>) -> EngineChoice<ShaEngine> {
        let usable = requested
            .and_then(ShaEngine::from_name)
            .filter(|e| e.is_available());
        Self::resolve(requested, usable, ShaEngine::detect)
    }
}

/// The SHA engine choice of this process, made once on first use from
/// [`SHA_ENGINE_ENV`] and the CPU.
pub fn sha_engine_choice() -> &'static EngineChoice<ShaEngine> {
    static CHOICE: OnceLock<EngineChoice<ShaEngine>> = OnceLock::new();
    CHOICE.get_or_init(|| {
        let env = std::env::var(SHA_ENGINE_ENV).ok();
        EngineChoice::<ShaEngine>::from_request(env.as_deref())
    })
}

/// The engine [`mac_multi`] uses in this process ([`sha_engine_choice`]):
/// [`SHA_ENGINE_ENV`] if it names one this CPU runs, [`ShaEngine::detect`]
/// otherwise.
pub fn sha_engine() -> ShaEngine {
    sha_engine_choice().engine
}

/// One message of [`mac_multi`].
pub struct MacJob<'a> {
    /// The key (its algorithm decides the hash; its digest length is not
    /// used: [`MacJob::tag`] gets the full tag).
    pub key: &'a MacKey,
    /// The message.
    pub data: &'a [u8],
    /// The full-length tag on return; bytes past the algorithm's output
    /// length are zero.
    pub tag: [u8; MAX_MAC_LEN],
}

impl<'a> MacJob<'a> {
    /// A job for `data` under `key`, tag zeroed.
    pub fn new(key: &'a MacKey, data: &'a [u8]) -> Self {
        MacJob {
            key,
            data,
            tag: [0; MAX_MAC_LEN],
        }
    }
}

impl std::fmt::Debug for MacJob<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MacJob {{ key: {:?}, len: {} }}", self.key, self.data.len())
    }
}

/// Computes the full-length (untruncated) tags of the `jobs` with the
/// process's engine ([`sha_engine`]). Keys, algorithms and lengths may
/// differ from job to job. No allocation.
pub fn mac_multi(jobs: &mut [MacJob<'_>]) {
    mac_multi_with(sha_engine(), jobs);
}

/// [`mac_multi`] with the given engine. On a CPU that cannot run it:
/// two interleaved SHA-NI streams for [`ShaEngine::Avx512X16`] without
/// AVX-512, [`ShaEngine::Portable`] without SHA-NI. Batches longer than
/// [`MAX_MAC_LANES`] are taken [`MAX_MAC_LANES`] jobs at a time.
/// [`ShaEngine::Avx512X16`] hands fewer messages of one algorithm than
/// five for HMAC-SHA1 and nine for HMAC-SHA-256 to two interleaved SHA-NI
/// streams when the CPU has SHA-NI.
pub fn mac_multi_with(engine: ShaEngine, jobs: &mut [MacJob<'_>]) {
    let ni = ShaNi::detect().filter(|_| engine != ShaEngine::Portable);
    let x16 = Avx512::detect().filter(|_| engine == ShaEngine::Avx512X16);
    for batch in jobs.chunks_mut(MAX_MAC_LANES) {
        for alg in [MacAlg::HmacSha1, MacAlg::HmacSha256] {
            let mut idx = [0u8; MAX_MAC_LANES];
            let mut n = 0;
            for (i, j) in batch.iter().enumerate() {
                if j.key.alg == alg {
                    idx[n] = i as u8;
                    n += 1;
                }
            }
            if n == 0 {
                continue;
            }
            let kernel = match (x16, ni) {
                (Some(x16), _) if n >= x16_min_jobs(alg) || ni.is_none() => Kernel::X16(x16),
                (_, Some(ni)) => Kernel::Ni(ni, engine.width()),
                _ => {
                    for j in batch.iter_mut().filter(|j| j.key.alg == alg) {
                        j.tag = j.key.tag_portable(j.data);
                    }
                    continue;
                }
            };
            run(kernel, alg, batch, &idx[..n]);
        }
    }
}

/// Fewest messages of algorithm `alg` the 16-lane AVX-512 kernels take;
/// fewer go to two interleaved SHA-NI streams. A 16-lane call costs
/// about the same for a few live lanes as for sixteen, two SHA-NI streams
/// the same per message: the `mac_alternate` bench prints how many
/// messages one full call is worth (5.3–5.4 for HMAC-SHA1, 8.1–8.7 for
/// HMAC-SHA-256, 256 and 1500 B, on a Sapphire Rapids class VM). Per
/// message there, SHA-NI against AVX-512, best of 40 (`mac_multi_with`
/// timed with this threshold at 1; one key, equal lengths):
///
/// | messages | HMAC-SHA1 256 B | HMAC-SHA1 1500 B | HMAC-SHA-256 256 B | HMAC-SHA-256 1500 B |
/// |---|---|---|---|---|
/// | 4 | 250 / 283 ns | 893 / 1,115 ns | 262 / 490 ns | 919 / 1,969 ns |
/// | 5 | 264 / 230 | 938 / 895 | 274 / 394 | 968 / 1,573 |
/// | 8 | 249 / 147 | 896 / 564 | 259 / 251 | 917 / 992 |
/// | 9 | 257 / 133 | 916 / 503 | 268 / 225 | 945 / 881 |
/// | 10 | 248 / 121 | 896 / 454 | 258 / 204 | 916 / 794 |
/// | 16 | 249 / 81 | 897 / 289 | 258 / 133 | 916 / 502 |
///
/// Eight HMAC-SHA-256 messages of 256 B run 3 % faster on AVX-512, of
/// 1500 B 8 % slower; from nine on both sizes gain.
fn x16_min_jobs(alg: MacAlg) -> usize {
    match alg {
        MacAlg::HmacSha1 => 5,
        MacAlg::HmacSha256 => 9,
    }
}

/// The kernel [`run`] calls: SHA-NI with at most this many lanes, or the
/// 16-lane AVX-512 kernels.
#[derive(Clone, Copy)]
enum Kernel {
    Ni(ShaNi, usize),
    X16(Avx512),
}

/// Widest SHA-NI kernel [`run`] calls.
const MAX_WIDTH: usize = 4;

/// A message in progress in a lane (its hash state is kept apart, in the
/// layout the kernel wants).
struct Slot {
    /// Index into the batch.
    job: usize,
    /// Whether the lane holds a message.
    live: bool,
    /// The part being hashed: 0 whole data blocks, 1 padded final blocks
    /// (`tail`), 2 outer block (`tail`'s first block).
    part: u8,
    /// Blocks of the current part already hashed.
    done: usize,
    /// Blocks in the current part.
    blocks: usize,
    /// Whether part 0 runs on into the padded final blocks (one part for
    /// the whole inner hash; [`Slot::pieces`]).
    merged: bool,
    tail: [u8; 2 * BLOCK],
}

impl Slot {
    const EMPTY: Slot = Slot {
        job: 0,
        live: false,
        part: 0,
        done: 0,
        blocks: 0,
        merged: false,
        tail: [0; 2 * BLOCK],
    };

    /// Starts `job`: padded final blocks; returns the inner state.
    fn start(&mut self, job: usize, j: &MacJob<'_>) -> [u32; 8] {
        let whole = j.data.len() / BLOCK;
        self.job = job;
        self.live = true;
        let tail_blocks = pad(
            &j.data[whole * BLOCK..],
            (BLOCK + j.data.len()) as u64,
            &mut self.tail,
        );
        self.done = 0;
        self.merged = false;
        if whole > 0 {
            self.part = 0;
            self.blocks = whole;
        } else {
            self.part = 1;
            self.blocks = tail_blocks;
        }
        j.key.inner
    }

    /// Starts `job` with the whole inner hash as one part (data blocks,
    /// then padded final blocks); returns the inner state.
    fn start_merged(&mut self, job: usize, j: &MacJob<'_>) -> [u32; 8] {
        let inner = self.start(job, j);
        self.part = 0;
        self.merged = true;
        self.blocks = inner_blocks(j.data.len());
        inner
    }

    /// The unhashed blocks of the current part as two pieces (for a merged
    /// part 0: the data's whole blocks, then the padded final blocks).
    fn pieces<'s>(&'s self, jobs: &'s [MacJob<'_>]) -> [&'s [u8]; 2] {
        if !(self.merged && self.part == 0) {
            return [self.data(jobs), &[]];
        }
        let whole = jobs[self.job].data.len() / BLOCK;
        let tail = &self.tail[..(self.blocks - whole) * BLOCK];
        if self.done < whole {
            [&jobs[self.job].data[self.done * BLOCK..whole * BLOCK], tail]
        } else {
            [&tail[(self.done - whole) * BLOCK..], &[]]
        }
    }

    /// Blocks left in the current part.
    fn left(&self) -> usize {
        self.blocks - self.done
    }

    /// The unhashed blocks of the current part.
    fn data<'s>(&'s self, jobs: &'s [MacJob<'_>]) -> &'s [u8] {
        let from = self.done * BLOCK;
        let to = self.blocks * BLOCK;
        match self.part {
            0 => &jobs[self.job].data[from..to],
            _ => &self.tail[from..to],
        }
    }

    /// Moves to the next part once the current one is done (`state` is the
    /// lane's hash state, replaced by the outer key state after the inner
    /// hash). Returns true when the message is finished (its tag written).
    fn advance(&mut self, alg: MacAlg, jobs: &mut [MacJob<'_>], state: &mut [u32; 8]) -> bool {
        if self.done < self.blocks {
            return false;
        }
        self.done = 0;
        match self.part {
            0 if !self.merged => {
                self.part = 1;
                self.blocks = if jobs[self.job].data.len() % BLOCK + 9 <= BLOCK {
                    1
                } else {
                    2
                };
                false
            }
            0 | 1 => {
                outer_block(alg, state, &mut self.tail);
                *state = jobs[self.job].key.outer;
                self.part = 2;
                self.blocks = 1;
                false
            }
            _ => {
                let tag = &mut jobs[self.job].tag;
                digest_into(alg, state, tag);
                tag[alg.output_len()..].fill(0);
                self.live = false;
                true
            }
        }
    }
}

/// Hashes the jobs `idx` of `jobs` (all of algorithm `alg`) in lanes of
/// the kernel's width.
fn run(kernel: Kernel, alg: MacAlg, jobs: &mut [MacJob<'_>], idx: &[u8]) {
    match kernel {
        Kernel::Ni(ni, w) => run_ni(ni, w.clamp(1, MAX_WIDTH), alg, jobs, idx),
        Kernel::X16(x16) => match even_blocks(jobs, idx) {
            Some(blocks) if idx.len() <= avx512_x16::LANES => run_x16_even(x16, alg, jobs, idx, blocks),
            _ => run_x16(x16, alg, jobs, idx),
        },
    }
}

/// Blocks of the inner hash of a `len`-byte message (after the 64-byte
/// key block): its whole blocks and one or two padded final blocks.
fn inner_blocks(len: usize) -> usize {
    len / BLOCK + if len % BLOCK + 9 <= BLOCK { 1 } else { 2 }
}

/// The inner hashes' block count when the jobs `idx` all have the same.
fn even_blocks(jobs: &[MacJob<'_>], idx: &[u8]) -> Option<usize> {
    let (&first, rest) = idx.split_first()?;
    let blocks = inner_blocks(jobs[usize::from(first)].data.len());
    rest.iter()
        .all(|&i| inner_blocks(jobs[usize::from(i)].data.len()) == blocks)
        .then_some(blocks)
}

/// [`run`] with the SHA-NI kernels: live lanes are compacted to the
/// front, and a call takes as many lanes as are live.
fn run_ni(ni: ShaNi, width: usize, alg: MacAlg, jobs: &mut [MacJob<'_>], idx: &[u8]) {
    let mut slots = [const { Slot::EMPTY }; MAX_WIDTH];
    let mut states = [[0u32; 8]; MAX_WIDTH];
    // Lane k is slots[order[k]]: finished lanes swap indices, not slots.
    let mut order = [0, 1, 2, 3];
    let mut next = idx.iter();
    let mut active = 0;
    loop {
        while active < width {
            let Some(&i) = next.next() else { break };
            let s = order[active];
            states[s] = slots[s].start(usize::from(i), &jobs[usize::from(i)]);
            active += 1;
        }
        if active == 0 {
            break;
        }
        let m = order[..active]
            .iter()
            .map(|&s| slots[s].left())
            .min()
            .unwrap_or(0);
        let lanes = &order[..active];
        match active {
            1 => call::<1>(ni, alg, &slots, &mut states, lanes, jobs, m),
            2 => call::<2>(ni, alg, &slots, &mut states, lanes, jobs, m),
            3 => call::<3>(ni, alg, &slots, &mut states, lanes, jobs, m),
            _ => call::<4>(ni, alg, &slots, &mut states, lanes, jobs, m),
        }
        let mut k = 0;
        while k < active {
            let s = order[k];
            slots[s].done += m;
            if slots[s].advance(alg, jobs, &mut states[s]) {
                active -= 1;
                order.swap(k, active);
            } else {
                k += 1;
            }
        }
    }
    // The states are as good as the key for this message's hash; the
    // tails hold message bytes and, in the outer block, the inner digest.
    states.zeroize();
    for s in &mut slots[..width.min(idx.len())] {
        s.tail[..MAX_MAC_LEN].zeroize();
    }
}

/// Runs `m` blocks of each of the `N` lanes `lanes` (slot indices) through
/// the SHA-NI kernel.
fn call<const N: usize>(
    ni: ShaNi,
    alg: MacAlg,
    slots: &[Slot],
    states: &mut [[u32; 8]; MAX_WIDTH],
    lanes: &[usize],
    jobs: &[MacJob<'_>],
    m: usize,
) {
    let mut st: [[u32; 8]; N] = std::array::from_fn(|l| states[lanes[l]]);
    let data: [&[u8]; N] = std::array::from_fn(|l| slots[lanes[l]].data(jobs));
    match alg {
        MacAlg::HmacSha1 => ni.sha1(&mut st, data, m),
        MacAlg::HmacSha256 => ni.sha256(&mut st, data, m),
    }
    for (l, s) in st.iter().enumerate() {
        states[lanes[l]] = *s;
    }
    st.zeroize();
}

/// The 16-lane AVX-512 kernel of `alg` on the state rows `st` (SHA-1
/// uses the first five), with the HMAC outer block from the rows `outer`
/// when given ([`Avx512::sha1`], [`Avx512::sha256`]).
fn x16_compress(
    x16: Avx512,
    alg: MacAlg,
    st: &mut [[u32; avx512_x16::LANES]; 8],
    outer: Option<&[[u32; avx512_x16::LANES]; 8]>,
    data: [[&[u8]; 2]; avx512_x16::LANES],
    blocks: usize,
) {
    match alg {
        MacAlg::HmacSha1 => {
            let st5 = st.first_chunk_mut().expect("8 > 5 rows");
            let outer5 = outer.map(|o| o.first_chunk().expect("8 > 5 rows"));
            x16.sha1(st5, outer5, data, blocks)
        }
        MacAlg::HmacSha256 => x16.sha256(st, outer, data, blocks),
    }
}

/// [`run`] with the 16-lane AVX-512 kernels for at most 16 jobs whose
/// inner hashes take `blocks` blocks each: one kernel call hashes every
/// lane's inner and outer blocks; the inner digests stay in registers.
/// Lanes past the jobs hash the first job's blocks again (their result is
/// not used).
fn run_x16_even(x16: Avx512, alg: MacAlg, jobs: &mut [MacJob<'_>], idx: &[u8], blocks: usize) {
    const L: usize = avx512_x16::LANES;
    let mut tails = [[0u8; 2 * BLOCK]; L];
    // SHA-1 uses the first five rows.
    let mut st = [[0u32; L]; 8];
    let mut outer = [[0u32; L]; 8];
    for (l, &i) in idx.iter().enumerate() {
        let j = &jobs[usize::from(i)];
        let whole = j.data.len() / BLOCK * BLOCK;
        pad(&j.data[whole..], (BLOCK + j.data.len()) as u64, &mut tails[l]);
        for w in 0..8 {
            st[w][l] = j.key.inner[w];
            outer[w][l] = j.key.outer[w];
        }
    }
    {
        let data: [[&[u8]; 2]; L] = std::array::from_fn(|l| {
            let l = if l < idx.len() { l } else { 0 };
            let d = jobs[usize::from(idx[l])].data;
            let whole = d.len() / BLOCK;
            [&d[..whole * BLOCK], &tails[l][..(blocks - whole) * BLOCK]]
        });
        x16_compress(x16, alg, &mut st, Some(&outer), data, blocks);
    }
    for (l, &i) in idx.iter().enumerate() {
        let s: [u32; 8] = std::array::from_fn(|w| st[w][l]);
        let tag = &mut jobs[usize::from(i)].tag;
        digest_into(alg, &s, tag);
        tag[alg.output_len()..].fill(0);
    }
    // `outer` holds the key's outer states; `st` only the tags now.
    outer.zeroize();
}

/// [`run`] with the 16-lane AVX-512 kernels. The states stay in the
/// kernel's layout (word-major) from call to call; lanes keep their
/// places, and a lane without a message hashes a live lane's blocks again
/// (its result is not used).
fn run_x16(x16: Avx512, alg: MacAlg, jobs: &mut [MacJob<'_>], idx: &[u8]) {
    const L: usize = avx512_x16::LANES;
    let mut slots = [const { Slot::EMPTY }; L];
    // SHA-1 uses the first five rows.
    let mut st = [[0u32; L]; 8];
    let mut next = idx.iter();
    let used = idx.len().min(L);
    for (l, slot) in slots.iter_mut().enumerate().take(used) {
        let Some(&i) = next.next() else { break };
        let s = slot.start_merged(usize::from(i), &jobs[usize::from(i)]);
        for (w, row) in st.iter_mut().enumerate() {
            row[l] = s[w];
        }
    }
    while let Some(any) = slots.iter().position(|s| s.live) {
        let m = slots.iter().filter(|s| s.live).map(Slot::left).min().unwrap_or(0);
        {
            let data: [[&[u8]; 2]; L] = std::array::from_fn(|l| {
                let s = if slots[l].live { &slots[l] } else { &slots[any] };
                s.pieces(jobs)
            });
            x16_compress(x16, alg, &mut st, None, data, m);
        }
        for l in 0..L {
            let slot = &mut slots[l];
            if !slot.live {
                continue;
            }
            slot.done += m;
            if slot.left() > 0 {
                continue;
            }
            let mut s = [0u32; 8];
            for (w, row) in st.iter().enumerate() {
                s[w] = row[l];
            }
            if slot.advance(alg, jobs, &mut s) {
                if let Some(&i) = next.next() {
                    s = slot.start_merged(usize::from(i), &jobs[usize::from(i)]);
                }
            }
            for (w, row) in st.iter_mut().enumerate() {
                row[l] = s[w];
            }
            s.zeroize();
        }
    }
    st.zeroize();
    for s in &mut slots[..used] {
        s.tail[..MAX_MAC_LEN].zeroize();
    }
}
