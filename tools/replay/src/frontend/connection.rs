// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The vhost-user connection: the QEMU-like (or DPDK 22.11) handshake,
//! memory and ring set-up, CREATE/CLOSE_CRYPTO_SESSION on a clone of the
//! socket, and the bound on every answer the frontend waits for.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};

use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VringConfigData};
use vhost_user_crypto::wire::session::{
    close_request, create_request, reply_session_id, SessionAbi, SymSessionInfo,
};
use vhost_user_crypto::wire::vhost_user::{FrontendReq, Header, HDR_SIZE, MAX_PAYLOAD, REPLY, VERSION_1};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::queue::RING_AREA_ALIGN;
use super::{DriverQueue, Error, FrontendConfig, CONTROL_TIMEOUT};
use crate::driver_ring::SplitRing;
use crate::guest_mem::GuestMem;

/// `VHOST_USER_F_PROTOCOL_FEATURES` (QEMU `docs/interop/vhost-user.rst`).
const F_PROTOCOL_FEATURES: u64 = VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
/// `VIRTIO_F_VERSION_1` (VIRTIO 1.2 §6).
const F_VERSION_1: u64 = 1 << virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
/// `VIRTIO_F_INDIRECT_DESC` (VIRTIO 1.2 §6).
const F_INDIRECT_DESC: u64 = 1 << virtio_bindings::virtio_ring::VIRTIO_RING_F_INDIRECT_DESC;
/// `VIRTIO_F_EVENT_IDX` (VIRTIO 1.2 §6).
const F_EVENT_IDX: u64 = 1 << virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;

/// A connected frontend.
pub struct CryptoFrontend {
    frontend: Frontend,
    sock: UnixStream,
    /// Set before this tool shuts the socket down itself (a backend that
    /// did not answer in time), so that the queues' waits do not take the
    /// end of the connection for the backend's doing.
    shut_here: Arc<AtomicBool>,
    abi: SessionAbi,
    /// Guest memory.
    pub mem: Arc<GuestMem>,
    /// Data queues.
    pub queues: Vec<DriverQueue>,
    /// DPDK mode: the session ids the backend holds (created, not closed).
    dpdk_live: Option<std::collections::HashSet<u64>>,
}

