// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The frontend compatibility layer: sits between the frontend's socket and
//! `vhost-user-backend`, which cannot serve QEMU's crypto device on its own
//! (protocol reference §6): it ends the connection on messages 26/27, and
//! QEMU never sends `SET_VRING_ENABLE` for this device (§2.3, §8).
//!
//! Per frontend message:
//! * `CREATE_CRYPTO_SESSION` (26): answered here, in the payload's layout
//!   (A, B or C, detected or forced), from the connection's session registry;
//! * `CLOSE_CRYPTO_SESSION` (27): handled here, never answered (QEMU reads
//!   no reply; one would desynchronise the channel); unknown ids are ignored;
//! * `SET_VRING_KICK` (12) with a kick fd on a data ring, once
//!   `VHOST_USER_F_PROTOCOL_FEATURES` was acked: forwarded, then followed by
//!   an injected `SET_VRING_ENABLE(index, 1)` without NEED_REPLY, so the ring
//!   is live once the frontend has set it up, whether or not the frontend
//!   ever enables it (a later real `SET_VRING_ENABLE` is forwarded as is);
//! * everything else: forwarded unchanged, with its file descriptors.
//!
//! Backend-to-frontend bytes (replies) are forwarded unchanged with their
//! file descriptors.

use std::fs::File;
use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::thread;

use log::{debug, info, warn};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;
use zeroize::Zeroize;

use crate::request::MAX_QUEUE_SIZE;
use crate::session_msg::{
    create_reply, decode_close, decode_create, decode_header, encode_header, SessionAbi,
    VHOST_USER_CLOSE_CRYPTO_SESSION, VHOST_USER_CREATE_CRYPTO_SESSION, VHOST_USER_HDR_SIZE,
    VHOST_USER_MAX_PAYLOAD, VHOST_USER_VERSION,
};
use crate::sessions::SessionRegistry;
use crate::wire::Status;

/// `VHOST_USER_SET_FEATURES`.
pub const VHOST_USER_SET_FEATURES: u32 = 2;
/// `VHOST_USER_SET_VRING_NUM`.
pub const VHOST_USER_SET_VRING_NUM: u32 = 8;
/// `VHOST_USER_SET_VRING_KICK`.
pub const VHOST_USER_SET_VRING_KICK: u32 = 12;
/// `VHOST_USER_SET_VRING_ENABLE`.
pub const VHOST_USER_SET_VRING_ENABLE: u32 = 18;
/// `VHOST_USER_VRING_NOFD_MASK`: bit 8 of a vring fd message's u64.
pub const VHOST_USER_VRING_NOFD_MASK: u64 = 0x100;
/// `VHOST_USER_VRING_IDX_MASK`.
pub const VHOST_USER_VRING_IDX_MASK: u64 = 0xff;
/// Most file descriptors one message may carry (rust-vmm `MAX_ATTACHED_FD_ENTRIES`).
pub const MAX_ATTACHED_FDS: usize = 32;

const PROTOCOL_FEATURES_BIT: u64 = 1 << 30;

/// Which session layout to use for CREATE messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AbiChoice {
    /// Detect from size and content (protocol reference §1.7).
    #[default]
    Auto,
    /// Always this layout.
    Fixed(SessionAbi),
}

/// A received message: header, payload, attached fds.
struct Message {
    hdr: [u8; VHOST_USER_HDR_SIZE],
    payload: Vec<u8>,
    fds: Vec<File>,
}

impl Drop for Message {
    fn drop(&mut self) {
        // CREATE payloads carry keys.
        self.payload.zeroize();
    }
}

