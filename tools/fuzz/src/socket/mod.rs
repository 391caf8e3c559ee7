// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Fuzz target `socket`: the frontend-facing socket parsing of the
//! compatibility layer (`src/proxy/`), as the request pump runs it on each
//! message: `framing::recv_message`, then `pump::takes_descriptors`,
//! `pump::check_descriptor_count` and, for `SET_MEM_TABLE` /
//! `ADD_MEM_REG`, `memory_check::check_memory_regions`.
//!
//! The input decodes into a [`SocketProgram`]: up to [`MAX_FILES`] files
//! (a sealable memfd, a memfd made without `MFD_ALLOW_SEALING`, a memfd
//! sealed as QEMU seals it, or an eventfd; each of a given length), whether
//! `--require-sealed-memory` is set, and up to [`MAX_OPS`] pieces of the
//! byte stream: messages (any request code, flags and declared size; a
//! payload of raw bytes, a memory table, an `ADD_MEM_REG` region or a u64;
//! cut in two `sendmsg` calls or not) and raw bytes, each with up to 40 of
//! the files attached.
//!
//! The pieces are written to one end of a Unix stream socket pair with
//! their descriptors (`SCM_RIGHTS`), the end is closed, and the other end
//! is read with `recv_message` until it returns the end of the stream or
//! an error. Everything is checked against a model written from the
//! vhost-user spec (QEMU `docs/interop/vhost-user.rst`, "Message
//! Specification": a 12-byte header of request, flags and size, little
//! endian, then `size` payload bytes; "Memory regions description") and
//! the limits of rust-vmm `vhost` 0.18 (payload at most 4096 bytes, at most
//! 32 descriptors per message), not from the daemon's code:
//!
//! * the split of the stream into messages: each message's header and
//!   payload bytes, and which descriptors came with it (by inode, in order);
//!   the end of the stream between messages; `UnexpectedEof` for one that
//!   ends inside a message; `InvalidData` for a declared size above 4096 or
//!   more than 32 descriptors on one message (as soon as they arrive);
//! * `takes_descriptors` and `check_descriptor_count` (one descriptor per
//!   region of `SET_MEM_TABLE` as its u32 count says, one with
//!   `ADD_MEM_REG`, at most one with `SET_VRING_KICK` / `_CALL` / `_ERR`);
//! * `check_memory_regions` on a message the count check lets through: a
//!   payload too short for the table, more descriptors than regions, a file
//!   that cannot be sealed with `--require-sealed-memory`, a descriptor that
//!   is not a regular file, a region past the end of its file (or whose
//!   offset + size overflows) are refused, in region order; otherwise one
//!   warning per region whose file cannot be sealed; and afterwards each
//!   file carries `F_SEAL_SHRINK` exactly when the model sealed it.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;

use vhost_user_crypto::memory_check::check_memory_regions;
use vhost_user_crypto::proxy::framing::recv_message;
use vhost_user_crypto::proxy::pump::{check_descriptor_count, takes_descriptors};
use vhost_user_crypto::wire::vhost_user::{FrontendReq, Header, MAX_FDS, MAX_PAYLOAD};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use super::reader::{Reader, Writer};

mod seeds;
pub use seeds::seeds;

/// Most stream pieces decoded from one input.
pub const MAX_OPS: usize = 32;
/// Most files one input makes.
pub const MAX_FILES: usize = 4;
/// Most descriptors attached to one piece.
pub const MAX_PIECE_FDS: u8 = 40;
/// Files are at most this long (sparse memfds).
pub const MAX_FILE_LEN: u64 = 16 << 20;

/// Request codes (vhost-user spec, "Front-end message types"), as `vhost`'s
/// `FrontendReq` numbers them, for matching raw header words.
const SET_MEM_TABLE: u32 = FrontendReq::SET_MEM_TABLE as u32;
const SET_VRING_KICK: u32 = FrontendReq::SET_VRING_KICK as u32;
const SET_VRING_CALL: u32 = FrontendReq::SET_VRING_CALL as u32;
const SET_VRING_ERR: u32 = FrontendReq::SET_VRING_ERR as u32;
const ADD_MEM_REG: u32 = FrontendReq::ADD_MEM_REG as u32;