impl CryptoFrontend {
    /// Connects to `path` and sets everything up.
    ///
    /// # Errors
    /// Connection or negotiation failures.
    pub fn connect(path: &Path, cfg: &FrontendConfig) -> Result<Self, Error> {
        // A backend that has just bound its socket may not listen yet
        // (connect then fails with ECONNREFUSED): retry briefly, as rust-vmm
        // vhost's Frontend::connect does.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        let sock = loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                Err(e)
                    if e.kind() == io::ErrorKind::ConnectionRefused
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(e) => return Err(Error::Connect(path.display().to_string(), e)),
            }
        };
        Self::from_stream(sock, cfg)
    }

    /// Sets up a frontend on an already-connected socket.
    ///
    /// # Errors
    /// Negotiation failures; [`Error::NoAnswer`] if the backend does not
    /// answer a message of the handshake within [`CONTROL_TIMEOUT`].
    pub fn from_stream(sock: UnixStream, cfg: &FrontendConfig) -> Result<Self, Error> {
        cfg.validate()?;
        // A backend that never answers must not hang the tool: the session
        // replies, read here, fail after the socket's read timeout; the
        // library's requests are bounded by `bounded`.
        sock.set_read_timeout(Some(CONTROL_TIMEOUT))?;
        let raw = sock.try_clone()?;
        let watch = sock.try_clone()?;
        let shut_here = Arc::new(AtomicBool::new(false));
        bounded(&watch, &shut_here, "the vhost-user handshake", || {
            Self::handshake(sock, raw, shut_here.clone(), cfg)
        })
    }

    fn handshake(
        sock: UnixStream,
        raw: UnixStream,
        shut_here: Arc<AtomicBool>,
        cfg: &FrontendConfig,
    ) -> Result<Self, Error> {
        let mut fe = Frontend::from_stream(sock, u64::from(cfg.queues));
        let v = |what| move |e| Error::Vhost(what, e);

        let features = fe.get_features().map_err(v("GET_FEATURES"))?;
        if features & F_PROTOCOL_FEATURES == 0 {
            return Err(Error::Missing("VHOST_USER_F_PROTOCOL_FEATURES"));
        }
        let pf = fe.get_protocol_features().map_err(v("GET_PROTOCOL_FEATURES"))?;
        if !pf.contains(VhostUserProtocolFeatures::CRYPTO_SESSION) {
            return Err(Error::Missing("VHOST_USER_PROTOCOL_F_CRYPTO_SESSION"));
        }
        let mut want = VhostUserProtocolFeatures::CRYPTO_SESSION;
        if cfg.queues > 1 {
            if !pf.contains(VhostUserProtocolFeatures::MQ) {
                return Err(Error::Missing(
                    "VHOST_USER_PROTOCOL_F_MQ (needed for --queues > 1)",
                ));
            }
            want |= VhostUserProtocolFeatures::MQ;
        }
        fe.set_protocol_features(want)
            .map_err(v("SET_PROTOCOL_FEATURES"))?;
        if cfg.queues > 1 {
            let n = fe.get_queue_num().map_err(v("GET_QUEUE_NUM"))?;
            if n < u64::from(cfg.queues) {
                return Err(Error::Options(format!(
                    "--queues {}: the backend offers {n} (GET_QUEUE_NUM)",
                    cfg.queues
                )));
            }
        }
        fe.set_owner().map_err(v("SET_OWNER"))?;
        let acked = features & (F_PROTOCOL_FEATURES | F_VERSION_1 | F_INDIRECT_DESC | F_EVENT_IDX);
        let event_idx = acked & F_EVENT_IDX != 0;

        let per_queue = DriverQueue::area_bytes(cfg);
        let need = (u64::from(cfg.queues) * per_queue + RING_AREA_ALIGN) as usize;
        let size = cfg.memory_bytes.max(need).next_multiple_of(2 << 20);
        let mem = Arc::new(GuestMem::new(size)?);

        fe.set_features(acked).map_err(v("SET_FEATURES"))?;
        fe.set_mem_table(&[mem.region_info()])
            .map_err(v("SET_MEM_TABLE"))?;

        let mut queues = Vec::new();
        let mut base = RING_AREA_ALIGN;
        for q in 0..usize::from(cfg.queues) {
            let ring = SplitRing::contiguous(base, cfg.queue_size, RING_AREA_ALIGN);
            base += per_queue;
            let kick = EventFd::new(EFD_NONBLOCK)?;
            let call = EventFd::new(EFD_NONBLOCK)?;
            fe.set_vring_num(q, cfg.queue_size).map_err(v("SET_VRING_NUM"))?;
            fe.set_vring_base(q, 0).map_err(v("SET_VRING_BASE"))?;
            fe.set_vring_addr(q, &vring_config(&mem, ring))
                .map_err(v("SET_VRING_ADDR"))?;
            fe.set_vring_kick(q, &kick).map_err(v("SET_VRING_KICK"))?;
            fe.set_vring_call(q, &call).map_err(v("SET_VRING_CALL"))?;
            let peer = (raw.try_clone()?, shut_here.clone());
            queues.push(DriverQueue::new(
                mem.clone(),
                ring,
                cfg,
                event_idx,
                kick,
                call,
                peer,
            )?);
        }
        if cfg.dpdk {
            // DPDK 22.11 installs its session handler only once every ring
            // is enabled (`docs/PROTOCOL.md` §9, and this module's notes).
            for q in 0..usize::from(cfg.queues) {
                fe.set_vring_enable(q, true).map_err(v("SET_VRING_ENABLE"))?;
            }
        }
        Ok(CryptoFrontend {
            frontend: fe,
            sock: raw,
            shut_here,
            abi: cfg.session_abi,
            mem,
            queues,
            dpdk_live: cfg.dpdk.then(Default::default),
        })
    }

    /// Sends CREATE_CRYPTO_SESSION and returns the backend's session id
    /// (negative on refusal).
    ///
    /// # Errors
    /// Socket failures or a malformed reply; [`Error::ShutHere`] once this
    /// tool has shut the connection down after an earlier failure.
    pub fn create_session(&mut self, info: &SymSessionInfo) -> Result<i64, Error> {
        let r = self.send_create(info);
        r.map_err(|e| self.after_own_shutdown(e))
    }

    /// A failure of a session message, or [`Error::ShutHere`] when the
    /// connection had been shut down by this tool (a socket error that
    /// only follows from it; [`Error::NoAnswer`], the shutdown's reason, is
    /// kept).
    fn after_own_shutdown(&self, e: Error) -> Error {
        match e {
            Error::NoAnswer(_) => e,
            _ if self.shut_here.load(Ordering::SeqCst) => Error::ShutHere,
            _ => e,
        }
    }

    fn send_create(&mut self, info: &SymSessionInfo) -> Result<i64, Error> {
        let msg = create_request(self.abi, info);
        self.sock.write_all(&msg)?;
        let mut hdr = [0u8; HDR_SIZE];
        let late = read_error(&self.sock, &self.shut_here, "CREATE_CRYPTO_SESSION");
        (&self.sock).read_exact(&mut hdr).map_err(late)?;
        let Header {
            request: req,
            flags,
            size,
        } = Header::from_bytes(&hdr);
        let size = size as usize;
        if req != u32::from(FrontendReq::CREATE_CRYPTO_SESSION)
            || flags != VERSION_1 | REPLY
            || size > MAX_PAYLOAD
        {
            return Err(Error::BadReply(format!(
                "request {req} flags {flags:#x} size {size}"
            )));
        }
        let mut payload = vec![0u8; size];
        (&self.sock).read_exact(&mut payload).map_err(late)?;
        if size != self.abi.size() {
            return Err(Error::BadReply(format!("size {size}, sent {}", self.abi.size())));
        }
        let id = reply_session_id(&payload, self.abi).ok_or_else(|| Error::BadReply("short".into()))?;
        if let (Some(live), true) = (&mut self.dpdk_live, id > 0) {
            live.insert(id as u64);
        }
        Ok(id)
    }

    /// Sends CLOSE_CRYPTO_SESSION (which has no reply), then a GET_FEATURES
    /// round trip: a backend handles messages in order, so once that reply
    /// is back the close has taken effect and later requests see it.
    ///
    /// In DPDK mode an id this connection did not get from CREATE, or has
    /// closed already, is not sent: DPDK 22.11 would close the connection
    /// (`vhost_crypto_close_sess` fails, and without NEED_REPLY
    /// `vhost_user_msg_handler` treats that as fatal); the session is gone
    /// either way.
    ///
    /// # Errors
    /// Socket failures; [`Error::ShutHere`] once this tool has shut the
    /// connection down after an earlier failure.
    pub fn close_session(&mut self, id: u64) -> Result<(), Error> {
        if let Some(live) = &mut self.dpdk_live {
            if !live.remove(&id) {
                return Ok(());
            }
        }
        let r = self.send_close(id);
        r.map_err(|e| self.after_own_shutdown(e))
    }

    fn send_close(&mut self, id: u64) -> Result<(), Error> {
        self.sock.write_all(&close_request(id))?;
        let fe = &mut self.frontend;
        bounded(&self.sock, &self.shut_here, "GET_FEATURES", || {
            fe.get_features().map_err(|e| Error::Vhost("GET_FEATURES", e))
        })?;
        Ok(())
    }

    /// Sends raw bytes on the vhost-user socket (for malformed-message tests).
    ///
    /// # Errors
    /// Socket failures.
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<(), Error> {
        self.sock.write_all(bytes)?;
        Ok(())
    }

    /// Reads one whole message (header + payload) from the socket, e.g. the
    /// reply to a message sent with [`CryptoFrontend::send_raw`].
    ///
    /// # Errors
    /// Socket failures or a payload over 4096 bytes.
    pub fn recv_raw_reply(&mut self) -> Result<Vec<u8>, Error> {
        let mut msg = vec![0u8; HDR_SIZE];
        self.sock.read_exact(&mut msg)?;
        let size = Header::from_bytes(msg[..HDR_SIZE].try_into().unwrap_or(&[0; HDR_SIZE])).size;
        if size as usize > MAX_PAYLOAD {
            return Err(Error::BadReply(format!("size {size}")));
        }
        msg.resize(HDR_SIZE + size as usize, 0);
        self.sock.read_exact(&mut msg[HDR_SIZE..])?;
        Ok(msg)
    }

    /// Asks the backend for ring `q`'s base (stops the ring), as a frontend
    /// does on shutdown.
    ///
    /// # Errors
    /// Protocol failures.
    pub fn get_vring_base(&mut self, q: usize) -> Result<u32, Error> {
        let fe = &mut self.frontend;
        bounded(&self.sock, &self.shut_here, "GET_VRING_BASE", || {
            fe.get_vring_base(q)
                .map_err(|e| Error::Vhost("GET_VRING_BASE", e))
        })
    }

    /// Sets data ring `q` up again after [`CryptoFrontend::get_vring_base`]
    /// stopped it, as QEMU does when it restarts a device: SET_VRING_NUM,
    /// SET_VRING_BASE (`base`), SET_VRING_ADDR, SET_VRING_KICK and
    /// SET_VRING_CALL with the same memory and eventfds. The guest side of
    /// the ring (descriptors, avail and used rings) is left as it is.
    ///
    /// # Errors
    /// Protocol failures.
    pub fn restart_ring(&mut self, q: usize, base: u16) -> Result<(), Error> {
        let v = |what: &'static str| move |e| Error::Vhost(what, e);
        let dq = &self.queues[q];
        let addr = vring_config(&self.mem, dq.ring_addrs());
        let fe = &mut self.frontend;
        bounded(&self.sock, &self.shut_here, "the ring set-up", || {
            fe.set_vring_num(q, dq.size).map_err(v("SET_VRING_NUM"))?;
            fe.set_vring_base(q, base).map_err(v("SET_VRING_BASE"))?;
            fe.set_vring_addr(q, &addr).map_err(v("SET_VRING_ADDR"))?;
            fe.set_vring_kick(q, &dq.kick).map_err(v("SET_VRING_KICK"))?;
            fe.set_vring_call(q, &dq.call).map_err(v("SET_VRING_CALL"))?;
            Ok(())
        })
    }
}

