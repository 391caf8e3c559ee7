// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Whole vhost-user messages on a Unix socket, with their descriptors.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::net::UnixStream;

use vmm_sys_util::sock_ctrl_msg::ScmSocket;
use zeroize::{Zeroize, Zeroizing};

use crate::wire::vhost_user::{Header, HDR_SIZE, MAX_FDS, MAX_PAYLOAD};

use super::closer::Closer;

/// A received message: header, payload, attached fds. The payload is
/// zeroized when the message is dropped: a CREATE_CRYPTO_SESSION carries
/// the session's keys.
pub struct Message {
    /// The 12 header bytes ([`Header::from_bytes`]).
    pub hdr: [u8; HDR_SIZE],
    /// The header's `size` payload bytes.
    pub payload: Zeroizing<Vec<u8>>,
    /// The descriptors that came with any of the message's bytes.
    pub fds: Fds,
}

impl Message {
    /// Sends the message unchanged, its fds attached to its first bytes.
    pub(super) fn send_to(&self, sock: &UnixStream) -> io::Result<()> {
        let mut whole = Vec::with_capacity(HDR_SIZE + self.payload.len());
        whole.extend_from_slice(&self.hdr);
        whole.extend_from_slice(&self.payload);
        send_all(sock, &whole, &self.fds)
    }
}

impl Drop for Message {
    fn drop(&mut self) {
        // CREATE payloads carry keys.
        self.payload.zeroize();
    }
}

/// Descriptors received from a peer. Those of the frontend are closed on
/// the connection's closer thread (see [`Closer`]), never where they are
/// dropped: the frontend chooses what they are, and closing some of them
/// blocks for as long as it likes (a TCP socket with `SO_LINGER` and
/// unsent data, socket(7); a FUSE file it serves).
pub struct Fds {
    /// The descriptors, in the order received.
    pub files: Vec<File>,
    closer: Option<Closer>,
}

impl std::ops::Deref for Fds {
    type Target = [File];
    fn deref(&self) -> &[File] {
        &self.files
    }
}

impl Drop for Fds {
    fn drop(&mut self) {
        if let Some(closer) = &self.closer {
            for f in self.files.drain(..) {
                closer.close(f.into());
            }
        }
    }
}

/// Most descriptors one `sendmsg` can pass (`SCM_MAX_FD`, unix(7)).
const SCM_MAX_FD: usize = 253;

/// Receives into `buf`, returning bytes read and the fds that came with
/// them. There is room for as many descriptors as a peer can send with
/// one `sendmsg`: the kernel would close those that do not fit, on this
/// thread (see [`Fds`]).
pub(super) fn recv_some(sock: &UnixStream, buf: &mut [u8]) -> io::Result<(usize, Vec<File>)> {
    let mut fds = [-1 as RawFd; SCM_MAX_FD];
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

/// Receives one whole message from `sock`, with every descriptor that came
/// with any of its bytes (a plain `read` would let the kernel close those,
/// see `recv_some`). Descriptors go to `closer` when dropped, if given.
/// `None` at the end of the stream before a header. (Public for the
/// `socket` fuzz target, `tools/fuzz`.)
///
/// # Errors
/// Socket errors; `UnexpectedEof` for a stream that ends inside a message;
/// `InvalidData` for a payload over [`MAX_PAYLOAD`] bytes or more than
/// [`MAX_FDS`] descriptors with one message.
pub fn recv_message(sock: &UnixStream, closer: Option<&Closer>) -> io::Result<Option<Message>> {
    let mut fds = Fds {
        files: Vec::new(),
        closer: closer.cloned(),
    };
    let recv_exact = |buf: &mut [u8], fds: &mut Fds| -> io::Result<usize> {
        let mut got = 0;
        while got < buf.len() {
            let (n, more) = match recv_some(sock, &mut buf[got..]) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => r?,
            };
            fds.files.extend(more);
            if fds.files.len() > MAX_FDS {
                // At once, not at the end of the message: the rest stay
                // queued on the socket, for the closer (`run`).
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("more than {MAX_FDS} descriptors on one message"),
                ));
            }
            if n == 0 {
                break;
            }
            got += n;
        }
        Ok(got)
    };
    let mut hdr = [0u8; HDR_SIZE];
    match recv_exact(&mut hdr, &mut fds)? {
        0 => return Ok(None),
        n if n < hdr.len() => return Err(io::ErrorKind::UnexpectedEof.into()),
        _ => {}
    }
    let size = Header::from_bytes(&hdr).size;
    let size = size as usize;
    if size > MAX_PAYLOAD {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("message payload of {size} bytes exceeds {MAX_PAYLOAD}"),
        ));
    }
    let mut payload = Zeroizing::new(vec![0u8; size]);
    if recv_exact(&mut payload, &mut fds)? < size {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(Some(Message { hdr, payload, fds }))
}

/// Sends `data` whole, with `fds` attached to its first bytes.
///
/// # Errors
/// Socket errors.
pub(super) fn send_all(sock: &UnixStream, data: &[u8], fds: &[File]) -> io::Result<()> {
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let mut sent = sock.send_with_fds(&[data], &raw).map_err(io::Error::from)?;
    while sent < data.len() {
        sent += (&*sock).write(&data[sent..])?;
    }
    Ok(())
}
