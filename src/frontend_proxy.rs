// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The frontend compatibility layer: sits between the frontend's socket and
//! `vhost-user-backend`, which cannot serve QEMU's crypto device on its own
//! (protocol reference §6): it ends the connection on messages 26/27, and
//! QEMU never sends `SET_VRING_ENABLE` for this device (§2.3, §8).
//!
//! Per frontend message:
//! * `CREATE_CRYPTO_SESSION` (26): answered here, in the payload's layout
//!   (A, B or C, detected or forced), from the connection's session registry;
//! * `CLOSE_CRYPTO_SESSION` (27): handled here; unknown ids are ignored.
//!   Answered only when the frontend negotiated `REPLY_ACK` and sets
//!   `NEED_REPLY` on it: then with the u64 ack the vhost-user spec gives
//!   such messages (0 = closed, 1 = unknown id or malformed payload). QEMU
//!   does not set the flag and reads no reply (one would desynchronise
//!   the channel);
//! * `SET_VRING_KICK` (12) and `SET_VRING_CALL` (13) with fds on a data
//!   ring, once `VHOST_USER_F_PROTOCOL_FEATURES` was acked: forwarded, and
//!   when the ring has both, followed by an injected
//!   `SET_VRING_ENABLE(index, 1)` without NEED_REPLY, so the ring is live
//!   once the frontend has set it up, whether or not the frontend ever
//!   enables it (after `GET_VRING_BASE` stops a ring, it is enabled again
//!   once set up again). A real `SET_VRING_ENABLE` is forwarded as is, and
//!   from then on that ring's enable state is the frontend's: nothing is
//!   injected for it any more (a ring it disabled stays disabled when it
//!   sends a new call fd);
//! * `SET_VRING_NUM` and `SET_VRING_BASE` values no split ring can have end
//!   the connection (the library would accept or truncate them), and so do
//!   memory regions larger than the file behind them (SIGBUS on access);
//! * `SET_VRING_KICK`, `SET_VRING_CALL` and `SET_VRING_ERR` descriptors
//!   that are not eventfds, or are eventfds in semaphore mode, end the
//!   connection; the others are made non-blocking before the library gets
//!   them (see [`check_ring_eventfd`]);
//! * `SET_VRING_KICK` of a data ring, given a [`KickWatch`] (the daemon
//!   always gives one): the frontend's kick eventfd goes to the watch (the
//!   queue's worker thread watches it itself) and the library gets a fresh
//!   eventfd of the daemon's own instead, which only it reads and nobody
//!   writes. vhost-user-backend 0.24 reads a ring's *current* kick eventfd
//!   whenever its epoll reports one of the ring's, and a failed read
//!   (`EAGAIN`: the frontend read the count first, two rings share the
//!   eventfd, or the ring's earlier eventfd, left in the epoll, was
//!   written) ends that queue's worker thread for the rest of the
//!   connection;
//! * `SET_MEM_TABLE` / `ADD_MEM_REG`: each region's file is sealed against
//!   shrinking first (`F_SEAL_SHRINK`, added if the memfd allows it), so the
//!   size checked is the size for good; a file that cannot be sealed is
//!   accepted with a warning, or ends the connection with
//!   `--require-sealed-memory` (see [`seal_against_shrinking`]); the files
//!   must be regular files, a hugetlbfs region gets its huge pages reserved
//!   (or is refused), and all of it must be done within 2 s, in a helper
//!   process (`check_memory_regions_bounded`);
//! * `SET_PROTOCOL_FEATURES` with a bit the daemon did not offer ends the
//!   connection (the library would take it);
//! * descriptors: one per region of `SET_MEM_TABLE`, one with
//!   `ADD_MEM_REG`, at most one with a ring's eventfd message (another
//!   count ends the connection); those of other messages are closed, not
//!   forwarded. Every descriptor the frontend sends is closed on the
//!   connection's closer thread (`Fds`), and so is the frontend's socket
//!   at the end;
//! * everything else: forwarded unchanged.
//!
//! Backend-to-frontend bytes (replies) are forwarded unchanged with their
//! file descriptors.

use std::fs::File;
use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;

use log::{debug, info, warn};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;
use zeroize::{Zeroize, Zeroizing};

use crate::request::MAX_QUEUE_SIZE;
use crate::session_msg::{
    create_reply, decode_close, decode_create, decode_header, encode_header, SessionAbi,
    VHOST_USER_CLOSE_CRYPTO_SESSION, VHOST_USER_CREATE_CRYPTO_SESSION, VHOST_USER_HDR_SIZE,
    VHOST_USER_MAX_PAYLOAD, VHOST_USER_NEED_REPLY_MASK, VHOST_USER_REPLY_MASK, VHOST_USER_VERSION,
};
use crate::sessions::SessionRegistry;
use crate::wire::Status;

/// `VHOST_USER_GET_FEATURES`.
pub const VHOST_USER_GET_FEATURES: u32 = 1;
/// `VHOST_USER_SET_FEATURES`.
pub const VHOST_USER_SET_FEATURES: u32 = 2;
/// `VHOST_USER_SET_PROTOCOL_FEATURES`.
pub const VHOST_USER_SET_PROTOCOL_FEATURES: u32 = 16;
/// `VHOST_USER_PROTOCOL_F_REPLY_ACK`.
pub const VHOST_USER_PROTOCOL_F_REPLY_ACK: u64 = 1 << 3;
/// `VHOST_USER_RESET_OWNER`.
pub const VHOST_USER_RESET_OWNER: u32 = 4;
/// `VHOST_USER_SET_MEM_TABLE`.
pub const VHOST_USER_SET_MEM_TABLE: u32 = 5;
/// `VHOST_USER_ADD_MEM_REG`.
pub const VHOST_USER_ADD_MEM_REG: u32 = 37;
/// `VHOST_USER_SET_VRING_NUM`.
pub const VHOST_USER_SET_VRING_NUM: u32 = 8;
/// `VHOST_USER_SET_VRING_BASE`.
pub const VHOST_USER_SET_VRING_BASE: u32 = 10;
/// `VHOST_USER_GET_VRING_BASE`.
pub const VHOST_USER_GET_VRING_BASE: u32 = 11;
/// `VHOST_USER_SET_VRING_KICK`.
pub const VHOST_USER_SET_VRING_KICK: u32 = 12;
/// `VHOST_USER_SET_VRING_CALL`.
pub const VHOST_USER_SET_VRING_CALL: u32 = 13;
/// `VHOST_USER_SET_VRING_ERR`.
pub const VHOST_USER_SET_VRING_ERR: u32 = 14;
/// `VHOST_USER_SET_VRING_ENABLE`.
pub const VHOST_USER_SET_VRING_ENABLE: u32 = 18;
/// `VHOST_USER_VRING_NOFD_MASK`: bit 8 of a vring fd message's u64.
pub const VHOST_USER_VRING_NOFD_MASK: u64 = 0x100;
/// `VHOST_USER_VRING_IDX_MASK`.
pub const VHOST_USER_VRING_IDX_MASK: u64 = 0xff;
/// Most file descriptors one message may carry (rust-vmm `MAX_ATTACHED_FD_ENTRIES`).
pub const MAX_ATTACHED_FDS: usize = 32;

const PROTOCOL_FEATURES_BIT: u64 = 1 << 30;

/// What the layer enforces on one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProxyConfig {
    /// Layout of CREATE payloads.
    pub abi: AbiChoice,
    /// Data queues of the device (rings past them are never enabled).
    pub num_queues: usize,
    /// Refuse memory regions whose file cannot be sealed against shrinking.
    pub require_sealed_memory: bool,
}

/// Which session layout to use for CREATE messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AbiChoice {
    /// Detect from size and content (protocol reference §1.7).
    #[default]
    Auto,
    /// Always this layout.
    Fixed(SessionAbi),
}

/// A received message: header, payload, attached fds. The payload is
/// zeroized when the message is dropped: a CREATE_CRYPTO_SESSION carries
/// the session's keys.
struct Message {
    hdr: [u8; VHOST_USER_HDR_SIZE],
    payload: Zeroizing<Vec<u8>>,
    fds: Fds,
}

/// Descriptors received from a peer. Those of the frontend are closed on
/// the connection's closer thread (see [`Closer`]), never where they are
/// dropped: the frontend chooses what they are, and closing some of them
/// blocks for as long as it likes (a TCP socket with `SO_LINGER` and
/// unsent data, socket(7); a FUSE file it serves).
struct Fds {
    files: Vec<File>,
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

/// Where a connection's frontend descriptors are closed: a thread of the
/// connection's own (`vuc-closer`), not waited for. If closing one blocks,
/// only that thread waits, and the descriptors behind it stay open until
/// it is done; the request pump, the teardown and later connections go
/// on. What that can hold is bounded: past [`MAX_PENDING_CLOSES`] of its
/// own connection waiting, the request pump ends that connection; and the
/// daemon does not serve another one while more than that many wait
/// daemon-wide ([`pending_closes`]; or it exits with status 3, see
/// `daemon::serve_stream`).
#[derive(Clone, Debug)]
pub struct Closer {
    tx: std::sync::mpsc::Sender<OwnedFd>,
    /// This connection's descriptors not closed yet.
    mine: Arc<std::sync::atomic::AtomicUsize>,
}

/// Frontend descriptors handed to closer threads and not closed yet, in
/// the whole daemon.
static PENDING_CLOSES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Most frontend descriptors that may wait to be closed, per connection
/// (more end it) and daemon-wide (more hold up the next connection). An
/// honest frontend's are closed as they come; each one waiting stays open
/// in the daemon, and so does the thread it waits on.
pub const MAX_PENDING_CLOSES: usize = 256;

/// Frontend descriptors handed to closer threads ([`Closer`]) and not
/// closed yet, daemon-wide.
pub fn pending_closes() -> usize {
    PENDING_CLOSES.load(Ordering::Relaxed)
}

impl Closer {
    /// Starts the closer thread. It ends once every `Closer` is dropped and
    /// it has closed what it was given.
    ///
    /// # Errors
    /// The thread could not be started.
    pub fn start() -> io::Result<Self> {
        let (tx, rx) = std::sync::mpsc::channel::<OwnedFd>();
        let mine = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let left = mine.clone();
        thread::Builder::new().name("vuc-closer".into()).spawn(move || {
            for fd in rx {
                drop(fd);
                left.fetch_sub(1, Ordering::Relaxed);
                PENDING_CLOSES.fetch_sub(1, Ordering::Relaxed);
            }
        })?;
        Ok(Closer { tx, mine })
    }

    /// This connection's descriptors handed over and not closed yet.
    fn pending(&self) -> usize {
        self.mine.load(Ordering::Relaxed)
    }