/// `SET_VRING_ADDR`'s payload for `ring` in `mem`: our addresses of its
/// three parts (the backend translates them with the memory table).
fn vring_config(mem: &GuestMem, ring: SplitRing) -> VringConfigData {
    VringConfigData {
        queue_max_size: ring.size,
        queue_size: ring.size,
        flags: 0,
        desc_table_addr: mem.va(ring.desc),
        used_ring_addr: mem.va(ring.used),
        avail_ring_addr: mem.va(ring.avail),
        log_addr: None,
    }
}

/// Shuts the connection down from this side: sets `shut_here` first, so
/// that a thread whose read or wait then fails reports
/// [`Error::ShutHere`], not the end of the stream as the backend's doing.
fn shut_down(sock: &UnixStream, shut_here: &AtomicBool) {
    shut_here.store(true, Ordering::SeqCst);
    let _ = sock.shutdown(Shutdown::Both);
}

/// Maps a failed read of `what`'s reply on `sock`: the socket's read
/// timeout ([`CONTROL_TIMEOUT`]) to [`Error::NoAnswer`], after shutting the
/// socket down (a late reply must not be taken for the answer to the next
/// message) and setting `shut_here`, anything else to [`Error::Io`].
fn read_error<'a>(
    sock: &'a UnixStream,
    shut_here: &'a AtomicBool,
    what: &'static str,
) -> impl Fn(io::Error) -> Error + Copy + 'a {
    move |e| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            shut_down(sock, shut_here);
            Error::NoAnswer(what)
        }
        _ => Error::Io(e),
    }
}