/// What a file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// memfd with `MFD_ALLOW_SEALING`: the check seals it.
    Sealable,
    /// memfd without it (born with `F_SEAL_SEAL`): cannot be sealed.
    Unsealable,
    /// memfd sealed `GROW | SHRINK | SEAL`, as QEMU's memory-backend-memfd.
    Sealed,
    /// An eventfd: no regular file, cannot be sealed.
    EventFd,
}

impl FileKind {
    fn from_u8(b: u8) -> Self {
        match b % 4 {
            0 => FileKind::Sealable,
            1 => FileKind::Unsealable,
            2 => FileKind::Sealed,
            _ => FileKind::EventFd,
        }
    }

    fn to_u8(self) -> u8 {
        self as u8
    }
}

/// One file the pieces may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileSpec {
    /// What it is.
    pub kind: FileKind,
    /// Its length in bytes (below [`MAX_FILE_LEN`]; eventfds have none).
    pub len: u64,
}

/// A memory region (vhost-user spec, "Memory regions description").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Region {
    /// Guest physical address.
    pub gpa: u64,
    /// Size in bytes.
    pub size: u64,
    /// Frontend virtual address.
    pub uaddr: u64,
    /// Offset in the file.
    pub offset: u64,
}

/// A message payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// `len` bytes of `fill` with `patch` at the start.
    Bytes {
        /// Size (modulo 4161: up to 64 bytes past the limit).
        len: u16,
        /// Filler.
        fill: u8,
        /// Leading bytes.
        patch: Vec<u8>,
    },
    /// `VhostUserMemory`: u32 count, u32 padding, the regions, with `cut`
    /// bytes (modulo 33) taken off the end.
    MemTable {
        /// The count field.
        count: u32,
        /// The regions (at most 8).
        regions: Vec<Region>,
        /// Bytes cut off the end.
        cut: u8,
    },
    /// `ADD_MEM_REG`'s u64 padding and one region, `cut` bytes (modulo 41)
    /// taken off the end.
    MemReg {
        /// The padding.
        pad: u64,
        /// The region.
        region: Region,
        /// Bytes cut off the end.
        cut: u8,
    },
    /// One u64 (features, vring fd messages with `VRING_NOFD_MASK`, …).
    U64(u64),
}

/// Descriptors attached to a piece: `count` (modulo 41) of the files,
/// slot i holding file `(first + i) % files`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Attach {
    /// How many.
    pub count: u8,
    /// The file in slot 0.
    pub first: u8,
}

/// A piece of the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// A message.
    Msg {
        /// Request code.
        request: u32,
        /// Header flags.
        flags: u32,
        /// Declared size, if not the payload's.
        size: Option<u32>,
        /// The payload.
        body: Body,
        /// Descriptors.
        fds: Attach,
        /// Sent in two `sendmsg` calls cut here (when inside the message).
        split: u16,
        /// The descriptors go with the second part.
        fds_late: bool,
    },
    /// Raw bytes.
    Raw {
        /// The bytes.
        bytes: Vec<u8>,
        /// Descriptors.
        fds: Attach,
    },
}

/// A decoded `socket` input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketProgram {
    /// `--require-sealed-memory`.
    pub require_sealed: bool,
    /// The files.
    pub files: Vec<FileSpec>,
    /// The pieces, in stream order.
    pub ops: Vec<Op>,
}

fn read_region(r: &mut Reader<'_>) -> Region {
    Region {
        gpa: r.compact(),
        size: r.compact(),
        uaddr: r.compact(),
        offset: r.compact(),
    }
}

fn write_region(w: &mut Writer, g: &Region) {
    for v in [g.gpa, g.size, g.uaddr, g.offset] {
        w.compact(v);
    }
}

fn read_attach(r: &mut Reader<'_>) -> Attach {
    Attach {
        count: r.u8() % (MAX_PIECE_FDS + 1),
        first: r.u8() % MAX_FILES as u8,
    }
}