    /// Hands `fd` to the closer thread (or, if that thread is gone, which
    /// cannot happen while a `Closer` exists, drops it here).
    fn close(&self, fd: OwnedFd) {
        self.mine.fetch_add(1, Ordering::Relaxed);
        PENDING_CLOSES.fetch_add(1, Ordering::Relaxed);
        if let Err(std::sync::mpsc::SendError(fd)) = self.tx.send(fd) {
            self.mine.fetch_sub(1, Ordering::Relaxed);
            PENDING_CLOSES.fetch_sub(1, Ordering::Relaxed);
            drop(fd);
        }
    }
}

impl Message {
    /// Sends the message unchanged, its fds attached to its first bytes.
    fn send_to(&self, sock: &UnixStream) -> io::Result<()> {
        let mut whole = Vec::with_capacity(VHOST_USER_HDR_SIZE + self.payload.len());
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

/// Most descriptors one `sendmsg` can pass (`SCM_MAX_FD`, unix(7)).
const SCM_MAX_FD: usize = 253;

/// Receives into `buf`, returning bytes read and the fds that came with
/// them. There is room for as many descriptors as a peer can send with
/// one `sendmsg`: the kernel would close those that do not fit, on this
/// thread (see [`Fds`]).
fn recv_some(sock: &UnixStream, buf: &mut [u8]) -> io::Result<(usize, Vec<File>)> {
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
/// see [`recv_some`]). Descriptors go to `closer` when dropped, if given.
/// `None` at the end of the stream before a header.
fn recv_message(sock: &UnixStream, closer: Option<&Closer>) -> io::Result<Option<Message>> {
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
            if fds.files.len() > MAX_ATTACHED_FDS {
                // At once, not at the end of the message: the rest stay
                // queued on the socket, for the closer (`run`).
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("more than {MAX_ATTACHED_FDS} descriptors on one message"),
                ));
            }
            if n == 0 {
                break;
            }
            got += n;
        }
        Ok(got)
    };
    let mut hdr = [0u8; VHOST_USER_HDR_SIZE];
    match recv_exact(&mut hdr, &mut fds)? {
        0 => return Ok(None),
        n if n < hdr.len() => return Err(io::ErrorKind::UnexpectedEof.into()),
        _ => {}
    }
    let (_, _, size) = decode_header(&hdr);
    let size = size as usize;
    if size > VHOST_USER_MAX_PAYLOAD {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("message payload of {size} bytes exceeds {VHOST_USER_MAX_PAYLOAD}"),
        ));
    }
    let mut payload = Zeroizing::new(vec![0u8; size]);
    if recv_exact(&mut payload, &mut fds)? < size {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
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

/// Takes the frontend's kick eventfds of the data rings (see the module
/// documentation): the daemon's queue workers watch them themselves.
pub trait KickWatch {
    /// Data ring `index` (below the number of data queues) now has `kick`
    /// as its kick eventfd (already checked, [`check_ring_eventfd`]), or
    /// none (`VHOST_USER_VRING_NOFD_MASK`). Keeps what it needs (a copy).
    ///
    /// # Errors
    /// Host-side failures (copying the descriptor, epoll); they end the
    /// connection.
    fn set_kick(&mut self, index: usize, kick: Option<&File>) -> io::Result<()>;
}

/// A new eventfd (non-blocking, close-on-exec) of the daemon's own.
///
/// # Errors
/// `eventfd(2)` failed.
fn own_eventfd() -> io::Result<File> {
    // SAFETY: eventfd(2) with an initial count of 0 and flags; the result
    // is checked.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Serves one frontend connection: pumps messages between `frontend` and
/// `backend` (the library's end) until either side closes, then shuts both.
/// With `kicks`, the data rings' kick eventfds go to it and the library
/// gets eventfds of the daemon's own (see the module documentation).
/// Every descriptor the frontend sent, and the last copy of `frontend`
/// itself, is closed through `closer` (see [`Closer`]).
/// Keeps copies of the rings' kick and call eventfds in `copies` for the
/// teardown, and sets `frontend_gone` (the backend's disconnect flag) as
/// soon as the frontend has closed or its messages have ended, so that the
/// queue workers stop serving the rings.
///
/// # Errors
/// Socket errors; a malformed message from the frontend (payload over
/// 4096 bytes) ends the connection with an error.
#[allow(clippy::too_many_arguments)]
pub fn run(
    frontend: UnixStream,
    backend: UnixStream,
    mut registry: SessionRegistry,
    config: ProxyConfig,
    copies: &mut EventFdCopies,
    kicks: Option<&mut dyn KickWatch>,
    frontend_gone: Arc<AtomicBool>,
    closer: &Closer,
) -> io::Result<()> {
    let frontend_w = Arc::new(Mutex::new(frontend.try_clone()?));
    let gone_r = frontend_gone.clone();
    let backend_r = backend.try_clone()?;
    let fw = frontend_w.clone();
    let front_shut = frontend.try_clone()?;
    let owed = Arc::new(Owed::default());
    let owed_r = owed.clone();
    let (relayed, relay_ended) = std::sync::mpsc::channel::<()>();
    let replies = thread::Builder::new().name("vuc-replies".into()).spawn(move || {
        relay_replies(&backend_r, &fw, &front_shut, &owed_r, &gone_r);
        owed_r.paid_all();
        // The library ended the connection, or the frontend is gone: end
        // both sides, so neither the library (blocked writing replies
        // nobody reads) nor the request pump (blocked writing to the
        // library) can stay stuck.
        let _ = front_shut.shutdown(Shutdown::Both);
        let _ = backend_r.shutdown(Shutdown::Both);
        let _ = relayed.send(());
    })?;

    let result = pump_requests(
        &frontend,
        &backend,
        &frontend_w,
        &owed,
        &mut registry,
        config,
        copies,
        kicks,
        closer,
    );
    // No more requests: the library answers what it has (a frontend that
    // only shut its sending side reads those replies; it has a second for
    // that), then closes, and the relay ends. A library that does not
    // finish within a second (its thread waits behind a blocked worker) is
    // cut off. The queue workers stop serving the rings now.
    frontend_gone.store(true, Ordering::Relaxed);
    let _ = backend.shutdown(Shutdown::Write);
    if relay_ended
        .recv_timeout(std::time::Duration::from_secs(1))
        .is_err()
    {
        let _ = backend.shutdown(Shutdown::Both);
        let _ = frontend.shutdown(Shutdown::Both);
    }
    let _ = replies.join();
    // The last copy of the frontend's socket is closed on the closer
    // thread: closing it releases the descriptors still queued on it
    // unread, which may be ones whose close blocks.
    closer.close(frontend.into());
    if let Ok(w) = Arc::try_unwrap(frontend_w) {
        closer.close(w.into_inner().unwrap_or_else(|e| e.into_inner()).into());
    }
    info!("frontend disconnected; {} sessions dropped", registry.len());
    result
}

/// Relays the library's replies from `library` to the frontend
/// (`frontend_w`), whole messages so that a CREATE reply can never land
/// inside one, until the library closes its end.
///
/// It also watches `frontend` for the frontend closing its socket
/// (`POLLHUP`, `POLLERR`; a frontend that only shuts its sending side still
/// gets its replies). From then on replies are read and dropped, and the
/// relay gives up once the request pump has taken none of the frontend's
/// unread bytes (`FIONREAD`) for a second: the pump is then blocked writing
/// to a library that stopped reading (its thread waits behind a blocked
/// worker, see [`EventFdCopies`]) and would never see the end of the
/// connection. While the pump still takes the frontend's last messages,
/// the relay lets it.
fn relay_replies(
    library: &UnixStream,
    frontend_w: &Mutex<UnixStream>,
    frontend: &UnixStream,
    owed: &Owed,
    frontend_gone: &AtomicBool,
) {
    // (When the frontend was seen gone, when its unread bytes last went
    // down, and how many there were then.)
    let mut gone: Option<(std::time::Instant, std::time::Instant, usize)> = None;
    let mut relaying = true;
    loop {
        let mut fds = [
            libc::pollfd {
                fd: library.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                // Once it is gone, POLLHUP would end every poll at once:
                // -1 leaves it out.
                fd: if gone.is_some() { -1 } else { frontend.as_raw_fd() },
                events: 0,
                revents: 0,
            },
        ];
        let timeout = if gone.is_some() { 20 } else { -1 };
        // SAFETY: poll(2) on an array of two pollfds of ours.
        if unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout) } < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        if gone.is_none() && fds[1].revents & (libc::POLLHUP | libc::POLLERR) != 0 {
            // The queue workers stop now, not when the last messages are
            // taken (the library's thread then gets the rings' locks
            // within a batch, and takes them quickly).
            frontend_gone.store(true, Ordering::Relaxed);
            let now = std::time::Instant::now();
            gone = Some((now, now, unread(frontend)));
            relaying = false;
        }
        if fds[0].revents != 0 {
            let Ok(Some(msg)) = recv_message(library, None) else {
                return;
            };
            if relaying {
                let w = frontend_w.lock().unwrap_or_else(|e| e.into_inner());
                // A frontend that takes no more replies gets none; the
                // pump sees the end of the connection.
                relaying = msg.send_to(&w).is_ok();
            }
            owed.paid();
        }
        if let Some((seen, since, last)) = &mut gone {
            let left = unread(frontend);
            if left < *last {
                (*since, *last) = (std::time::Instant::now(), left);
            } else if since.elapsed() >= std::time::Duration::from_secs(1) {
                return;
            }
            if seen.elapsed() >= GONE_LIMIT {
                return;
            }
        }
    }
}

/// How long, once the frontend has closed its socket, the request pump may
/// go on taking its last messages before the connection is cut.
const GONE_LIMIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Bytes waiting unread on `sock` (`FIONREAD`; 0 if that fails).
fn unread(sock: &UnixStream) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: ioctl(FIONREAD) writes one int, ours.
    let r = unsafe { libc::ioctl(sock.as_raw_fd(), libc::FIONREAD, &mut n) };
    if r < 0 {
        0
    } else {
        usize::try_from(n).unwrap_or(0)
    }
}

/// Replies the library still owes the frontend for forwarded messages.
/// A reply made here (CREATE) waits until they are relayed, so replies
/// reach the frontend in the order of its requests even when it sends
/// several before reading (QEMU does not, other frontends may).
#[derive(Default)]
struct Owed {
    count: Mutex<u64>,
    changed: Condvar,
}

impl Owed {
    fn owe(&self) {
        *self.count.lock().unwrap_or_else(|e| e.into_inner()) += 1;
    }

    fn paid(&self) {
        let mut c = self.count.lock().unwrap_or_else(|e| e.into_inner());
        *c = c.saturating_sub(1);
        self.changed.notify_all();
    }

    fn paid_all(&self) {
        *self.count.lock().unwrap_or_else(|e| e.into_inner()) = 0;
        self.changed.notify_all();
    }

    /// Waits until nothing is owed. A library that does not answer a
    /// message the way this layer expects only delays the reply (by at most
    /// a second), it cannot block it.
    fn wait_settled(&self) {
        let c = self.count.lock().unwrap_or_else(|e| e.into_inner());
        let (c, timeout) = self
            .changed
            .wait_timeout_while(c, std::time::Duration::from_secs(1), |c| *c > 0)
            .unwrap_or_else(|e| e.into_inner());
        if timeout.timed_out() {
            warn!(
                "{} replies still owed by the backend library; answering CREATE anyway",
                *c
            );
        }
    }
}

/// Whether the library answers a forwarded message (rust-vmm vhost 0.18
/// `backend_req_handler.rs`): GET_* and a few others always do; the rest
/// only with NEED_REPLY once REPLY_ACK is negotiated.
fn expects_reply(request: u32, flags: u32, reply_ack: bool) -> bool {
    const ALWAYS: [u32; 12] = [1, 6, 11, 15, 17, 24, 28, 31, 36, 40, 42, 43];
    ALWAYS.contains(&request) || (reply_ack && flags & VHOST_USER_NEED_REPLY_MASK != 0)
}

/// Whether REPLY_ACK is in force: the library's rule (see its use in
/// [`pump_requests`]).
fn reply_ack_on(features_offered: bool, acked_protocol: u64) -> bool {
    features_offered
        && crate::backend::FEATURES & PROTOCOL_FEATURES_BIT != 0
        && acked_protocol & VHOST_USER_PROTOCOL_F_REPLY_ACK != 0
}

/// The ack of a `NEED_REPLY` message under REPLY_ACK: the request's own
/// code, flags REPLY | version 1, a u64 payload (0 = success).
fn ack_message(request: u32, value: u64) -> [u8; VHOST_USER_HDR_SIZE + 8] {
    let mut m = [0u8; VHOST_USER_HDR_SIZE + 8];
    m[..VHOST_USER_HDR_SIZE].copy_from_slice(&encode_header(
        request,
        VHOST_USER_VERSION | VHOST_USER_REPLY_MASK,
        8,
    ));
    m[VHOST_USER_HDR_SIZE..].copy_from_slice(&value.to_le_bytes());
    m
}

