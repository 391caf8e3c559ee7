// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A raw vhost-user connection (QEMU `docs/interop/vhost-user.rst`): any
//! message, any flags, any descriptors, and what the daemon answers.

use std::io::{self, Read, Write};
use std::os::fd::RawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use super::daemon::TIMEOUT;
use crate::common::*;
use vhost_user_crypto::wire::vhost_user::{self, Header};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

/// What a read on a raw connection gave.
#[derive(Debug)]
pub enum Got {
    /// A whole message: request, flags, payload.
    Msg(u32, u32, Vec<u8>),
    /// The daemon closed the connection (EOF or ECONNRESET).
    Closed,
    /// Nothing within [`TIMEOUT`].
    TimedOut,
}

pub struct Conn {
    pub s: UnixStream,
}

impl Conn {
    pub fn open(sock: &Path) -> Conn {
        let s = UnixStream::connect(sock).unwrap();
        s.set_read_timeout(Some(TIMEOUT)).unwrap();
        s.set_write_timeout(Some(TIMEOUT)).unwrap();
        Conn { s }
    }

    /// Header and payload of a message with any request code and flags.
    pub fn message(req: u32, flags: u32, payload: &[u8]) -> Vec<u8> {
        let header = Header {
            request: req,
            flags,
            size: payload.len() as u32,
        };
        [&header.to_bytes()[..], payload].concat()
    }

    /// Sends `bytes` in one sendmsg carrying `fds`, then the rest if short.
    pub fn send_bytes(&self, bytes: &[u8], fds: &[RawFd]) -> io::Result<()> {
        let sent = if fds.is_empty() {
            0
        } else {
            self.s.send_with_fds(&[bytes], fds).map_err(io::Error::from)?
        };
        (&self.s).write_all(&bytes[sent..])
    }

    pub fn send(&self, req: u32, flags: u32, payload: &[u8], fds: &[RawFd]) -> io::Result<()> {
        self.send_bytes(&Self::message(req, flags, payload), fds)
    }

    /// SET_VRING_KICK then SET_VRING_CALL for ring 0 with `kick` and
    /// `call`, without NEED_REPLY and without waiting for anything (QEMU's
    /// order, `docs/PROTOCOL.md` §4.1).
    pub fn send_kick_and_call(&self, kick: RawFd, call: RawFd) -> io::Result<()> {
        self.send(SET_VRING_KICK, VERSION_1, &0u64.to_le_bytes(), &[kick])?;
        self.send(SET_VRING_CALL, VERSION_1, &0u64.to_le_bytes(), &[call])
    }

    pub fn recv(&self) -> Got {
        let mut hdr = [0u8; 12];
        let mut got = 0;
        while got < hdr.len() {
            match (&self.s).read(&mut hdr[got..]) {
                Ok(0) if got == 0 => return Got::Closed,
                Ok(0) => panic!("daemon closed the connection inside a reply header"),
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return Got::Closed,
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    assert_eq!(got, 0, "daemon stalled inside a reply header");
                    return Got::TimedOut;
                }
                Err(e) => panic!("reading a reply: {e}"),
            }
        }
        let word = |i: usize| u32::from_le_bytes(hdr[i..i + 4].try_into().unwrap());
        let size = word(8) as usize;
        assert!(size <= 4096, "reply payload of {size} bytes");
        let mut payload = vec![0u8; size];
        (&self.s).read_exact(&mut payload).expect("reply payload");
        Got::Msg(word(0), word(4), payload)
    }

    /// Receives the reply to `req` (flags REPLY | version 1) and returns its payload.
    #[track_caller]
    pub fn reply(&self, req: u32) -> Vec<u8> {
        match self.recv() {
            Got::Msg(r, f, p) => {
                assert_eq!((r, f), (req, REPLY | VERSION_1), "reply header to request {req}");
                p
            }
            other => panic!("request {req}: expected a reply, got {other:?}"),
        }
    }

    #[track_caller]
    pub fn reply_u64(&self, req: u32) -> u64 {
        let p = self.reply(req);
        assert_eq!(p.len(), 8, "reply to {req}: payload size");
        u64::from_le_bytes(p[..8].try_into().unwrap())
    }

    #[track_caller]
    pub fn get_features(&self) -> u64 {
        self.send(GET_FEATURES, VERSION_1, &[], &[]).unwrap();
        self.reply_u64(GET_FEATURES)
    }

    /// QEMU's negotiation plus REPLY_ACK, so a refused message can be
    /// answered with an error ack: GET_FEATURES, GET_PROTOCOL_FEATURES,
    /// SET_PROTOCOL_FEATURES(CRYPTO_SESSION | REPLY_ACK), SET_OWNER,
    /// SET_FEATURES(PROTOCOL_FEATURES) with NEED_REPLY (acked with 0).
    pub fn negotiated(sock: &Path) -> Conn {
        Conn::negotiated_with(sock, F_PROTOCOL_FEATURES)
    }

    /// [`Conn::negotiated`] with SET_FEATURES(`features`).
    pub fn negotiated_with(sock: &Path, features: u64) -> Conn {
        let c = Conn::open(sock);
        assert_ne!(c.get_features() & F_PROTOCOL_FEATURES, 0);
        c.send(GET_PROTOCOL_FEATURES, VERSION_1, &[], &[]).unwrap();
        let pf = c.reply_u64(GET_PROTOCOL_FEATURES);
        assert_eq!(
            pf & (PF_CRYPTO_SESSION | PF_REPLY_ACK),
            PF_CRYPTO_SESSION | PF_REPLY_ACK
        );
        c.send(
            SET_PROTOCOL_FEATURES,
            VERSION_1,
            &(PF_CRYPTO_SESSION | PF_REPLY_ACK).to_le_bytes(),
            &[],
        )
        .unwrap();
        c.send(SET_OWNER, VERSION_1 | NEED_REPLY, &[], &[]).unwrap();
        assert_eq!(c.reply_u64(SET_OWNER), 0, "SET_OWNER ack");
        c.send(SET_FEATURES, VERSION_1 | NEED_REPLY, &features.to_le_bytes(), &[])
            .unwrap();
        assert_eq!(c.reply_u64(SET_FEATURES), 0, "SET_FEATURES ack");
        c
    }
}