/// Receives into `buf`, returning bytes read and the fds that came with them.
fn recv_some(sock: &UnixStream, buf: &mut [u8]) -> io::Result<(usize, Vec<File>)> {
    let mut fds = [-1 as RawFd; MAX_ATTACHED_FDS];
    let mut iov = [libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    }];
    // SAFETY: the iovec points to `buf`, which is exclusively borrowed and
    // may receive arbitrary bytes.
    let (n, nfds) = unsafe { sock.recv_with_fds(&mut iov, &mut fds) }.map_err(io::Error::from)?;
    let files = fds[..nfds]
        .iter()
        // SAFETY: recvmsg just gave us these descriptors; we own them.
        .map(|&fd| unsafe { File::from_raw_fd(fd) })
        .collect();
    Ok((n, files))
}

fn recv_message(sock: &UnixStream) -> io::Result<Option<Message>> {
    let mut hdr = [0u8; VHOST_USER_HDR_SIZE];
    let (n, fds) = recv_some(sock, &mut hdr)?;
    if n == 0 {
        return Ok(None);
    }
    if n < hdr.len() {
        (&*sock).read_exact(&mut hdr[n..])?;
    }
    let (_, _, size) = decode_header(&hdr);
    let size = size as usize;
    if size > VHOST_USER_MAX_PAYLOAD {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("message payload of {size} bytes exceeds {VHOST_USER_MAX_PAYLOAD}"),
        ));
    }
    let mut payload = vec![0u8; size];
    (&*sock).read_exact(&mut payload)?;
    Ok(Some(Message { hdr, payload, fds }))
}

fn send_all(sock: &UnixStream, data: &[u8], fds: &[File]) -> io::Result<()> {
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let mut sent = sock.send_with_fds(&[data], &raw).map_err(io::Error::from)?;
    while sent < data.len() {
        sent += (&*sock).write(&data[sent..])?;
    }
    Ok(())
}

/// Serves one frontend connection: pumps messages between `frontend` and
/// `backend` (the library's end) until either side closes, then shuts both.
///
/// # Errors
/// Socket errors; a malformed message from the frontend (payload over
/// 4096 bytes) ends the connection with an error.
pub fn run(
    frontend: UnixStream,
    backend: UnixStream,
    mut registry: SessionRegistry,
    abi: AbiChoice,
    num_queues: usize,
) -> io::Result<()> {
    let frontend_w = Arc::new(Mutex::new(frontend.try_clone()?));
    let backend_r = backend.try_clone()?;
    let fw = frontend_w.clone();
    let front_shut = frontend.try_clone()?;
    let replies = thread::Builder::new().name("vuc-replies".into()).spawn(move || {
        let mut buf = vec![0u8; VHOST_USER_HDR_SIZE + VHOST_USER_MAX_PAYLOAD];
        loop {
            match recv_some(&backend_r, &mut buf) {
                Ok((0, _)) | Err(_) => break,
                Ok((n, fds)) => {
                    let w = fw.lock().unwrap_or_else(|e| e.into_inner());
                    if send_all(&w, &buf[..n], &fds).is_err() {
                        break;
                    }
                }
            }
        }
        // The library ended the connection: end the frontend's too.
        let _ = front_shut.shutdown(Shutdown::Both);
    })?;

    let result = pump_requests(&frontend, &backend, &frontend_w, &mut registry, abi, num_queues);
    let _ = backend.shutdown(Shutdown::Both);
    let _ = frontend.shutdown(Shutdown::Both);
    let _ = replies.join();
    info!("frontend disconnected; {} sessions dropped", registry.len());
    result
}