#[allow(clippy::too_many_arguments)]
fn pump_requests(
    frontend: &UnixStream,
    backend: &UnixStream,
    frontend_w: &Mutex<UnixStream>,
    owed: &Owed,
    registry: &mut SessionRegistry,
    config: ProxyConfig,
    copies: &mut EventFdCopies,
    mut kicks: Option<&mut dyn KickWatch>,
    closer: &Closer,
) -> io::Result<()> {
    let mut acked_features: u64 = 0;
    let mut acked_protocol: u64 = 0;
    // Whether the library has answered GET_FEATURES: from then on it
    // counts our offered features (which always include
    // VHOST_USER_F_PROTOCOL_FEATURES) for REPLY_ACK, not the acked ones.
    let mut features_offered = false;
    let mut rings = vec![RingSetup::default(); config.num_queues];
    while let Some(mut msg) = recv_message(frontend, Some(closer))? {
        if closer.pending() > MAX_PENDING_CLOSES {
            // Closing this frontend's descriptors blocks (see `Fds`):
            // taking more would only pile them up open in the daemon.
            return Err(io::Error::other(format!(
                "{} of the frontend's descriptors wait to be closed (a close blocks)",
                closer.pending()
            )));
        }
        let (request, flags, _) = decode_header(&msg.hdr);
        match request {
            VHOST_USER_CREATE_CRYPTO_SESSION => {
                let reply = handle_create(registry, &msg.payload, config.abi);
                owed.wait_settled();
                let w = frontend_w.lock().unwrap_or_else(|e| e.into_inner());
                send_all(&w, &reply, &[])?;
            }
            VHOST_USER_CLOSE_CRYPTO_SESSION => {
                let closed = match decode_close(&msg.payload) {
                    Ok(id) => registry.close(id),
                    Err(e) => {
                        warn!("CLOSE_CRYPTO_SESSION ignored: {e}");
                        false
                    }
                };
                if flags & VHOST_USER_NEED_REPLY_MASK != 0 && reply_ack_on(features_offered, acked_protocol) {
                    owed.wait_settled();
                    let w = frontend_w.lock().unwrap_or_else(|e| e.into_inner());
                    send_all(&w, &ack_message(request, u64::from(!closed)), &[])?;
                }
            }
            _ => {
                debug!(
                    "forwarding request {request} (flags {flags:#x}, {} fds)",
                    msg.fds.len()
                );
                check_descriptor_count(request, &msg.payload, msg.fds.len())?;
                if !takes_descriptors(request) && !msg.fds.is_empty() {
                    // Only descriptors checked here reach the library,
                    // which would close the others on its own threads.
                    debug!(
                        "request {request} takes no descriptors: {} dropped",
                        msg.fds.len()
                    );
                    for f in std::mem::take(&mut msg.fds.files) {
                        closer.close(f.into());
                    }
                }
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
                if request == VHOST_USER_SET_VRING_BASE && msg.payload.len() == 8 {
                    // A split ring's index is 16 bits; the library would
                    // truncate a larger value silently.
                    let num = u32::from_le_bytes(msg.payload[4..8].try_into().unwrap_or_default());
                    if num > u32::from(u16::MAX) {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!("SET_VRING_BASE {num} does not fit a split ring's 16-bit index"),
                        ));
                    }
                }
                if request == VHOST_USER_SET_MEM_TABLE || request == VHOST_USER_ADD_MEM_REG {
                    check_memory_regions_bounded(
                        request,
                        &msg.payload,
                        &msg.fds,
                        config.require_sealed_memory,
                    )?;
                }
                if matches!(
                    request,
                    VHOST_USER_SET_VRING_KICK | VHOST_USER_SET_VRING_CALL | VHOST_USER_SET_VRING_ERR
                ) {
                    for file in msg.fds.iter() {
                        check_ring_eventfd(request, file)?;
                    }
                    // The data ring the message is for, if any.
                    let data_ring = msg
                        .payload
                        .get(..8)
                        .map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default()))
                        .map(|w| (w & VHOST_USER_VRING_IDX_MASK) as usize)
                        .filter(|&index| index < config.num_queues);
                    if let (Some(index), [file]) = (data_ring, &msg.fds[..]) {
                        copies.keep(request, index, file)?;
                    }
                    if let (VHOST_USER_SET_VRING_KICK, Some(index), Some(watch)) =
                        (request, data_ring, kicks.as_deref_mut())
                    {
                        if let Some(theirs) = msg.fds.files.first_mut() {
                            watch.set_kick(index, Some(theirs))?;
                            let theirs = std::mem::replace(theirs, own_eventfd()?);
                            closer.close(theirs.into());
                        } else {
                            // (VHOST_USER_VRING_NOFD_MASK: no eventfd.)
                            watch.set_kick(index, None)?;
                        }
                    }
                }
                if request == VHOST_USER_SET_FEATURES && msg.payload.len() == 8 {
                    acked_features = u64::from_le_bytes(msg.payload[..8].try_into().unwrap_or_default());
                }
                if request == VHOST_USER_RESET_OWNER {
                    // The library forgets the acked features too
                    // (vhost-user-backend 0.24 `reset_owner`), and refuses
                    // SET_VRING_ENABLE until they include
                    // PROTOCOL_FEATURES again: none is sent to it till then.
                    acked_features = 0;
                }
                if request == VHOST_USER_SET_PROTOCOL_FEATURES && msg.payload.len() == 8 {
                    acked_protocol = u64::from_le_bytes(msg.payload[..8].try_into().unwrap_or_default());
                    // The library takes any bits (vhost-user-backend 0.24
                    // `set_protocol_features`), and would then serve
                    // messages of features never offered (e.g. ADD_MEM_REG
                    // without a region limit under CONFIGURE_MEM_SLOTS).
                    let unoffered = acked_protocol & !crate::backend::PROTOCOL_FEATURES;
                    if unoffered != 0 {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!("SET_PROTOCOL_FEATURES acks {unoffered:#x}, which was not offered"),
                        ));
                    }
                }
                if request == VHOST_USER_GET_FEATURES {
                    features_offered = true;
                }
                // The library's rule (vhost 0.18 `update_reply_ack_flag`):
                // REPLY_ACK is on once the features it *offered* in its last
                // GET_FEATURES reply include PROTOCOL_FEATURES and the
                // frontend acked REPLY_ACK; SET_FEATURES does not matter.
                // (Using the acked features here missed the ack of a
                // NEED_REPLY message sent before SET_FEATURES, e.g.
                // SET_OWNER: its reply then settled the count of another
                // one and a CREATE reply could overtake that one's.)
                let reply_ack = reply_ack_on(features_offered, acked_protocol);
                if expects_reply(request, flags, reply_ack) {
                    owed.owe();
                }
                msg.send_to(backend)?;
                let protocol_features = acked_features & PROTOCOL_FEATURES_BIT != 0;
                match track_ring_setup(&mut rings, request, &msg.payload, protocol_features) {
                    Some(RingAction::Enable(index)) => {
                        debug!("enabling data ring {index} (frontend set it up)");
                        send_all(backend, &enable_message(index, true), &[])?;
                    }
                    Some(RingAction::Disable(index)) => {
                        debug!("disabling data ring {index} (frontend stopped it)");
                        send_all(backend, &enable_message(index, false), &[])?;
                    }
                    None => {}
                }
            }
        }
    }
    Ok(())
}

/// Whether the daemon takes descriptors with `request`: the memory table
/// and region, and the rings' eventfds. Other messages that carry
/// descriptors in the vhost-user spec (SET_LOG_BASE, SET_LOG_FD,
/// SET_BACKEND_REQ_FD, SET_INFLIGHT_FD, SET_DEVICE_STATE_FD, REM_MEM_REG)
/// belong to features the daemon does not offer.
fn takes_descriptors(request: u32) -> bool {
    matches!(
        request,
        VHOST_USER_SET_MEM_TABLE
            | VHOST_USER_ADD_MEM_REG
            | VHOST_USER_SET_VRING_KICK
            | VHOST_USER_SET_VRING_CALL
            | VHOST_USER_SET_VRING_ERR
    )
}

/// Checks how many descriptors a message that takes them carries: one per
/// region of a SET_MEM_TABLE (u32 count at the start of its payload), one
/// with ADD_MEM_REG, at most one with a ring's eventfd message. Each one
/// the library gets has been checked here, and it gets no others.
///
/// # Errors
/// `InvalidData` (the connection ends) for any other count.
fn check_descriptor_count(request: u32, payload: &[u8], fds: usize) -> io::Result<()> {
    let expected = match request {
        VHOST_USER_SET_MEM_TABLE => {
            let Some(n) = payload.get(..4) else {
                return Ok(()); // the memory check refuses it
            };
            let n = u32::from_le_bytes(n.try_into().unwrap_or_default()) as usize;
            n..=n
        }
        VHOST_USER_ADD_MEM_REG => 1..=1,
        VHOST_USER_SET_VRING_KICK | VHOST_USER_SET_VRING_CALL | VHOST_USER_SET_VRING_ERR => 0..=1,
        _ => return Ok(()),
    };
    if expected.contains(&fds) {
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidData,
        format!("request {request} carries {fds} descriptors, not {expected:?}"),
    ))
}

/// Memory checks ([`check_memory_regions_bounded`]) whose thread has not
/// returned, daemon-wide.
static MEMORY_CHECKS_RUNNING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Most memory checks that may be running at a time: past it, a memory
/// table is refused at once. (A check that does not return waits on a lock
/// the frontend holds, e.g. the inode lock, uninterruptibly: not even an
/// exit of the daemon could finish then; so the daemon goes on serving,
/// with at most this many threads and 4 × 32 descriptor copies held, and
/// refuses memory tables while they wait.)
const MAX_STUCK_MEMORY_CHECKS: usize = 4;

/// How long the checks of a memory table's files may take: they run on a
/// thread of their own ([`check_memory_regions_bounded`]).
const MEMORY_CHECK_LIMIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The argument that makes the daemon's binary run one memory check for
/// its parent ([`memory_check_helper_main`]); not for users.
pub const MEMORY_CHECK_HELPER_ARG: &str = "--internal-memory-check";

/// The binary [`check_memory_regions_bounded`] runs the checks in, when
/// set ([`use_memory_check_helper`]).
static MEMORY_CHECK_HELPER: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

/// Helper processes whose check did not finish in time (killed, to be
/// reaped), daemon-wide.
static STUCK_HELPERS: Mutex<Vec<std::process::Child>> = Mutex::new(Vec::new());

/// Makes the memory table checks (`check_memory_regions_bounded`) run in a process of
/// their own, `exe` started with [`MEMORY_CHECK_HELPER_ARG`] (the daemon
/// passes `/proc/self/exe`). A check that waits uninterruptibly on a lock
/// the frontend holds then keeps only that process waiting, with copies of
/// the region descriptors and nothing else of the daemon's: the daemon can
/// still exit. Without it (the library's tests), the checks run on a
/// thread of the daemon's own.
pub fn use_memory_check_helper(exe: std::path::PathBuf) {
    let _ = MEMORY_CHECK_HELPER.set(exe);
}

/// The helper process's side of [`use_memory_check_helper`]: `args` are
/// the request code, `1` or `0` for `--require-sealed-memory`, and the
/// number N of region descriptors, which it has as descriptors 3 to
/// 2 + N; the payload comes on standard input. Writes a line `W <text>`
/// per warning, then `OK`, or `ERR <text>`, to standard output. Returns
/// the exit status.
pub fn memory_check_helper_main(args: &[String]) -> i32 {
    let (Some(request), Some(sealed), Some(n)) = (
        args.first().and_then(|a| a.parse::<u32>().ok()),
        args.get(1),
        args.get(2)
            .and_then(|a| a.parse::<usize>().ok())
            .filter(|&n| n <= MAX_ATTACHED_FDS),
    ) else {
        return 2;
    };
    let mut payload = Vec::new();
    if io::stdin()
        .take(VHOST_USER_MAX_PAYLOAD as u64)
        .read_to_end(&mut payload)
        .is_err()
    {
        return 2;
    }
    // SAFETY: the parent passed exactly these N descriptors, 3 to 2 + N
    // (`check_in_helper`), and nothing else owns them here.
    let files: Vec<File> = (0..n)
        .map(|i| unsafe { File::from_raw_fd(3 + i as RawFd) })
        .collect();
    let out = match check_memory_regions(request, &payload, &files, sealed == "1") {
        Ok(warnings) => {
            let mut o: String = warnings
                .iter()
                .map(|w| format!("W {}\n", w.replace('\n', " ")))
                .collect();
            o.push_str("OK\n");
            o
        }
        Err(e) => format!("ERR {}\n", e.to_string().replace('\n', " ")),
    };
    if io::stdout().write_all(out.as_bytes()).is_err() {
        return 1;
    }
    0
}

/// Why [`check_in_helper`] gave no answer.
enum HelperError {
    /// The helper process could not be started (the caller checks on a
    /// thread instead).
    Spawn(io::Error),
    /// The check refused the table, or did not finish in time.
    Check(io::Error),
}

impl From<io::Error> for HelperError {
    fn from(e: io::Error) -> Self {
        HelperError::Check(e)
    }
}

