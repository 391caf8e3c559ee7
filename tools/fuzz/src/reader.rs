// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Byte-level decoding and encoding of fuzz inputs.
//!
//! Every byte string decodes to something (missing bytes read as zero), so
//! the fuzzer never wastes an input; the encoder writes the canonical form
//! the decoder reads back, which is how the seed corpus is built.

/// Values a one-byte "compact" number can name directly (tags 0xE3..).
pub const SPECIAL: [u64; 29] = [
    0xFFFF_FFFF,
    0xFFFF_FFF0,
    0xFFFF_FFF8,
    0x7FFF_FFF0,
    0x8000_0000,
    0x1234_5678,
    0xFFFF,
    0x1_0000,
    0x1_0000_0000,
    u64::MAX,
    u64::MAX - 1,
    0xFFFF_FFFF_FFFF_FF00,
    0xDEAD_BEEF_0000_0000,
    0x1000,
    0x1010,
    0x8000,
    0x10_0000,
    0x10_0010,
    0x100,
    0x200,
    0x400,
    0x800,
    0xFFF,
    0x1001,
    0x7FFF_FFFF_FFFF_FFFF,
    0x8000_0000_0000_0000,
    0x4000,
    0x404,
    0xFFFF_FFFF_0000,
];

const TAG_U16: u8 = 0xE0;
const TAG_U32: u8 = 0xE1;
const TAG_U64: u8 = 0xE2;
const TAG_SPECIAL: u8 = 0xE3;

/// Reads fixed-size little-endian fields; past the end every read is zero.
#[derive(Debug)]
pub struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// A reader over `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Reader { data, pos: 0 }
    }

    /// Whether every byte has been read.
    pub fn is_empty(&self) -> bool {
        self.pos >= self.data.len()
    }

    /// Up to `n` bytes (fewer at the end).
    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let start = self.pos.min(self.data.len());
        let end = start.saturating_add(n).min(self.data.len());
        self.pos = start + n.min(self.data.len() - start);
        &self.data[start..end]
    }

    fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut b = [0u8; N];
        let s = self.bytes(N);
        b[..s.len()].copy_from_slice(s);
        b
    }

    /// One byte.
    pub fn u8(&mut self) -> u8 {
        self.array::<1>()[0]
    }

    /// A little-endian u16.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.array())
    }

    /// A little-endian u32.
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.array())
    }

    /// A little-endian u64.
    pub fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.array())
    }

    /// A compact number: one byte below 0xE0 is its own value, 0xE0/E1/E2
    /// are followed by a u16/u32/u64, 0xE3.. name [`SPECIAL`] values.
    pub fn compact(&mut self) -> u64 {
        match self.u8() {
            b if b < TAG_U16 => u64::from(b),
            TAG_U16 => u64::from(self.u16()),
            TAG_U32 => u64::from(self.u32()),
            TAG_U64 => self.u64(),
            b => SPECIAL[usize::from(b - TAG_SPECIAL)],
        }
    }

    /// A compact number truncated to 32 bits.
    pub fn compact32(&mut self) -> u32 {
        self.compact() as u32
    }

    /// A compact number truncated to 16 bits.
    pub fn compact16(&mut self) -> u16 {
        self.compact() as u16
    }

    /// A byte string: a length byte, then that many bytes.
    pub fn blob(&mut self) -> Vec<u8> {
        let n = usize::from(self.u8());
        self.bytes(n).to_vec()
    }
}

/// Encodes what [`Reader`] decodes.
#[derive(Debug, Default)]
pub struct Writer {
    /// The encoded bytes.
    pub buf: Vec<u8>,
}

impl Writer {
    /// One byte.
    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }

    /// A little-endian u16.
    pub fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    /// A little-endian u32.
    pub fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    /// A little-endian u64.
    pub fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    /// The shortest compact form of `v`.
    pub fn compact(&mut self, v: u64) {
        if v < u64::from(TAG_U16) {
            self.u8(v as u8);
        } else if let Some(i) = SPECIAL.iter().position(|&s| s == v) {
            self.u8(TAG_SPECIAL + i as u8);
        } else if v <= 0xFFFF {
            self.u8(TAG_U16);
            self.u16(v as u16);
        } else if v <= 0xFFFF_FFFF {
            self.u8(TAG_U32);
            self.u32(v as u32);
        } else {
            self.u8(TAG_U64);
            self.u64(v);
        }
    }

    /// A byte string of at most 255 bytes.
    pub fn blob(&mut self, b: &[u8]) {
        assert!(b.len() <= 255, "blob of {} bytes", b.len());
        self.u8(b.len() as u8);
        self.buf.extend_from_slice(b);
    }
}