impl SocketProgram {
    /// Decodes any byte string.
    pub fn decode(data: &[u8]) -> SocketProgram {
        let mut r = Reader::new(data);
        let head = r.u8();
        let require_sealed = head & 0x80 != 0;
        let files = (0..usize::from(head & 0x7f) % (MAX_FILES + 1))
            .map(|_| FileSpec {
                kind: FileKind::from_u8(r.u8()),
                len: r.compact() % MAX_FILE_LEN,
            })
            .collect();
        let mut ops = Vec::new();
        while !r.is_empty() && ops.len() < MAX_OPS {
            let tag = r.u8();
            if tag & 1 == 1 {
                ops.push(Op::Raw {
                    bytes: r.blob(),
                    fds: read_attach(&mut r),
                });
                continue;
            }
            let request = r.compact32();
            let flags = r.compact32();
            let size = (tag & 2 != 0).then(|| r.compact32());
            let body = match (tag >> 2) % 4 {
                0 => Body::Bytes {
                    len: r.u16() % (MAX_PAYLOAD as u16 + 65),
                    fill: r.u8(),
                    patch: r.blob(),
                },
                1 => Body::MemTable {
                    count: r.compact32(),
                    regions: (0..r.u8() % 9).map(|_| read_region(&mut r)).collect(),
                    cut: r.u8() % 33,
                },
                2 => Body::MemReg {
                    pad: r.compact(),
                    region: read_region(&mut r),
                    cut: r.u8() % 41,
                },
                _ => Body::U64(r.compact()),
            };
            let fds = read_attach(&mut r);
            let split = r.u16();
            ops.push(Op::Msg {
                request,
                flags,
                size,
                body,
                fds,
                split,
                fds_late: tag & 0x10 != 0,
            });
        }
        SocketProgram {
            require_sealed,
            files,
            ops,
        }
    }

    /// Encodes the program in the form [`SocketProgram::decode`] reads back.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.u8(u8::from(self.require_sealed) << 7 | self.files.len() as u8);
        for f in &self.files {
            w.u8(f.kind.to_u8());
            w.compact(f.len);
        }
        let attach = |w: &mut Writer, a: &Attach| {
            w.u8(a.count);
            w.u8(a.first);
        };
        for op in &self.ops {
            match op {
                Op::Raw { bytes, fds } => {
                    w.u8(1);
                    w.blob(bytes);
                    attach(&mut w, fds);
                }
                Op::Msg {
                    request,
                    flags,
                    size,
                    body,
                    fds,
                    split,
                    fds_late,
                } => {
                    let kind = match body {
                        Body::Bytes { .. } => 0u8,
                        Body::MemTable { .. } => 1,
                        Body::MemReg { .. } => 2,
                        Body::U64(_) => 3,
                    };
                    w.u8(u8::from(size.is_some()) << 1 | kind << 2 | u8::from(*fds_late) << 4);
                    w.compact(u64::from(*request));
                    w.compact(u64::from(*flags));
                    if let Some(s) = size {
                        w.compact(u64::from(*s));
                    }
                    match body {
                        Body::Bytes { len, fill, patch } => {
                            w.u16(*len);
                            w.u8(*fill);
                            w.blob(patch);
                        }
                        Body::MemTable { count, regions, cut } => {
                            w.compact(u64::from(*count));
                            w.u8(regions.len() as u8);
                            for g in regions {
                                write_region(&mut w, g);
                            }
                            w.u8(*cut);
                        }
                        Body::MemReg { pad, region, cut } => {
                            w.compact(*pad);
                            write_region(&mut w, region);
                            w.u8(*cut);
                        }
                        Body::U64(v) => w.compact(*v),
                    }
                    attach(&mut w, fds);
                    w.u16(*split);
                }
            }
        }
        w.buf
    }
}