/// [`check_memory_regions_bounded`] in a helper process (see
/// [`use_memory_check_helper`]).
fn check_in_helper(
    exe: &std::path::Path,
    request: u32,
    payload: &[u8],
    fds: &[File],
    require_sealed: bool,
) -> Result<Vec<String>, HelperError> {
    use std::os::unix::process::CommandExt;
    {
        let mut stuck = STUCK_HELPERS.lock().unwrap_or_else(|e| e.into_inner());
        stuck.retain_mut(|c| matches!(c.try_wait(), Ok(None)));
        if stuck.len() >= MAX_STUCK_MEMORY_CHECKS {
            return Err(HelperError::Check(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!("{MAX_STUCK_MEMORY_CHECKS} earlier memory tables' checks are still blocked"),
            )));
        }
    }
    let n = fds.len().min(MAX_ATTACHED_FDS);
    let mut raw = [-1 as RawFd; MAX_ATTACHED_FDS];
    for (r, f) in raw.iter_mut().zip(fds) {
        *r = f.as_raw_fd();
    }
    let mut cmd = std::process::Command::new(exe);
    cmd.arg(MEMORY_CHECK_HELPER_ARG)
        .arg(request.to_string())
        .arg(if require_sealed { "1" } else { "0" })
        .arg(n.to_string())
        .env("RUST_LOG", "off")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    // SAFETY: the closure runs in the forked child before exec and makes
    // only async-signal-safe system calls (fcntl, dup2, close_range) on
    // plain integers; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            let first = 3 + n as RawFd;
            let mut high = [-1 as RawFd; MAX_ATTACHED_FDS];
            // Copies above the target range first, so that placing them
            // at 3.. cannot overwrite one not yet placed.
            for i in 0..n {
                high[i] = libc::fcntl(raw[i], libc::F_DUPFD_CLOEXEC, first);
                if high[i] < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            for (i, &h) in high.iter().enumerate().take(n) {
                if libc::dup2(h, 3 + i as RawFd) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            // Nothing else of the daemon's goes along: close-on-exec for
            // all the rest (CLOSE_RANGE_CLOEXEC, Linux 5.11; closing them
            // here would also close the pipe on which the standard library
            // reports a failed exec).
            const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
            libc::syscall(
                libc::SYS_close_range,
                first as libc::c_uint,
                libc::c_uint::MAX,
                CLOSE_RANGE_CLOEXEC,
            );
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(HelperError::Spawn)?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(payload);
    }
    let Some(mut stdout) = child.stdout.take() else {
        reap_or_keep(child);
        return Err(io::Error::other("memory check helper without output").into());
    };
    if let Err(e) = set_nonblocking(stdout.as_raw_fd()) {
        let _ = child.kill();
        reap_or_keep(child);
        return Err(e.into());
    }
    let deadline = std::time::Instant::now() + MEMORY_CHECK_LIMIT;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    // Until the answer's last line, not until EOF: after its answer the
    // helper closes the region files (when `memory_check_helper_main`
    // returns, its stdout still open), and closing one can wait on the
    // frontend (a FUSE file's FLUSH).
    let answered = |out: &[u8]| {
        out.ends_with(b"\n")
            && out[..out.len() - 1]
                .rsplit(|&b| b == b'\n')
                .next()
                .is_some_and(|last| last == b"OK" || last.starts_with(b"ERR "))
    };
    loop {
        match stdout.read(&mut buf) {
            Ok(0) => break,
            Ok(k) => {
                out.extend_from_slice(&buf[..k]);
                if answered(&out) {
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    // It waits on something of the frontend's: killed
                    // (it dies once that lets it go), reaped later.
                    let _ = child.kill();
                    reap_or_keep(child);
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("checking the memory regions' files took more than {MEMORY_CHECK_LIMIT:?}"),
                    )
                    .into());
                }
                let mut p = libc::pollfd {
                    fd: stdout.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: poll(2) on one pollfd of ours.
                unsafe {
                    libc::poll(
                        &mut p,
                        1,
                        i32::try_from(left.as_millis()).unwrap_or(i32::MAX).max(1),
                    )
                };
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                reap_or_keep(child);
                return Err(e.into());
            }
        }
    }
    reap_or_keep(child);
    let text = String::from_utf8_lossy(&out);
    let mut warnings = Vec::new();
    for line in text.lines() {
        if let Some(w) = line.strip_prefix("W ") {
            warnings.push(w.to_string());
        } else if line == "OK" {
            return Ok(warnings);
        } else if let Some(e) = line.strip_prefix("ERR ") {
            return Err(io::Error::new(io::ErrorKind::InvalidData, e.to_string()).into());
        }
    }
    Err(io::Error::other("the memory check helper gave no result").into())
}

/// Reaps a helper process that has exited, or exits within 100 ms (after
/// its answer it only closes its descriptors); one that does not is kept
/// in `STUCK_HELPERS`, to be reaped later and counted until then.
fn reap_or_keep(mut child: std::process::Child) {
    let until = std::time::Instant::now() + std::time::Duration::from_millis(100);
    loop {
        match child.try_wait() {
            Ok(Some(_)) | Err(_) => return,
            Ok(None) if std::time::Instant::now() >= until => break,
            Ok(None) => thread::sleep(std::time::Duration::from_millis(1)),
        }
    }
    STUCK_HELPERS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(child);
}

/// [`check_memory_regions`] in a helper process ([`use_memory_check_helper`];
/// else directly), started from a thread of its own, for at most
/// [`MEMORY_CHECK_LIMIT`]; its warnings are logged. The frontend can make
/// the checks' system calls on its files wait as long as it likes
/// (`F_ADD_SEALS` takes the file's inode lock, which a write of the
/// frontend's own can hold while it waits in a page fault it never
/// resolves; `fstat` of a FUSE file asks the FUSE server; the helper's exec
/// closes copies of a FUSE file, which waits for the server): then the
/// region is refused, a helper process is killed (it dies once the
/// frontend lets it), and the thread is left to finish whenever the
/// frontend lets it (holding copies of the descriptors until then).
/// While [`MAX_STUCK_MEMORY_CHECKS`] such checks wait, tables are refused
/// at once.
///
/// # Errors
/// As [`check_memory_regions`]; `TimedOut` past the limit; `WouldBlock`
/// while too many earlier checks wait; `dup` failing.
fn check_memory_regions_bounded(
    request: u32,
    payload: &[u8],
    fds: &[File],
    require_sealed: bool,
) -> io::Result<()> {
    // Checks that have not returned hold their thread and copies of up to
    // 32 descriptors each: at most MAX_STUCK_MEMORY_CHECKS at a time.
    if MEMORY_CHECKS_RUNNING.fetch_add(1, Ordering::Relaxed) >= MAX_STUCK_MEMORY_CHECKS {
        MEMORY_CHECKS_RUNNING.fetch_sub(1, Ordering::Relaxed);
        return Err(io::Error::new(
            io::ErrorKind::WouldBlock,
            format!("{MAX_STUCK_MEMORY_CHECKS} earlier memory tables' checks are still blocked"),
        ));
    }
    let done = || MEMORY_CHECKS_RUNNING.fetch_sub(1, Ordering::Relaxed);
    let copies = match fds.iter().map(File::try_clone).collect::<io::Result<Vec<File>>>() {
        Ok(c) => c,
        Err(e) => {
            done();
            return Err(e);
        }
    };
    let payload = payload.to_vec();
    let (tx, rx) = std::sync::mpsc::channel();
    // Even the helper's start runs on this thread: its exec closes the
    // child's close-on-exec copies of the region files, and closing a FUSE
    // file waits for the frontend's server (FLUSH).
    let spawned = thread::Builder::new().name("vuc-memcheck".into()).spawn(move || {
        let r = match MEMORY_CHECK_HELPER.get() {
            Some(exe) => match check_in_helper(exe, request, &payload, &copies, require_sealed) {
                Err(HelperError::Spawn(e)) => {
                    warn!("cannot start the memory check helper ({e}); checking on this thread");
                    check_memory_regions(request, &payload, &copies, require_sealed)
                }
                Err(HelperError::Check(e)) => Err(e),
                Ok(w) => Ok(w),
            },
            None => check_memory_regions(request, &payload, &copies, require_sealed),
        };
        drop(copies);
        done();
        let _ = tx.send(r);
    });
    if let Err(e) = spawned {
        // (The closure, with the copies, was dropped.)
        done();
        return Err(e);
    }
    match rx.recv_timeout(MEMORY_CHECK_LIMIT) {
        Ok(r) => {
            for w in r? {
                warn!("{w}");
            }
            Ok(())
        }
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("checking the memory regions' files took more than {MEMORY_CHECK_LIMIT:?}"),
        )),
    }
}

/// Seals each region's file of a SET_MEM_TABLE / ADD_MEM_REG against
/// shrinking where it can ([`seal_against_shrinking`]), then checks that the
/// region fits in the file. A region declared larger than its file, or a
/// file truncated later, would make the first access past the end raise
/// SIGBUS in the daemon. A file that cannot be sealed is refused with
/// `require_sealed`, and accepted with a warning otherwise. The payload is
/// `VhostUserMemory` (u32 count, u32 padding, then 32-byte regions: guest
/// address, size, frontend address, mmap offset), or for ADD_MEM_REG an u64
/// padding and one region (vhost-user spec, "Memory regions description").
fn check_memory_regions(
    request: u32,
    payload: &[u8],
    fds: &[File],
    require_sealed: bool,
) -> io::Result<Vec<String>> {
    let mut warnings = Vec::new();
    let bad = |m: String| Err(io::Error::new(io::ErrorKind::InvalidData, m));
    let regions = if request == VHOST_USER_SET_MEM_TABLE {
        payload.get(8..)
    } else {
        payload.get(8..40)
    };
    let Some(regions) = regions else {
        return bad("memory table too short".into());
    };
    if regions.len() / 32 < fds.len() {
        // Every descriptor is checked below, or none is forwarded.
        return bad(format!(
            "{} descriptors for {} memory regions",
            fds.len(),
            regions.len() / 32
        ));
    }
    for (i, r) in regions.chunks_exact(32).enumerate() {
        let word = |o: usize| u64::from_le_bytes(r[o..o + 8].try_into().unwrap_or_default());
        let (size, offset) = (word(8), word(24));
        let Some(file) = fds.get(i) else {
            // The library refuses a region without a descriptor itself.
            continue;
        };
        match seal_against_shrinking(file) {
            ShrinkSeal::Present | ShrinkSeal::Added => {}
            ShrinkSeal::Impossible(why) if require_sealed => {
                return bad(format!(
                    "memory region {i}: its file cannot be sealed against shrinking ({why}), \
                     and --require-sealed-memory is set"
                ));
            }
            ShrinkSeal::Impossible(why) => warnings.push(format!(
                "memory region {i}: its file cannot be sealed against shrinking ({why}); \
                 if the frontend truncates it, the daemon dies of SIGBUS (--require-sealed-memory \
                 refuses such regions)"
            )),
        }
        let meta = file.metadata()?;
        if !meta.file_type().is_file() {
            return bad(format!("memory region {i}: its descriptor is not a regular file"));
        }
        let file_len = meta.len();
        if offset.checked_add(size).is_none_or(|end| end > file_len) {
            return bad(format!(
                "memory region {i}: {size} bytes at offset {offset} do not fit its {file_len}-byte file"
            ));
        }
        reserve_huge_pages(file, offset, size)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("memory region {i}: {e}")))?;
    }
    Ok(warnings)
}

/// `HUGETLBFS_MAGIC` (statfs(2)).
const HUGETLBFS_MAGIC: i64 = 0x9584_58f6;

/// For a region in a hugetlbfs file, makes sure huge pages are reserved
/// for all of it, so that the daemon's accesses cannot fault on a page
/// that no huge page backs. The library maps regions with
/// `MAP_NORESERVE` (vm-memory `MmapRegion::from_file`), and hugetlbfs does
/// not overcommit: without a reservation, the first access to a page the
/// pool cannot supply raises SIGBUS. A shared mapping without
/// `MAP_NORESERVE` reserves the range's pages on the file for good (they
/// stay reserved after `munmap`; Documentation/mm/hugetlbfs_reserv.rst),
/// or fails with `ENOMEM` when the pool has too few. QEMU's own mapping
/// of hugetlbfs guest memory reserves them the same way, so its pages are
/// reserved already, except with `reserve=off` (QEMU ≥ 6.1, `MAP_NORESERVE`
/// on its side too): then the daemon reserves the region's pages itself,
/// and refuses the region if the pool cannot hold them all. The mapping's
/// length is the region's rounded up to the file's huge page size
/// (`f_bsize`): `munmap` of an unaligned length fails on hugetlbfs.
/// Other files: nothing to do.
///
/// # Errors
/// `fstatfs` failed, or the range cannot be reserved (the error says why).
fn reserve_huge_pages(file: &File, offset: u64, size: u64) -> io::Result<()> {
    // SAFETY: an all-zero statfs is a valid value of this plain C struct.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs(2) on a descriptor `file` owns, writing into `st`.
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) } < 0 {
        return Err(io::Error::last_os_error());
    }
    #[allow(clippy::unnecessary_cast)] // f_type's type differs between targets
    if st.f_type as i64 != HUGETLBFS_MAGIC || size == 0 {
        return Ok(());
    }
    let page = u64::try_from(st.f_bsize).unwrap_or(0).max(4096);
    let (Some(len), Ok(off)) = (
        size.checked_next_multiple_of(page)
            .and_then(|l| usize::try_from(l).ok()),
        libc::off_t::try_from(offset),
    ) else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "region too large"));
    };
    // SAFETY: a new shared read-only mapping of the frontend's file, at an
    // address the kernel picks; nothing reads it, and it is unmapped below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            off,
        )
    };
    if p == libc::MAP_FAILED {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("cannot reserve huge pages for its {size} bytes of hugetlbfs memory ({e})"),
        ));
    }
    // SAFETY: the mapping made just above, of `len` bytes, used by nothing.
    if unsafe { libc::munmap(p, len) } < 0 {
        // (Cannot happen with a whole number of huge pages; the mapping
        // would stay, holding the file and its reservation.)
        warn!(
            "munmap of a hugetlbfs reservation mapping: {}",
            io::Error::last_os_error()
        );
    }
    Ok(())
}