/// Frontend virtual address of guest address 0 in the raw tests (the
/// backend only uses it to translate SET_VRING_ADDR addresses).
pub const UADDR: u64 = 0x7f00_0000_0000;
pub const MEM_SIZE: u64 = 1 << 20;

/// SET_MEM_TABLE payload: (guest address, size, frontend address, mmap offset) per region.
pub fn mem_table(regions: &[(u64, u64, u64, u64)]) -> Vec<u8> {
    let mut p = Vec::new();
    p.extend_from_slice(&(regions.len() as u32).to_le_bytes());
    p.extend_from_slice(&0u32.to_le_bytes());
    for &(gpa, size, uaddr, off) in regions {
        for v in [gpa, size, uaddr, off] {
            p.extend_from_slice(&v.to_le_bytes());
        }
    }
    p
}

pub fn vring_state(index: u32, num: u32) -> Vec<u8> {
    vhost_user::vring_state(index, num).to_vec()
}

/// SET_VRING_ADDR payload (frontend addresses), no flags, no log.
pub fn vring_addr(index: u32, desc: u64, used: u64, avail: u64) -> Vec<u8> {
    let mut p = index.to_le_bytes().to_vec();
    p.extend_from_slice(&0u32.to_le_bytes());
    for v in [desc, used, avail, 0] {
        p.extend_from_slice(&v.to_le_bytes());
    }
    p
}

/// Reads what the daemon does with a bad request `req` sent with
/// NEED_REPLY: an error ack (non-zero u64) and/or a disconnect are fine; a
/// success ack, any other message, or neither within the timeout fail.
#[track_caller]
pub fn expect_refused(c: &Conn, req: u32, what: &str) -> &'static str {
    match c.recv() {
        Got::Closed => "disconnect",
        Got::TimedOut => panic!("{what}: neither a reply nor a disconnect"),
        Got::Msg(r, f, p) => {
            assert_eq!(
                (r, f, p.len()),
                (req, REPLY | VERSION_1, 8),
                "{what}: reply header"
            );
            let v = u64::from_le_bytes(p[..8].try_into().unwrap());
            assert_ne!(v, 0, "{what}: accepted");
            match c.recv() {
                Got::Closed => "error ack, then disconnect",
                Got::TimedOut => {
                    // Still connected: it must still work.
                    assert_ne!(c.get_features() & F_PROTOCOL_FEATURES, 0, "{what}");
                    "error ack"
                }
                Got::Msg(r, ..) => panic!("{what}: unexpected message {r} after the error ack"),
            }
        }
    }
}

/// Like `expect_refused` but a success ack is fine too.
pub fn accepted_or_refused(c: &Conn, req: u32) -> &'static str {
    match c.recv() {
        Got::Msg(r, f, p) if (r, f) == (req, REPLY | VERSION_1) && p == [0u8; 8] => "accepted",
        Got::Msg(r, f, p) if (r, f) == (req, REPLY | VERSION_1) && p.len() == 8 => "error ack",
        Got::Closed => "disconnect",
        other => panic!("request {req}: {other:?}"),
    }
}

/// What came back for one request on a raw connection (any reply).
pub fn outcome_of(c: &Conn) -> String {
    match c.recv() {
        Got::Msg(r, f, p) if p.len() == 8 => format!(
            "reply {r} flags {f:#x} value {}",
            u64::from_le_bytes(p[..8].try_into().unwrap())
        ),
        Got::Msg(r, f, p) => format!("reply {r} flags {f:#x} {} bytes", p.len()),
        Got::Closed => "disconnect".into(),
        Got::TimedOut => "no answer".into(),
    }
}

/// Sends SET_MEM_TABLE (`table`, one descriptor per entry of `fds`) with
/// NEED_REPLY on a new connection and returns what came back within 4 s;
/// the connection is closed afterwards.
pub fn send_mem_table(sock: &Path, table: &[u8], fds: &[RawFd]) -> Got {
    let c = Conn::negotiated(sock);
    c.send(SET_MEM_TABLE, VERSION_1 | NEED_REPLY, table, fds).unwrap();
    c.s.set_read_timeout(Some(Duration::from_secs(4))).unwrap();
    c.recv()
}