fn region_bytes(out: &mut Vec<u8>, g: &Region) {
    for v in [g.gpa, g.size, g.uaddr, g.offset] {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// A payload's bytes.
pub fn body_bytes(b: &Body) -> Vec<u8> {
    match b {
        Body::Bytes { len, fill, patch } => {
            let mut p = vec![*fill; usize::from(*len)];
            let n = patch.len().min(p.len());
            p[..n].copy_from_slice(&patch[..n]);
            p
        }
        Body::MemTable { count, regions, cut } => {
            let mut p = count.to_le_bytes().to_vec();
            p.extend_from_slice(&[0; 4]);
            for g in regions {
                region_bytes(&mut p, g);
            }
            p.truncate(p.len().saturating_sub(usize::from(*cut)));
            p
        }
        Body::MemReg { pad, region, cut } => {
            let mut p = pad.to_le_bytes().to_vec();
            region_bytes(&mut p, region);
            p.truncate(p.len().saturating_sub(usize::from(*cut)));
            p
        }
        Body::U64(v) => v.to_le_bytes().to_vec(),
    }
}

/// What a run saw.
#[derive(Debug, Default, Clone, Copy)]
pub struct Outcome {
    /// Pieces written (each with at least one byte).
    pub pieces: u64,
    /// Messages received whole.
    pub messages: u64,
    /// Descriptors received with them.
    pub fds: u64,
    /// Streams ending between messages.
    pub ends: u64,
    /// Streams ending inside a message.
    pub truncated: u64,
    /// Streams refused (size or descriptors over the limit).
    pub refused: u64,
    /// Descriptor counts refused.
    pub count_refused: u64,
    /// Memory tables checked.
    pub tables: u64,
    /// Memory tables accepted.
    pub tables_ok: u64,
}

/// A file made for a run, with what the model knows of it.
struct Made {
    file: File,
    spec: FileSpec,
    /// The model's view: `F_SEAL_SHRINK` is on.
    sealed: bool,
    /// (st_dev, st_ino).
    id: (u64, u64),
}

fn make_file(spec: FileSpec) -> io::Result<File> {
    let fd = match spec.kind {
        // SAFETY: eventfd(2) with valid flags; the result is checked.
        FileKind::EventFd => unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) },
        kind => {
            let flags = match kind {
                FileKind::Unsealable => libc::MFD_CLOEXEC,
                _ => libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            };
            // SAFETY: a valid NUL-terminated name; the result is checked.
            unsafe { libc::memfd_create(c"fuzz-socket".as_ptr(), flags) }
        }
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    let file = unsafe { File::from_raw_fd(fd) };
    if spec.kind != FileKind::EventFd {
        file.set_len(spec.len)?;
    }
    if spec.kind == FileKind::Sealed {
        let seals = libc::F_SEAL_GROW | libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL;
        // SAFETY: F_ADD_SEALS with an int on a descriptor we own.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(file)
}

fn file_id(f: &File) -> (u64, u64) {
    let m = f.metadata().expect("fstat of a descriptor we hold");
    (m.dev(), m.ino())
}

fn has_shrink_seal(f: &File) -> bool {
    // SAFETY: F_GET_SEALS on a descriptor we hold.
    let s = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GET_SEALS) };
    s > 0 && s & libc::F_SEAL_SHRINK != 0
}

/// A piece as written: where it starts in the stream, and its files.
struct Sent {
    start: usize,
    files: Vec<usize>,
}

/// What the model expects `recv_message` to return next.
#[derive(Debug, PartialEq, Eq)]
enum Expect {
    /// A message: its stream range and the files that came with it.
    Message {
        start: usize,
        end: usize,
        files: Vec<usize>,
    },
    /// The end of the stream.
    End,
    /// An error of this kind.
    Error(io::ErrorKind),
}

/// The spec model of the framing: the message starting at `s`.
fn model_next(stream: &[u8], sent: &[Sent], s: usize) -> Expect {
    let files_in = |a: usize, b: usize| -> Vec<usize> {
        sent.iter()
            .filter(|p| p.start >= a && p.start < b)
            .flat_map(|p| p.files.iter().copied())
            .collect()
    };
    let end = stream.len();
    let hdr_end = (s + 12).min(end);
    if files_in(s, hdr_end).len() > MAX_FDS {
        return Expect::Error(io::ErrorKind::InvalidData);
    }
    if s == end {
        return Expect::End;
    }
    if hdr_end < s + 12 {
        return Expect::Error(io::ErrorKind::UnexpectedEof);
    }
    let size = u32::from_le_bytes(stream[s + 8..s + 12].try_into().expect("4 bytes")) as usize;
    if size > MAX_PAYLOAD {
        return Expect::Error(io::ErrorKind::InvalidData);
    }
    let msg_end = s + 12 + size;
    let files = files_in(s, msg_end.min(end));
    if files.len() > MAX_FDS {
        return Expect::Error(io::ErrorKind::InvalidData);
    }
    if msg_end > end {
        return Expect::Error(io::ErrorKind::UnexpectedEof);
    }
    Expect::Message {
        start: s,
        end: msg_end,
        files,
    }
}