/// Whether a guest memory file is protected against shrinking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShrinkSeal {
    /// `F_SEAL_SHRINK` was set already (QEMU's `memory-backend-memfd` with
    /// its default `seal=on` sets `F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL`).
    Present,
    /// It was not, and [`seal_against_shrinking`] added it.
    Added,
    /// The file cannot get it: not a memfd (a `/dev/shm` or hugetlbfs file
    /// of `memory-backend-file`, anything else), or a memfd made without
    /// `MFD_ALLOW_SEALING` (`memory-backend-memfd` with `seal=off`). Why,
    /// for the log.
    Impossible(String),
}

/// Makes sure `file` has `F_SEAL_SHRINK`, adding it if the file allows
/// (memfd_create(2), "File sealing" in fcntl(2)): a sealed file can no
/// longer be made smaller by anyone, so memory mapped from it cannot turn
/// into SIGBUS under the daemon. The seal stays on the frontend's file for
/// good (seals cannot be removed); growing it and punching holes are still
/// allowed, and a frontend has no reason to shrink guest memory it shares.
pub fn seal_against_shrinking(file: &File) -> ShrinkSeal {
    let fd = file.as_raw_fd();
    // SAFETY: fcntl(F_GET_SEALS) on a descriptor `file` owns; it takes no
    // argument and touches no memory of ours.
    let seals = unsafe { libc::fcntl(fd, libc::F_GET_SEALS) };
    if seals < 0 {
        let e = io::Error::last_os_error();
        return ShrinkSeal::Impossible(format!("no file seals on it: F_GET_SEALS: {e}"));
    }
    if seals & libc::F_SEAL_SHRINK != 0 {
        return ShrinkSeal::Present;
    }
    if seals & libc::F_SEAL_SEAL != 0 {
        return ShrinkSeal::Impossible(
            "F_SEAL_SEAL is set without F_SEAL_SHRINK (a memfd made without MFD_ALLOW_SEALING, \
             or a tmpfs or hugetlbfs file)"
                .into(),
        );
    }
    // SAFETY: fcntl(F_ADD_SEALS) with an int argument on a descriptor `file`
    // owns; it touches no memory of ours.
    if unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) } < 0 {
        let e = io::Error::last_os_error();
        return ShrinkSeal::Impossible(format!("F_ADD_SEALS(F_SEAL_SHRINK): {e}"));
    }
    ShrinkSeal::Added
}

/// Checks a descriptor of `SET_VRING_KICK`, `SET_VRING_CALL` or
/// `SET_VRING_ERR` (`request`) and sets `O_NONBLOCK` on it.
///
/// vhost-user-backend 0.24 reads 8 bytes from a ring's kick descriptor
/// whenever its epoll (level-triggered) reports it readable, while it
/// holds the ring's lock (`event_loop.rs` `handle_event`, `vring.rs`
/// `read_kick`), and the worker writes 8 bytes to the call descriptor
/// after each batch. The vhost-user spec says these are eventfds; the
/// library does not check. So:
/// * anything else (a pipe, a socket, a file) is refused: a pipe holding
///   fewer than 8 bytes would block the worker in `read` for good, holding
///   the ring's lock (GET_VRING_BASE never answered) and, once the
///   frontend is gone, keeping the daemon from serving anyone else;
/// * an eventfd in semaphore mode (`EFD_SEMAPHORE`, shown as
///   `eventfd-semaphore: 1` in `/proc/self/fdinfo` on recent kernels,
///   e.g. 6.18) is refused: each read takes 1 off its counter, so one write of 2^32
///   keeps the worker waking up, a whole CPU, as long as the connection
///   lasts. (On older kernels, which do not show the mode, it cannot be
///   told apart and is accepted.)
/// * the others get `O_NONBLOCK`, so that neither the library's read of a
///   kick descriptor nor the worker's write of a call descriptor can
///   block: a call eventfd whose counter the frontend filled up makes the
///   write fail with `EAGAIN` instead (counted, see
///   [`crate::backend::CryptoBackend::signal_failures`]). The flag is on
///   the open file, shared with the frontend; QEMU opens its eventfds
///   with `EFD_NONBLOCK` anyway (`event_notifier_init`). A frontend can
///   clear it again; then a worker can block after all, and the daemon
///   lets it go on when the connection ends ([`EventFdCopies`]).
///
/// What a descriptor is comes from `/proc/self/fd/N`
/// (`anon_inode:[eventfd]`); without `/proc` nothing is accepted.
///
/// # Errors
/// `InvalidData` (the caller ends the connection) for a refused
/// descriptor, with the reason; the `fcntl` error if setting the flag
/// failed.
pub fn check_ring_eventfd(request: u32, file: &File) -> io::Result<()> {
    let fd = file.as_raw_fd();
    let what = match request {
        VHOST_USER_SET_VRING_KICK => "SET_VRING_KICK",
        VHOST_USER_SET_VRING_CALL => "SET_VRING_CALL",
        _ => "SET_VRING_ERR",
    };
    let bad = |m: String| Err(io::Error::new(io::ErrorKind::InvalidData, format!("{what}: {m}")));
    match std::fs::read_link(format!("/proc/self/fd/{fd}")) {
        Ok(target) if target.as_os_str() == "anon_inode:[eventfd]" => {}
        Ok(target) => return bad(format!("the descriptor is {}, not an eventfd", target.display())),
        Err(e) => return bad(format!("cannot tell what the descriptor is (/proc/self/fd: {e})")),
    }
    if fdinfo_field(file, "eventfd-semaphore").is_some_and(|v| v != "0") {
        return bad("the eventfd is in semaphore mode (EFD_SEMAPHORE)".into());
    }
    set_nonblocking(fd)
}

/// The value of field `key` of `/proc/self/fdinfo/N` for `file` (e.g.
/// `eventfd-id`, `eventfd-semaphore`), trimmed; `None` when the file or
/// the field is not there.
fn fdinfo_field(file: &File, key: &str) -> Option<String> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", file.as_raw_fd())).ok()?;
    info.lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim() == key)
        .map(|(_, v)| v.trim().to_string())
}

/// Checks that [`check_ring_eventfd`] works here, on an eventfd of its
/// own, so that a daemon that cannot tell eventfds apart (no `/proc`)
/// fails at start-up instead of refusing every frontend.
///
/// # Errors
/// Creating the eventfd failed, or the check refused it (the error says
/// why, e.g. `/proc/self/fd` missing).
pub fn probe_eventfd_check() -> io::Result<()> {
    let file = own_eventfd()?;
    check_ring_eventfd(VHOST_USER_SET_VRING_KICK, &file).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("{e} (the daemon needs /proc mounted to tell eventfds from other descriptors)"),
        )
    })
}

/// Most eventfd copies [`EventFdCopies`] keeps per ring and kind (kick,
/// call); past it the oldest is let go.
pub const EVENTFD_COPIES_PER_RING: usize = 16;

/// Copies (`dup`s) of the kick and call eventfds the frontend gave each
/// data ring, kept for tearing the connection down: the latest ones, and
/// the ones they replaced, one per eventfd (told apart by the
/// `eventfd-id` of `/proc/self/fdinfo`; QEMU switches a ring's call
/// between two eventfds as the guest masks and unmasks its interrupt), at
/// most [`EVENTFD_COPIES_PER_RING`] of each kind per ring.
///
/// [`check_ring_eventfd`] makes those eventfds non-blocking, but the flag
/// lives on the open file, which the frontend shares and can clear again.
/// A worker can then be blocked for good in the call write (the frontend
/// filled the counter) or, where the kernel's eventfds refuse
/// `RWF_NOWAIT` (see [`read_eventfd_nowait`]), in its read of the
/// frontend's kick eventfd (the frontend read the counter first, or gave
/// two rings one kick eventfd), and the daemon, which joins the workers
/// when the connection ends, would wait for it forever.
/// [`EventFdCopies::wake_workers`] lets such a worker go on, also when the
/// frontend has since given the ring another eventfd (the library applies
/// that only once the worker lets go of the ring).
#[derive(Debug, Default)]
pub struct EventFdCopies {
    kick: Vec<Vec<(Option<u64>, File)>>,
    call: Vec<Vec<(Option<u64>, File)>>,
}

/// The `eventfd-id` of an eventfd (`/proc/self/fdinfo`), if shown.
fn eventfd_id(file: &File) -> Option<u64> {
    fdinfo_field(file, "eventfd-id")?.parse().ok()
}

impl EventFdCopies {
    /// Keeps a copy of `file`, the eventfd of `SET_VRING_KICK` or
    /// `SET_VRING_CALL` (`request`; others are ignored) for ring `index`,
    /// as the latest (a copy of the same eventfd kept before is let go).
    ///
    /// # Errors
    /// `dup` failed.
    fn keep(&mut self, request: u32, index: usize, file: &File) -> io::Result<()> {
        let rings = match request {
            VHOST_USER_SET_VRING_KICK => &mut self.kick,
            VHOST_USER_SET_VRING_CALL => &mut self.call,
            _ => return Ok(()),
        };
        if rings.len() <= index {
            rings.resize_with(index + 1, Vec::new);
        }
        let copies = &mut rings[index];
        let id = eventfd_id(file);
        if id.is_some() {
            copies.retain(|(other, _)| *other != id);
        }
        if copies.len() == EVENTFD_COPIES_PER_RING {
            copies.remove(0);
        }
        copies.push((id, file.try_clone()?));
        Ok(())
    }

    /// How many copies are kept (all rings, both kinds).
    pub fn len(&self) -> usize {
        self.kick.iter().chain(&self.call).map(Vec::len).sum()
    }

    /// Whether no copy is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Wakes a worker blocked on one of the eventfds: empties each call
    /// eventfd without waiting, so a worker blocked writing it goes on, and
    /// adds 1 to each kick eventfd that is empty, so a worker blocked
    /// reading it goes on. The call eventfd is read with `preadv2` and
    /// `RWF_NOWAIT`, which does not depend on `O_NONBLOCK`; where the
    /// kernel does not support that for eventfds (`EOPNOTSUPP`), the copy
    /// sets `O_NONBLOCK` again and reads. The kick eventfd is written after
    /// setting `O_NONBLOCK` again. Meant for the end of a connection, when
    /// the workers no longer serve the rings; call it on a thread of its
    /// own: a frontend that clears `O_NONBLOCK` and fills a kick eventfd
    /// between those steps would block the write until a worker reads it.
    pub fn wake_workers(&self) {
        for (_, call) in self.call.iter().flatten() {
            let fd = call.as_raw_fd();
            if let Err(e) = read_eventfd_nowait(fd) {
                if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
                    let _ = set_nonblocking(fd);
                    let _ = (&*call).read(&mut [0u8; 8]);
                }
            }
        }
        for (_, kick) in self.kick.iter().flatten() {
            let mut p = libc::pollfd {
                fd: kick.as_raw_fd(),
                events: libc::POLLIN | libc::POLLOUT,
                revents: 0,
            };
            // SAFETY: poll(2) on one pollfd of ours, without waiting.
            let ready = unsafe { libc::poll(&mut p, 1, 0) };
            if ready == 1 && p.revents & libc::POLLIN == 0 && p.revents & libc::POLLOUT != 0 {
                let _ = set_nonblocking(kick.as_raw_fd());
                let _ = (&*kick).write(&1u64.to_ne_bytes());
            }
        }
    }
}

/// Takes an eventfd's counter (eventfd(2): an 8-byte read returns it and
/// sets it to 0) without ever waiting, whatever the open file's
/// `O_NONBLOCK`, which the frontend shares and can clear: `preadv2(2)` at
/// the current position with `RWF_NOWAIT`, which an eventfd whose counter
/// is 0 answers with `EAGAIN`.
///
/// # Errors
/// The `preadv2` error: `EAGAIN` when the counter is 0; `EOPNOTSUPP` where
/// the kernel's eventfds do not take `RWF_NOWAIT` (kernels older than the
/// eventfd `read_iter` conversion).
pub fn read_eventfd_nowait(fd: RawFd) -> io::Result<u64> {
    let mut buf = [0u8; 8];
    let iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: preadv2 into one 8-byte buffer of ours, at the current
    // position (-1); RWF_NOWAIT: EAGAIN instead of waiting when the counter
    // is 0.
    let r = unsafe { libc::preadv2(fd, &iov, 1, -1, libc::RWF_NOWAIT) };
    match r {
        8 => Ok(u64::from_ne_bytes(buf)),
        r if r < 0 => Err(io::Error::last_os_error()),
        _ => Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
    }
}