fn pump_requests(
    frontend: &UnixStream,
    backend: &UnixStream,
    frontend_w: &Mutex<UnixStream>,
    registry: &mut SessionRegistry,
    abi: AbiChoice,
    num_queues: usize,
) -> io::Result<()> {
    let mut acked_features: u64 = 0;
    while let Some(msg) = recv_message(frontend)? {
        let (request, flags, _) = decode_header(&msg.hdr);
        match request {
            VHOST_USER_CREATE_CRYPTO_SESSION => {
                let reply = handle_create(registry, &msg.payload, abi);
                let w = frontend_w.lock().unwrap_or_else(|e| e.into_inner());
                send_all(&w, &reply, &[])?;
            }
            VHOST_USER_CLOSE_CRYPTO_SESSION => match decode_close(&msg.payload) {
                Ok(id) => {
                    registry.close(id);
                }
                Err(e) => warn!("CLOSE_CRYPTO_SESSION ignored: {e}"),
            },
            _ => {
                debug!(
                    "forwarding request {request} (flags {flags:#x}, {} fds)",
                    msg.fds.len()
                );
                if request == VHOST_USER_SET_VRING_NUM && msg.payload.len() == 8 {
                    // vhost-user-backend only checks 1..=max; virtio-queue then
                    // silently keeps the old size for a non-power of two. A
                    // split ring must be a power of two (VIRTIO 1.2 §2.7):
                    // refuse it with a clean disconnect.
                    let num = u32::from_le_bytes(msg.payload[4..8].try_into().unwrap_or_default());
                    if num == 0 || num > u32::from(MAX_QUEUE_SIZE) || !num.is_power_of_two() {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!("SET_VRING_NUM {num} is not a power of two in 1..=32768"),
                        ));
                    }
                }
                if request == VHOST_USER_SET_FEATURES && msg.payload.len() == 8 {
                    acked_features = u64::from_le_bytes(msg.payload[..8].try_into().unwrap_or_default());
                }
                let mut whole = Vec::with_capacity(VHOST_USER_HDR_SIZE + msg.payload.len());
                whole.extend_from_slice(&msg.hdr);
                whole.extend_from_slice(&msg.payload);
                send_all(backend, &whole, &msg.fds)?;
                if request == VHOST_USER_SET_VRING_KICK
                    && msg.payload.len() == 8
                    && acked_features & PROTOCOL_FEATURES_BIT != 0
                {
                    let v = u64::from_le_bytes(msg.payload[..8].try_into().unwrap_or_default());
                    let index = v & VHOST_USER_VRING_IDX_MASK;
                    if v & VHOST_USER_VRING_NOFD_MASK == 0 && (index as usize) < num_queues {
                        debug!("enabling data ring {index} (frontend set it up)");
                        send_all(backend, &enable_message(index as u32), &[])?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// `SET_VRING_ENABLE(index, 1)`, flags = version 1 (no NEED_REPLY).
fn enable_message(index: u32) -> [u8; VHOST_USER_HDR_SIZE + 8] {
    let mut m = [0u8; VHOST_USER_HDR_SIZE + 8];
    m[..VHOST_USER_HDR_SIZE].copy_from_slice(&encode_header(
        VHOST_USER_SET_VRING_ENABLE,
        VHOST_USER_VERSION,
        8,
    ));
    m[12..16].copy_from_slice(&index.to_le_bytes());
    m[16..20].copy_from_slice(&1u32.to_le_bytes());
    m
}

/// Decodes a CREATE payload, runs it through the registry and builds the
/// reply message. Never fails: a payload that matches no layout, or not the
/// forced one, gets a negative session id in a reply of the same size.
pub fn handle_create(registry: &mut SessionRegistry, payload: &[u8], abi: AbiChoice) -> Vec<u8> {
    let layout = match abi {
        AbiChoice::Auto => SessionAbi::detect(payload),
        AbiChoice::Fixed(a) => Some(a),
    };
    let id = match layout.map(|l| (l, decode_create(payload, l))) {
        Some((_, Ok(info))) => registry.create(&info),
        Some((_, Err(e))) => {
            warn!("CREATE_CRYPTO_SESSION refused: {e}");
            -(Status::Err as i64)
        }
        None => {
            warn!(
                "CREATE_CRYPTO_SESSION refused: payload of {} bytes matches no layout",
                payload.len()
            );
            -(Status::Err as i64)
        }
    };
    // A forced layout whose size does not match: answer where that layout
    // keeps the id only if it fits; create_reply skips it otherwise.
    let reply_layout = layout.filter(|l| l.size() == payload.len());
    create_reply(payload, reply_layout, id)
}