/// The spec model of `check_descriptor_count`: whether `fds` descriptors
/// fit request `code`.
fn model_count_ok(code: u32, payload: &[u8], fds: usize) -> bool {
    match code {
        SET_MEM_TABLE => match payload.get(..4) {
            // (Too short: the memory check refuses it.)
            None => true,
            Some(n) => u32::from_le_bytes(n.try_into().expect("4 bytes")) as usize == fds,
        },
        ADD_MEM_REG => fds == 1,
        SET_VRING_KICK | SET_VRING_CALL | SET_VRING_ERR => fds <= 1,
        _ => true,
    }
}

/// The model of the memory check: `Ok(warnings)` or `Err(())`, sealing
/// the files it reaches in `made`.
fn model_memory(
    code: u32,
    payload: &[u8],
    slots: &[usize],
    made: &mut [Made],
    require_sealed: bool,
) -> Result<usize, ()> {
    let regions = if code == SET_MEM_TABLE {
        payload.get(8..)
    } else {
        payload.get(8..40)
    };
    let regions = regions.ok_or(())?;
    if regions.len() / 32 < slots.len() {
        return Err(());
    }
    let mut warnings = 0;
    for (i, &f) in slots.iter().enumerate() {
        let r = &regions[i * 32..i * 32 + 32];
        let word = |o: usize| u64::from_le_bytes(r[o..o + 8].try_into().expect("8 bytes"));
        let (size, offset) = (word(8), word(24));
        let m = &mut made[f];
        match m.spec.kind {
            FileKind::Sealable => m.sealed = true,
            FileKind::Sealed => {}
            FileKind::Unsealable | FileKind::EventFd if require_sealed => return Err(()),
            FileKind::Unsealable | FileKind::EventFd => warnings += 1,
        }
        if m.spec.kind == FileKind::EventFd {
            return Err(());
        }
        if offset.checked_add(size).is_none_or(|e| e > m.spec.len) {
            return Err(());
        }
    }
    Ok(warnings)
}

/// Decodes and runs one input.
pub fn run(data: &[u8]) -> Outcome {
    run_program(&SocketProgram::decode(data))
}