/// Sets `O_NONBLOCK` on `fd`'s open file, if it is not set already.
///
/// # Errors
/// The `fcntl` error.
fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl(F_GETFL) on a descriptor the caller owns; it takes no
    // argument and touches no memory of ours.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    if flags & libc::O_NONBLOCK != 0 {
        return Ok(());
    }
    // SAFETY: fcntl(F_SETFL) with an int argument on a descriptor the
    // caller owns; it touches no memory of ours.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// What the frontend has set up for one data ring since it was last stopped.
#[derive(Debug, Clone, Copy, Default)]
struct RingSetup {
    kick: bool,
    call: bool,
    enabled: bool,
    /// The frontend has sent `SET_VRING_ENABLE` for this ring on this
    /// connection (kept when the ring is stopped): it enables and disables
    /// the ring itself.
    frontend_enables: bool,
}

/// A `SET_VRING_ENABLE` this layer sends the library for a data ring whose
/// frontend does not send its own (QEMU's cryptodev-vhost-user does not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RingAction {
    /// The ring has both its kick and its call eventfd: serve it.
    Enable(u32),
    /// The frontend stopped the ring (GET_VRING_BASE) that this layer
    /// enabled.
    Disable(u32),
}

/// Updates `rings` for a forwarded message (`protocol_features`: the
/// frontend acked `VHOST_USER_F_PROTOCOL_FEATURES`, without which the
/// library enables rings itself) and says what to send the library after
/// it:
///
/// * Enable a ring once it has both its kick and its call eventfd (QEMU
///   sends KICK before CALL, and its kick eventfd may already be
///   signalled): a request done before the call fd is set would complete
///   without an interrupt, and the guest would wait for it forever.
/// * Disable it again when the frontend stops it. vhost-user-backend 0.24's
///   `get_vring_base` clears the ring's ready flag and eventfds but keeps
///   it enabled, so without this a restart (QEMU: `stop` then `cont`,
///   which sends NUM, BASE, ADDR, KICK, then CALL) would be served from
///   its KICK on, before its new call eventfd is set.
fn track_ring_setup(
    rings: &mut [RingSetup],
    request: u32,
    payload: &[u8],
    protocol_features: bool,
) -> Option<RingAction> {
    let word = u64::from_le_bytes(payload.get(..8)?.try_into().ok()?);
    let index = match request {
        VHOST_USER_SET_VRING_KICK | VHOST_USER_SET_VRING_CALL => (word & VHOST_USER_VRING_IDX_MASK) as usize,
        // vhost_vring_state: index u32, num u32.
        VHOST_USER_GET_VRING_BASE | VHOST_USER_SET_VRING_ENABLE => (word & 0xffff_ffff) as usize,
        _ => return None,
    };
    let ring = rings.get_mut(index)?;
    // (index < rings.len(), the number of queues: it fits in u32.)
    let index = index as u32;
    let has_fd = word & VHOST_USER_VRING_NOFD_MASK == 0;
    match request {
        VHOST_USER_SET_VRING_KICK => ring.kick = has_fd,
        VHOST_USER_SET_VRING_CALL => ring.call = has_fd,
        // The library stops the ring and drops both fds.
        VHOST_USER_GET_VRING_BASE => {
            // (Without PROTOCOL_FEATURES acked now, the library refuses
            // SET_VRING_ENABLE, ending the connection; it then enables
            // every ring itself anyway.)
            let enabled_here = ring.enabled && !ring.frontend_enables && protocol_features;
            *ring = RingSetup {
                frontend_enables: ring.frontend_enables,
                ..RingSetup::default()
            };
            return enabled_here.then_some(RingAction::Disable(index));
        }
        _ => {
            ring.enabled = word >> 32 != 0;
            ring.frontend_enables = true;
            return None;
        }
    }
    if ring.kick && ring.call && !ring.enabled && !ring.frontend_enables && protocol_features {
        ring.enabled = true;
        return Some(RingAction::Enable(index));
    }
    None
}

/// `SET_VRING_ENABLE(index, enable)`, flags = version 1 (no NEED_REPLY).
fn enable_message(index: u32, enable: bool) -> [u8; VHOST_USER_HDR_SIZE + 8] {
    let mut m = [0u8; VHOST_USER_HDR_SIZE + 8];
    m[..VHOST_USER_HDR_SIZE].copy_from_slice(&encode_header(
        VHOST_USER_SET_VRING_ENABLE,
        VHOST_USER_VERSION,
        8,
    ));
    m[12..16].copy_from_slice(&index.to_le_bytes());
    m[16..20].copy_from_slice(&u32::from(enable).to_le_bytes());
    m
}

/// Decodes a CREATE payload, runs it through the registry and builds the
/// reply message (zeroized when dropped, see [`create_reply`]). Never
/// fails: a payload that matches no layout, or not the forced one, gets a
/// negative session id in a reply of the same size.
///
/// The stack below the caller is wiped before returning
/// ([`crate::sessions::wipe_stack`]): decoding the payload and expanding
/// the keys leave copies of them there.
pub fn handle_create(registry: &mut SessionRegistry, payload: &[u8], abi: AbiChoice) -> Zeroizing<Vec<u8>> {
    let reply = create_session(registry, payload, abi);
    crate::sessions::wipe_stack::<{ crate::sessions::CREATE_STACK_WIPE_BYTES }>();
    reply
}

/// [`handle_create`] without the stack wipe, out of line so that all of
/// its key handling runs in frames below the wiping one.
#[inline(never)]
fn create_session(registry: &mut SessionRegistry, payload: &[u8], abi: AbiChoice) -> Zeroizing<Vec<u8>> {
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
    // The id goes where the frontend that sent this size reads it: at 1064
    // in a 1072-byte payload, at 0 otherwise (also when a forced layout
    // does not match the size).
    create_reply(payload, SessionAbi::detect(payload), id)
}

#[cfg(test)]
mod tests {
    //! The layer's framing over real socket pairs: a fake frontend on one
    //! side, a fake library on the other. Messages are laid out by hand from
    //! the vhost-user spec (header: request, flags, size; u64 payloads).
    use super::*;
    use crate::sessions::session_set;
    use std::os::fd::AsRawFd;
    use std::time::Duration;