/// Runs `f`, which sends vhost-user requests through rust-vmm's
/// [`Frontend`] on `sock`, and shuts the socket down (setting `shut_here`
/// first) if `f` has not returned after [`CONTROL_TIMEOUT`]: the library
/// retries a read that timed out (`EAGAIN`) for ever (vhost 0.18
/// `connection.rs`), so the socket's read timeout alone does not bound it.
///
/// # Errors
/// [`Error::NoAnswer`] (`what`) once the time ran out (the connection is
/// unusable then, whatever `f` returned), else `f`'s error.
fn bounded<T>(
    sock: &UnixStream,
    shut_here: &Arc<AtomicBool>,
    what: &'static str,
    f: impl FnOnce() -> Result<T, Error>,
) -> Result<T, Error> {
    let watch = sock.try_clone()?;
    let fired = Arc::new(AtomicBool::new(false));
    let (done, wait) = mpsc::channel::<()>();
    let t = {
        let fired = fired.clone();
        let shut_here = shut_here.clone();
        std::thread::spawn(move || {
            if wait.recv_timeout(CONTROL_TIMEOUT) == Err(mpsc::RecvTimeoutError::Timeout) {
                fired.store(true, Ordering::SeqCst);
                // The blocked read then sees the end of the stream.
                shut_down(&watch, &shut_here);
            }
        })
    };
    let r = f();
    let _ = done.send(());
    let _ = t.join();
    if fired.load(Ordering::SeqCst) {
        return Err(Error::NoAnswer(what));
    }
    r
}