/// Runs a decoded program, panicking on any disagreement with the model.
pub fn run_program(prog: &SocketProgram) -> Outcome {
    let mut out = Outcome::default();
    let mut made: Vec<Made> = prog
        .files
        .iter()
        .map(|&spec| {
            let file = make_file(spec).expect("make a file");
            let id = file_id(&file);
            Made {
                file,
                spec,
                sealed: spec.kind == FileKind::Sealed,
                id,
            }
        })
        .collect();
    let slots = |a: &Attach| -> Vec<usize> {
        if made.is_empty() {
            return Vec::new();
        }
        (0..usize::from(a.count))
            .map(|i| (usize::from(a.first) + i) % made.len())
            .collect()
    };
    // The pieces, as `sendmsg` calls.
    let mut pieces: Vec<(Vec<u8>, Vec<usize>)> = Vec::new();
    for op in &prog.ops {
        match op {
            Op::Raw { bytes, fds } => pieces.push((bytes.clone(), slots(fds))),
            Op::Msg {
                request,
                flags,
                size,
                body,
                fds,
                split,
                fds_late,
            } => {
                let payload = body_bytes(body);
                let declared = size.unwrap_or(payload.len() as u32);
                let mut m = Header {
                    request: *request,
                    flags: *flags,
                    size: declared,
                }
                .to_bytes()
                .to_vec();
                m.extend_from_slice(&payload);
                let cut = usize::from(*split);
                if cut > 0 && cut < m.len() {
                    let second = m.split_off(cut);
                    let (a, b) = if *fds_late {
                        (Vec::new(), slots(fds))
                    } else {
                        (slots(fds), Vec::new())
                    };
                    pieces.push((m, a));
                    pieces.push((second, b));
                } else {
                    pieces.push((m, slots(fds)));
                }
            }
        }
    }
    let (writer, reader) = UnixStream::pair().expect("socketpair");
    writer.set_nonblocking(true).expect("O_NONBLOCK");
    let mut stream = Vec::new();
    let mut sent = Vec::new();
    for (bytes, files) in &pieces {
        if bytes.is_empty() {
            continue;
        }
        let raw: Vec<RawFd> = files.iter().map(|&f| made[f].file.as_raw_fd()).collect();
        // A full socket buffer (EAGAIN) or a partial write ends the stream
        // there: the model reads the bytes written.
        let n = match writer.send_with_fds(&[&bytes[..]], &raw) {
            Ok(n) if n > 0 => n,
            _ => break,
        };
        sent.push(Sent {
            start: stream.len(),
            files: files.clone(),
        });
        stream.extend_from_slice(&bytes[..n]);
        out.pieces += 1;
        if n < bytes.len() {
            break;
        }
    }
    drop(writer);
    let mut at = 0;
    loop {
        let want = model_next(&stream, &sent, at);
        let got = recv_message(&reader, None);
        let msg = match (want, got) {
            (Expect::End, Ok(None)) => {
                out.ends += 1;
                break;
            }
            (Expect::Error(kind), Err(e)) => {
                assert_eq!(e.kind(), kind, "at stream byte {at}: {e}");
                if kind == io::ErrorKind::UnexpectedEof {
                    out.truncated += 1;
                } else {
                    out.refused += 1;
                }
                break;
            }
            (Expect::Message { start, end, files }, Ok(Some(msg))) => {
                assert_eq!(&msg.hdr[..], &stream[start..start + 12], "header at {start}");
                assert_eq!(&msg.payload[..], &stream[start + 12..end], "payload at {start}");
                let ids: Vec<_> = msg.fds.iter().map(file_id).collect();
                let want_ids: Vec<_> = files.iter().map(|&f| made[f].id).collect();
                assert_eq!(ids, want_ids, "descriptors of the message at {start}");
                at = end;
                out.messages += 1;
                out.fds += ids.len() as u64;
                (msg, files)
            }
            (want, got) => panic!(
                "at stream byte {at}: model {want:?}, recv_message {:?}",
                got.map(|m| m.map(|m| (m.hdr, m.payload.len(), m.fds.len())))
            ),
        };
        let (msg, files) = msg;
        let code = u32::from_le_bytes(msg.hdr[..4].try_into().expect("4 bytes"));
        let hdr = Header::from_bytes(&msg.hdr);
        assert_eq!(hdr.size as usize, msg.payload.len());
        let Some(req) = hdr.frontend_req() else {
            continue;
        };
        assert_eq!(u32::from(req), code);
        assert_eq!(
            takes_descriptors(req),
            matches!(
                code,
                SET_MEM_TABLE | ADD_MEM_REG | SET_VRING_KICK | SET_VRING_CALL | SET_VRING_ERR
            ),
            "{req:?}"
        );
        if !takes_descriptors(req) {
            // The pump closes them: nothing else reads them.
            continue;
        }
        let counted = check_descriptor_count(req, &msg.payload, msg.fds.len());
        assert_eq!(
            counted.is_ok(),
            model_count_ok(code, &msg.payload, msg.fds.len()),
            "{req:?} with {} bytes and {} descriptors: {counted:?}",
            msg.payload.len(),
            msg.fds.len()
        );
        if let Err(e) = counted {
            assert_eq!(e.kind(), io::ErrorKind::InvalidData);
            out.count_refused += 1;
            // The connection ends here.
            break;
        }
        if !matches!(req, FrontendReq::SET_MEM_TABLE | FrontendReq::ADD_MEM_REG) {
            continue;
        }
        out.tables += 1;
        let checked = check_memory_regions(req, &msg.payload, &msg.fds, prog.require_sealed);
        let modelled = model_memory(code, &msg.payload, &files, &mut made, prog.require_sealed);
        match (&checked, modelled) {
            (Ok(w), Ok(n)) => {
                assert_eq!(w.len(), n, "warnings: {w:?}");
                out.tables_ok += 1;
            }
            (Err(e), Err(())) => assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}"),
            (c, m) => panic!(
                "{req:?} ({} bytes, files {files:?}): check {c:?}, model {m:?}",
                msg.payload.len()
            ),
        }
        for (i, m) in made.iter().enumerate() {
            assert_eq!(
                has_shrink_seal(&m.file),
                m.sealed,
                "file {i} ({:?}) sealed",
                m.spec.kind
            );
        }
        if checked.is_err() {
            break;
        }
    }
    out
}