    fn msg(request: u32, flags: u32, payload: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&request.to_le_bytes());
        m.extend_from_slice(&flags.to_le_bytes());
        m.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        m.extend_from_slice(payload);
        m
    }

    /// Reads one message and its fds, or None if nothing comes within 200 ms.
    fn read_msg(s: &UnixStream) -> Option<(u32, u32, Vec<u8>, usize)> {
        s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        let mut hdr = [0u8; 12];
        let (n, fds) = recv_some(s, &mut hdr).ok()?;
        if n == 0 {
            return None;
        }
        if n < 12 {
            (&*s).read_exact(&mut hdr[n..]).ok()?;
        }
        let (req, flags, size) = decode_header(&hdr);
        let mut p = vec![0u8; size as usize];
        (&*s).read_exact(&mut p).ok()?;
        Some((req, flags, p, fds.len()))
    }

    struct Rig {
        front: UnixStream,
        lib: UnixStream,
        thread: Option<thread::JoinHandle<io::Result<()>>>,
    }

    fn rig(abi: AbiChoice) -> Rig {
        let (front, front_peer) = UnixStream::pair().unwrap();
        let (lib, lib_peer) = UnixStream::pair().unwrap();
        let (registry, _tables) = session_set(8, 1);
        let config = ProxyConfig {
            abi,
            num_queues: 1,
            require_sealed_memory: false,
        };
        let thread = Some(thread::spawn(move || {
            run(
                front_peer,
                lib_peer,
                registry,
                config,
                &mut EventFdCopies::default(),
                None,
                Arc::default(),
                &Closer::start().unwrap(),
            )
        }));
        Rig { front, lib, thread }
    }

    impl Drop for Rig {
        fn drop(&mut self) {
            let _ = self.front.shutdown(Shutdown::Both);
            let _ = self.lib.shutdown(Shutdown::Both);
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
    }

    /// A frontend that sends SET_VRING_ENABLE itself manages the ring:
    /// a ring it disabled is not enabled again behind its back when it
    /// sends a new call fd (QEMU does on every guest-notifier change), nor
    /// when it sets the ring up again after stopping it.
    #[test]
    fn a_ring_the_frontend_disabled_stays_disabled() {
        let r = rig(AbiChoice::Auto);
        let efd = vmm_sys_util::eventfd::EventFd::new(0).unwrap();
        let send = |req: u32, payload: &[u8], fd: bool| {
            let fds = if fd { vec![efd.as_raw_fd()] } else { vec![] };
            r.front.send_with_fds(&[&msg(req, 1, payload)[..]], &fds).unwrap();
        };
        send(2, &(1u64 << 30).to_le_bytes(), false);
        assert_eq!(read_msg(&r.lib).map(|m| m.0), Some(2));
        for req in [12u32, 13] {
            send(req, &0u64.to_le_bytes(), true);
            assert_eq!(read_msg(&r.lib).map(|m| m.0), Some(req));
        }
        assert_eq!(read_msg(&r.lib).map(|m| m.0), Some(18), "enabled once set up");
        // SET_VRING_ENABLE(0, 0): forwarded as is.
        send(18, &[0; 8], false);
        assert_eq!(read_msg(&r.lib), Some((18, 1, vec![0; 8], 0)));
        // A new call fd: forwarded, nothing injected.
        send(13, &0u64.to_le_bytes(), true);
        assert_eq!(read_msg(&r.lib).map(|m| m.0), Some(13));
        assert_eq!(
            read_msg(&r.lib),
            None,
            "ring enabled again against SET_VRING_ENABLE(0, 0)"
        );
        // Stopped and set up again: still the frontend's to enable.
        send(11, &[0; 8], false);
        assert_eq!(read_msg(&r.lib).map(|m| m.0), Some(11));
        for req in [12u32, 13] {
            send(req, &0u64.to_le_bytes(), true);
            assert_eq!(read_msg(&r.lib).map(|m| m.0), Some(req));
        }
        assert_eq!(read_msg(&r.lib), None, "ring enabled again after a restart");
        // Its own SET_VRING_ENABLE(0, 1) is forwarded.
        send(18, &[0, 0, 0, 0, 1, 0, 0, 0], false);
        assert_eq!(read_msg(&r.lib), Some((18, 1, vec![0, 0, 0, 0, 1, 0, 0, 0], 0)));
        assert_eq!(read_msg(&r.lib), None);
    }

    #[test]
    fn forwards_with_fds_and_enables_a_ring_once_kick_and_call_are_set() {
        let r = rig(AbiChoice::Auto);
        let efd = vmm_sys_util::eventfd::EventFd::new(0).unwrap();
        // SET_FEATURES(bit 30) is forwarded unchanged.
        r.front
            .send_with_fds(&[&msg(2, 1, &(1u64 << 30).to_le_bytes())[..]], &[])
            .unwrap();
        assert_eq!(
            read_msg(&r.lib),
            Some((2, 1, (1u64 << 30).to_le_bytes().to_vec(), 0))
        );
        // SET_VRING_KICK(0) with its fd: forwarded with the fd, no enable yet.
        r.front
            .send_with_fds(&[&msg(12, 1, &0u64.to_le_bytes())[..]], &[efd.as_raw_fd()])
            .unwrap();
        assert_eq!(read_msg(&r.lib), Some((12, 1, 0u64.to_le_bytes().to_vec(), 1)));
        assert_eq!(read_msg(&r.lib), None, "enabled before the call fd was set");
        // SET_VRING_CALL(0) with its fd: forwarded, then SET_VRING_ENABLE(0, 1).
        r.front
            .send_with_fds(&[&msg(13, 1, &0u64.to_le_bytes())[..]], &[efd.as_raw_fd()])
            .unwrap();
        assert_eq!(read_msg(&r.lib), Some((13, 1, 0u64.to_le_bytes().to_vec(), 1)));
        assert_eq!(read_msg(&r.lib), Some((18, 1, vec![0, 0, 0, 0, 1, 0, 0, 0], 0)));
        // A second CALL does not enable again.
        r.front
            .send_with_fds(&[&msg(13, 1, &0u64.to_le_bytes())[..]], &[efd.as_raw_fd()])
            .unwrap();
        assert_eq!(read_msg(&r.lib).map(|m| m.0), Some(13));
        assert_eq!(read_msg(&r.lib), None);
        // GET_VRING_BASE stops the ring, and the ring is disabled again
        // (SET_VRING_ENABLE(0, 0)): the library would keep it enabled.
        r.front.send_with_fds(&[&msg(11, 1, &[0; 8])[..]], &[]).unwrap();
        assert_eq!(read_msg(&r.lib).map(|m| m.0), Some(11));
        assert_eq!(read_msg(&r.lib), Some((18, 1, vec![0, 0, 0, 0, 0, 0, 0, 0], 0)));
        // Set up again: KICK alone does not enable it, KICK and CALL do.
        r.front
            .send_with_fds(&[&msg(12, 1, &0u64.to_le_bytes())[..]], &[efd.as_raw_fd()])
            .unwrap();
        assert_eq!(read_msg(&r.lib).map(|m| (m.0, m.3)), Some((12, 1)));
        assert_eq!(read_msg(&r.lib), None, "enabled again before the call fd was set");
        r.front
            .send_with_fds(&[&msg(13, 1, &0u64.to_le_bytes())[..]], &[efd.as_raw_fd()])
            .unwrap();
        assert_eq!(read_msg(&r.lib).map(|m| (m.0, m.3)), Some((13, 1)));
        assert_eq!(read_msg(&r.lib), Some((18, 1, vec![0, 0, 0, 0, 1, 0, 0, 0], 0)));
        // Stopped again, then set up with KICK only and stopped before it
        // was enabled: the second stop has nothing to disable.
        r.front.send_with_fds(&[&msg(11, 1, &[0; 8])[..]], &[]).unwrap();
        assert_eq!(read_msg(&r.lib).map(|m| m.0), Some(11));
        assert_eq!(read_msg(&r.lib), Some((18, 1, vec![0; 8], 0)));
        r.front
            .send_with_fds(&[&msg(12, 1, &0u64.to_le_bytes())[..]], &[efd.as_raw_fd()])
            .unwrap();
        assert_eq!(read_msg(&r.lib).map(|m| m.0), Some(12));
        r.front.send_with_fds(&[&msg(11, 1, &[0; 8])[..]], &[]).unwrap();
        assert_eq!(read_msg(&r.lib).map(|m| m.0), Some(11));
        assert_eq!(
            read_msg(&r.lib),
            None,
            "a ring this layer did not enable was disabled"
        );
        // A ring index past the queues is forwarded and never enabled.
        r.front
            .send_with_fds(&[&msg(12, 1, &5u64.to_le_bytes())[..]], &[efd.as_raw_fd()])
            .unwrap();
        r.front
            .send_with_fds(&[&msg(13, 1, &5u64.to_le_bytes())[..]], &[efd.as_raw_fd()])
            .unwrap();
        assert_eq!(read_msg(&r.lib).map(|m| m.0), Some(12));
        assert_eq!(read_msg(&r.lib).map(|m| m.0), Some(13));
        assert_eq!(read_msg(&r.lib), None);
        // Library replies reach the frontend unchanged.
        r.lib
            .send_with_fds(&[&msg(1, 5, &0x4000_0000u64.to_le_bytes())[..]], &[])
            .unwrap();
        assert_eq!(
            read_msg(&r.front),
            Some((1, 5, 0x4000_0000u64.to_le_bytes().to_vec(), 0))
        );
    }

    /// A ring this layer enabled is not disabled at GET_VRING_BASE once the
    /// frontend has taken PROTOCOL_FEATURES back (SET_FEATURES without it,
    /// or RESET_OWNER): the library would refuse the SET_VRING_ENABLE and
    /// end the connection.
    #[test]
    fn no_disable_once_protocol_features_are_taken_back() {
        for (req, payload) in [(2u32, 0u64.to_le_bytes().to_vec()), (4, vec![])] {
            let r = rig(AbiChoice::Auto);
            let efd = vmm_sys_util::eventfd::EventFd::new(0).unwrap();
            r.front
                .send_with_fds(&[&msg(2, 1, &(1u64 << 30).to_le_bytes())[..]], &[])
                .unwrap();
            assert_eq!(read_msg(&r.lib).map(|m| m.0), Some(2));
            for q in [12u32, 13] {
                r.front
                    .send_with_fds(&[&msg(q, 1, &0u64.to_le_bytes())[..]], &[efd.as_raw_fd()])
                    .unwrap();
                assert_eq!(read_msg(&r.lib).map(|m| m.0), Some(q));
            }
            assert_eq!(read_msg(&r.lib), Some((18, 1, vec![0, 0, 0, 0, 1, 0, 0, 0], 0)));
            r.front.send_with_fds(&[&msg(req, 1, &payload)[..]], &[]).unwrap();
            assert_eq!(read_msg(&r.lib).map(|m| m.0), Some(req));
            r.front.send_with_fds(&[&msg(11, 1, &[0; 8])[..]], &[]).unwrap();
            assert_eq!(read_msg(&r.lib).map(|m| m.0), Some(11));
            assert_eq!(read_msg(&r.lib), None, "disabled after request {req}");
        }
    }

    #[test]
    fn no_enable_without_protocol_features() {
        let r = rig(AbiChoice::Auto);
        let efd = vmm_sys_util::eventfd::EventFd::new(0).unwrap();
        // SET_FEATURES without bit 30: the library enables rings itself.
        r.front
            .send_with_fds(&[&msg(2, 1, &(1u64 << 32).to_le_bytes())[..]], &[])
            .unwrap();
        for req in [2u32, 12, 13] {
            if req != 2 {
                r.front
                    .send_with_fds(&[&msg(req, 1, &0u64.to_le_bytes())[..]], &[efd.as_raw_fd()])
                    .unwrap();
            }
            assert_eq!(read_msg(&r.lib).map(|m| m.0), Some(req));
        }
        assert_eq!(read_msg(&r.lib), None);
    }

    #[test]
    fn create_is_answered_here_and_close_never() {
        let r = rig(AbiChoice::Auto);
        // Layout B (QEMU 7.2), AES-128-CBC encrypt: cipher_alg @8, key_len @12,
        // op_type @32, direction @33, key @56.
        let mut p = vec![0u8; 632];
        p[8] = 3;
        p[12] = 16;
        p[32] = 1;
        p[33] = 1;
        p[56..72].copy_from_slice(&[0x2b; 16]);
        r.front.send_with_fds(&[&msg(26, 1, &p)[..]], &[]).unwrap();
        let (req, flags, reply, _) = read_msg(&r.front).unwrap();
        assert_eq!((req, flags, reply.len()), (26, 5, 632));
        assert_eq!(&reply[0..8], &1i64.to_le_bytes());
        assert!(reply[56..72].iter().all(|&b| b == 0), "key echoed back");
        // CLOSE (known and unknown ids): no reply, nothing forwarded.
        for id in [1u64, 77] {
            r.front
                .send_with_fds(&[&msg(27, 1, &id.to_le_bytes())[..]], &[])
                .unwrap();
        }
        assert_eq!(read_msg(&r.front), None);
        assert_eq!(read_msg(&r.lib), None);
        // Layout C (1072 bytes) with an unknown cipher: negative id at 1064.
        let mut p = vec![0u8; 1072];
        p[0] = 2;
        p[8] = 4;
        p[12] = 16;
        p[32] = 1;
        p[33] = 1;
        r.front.send_with_fds(&[&msg(26, 1, &p)[..]], &[]).unwrap();
        let (_, _, reply, _) = read_msg(&r.front).unwrap();
        assert_eq!(&reply[1064..1072], &(-3i64).to_le_bytes());
    }

    /// GET_FEATURES (forwarded, answered by the library with our
    /// features) and SET_PROTOCOL_FEATURES(CRYPTO_SESSION | REPLY_ACK)
    /// (forwarded, no reply): REPLY_ACK is then in force.
    fn negotiate_reply_ack(r: &Rig) {
        r.front.send_with_fds(&[&msg(1, 1, &[])[..]], &[]).unwrap();
        assert_eq!(read_msg(&r.lib).map(|m| m.0), Some(1));
        r.lib
            .send_with_fds(&[&msg(1, 5, &crate::backend::FEATURES.to_le_bytes())[..]], &[])
            .unwrap();
        assert_eq!(read_msg(&r.front).map(|m| m.0), Some(1));
        let pf: u64 = (1 << 7) | VHOST_USER_PROTOCOL_F_REPLY_ACK;
        r.front
            .send_with_fds(&[&msg(16, 1, &pf.to_le_bytes())[..]], &[])
            .unwrap();
        assert_eq!(read_msg(&r.lib).map(|m| m.0), Some(16));
    }

    /// A 632-byte CREATE payload that detection reads as layout B
    /// (`SessionAbi::detect`): cipher_alg 3 (AES-CBC) at 8, key_len 16 at
    /// 12, op_type 1 (CIPHER) at 32, direction 1 (encrypt) at 33, a key of
    /// zeroes; its reply carries the id at offset 0.
    fn layout_b_create() -> Vec<u8> {
        let mut create = vec![0u8; 632];
        create[8] = 3;
        create[12] = 16;
        create[32] = 1;
        create[33] = 1;
        create
    }

    /// A NEED_REPLY message sent after SET_PROTOCOL_FEATURES(REPLY_ACK) but
    /// before SET_FEATURES (SET_OWNER here) is acked by the library; a
    /// CREATE right behind it must wait for that ack, however late the
    /// library sends it.
    #[test]
    fn create_waits_for_the_ack_of_a_need_reply_before_set_features() {
        let r = rig(AbiChoice::Auto);
        let ack = |req: u32| msg(req, 5, &0u64.to_le_bytes());
        negotiate_reply_ack(&r);
        // SET_OWNER with NEED_REPLY, then at once a CREATE.
        let create = layout_b_create();
        r.front
            .send_with_fds(
                &[&[msg(3, 1 | VHOST_USER_NEED_REPLY_MASK, &[]), msg(26, 1, &create)].concat()[..]],
                &[],
            )
            .unwrap();
        assert_eq!(read_msg(&r.lib).map(|m| m.0), Some(3));
        // The library is slow to ack: nothing may reach the frontend before.
        thread::sleep(Duration::from_millis(100));
        r.lib.send_with_fds(&[&ack(3)[..]], &[]).unwrap();
        assert_eq!(read_msg(&r.front).map(|m| m.0), Some(3), "SET_OWNER's ack first");
        assert_eq!(read_msg(&r.front).map(|m| m.0), Some(26), "then CREATE's reply");
    }

    /// CLOSE is answered with an ack only when the frontend negotiated
    /// REPLY_ACK and sets NEED_REPLY on it: 0 for a session it closed, 1
    /// for an unknown id; without the flag there is no reply.
    #[test]
    fn close_with_need_reply_gets_an_ack_under_reply_ack() {
        let r = rig(AbiChoice::Auto);
        // Before REPLY_ACK is negotiated, NEED_REPLY on CLOSE gets nothing.
        r.front
            .send_with_fds(
                &[&msg(27, 1 | VHOST_USER_NEED_REPLY_MASK, &9u64.to_le_bytes())[..]],
                &[],
            )
            .unwrap();
        assert_eq!(read_msg(&r.front), None, "a reply without REPLY_ACK");
        negotiate_reply_ack(&r);
        // A session to close.
        r.front
            .send_with_fds(&[&msg(26, 1, &layout_b_create())[..]], &[])
            .unwrap();
        let (_, _, reply, _) = read_msg(&r.front).unwrap();
        assert_eq!(&reply[..8], &1i64.to_le_bytes());
        let close = |id: u64, flags: u32| {
            r.front
                .send_with_fds(&[&msg(27, flags, &id.to_le_bytes())[..]], &[])
                .unwrap();
            read_msg(&r.front)
        };
        let ack = |v: u64| Some((27, 5, v.to_le_bytes().to_vec(), 0));
        assert_eq!(close(1, 1 | VHOST_USER_NEED_REPLY_MASK), ack(0), "closed");
        assert_eq!(close(1, 1 | VHOST_USER_NEED_REPLY_MASK), ack(1), "already closed");
        assert_eq!(close(7, 1), None, "no NEED_REPLY, no reply");
        assert_eq!(read_msg(&r.lib), None, "CLOSE is never forwarded");
    }

    #[test]
    fn forced_layout_of_the_wrong_size_answers_where_the_frontend_reads() {
        let r = rig(AbiChoice::Fixed(SessionAbi::B));
        let p = vec![0u8; 1072];
        r.front.send_with_fds(&[&msg(26, 1, &p)[..]], &[]).unwrap();
        let (_, _, reply, _) = read_msg(&r.front).unwrap();
        assert_eq!(reply.len(), 1072);
        assert_eq!(&reply[1064..1072], &(-1i64).to_le_bytes());
    }

    /// SET_MEM_TABLE payload with one region of `size` bytes at file `offset`.
    fn table(size: u64, offset: u64) -> Vec<u8> {
        let mut p = vec![1, 0, 0, 0, 0, 0, 0, 0];
        for w in [0u64, size, 0x7f00_0000_0000, offset] {
            p.extend_from_slice(&w.to_le_bytes());
        }
        p
    }

    /// A memfd of `len` bytes made with `flags` (besides MFD_CLOEXEC).
    fn memfd(flags: libc::c_uint, len: u64) -> File {
        // SAFETY: a valid NUL-terminated name; the result is checked.
        let fd = unsafe { libc::memfd_create(c"proxy-test".as_ptr(), libc::MFD_CLOEXEC | flags) };
        assert!(fd >= 0, "memfd_create: {}", io::Error::last_os_error());
        // SAFETY: a fresh descriptor we own.
        let f = unsafe { File::from_raw_fd(fd) };
        f.set_len(len).unwrap();
        f
    }

    fn seals(f: &File) -> i32 {
        // SAFETY: F_GET_SEALS on a descriptor we own.
        unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GET_SEALS) }
    }

    #[test]
    fn only_checked_descriptors_reach_the_library() {
        let one = table(4096, 0);
        // SET_MEM_TABLE: one descriptor per region, by its count field.
        assert!(check_descriptor_count(VHOST_USER_SET_MEM_TABLE, &one, 1).is_ok());
        for n in [0, 2, 33] {
            let e = check_descriptor_count(VHOST_USER_SET_MEM_TABLE, &one, n).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{n} fds");
        }
        // A count of 2 with one region in the payload: the second
        // descriptor would go unchecked.
        let mut two = one.clone();
        two[0] = 2;
        let files = [memfd(0, 4096), memfd(0, 4096)];
        assert!(check_descriptor_count(VHOST_USER_SET_MEM_TABLE, &two, 2).is_ok());
        let e = check_memory_regions(VHOST_USER_SET_MEM_TABLE, &two, &files, false).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(check_descriptor_count(VHOST_USER_ADD_MEM_REG, &[], 1).is_ok());
        assert!(check_descriptor_count(VHOST_USER_ADD_MEM_REG, &[], 2).is_err());
        for r in [
            VHOST_USER_SET_VRING_KICK,
            VHOST_USER_SET_VRING_CALL,
            VHOST_USER_SET_VRING_ERR,
        ] {
            assert!(check_descriptor_count(r, &[], 0).is_ok());
            assert!(check_descriptor_count(r, &[], 1).is_ok());
            assert!(check_descriptor_count(r, &[], 2).is_err(), "{r}");
            assert!(takes_descriptors(r));
        }
        // Messages of features the daemon does not offer: their
        // descriptors are not forwarded (SET_LOG_BASE, SET_LOG_FD,
        // SET_BACKEND_REQ_FD, SET_INFLIGHT_FD, SET_DEVICE_STATE_FD).
        for r in [
            6,
            7,
            21,
            32,
            42,
            VHOST_USER_GET_FEATURES,
            VHOST_USER_CREATE_CRYPTO_SESSION,
        ] {
            assert!(!takes_descriptors(r), "{r}");
        }
        // A memory region's descriptor must be a regular file.
        let (a, _b) = UnixStream::pair().unwrap();
        let sock = [File::from(OwnedFd::from(a))];
        let e = check_memory_regions(VHOST_USER_SET_MEM_TABLE, &table(0, 0), &sock, false).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }

    #[test]
    fn memory_checks_fall_back_to_a_thread_when_the_helper_cannot_start() {
        // (Process-wide: other tests' tables then fall back the same way.)
        use_memory_check_helper("/nonexistent/vuc-memory-check".into());
        let f = [memfd(libc::MFD_ALLOW_SEALING, 1 << 20)];
        let check = |p: &[u8]| check_memory_regions_bounded(VHOST_USER_SET_MEM_TABLE, p, &f, false);
        check(&table(1 << 20, 0)).unwrap();
        assert_eq!(seals(&f[0]) & libc::F_SEAL_SHRINK, libc::F_SEAL_SHRINK);
        let e = check(&table(2 << 20, 0)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    }

    #[test]
    fn memory_regions_must_fit_their_files() {
        let f = tempfile::tempfile().unwrap();
        f.set_len(1 << 20).unwrap();
        let fds = [f];
        for require in [false, true] {
            let sealable = [memfd(libc::MFD_ALLOW_SEALING, 1 << 20)];
            let check = |p: &[u8]| check_memory_regions(VHOST_USER_SET_MEM_TABLE, p, &sealable, require);
            assert!(check(&table(1 << 20, 0)).is_ok());
            assert!(check(&table(4096, (1 << 20) - 4096)).is_ok());
            for (size, offset) in [(2 << 20, 0), (4096, 1 << 20), (u64::MAX, 4096)] {
                let e = check(&table(size, offset)).unwrap_err();
                assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{size} at {offset}");
            }
        }
        // A plain file fits too, and is accepted while sealing is not required.
        assert!(check_memory_regions(VHOST_USER_SET_MEM_TABLE, &table(1 << 20, 0), &fds, false).is_ok());
        // ADD_MEM_REG: u64 padding then one region.
        let mut add = vec![0u8; 8];
        add.extend_from_slice(&table(2 << 20, 0)[8..]);
        assert!(check_memory_regions(VHOST_USER_ADD_MEM_REG, &add, &fds, false).is_err());
    }

    #[test]
    fn sealable_memfds_get_f_seal_shrink() {
        let f = memfd(libc::MFD_ALLOW_SEALING, 1 << 20);
        assert_eq!(seals(&f), 0, "a fresh MFD_ALLOW_SEALING memfd has no seals");
        assert!(check_memory_regions(VHOST_USER_SET_MEM_TABLE, &table(1 << 20, 0), &[f], true).is_ok());
        let f = memfd(libc::MFD_ALLOW_SEALING, 1 << 20);
        assert_eq!(seal_against_shrinking(&f), ShrinkSeal::Added);
        assert_eq!(seals(&f), libc::F_SEAL_SHRINK);
        // Shrinking now fails for everyone (fcntl(2): EPERM); growing does not.
        let e = f.set_len(4096).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPERM));
        f.set_len(2 << 20).unwrap();
        assert_eq!(f.metadata().unwrap().len(), 2 << 20);
        assert_eq!(seal_against_shrinking(&f), ShrinkSeal::Present);
        // QEMU's memory-backend-memfd (seal=on): GROW | SHRINK | SEAL.
        let q = memfd(libc::MFD_ALLOW_SEALING, 1 << 20);
        let qemu = libc::F_SEAL_GROW | libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL;
        // SAFETY: F_ADD_SEALS with an int on a descriptor we own.
        assert_eq!(unsafe { libc::fcntl(q.as_raw_fd(), libc::F_ADD_SEALS, qemu) }, 0);
        assert_eq!(seal_against_shrinking(&q), ShrinkSeal::Present);
        assert_eq!(seals(&q), qemu);
    }

    #[test]
    fn unsealable_files_are_accepted_unless_sealing_is_required() {
        let plain = tempfile::tempfile().unwrap();
        plain.set_len(1 << 20).unwrap();
        // A memfd without MFD_ALLOW_SEALING (QEMU's memory-backend-memfd with
        // seal=off, util/memfd.c) carries F_SEAL_SEAL from birth.
        let no_sealing = memfd(0, 1 << 20);
        assert_eq!(seals(&no_sealing), libc::F_SEAL_SEAL);
        for f in [plain, no_sealing] {
            assert!(
                matches!(seal_against_shrinking(&f), ShrinkSeal::Impossible(_)),
                "{f:?}"
            );
            let fds = [f];
            assert!(check_memory_regions(VHOST_USER_SET_MEM_TABLE, &table(1 << 20, 0), &fds, false).is_ok());
            let e =
                check_memory_regions(VHOST_USER_SET_MEM_TABLE, &table(1 << 20, 0), &fds, true).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData);
            assert!(e.to_string().contains("cannot be sealed"), "{e}");
            // Nothing was sealed, and the frontend can still resize its file.
            fds[0].set_len(4096).unwrap();
        }
        // Neither is a file of another kind.
        let efd = vmm_sys_util::eventfd::EventFd::new(0).unwrap();
        // SAFETY: dup of a live descriptor; the copy is owned by the File.
        let dup = unsafe { File::from_raw_fd(libc::dup(efd.as_raw_fd())) };
        assert!(matches!(seal_against_shrinking(&dup), ShrinkSeal::Impossible(_)));
    }

    #[test]
    fn oversized_or_impossible_values_end_the_connection() {
        for bad in [
            msg(1, 1, &vec![0u8; 4097]),
            msg(8, 1, &[0, 0, 0, 0, 3, 0, 0, 0]),
            msg(10, 1, &[0, 0, 0, 0, 1, 0, 1, 0]),
        ] {
            let mut r = rig(AbiChoice::Auto);
            r.front.send_with_fds(&[&bad[..]], &[]).unwrap();
            let result = r.thread.take().unwrap().join().unwrap();
            assert_eq!(result.unwrap_err().kind(), io::ErrorKind::InvalidData);
        }
    }

    fn eventfd(flags: i32) -> File {
        // SAFETY: eventfd(2) with a count and flags; the result is checked.
        let fd = unsafe { libc::eventfd(0, flags) };
        assert!(fd >= 0, "eventfd: {}", io::Error::last_os_error());
        // SAFETY: a fresh descriptor we own.
        unsafe { File::from_raw_fd(fd) }
    }

    /// An eventfd's counter (`eventfd-count`, hexadecimal in fdinfo).
    fn count(f: &File) -> u64 {
        u64::from_str_radix(&fdinfo_field(f, "eventfd-count").unwrap(), 16).unwrap()
    }

    /// One copy per eventfd and ring (QEMU's two alternating call eventfds
    /// stay two copies), at most EVENTFD_COPIES_PER_RING per ring and kind.
    #[test]
    fn eventfd_copies_are_one_per_eventfd_and_bounded() {
        let mut c = EventFdCopies::default();
        let (a, b) = (eventfd(0), eventfd(0));
        for _ in 0..10 {
            c.keep(VHOST_USER_SET_VRING_CALL, 0, &a).unwrap();
            c.keep(VHOST_USER_SET_VRING_CALL, 0, &b).unwrap();
        }
        assert_eq!(c.len(), 2);
        c.keep(VHOST_USER_SET_VRING_KICK, 0, &a).unwrap();
        c.keep(VHOST_USER_SET_VRING_CALL, 3, &a).unwrap();
        c.keep(VHOST_USER_SET_VRING_ERR, 0, &a).unwrap();
        assert_eq!(c.len(), 4);
        let many: Vec<File> = (0..2 * EVENTFD_COPIES_PER_RING).map(|_| eventfd(0)).collect();
        for f in &many {
            c.keep(VHOST_USER_SET_VRING_KICK, 1, f).unwrap();
        }
        assert_eq!(c.len(), 4 + EVENTFD_COPIES_PER_RING);
    }

    /// wake_workers empties a full call eventfd and adds 1 to an empty kick
    /// eventfd, whether or not the frontend's copy is non-blocking, and
    /// leaves a kick that already holds a count alone.
    #[test]
    fn wake_workers_empties_calls_and_kicks_empty_kicks() {
        let mut c = EventFdCopies::default();
        let (call, kick, busy_kick) = (eventfd(0), eventfd(0), eventfd(libc::EFD_NONBLOCK));
        (&call).write_all(&(u64::MAX - 1).to_ne_bytes()).unwrap();
        (&busy_kick).write_all(&5u64.to_ne_bytes()).unwrap();
        c.keep(VHOST_USER_SET_VRING_CALL, 0, &call).unwrap();
        c.keep(VHOST_USER_SET_VRING_KICK, 0, &kick).unwrap();
        c.keep(VHOST_USER_SET_VRING_KICK, 1, &busy_kick).unwrap();
        c.wake_workers();
        assert_eq!((count(&call), count(&kick), count(&busy_kick)), (0, 1, 5));
    }

    /// read_eventfd_nowait takes the whole counter of a blocking eventfd
    /// (no `O_NONBLOCK`, as a frontend can leave the kick eventfd it
    /// shares) and answers `EAGAIN` at once when it is 0, where read(2)
    /// would wait for the next write (eventfd(2)). The reads run on a
    /// thread of their own, so a read that waits fails the test instead
    /// of hanging it.
    #[test]
    fn read_eventfd_nowait_never_waits() {
        let f = eventfd(0);
        (&f).write_all(&5u64.to_ne_bytes()).unwrap();
        let fd = f.as_raw_fd();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let first = read_eventfd_nowait(fd).map_err(|e| e.raw_os_error());
            let second = read_eventfd_nowait(fd).map_err(|e| e.raw_os_error());
            let _ = tx.send((first, second));
        });
        let got = rx.recv_timeout(std::time::Duration::from_secs(5));
        // Let a thread that waits go before `f` closes.
        (&f).write_all(&1u64.to_ne_bytes()).unwrap();
        assert_eq!(got, Ok((Ok(5), Err(Some(libc::EAGAIN)))));
        assert_eq!(count(&f), 1);
    }
}
