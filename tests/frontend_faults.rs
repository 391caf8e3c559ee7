// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Frontend faults against the daemon binary: disconnects at every point of
//! the handshake and in the middle of a batch, many connect/disconnect
//! cycles under load (fd, thread, mapping and RSS accounting), malformed
//! vhost-user messages, guest memory files smaller than announced or shrunk
//! after SET_MEM_TABLE, guest memory that cannot be sealed (with and without
//! `--require-sealed-memory`), session-message floods and churn, pipelined
//! requests, and a frontend waiting while another is served.
//!
//! Every test spawns its own daemon (`RUST_LOG=warn`, stderr to a log file
//! that is printed when the test fails), puts a timeout on every blocking
//! read, and checks after each fault that the daemon process is alive and
//! that a fresh frontend gets NIST SP 800-38A F.2.1 right.
//!
//! Expected values come from the vhost-user and virtio-crypto specifications,
//! the NIST vectors and OpenSSL, never from the code under test.

use std::fs::File;
use std::io::{self, BufReader, Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use openssl::symm::{Cipher, Crypter, Mode};
use vhost_crypto_replay::frontend::{CryptoFrontend, DescMode, FrontendConfig, Used};
use vhost_user_crypto::eventfd::EVENTFD_COPIES_PER_RING;
use vhost_user_crypto::virtq::descriptor::Desc;
use vhost_user_crypto::wire::session::{close_request, create_request, SessionAbi, SymSessionInfo};
use vhost_user_crypto::wire::virtio_crypto::OpDataReq;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

// ---- vhost-user protocol constants (vhost-user specification) ----

const GET_FEATURES: u32 = 1;
const SET_FEATURES: u32 = 2;
const SET_OWNER: u32 = 3;
const SET_MEM_TABLE: u32 = 5;
const SET_VRING_NUM: u32 = 8;
const SET_VRING_ADDR: u32 = 9;
const SET_VRING_BASE: u32 = 10;
const GET_VRING_BASE: u32 = 11;
const SET_VRING_KICK: u32 = 12;
const SET_VRING_CALL: u32 = 13;
const SET_VRING_ERR: u32 = 14;
/// `VHOST_USER_VRING_NOFD_MASK` in a ring fd message's u64.
const VHOST_USER_VRING_NOFD: u64 = 0x100;
const GET_PROTOCOL_FEATURES: u32 = 15;
const SET_PROTOCOL_FEATURES: u32 = 16;
const SET_VRING_ENABLE: u32 = 18;
const CREATE_CRYPTO_SESSION: u32 = 26;
const CLOSE_CRYPTO_SESSION: u32 = 27;

/// Header flags: version 1, REPLY, NEED_REPLY.
const V1: u32 = 0x1;
const REPLY: u32 = 0x4;
const NEED_REPLY: u32 = 0x8;

const F_PROTOCOL_FEATURES: u64 = 1 << 30;
const PF_REPLY_ACK: u64 = 0x8;
const PF_CRYPTO_SESSION: u64 = 0x80;

/// Read timeout on every socket: a daemon bug shows as a failure, not a hang.
const TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a test may run before its daemon is killed (see `Daemon::with_watchdog`).
const WATCHDOG: Duration = Duration::from_secs(240);

// ---- virtio-crypto ----

const ENCRYPT: u32 = 0;
const DECRYPT: u32 = 1;
const ST_OK: u8 = 0;
const ST_INVSESS: u8 = 4;
/// Negative session ids of refused CREATEs: -VIRTIO_CRYPTO_ERR, -VIRTIO_CRYPTO_NOSPC.
const ID_ERR: i64 = -1;
const ID_NOSPC: i64 = -5;

// ---- NIST SP 800-38A F.2.1 / F.2.2 (CBC-AES128) ----

const NIST_KEY: &str = "2b7e151628aed2a6abf7158809cf4f3c";
const NIST_IV: &str = "000102030405060708090a0b0c0d0e0f";
const NIST_PT: &str = concat!(
    "6bc1bee22e409f96e93d7e117393172a",
    "ae2d8a571e03ac9c9eb76fac45af8e51",
    "30c81c46a35ce411e5fbc1191a0a52ef",
    "f69f2445df4f9b17ad2b417be66c3710"
);
const NIST_CT: &str = concat!(
    "7649abac8119b246cee98e9b12e9197d",
    "5086cb9b507219ee95db113a917678b2",
    "73bed6b8e3c1743b7116e69e22229516",
    "3ff1caa1681fac09120eca307586e1a7"
);

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

// ---- the daemon process ----

#[path = "common/daemon.rs"]
mod daemon;
#[path = "common/skip.rs"]
mod skip;
use skip::skipped;

/// The in-process test harness; only its request-header helper is used here.
mod common;

/// The daemon under test (RUST_LOG=warn, log in a file) with a watchdog;
/// killed on drop (its log is printed if the test failed).
struct Daemon {
    inner: daemon::Daemon,
    watchdog: Option<(mpsc::Sender<()>, std::thread::JoinHandle<()>)>,
}

impl std::ops::Deref for Daemon {
    type Target = daemon::Daemon;
    fn deref(&self) -> &daemon::Daemon {
        &self.inner
    }
}

impl std::ops::DerefMut for Daemon {
    fn deref_mut(&mut self) -> &mut daemon::Daemon {
        &mut self.inner
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some((stop, t)) = self.watchdog.take() {
            let _ = stop.send(());
            let _ = t.join();
        }
        self.inner.stop();
        if std::thread::panicking() {
            eprintln!("---- daemon log (tail) ----\n{}", self.log_tail(4000));
        }
    }
}

impl Daemon {
    fn spawn(extra: &[&str]) -> Daemon {
        Daemon {
            inner: daemon::spawn_daemon_logged(extra, "warn"),
            watchdog: None,
        }
        .with_watchdog(WATCHDOG)
    }

    /// Kills the daemon if the test is still running after `limit`.
    ///
    /// Socket reads here have timeouts, but rust-vmm's `Frontend` (inside
    /// `CryptoFrontend`) retries a timed-out read forever; killing the
    /// daemon turns such a hang into a disconnect error, so the test fails
    /// instead of hanging.
    fn with_watchdog(mut self, limit: Duration) -> Daemon {
        let (stop, rx) = mpsc::channel::<()>();
        let pid = self.pid() as libc::pid_t;
        let t = std::thread::spawn(move || {
            if rx.recv_timeout(limit) == Err(mpsc::RecvTimeoutError::Timeout) {
                eprintln!("watchdog: test still running after {limit:?}; killing the daemon (pid {pid})");
                // SAFETY: plain kill(2) of our child, which is not reaped
                // yet (Drop stops this thread before it waits for the child).
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        });
        self.watchdog = Some((stop, t));
        self
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    #[track_caller]
    fn assert_alive(&mut self, after: &str) {
        // A dead daemon's sockets close before its exit status is ready, so
        // probe it with a GET_FEATURES round trip on a new connection (it
        // serves one frontend at a time: call this with no other open).
        let probe = || -> io::Result<()> {
            let s = UnixStream::connect(&self.sock)?;
            s.set_read_timeout(Some(TIMEOUT))?;
            (&s).write_all(&Conn::message(GET_FEATURES, V1, &[]))?;
            let mut reply = [0u8; 20];
            (&s).read_exact(&mut reply)?;
            if reply[..4] != GET_FEATURES.to_le_bytes() {
                return Err(io::Error::other(format!("bad reply {reply:02x?}")));
            }
            Ok(())
        };
        let probed = probe();
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("daemon died after {after}: {status}");
            }
            if probed.is_ok() {
                return;
            }
            if start.elapsed() > Duration::from_secs(2) {
                panic!("daemon does not answer after {after}: {probed:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits up to `within` for `needle` to appear in the last 4000 bytes
    /// of the daemon's log; fails with `what` and the log's tail.
    fn until_logged(&self, needle: &str, within: Duration, what: &str) {
        let start = Instant::now();
        while !self.log_tail(4000).contains(needle) {
            assert!(
                start.elapsed() < within,
                "{what}\nlog tail: {}",
                self.log_tail(1500)
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn log_tail(&self, bytes: usize) -> String {
        let s = std::fs::read_to_string(self.log()).unwrap_or_default();
        let cut = s.len().saturating_sub(bytes);
        let cut = (cut..s.len()).find(|&i| s.is_char_boundary(i)).unwrap_or(s.len());
        s[cut..].to_string()
    }

    fn log_len(&self) -> u64 {
        std::fs::metadata(self.log()).map(|m| m.len()).unwrap_or(0)
    }

    fn proc_file(&self, name: &str) -> String {
        std::fs::read_to_string(format!("/proc/{}/{name}", self.pid())).unwrap()
    }

    /// A `kB` field of /proc/PID/status.
    fn status_kib(&self, field: &str) -> u64 {
        let status = self.proc_file("status");
        let line = status
            .lines()
            .find(|l| l.starts_with(field))
            .unwrap_or_else(|| panic!("no {field} in /proc/PID/status"));
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    fn snapshot(&self) -> Snapshot {
        let fds = std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .unwrap()
            .count();
        let maps = self.proc_file("maps");
        Snapshot {
            fds,
            threads: self.status_kib("Threads:"),
            rss_kib: self.status_kib("VmRSS:"),
            memfd_maps: maps.lines().filter(|l| l.contains("/memfd:")).count(),
        }
    }

    /// Resource use of the daemon with one idle, freshly accepted
    /// connection: opening it and waiting for a GET_FEATURES reply proves
    /// the previous connection was torn down (the daemon serves one
    /// frontend at a time and sets the next one up only after the last one
    /// is gone), and every measurement is then taken in the same state.
    /// Threads that end on their own after an earlier connection (its
    /// `vuc-closer`, which the daemon does not wait for, a `vuc-memcheck`
    /// that has given its answer, a `vuc-wake`) get up to 1 s to be gone
    /// first, and the threads must be the same 20 ms apart: a snapshot
    /// that caught one counted a thread more than the next
    /// (`connection_kinds_leave_no_descriptors_or_threads_behind` failed so
    /// in 2 of 10 runs of this file, and
    /// `hundred_connect_disconnect_cycles_under_load` once in 12 with the
    /// names alone). The names are printed, for a failure's output.
    fn idle_snapshot(&self) -> Snapshot {
        let c = Conn::open(&self.sock);
        c.get_features();
        let start = Instant::now();
        let mut names = thread_names(self.pid());
        while start.elapsed() < Duration::from_secs(1) {
            let count = |name: &str| names.iter().filter(|n| *n == name).count();
            let settled = count("vuc-closer") <= 1 && count("vuc-memcheck") == 0 && count("vuc-wake") == 0;
            // (And the same threads 20 ms later.)
            std::thread::sleep(Duration::from_millis(20));
            let again = thread_names(self.pid());
            if settled && again == names {
                break;
            }
            names = again;
        }
        let s = self.snapshot();
        // (Shown with a failed assertion on the counts.)
        eprintln!("idle snapshot {s:?}, threads {names:?}");
        drop(c);
        s
    }
}

#[derive(Debug, Clone, Copy)]
struct Snapshot {
    fds: usize,
    threads: u64,
    rss_kib: u64,
    memfd_maps: usize,
}

// ---- raw vhost-user connection ----

/// What a read on a raw connection gave.
#[derive(Debug)]
enum Got {
    /// A whole message: request, flags, payload.
    Msg(u32, u32, Vec<u8>),
    /// The daemon closed the connection (EOF or ECONNRESET).
    Closed,
    /// Nothing within [`TIMEOUT`].
    TimedOut,
}

struct Conn {
    s: UnixStream,
}

impl Conn {
    fn open(sock: &Path) -> Conn {
        let s = UnixStream::connect(sock).unwrap();
        s.set_read_timeout(Some(TIMEOUT)).unwrap();
        s.set_write_timeout(Some(TIMEOUT)).unwrap();
        Conn { s }
    }

    fn message(req: u32, flags: u32, payload: &[u8]) -> Vec<u8> {
        let mut m = Vec::with_capacity(12 + payload.len());
        m.extend_from_slice(&req.to_le_bytes());
        m.extend_from_slice(&flags.to_le_bytes());
        m.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        m.extend_from_slice(payload);
        m
    }

    /// Sends `bytes` in one sendmsg carrying `fds`, then the rest if short.
    fn send_bytes(&self, bytes: &[u8], fds: &[RawFd]) -> io::Result<()> {
        let sent = if fds.is_empty() {
            0
        } else {
            self.s.send_with_fds(&[bytes], fds).map_err(io::Error::from)?
        };
        (&self.s).write_all(&bytes[sent..])
    }

    fn send(&self, req: u32, flags: u32, payload: &[u8], fds: &[RawFd]) -> io::Result<()> {
        self.send_bytes(&Self::message(req, flags, payload), fds)
    }

    fn recv(&self) -> Got {
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
    fn reply(&self, req: u32) -> Vec<u8> {
        match self.recv() {
            Got::Msg(r, f, p) => {
                assert_eq!((r, f), (req, REPLY | V1), "reply header to request {req}");
                p
            }
            other => panic!("request {req}: expected a reply, got {other:?}"),
        }
    }

    #[track_caller]
    fn reply_u64(&self, req: u32) -> u64 {
        let p = self.reply(req);
        assert_eq!(p.len(), 8, "reply to {req}: payload size");
        u64::from_le_bytes(p[..8].try_into().unwrap())
    }

    #[track_caller]
    fn get_features(&self) -> u64 {
        self.send(GET_FEATURES, V1, &[], &[]).unwrap();
        self.reply_u64(GET_FEATURES)
    }

    /// QEMU's negotiation plus REPLY_ACK, so a refused message can be
    /// answered with an error ack: GET_FEATURES, GET_PROTOCOL_FEATURES,
    /// SET_PROTOCOL_FEATURES(CRYPTO_SESSION | REPLY_ACK), SET_OWNER,
    /// SET_FEATURES(PROTOCOL_FEATURES) with NEED_REPLY (acked with 0).
    fn negotiated(sock: &Path) -> Conn {
        let c = Conn::open(sock);
        assert_ne!(c.get_features() & F_PROTOCOL_FEATURES, 0);
        c.send(GET_PROTOCOL_FEATURES, V1, &[], &[]).unwrap();
        let pf = c.reply_u64(GET_PROTOCOL_FEATURES);
        assert_eq!(
            pf & (PF_CRYPTO_SESSION | PF_REPLY_ACK),
            PF_CRYPTO_SESSION | PF_REPLY_ACK
        );
        c.send(
            SET_PROTOCOL_FEATURES,
            V1,
            &(PF_CRYPTO_SESSION | PF_REPLY_ACK).to_le_bytes(),
            &[],
        )
        .unwrap();
        c.send(SET_OWNER, V1 | NEED_REPLY, &[], &[]).unwrap();
        assert_eq!(c.reply_u64(SET_OWNER), 0, "SET_OWNER ack");
        c.send(
            SET_FEATURES,
            V1 | NEED_REPLY,
            &F_PROTOCOL_FEATURES.to_le_bytes(),
            &[],
        )
        .unwrap();
        assert_eq!(c.reply_u64(SET_FEATURES), 0, "SET_FEATURES ack");
        c
    }
}

/// A memfd to share as guest memory (never touched by the test itself).
fn memfd(size: u64) -> File {
    // SAFETY: a valid NUL-terminated name; the result is checked.
    let fd = unsafe { libc::memfd_create(c"frontend-faults".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", io::Error::last_os_error());
    // SAFETY: a fresh descriptor we own.
    let f = unsafe { File::from_raw_fd(fd) };
    f.set_len(size).unwrap();
    f
}

/// Frontend virtual address of guest address 0 in the raw tests (the
/// backend only uses it to translate SET_VRING_ADDR addresses).
const UADDR: u64 = 0x7f00_0000_0000;
const MEM_SIZE: u64 = 1 << 20;

/// SET_MEM_TABLE payload: (guest address, size, frontend address, mmap offset) per region.
fn mem_table(regions: &[(u64, u64, u64, u64)]) -> Vec<u8> {
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

fn vring_state(index: u32, num: u32) -> Vec<u8> {
    let mut p = index.to_le_bytes().to_vec();
    p.extend_from_slice(&num.to_le_bytes());
    p
}

/// SET_VRING_ADDR payload (frontend addresses), no flags, no log.
fn vring_addr(index: u32, desc: u64, used: u64, avail: u64) -> Vec<u8> {
    let mut p = index.to_le_bytes().to_vec();
    p.extend_from_slice(&0u32.to_le_bytes());
    for v in [desc, used, avail, 0] {
        p.extend_from_slice(&v.to_le_bytes());
    }
    p
}

// ---- sessions and requests through the replay tool's frontend ----

fn cfg(abi: SessionAbi, queues: u16, queue_size: u16, depth: u16, max_payload: usize) -> FrontendConfig {
    FrontendConfig {
        queues,
        queue_size,
        queue_depth: depth,
        max_payload,
        max_iv: 16,
        memory_bytes: 0,
        session_abi: abi,
        desc_mode: DescMode::Indirect,
        dpdk: false,
    }
}

/// A `CryptoFrontend` whose socket has read and write timeouts.
fn frontend(sock: &Path, cfg: &FrontendConfig) -> CryptoFrontend {
    let s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(TIMEOUT)).unwrap();
    s.set_write_timeout(Some(TIMEOUT)).unwrap();
    CryptoFrontend::from_stream(s, cfg).unwrap()
}

fn session(key: &[u8], direction: u8) -> SymSessionInfo {
    SymSessionInfo {
        op_code: 2, // VIRTIO_CRYPTO_CIPHER_CREATE_SESSION (layouts A and C carry it)
        ..SymSessionInfo::aes_cbc(key, direction)
    }
}

/// One request on queue `q`: writes header, IV, src, a 0xEE-filled dst
/// and a 0xFF status byte into a free slot and makes it available (no kick).
fn put_request(fe: &mut CryptoFrontend, q: usize, opcode: u32, sid: u64, iv: &[u8], src: &[u8]) -> u16 {
    let q = &mut fe.queues[q];
    let slot = q.next_slot().expect("a free slot");
    let l = q.layout(slot);
    let hdr = OpDataReq {
        opcode,
        algo: 0,
        session_id: sid,
        op_type: 1,
        iv_len: iv.len() as u32,
        src_data_len: src.len() as u32,
        dst_data_len: src.len() as u32,
    };
    q.mem().write(l.hdr, &hdr.to_bytes());
    q.mem().write(l.iv, iv);
    q.mem().write(l.src, src);
    q.mem().fill(l.dst, src.len(), 0xEE);
    q.mem().write(l.status, &[0xFF]);
    q.submit(slot, iv.len() as u32, src.len() as u32);
    slot
}

/// Status byte, used length and dst of a completed request.
fn result(fe: &CryptoFrontend, q: usize, u: Used, len: usize) -> (u8, u32, Vec<u8>) {
    let q = &fe.queues[q];
    let l = q.layout(u.slot);
    let mut dst = vec![0; len];
    q.mem().read(l.dst, &mut dst);
    (q.mem().read_u8(l.status), u.len, dst)
}

/// Runs one request on queue 0 and returns (status, used length, dst).
fn run_one(fe: &mut CryptoFrontend, opcode: u32, sid: u64, src: &[u8]) -> (u8, u32, Vec<u8>) {
    let slot = put_request(fe, 0, opcode, sid, &hex(NIST_IV), src);
    fe.queues[0].publish_and_kick().unwrap();
    let mut done = Vec::new();
    fe.queues[0].reap(&mut done, TIMEOUT).unwrap();
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].slot, slot);
    result(fe, 0, done[0], src.len())
}

/// A fresh frontend gets F.2.1 (and F.2.2) right: status OK, used length 65.
#[track_caller]
fn assert_nist(sock: &Path, after: &str) {
    let mut fe = frontend(sock, &cfg(SessionAbi::C, 1, 64, 8, 64));
    let e = fe.create_session(&session(&hex(NIST_KEY), 1)).unwrap();
    let d = fe.create_session(&session(&hex(NIST_KEY), 2)).unwrap();
    // Ids go on from the daemon's earlier connections (never reused).
    assert!(
        e >= 1 && d == e + 1,
        "session ids {e}, {d} on a fresh connection after {after}"
    );
    let (st, len, dst) = run_one(&mut fe, ENCRYPT, e as u64, &hex(NIST_PT));
    assert_eq!(
        (st, len),
        (ST_OK, 65),
        "F.2.1 status and used length after {after}"
    );
    assert_eq!(dst, hex(NIST_CT), "F.2.1 ciphertext after {after}");
    let (st, len, dst) = run_one(&mut fe, DECRYPT, d as u64, &hex(NIST_CT));
    assert_eq!((st, len, dst), (ST_OK, 65, hex(NIST_PT)), "F.2.2 after {after}");
}

/// AES-CBC without padding through OpenSSL (the independent oracle).
fn oracle(encrypt: bool, key: &[u8], iv: &[u8], data: &[u8]) -> Vec<u8> {
    let cipher = match key.len() {
        16 => Cipher::aes_128_cbc(),
        24 => Cipher::aes_192_cbc(),
        32 => Cipher::aes_256_cbc(),
        n => panic!("key of {n} bytes"),
    };
    let mode = if encrypt { Mode::Encrypt } else { Mode::Decrypt };
    let mut c = Crypter::new(cipher, mode, key, Some(iv)).unwrap();
    c.pad(false);
    let mut out = vec![0u8; data.len() + 16];
    let mut n = c.update(data, &mut out).unwrap();
    n += c.finalize(&mut out[n..]).unwrap();
    out.truncate(n);
    out
}

/// splitmix64: deterministic test data without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// One verified request: session, direction, key, IV, source.
struct Job {
    sid: u64,
    encrypt: bool,
    key: Vec<u8>,
    iv: Vec<u8>,
    src: Vec<u8>,
}

/// Runs `jobs` on queue `q` with up to `depth` in flight and checks every
/// completion against OpenSSL (status OK, used length len + 1, dst bytes).
/// With `abandon_at = Some(n)`, stops after submitting `n` jobs, kicks,
/// and returns with them in flight (the caller then disconnects).
fn run_jobs(
    fe: &mut CryptoFrontend,
    q: usize,
    jobs: &[Job],
    depth: usize,
    abandon_at: Option<usize>,
) -> usize {
    let mut inflight: Vec<Option<usize>> = vec![None; usize::from(fe.queues[q].size)];
    let mut next = 0;
    let mut verified = 0;
    let mut done = Vec::new();
    let stop = abandon_at.unwrap_or(jobs.len()).min(jobs.len());
    while verified < stop || (abandon_at.is_none() && verified < jobs.len()) {
        while next < stop
            && usize::from(fe.queues[q].in_flight()) < depth
            && fe.queues[q].next_slot().is_some()
        {
            let j = &jobs[next];
            let op = if j.encrypt { ENCRYPT } else { DECRYPT };
            let slot = put_request(fe, q, op, j.sid, &j.iv, &j.src);
            inflight[usize::from(slot)] = Some(next);
            next += 1;
        }
        fe.queues[q].publish_and_kick().unwrap();
        if abandon_at.is_some() && next == stop {
            return verified;
        }
        done.clear();
        fe.queues[q].reap(&mut done, TIMEOUT).unwrap();
        for &u in &done {
            let i = inflight[usize::from(u.slot)]
                .take()
                .expect("completion of a slot in flight");
            let j = &jobs[i];
            let (st, len, dst) = result(fe, q, u, j.src.len());
            assert_eq!(
                (st, len),
                (ST_OK, j.src.len() as u32 + 1),
                "job {i} status, used length"
            );
            assert!(
                dst == oracle(j.encrypt, &j.key, &j.iv, &j.src),
                "job {i}: wrong output"
            );
            verified += 1;
        }
    }
    verified
}

// ---- 1. disconnect at every point of the handshake ----

/// A message of the QEMU-like handshake.
struct Msg {
    name: &'static str,
    req: u32,
    payload: Vec<u8>,
    fds: Vec<RawFd>,
    /// Whether the protocol has a reply (without REPLY_ACK negotiated).
    reply: bool,
}

/// Memory and eventfds the handshake hands over.
struct HandshakeRes {
    mem: File,
    kick: EventFd,
    call: EventFd,
}

impl HandshakeRes {
    fn new() -> Self {
        HandshakeRes {
            mem: memfd(MEM_SIZE),
            kick: EventFd::new(EFD_NONBLOCK).unwrap(),
            call: EventFd::new(EFD_NONBLOCK).unwrap(),
        }
    }

    /// What QEMU sends for `cryptodev-vhost-user` with one data queue,
    /// then a CREATE (layout C); the ring lives in the first 64 KiB.
    fn messages(&self) -> Vec<Msg> {
        let m = |name, req, payload: Vec<u8>, fds: Vec<RawFd>, reply| Msg {
            name,
            req,
            payload,
            fds,
            reply,
        };
        let (desc, avail, used) = (0x1000u64, 0x2000u64, 0x3000u64);
        let create = create_request(SessionAbi::C, &session(&hex(NIST_KEY), 1));
        vec![
            m("GET_FEATURES", GET_FEATURES, vec![], vec![], true),
            m(
                "GET_PROTOCOL_FEATURES",
                GET_PROTOCOL_FEATURES,
                vec![],
                vec![],
                true,
            ),
            m(
                "SET_PROTOCOL_FEATURES",
                SET_PROTOCOL_FEATURES,
                PF_CRYPTO_SESSION.to_le_bytes().to_vec(),
                vec![],
                false,
            ),
            m("SET_OWNER", SET_OWNER, vec![], vec![], false),
            m(
                "SET_FEATURES",
                SET_FEATURES,
                F_PROTOCOL_FEATURES.to_le_bytes().to_vec(),
                vec![],
                false,
            ),
            m(
                "SET_MEM_TABLE",
                SET_MEM_TABLE,
                mem_table(&[(0, MEM_SIZE, UADDR, 0)]),
                vec![self.mem.as_raw_fd()],
                false,
            ),
            m("SET_VRING_NUM", SET_VRING_NUM, vring_state(0, 256), vec![], false),
            m("SET_VRING_BASE", SET_VRING_BASE, vring_state(0, 0), vec![], false),
            m(
                "SET_VRING_ADDR",
                SET_VRING_ADDR,
                vring_addr(0, UADDR + desc, UADDR + used, UADDR + avail),
                vec![],
                false,
            ),
            m(
                "SET_VRING_KICK",
                SET_VRING_KICK,
                0u64.to_le_bytes().to_vec(),
                vec![self.kick.as_raw_fd()],
                false,
            ),
            m(
                "SET_VRING_CALL",
                SET_VRING_CALL,
                0u64.to_le_bytes().to_vec(),
                vec![self.call.as_raw_fd()],
                false,
            ),
            m(
                "CREATE_CRYPTO_SESSION",
                CREATE_CRYPTO_SESSION,
                create[12..].to_vec(),
                vec![],
                true,
            ),
        ]
    }
}

/// Checks the reply to handshake message `m`: a CREATE's id must be
/// above `last_id` (ids are never given twice in the daemon), and
/// becomes the new `last_id`.
#[track_caller]
fn check_handshake_reply(c: &Conn, m: &Msg, last_id: &mut i64) {
    let p = c.reply(m.req);
    match m.req {
        GET_FEATURES => {
            let f = u64::from_le_bytes(p[..8].try_into().unwrap());
            assert_ne!(f & F_PROTOCOL_FEATURES, 0, "features {f:#x}");
        }
        GET_PROTOCOL_FEATURES => {
            let f = u64::from_le_bytes(p[..8].try_into().unwrap());
            assert_ne!(f & PF_CRYPTO_SESSION, 0, "protocol features {f:#x}");
        }
        CREATE_CRYPTO_SESSION => {
            assert_eq!(p.len(), 1072, "CREATE reply size (layout C)");
            let id = i64::from_le_bytes(p[1064..1072].try_into().unwrap());
            assert!(id > *last_id, "session id {id} after {last_id}");
            *last_id = id;
        }
        _ => unreachable!(),
    }
}

/// How a connection ends after the first k messages.
#[derive(Debug, Clone, Copy)]
enum Cut {
    /// Right after message k-1 (and its reply).
    Clean,
    /// After 6 bytes of message k's header.
    HalfHeader,
    /// After message k's header (with its fds), without its payload.
    HeaderOnly,
    /// After message k's header and half its payload.
    HalfPayload,
    /// After all of message k, without reading its reply.
    ReplyUnread,
}

#[test]
fn disconnect_at_every_point_of_the_handshake() {
    let mut daemon = Daemon::spawn(&[]);
    let n = HandshakeRes::new().messages().len();
    let mut cases = 0;
    let mut last_id = 0;
    for k in 0..=n {
        for cut in [
            Cut::Clean,
            Cut::HalfHeader,
            Cut::HeaderOnly,
            Cut::HalfPayload,
            Cut::ReplyUnread,
        ] {
            let res = HandshakeRes::new();
            let msgs = res.messages();
            let next = msgs.get(k);
            match (cut, next) {
                (Cut::Clean, _) => {}
                (_, None) => continue,
                (Cut::HeaderOnly | Cut::HalfPayload, Some(m)) if m.payload.is_empty() => continue,
                (Cut::ReplyUnread, Some(m)) if !m.reply => continue,
                _ => {}
            }
            let c = Conn::open(&daemon.sock);
            for m in &msgs[..k] {
                c.send(m.req, V1, &m.payload, &m.fds).unwrap();
                if m.reply {
                    check_handshake_reply(&c, m, &mut last_id);
                }
            }
            if let Some(m) = next {
                let whole = Conn::message(m.req, V1, &m.payload);
                match cut {
                    Cut::Clean => {}
                    Cut::HalfHeader => c.send_bytes(&whole[..6], &[]).unwrap(),
                    Cut::HeaderOnly => c.send_bytes(&whole[..12], &m.fds).unwrap(),
                    Cut::HalfPayload => c.send_bytes(&whole[..12 + m.payload.len() / 2], &m.fds).unwrap(),
                    Cut::ReplyUnread => c.send_bytes(&whole, &m.fds).unwrap(),
                }
            }
            let what = format!(
                "{k} messages then {cut:?} (next: {})",
                next.map_or("none", |m| m.name)
            );
            drop(c);
            drop(res);
            daemon.assert_alive(&what);
            assert_nist(&daemon.sock, &what);
            cases += 1;
        }
    }
    // 13 clean cuts, 12 half headers, 9 headers without payload, 9 half
    // payloads, 3 replies unread (GET_FEATURES, GET_PROTOCOL_FEATURES, CREATE).
    assert_eq!(cases, 46);
    daemon.assert_alive("the handshake cuts");
}

// ---- 2. disconnect in the middle of a batch ----

fn jobs_4k(rng: &mut Rng, count: usize, sid: u64, key: &[u8]) -> Vec<Job> {
    (0..count)
        .map(|_| Job {
            sid,
            encrypt: true,
            key: key.to_vec(),
            iv: rng.bytes(16),
            src: rng.bytes(4096),
        })
        .collect()
}

#[test]
fn disconnect_in_the_middle_of_a_batch() {
    let mut daemon = Daemon::spawn(&[]);
    let mut rng = Rng(7);
    let key = rng.bytes(32);
    let base = daemon.idle_snapshot();
    let mut last_sid = 0;
    for (round, reaped_first) in [0usize, 100, 255, 0, 400].into_iter().enumerate() {
        let mut fe = frontend(&daemon.sock, &cfg(SessionAbi::C, 1, 256, 256, 4096));
        let sid = fe.create_session(&session(&key, 1)).unwrap();
        // Each connection gets ids the daemon never gave before.
        assert!(sid > last_sid, "round {round}: session id {sid} after {last_sid}");
        last_sid = sid;
        let jobs = jobs_4k(&mut rng, 512, sid as u64, &key);
        // Verify `reaped_first` completions, keep the queue full up to 512
        // submitted, then drop the frontend with the rest in flight.
        if reaped_first > 0 {
            let v = run_jobs(&mut fe, 0, &jobs[..reaped_first], 256, None);
            assert_eq!(v, reaped_first);
        }
        let rest = &jobs[reaped_first..];
        run_jobs(&mut fe, 0, rest, 256, Some(rest.len().min(256)));
        assert!(
            fe.queues[0].in_flight() > 0,
            "round {round}: nothing left in flight"
        );
        drop(fe);
        let what = format!("round {round}: disconnect with requests in flight");
        daemon.assert_alive(&what);
        assert_nist(&daemon.sock, &what);
    }
    // QEMU's way out: GET_VRING_BASE (stop the ring) with 256 requests in
    // flight, then disconnect. Once the reply is back the backend has
    // stopped: every request before the returned base is completed, none
    // after it is, and the ring is not touched any more.
    for round in 0..5 {
        let mut fe = frontend(&daemon.sock, &cfg(SessionAbi::C, 1, 256, 256, 4096));
        let sid = fe.create_session(&session(&key, 1)).unwrap();
        let jobs = jobs_4k(&mut rng, 256, sid as u64, &key);
        run_jobs(&mut fe, 0, &jobs, 256, Some(256));
        std::thread::sleep(Duration::from_micros(200 * round));
        let base = fe.get_vring_base(0).unwrap();
        assert!(base <= 256, "round {round}: base {base}");
        let mut done = Vec::new();
        while done.len() < base as usize {
            fe.queues[0].reap(&mut done, TIMEOUT).unwrap();
        }
        std::thread::sleep(Duration::from_millis(50));
        if fe.queues[0].in_flight() > 0 {
            let mut late = Vec::new();
            let r = fe.queues[0].reap(&mut late, Duration::from_millis(1));
            assert!(
                r.is_err() && late.is_empty(),
                "round {round}: {} completions after the stop",
                late.len()
            );
        }
        assert_eq!(
            done.len(),
            base as usize,
            "round {round}: completions vs base {base}"
        );
        for u in &done {
            let j = &jobs[usize::from(u.slot)];
            let (st, len, dst) = result(&fe, 0, *u, 4096);
            assert_eq!((st, len), (ST_OK, 4097), "round {round} slot {}", u.slot);
            assert!(
                dst == oracle(true, &j.key, &j.iv, &j.src),
                "round {round} slot {}",
                u.slot
            );
        }
        eprintln!("GET_VRING_BASE round {round}: base {base} of 256");
        drop(fe);
        let what = format!("round {round}: GET_VRING_BASE then disconnect");
        daemon.assert_alive(&what);
        assert_nist(&daemon.sock, &what);
    }
    // Nothing of the dropped connections is left behind.
    let after = daemon.idle_snapshot();
    eprintln!("mid-batch disconnects: {base:?} before, {after:?} after");
    assert!(
        after.fds <= base.fds + 2,
        "fds: {} before, {} after",
        base.fds,
        after.fds
    );
    assert_eq!(
        (after.threads, after.memfd_maps),
        (base.threads, 0),
        "threads, guest mappings"
    );
    // Four queues, all full, dropped at once.
    drop(daemon);
    let mut daemon = Daemon::spawn(&["--queues", "4"]);
    let mut fe = frontend(&daemon.sock, &cfg(SessionAbi::B, 4, 256, 256, 4096));
    let sid = fe.create_session(&session(&key, 1)).unwrap();
    for q in 0..4 {
        let jobs = jobs_4k(&mut rng, 256, sid as u64, &key);
        run_jobs(&mut fe, q, &jobs, 256, Some(256));
    }
    drop(fe);
    daemon.assert_alive("four full queues dropped");
    assert_nist(&daemon.sock, "four full queues dropped");
}

// ---- 3. connect/disconnect cycles under load ----

/// A guest keeps the session ids a connection gave it; after its frontend
/// reconnects, a request naming one must not run under a session the new
/// connection created (with ids restarting at 1 per connection it ran
/// under the new session's key and completed OK).
#[test]
fn a_previous_connections_session_id_is_not_given_again() {
    let daemon = Daemon::spawn(&[]);
    let mut fe = frontend(&daemon.sock, &cfg(SessionAbi::C, 1, 64, 8, 64));
    let old = fe.create_session(&session(&hex(NIST_KEY), 1)).unwrap();
    assert_eq!(
        run_one(&mut fe, ENCRYPT, old as u64, &hex(NIST_PT)),
        (ST_OK, 65, hex(NIST_CT))
    );
    drop(fe);
    let mut fe = frontend(&daemon.sock, &cfg(SessionAbi::C, 1, 64, 8, 64));
    let new = fe.create_session(&session(&[0x5a; 16], 1)).unwrap();
    assert_ne!(new, old, "the new connection's first session id");
    let (st, len, dst) = run_one(&mut fe, ENCRYPT, old as u64, &hex(NIST_PT));
    assert_eq!(
        (st, len),
        (ST_INVSESS, 1),
        "the previous connection's session {old}"
    );
    assert_eq!(dst, vec![0xEE; 64], "INVSESS wrote dst");
    // The new session works (its ciphertext differs from F.2.1's key's).
    let (st, len, dst) = run_one(&mut fe, ENCRYPT, new as u64, &hex(NIST_PT));
    assert_eq!((st, len), (ST_OK, 65));
    assert_ne!(dst, hex(NIST_CT));
}

#[test]
fn hundred_connect_disconnect_cycles_under_load() {
    let mut daemon = Daemon::spawn(&["--max-sessions", "16"]);
    let mut rng = Rng(42);
    let keys = [rng.bytes(16), rng.bytes(24), rng.bytes(32)];
    let mut first: Option<Snapshot> = None;
    let mut total = 0;
    let mut prev_ids: Vec<i64> = Vec::new();
    for cycle in 0..100 {
        let mut fe = frontend(&daemon.sock, &cfg(SessionAbi::C, 1, 256, 64, 256));
        // The previous connection's sessions are gone: INVSESS, used length 1.
        for &sid in prev_ids.iter().step_by(5) {
            let (st, len, dst) = run_one(&mut fe, ENCRYPT, sid as u64, &hex(NIST_PT));
            assert_eq!((st, len), (ST_INVSESS, 1), "cycle {cycle}: old session {sid}");
            assert_eq!(dst, vec![0xEE; 64], "cycle {cycle}: INVSESS wrote dst");
        }
        // Ids go on from the previous connection's: never reused.
        let mut sids = Vec::new();
        for key in &keys {
            for dir in [1u8, 2] {
                sids.push((
                    fe.create_session(&session(key, dir)).unwrap(),
                    key.clone(),
                    dir == 1,
                ));
            }
        }
        let ids: Vec<i64> = sids.iter().map(|s| s.0).collect();
        let from = prev_ids.last().map_or(1, |&l| l + 1);
        assert_eq!(
            ids,
            (from..from + 6).collect::<Vec<i64>>(),
            "cycle {cycle}: session ids"
        );
        let jobs: Vec<Job> = (0..300)
            .map(|i| {
                let (sid, key, encrypt) = &sids[i % sids.len()];
                let len = 16 * (1 + (rng.next() % 16) as usize);
                Job {
                    sid: *sid as u64,
                    encrypt: *encrypt,
                    key: key.clone(),
                    iv: rng.bytes(16),
                    src: rng.bytes(len),
                }
            })
            .collect();
        if cycle % 3 == 2 {
            // Disconnect mid-batch: 200 verified, 64 more left in flight.
            total += run_jobs(&mut fe, 0, &jobs[..200], 64, None);
            run_jobs(&mut fe, 0, &jobs[200..], 64, Some(64));
        } else {
            total += run_jobs(&mut fe, 0, &jobs, 64, None);
            if cycle % 2 == 0 {
                for &(sid, _, _) in &sids[..3] {
                    fe.close_session(sid as u64).unwrap();
                }
                let (st, len, _) = run_one(&mut fe, ENCRYPT, ids[0] as u64, &hex(NIST_PT));
                assert_eq!(
                    (st, len),
                    (ST_INVSESS, 1),
                    "cycle {cycle}: closed session {}",
                    ids[0]
                );
            }
        }
        if cycle == 0 {
            // The mapping check below can see guest memory: here it is mapped.
            assert!(
                daemon.snapshot().memfd_maps >= 1,
                "guest memory not seen in /proc/PID/maps"
            );
        }
        drop(fe);
        daemon.assert_alive(&format!("cycle {cycle}"));
        if cycle == 0 {
            first = Some(daemon.idle_snapshot());
        }
        prev_ids = ids;
    }
    let first = first.unwrap();
    let last = daemon.idle_snapshot();
    eprintln!("cycles: {total} requests verified; after cycle 1: {first:?}; after cycle 100: {last:?}");
    // Both snapshots are taken in the same state (one idle, freshly
    // accepted connection, the previous one torn down), and after cycle 1
    // everything opened once per process exists already, so the expected
    // difference is 0 (measured: 0). The slack of 2 only tolerates a
    // descriptor some library opens lazily on a rare path; a per-cycle
    // leak (the kick and call eventfds were leaking before ff2f6a9) is
    // 99 × k and far past it.
    assert!(
        last.fds <= first.fds + 2,
        "fd leak: {} after cycle 1, {} after cycle 100",
        first.fds,
        last.fds
    );
    assert_eq!(last.threads, first.threads, "thread count");
    assert_eq!(
        last.memfd_maps, 0,
        "guest memory of closed connections still mapped"
    );
    // RSS: measured +12..+30 KiB over 99 cycles (glibc reuses the arenas
    // of the per-connection threads). 4 MiB is about 40 KiB per cycle:
    // far above that noise, far below a leak of anything per connection
    // (its 2 MiB guest memory, threads' stacks, 6 sessions' key schedules
    // in 3 tables, 300 requests' buffers); leaked mappings are also
    // checked directly above.
    assert!(
        last.rss_kib <= first.rss_kib + 4096,
        "RSS grew from {} KiB to {} KiB",
        first.rss_kib,
        last.rss_kib
    );
    assert_nist(&daemon.sock, "100 cycles");
    daemon.assert_alive("100 cycles");
}

// ---- 4. malformed vhost-user messages ----

/// Reads what the daemon does with a bad request `req` sent with
/// NEED_REPLY: an error ack (non-zero u64) and/or a disconnect are fine; a
/// success ack, any other message, or neither within the timeout fail.
#[track_caller]
fn expect_refused(c: &Conn, req: u32, what: &str) -> &'static str {
    match c.recv() {
        Got::Closed => "disconnect",
        Got::TimedOut => panic!("{what}: neither a reply nor a disconnect"),
        Got::Msg(r, f, p) => {
            assert_eq!((r, f, p.len()), (req, REPLY | V1, 8), "{what}: reply header");
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

#[test]
fn malformed_messages_never_crash_the_daemon() {
    let mut daemon = Daemon::spawn(&[]);
    let base = daemon.idle_snapshot();
    let mem = memfd(MEM_SIZE);
    let ev = EventFd::new(EFD_NONBLOCK).unwrap();
    let efd = ev.as_raw_fd();
    let mut outcomes = Vec::new();
    // Closes the bad connection first: the daemon serves one frontend at a
    // time, so the next one is only served once this one is gone.
    let mut check = |daemon: &mut Daemon, c: Conn, what: &str, outcome: &'static str| {
        drop(c);
        daemon.assert_alive(what);
        assert_nist(&daemon.sock, what);
        outcomes.push(format!("{what}: {outcome}"));
    };

    // Payload size field over 4096, the payload not sent.
    for size in [4097u32, 0x10000, u32::MAX] {
        let c = Conn::negotiated(&daemon.sock);
        let mut h = Conn::message(SET_OWNER, V1 | NEED_REPLY, &[]);
        h[8..12].copy_from_slice(&size.to_le_bytes());
        c.send_bytes(&h, &[]).unwrap();
        let o = expect_refused(&c, SET_OWNER, "size field > 4096");
        assert_eq!(o, "disconnect", "size {size}");
        check(&mut daemon, c, &format!("size field {size}"), o);
    }
    // Size field larger than what is sent, then the frontend half-closes.
    for (req, size, sent) in [(SET_FEATURES, 8u32, 3usize), (CREATE_CRYPTO_SESSION, 1072, 500)] {
        let c = Conn::negotiated(&daemon.sock);
        let mut m = Conn::message(req, V1, &vec![0u8; sent]);
        m[8..12].copy_from_slice(&size.to_le_bytes());
        c.send_bytes(&m, &[]).unwrap();
        c.s.shutdown(Shutdown::Write).unwrap();
        let o = expect_refused(&c, req, "short payload");
        check(
            &mut daemon,
            c,
            &format!("request {req}: {sent} of {size} payload bytes, then close"),
            o,
        );
    }
    // Unknown request codes, with and without payload.
    for (req, payload) in [
        (0u32, vec![]),
        (99, vec![]),
        (0xFFFF, vec![]),
        (99, vec![0u8; 8]),
        (u32::MAX, vec![0u8; 40]),
    ] {
        let c = Conn::negotiated(&daemon.sock);
        c.send(req, V1 | NEED_REPLY, &payload, &[]).unwrap();
        let o = expect_refused(&c, req, "unknown request");
        check(
            &mut daemon,
            c,
            &format!("unknown request {req:#x} ({} bytes)", payload.len()),
            o,
        );
    }
    // Bad header flags: version 0 and 2, reserved bits.
    for flags in [0u32, 2, 0x100 | V1] {
        let c = Conn::negotiated(&daemon.sock);
        c.send(GET_FEATURES, flags, &[], &[]).unwrap();
        let o = match c.recv() {
            Got::Closed => "disconnect",
            other => panic!("GET_FEATURES with flags {flags:#x}: {other:?}"),
        };
        check(&mut daemon, c, &format!("header flags {flags:#x}"), o);
    }
    // Ring values h16 (tests/socket_smoke.rs) does not cover: sizes past
    // 16 bits that truncate to a valid size (0x10100 -> 256), 2^31 and
    // 32768 * 2; a base past 16 bits; SET_VRING_ENABLE with 2 and for ring 5.
    for (req, payload) in [
        (SET_VRING_NUM, vring_state(0, 0x1_0100)),
        (SET_VRING_NUM, vring_state(0, 1 << 31)),
        (SET_VRING_NUM, vring_state(0, 65536)),
        (SET_VRING_BASE, vring_state(0, 0x1_0000)),
        (SET_VRING_BASE, vring_state(0, u32::MAX)),
        (SET_VRING_ENABLE, vring_state(0, 2)),
        (SET_VRING_ENABLE, vring_state(5, 1)),
    ] {
        let c = Conn::negotiated(&daemon.sock);
        c.send(req, V1 | NEED_REPLY, &payload, &[]).unwrap();
        let o = expect_refused(&c, req, "bad ring value");
        let v = u32::from_le_bytes(payload[4..8].try_into().unwrap());
        let i = u32::from_le_bytes(payload[..4].try_into().unwrap());
        check(
            &mut daemon,
            c,
            &format!("request {req} for ring {i} with {v:#x}"),
            o,
        );
    }
    // Ring index 5 on a one-queue daemon (with memory set up).
    for (req, payload, fds) in [
        (SET_VRING_NUM, vring_state(5, 256), vec![]),
        (SET_VRING_BASE, vring_state(5, 0), vec![]),
        (
            SET_VRING_ADDR,
            vring_addr(5, UADDR + 0x1000, UADDR + 0x3000, UADDR + 0x2000),
            vec![],
        ),
        (SET_VRING_KICK, 5u64.to_le_bytes().to_vec(), vec![efd]),
        (SET_VRING_CALL, 5u64.to_le_bytes().to_vec(), vec![efd]),
        (SET_VRING_KICK, 0x105u64.to_le_bytes().to_vec(), vec![]),
        (GET_VRING_BASE, vring_state(5, 0), vec![]),
    ] {
        let c = Conn::negotiated(&daemon.sock);
        c.send(
            SET_MEM_TABLE,
            V1 | NEED_REPLY,
            &mem_table(&[(0, MEM_SIZE, UADDR, 0)]),
            &[mem.as_raw_fd()],
        )
        .unwrap();
        assert_eq!(c.reply_u64(SET_MEM_TABLE), 0, "SET_MEM_TABLE ack");
        c.send(req, V1 | NEED_REPLY, &payload, &fds).unwrap();
        let o = expect_refused(&c, req, "ring 5");
        check(&mut daemon, c, &format!("request {req} for ring 5"), o);
    }
    // SET_MEM_TABLE: 0 regions; a region without its fd; one region with
    // two fds; a region of size 0; 33 regions.
    let many: Vec<(u64, u64, u64, u64)> = (0..33)
        .map(|i| (i << 20, 1 << 20, UADDR + (i << 20), 0))
        .collect();
    for (name, payload, fds) in [
        ("0 regions", mem_table(&[]), vec![]),
        ("0 regions with an fd", mem_table(&[]), vec![mem.as_raw_fd()]),
        (
            "a region without fd",
            mem_table(&[(0, MEM_SIZE, UADDR, 0)]),
            vec![],
        ),
        (
            "a region with two fds",
            mem_table(&[(0, MEM_SIZE, UADDR, 0)]),
            vec![mem.as_raw_fd(), efd],
        ),
        (
            "a region of size 0",
            mem_table(&[(0, 0, UADDR, 0)]),
            vec![mem.as_raw_fd()],
        ),
        ("33 regions", mem_table(&many), vec![mem.as_raw_fd()]),
        (
            "num_regions 2, one region",
            {
                let mut p = mem_table(&[(0, MEM_SIZE, UADDR, 0)]);
                p[0] = 2;
                p
            },
            vec![mem.as_raw_fd()],
        ),
    ] {
        let c = Conn::negotiated(&daemon.sock);
        c.send(SET_MEM_TABLE, V1 | NEED_REPLY, &payload, &fds).unwrap();
        let o = expect_refused(&c, SET_MEM_TABLE, name);
        check(&mut daemon, c, &format!("SET_MEM_TABLE with {name}"), o);
    }
    // SET_FEATURES with bits the backend did not offer.
    for bits in [1u64 << 0, 1 << 63, 1 << 31, u64::MAX] {
        let c = Conn::negotiated(&daemon.sock);
        let offered = c.get_features();
        assert_eq!(
            offered & bits & (1 << 0 | 1 << 63 | 1 << 31),
            0,
            "offered {offered:#x}"
        );
        c.send(
            SET_FEATURES,
            V1 | NEED_REPLY,
            &(F_PROTOCOL_FEATURES | bits).to_le_bytes(),
            &[],
        )
        .unwrap();
        let o = expect_refused(&c, SET_FEATURES, "unoffered features");
        check(&mut daemon, c, &format!("SET_FEATURES with {bits:#x}"), o);
    }
    // Messages with fds they must not carry.
    for req in [GET_FEATURES, SET_OWNER] {
        let c = Conn::negotiated(&daemon.sock);
        c.send(req, V1 | NEED_REPLY, &[], &[efd]).unwrap();
        let o = expect_refused(&c, req, "stray fd");
        check(&mut daemon, c, &format!("request {req} with an fd"), o);
    }
    // Out of order: SET_VRING_ADDR before SET_MEM_TABLE (nothing to
    // translate the addresses with): refused.
    {
        let c = Conn::negotiated(&daemon.sock);
        c.send(SET_VRING_NUM, V1 | NEED_REPLY, &vring_state(0, 256), &[])
            .unwrap();
        assert_eq!(c.reply_u64(SET_VRING_NUM), 0);
        let p = vring_addr(0, UADDR + 0x1000, UADDR + 0x3000, UADDR + 0x2000);
        c.send(SET_VRING_ADDR, V1 | NEED_REPLY, &p, &[]).unwrap();
        let o = expect_refused(&c, SET_VRING_ADDR, "SET_VRING_ADDR before SET_MEM_TABLE");
        check(&mut daemon, c, "SET_VRING_ADDR before SET_MEM_TABLE", o);
    }
    // Out of order, but not invalid: the daemon may accept them; it must
    // stay consistent. Each then kicks the ring and checks the connection
    // still answers.
    let accepted = |c: &Conn, req: u32, payload: &[u8], fds: &[RawFd]| -> &'static str {
        c.send(req, V1 | NEED_REPLY, payload, fds).unwrap();
        match c.recv() {
            Got::Msg(r, f, p) if (r, f) == (req, REPLY | V1) && p == [0u8; 8] => "accepted",
            Got::Msg(r, f, p) if (r, f) == (req, REPLY | V1) && p.len() == 8 => "error ack",
            Got::Closed => "disconnect",
            other => panic!("request {req}: {other:?}"),
        }
    };
    {
        // SET_VRING_KICK before SET_MEM_TABLE, then a kick.
        let c = Conn::negotiated(&daemon.sock);
        let kick = EventFd::new(EFD_NONBLOCK).unwrap();
        let o = accepted(&c, SET_VRING_KICK, &0u64.to_le_bytes(), &[kick.as_raw_fd()]);
        if o == "accepted" {
            kick.write(1).unwrap();
            std::thread::sleep(Duration::from_millis(50));
            assert_ne!(c.get_features() & F_PROTOCOL_FEATURES, 0);
        }
        check(
            &mut daemon,
            c,
            "SET_VRING_KICK before SET_MEM_TABLE, then a kick",
            o,
        );
    }
    {
        // SET_VRING_ADDR before SET_VRING_NUM (memory set up), then KICK and a kick.
        let c = Conn::negotiated(&daemon.sock);
        c.send(
            SET_MEM_TABLE,
            V1 | NEED_REPLY,
            &mem_table(&[(0, MEM_SIZE, UADDR, 0)]),
            &[mem.as_raw_fd()],
        )
        .unwrap();
        assert_eq!(c.reply_u64(SET_MEM_TABLE), 0);
        let p = vring_addr(0, UADDR + 0x1000, UADDR + 0x3000, UADDR + 0x2000);
        let mut o = accepted(&c, SET_VRING_ADDR, &p, &[]);
        if o == "accepted" {
            let kick = EventFd::new(EFD_NONBLOCK).unwrap();
            o = accepted(&c, SET_VRING_KICK, &0u64.to_le_bytes(), &[kick.as_raw_fd()]);
            if o == "accepted" {
                kick.write(1).unwrap();
                std::thread::sleep(Duration::from_millis(50));
                assert_ne!(c.get_features() & F_PROTOCOL_FEATURES, 0);
            }
        }
        check(
            &mut daemon,
            c,
            "SET_VRING_ADDR before SET_VRING_NUM, then a kick",
            o,
        );
    }
    {
        // GET_VRING_BASE on a ring never started: base 0 for ring 0.
        let c = Conn::negotiated(&daemon.sock);
        c.send(GET_VRING_BASE, V1, &vring_state(0, 0), &[]).unwrap();
        let p = c.reply(GET_VRING_BASE);
        assert_eq!(p, vring_state(0, 0), "GET_VRING_BASE of a ring never started");
        assert_ne!(c.get_features() & F_PROTOCOL_FEATURES, 0);
        check(
            &mut daemon,
            c,
            "GET_VRING_BASE on a ring never started",
            "reply (0, 0)",
        );
    }
    drop(mem);
    drop(ev);
    let after = daemon.idle_snapshot();
    eprintln!("malformed messages:\n  {}", outcomes.join("\n  "));
    eprintln!("fds: {} before, {} after", base.fds, after.fds);
    assert!(
        after.fds <= base.fds + 2,
        "fd leak: {} before, {} after",
        base.fds,
        after.fds
    );
    assert_eq!(
        after.memfd_maps, 0,
        "guest memory of closed connections still mapped"
    );
}

/// A SET_MEM_TABLE region larger than the file behind it (1 MiB announced,
/// 64 KiB of memfd), then a ring in the part past the end of the file:
/// the daemon must refuse the table or the ring (error ack or disconnect),
/// not touch pages that do not exist (SIGBUS kills the whole daemon).
#[test]
fn memory_region_larger_than_its_file() {
    let mut daemon = Daemon::spawn(&[]);
    let c = Conn::negotiated(&daemon.sock);
    let small = memfd(64 << 10);
    let table = mem_table(&[(0, MEM_SIZE, UADDR, 0)]);
    c.send(SET_MEM_TABLE, V1 | NEED_REPLY, &table, &[small.as_raw_fd()])
        .unwrap();
    let mut outcome = format!("SET_MEM_TABLE: {}", accepted_or_refused(&c, SET_MEM_TABLE));
    if outcome.ends_with("accepted") {
        c.send(SET_VRING_NUM, V1 | NEED_REPLY, &vring_state(0, 256), &[])
            .unwrap();
        assert_eq!(c.reply_u64(SET_VRING_NUM), 0);
        // Descriptor table at 512 KiB, avail ring at 516 KiB, used ring at 520 KiB.
        let p = vring_addr(0, UADDR + 0x80000, UADDR + 0x82000, UADDR + 0x81000);
        c.send(SET_VRING_ADDR, V1 | NEED_REPLY, &p, &[]).unwrap();
        let o = accepted_or_refused(&c, SET_VRING_ADDR);
        outcome = format!("{outcome}; SET_VRING_ADDR past the end of the file: {o}");
        if o == "accepted" {
            let kick = EventFd::new(EFD_NONBLOCK).unwrap();
            let call = EventFd::new(EFD_NONBLOCK).unwrap();
            c.send(SET_VRING_KICK, V1, &0u64.to_le_bytes(), &[kick.as_raw_fd()])
                .unwrap();
            c.send(SET_VRING_CALL, V1, &0u64.to_le_bytes(), &[call.as_raw_fd()])
                .unwrap();
            kick.write(1).unwrap();
            std::thread::sleep(Duration::from_millis(50));
            c.send(GET_FEATURES, V1, &[], &[]).unwrap();
            let o = match c.recv() {
                Got::Msg(GET_FEATURES, ..) => "still served",
                Got::Closed => "disconnect",
                Got::TimedOut => "no answer",
                Got::Msg(..) => "unexpected message",
            };
            outcome = format!("{outcome}; kick: {o}");
        }
    }
    eprintln!("region larger than its file: {outcome}");
    drop(c);
    daemon.assert_alive(&format!("a memory region larger than its file ({outcome})"));
    assert_nist(&daemon.sock, "a memory region larger than its file");
}

/// Like `expect_refused` but a success ack is fine too.
fn accepted_or_refused(c: &Conn, req: u32) -> &'static str {
    match c.recv() {
        Got::Msg(r, f, p) if (r, f) == (req, REPLY | V1) && p == [0u8; 8] => "accepted",
        Got::Msg(r, f, p) if (r, f) == (req, REPLY | V1) && p.len() == 8 => "error ack",
        Got::Closed => "disconnect",
        other => panic!("request {req}: {other:?}"),
    }
}

// ---- 5. session-message floods ----

/// Sends `msgs` from a writer thread on a clone of `s` while this thread
/// reads one CREATE reply (layout C) per message; returns the ids.
fn pipelined_creates(s: &UnixStream, msgs: Vec<u8>, count: usize) -> Vec<i64> {
    let w = s.try_clone().unwrap();
    let writer = std::thread::spawn(move || (&w).write_all(&msgs));
    let mut r = BufReader::with_capacity(1 << 16, s.try_clone().unwrap());
    let mut ids = Vec::with_capacity(count);
    let mut reply = vec![0u8; 12 + 1072];
    for i in 0..count {
        r.read_exact(&mut reply)
            .unwrap_or_else(|e| panic!("CREATE reply {i}: {e}"));
        assert_eq!(
            &reply[..12],
            &Conn::message(CREATE_CRYPTO_SESSION, REPLY | V1, &[0; 1072])[..12]
        );
        ids.push(i64::from_le_bytes(reply[12 + 1064..].try_into().unwrap()));
    }
    writer.join().unwrap().unwrap();
    ids
}

#[test]
fn session_flood() {
    const N: usize = 100_000;
    let mut daemon = Daemon::spawn(&["--max-sessions", "64"]);
    let s = UnixStream::connect(&daemon.sock).unwrap();
    s.set_read_timeout(Some(TIMEOUT)).unwrap();
    s.set_write_timeout(Some(TIMEOUT)).unwrap();
    let raw = s.try_clone().unwrap();
    let mut fe = CryptoFrontend::from_stream(s, &cfg(SessionAbi::C, 1, 64, 8, 64)).unwrap();
    // Warm up the data path, then measure.
    let warm = fe.create_session(&session(&hex(NIST_KEY), 1)).unwrap();
    assert_eq!(warm, 1);
    assert_eq!(
        run_one(&mut fe, ENCRYPT, 1, &hex(NIST_PT)),
        (ST_OK, 65, hex(NIST_CT))
    );
    fe.close_session(1).unwrap();
    let before = daemon.snapshot();
    let log_before = daemon.log_len();
    let t = Instant::now();

    // 100,000 CREATEs with a 17-byte key: all -ERR, no disconnect.
    let mut bad = session(&hex(NIST_KEY), 1);
    bad.key_len = 17;
    let one = create_request(SessionAbi::C, &bad);
    let ids = pipelined_creates(&raw, one.repeat(N), N);
    assert!(ids.iter().all(|&id| id == ID_ERR), "17-byte key: {:?}", &ids[..4]);
    let t_bad = t.elapsed();

    // 100,000 valid CREATEs past --max-sessions 64: ids 2..=65 (1 was
    // used and closed), then -NOSPC.
    let mut msgs = Vec::with_capacity(N * 1084);
    for i in 0..N {
        let dir = if i % 2 == 0 { 1 } else { 2 };
        msgs.extend_from_slice(&create_request(SessionAbi::C, &session(&hex(NIST_KEY), dir)));
    }
    let ids = pipelined_creates(&raw, msgs, N);
    let expect: Vec<i64> = (2..=65).collect();
    assert_eq!(&ids[..64], &expect[..], "the first 64 sessions");
    assert!(
        ids[64..].iter().all(|&id| id == ID_NOSPC),
        "past the limit: {:?}",
        &ids[64..68]
    );
    let t_valid = t.elapsed();

    // 100,000 CLOSEs of ids never created (and 0, u64::MAX): no reply, ever.
    let mut msgs = Vec::with_capacity((N + 2) * 20);
    for id in (66..66 + N as u64 - 2).chain([0, u64::MAX, 1]) {
        msgs.extend_from_slice(&close_request(id));
    }
    (&raw).write_all(&msgs).unwrap();
    // Barrier: GET_FEATURES; its reply must be the very next bytes.
    (&raw).write_all(&Conn::message(GET_FEATURES, V1, &[])).unwrap();
    let mut reply = [0u8; 20];
    (&raw).read_exact(&mut reply).unwrap();
    assert_eq!(
        &reply[..12],
        &Conn::message(GET_FEATURES, REPLY | V1, &[0; 8])[..12],
        "a CLOSE was answered"
    );
    raw.set_nonblocking(true).unwrap();
    let mut extra = [0u8; 64];
    match (&raw).read(&mut extra) {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
        other => panic!("bytes after the barrier reply: {other:?}"),
    }
    raw.set_nonblocking(false).unwrap();
    let t_close = t.elapsed();

    let after = daemon.snapshot();
    let log_bytes = daemon.log_len() - log_before;
    eprintln!(
        "session flood: 17-byte keys {t_bad:?}, valid {:?}, closes {:?}; RSS {} -> {} KiB; \
         fds {} -> {}; {log_bytes} bytes of log",
        t_valid - t_bad,
        t_close - t_valid,
        before.rss_kib,
        after.rss_kib,
        before.fds,
        after.fds
    );
    // Measured +100..+130 KiB. The flood may cost at most the 64 live
    // sessions (a few KiB each in 1 table) and fixed buffers: 4 MiB is far
    // above that and far below anything kept per message (300,000 messages
    // at even 16 bytes each would be 4.6 MiB).
    assert!(
        after.rss_kib <= before.rss_kib + 4096,
        "RSS grew from {} KiB to {} KiB",
        before.rss_kib,
        after.rss_kib
    );
    assert_eq!(after.fds, before.fds, "fds during the flood");
    // The guest can repeat refused CREATEs at will: the log must not grow
    // per message (one warning line per connection is about 100 bytes;
    // before ff2f6a9 each refusal logged a line: 10 MB here).
    assert!(log_bytes < 64 << 10, "{log_bytes} bytes of log for the flood");

    // Requests still work: the 64 live sessions (2 = encrypt, 3 = decrypt,
    // …), 66.. and the closed 1 are unknown.
    assert_eq!(
        run_one(&mut fe, ENCRYPT, 2, &hex(NIST_PT)),
        (ST_OK, 65, hex(NIST_CT))
    );
    assert_eq!(
        run_one(&mut fe, DECRYPT, 65, &hex(NIST_CT)),
        (ST_OK, 65, hex(NIST_PT))
    );
    for sid in [1u64, 66, 100_000] {
        let (st, len, _) = run_one(&mut fe, ENCRYPT, sid, &hex(NIST_PT));
        assert_eq!((st, len), (ST_INVSESS, 1), "session {sid}");
    }
    // Closing a live one frees a slot: the next CREATE gets 66.
    fe.close_session(2).unwrap();
    assert_eq!(fe.create_session(&session(&hex(NIST_KEY), 1)).unwrap(), 66);
    drop(fe);
    drop(raw);
    daemon.assert_alive("the session flood");
    assert_nist(&daemon.sock, "the session flood");
}

/// Sessions created and closed over and over with no request in between,
/// on a four-queue daemon (QEMU only ever starts data queue 0): whatever a
/// queue keeps per session must go away with the session, not pile up until
/// the queue next runs. Then sessions come and go while every queue is busy.
#[test]
fn session_churn_without_requests_stays_bounded() {
    const N: usize = 50_000;
    let mut daemon = Daemon::spawn(&["--queues", "4", "--max-sessions", "64"]);
    let s = UnixStream::connect(&daemon.sock).unwrap();
    s.set_read_timeout(Some(TIMEOUT)).unwrap();
    s.set_write_timeout(Some(TIMEOUT)).unwrap();
    let raw = s.try_clone().unwrap();
    let mut fe = CryptoFrontend::from_stream(s, &cfg(SessionAbi::C, 4, 256, 64, 256)).unwrap();
    let key = hex(NIST_KEY);
    assert_eq!(fe.create_session(&session(&key, 1)).unwrap(), 1);
    assert_eq!(
        run_one(&mut fe, ENCRYPT, 1, &hex(NIST_PT)),
        (ST_OK, 65, hex(NIST_CT))
    );
    let before = daemon.snapshot();

    // CREATE (id 2 + i, known in advance) and CLOSE of that id, pipelined.
    let mut msgs = Vec::with_capacity(N * (1084 + 20));
    for i in 0..N {
        msgs.extend_from_slice(&create_request(SessionAbi::C, &session(&key, 1 + (i % 2) as u8)));
        msgs.extend_from_slice(&close_request(2 + i as u64));
    }
    let t = Instant::now();
    let ids = pipelined_creates(&raw, msgs, N);
    assert!(
        ids.iter().enumerate().all(|(i, &id)| id == 2 + i as i64),
        "ids of create/close pairs: {:?}",
        &ids[..4]
    );
    (&raw).write_all(&Conn::message(GET_FEATURES, V1, &[])).unwrap();
    let mut reply = [0u8; 20];
    (&raw).read_exact(&mut reply).unwrap();
    assert_eq!(reply[..4], GET_FEATURES.to_le_bytes());
    let after = daemon.snapshot();
    eprintln!(
        "session churn: {N} create/close pairs in {:?}; RSS {} -> {} KiB",
        t.elapsed(),
        before.rss_kib,
        after.rss_kib
    );
    // Each session holds an expanded AES key per queue (hundreds of bytes):
    // 50,000 of them kept on 4 queues would be tens of MiB.
    assert!(
        after.rss_kib <= before.rss_kib + 4096,
        "RSS grew from {} KiB to {} KiB with no session live",
        before.rss_kib,
        after.rss_kib
    );
    // Closed sessions are gone on every queue; a new one works on every queue.
    let next = fe.create_session(&session(&key, 1)).unwrap();
    assert_eq!(next, 2 + N as i64);
    for q in 0..4 {
        for (sid, want) in [
            (2u64, ST_INVSESS),
            (1 + N as u64, ST_INVSESS),
            (next as u64, ST_OK),
        ] {
            let slot = put_request(&mut fe, q, ENCRYPT, sid, &hex(NIST_IV), &hex(NIST_PT));
            fe.queues[q].publish_and_kick().unwrap();
            let mut done = Vec::new();
            fe.queues[q].reap(&mut done, TIMEOUT).unwrap();
            assert_eq!(done[0].slot, slot);
            let (st, _, dst) = result(&fe, q, done[0], 64);
            assert_eq!(st, want, "queue {q} session {sid}");
            if want == ST_OK {
                assert_eq!(dst, hex(NIST_CT), "queue {q}");
            }
        }
    }

    // Sessions come and go while all four queues have requests in flight.
    let mut rng = Rng(3);
    let mut jobs: Vec<Vec<Job>> = (0..4)
        .map(|_| {
            (0..64)
                .map(|_| Job {
                    sid: next as u64,
                    encrypt: true,
                    key: key.clone(),
                    iv: rng.bytes(16),
                    src: rng.bytes(256),
                })
                .collect()
        })
        .collect();
    for round in 0..20 {
        let mut slots = Vec::new();
        for (q, js) in jobs.iter().enumerate() {
            let s: Vec<u16> = js
                .iter()
                .map(|j| put_request(&mut fe, q, ENCRYPT, j.sid, &j.iv, &j.src))
                .collect();
            fe.queues[q].publish_and_kick().unwrap();
            slots.push(s);
        }
        let id = fe.create_session(&session(&key, 2)).unwrap();
        assert!(id > next, "round {round}: id {id}");
        fe.close_session(id as u64).unwrap();
        for (q, js) in jobs.iter().enumerate() {
            let mut done = Vec::new();
            while done.len() < js.len() {
                fe.queues[q].reap(&mut done, TIMEOUT).unwrap();
            }
            for u in done {
                let i = slots[q].iter().position(|&s| s == u.slot).unwrap();
                let j = &js[i];
                let (st, len, dst) = result(&fe, q, u, 256);
                assert_eq!((st, len), (ST_OK, 257), "round {round} queue {q} job {i}");
                assert!(
                    dst == oracle(true, &j.key, &j.iv, &j.src),
                    "round {round} queue {q} job {i}"
                );
            }
        }
        for js in &mut jobs {
            for j in js.iter_mut() {
                j.iv = rng.bytes(16);
            }
        }
    }
    drop(fe);
    drop(raw);
    daemon.assert_alive("the session churn");
    assert_nist(&daemon.sock, "the session churn");
}

/// A frontend may send its next request before reading the previous reply
/// (the replies are in request order on the stream): the daemon answers
/// some requests itself (CREATE) and forwards the others, and the replies
/// must still come back in request order.
#[test]
fn pipelined_requests_get_replies_in_order() {
    let daemon = Daemon::spawn(&["--max-sessions", "100000"]);
    let c = Conn::negotiated(&daemon.sock);
    let create = create_request(SessionAbi::C, &session(&hex(NIST_KEY), 1)).to_vec();
    let get = |req: u32| Conn::message(req, V1, &[]);
    let set_features = Conn::message(SET_FEATURES, V1 | NEED_REPLY, &F_PROTOCOL_FEATURES.to_le_bytes());
    // (name, messages sent back to back, replies expected in this order)
    let sequences = [
        (
            "GET_FEATURES, CREATE",
            vec![get(GET_FEATURES), create.clone()],
            vec![GET_FEATURES, CREATE_CRYPTO_SESSION],
        ),
        (
            "SET_FEATURES with NEED_REPLY, CREATE",
            vec![set_features, create.clone()],
            vec![SET_FEATURES, CREATE_CRYPTO_SESSION],
        ),
        (
            "GET_PROTOCOL_FEATURES, CREATE, GET_FEATURES",
            vec![get(GET_PROTOCOL_FEATURES), create.clone(), get(GET_FEATURES)],
            vec![GET_PROTOCOL_FEATURES, CREATE_CRYPTO_SESSION, GET_FEATURES],
        ),
    ];
    let mut out_of_order = Vec::new();
    for (name, msgs, want) in &sequences {
        let mut bad = 0;
        for _ in 0..200 {
            c.send_bytes(&msgs.concat(), &[]).unwrap();
            let got: Vec<u32> = want
                .iter()
                .map(|_| match c.recv() {
                    Got::Msg(r, f, _) => {
                        assert_eq!(f, REPLY | V1, "{name}: reply flags");
                        r
                    }
                    other => panic!("{name}: {other:?}"),
                })
                .collect();
            let mut sorted = got.clone();
            sorted.sort_unstable();
            let mut want_sorted = want.clone();
            want_sorted.sort_unstable();
            assert_eq!(sorted, want_sorted, "{name}: one reply per request");
            if got != *want {
                bad += 1;
            }
        }
        if bad > 0 {
            out_of_order.push(format!("{name}: {bad} of 200 out of order"));
        }
    }
    assert!(
        out_of_order.is_empty(),
        "replies out of request order: {out_of_order:?}"
    );
}

/// A second frontend that connects while the first is served waits (the
/// daemon serves one at a time), sees nothing of the first one's state once
/// it is served, and its early requests are answered then.
#[test]
fn a_waiting_frontend_is_served_fresh_after_the_first_leaves() {
    // At most 3 live sessions: the first frontend's would fill a registry
    // carried over to the second.
    let mut daemon = Daemon::spawn(&["--max-sessions", "3"]);
    let mut first = frontend(&daemon.sock, &cfg(SessionAbi::C, 1, 64, 8, 64));
    for want in 1..=3 {
        assert_eq!(first.create_session(&session(&hex(NIST_KEY), 1)).unwrap(), want);
    }
    // The second one sends GET_FEATURES right away.
    let second = Conn::open(&daemon.sock);
    second.send(GET_FEATURES, V1, &[], &[]).unwrap();
    second
        .s
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    assert!(
        matches!(second.recv(), Got::TimedOut),
        "served while the first frontend is"
    );
    assert_eq!(
        run_one(&mut first, ENCRYPT, 3, &hex(NIST_PT)),
        (ST_OK, 65, hex(NIST_CT))
    );
    drop(first);
    second.s.set_read_timeout(Some(TIMEOUT)).unwrap();
    assert_ne!(second.reply_u64(GET_FEATURES) & F_PROTOCOL_FEATURES, 0);
    let create = create_request(SessionAbi::C, &session(&hex(NIST_KEY), 1));
    second.send_bytes(&create, &[]).unwrap();
    let p = second.reply(CREATE_CRYPTO_SESSION);
    let id = i64::from_le_bytes(p[1064..1072].try_into().unwrap());
    // Fresh state (not NOSPC), and an id the first frontend never had.
    assert_eq!(id, 4, "the waiting frontend's first session id");
    drop(second);
    daemon.assert_alive("two frontends in a row");
    assert_nist(&daemon.sock, "two frontends in a row");
}

/// A memfd made with `MFD_ALLOW_SEALING` (and MFD_CLOEXEC), no seals yet.
fn sealable_memfd(size: u64) -> File {
    // SAFETY: a valid NUL-terminated name; the result is checked.
    let fd = unsafe {
        libc::memfd_create(
            c"frontend-faults".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    assert!(fd >= 0, "memfd_create: {}", io::Error::last_os_error());
    // SAFETY: a fresh descriptor we own.
    let f = unsafe { File::from_raw_fd(fd) };
    f.set_len(size).unwrap();
    f
}

/// fcntl(F_GET_SEALS), or -1 for a file without seals.
fn seals(f: &File) -> i32 {
    // SAFETY: F_GET_SEALS on a descriptor we own; no memory is passed.
    unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GET_SEALS) }
}

/// Split-ring descriptor flags (VIRTIO 1.2 §2.7.5).
const VRING_DESC_F_NEXT: u16 = 1;
const VRING_DESC_F_WRITE: u16 = 2;
const VRING_DESC_F_INDIRECT: u16 = 4;

/// Where [`submit_raw_nist`] puts a request: header, IV, src (0x12000),
/// dst, status, 4 KiB apart ([`submit_nist_at`]), then the ring
/// (descriptors, avail ring, used ring) at 512 KiB.
const RAW_HDR: u64 = 0x10000;
const RAW_IV: u64 = 0x11000;
const RAW_DST: u64 = 0x13000;
const RAW_STATUS: u64 = 0x14000;
const RAW_DESC: u64 = 0x80000;
const RAW_AVAIL: u64 = 0x81000;
const RAW_USED: u64 = 0x82000;

/// One NIST F.2.1 encryption written straight into a raw guest memory file
/// with pwrite (the daemon sees the same pages through its mapping): a
/// direct 5-descriptor chain (header, IV, src, dst, status) at head 0 of the
/// ring at 512 KiB (avail ring +4 KiB, used ring +8 KiB), published as the
/// `n`th avail entry; kicks and waits for the call eventfd, then returns
/// (used id, used length, status, dst).
fn raw_nist_request(mem: &File, kick: &EventFd, call: &EventFd, sid: u64, n: u16) -> (u32, u32, u8, Vec<u8>) {
    submit_raw_nist(mem, kick, sid, n);
    await_call(call, "for the request");
    raw_nist_result(mem, n)
}

/// Waits up to [`TIMEOUT`] for a used-buffer notification on `call`
/// (`after` says what it should follow, for the failure message).
#[track_caller]
fn await_call(call: &EventFd, after: &str) {
    let start = Instant::now();
    while call.read().is_err() {
        assert!(start.elapsed() < TIMEOUT, "no used-buffer notification {after}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The guest's part of [`raw_nist_request`]: writes the request, publishes
/// it as the `n`th avail entry and kicks.
fn submit_raw_nist(mem: &File, kick: &EventFd, sid: u64, n: u16) {
    submit_nist_at(mem, kick, RAW_DESC, RAW_HDR, sid, n);
}

/// [`submit_raw_nist`] for a ring at `ring_at` (avail ring +4 KiB) whose
/// buffers lie at `buf_at` (header; IV, src, dst and status 4 KiB apart
/// after it): [`RAW_DESC`] and [`RAW_HDR`] are the usual ones.
fn submit_nist_at(mem: &File, kick: &EventFd, ring_at: u64, buf_at: u64, sid: u64, n: u16) {
    use std::os::unix::fs::FileExt;
    let (desc, avail) = (ring_at, ring_at + 0x1000);
    let chain = put_nist_buffers(mem, sid, buf_at, 0x1000);
    write_chain(mem, desc, &chain);
    // avail.ring[n - 1] = head 0, then avail.idx = n.
    mem.write_all_at(&0u16.to_le_bytes(), avail + 4 + 2 * u64::from(n - 1))
        .unwrap();
    mem.write_all_at(&n.to_le_bytes(), avail + 2).unwrap();
    kick.write(1).unwrap();
}

/// Writes the buffers of a NIST F.2.1 encryption in session `sid` into
/// `mem`: header at `at`, then IV, src, dst and status each `step` bytes
/// further (dst and status filled with canaries), and returns the chain
/// that names them (header, IV, src, dst, status) for [`write_chain`].
fn put_nist_buffers(mem: &File, sid: u64, at: u64, step: u64) -> [(u64, u32, u16); 5] {
    use std::os::unix::fs::FileExt;
    let [hdr_at, iv_at, src_at, dst_at, status_at] = [0, 1, 2, 3, 4].map(|k| at + k * step);
    mem.write_all_at(&common::hdr(ENCRYPT, sid, 64, 64).to_bytes(), hdr_at)
        .unwrap();
    mem.write_all_at(&hex(NIST_IV), iv_at).unwrap();
    mem.write_all_at(&hex(NIST_PT), src_at).unwrap();
    mem.write_all_at(&[0xEE; 64], dst_at).unwrap();
    mem.write_all_at(&[0xFF], status_at).unwrap();
    [
        (hdr_at, 72, 0),
        (iv_at, 16, 0),
        (src_at, 64, 0),
        (dst_at, 64, VRING_DESC_F_WRITE),
        (status_at, 1, VRING_DESC_F_WRITE),
    ]
}

/// Creates the NIST F.2.1 encrypt session (AES-128, layout C) on a raw
/// connection; its id (≥ 1; ids go on from the daemon's earlier
/// connections).
#[track_caller]
fn create_nist_session(c: &Conn) -> u64 {
    let sid = create_nist_session_id(c);
    assert!(sid >= 1, "session id {sid}");
    sid as u64
}

/// Sends the CREATE of [`create_nist_session`] and returns the id replied.
#[track_caller]
fn create_nist_session_id(c: &Conn) -> i64 {
    c.send_bytes(&create_request(SessionAbi::C, &session(&hex(NIST_KEY), 1)), &[])
        .unwrap();
    let p = c.reply(CREATE_CRYPTO_SESSION);
    i64::from_le_bytes(p[1064..1072].try_into().unwrap())
}

/// Request `n` of [`submit_raw_nist`] completed as NIST F.2.1 says: head 0,
/// used length 65, status OK, the F.2.1 ciphertext.
#[track_caller]
fn assert_raw_nist_ok(n: u16, (id, len, status, dst): (u32, u32, u8, Vec<u8>)) {
    assert_eq!(
        (id, len, status),
        (0, 65, ST_OK),
        "request {n}: used id, used length, status"
    );
    assert_eq!(dst, hex(NIST_CT), "request {n}: F.2.1 ciphertext");
}

/// The `n`th completion of [`submit_raw_nist`]'s requests: (used id, used
/// length, status, dst). Checks that `used.idx` is `n`.
fn raw_nist_result(mem: &File, n: u16) -> (u32, u32, u8, Vec<u8>) {
    use std::os::unix::fs::FileExt;
    let (dst_at, status_at, used) = (RAW_DST, RAW_STATUS, RAW_USED);
    let word = |at: u64, len: usize| {
        let mut b = [0u8; 4];
        mem.read_exact_at(&mut b[..len], at).unwrap();
        u32::from_le_bytes(b)
    };
    assert_eq!(word(used + 2, 2), u32::from(n), "used.idx");
    let elem = used + 4 + 8 * u64::from(n - 1);
    let mut dst = vec![0u8; 64];
    mem.read_exact_at(&mut dst, dst_at).unwrap();
    (word(elem, 4), word(elem + 4, 4), word(status_at, 1) as u8, dst)
}

/// Sets up data ring 0 at 512 KiB on a negotiated connection after a
/// SET_MEM_TABLE with `mem` (one 1 MiB region at guest address 0); every
/// message is acked with 0.
fn raw_ring(c: &Conn, mem: &File, kick: &EventFd, call: &EventFd) {
    raw_ring_index(c, mem, 0, kick, call);
}

/// [`raw_ring`] for data ring `index`.
fn raw_ring_index(c: &Conn, mem: &File, index: u32, kick: &EventFd, call: &EventFd) {
    set_mem_table(c, mem, &[(0, MEM_SIZE, UADDR, 0)]);
    raw_ring_at(c, index, RAW_DESC, kick, call);
}

/// SET_MEM_TABLE of `regions` (guest address, size, frontend address,
/// offset), all in `mem`; acked with 0.
#[track_caller]
fn set_mem_table(c: &Conn, mem: &File, regions: &[(u64, u64, u64, u64)]) {
    c.send(
        SET_MEM_TABLE,
        V1 | NEED_REPLY,
        &mem_table(regions),
        &[mem.as_raw_fd()],
    )
    .unwrap();
    assert_eq!(c.reply_u64(SET_MEM_TABLE), 0, "SET_MEM_TABLE");
}

/// On a negotiated connection: ring 0 in a fresh memory file
/// ([`raw_ring`]), the NIST session, and its first request served (NIST
/// F.2.1). Returns the memory, the ring's kick and call eventfds and the
/// session id.
fn ring_with_one_request_served(c: &Conn) -> (File, EventFd, EventFd, u64) {
    ring_with_one_request_served_at(c, 0)
}

/// [`ring_with_one_request_served`] on data ring `index`.
fn ring_with_one_request_served_at(c: &Conn, index: u32) -> (File, EventFd, EventFd, u64) {
    let mem = memfd(MEM_SIZE);
    let kick = EventFd::new(EFD_NONBLOCK).unwrap();
    let call = EventFd::new(EFD_NONBLOCK).unwrap();
    raw_ring_index(c, &mem, index, &kick, &call);
    let sid = create_nist_session(c);
    assert_raw_nist_ok(1, raw_nist_request(&mem, &kick, &call, sid, 1));
    (mem, kick, call, sid)
}

/// Sets up data ring `index` of 256 entries at guest address `at`
/// (descriptors; avail ring at +4 KiB, used ring at +8 KiB) with `kick` and
/// `call`; every message is acked with 0.
fn raw_ring_at(c: &Conn, index: u32, at: u64, kick: &EventFd, call: &EventFd) {
    let addr = vring_addr(index, UADDR + at, UADDR + at + 0x2000, UADDR + at + 0x1000);
    start_ring(c, index, Some(addr), kick, call);
}

/// Sends SET_VRING_NUM (256 entries), SET_VRING_BASE (0), the
/// SET_VRING_ADDR payload `addr` if there is one, SET_VRING_KICK `kick`
/// and SET_VRING_CALL `call` for data ring `index`; every message is acked
/// with 0.
fn start_ring(c: &Conn, index: u32, addr: Option<Vec<u8>>, kick: &EventFd, call: &EventFd) {
    let fd_message = u64::from(index).to_le_bytes().to_vec();
    let messages = [
        (SET_VRING_NUM, vring_state(index, 256), vec![]),
        (SET_VRING_BASE, vring_state(index, 0), vec![]),
    ]
    .into_iter()
    .chain(addr.map(|a| (SET_VRING_ADDR, a, vec![])))
    .chain([
        (SET_VRING_KICK, fd_message.clone(), vec![kick.as_raw_fd()]),
        (SET_VRING_CALL, fd_message, vec![call.as_raw_fd()]),
    ]);
    for (req, payload, fds) in messages {
        c.send(req, V1 | NEED_REPLY, &payload, &fds).unwrap();
        assert_eq!(c.reply_u64(req), 0, "request {req}");
    }
}

/// A frontend that starts a ring (SET_VRING_KICK, SET_VRING_CALL) without
/// ever sending SET_VRING_ADDR: vhost-user-backend leaves the ring's three
/// addresses at 0 and marks it ready, and the worker used to serve it
/// there, reading an avail ring and writing a used ring at guest address
/// 0 that the frontend never named. Now such a ring is not served until
/// its addresses come: guest memory below 12 KiB stays as the guest left
/// it (an avail index of 1 at guest address 2, every other byte 0x5A),
/// and once the frontend sends SET_VRING_ADDR and kicks, a NIST request
/// is served at the ring those addresses name.
#[test]
fn a_ring_started_without_addresses_is_not_served_at_guest_address_0() {
    use std::os::unix::fs::FileExt;
    let mut daemon = Daemon::spawn(&[]);
    let c = Conn::negotiated(&daemon.sock);
    let mem = sealable_memfd(MEM_SIZE);
    let kick = EventFd::new(EFD_NONBLOCK).unwrap();
    let call = EventFd::new(EFD_NONBLOCK).unwrap();
    let mut low = vec![0x5Au8; 0x3000];
    low[2..4].copy_from_slice(&1u16.to_le_bytes());
    mem.write_all_at(&low, 0).unwrap();
    set_mem_table(&c, &mem, &[(0, MEM_SIZE, UADDR, 0)]);
    start_ring(&c, 0, None, &kick, &call);
    let sid = create_nist_session(&c);
    for _ in 0..20 {
        kick.write(1).unwrap();
        std::thread::sleep(Duration::from_millis(10));
    }
    daemon.until_logged(
        "has no SET_VRING_ADDR addresses",
        TIMEOUT,
        "the ring without addresses",
    );
    assert_eq!(
        daemon
            .log_tail(1 << 20)
            .matches("has no SET_VRING_ADDR addresses")
            .count(),
        1,
        "logged once per connection"
    );
    assert_unchanged_from_0(&mem, &low, "started without addresses");
    let addr = vring_addr(
        0,
        UADDR + RAW_DESC,
        UADDR + RAW_DESC + 0x2000,
        UADDR + RAW_DESC + 0x1000,
    );
    c.send(SET_VRING_ADDR, V1 | NEED_REPLY, &addr, &[]).unwrap();
    assert_eq!(c.reply_u64(SET_VRING_ADDR), 0, "SET_VRING_ADDR");
    assert_raw_nist_ok(1, raw_nist_request(&mem, &kick, &call, sid, 1));
    drop(c);
    daemon.assert_alive("a ring started without addresses");
}

/// Checks that guest memory from address 0 still holds `was` (where the
/// frontend named no ring); names the first 16 bytes that changed.
#[track_caller]
fn assert_unchanged_from_0(mem: &File, was: &[u8], what: &str) {
    use std::os::unix::fs::FileExt;
    let mut now = vec![0u8; was.len()];
    mem.read_exact_at(&mut now, 0).unwrap();
    let changed: Vec<usize> = (0..now.len()).filter(|&i| now[i] != was[i]).collect();
    assert!(
        changed.is_empty(),
        "{what}: {} bytes written below {:#x}, where the frontend named no ring (at {:?})",
        changed.len(),
        was.len(),
        &changed[..changed.len().min(16)]
    );
}

/// A SET_VRING_ADDR that vhost-user-backend refuses half way: the used
/// ring's frontend address translates to guest address 0x82002 (the
/// second memory region's frontend address is 2 bytes off its guest
/// address), which is not 4-byte aligned, so the library sets the
/// descriptor table and the avail ring, leaves the used ring at 0 and ends
/// the connection. The ring was started (SET_VRING_KICK) before, and the
/// guest kicks all along with a request in its avail ring: until the
/// teardown, the worker served it with its used ring at guest address 0
/// (a second reviewer's finding, in 25 of 50 tries). Ten tries, each on a
/// connection of its own: guest memory below 12 KiB (0x5A) must stay as
/// it is, and the next frontend is served.
#[test]
fn a_ring_whose_set_vring_addr_failed_half_way_is_not_served_at_guest_address_0() {
    use std::os::unix::fs::FileExt;
    use std::sync::atomic::{AtomicBool, Ordering};
    let mut daemon = Daemon::spawn(&[]);
    for round in 0..10 {
        let c = Conn::negotiated(&daemon.sock);
        let mem = sealable_memfd(MEM_SIZE);
        let kick = EventFd::new(EFD_NONBLOCK).unwrap();
        let call = EventFd::new(EFD_NONBLOCK).unwrap();
        let low = vec![0x5Au8; 0x3000];
        mem.write_all_at(&low, 0).unwrap();
        // Descriptor table at 0x40000, avail ring at 0x41000 with one
        // NIST request (session 1, which does not exist: INVSESS).
        write_chain(&mem, 0x40000, &put_nist_buffers(&mem, 1, RAW_HDR, 0x1000));
        mem.write_all_at(&0u16.to_le_bytes(), 0x41000 + 4).unwrap();
        mem.write_all_at(&1u16.to_le_bytes(), 0x41000 + 2).unwrap();
        let half = MEM_SIZE / 2;
        let table = mem_table(&[(0, half, UADDR, 0), (half, half, UADDR + half + 2, half)]);
        let fds = [mem.as_raw_fd(), mem.as_raw_fd()];
        c.send(SET_MEM_TABLE, V1 | NEED_REPLY, &table, &fds).unwrap();
        assert_eq!(c.reply_u64(SET_MEM_TABLE), 0, "SET_MEM_TABLE");
        start_ring(&c, 0, None, &kick, &call);
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    let _ = kick.write(1);
                    std::thread::sleep(Duration::from_micros(100));
                }
            });
            std::thread::sleep(Duration::from_millis(20));
            // The used ring's frontend address is 4-byte aligned (the
            // vhost crate checks that); its guest address, 0x82002, is not.
            let addr = vring_addr(0, UADDR + 0x40000, UADDR + 0x82004, UADDR + 0x41000);
            let _ = c.send(SET_VRING_ADDR, V1, &addr, &[]);
            std::thread::sleep(Duration::from_millis(100));
            stop.store(true, Ordering::Relaxed);
        });
        drop(c);
        assert_unchanged_from_0(&mem, &low, &format!("try {round}"));
    }
    daemon.assert_alive("SET_VRING_ADDRs refused half way");
    assert_nist(&daemon.sock, "SET_VRING_ADDRs refused half way");
}

/// The frontend tries to shrink the guest memory file after SET_MEM_TABLE
/// (all sizes were right when the table was checked), under a live ring.
///
/// The memfd allows sealing but has no seal (a frontend that did not seal
/// it, unlike QEMU's memory-backend-memfd with its default `seal=on`): the
/// daemon adds F_SEAL_SHRINK at SET_MEM_TABLE, so the frontend's ftruncate
/// fails with EPERM (fcntl(2), "File sealing"), and requests on the ring
/// still complete with the NIST answer instead of the daemon dying of
/// SIGBUS on pages past the new end.
#[test]
fn memory_file_truncated_after_mem_table() {
    let mut daemon = Daemon::spawn(&[]);
    let c = Conn::negotiated(&daemon.sock);
    let mem = sealable_memfd(MEM_SIZE);
    assert_eq!(seals(&mem), 0, "a fresh MFD_ALLOW_SEALING memfd has no seals");
    let kick = EventFd::new(EFD_NONBLOCK).unwrap();
    let call = EventFd::new(EFD_NONBLOCK).unwrap();
    raw_ring(&c, &mem, &kick, &call);
    assert_eq!(seals(&mem), libc::F_SEAL_SHRINK, "seals after SET_MEM_TABLE");
    let e = mem.set_len(64 << 10).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPERM), "ftruncate to 64 KiB: {e}");
    let e = mem.set_len(0).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPERM), "ftruncate to 0: {e}");
    assert_eq!(mem.metadata().unwrap().len(), MEM_SIZE);

    // The ring (512 KiB, past the 64 KiB the frontend asked for) still works.
    let sid = create_nist_session(&c);
    for n in 1..=3u16 {
        assert_raw_nist_ok(n, raw_nist_request(&mem, &kick, &call, sid, n));
    }
    assert_ne!(c.get_features() & F_PROTOCOL_FEATURES, 0, "still served");
    drop(c);
    daemon.assert_alive("a frontend tried to shrink sealed guest memory");
    assert_nist(&daemon.sock, "a frontend tried to shrink sealed guest memory");
}

/// Both ends of a new pipe (blocking): (read end, write end).
fn pipe() -> (File, File) {
    let mut fds = [0; 2];
    // SAFETY: pipe(2) fills a 2-int array; the result is checked.
    let r = unsafe { libc::pipe(fds.as_mut_ptr()) };
    assert_eq!(r, 0, "pipe: {}", io::Error::last_os_error());
    // SAFETY: two fresh descriptors we own.
    unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) }
}

/// Clears `O_NONBLOCK` on a descriptor (on its open file, which the
/// daemon shares when the descriptor was sent to it).
fn clear_nonblock(fd: RawFd) {
    let flags = status_flags(fd);
    // SAFETY: fcntl(F_SETFL) with an int argument; touches no memory.
    let r = unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) };
    assert_eq!(r, 0, "F_SETFL: {}", io::Error::last_os_error());
}

/// A descriptor's status flags (`fcntl(F_GETFL)`).
fn status_flags(fd: RawFd) -> i32 {
    // SAFETY: fcntl(F_GETFL) takes no argument and touches no memory of ours.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    assert!(flags >= 0, "F_GETFL: {}", io::Error::last_os_error());
    flags
}

/// Ring descriptors that are not plain eventfds (vhost-user spec:
/// SET_VRING_KICK/CALL/ERR carry eventfds). vhost-user-backend reads 8
/// bytes from a kick descriptor when its epoll reports it readable, while
/// holding the ring's lock: a pipe holding one byte blocked the worker in
/// `read` for good (GET_VRING_BASE never answered; once the frontend left,
/// tearing the connection down waited for the worker, so no later frontend
/// was served), and an eventfd in semaphore mode, written 2^32 once, kept
/// the worker waking up at 100 % CPU. Each kind is now refused (an error
/// ack or a disconnect), the daemon stays up, and the next frontend gets
/// NIST F.2.1 right.
#[test]
fn ring_descriptors_that_are_not_plain_eventfds_are_refused() {
    let mut daemon = Daemon::spawn(&[]);
    let (kick_r, kick_w) = pipe();
    (&kick_w).write_all(b"x").unwrap();
    let (call_r, call_w) = pipe();
    let (sock, _peer) = UnixStream::pair().unwrap();
    let semaphore = EventFd::new(libc::EFD_SEMAPHORE).unwrap();
    semaphore.write(1 << 32).unwrap();
    let mut cases: Vec<(&str, u32, RawFd)> = vec![
        (
            "a pipe's read end holding one byte as kick",
            SET_VRING_KICK,
            kick_r.as_raw_fd(),
        ),
        ("a pipe's write end as call", SET_VRING_CALL, call_w.as_raw_fd()),
        ("a pipe's read end as err", SET_VRING_ERR, call_r.as_raw_fd()),
        ("a socket as kick", SET_VRING_KICK, sock.as_raw_fd()),
    ];
    let mem = memfd(4096);
    cases.push(("a memfd as call", SET_VRING_CALL, mem.as_raw_fd()));
    // SAFETY: epoll_create1(2) with no flags; the result is checked.
    let epoll = unsafe { libc::epoll_create1(0) };
    assert!(epoll >= 0, "epoll_create1: {}", io::Error::last_os_error());
    // SAFETY: a fresh descriptor we own.
    let epoll = unsafe { File::from_raw_fd(epoll) };
    cases.push((
        "an epoll descriptor (another anonymous inode) as kick",
        SET_VRING_KICK,
        epoll.as_raw_fd(),
    ));
    let fdinfo = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", semaphore.as_raw_fd())).unwrap();
    if fdinfo.contains("eventfd-semaphore:") {
        cases.push((
            "a semaphore eventfd as kick",
            SET_VRING_KICK,
            semaphore.as_raw_fd(),
        ));
    } else {
        eprintln!("this kernel does not show an eventfd's semaphore mode: that case is not run");
    }
    for (what, req, fd) in cases {
        let c = Conn::negotiated(&daemon.sock);
        c.send(req, V1 | NEED_REPLY, &0u64.to_le_bytes(), &[fd]).unwrap();
        let how = expect_refused(&c, req, what);
        eprintln!("{what}: {how}");
        drop(c);
        daemon.assert_alive(what);
    }
    assert!(
        daemon.log_tail(8000).contains("not an eventfd"),
        "the refusals are logged with their reason"
    );
    assert_nist(&daemon.sock, "ring descriptors that are not plain eventfds");
}

/// Kick and call eventfds are made non-blocking when they are set (the flag
/// lives on the open file, which the frontend shares, so it shows here),
/// and a call eventfd whose counter the frontend filled up (0xffff...fe,
/// the most it holds) neither blocks the worker nor floods the log: before,
/// a blocking call eventfd left the worker stuck in `write` after its
/// first batch. Three requests complete with NIST F.2.1 (watched through
/// `used.idx`, since the call eventfd cannot signal), one warning is
/// logged, and the frontend is still served.
#[test]
fn kick_and_call_eventfds_are_made_non_blocking() {
    let mut daemon = Daemon::spawn(&[]);
    let c = Conn::negotiated(&daemon.sock);
    let mem = sealable_memfd(MEM_SIZE);
    let kick = EventFd::new(0).unwrap();
    let call = EventFd::new(0).unwrap();
    assert_eq!(status_flags(kick.as_raw_fd()) & libc::O_NONBLOCK, 0);
    raw_ring(&c, &mem, &kick, &call);
    for (what, fd) in [("kick", kick.as_raw_fd()), ("call", call.as_raw_fd())] {
        assert_ne!(
            status_flags(fd) & libc::O_NONBLOCK,
            0,
            "{what} eventfd is non-blocking"
        );
    }
    let sid = create_nist_session(&c);
    call.write(u64::MAX - 1).unwrap();
    let log_before = daemon
        .log_tail(1 << 20)
        .matches("signalling the call eventfd failed")
        .count();
    for n in 1..=3u16 {
        submit_raw_nist(&mem, &kick, sid, n);
        let start = Instant::now();
        while ring0_used_u16(&mem, 2) != n {
            assert!(start.elapsed() < TIMEOUT, "request {n} not completed");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_raw_nist_ok(n, raw_nist_result(&mem, n));
    }
    assert_ne!(c.get_features() & F_PROTOCOL_FEATURES, 0, "still served");
    let warnings = daemon
        .log_tail(1 << 20)
        .matches("signalling the call eventfd failed")
        .count();
    assert_eq!(
        (log_before, warnings),
        (0, 1),
        "warnings before and after the three requests"
    );
    drop(c);
    daemon.assert_alive("a call eventfd that cannot be written");
    assert!(
        daemon
            .log_tail(1 << 20)
            .contains("3 used-buffer notifications could not be signalled on this connection"),
        "the failures are counted at the end of the connection:\n{}",
        daemon.log_tail(8000)
    );
    assert_nist(&daemon.sock, "a call eventfd that cannot be written");
}

/// The names (`comm`) of `pid`'s threads, sorted.
fn thread_names(pid: u32) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .map(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .unwrap_or_default()
                .trim()
                .to_string()
        })
        .collect();
    names.sort();
    names
}

/// The syscall each `vring_worker` thread of process `pid` is in (the
/// first field of /proc/PID/task/TID/syscall: a number, or "running").
fn vring_worker_syscalls(pid: u32) -> Vec<String> {
    let mut out = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim() == "vring_worker" {
            let sc = std::fs::read_to_string(t.path().join("syscall")).unwrap_or_default();
            out.push(sc.split_whitespace().next().unwrap_or("").to_string());
        }
    }
    out
}

/// Waits until a `vring_worker` of `pid` sits in syscall `nr`
/// (`libc::SYS_read`, `libc::SYS_write`) twice 20 ms apart, calling `poke`
/// before each look; up to 4 × [`TIMEOUT`]: getting there can take a race
/// that two workers must run for at once, which took more than
/// [`TIMEOUT`] in 2 of 34 runs of this file on 2 CPUs while other builds
/// and tests ran beside it.
fn until_a_worker_blocks_in(pid: u32, nr: libc::c_long, mut poke: impl FnMut()) {
    let start = Instant::now();
    loop {
        poke();
        std::thread::sleep(Duration::from_millis(2));
        if a_worker_sits_in(pid, nr) {
            return;
        }
        assert!(
            start.elapsed() < 4 * TIMEOUT,
            "no worker blocked in syscall {nr}: {:?}",
            vring_worker_syscalls(pid)
        );
    }
}

/// Fails if a `vring_worker` of `pid` is seen in syscall `nr` twice 20 ms
/// apart during `within`, calling `poke` before each look (the opposite
/// of [`until_a_worker_blocks_in`]). A wait that needs a race between two
/// workers may take a while: the shared-kick test's old read was seen
/// after 22–826 ms in each of 20 runs (its reviewer), but on busy CPUs
/// such a race took more than 5 s in 2 of 34 runs, so a single run may
/// miss one.
fn no_worker_waits_in(pid: u32, nr: libc::c_long, within: Duration, mut poke: impl FnMut()) {
    let start = Instant::now();
    let mut looks = 0u32;
    while start.elapsed() < within {
        poke();
        std::thread::sleep(Duration::from_millis(2));
        looks += 1;
        assert!(
            !a_worker_sits_in(pid, nr),
            "a worker waits in syscall {nr} after {looks} pokes in {:?}: {:?}",
            start.elapsed(),
            vring_worker_syscalls(pid)
        );
    }
}

/// Whether a `vring_worker` of `pid` is in syscall `nr` now and still 20
/// ms later (one that is only passing through is not counted).
fn a_worker_sits_in(pid: u32, nr: libc::c_long) -> bool {
    let nr = &nr.to_string();
    let seen = || vring_worker_syscalls(pid).iter().any(|s| s == nr);
    seen() && {
        std::thread::sleep(Duration::from_millis(20));
        seen()
    }
}

/// A daemon (`extra` arguments) whose ring 0 worker is blocked writing its
/// call eventfd: ring 0 set up ([`raw_ring`]) and then `more`, the NIST
/// session, then the frontend fills the call eventfd's counter, clears the
/// `O_NONBLOCK` the daemon set on it (the flag is on the open file they
/// share) and submits a request; returned once a worker sits in `write`.
struct BlockedOnCall {
    daemon: Daemon,
    c: Conn,
    mem: File,
    _kick: EventFd,
    _call: EventFd,
}

/// Gives ring 0 `n` new call eventfds, one after another (returned, to
/// keep them open), then waits for the reply to a second CREATE: the
/// daemon's proxy answers it in order, so it has taken every message
/// before it (the proxy ends a connection as soon as the frontend closes,
/// whatever it has not read).
fn replace_call_eventfd(c: &Conn, n: usize) -> Vec<EventFd> {
    let new: Vec<EventFd> = (0..n).map(|_| EventFd::new(EFD_NONBLOCK).unwrap()).collect();
    for e in &new {
        c.send(SET_VRING_CALL, V1, &0u64.to_le_bytes(), &[e.as_raw_fd()])
            .unwrap();
    }
    assert_eq!(create_nist_session_id(c), 2);
    new
}

impl BlockedOnCall {
    fn start(extra: &[&str], more: impl FnOnce(&Conn)) -> BlockedOnCall {
        let daemon = Daemon::spawn(extra);
        let c = Conn::negotiated(&daemon.sock);
        let mem = sealable_memfd(MEM_SIZE);
        let kick = EventFd::new(EFD_NONBLOCK).unwrap();
        let call = EventFd::new(EFD_NONBLOCK).unwrap();
        raw_ring(&c, &mem, &kick, &call);
        more(&c);
        let sid = create_nist_session(&c);
        call.write(u64::MAX - 1).unwrap();
        clear_nonblock(call.as_raw_fd());
        submit_raw_nist(&mem, &kick, sid, 1);
        until_a_worker_blocks_in(daemon.pid(), libc::SYS_write, || {});
        BlockedOnCall {
            daemon,
            c,
            mem,
            _kick: kick,
            _call: call,
        }
    }
}

/// The frontend clears the `O_NONBLOCK` the daemon set on its call eventfd
/// (the flag is on the open file they share) and fills the counter: the
/// worker's used-buffer notification blocks in `write`. Found by two fresh
/// reviewers: tearing the connection down joined that worker forever, so
/// no later frontend was served. Now the daemon empties the call eventfd
/// through its own copy at teardown: the worker goes on, the next frontend
/// gets NIST F.2.1 right. Also when the frontend then gives the ring new
/// call eventfds (the library applies them only once the worker lets go;
/// found by a third reviewer), more than the copies kept per ring.
#[test]
fn a_frontend_clearing_o_nonblock_on_its_call_eventfd_cannot_wedge_the_daemon() {
    for replacements in [0, 1, EVENTFD_COPIES_PER_RING - 1] {
        let what = format!("a worker blocked writing the call eventfd, {replacements} new ones since");
        let BlockedOnCall {
            mut daemon, c, mem, ..
        } = BlockedOnCall::start(&[], |_| {});
        // The request was completed before the notification blocked.
        assert_raw_nist_ok(1, raw_nist_result(&mem, 1));
        let _new = replace_call_eventfd(&c, replacements);
        drop(c);
        daemon.assert_alive(&what);
        assert_nist(&daemon.sock, &what);
        assert!(
            daemon
                .log_tail(8000)
                .contains("waking any queue worker blocked on an eventfd"),
            "{what}: {}",
            daemon.log_tail(8000)
        );
    }
}

/// The last resort: a frontend that blocks a worker on its call eventfd
/// (as above) and then gives the ring more new call eventfds than the
/// daemon keeps copies of ([`EVENTFD_COPIES_PER_RING`]) leaves a worker the
/// daemon cannot wake. It then exits with status 3 once the workers have
/// used no CPU for 10 s, saying why, rather than serving nobody for good.
/// Also when the frontend, gone, keeps kicking a second ring's worker
/// through the kick eventfd it still holds, so that some worker always
/// uses a little CPU (found by a fifth reviewer: the daemon then never
/// exited); the cap on the whole teardown ends it then, a fraction of a
/// second later with the default request size.
#[test]
fn a_worker_that_cannot_be_woken_ends_the_daemon_with_status_3() {
    for kicks_after_leaving in [false, true] {
        let (kick1, call1) = (
            EventFd::new(EFD_NONBLOCK).unwrap(),
            EventFd::new(EFD_NONBLOCK).unwrap(),
        );
        let BlockedOnCall { mut daemon, c, .. } =
            BlockedOnCall::start(&["--queues", "2"], |c| raw_ring_at(c, 1, 0x84000, &kick1, &call1));
        let _new = replace_call_eventfd(&c, EVENTFD_COPIES_PER_RING);
        drop(c);
        let start = Instant::now();
        let status = loop {
            if let Some(status) = daemon.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "kicks after leaving {kicks_after_leaving}: still running after 20 s\n{}",
                daemon.log_tail(4000)
            );
            if kicks_after_leaving {
                let _ = kick1.write(1);
                std::thread::sleep(Duration::from_millis(2));
            } else {
                std::thread::sleep(Duration::from_millis(50));
            }
        };
        let log = daemon.log_tail(4000);
        assert_eq!(status.code(), Some(3), "{log}");
        assert!(
            start.elapsed() >= Duration::from_secs(10),
            "{:?}",
            start.elapsed()
        );
        assert!(log.contains("one stays blocked"), "{log}");
    }
}

/// The frontend blocks a worker (call eventfd, as above), asks for
/// GET_VRING_BASE (the library's thread then waits for the ring behind the
/// worker and stops reading) and sends until its socket is full, so the
/// daemon's request pump blocks writing to the library; then it leaves.
/// Found by a fourth reviewer: the pump never saw the end of the
/// connection, so teardown never started. Now the reply relay also watches
/// for the frontend hanging up and ends the connection; the next frontend
/// is served.
#[test]
fn a_frontend_that_fills_the_library_socket_cannot_wedge_the_daemon() {
    let BlockedOnCall { mut daemon, c, .. } = BlockedOnCall::start(&[], |_| {});
    c.send(GET_VRING_BASE, V1, &vring_state(0, 0), &[]).unwrap();
    c.s.set_nonblocking(true).unwrap();
    let m = Conn::message(SET_FEATURES, V1, &F_PROTOCOL_FEATURES.to_le_bytes());
    let (mut sent, start) = (0usize, Instant::now());
    // Until the socket stays full for half a second.
    let mut full_since = None;
    while full_since.is_none_or(|t: Instant| t.elapsed() < Duration::from_millis(500)) {
        match (&c.s).write(&m) {
            Ok(n) => {
                assert_eq!(n, m.len());
                sent += 1;
                full_since = None;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                full_since.get_or_insert_with(Instant::now);
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("after {sent} messages: {e}"),
        }
        assert!(start.elapsed() < TIMEOUT, "the socket never filled ({sent} sent)");
    }
    drop(c);
    daemon.assert_alive("a frontend that filled the library's socket");
    assert_nist(&daemon.sock, "a frontend that filled the library's socket");
}

/// Honest ends of a connection, 30 times each (found by a fifth reviewer
/// after the relay learned to notice a frontend closing): a frontend that
/// sends GET_FEATURES and shuts only its sending side still gets the reply,
/// and one that sends 50 messages and closes has them all taken, with no
/// "connection ended" warning (they used to be cut off with EPIPE).
#[test]
fn a_frontend_that_half_closes_or_closes_after_sending_is_served_in_full() {
    let mut daemon = Daemon::spawn(&[]);
    for i in 0..30 {
        let s = UnixStream::connect(&daemon.sock).unwrap();
        s.set_read_timeout(Some(TIMEOUT)).unwrap();
        (&s).write_all(&Conn::message(GET_FEATURES, V1, &[])).unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        let mut reply = Vec::new();
        (&s).read_to_end(&mut reply).unwrap();
        assert_eq!(reply.len(), 20, "half-close {i}: the GET_FEATURES reply");
        assert_eq!(reply[..4], GET_FEATURES.to_le_bytes());
    }
    for _ in 0..30 {
        let c = Conn::negotiated(&daemon.sock);
        let m = Conn::message(SET_FEATURES, V1, &F_PROTOCOL_FEATURES.to_le_bytes());
        (&c.s).write_all(&m.repeat(50)).unwrap();
        drop(c);
    }
    daemon.assert_alive("frontends that half-close or close after sending");
    let log = daemon.log_tail(1 << 20);
    assert_eq!(log.matches("frontend connection ended").count(), 0, "{log}");
}

/// An honest frontend leaves while its guest has a ring of 256 large
/// requests queued (64 MiB each, `--max-request-bytes` 64 MiB, no
/// polling). Found by a fourth reviewer: the worker finished the whole
/// ring before looking at the disconnect (about 16 GiB of AES here), and
/// the daemon even exited with status 3 after 10 s. Now it stops after the
/// batch in progress: the next frontend is served within seconds, and the
/// daemon lives.
#[test]
fn a_ring_of_large_requests_does_not_hold_up_the_teardown() {
    use std::os::unix::fs::FileExt;
    let (size, len) = (160u64 << 20, 64u32 << 20);
    let mut daemon = Daemon::spawn(&["--max-request-bytes", "67108864", "--poll-us", "0"]);
    let c = Conn::negotiated(&daemon.sock);
    let mem = sealable_memfd(size);
    let kick = EventFd::new(EFD_NONBLOCK).unwrap();
    let call = EventFd::new(EFD_NONBLOCK).unwrap();
    let table = mem_table(&[(0, size, UADDR, 0)]);
    c.send(SET_MEM_TABLE, V1 | NEED_REPLY, &table, &[mem.as_raw_fd()])
        .unwrap();
    assert_eq!(c.reply_u64(SET_MEM_TABLE), 0);
    raw_ring_at(&c, 0, RAW_DESC, &kick, &call);
    let sid = create_nist_session(&c);
    // Every avail entry names the same chain: header, IV, 64 MiB src and dst.
    let (src_at, dst_at) = (0x100_0000u64, 0x500_0000u64);
    mem.write_all_at(&common::hdr(ENCRYPT, sid, len, len).to_bytes(), RAW_HDR)
        .unwrap();
    write_chain(
        &mem,
        RAW_DESC,
        &[
            (RAW_HDR, 72, 0),
            (RAW_IV, 16, 0),
            (src_at, len, 0),
            (dst_at, len, VRING_DESC_F_WRITE),
            (RAW_STATUS, 1, VRING_DESC_F_WRITE),
        ],
    );
    for slot in 0..256u64 {
        mem.write_all_at(&0u16.to_le_bytes(), RAW_AVAIL + 4 + 2 * slot)
            .unwrap();
    }
    mem.write_all_at(&256u16.to_le_bytes(), RAW_AVAIL + 2).unwrap();
    kick.write(1).unwrap();
    let start = Instant::now();
    while ring0_used_u16(&mem, 2) < 2 {
        assert!(start.elapsed() < TIMEOUT, "the first requests did not complete");
        std::thread::sleep(Duration::from_millis(1));
    }
    // A backlog of messages the library takes one per batch (each needs
    // the ring's lock), so that the daemon's proxy is still taking them
    // when the frontend closes (found by a sixth reviewer: the workers went
    // on serving the ring meanwhile).
    let err = Conn::message(SET_VRING_ERR, V1, &VHOST_USER_VRING_NOFD.to_le_bytes());
    (&c.s).write_all(&err.repeat(5000)).unwrap();
    let at_close = ring0_used_u16(&mem, 2);
    drop(c);
    let left = Instant::now();
    daemon.assert_alive("a frontend left with a ring of large requests queued");
    let took = left.elapsed();
    let after = ring0_used_u16(&mem, 2).wrapping_sub(at_close);
    assert!(
        took < Duration::from_secs(5),
        "the next frontend waited {took:?}; {after} requests served after the close"
    );
    // The batch in progress, and perhaps the next: MAX_LANES requests each.
    assert!(
        after <= 16,
        "{after} requests served after the close (in {took:?})"
    );
    assert_nist(
        &daemon.sock,
        "a frontend left with a ring of large requests queued",
    );
}

/// The frontend gives two rings one kick eventfd and clears its
/// `O_NONBLOCK` (the flag is on the open file it shares with the daemon):
/// both workers wake for a kick and one takes the count. The other's read
/// used to wait for the next kick, its ring unserved meanwhile (found by a
/// fresh reviewer; at first the daemon then never served another
/// frontend, until the teardown learnt to kick such a worker free). The
/// workers now take the count with `preadv2(RWF_NOWAIT)`: over 5 s of
/// kicks no worker waits in `read`, both rings are served with the flag
/// still cleared, and the next frontend is served, also after the
/// frontend gives both rings new kick eventfds.
#[test]
fn a_frontend_clearing_o_nonblock_on_a_shared_kick_eventfd_parks_no_worker() {
    for replace in [false, true] {
        let what = format!("a shared kick eventfd without O_NONBLOCK, replaced: {replace}");
        let mut daemon = Daemon::spawn(&["--queues", "2"]);
        let c = Conn::negotiated(&daemon.sock);
        let mem = sealable_memfd(MEM_SIZE);
        let kick = EventFd::new(EFD_NONBLOCK).unwrap();
        let call = EventFd::new(EFD_NONBLOCK).unwrap();
        let call1 = EventFd::new(EFD_NONBLOCK).unwrap();
        raw_ring(&c, &mem, &kick, &call);
        // Ring 1 at 640 KiB, with ring 0's kick eventfd.
        raw_ring_at(&c, 1, 0xA0000, &kick, &call1);
        let sid = create_nist_session(&c);
        clear_nonblock(kick.as_raw_fd());
        if !replace {
            no_worker_waits_in(daemon.pid(), libc::SYS_read, TIMEOUT, || kick.write(1).unwrap());
        }
        both_rings_served_on_a_shared_kick(&mem, &kick, sid, &what);
        let new = [
            EventFd::new(EFD_NONBLOCK).unwrap(),
            EventFd::new(EFD_NONBLOCK).unwrap(),
        ];
        if replace {
            for (ring, e) in new.iter().enumerate() {
                c.send(SET_VRING_KICK, V1, &(ring as u64).to_le_bytes(), &[e.as_raw_fd()])
                    .unwrap();
            }
            // All taken by the proxy (see the status-3 test).
            assert!(create_nist_session_id(&c) >= 1);
        }
        drop(c);
        daemon.assert_alive(&what);
        assert_nist(&daemon.sock, &what);
    }
}

/// H10 against the daemon binary, with its log in colour and not: the
/// guest moves the avail index 1,000 past the last one on a 256-entry
/// ring and kicks. The queue worker stops the ring and logs "data queue
/// stopped" from its own thread, which runs under the seccomp filter. In
/// colour, env_logger used to ask for each line whether stderr is a
/// terminal (an `ioctl` the filter does not allow), and the filter killed
/// the whole daemon (SIGSYS) instead of stopping one ring. Found by a fresh
/// reviewer. For stderr a file (plain, `RUST_LOG_STYLE=always`,
/// `CLICOLOR_FORCE=1`) and a terminal (`TERM=xterm-256color`): the line is
/// logged once, the daemon lives, the connection still answers, and the
/// next frontend gets NIST F.2.1 right (hostile-guest-cases.md H10: stop
/// that queue, log once, other connections unaffected).
#[test]
fn h10_logged_by_a_filtered_worker_in_colour_does_not_kill_the_daemon() {
    use std::os::unix::fs::FileExt;
    use std::sync::{Arc, Mutex};
    type Captured = Arc<Mutex<Vec<u8>>>;
    // A pseudo-terminal whose other side is read into a buffer.
    let terminal = || -> (File, Captured) {
        let (mut master, mut slave) = (-1, -1);
        // SAFETY: openpty(3) fills two ints; no name, termios or window size.
        let rc = unsafe {
            libc::openpty(
                &mut master,
                &mut slave,
                std::ptr::null_mut(),
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        assert_eq!(rc, 0, "openpty: {}", io::Error::last_os_error());
        // SAFETY: two fresh descriptors we own.
        let (mut m, s) = unsafe { (File::from_raw_fd(master), File::from_raw_fd(slave)) };
        let out = Captured::default();
        let sink = out.clone();
        std::thread::spawn(move || {
            let mut b = [0u8; 4096];
            while let Ok(n @ 1..) = m.read(&mut b) {
                sink.lock().unwrap().extend_from_slice(&b[..n]);
            }
        });
        (s, out)
    };
    /// What is tried, the daemon's extra environment, stderr on a
    /// terminal, colour expected.
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], bool, bool);
    let cases: [Case; 5] = [
        ("stderr a file", &[], false, false),
        (
            "RUST_LOG_STYLE=always",
            &[("RUST_LOG_STYLE", "always")],
            false,
            true,
        ),
        ("CLICOLOR_FORCE=1", &[("CLICOLOR_FORCE", "1")], false, true),
        ("stderr a terminal", &[("TERM", "xterm-256color")], true, true),
        (
            "stderr a terminal, CLICOLOR=0",
            &[("TERM", "xterm-256color"), ("CLICOLOR", "0")],
            true,
            false,
        ),
    ];
    for (what, env, on_terminal, colour) in cases {
        let (stderr, log): (File, Box<dyn Fn() -> String>) = if on_terminal {
            let (s, out) = terminal();
            (
                s,
                Box::new(move || String::from_utf8_lossy(&out.lock().unwrap()).into_owned()),
            )
        } else {
            // (The daemon shares the file's offset: read from 0, by position.)
            let f = tempfile::tempfile().unwrap();
            let r = f.try_clone().unwrap();
            (
                f,
                Box::new(move || {
                    let mut b = vec![0u8; r.metadata().unwrap().len() as usize];
                    r.read_exact_at(&mut b, 0).unwrap();
                    String::from_utf8_lossy(&b).into_owned()
                }),
            )
        };
        let mut seen = String::new();
        let mut d = daemon::spawn_daemon_env(&[], "warn", env, stderr.into());
        let c = Conn::negotiated(&d.sock);
        let mem = sealable_memfd(MEM_SIZE);
        let kick = EventFd::new(EFD_NONBLOCK).unwrap();
        let call = EventFd::new(EFD_NONBLOCK).unwrap();
        raw_ring(&c, &mem, &kick, &call);
        mem.write_all_at(&1000u16.to_le_bytes(), RAW_AVAIL + 2).unwrap();
        kick.write(1).unwrap();
        let start = Instant::now();
        while !seen.contains("data queue stopped") {
            if let Some(status) = d.child.try_wait().unwrap() {
                panic!(
                    "{what}: the daemon died after H10: {status:?}; its log:\n{}",
                    log()
                );
            }
            assert!(
                start.elapsed() < TIMEOUT,
                "{what}: H10 not logged; the log:\n{seen}"
            );
            std::thread::sleep(Duration::from_millis(5));
            seen = log();
        }
        // A kick more, and the connection still answers.
        kick.write(1).unwrap();
        assert_ne!(c.get_features() & F_PROTOCOL_FEATURES, 0, "{what}: still served");
        std::thread::sleep(Duration::from_millis(100));
        let seen = log();
        assert_eq!(
            seen.matches("data queue stopped").count(),
            1,
            "{what}: logged once:\n{seen}"
        );
        assert_eq!(
            seen.contains("\x1b["),
            colour,
            "{what}: in colour or not:\n{seen}"
        );
        assert!(d.child.try_wait().unwrap().is_none(), "{what}: daemon died");
        drop(c);
        assert_nist(&d.sock, what);
        d.stop();
    }
}

/// Guest memory files that cannot be sealed against shrinking: a memfd made
/// without MFD_ALLOW_SEALING (F_SEAL_SEAL from birth; QEMU's
/// memory-backend-memfd with seal=off) and a plain file (memory-backend-file
/// on /dev/shm, hugetlbfs or a disk). With `--require-sealed-memory` the
/// daemon refuses their SET_MEM_TABLE (disconnect), seals nothing, and
/// serves the next frontend (the replay tool, whose memfd is sealed, and a
/// sealable memfd, which it seals). Without the flag they are accepted with
/// one warning per region, and requests complete.
#[test]
fn unsealable_guest_memory_and_require_sealed_memory() {
    let dir = tempfile::tempdir().unwrap();
    let unsealable = || -> Vec<(&'static str, File)> {
        let plain = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("guest.mem"))
            .unwrap();
        plain.set_len(MEM_SIZE).unwrap();
        vec![
            ("memfd without MFD_ALLOW_SEALING", memfd(MEM_SIZE)),
            ("plain file", plain),
        ]
    };

    let mut strict = Daemon::spawn(&["--require-sealed-memory"]);
    for (what, f) in unsealable() {
        let c = Conn::negotiated(&strict.sock);
        let table = mem_table(&[(0, MEM_SIZE, UADDR, 0)]);
        c.send(SET_MEM_TABLE, V1 | NEED_REPLY, &table, &[f.as_raw_fd()])
            .unwrap();
        assert_eq!(expect_refused(&c, SET_MEM_TABLE, what), "disconnect", "{what}");
        drop(c);
        // Refused, not sealed: the frontend may still resize its own file.
        f.set_len(64 << 10).unwrap();
        strict.assert_alive(&format!("--require-sealed-memory refusing a {what}"));
    }
    assert!(
        strict
            .log_tail(4000)
            .contains("cannot be sealed against shrinking"),
        "reason in the log: {}",
        strict.log_tail(4000)
    );
    // A sealable memfd is accepted, sealed, and serves requests.
    let c = Conn::negotiated(&strict.sock);
    let mem = sealable_memfd(MEM_SIZE);
    let kick = EventFd::new(EFD_NONBLOCK).unwrap();
    let call = EventFd::new(EFD_NONBLOCK).unwrap();
    raw_ring(&c, &mem, &kick, &call);
    assert_eq!(seals(&mem), libc::F_SEAL_SHRINK);
    c.send_bytes(&create_request(SessionAbi::C, &session(&hex(NIST_KEY), 1)), &[])
        .unwrap();
    assert_eq!(&c.reply(CREATE_CRYPTO_SESSION)[1064..1072], &1i64.to_le_bytes());
    let (id, len, status, dst) = raw_nist_request(&mem, &kick, &call, 1, 1);
    assert_eq!((id, len, status, dst), (0, 65, ST_OK, hex(NIST_CT)));
    drop(c);
    // The replay tool's memfd comes sealed (SHRINK | GROW) and is accepted.
    let fe = frontend(&strict.sock, &cfg(SessionAbi::C, 1, 64, 8, 64));
    assert_eq!(seals(fe.mem.file()), libc::F_SEAL_SHRINK | libc::F_SEAL_GROW);
    let e = fe.mem.file().set_len(4096).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPERM));
    drop(fe);
    assert_nist(
        &strict.sock,
        "--require-sealed-memory with the replay tool's memfd",
    );
    strict.assert_alive("--require-sealed-memory");
    drop(strict);

    // Without the flag: accepted, one warning per region, requests complete.
    let mut lenient = Daemon::spawn(&[]);
    for (what, f) in unsealable() {
        let before = lenient.log_tail(1 << 20).matches("cannot be sealed").count();
        let c = Conn::negotiated(&lenient.sock);
        let kick = EventFd::new(EFD_NONBLOCK).unwrap();
        let call = EventFd::new(EFD_NONBLOCK).unwrap();
        raw_ring(&c, &f, &kick, &call);
        assert_ne!(seals(&f), libc::F_SEAL_SHRINK, "{what} got sealed");
        // Ids go on from the daemon's earlier connections.
        let sid = create_nist_session(&c);
        let (id, len, status, dst) = raw_nist_request(&f, &kick, &call, sid, 1);
        assert_eq!((id, len, status, dst), (0, 65, ST_OK, hex(NIST_CT)), "{what}");
        drop(c);
        lenient.assert_alive(what);
        let after = lenient.log_tail(1 << 20).matches("cannot be sealed").count();
        assert_eq!(after - before, 1, "warnings for one region of a {what}");
    }
    assert_nist(&lenient.sock, "unsealable guest memory accepted with a warning");
}

/// Writes `chain` (address, length, flags of each buffer) as a direct
/// chain from descriptor 0 of the table at guest address `desc`, laid out
/// by hand (VIRTIO 1.2 §2.7.5: addr u64, len u32, flags u16, next u16),
/// with NEXT and `next` added on all but the last.
fn write_chain(mem: &File, desc: u64, chain: &[(u64, u32, u16)]) {
    use std::os::unix::fs::FileExt;
    for (k, &(addr, len, flags)) in chain.iter().enumerate() {
        let last = k + 1 == chain.len();
        let d = Desc {
            addr,
            len,
            flags: flags | if last { 0 } else { VRING_DESC_F_NEXT },
            next: if last { 0 } else { k as u16 + 1 },
        };
        mem.write_all_at(&d.to_bytes(), desc + 16 * k as u64).unwrap();
    }
}

/// A u16 of data ring 0's used ring (set up by [`raw_ring`] at 0x82000):
/// `used.flags` at 0, `used.idx` at 2.
fn ring0_used_u16(mem: &File, at: u64) -> u16 {
    use std::os::unix::fs::FileExt;
    let mut b = [0u8; 2];
    mem.read_exact_at(&mut b, RAW_USED + at).unwrap();
    u16::from_le_bytes(b)
}

/// A daemon, a negotiated connection with data ring 0 set up
/// ([`raw_ring`]) and one AES-128 encrypt session, and a guest that keeps
/// the ring busy on its own, as another vCPU would: every avail entry
/// names head 0, a 64 KiB encryption (header 0x10000, src 0x20000, dst
/// 0x40000, status 0x14000), and a thread keeps the avail index 256 ahead
/// of the used index, kicking after each move, until
/// [`BusyRing::stop_guest`]. Started 100 ms before it is returned.
struct BusyRing {
    daemon: Daemon,
    /// The connection (taken by a test that drops it).
    conn: Option<Conn>,
    mem: File,
    kicks: Vec<EventFd>,
    _calls: Vec<EventFd>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    guest: Option<std::thread::JoinHandle<()>>,
}

impl BusyRing {
    fn start() -> BusyRing {
        Self::start_with(&[], 0x10000)
    }

    /// [`BusyRing::start`] with daemon options `args` and requests of
    /// `len` bytes; above 64 KiB each is encrypted in place at 1 MiB, in
    /// guest memory that large enough.
    fn start_with(args: &[&str], len: u32) -> BusyRing {
        Self::start_queues(args, len, 1, 256)
    }

    /// [`BusyRing::start_with`] with `queues` data rings (the daemon is
    /// given `--queues`), each kept busy the same way but `ahead` (at most
    /// 256) entries ahead of its used index: ring q at 0x80000 + q * 0x3000
    /// (ring 0 where [`raw_ring`] puts it), all of them naming the same
    /// buffers. Guest memory from 0x20000 to 0x40000 is left free when
    /// `len` is above 64 KiB. With more queues than CPUs the daemon runs at
    /// nice 10 (or the test's own, if higher), so that the tests running
    /// beside this one keep their share.
    fn start_queues(args: &[&str], len: u32, queues: u32, ahead: u16) -> BusyRing {
        use std::os::unix::fs::FileExt;
        use std::sync::atomic::{AtomicBool, Ordering};
        let n = queues.to_string();
        let args: Vec<&str> = args.iter().copied().chain(["--queues", &n]).collect();
        let daemon = Daemon::spawn(&args);
        if queues as usize > std::thread::available_parallelism().map_or(1, |n| n.get()) {
            // (Threads started later inherit it from the ones that start
            // them. Never below the test's own nice value, which only root
            // could lower; a failure leaves it as it is.)
            // SAFETY: getpriority of this thread; no memory is passed.
            let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) }.max(10);
            for t in std::fs::read_dir(format!("/proc/{}/task", daemon.child.id())).unwrap() {
                let tid: libc::id_t = t.unwrap().file_name().to_string_lossy().parse().unwrap();
                // SAFETY: setpriority on one of the daemon's threads; no memory is passed.
                let _ = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, nice) };
            }
        }
        let c = Conn::negotiated(&daemon.sock);
        let (hdr_at, status_at) = (0x10000u64, 0x14000u64);
        let (src_at, dst_at, size) = if len <= 0x10000 {
            (0x20000u64, 0x40000u64, MEM_SIZE)
        } else {
            (
                0x100000,
                0x100000,
                0x100000 + u64::from(len).next_multiple_of(0x1000),
            )
        };
        let mem = sealable_memfd(size);
        let table = mem_table(&[(0, size, UADDR, 0)]);
        c.send(SET_MEM_TABLE, V1 | NEED_REPLY, &table, &[mem.as_raw_fd()])
            .unwrap();
        assert_eq!(c.reply_u64(SET_MEM_TABLE), 0, "SET_MEM_TABLE");
        let rings: Vec<u64> = (0..u64::from(queues)).map(|q| RAW_DESC + q * 0x3000).collect();
        let (mut kicks, mut calls) = (Vec::new(), Vec::new());
        for (q, &at) in rings.iter().enumerate() {
            let kick = EventFd::new(EFD_NONBLOCK).unwrap();
            let call = EventFd::new(EFD_NONBLOCK).unwrap();
            raw_ring_at(&c, q as u32, at, &kick, &call);
            kicks.push(kick);
            calls.push(call);
        }
        let sid = create_nist_session(&c);
        let h = common::hdr(ENCRYPT, sid, len, len);
        mem.write_all_at(&h.to_bytes(), hdr_at).unwrap();
        for &at in &rings {
            write_chain(
                &mem,
                at,
                &[
                    (hdr_at, 72, 0),
                    (0x11000, 16, 0),
                    (src_at, len, 0),
                    (dst_at, len, VRING_DESC_F_WRITE),
                    (status_at, 1, VRING_DESC_F_WRITE),
                ],
            );
            for slot in 0..256u64 {
                mem.write_all_at(&0u16.to_le_bytes(), at + 0x1000 + 4 + 2 * slot)
                    .unwrap();
            }
        }
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let mut a: Vec<u16> = rings.iter().map(|&at| used_idx_at(&mem, at)).collect();
        let (m, s) = (mem.try_clone().unwrap(), stop.clone());
        let k: Vec<EventFd> = kicks.iter().map(|k| k.try_clone().unwrap()).collect();
        let guest = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                for ((&at, a), k) in rings.iter().zip(&mut a).zip(&k) {
                    // Never more than `ahead` entries ahead, never backwards.
                    let want = used_idx_at(&m, at).wrapping_add(ahead);
                    if want.wrapping_sub(*a) as i16 > 0 {
                        *a = want;
                        m.write_all_at(&a.to_le_bytes(), at + 0x1000 + 2).unwrap();
                        // (Once the daemon has let go of the ring nobody reads
                        // this eventfd: it may fill up, which only fails the write.)
                        let _ = k.write(1);
                    }
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        std::thread::sleep(Duration::from_millis(100));
        BusyRing {
            daemon,
            conn: Some(c),
            mem,
            kicks,
            _calls: calls,
            stop,
            guest: Some(guest),
        }
    }

    fn conn(&self) -> &Conn {
        self.conn.as_ref().expect("connection still open")
    }

    fn used_idx(&self) -> u16 {
        ring0_used_u16(&self.mem, 2)
    }

    fn kick(&self, ring: u32) {
        self.kicks[ring as usize].write(1).unwrap();
    }

    fn stop_guest(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(g) = self.guest.take() {
            g.join().unwrap();
        }
    }

    /// Stops the guest, closes the connection, and checks that the daemon
    /// is alive and serves a new frontend.
    fn finish(mut self, what: &str) {
        self.stop_guest();
        drop(self.conn.take());
        self.daemon.assert_alive(what);
        assert_nist(&self.daemon.sock, what);
    }
}

/// Review (fifteenth session): with requests of 1 MiB, the worker took its
/// locks back after every batch before the library's thread, woken by the
/// release, could take them (std's locks are not fair), so GET_VRING_BASE
/// was answered after 2–10 s, and with `--poll-us 0` (several batches per
/// lock) not within 60 s; a CREATE, which waits for the queue's session
/// table, after 1–3 s. Now the worker takes its locks for one batch at a
/// time and stays off them for a moment every 10 ms of busy work: each is
/// answered within the bound below (tens of milliseconds here). A ring
/// stopped while the worker polled it is left with the driver's kicks on.
#[test]
fn control_messages_are_answered_while_the_guest_keeps_a_ring_of_large_requests_busy() {
    use std::os::unix::fs::FileExt;
    const BOUND: Duration = Duration::from_millis(1000);
    for poll in ["0", "50"] {
        for get_base in [false, true] {
            let mut r = BusyRing::start_with(&["--poll-us", poll], 1 << 20);
            // (Measured while requests are being served.)
            let until = Instant::now() + TIMEOUT;
            let first = r.used_idx();
            while r.used_idx() == first && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(1));
            }
            assert_ne!(
                r.used_idx(),
                first,
                "--poll-us {poll}: the guest's requests are served"
            );
            let t = Instant::now();
            let what = if get_base {
                r.conn()
                    .send(GET_VRING_BASE, V1, &vring_state(0, 0), &[])
                    .unwrap();
                let got = r.conn().recv();
                assert!(
                    matches!(got, Got::Msg(GET_VRING_BASE, ..)),
                    "--poll-us {poll}: GET_VRING_BASE: {got:?}"
                );
                "GET_VRING_BASE"
            } else {
                create_nist_session(r.conn());
                "CREATE_CRYPTO_SESSION"
            };
            let took = t.elapsed();
            r.stop_guest();
            eprintln!("--poll-us {poll}: {what} answered after {took:?}");
            assert!(
                took < BOUND,
                "--poll-us {poll}: {what} answered only after {took:?}"
            );
            if get_base {
                // The worker, polling, had the driver's kicks off: the
                // stopped ring has them on again (used.flags 0, avail_event
                // at the avail index the worker saw, which the guest may
                // have moved on since, by less than the ring), or whoever
                // serves it next would never be kicked. (Kicks left off
                // put avail_event 0x8000 ahead.)
                let mut b = [0u8; 2];
                r.mem.read_exact_at(&mut b, RAW_DESC + 0x1000 + 2).unwrap();
                let avail = u16::from_le_bytes(b);
                r.mem.read_exact_at(&mut b, RAW_USED + 4 + 8 * 256).unwrap();
                let avail_event = u16::from_le_bytes(b);
                let flags = ring0_used_u16(&r.mem, 0);
                assert!(
                    flags == 0 && avail.wrapping_sub(avail_event) <= 256,
                    "--poll-us {poll}: after GET_VRING_BASE used.flags {flags}, avail_event {avail_event}, avail {avail}"
                );
            }
            r.finish(what);
        }
    }
}

/// Multi-queue prober (seventeenth session): with more busy queues than
/// CPUs, a CREATE or CLOSE waited for each queue's session table in turn,
/// each queue letting go of it only at its next lock gap, which came late
/// with so many workers sharing two CPUs: with 1 MiB requests 0.78–1.03 s
/// at 16 queues and 6–7 s at 32. Now the registry posts the change to
/// every table, and a table that a batch holds is updated by its worker
/// when it takes it for its next batch: a CREATE waits for no batch, a
/// CLOSE for the busy queues' current batches at once (a tenth of a second
/// or two here). A request made available on each ring right after the
/// CREATE reply finds the session.
#[test]
fn sessions_come_and_go_quickly_while_more_queues_than_cpus_are_busy() {
    use std::os::unix::fs::FileExt;
    const QUEUES: u32 = 32;
    const BOUND: Duration = Duration::from_millis(1500);
    // (32 requests ahead: enough to keep every worker busy between the
    // guest's top-ups, so that the sequential registry took seconds, and
    // few enough to drain within about a second at the end.)
    let mut r = BusyRing::start_queues(&[], 1 << 20, QUEUES, 32);
    let until = Instant::now() + TIMEOUT;
    let first = r.used_idx();
    while r.used_idx() == first && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_ne!(r.used_idx(), first, "the guest's requests are served");
    // A CLOSE waits for the busy queues' current batches (a session of
    // its own, so that the CREATE below is still to be applied by the
    // queues' workers).
    let closed = create_nist_session(r.conn());
    let mut m = close_request(closed).to_vec();
    m[4..8].copy_from_slice(&(V1 | NEED_REPLY).to_le_bytes());
    let t = Instant::now();
    r.conn().send_bytes(&m, &[]).unwrap();
    assert_eq!(r.conn().reply_u64(CLOSE_CRYPTO_SESSION), 0, "CLOSE of a live id");
    let close = t.elapsed();
    let t = Instant::now();
    let sid = create_nist_session(r.conn());
    let create = t.elapsed();
    // Each ring gets one more request, naming the new session (made
    // available after the reply, as a guest would): an indirect table at
    // head 8, its buffers in ring q's page at 0x20000 + q * 0x1000.
    r.stop_guest();
    let mut ends = Vec::new();
    for q in 0..QUEUES {
        let (ring, page) = (RAW_DESC + u64::from(q) * 0x3000, 0x20000 + u64::from(q) * 0x1000);
        let table = page + 0x800;
        let chain = put_nist_buffers(&r.mem, sid, page, 0x100);
        let (dst, status) = (chain[3].0, chain[4].0);
        write_chain(&r.mem, table, &chain);
        let head = Desc {
            addr: table,
            len: 5 * 16,
            flags: VRING_DESC_F_INDIRECT,
            next: 0,
        };
        r.mem.write_all_at(&head.to_bytes(), ring + 16 * 8).unwrap();
        let mut b = [0u8; 2];
        r.mem.read_exact_at(&mut b, ring + 0x1000 + 2).unwrap();
        let n = u16::from_le_bytes(b);
        r.mem
            .write_all_at(&8u16.to_le_bytes(), ring + 0x1000 + 4 + 2 * u64::from(n % 256))
            .unwrap();
        r.mem
            .write_all_at(&n.wrapping_add(1).to_le_bytes(), ring + 0x1000 + 2)
            .unwrap();
        r.kick(q);
        ends.push((ring, n.wrapping_add(1), dst, status));
    }
    // (The rings' last 1 MiB requests drain first: about a second alone,
    // longer beside other tests at the daemon's nice value.)
    let until = Instant::now() + 6 * TIMEOUT;
    for (q, &(ring, end, dst, status)) in ends.iter().enumerate() {
        while used_idx_at(&r.mem, ring) != end && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(
            used_idx_at(&r.mem, ring),
            end,
            "ring {q}: the request after the CREATE is served"
        );
        let (mut st, mut out) = ([0u8; 1], [0u8; 64]);
        r.mem.read_exact_at(&mut st, status).unwrap();
        r.mem.read_exact_at(&mut out, dst).unwrap();
        assert_eq!(
            (st[0], out.to_vec()),
            (ST_OK, hex(NIST_CT)),
            "ring {q}: the new session's request"
        );
    }
    eprintln!("{QUEUES} busy queues: CREATE answered after {create:?}, CLOSE after {close:?}");
    assert!(create < BOUND, "CREATE answered only after {create:?}");
    assert!(close < BOUND, "CLOSE answered only after {close:?}");
    r.finish("sessions under many busy queues");
}

/// The frontend disconnects while its guest keeps ring 0 busy (QEMU gone,
/// or a frontend doing it on purpose; the guest's pages are still shared):
/// the queue worker stops serving the ring at once, the connection is torn
/// down and the next frontend is served, while the old guest still writes
/// its avail index.
#[test]
fn busy_ring_after_disconnect_does_not_hold_up_the_next_frontend() {
    let mut r = BusyRing::start();
    let u0 = r.used_idx();
    assert!(u0 > 0, "the busy guest's requests are served");
    drop(r.conn.take());
    std::thread::sleep(Duration::from_millis(200));
    let u1 = r.used_idx();
    let next = Conn::open(&r.daemon.sock);
    next.send(GET_FEATURES, V1, &[], &[]).unwrap();
    let got = next.recv();
    std::thread::sleep(Duration::from_millis(100));
    let u2 = r.used_idx();
    r.stop_guest();
    eprintln!("used.idx {u0} while connected, {u1} 200 ms after the disconnect, {u2} later");
    assert!(
        matches!(got, Got::Msg(GET_FEATURES, _, _)),
        "the next frontend is not served while the old guest keeps its ring busy: {got:?}"
    );
    assert_eq!(u2, u1, "the ring is still served after its frontend left");
    drop(next);
    r.finish("busy ring after disconnect");
}

/// GET_VRING_BASE while the guest keeps ring 0 busy: the reply comes
/// (within a batch, not when the guest stops sending), and once it is
/// back the ring is no longer served.
#[test]
fn get_vring_base_is_answered_while_the_guest_keeps_the_ring_busy() {
    let mut r = BusyRing::start();
    r.conn()
        .send(GET_VRING_BASE, V1, &vring_state(0, 0), &[])
        .unwrap();
    let got = r.conn().recv();
    let u1 = r.used_idx();
    std::thread::sleep(Duration::from_millis(100));
    let u2 = r.used_idx();
    r.stop_guest();
    let Got::Msg(GET_VRING_BASE, _, p) = got else {
        panic!("GET_VRING_BASE not answered while the guest keeps the ring busy: {got:?}");
    };
    eprintln!("GET_VRING_BASE: {p:?}; used.idx {u1}, then {u2}");
    assert!(u1 > 0, "the busy guest's requests were served");
    assert_eq!(
        p,
        vring_state(0, u32::from(u1)),
        "the base is where the used ring stopped"
    );
    assert_eq!(u2, u1, "the ring is still served after GET_VRING_BASE");
    r.finish("GET_VRING_BASE under a busy ring");
}

/// Review (nineteenth session): the frontend moves a running ring
/// (SET_VRING_ADDR, no GET_VRING_BASE first) while the worker polls it
/// with the driver's kicks turned off, to a place whose avail index is
/// far ahead (the new ring is stopped at once, H10), and the guest reuses
/// the old ring's used page. The worker remembered the old ring as the one
/// whose kicks it had turned off, and the GET_VRING_BASE that stops the
/// ring turned them back on there: it wrote used.flags and avail_event
/// into memory that was no longer a ring (two and two bytes of the old
/// used page). Now the stop turns them back on where the ring is at that
/// moment: the GET_VRING_BASE writes nothing at the old place.
#[test]
fn a_ring_moved_while_polled_is_not_written_at_its_old_place_when_stopped() {
    use std::os::unix::fs::FileExt;
    // Waits for the worker to stop a ring for H10 (logged).
    let until_h10 = |r: &BusyRing, what: &str| r.daemon.until_logged("data queue stopped", TIMEOUT, what);
    // Stops the ring and checks the old used page, which the guest filled
    // with 0x5A, is as the guest left it.
    let stop_and_check_old_page = |r: &BusyRing, what: &str| {
        r.conn()
            .send(GET_VRING_BASE, V1, &vring_state(0, 0), &[])
            .unwrap();
        let got = r.conn().recv();
        assert!(
            matches!(got, Got::Msg(GET_VRING_BASE, _, _)),
            "{what}: GET_VRING_BASE not answered: {got:?}"
        );
        let mut page = vec![0u8; 0x1000];
        r.mem.read_exact_at(&mut page, RAW_USED).unwrap();
        let written: Vec<(u64, u8)> = page
            .iter()
            .enumerate()
            .filter(|&(_, &b)| b != 0x5A)
            .map(|(i, &b)| (RAW_USED + i as u64, b))
            .collect();
        assert!(
            written.is_empty(),
            "{what}: stopping it wrote into its old used page: {written:x?}"
        );
    };
    let mut r = BusyRing::start();
    // The new place: avail at +0x1000 with an index 40,000 ahead of the
    // ring's, used at +0x2000.
    const NEW: u64 = 0xC0000;
    r.mem
        .write_all_at(&40000u16.to_le_bytes(), NEW + 0x1000 + 2)
        .unwrap();
    r.mem.write_all_at(&0u16.to_le_bytes(), NEW + 0x2000 + 2).unwrap();
    let addr = vring_addr(0, UADDR + NEW, UADDR + NEW + 0x2000, UADDR + NEW + 0x1000);
    r.conn()
        .send(SET_VRING_ADDR, V1 | NEED_REPLY, &addr, &[])
        .unwrap();
    assert_eq!(r.conn().reply_u64(SET_VRING_ADDR), 0, "SET_VRING_ADDR");
    // The worker was polling the busy ring with the driver's kicks off
    // (without them off there would be nothing to turn back on).
    assert_eq!(
        ring0_used_u16(&r.mem, 0),
        1,
        "VRING_USED_F_NO_NOTIFY in the old used ring"
    );
    r.stop_guest();
    // The worker has looked at the new place once H10 is logged.
    until_h10(&r, "the new place was not looked at");
    // The guest uses the old used page for something else.
    r.mem.write_all_at(&[0x5A; 0x1000], RAW_USED).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    stop_and_check_old_page(&r, "the moved ring");
    r.finish("a ring moved while polled, then stopped");

    // The worker need not look at the new place before the stop at all:
    // here the old ring is stopped by H10 right after a polling batch (the
    // guest's avail index jumps), so its worker waits for kicks with the
    // kicks it turned off still off, and nothing wakes it between the
    // move and the stop. (Requests of 1 MiB: the ring is still being
    // served when the jump is written, so the worker still polls it.)
    let mut r = BusyRing::start_with(&[], 1 << 20);
    r.stop_guest();
    let jump = r.used_idx().wrapping_add(40000);
    r.mem.write_all_at(&jump.to_le_bytes(), RAW_AVAIL + 2).unwrap();
    until_h10(&r, "the jump was not seen");
    assert_eq!(
        ring0_used_u16(&r.mem, 0),
        1,
        "kicks still off in the stopped ring"
    );
    r.mem.write_all_at(&[0x5A; 0x1000], RAW_USED).unwrap();
    // The new place's used ring with the kicks off, as the driver may
    // have left it.
    r.mem.write_all_at(&1u16.to_le_bytes(), NEW + 0x2000).unwrap();
    r.conn()
        .send(SET_VRING_ADDR, V1 | NEED_REPLY, &addr, &[])
        .unwrap();
    assert_eq!(r.conn().reply_u64(SET_VRING_ADDR), 0, "SET_VRING_ADDR");
    stop_and_check_old_page(&r, "a ring moved while its worker waited");
    let mut flags = [0u8; 2];
    r.mem.read_exact_at(&mut flags, NEW + 0x2000).unwrap();
    assert_eq!(
        u16::from_le_bytes(flags),
        0,
        "kicks back on where the ring is now"
    );
    r.finish("a ring moved while its worker waited, then stopped");
}

/// SET_VRING_ENABLE(0, 0) while the guest keeps ring 0 busy: acked, and
/// from then on the ring is not served, with the driver's kicks turned
/// back on in guest memory (the worker had them off while polling); once
/// enabled again (the guest still kicking), it is served again.
#[test]
fn a_ring_disabled_while_busy_stops_and_comes_back() {
    let mut r = BusyRing::start();
    let c = r.conn();
    c.send(SET_VRING_ENABLE, V1 | NEED_REPLY, &vring_state(0, 0), &[])
        .unwrap();
    assert_eq!(c.reply_u64(SET_VRING_ENABLE), 0, "SET_VRING_ENABLE(0, 0) ack");
    // The batch running when the message came may still complete.
    std::thread::sleep(Duration::from_millis(50));
    let u1 = r.used_idx();
    std::thread::sleep(Duration::from_millis(100));
    let (u2, flags) = (r.used_idx(), ring0_used_u16(&r.mem, 0));
    c.send(SET_VRING_ENABLE, V1 | NEED_REPLY, &vring_state(0, 1), &[])
        .unwrap();
    assert_eq!(c.reply_u64(SET_VRING_ENABLE), 0, "SET_VRING_ENABLE(0, 1) ack");
    std::thread::sleep(Duration::from_millis(100));
    let u3 = r.used_idx();
    r.stop_guest();
    eprintln!("used.idx {u1} after the disable, {u2} 100 ms later (flags {flags:#x}), {u3} after the enable");
    assert!(u1 > 0, "the busy guest's requests were served");
    assert_eq!(u2, u1, "a disabled ring is still served");
    assert_eq!(flags, 0, "kicks left suppressed on a disabled ring");
    assert!(u3 != u2, "the ring is not served again once enabled");
    r.finish("ring disabled and enabled under a busy guest");
}

/// A ring stopped (GET_VRING_BASE) and started again the way QEMU does it
/// on `stop` then `cont` (NUM, BASE, ADDR, KICK, then CALL, the kick
/// eventfd already signalled for a request the guest queued meanwhile):
/// the request is not served before the ring has its new call eventfd,
/// and once it has, it completes (NIST F.2.1) with a used-buffer
/// notification. Before the fix the library kept the ring enabled across
/// the stop, so the request completed at KICK with no call eventfd to
/// signal, and the guest would wait for it forever.
#[test]
fn a_ring_started_again_waits_for_its_call_eventfd() {
    restart_with_a_queued_request(false);
}

/// As above with the new call eventfd sent before the kick eventfd (the
/// order of QEMU's guest-notifier set-up before `vhost_dev_start`): the
/// ring is enabled again at KICK and the queued request completes (NIST
/// F.2.1) with a notification on the new call eventfd.
#[test]
fn a_ring_started_again_call_first_is_served_at_its_kick() {
    restart_with_a_queued_request(true);
}

/// Serves request 1 on ring 0, stops the ring, queues request 2 (its new
/// kick eventfd signalled, as QEMU's new host notifier starts) and sets
/// the ring up again: NUM, BASE, ADDR, KICK, then CALL, or CALL first.
/// Request 2 must not be served before the new call eventfd is set, and
/// must then complete with a notification on it.
fn restart_with_a_queued_request(call_first: bool) {
    use std::os::unix::fs::FileExt;
    let daemon = Daemon::spawn(&[]);
    let c = Conn::negotiated(&daemon.sock);
    let (mem, _kick, _call, sid) = ring_with_one_request_served(&c);
    c.send(GET_VRING_BASE, V1, &vring_state(0, 0), &[]).unwrap();
    assert_eq!(c.reply(GET_VRING_BASE), vring_state(0, 1), "GET_VRING_BASE");
    let kick2 = EventFd::new(EFD_NONBLOCK).unwrap();
    let call2 = EventFd::new(EFD_NONBLOCK).unwrap();
    submit_raw_nist(&mem, &kick2, sid, 2);
    let send = |req: u32, payload: &[u8], fds: &[RawFd]| {
        c.send(req, V1 | NEED_REPLY, payload, fds).unwrap();
        assert_eq!(c.reply_u64(req), 0, "request {req}");
    };
    let fd_message = 0u64.to_le_bytes();
    if call_first {
        send(SET_VRING_CALL, &fd_message, &[call2.as_raw_fd()]);
    }
    send(SET_VRING_NUM, &vring_state(0, 256), &[]);
    send(SET_VRING_BASE, &vring_state(0, 1), &[]);
    let addr = vring_addr(
        0,
        UADDR + RAW_DESC,
        UADDR + RAW_DESC + 0x2000,
        UADDR + RAW_DESC + 0x1000,
    );
    send(SET_VRING_ADDR, &addr, &[]);
    send(SET_VRING_KICK, &fd_message, &[kick2.as_raw_fd()]);
    if !call_first {
        std::thread::sleep(Duration::from_millis(200));
        let mut b = [0u8; 2];
        mem.read_exact_at(&mut b, RAW_USED + 2).unwrap();
        assert_eq!(
            u16::from_le_bytes(b),
            1,
            "used.idx: served before the ring had its call eventfd"
        );
        send(SET_VRING_CALL, &fd_message, &[call2.as_raw_fd()]);
    }
    await_call(&call2, "after the restart");
    assert_raw_nist_ok(2, raw_nist_result(&mem, 2));
}

/// A memory table that leaves ring 0's memory out (only the first 256
/// KiB; the ring lies at 512 KiB), a request queued and kicked meanwhile,
/// then a table that maps the ring again: the request must be served once
/// that table is in place, without another kick (the guest kicked once
/// and waits; a worker that had kicks suppressed while polling could not
/// even turn them back on in unmapped memory). Sixteenth session's
/// leftover: the ring was looked at again only at the next kick.
#[test]
fn a_ring_whose_memory_comes_back_is_served_without_another_kick() {
    memory_comes_back_without_a_kick(1, 0);
}

/// As above for ring 1 of a daemon with two data queues (ring 0 not set
/// up): each queue's worker thread is woken for its own ring (a first
/// version woke only ring 0's, reviewer).
#[test]
fn a_second_ring_whose_memory_comes_back_is_served_without_another_kick() {
    memory_comes_back_without_a_kick(2, 1);
}

/// The two tests above: ring `index` of a daemon with `queues` data
/// queues, set up at [`RAW_DESC`], serves request 1; a memory table
/// without the ring; request 2 queued and kicked, not served; the full
/// table again; request 2 must complete (NIST F.2.1) with a notification.
fn memory_comes_back_without_a_kick(queues: u32, index: u32) {
    let daemon = Daemon::spawn(&["--queues", &queues.to_string()]);
    let c = Conn::negotiated(&daemon.sock);
    let (mem, kick, call, sid) = ring_with_one_request_served_at(&c, index);
    set_mem_table(&c, &mem, &[(0, RAW_DESC / 2, UADDR, 0)]);
    submit_raw_nist(&mem, &kick, sid, 2);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        used_idx_at(&mem, RAW_DESC),
        1,
        "ring {index}: used.idx: served while the ring was unmapped"
    );
    let _ = call.read();
    set_mem_table(&c, &mem, &[(0, MEM_SIZE, UADDR, 0)]);
    await_call(
        &call,
        &format!("on ring {index} after the ring's memory came back"),
    );
    assert_raw_nist_ok(2, raw_nist_result(&mem, 2));
}

/// How many `vring_worker` threads process `pid` has (one per data queue
/// while a connection is served).
fn vring_workers(pid: u32) -> usize {
    vring_worker_syscalls(pid).len()
}

/// `used.idx` of the ring at `ring_at` (used ring +8 KiB).
fn used_idx_at(mem: &File, ring_at: u64) -> u16 {
    use std::os::unix::fs::FileExt;
    let mut b = [0u8; 2];
    mem.read_exact_at(&mut b, ring_at + 0x2002).unwrap();
    u16::from_le_bytes(b)
}

/// Submits request `n` ([`submit_nist_at`]) and waits for `used.idx` to
/// reach `n`; false after 2 s.
fn served_at(mem: &File, kick: &EventFd, ring_at: u64, buf_at: u64, sid: u64, n: u16) -> bool {
    submit_nist_at(mem, kick, ring_at, buf_at, sid, n);
    let start = Instant::now();
    while used_idx_at(mem, ring_at) != n {
        if start.elapsed() > Duration::from_secs(2) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    true
}

/// SET_VRING_KICK gives a running ring a new kick eventfd (no stop
/// before), and the frontend then writes the old one. vhost-user-backend
/// 0.24 left the old eventfd in the worker's epoll (other copies of it
/// were open) but read the new, empty one: `EAGAIN` ended the queue's
/// worker thread for the rest of the connection, and requests kicked on
/// the new eventfd were never served, even after a full ring restart
/// (seventeenth session, found by a fresh prober). Ring 0 of one queue
/// and ring 1 of two. Now the workers watch the frontend's kick eventfds
/// themselves and the library gets eventfds of the daemon's own.
#[test]
fn a_kick_eventfd_written_after_its_replacement_stops_no_worker() {
    for (queues, index) in [(1u32, 0u32), (2, 1)] {
        let mut daemon = Daemon::spawn(&["--queues", &queues.to_string()]);
        let c = Conn::negotiated(&daemon.sock);
        let (mem, kick, _call, sid) = ring_with_one_request_served_at(&c, index);
        let kick2 = EventFd::new(EFD_NONBLOCK).unwrap();
        c.send(
            SET_VRING_KICK,
            V1 | NEED_REPLY,
            &u64::from(index).to_le_bytes(),
            &[kick2.as_raw_fd()],
        )
        .unwrap();
        assert_eq!(c.reply_u64(SET_VRING_KICK), 0, "SET_VRING_KICK");
        kick.write(1).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(
            vring_workers(daemon.pid()),
            queues as usize,
            "ring {index}: worker threads after a write to the replaced kick eventfd"
        );
        // The replaced eventfd is out of the worker's epoll: its count,
        // which nobody takes now, does not wake the worker again and
        // again (90 % of a CPU when it stayed in, reviewer).
        let busy = cpu_busy(daemon.pid(), Duration::from_secs(1));
        assert!(
            busy < 0.5,
            "ring {index}: the daemon used {:.0} % of a CPU after a write to the replaced kick eventfd",
            busy * 100.0
        );
        assert!(
            served_at(&mem, &kick2, RAW_DESC, RAW_HDR, sid, 2),
            "ring {index}: request 2, kicked on the new eventfd, not served"
        );
        assert_raw_nist_ok(2, raw_nist_result(&mem, 2));
        drop(c);
        daemon.assert_alive("a replaced kick eventfd written");
    }
}

/// Two rings share one non-blocking kick eventfd: each kick wakes both
/// workers, and the one that read second got `EAGAIN` from the library,
/// which ended its thread (within a few hundred kicks, prober). After
/// 1,000 kicks both workers must be there and serve their rings. (Which
/// worker sees a given kick is a race the frontend made by sharing the
/// eventfd: a worker whose epoll looks only after the other took the
/// count does not wake for it. So the requests are kicked until served.)
#[test]
fn two_rings_sharing_a_kick_eventfd_keep_their_workers() {
    let mut daemon = Daemon::spawn(&["--queues", "2"]);
    let c = Conn::negotiated(&daemon.sock);
    let mem = memfd(MEM_SIZE);
    let kick = EventFd::new(EFD_NONBLOCK).unwrap();
    let (call0, call1) = (
        EventFd::new(EFD_NONBLOCK).unwrap(),
        EventFd::new(EFD_NONBLOCK).unwrap(),
    );
    raw_ring(&c, &mem, &kick, &call0);
    raw_ring_at(&c, 1, 0xA0000, &kick, &call1);
    let sid = create_nist_session(&c);
    for _ in 0..1000 {
        kick.write(1).unwrap();
        std::thread::sleep(Duration::from_micros(100));
    }
    assert_eq!(
        vring_workers(daemon.pid()),
        2,
        "worker threads after 1,000 shared kicks"
    );
    both_rings_served_on_a_shared_kick(&mem, &kick, sid, "a shared kick eventfd");
    drop(c);
    daemon.assert_alive("a shared kick eventfd");
}

/// One NIST F.2.1 request on ring 0 (at [`RAW_DESC`]) and one on ring 1
/// (at 0xA0000, buffers from 0x30000), both rings kicked through the one
/// `kick` eventfd they share, until both are served (within [`TIMEOUT`]);
/// checks both results. Which worker sees a kick on a shared eventfd is a
/// race of the frontend's making (a worker whose epoll looks after the
/// other took the count does not wake), hence a kick every 10 ms.
fn both_rings_served_on_a_shared_kick(mem: &File, kick: &EventFd, sid: u64, what: &str) {
    use std::os::unix::fs::FileExt;
    submit_nist_at(mem, kick, RAW_DESC, RAW_HDR, sid, 1);
    submit_nist_at(mem, kick, 0xA0000, 0x30000, sid, 1);
    let start = Instant::now();
    while used_idx_at(mem, RAW_DESC) != 1 || used_idx_at(mem, 0xA0000) != 1 {
        assert!(
            start.elapsed() < TIMEOUT,
            "{what}: rings not served: used.idx {} and {}",
            used_idx_at(mem, RAW_DESC),
            used_idx_at(mem, 0xA0000)
        );
        kick.write(1).unwrap();
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_raw_nist_ok(1, raw_nist_result(mem, 1));
    let mut dst = vec![0u8; 64];
    mem.read_exact_at(&mut dst, 0x33000).unwrap();
    assert_eq!(dst, hex(NIST_CT), "{what}: ring 1: F.2.1 ciphertext");
}

/// The frontend reads its own kick eventfd right after each write (it
/// holds a copy): a worker woken for the kick found it empty, and the
/// library's `EAGAIN` ended the thread (after about 700 pairs, prober).
/// The ring must still be served after 5,000 such pairs.
#[test]
fn a_frontend_taking_back_its_kicks_keeps_the_worker() {
    let mut daemon = Daemon::spawn(&[]);
    let c = Conn::negotiated(&daemon.sock);
    let (mem, kick, _call, sid) = ring_with_one_request_served(&c);
    for i in 0..5000u32 {
        kick.write(1).unwrap();
        for _ in 0..(i % 50) * 20 {
            std::hint::spin_loop();
        }
        let _ = kick.read();
    }
    assert_eq!(
        vring_workers(daemon.pid()),
        1,
        "worker threads after 5,000 kicks taken back"
    );
    assert!(
        served_at(&mem, &kick, RAW_DESC, RAW_HDR, sid, 2),
        "request 2 not served"
    );
    assert_raw_nist_ok(2, raw_nist_result(&mem, 2));
    drop(c);
    daemon.assert_alive("kicks taken back");
}

/// Takes eventfd `efd`'s count to `u64::MAX`, which `write(2)` cannot (it
/// stops at `u64::MAX - 1`): that write, then one Linux AIO read whose
/// completion signals the eventfd (`IOCB_FLAG_RESFD`; the kernel's
/// `eventfd_signal` may reach `u64::MAX`). Such an eventfd polls as IN and
/// ERR. False where AIO is not available.
fn saturate_eventfd(efd: &EventFd) -> bool {
    /// `struct iocb` (linux/aio_abi.h, little-endian).
    #[repr(C)]
    #[derive(Default)]
    struct Iocb {
        aio_data: u64,
        aio_key: u32,
        aio_rw_flags: i32,
        aio_lio_opcode: u16,
        aio_reqprio: i16,
        aio_fildes: u32,
        aio_buf: u64,
        aio_nbytes: u64,
        aio_offset: i64,
        aio_reserved2: u64,
        aio_flags: u32,
        aio_resfd: u32,
    }
    const IOCB_CMD_PREAD: u16 = 0;
    const IOCB_FLAG_RESFD: u32 = 1;
    if efd.write(u64::MAX - 1).is_err() {
        return false;
    }
    let file = memfd(4096);
    let mut buf = [0u8; 16];
    let mut ctx: libc::c_ulong = 0;
    // SAFETY: io_setup(2) writes the context id into `ctx`.
    if unsafe { libc::syscall(libc::SYS_io_setup, 1, &mut ctx) } != 0 {
        return false;
    }
    let mut cb = Iocb {
        aio_lio_opcode: IOCB_CMD_PREAD,
        aio_fildes: file.as_raw_fd() as u32,
        aio_buf: buf.as_mut_ptr() as u64,
        aio_nbytes: buf.len() as u64,
        aio_flags: IOCB_FLAG_RESFD,
        aio_resfd: efd.as_raw_fd() as u32,
        ..Default::default()
    };
    let mut cbs = [&mut cb as *mut Iocb];
    let mut events = [0u64; 4 * 4];
    // SAFETY: io_submit(2) of one iocb whose buffer and descriptors outlive
    // the request (it is waited for with io_getevents(2) below, into room
    // for four 32-byte io_events), then io_destroy(2) of our context.
    let done = unsafe {
        libc::syscall(libc::SYS_io_submit, ctx, 1, cbs.as_mut_ptr()) == 1
            && libc::syscall(
                libc::SYS_io_getevents,
                ctx,
                1,
                1,
                events.as_mut_ptr(),
                std::ptr::null_mut::<libc::timespec>(),
            ) == 1
    };
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_io_destroy, ctx) };
    let mut p = libc::pollfd {
        fd: efd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll(2) on one pollfd of ours, without waiting.
    done && unsafe { libc::poll(&mut p, 1, 0) } == 1 && p.revents & libc::POLLERR != 0
}

/// User and system CPU time of process `pid` so far, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // (Fields after the command name's closing parenthesis: utime and
    // stime are the 12th and 13th.)
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// The share of one CPU process `pid` used over the next `span`.
fn cpu_busy(pid: u32, span: Duration) -> f64 {
    let (t0, ticks0) = (Instant::now(), cpu_ticks(pid));
    std::thread::sleep(span);
    let ticks = cpu_ticks(pid) - ticks0;
    // (USER_HZ: 100 ticks a second.)
    ticks as f64 / 100.0 / t0.elapsed().as_secs_f64()
}

/// A running ring gets a kick eventfd whose count the frontend took to
/// `u64::MAX` ([`saturate_eventfd`]): the worker's epoll reports it as IN
/// and ERR. The first version of the daemon's own kick watch returned on
/// any event set but IN before reading the kick, so the event came back at
/// once for ever: a core at 100 % and 40 MB of warnings a second (reviewer).
/// Now the count is read first: the worker settles, one warning at most,
/// and the next request kicked on that eventfd is served.
#[test]
fn a_kick_eventfd_at_its_largest_count_is_taken_not_spun_on() {
    let mut daemon = Daemon::spawn(&[]);
    let c = Conn::negotiated(&daemon.sock);
    let (mem, _kick, call, sid) = ring_with_one_request_served(&c);
    let kick2 = EventFd::new(EFD_NONBLOCK).unwrap();
    if !saturate_eventfd(&kick2) {
        skipped("Linux AIO is not available to take an eventfd to its largest count");
        return;
    }
    let log_before = std::fs::metadata(daemon.log()).unwrap().len();
    c.send(
        SET_VRING_KICK,
        V1 | NEED_REPLY,
        &0u64.to_le_bytes(),
        &[kick2.as_raw_fd()],
    )
    .unwrap();
    assert_eq!(c.reply_u64(SET_VRING_KICK), 0, "SET_VRING_KICK");
    std::thread::sleep(Duration::from_millis(100));
    let busy = cpu_busy(daemon.pid(), Duration::from_secs(1));
    let grew = std::fs::metadata(daemon.log()).unwrap().len() - log_before;
    assert!(
        busy < 0.5,
        "the daemon used {:.0} % of a CPU after the kick",
        busy * 100.0
    );
    assert!(grew < 4096, "the log grew by {grew} bytes after the kick");
    let _ = call.read();
    let (id, len, status, dst) = raw_nist_request(&mem, &kick2, &call, sid, 2);
    assert_raw_nist_ok(2, (id, len, status, dst));
    drop(c);
    daemon.assert_alive("a kick eventfd at its largest count");
}

// ---- Frontend descriptors, memory files and protocol features (ninth session) ----

/// A memfd in hugetlbfs (`MFD_HUGETLB | MFD_ALLOW_SEALING`) of `size`
/// bytes, or None where the kernel cannot make one.
fn hugetlb_memfd(size: u64) -> Option<File> {
    // SAFETY: a valid NUL-terminated name; the result is checked.
    let fd = unsafe {
        libc::memfd_create(
            c"frontend-faults-huge".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING | libc::MFD_HUGETLB,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: a fresh descriptor we own.
    let f = unsafe { File::from_raw_fd(fd) };
    f.set_len(size).ok()?;
    Some(f)
}

/// Field `name` (e.g. `HugePages_Free`) of /proc/meminfo; 0 if absent.
fn meminfo(name: &str) -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn free_huge_pages() -> u64 {
    meminfo("HugePages_Free")
}

/// Guest memory in a hugetlbfs memfd (QEMU's `memory-backend-memfd,
/// hugetlb=on`) with no huge pages behind it: the file has the size the
/// table says and takes F_SEAL_SHRINK, so the proxy's checks pass, but
/// the library maps it with `MAP_NORESERVE` and the first access to a page
/// no huge page can back raises SIGBUS (hugetlbfs has no overcommit). The
/// daemon must refuse the table or the ring (error ack or disconnect) and
/// serve the next frontend, as for a region larger than its file; a
/// mapping without `MAP_NORESERVE` fails with ENOMEM instead.
#[test]
fn hugetlb_guest_memory_without_huge_pages_does_not_kill_the_daemon() {
    const HUGE: u64 = 2 << 20;
    if hugetlb_memfd(HUGE).is_none() {
        skipped("no MFD_HUGETLB memfd here");
        return;
    }
    if free_huge_pages() > 0 {
        skipped("huge pages are free here, the memory is backed");
        return;
    }
    let mut failures = Vec::new();
    // Also with --require-sealed-memory: the file is sealed (F_SEAL_SHRINK
    // added), so the strict mode takes it too.
    for extra in [&[][..], &["--require-sealed-memory"][..]] {
        let mem = hugetlb_memfd(HUGE).unwrap();
        let mut daemon = Daemon::spawn(extra);
        let c = Conn::negotiated(&daemon.sock);
        let table = mem_table(&[(0, HUGE, UADDR, 0)]);
        c.send(SET_MEM_TABLE, V1 | NEED_REPLY, &table, &[mem.as_raw_fd()])
            .unwrap();
        let mut outcome = format!("SET_MEM_TABLE: {}", accepted_or_refused(&c, SET_MEM_TABLE));
        if outcome.ends_with("accepted") {
            let kick = EventFd::new(EFD_NONBLOCK).unwrap();
            let call = EventFd::new(EFD_NONBLOCK).unwrap();
            let addr = vring_addr(0, UADDR + RAW_DESC, UADDR + RAW_USED, UADDR + RAW_AVAIL);
            for (req, payload, fds) in [
                (SET_VRING_NUM, vring_state(0, 256), vec![]),
                (SET_VRING_BASE, vring_state(0, 0), vec![]),
                (SET_VRING_ADDR, addr, vec![]),
                (
                    SET_VRING_KICK,
                    0u64.to_le_bytes().to_vec(),
                    vec![kick.as_raw_fd()],
                ),
                (
                    SET_VRING_CALL,
                    0u64.to_le_bytes().to_vec(),
                    vec![call.as_raw_fd()],
                ),
            ] {
                if c.send(req, V1 | NEED_REPLY, &payload, &fds).is_err() {
                    outcome = format!("{outcome}; request {req}: send failed");
                    break;
                }
                let o = accepted_or_refused(&c, req);
                outcome = format!("{outcome}; request {req}: {o}");
                if o != "accepted" {
                    break;
                }
            }
            let _ = kick.write(1);
            std::thread::sleep(Duration::from_millis(100));
        }
        drop(c);
        std::thread::sleep(Duration::from_millis(100));
        match daemon.child.try_wait().unwrap() {
            Some(st) => failures.push(format!("{extra:?}: {outcome}; the daemon died: {st}")),
            None => {
                daemon.assert_alive(&format!("hugetlb guest memory without huge pages ({outcome})"));
                assert_nist(&daemon.sock, "hugetlb guest memory without huge pages");
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Connections of one kind, `n` of them in a row; resource use of the
/// daemon before and after (idle snapshots).
fn per_kind_growth(daemon: &Daemon, n: usize, mut one: impl FnMut(&Path)) -> (Snapshot, Snapshot) {
    let before = daemon.idle_snapshot();
    for _ in 0..n {
        one(&daemon.sock);
    }
    // The last one's teardown.
    let after = daemon.idle_snapshot();
    (before, after)
}

#[test]
fn connection_kinds_leave_no_descriptors_or_threads_behind() {
    let mut daemon = Daemon::spawn(&[]);
    let mut report = Vec::new();
    let n = 60;
    type Kind = (&'static str, Box<dyn FnMut(&Path)>);
    let kinds: Vec<Kind> = vec![
        ("connect+close", Box::new(|s: &Path| drop(Conn::open(s)))),
        ("negotiated", Box::new(|s: &Path| drop(Conn::negotiated(s)))),
        (
            "ring+session, no GET_VRING_BASE",
            Box::new(|s: &Path| drop(ring_with_one_request_served(&Conn::negotiated(s)))),
        ),
        (
            "33 fds on GET_FEATURES",
            Box::new(|s: &Path| {
                let c = Conn::negotiated(s);
                let evs: Vec<EventFd> = (0..33).map(|_| EventFd::new(EFD_NONBLOCK).unwrap()).collect();
                let fds: Vec<RawFd> = evs.iter().map(|e| e.as_raw_fd()).collect();
                let _ = c.send(GET_FEATURES, V1, &[], &fds);
                let _ = c.recv();
            }),
        ),
        (
            "SET_VRING_ERR",
            Box::new(|s: &Path| {
                let c = Conn::negotiated(s);
                let e = EventFd::new(EFD_NONBLOCK).unwrap();
                c.send(
                    SET_VRING_ERR,
                    V1 | NEED_REPLY,
                    &0u64.to_le_bytes(),
                    &[e.as_raw_fd()],
                )
                .unwrap();
                let _ = c.recv();
            }),
        ),
        (
            "SET_DEVICE_STATE_FD",
            Box::new(|s: &Path| {
                let c = Conn::negotiated(s);
                let (r, _w) = pipe();
                let mut p = 0u32.to_le_bytes().to_vec();
                p.extend_from_slice(&0u32.to_le_bytes());
                c.send(42, V1, &p, &[r.as_raw_fd()]).unwrap();
                let _ = c.recv();
            }),
        ),
        (
            "BACKEND_REQ acked + SET_BACKEND_REQ_FD",
            Box::new(|s: &Path| {
                let c = Conn::negotiated(s);
                c.send(
                    SET_PROTOCOL_FEATURES,
                    V1 | NEED_REPLY,
                    &(PF_CRYPTO_SESSION | PF_REPLY_ACK | 1 << 5).to_le_bytes(),
                    &[],
                )
                .unwrap();
                let _ = c.recv();
                // (BACKEND_REQ was not offered: the daemon has closed the
                // connection by now.)
                let (a, _b) = UnixStream::pair().unwrap();
                let _ = c.send(21, V1 | NEED_REPLY, &[], &[a.as_raw_fd()]);
                let _ = c.recv();
            }),
        ),
    ];
    for (name, mut one) in kinds {
        let (b, a) = per_kind_growth(&daemon, n, &mut one);
        report.push(format!(
            "{name}: fds {} -> {}, threads {} -> {}, rss {} -> {} KiB, maps {} -> {}",
            b.fds, a.fds, b.threads, a.threads, b.rss_kib, a.rss_kib, b.memfd_maps, a.memfd_maps
        ));
        assert_eq!(
            (a.fds, a.threads, a.memfd_maps),
            (b.fds, b.threads, 0),
            "after {n} x {name}"
        );
        assert!(
            a.rss_kib < b.rss_kib + 2048,
            "RSS after {n} x {name}: {} -> {} KiB",
            b.rss_kib,
            a.rss_kib
        );
    }
    daemon.assert_alive("probes");
    eprintln!("{}", report.join("\n"));
}

/// What came back for one request on a raw connection (any reply).
fn outcome_of(c: &Conn) -> String {
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

#[test]
fn message_variants_get_an_answer_or_a_clean_disconnect() {
    let mut daemon = Daemon::spawn(&[]);
    let mut report = Vec::new();
    let mem = memfd(MEM_SIZE);
    let mfd = mem.as_raw_fd();
    let two = memfd(2 * MEM_SIZE);
    let spare = EventFd::new(EFD_NONBLOCK).unwrap();
    type Step = (u32, u32, Vec<u8>, Vec<RawFd>);
    let ack = |pf: u64| {
        (
            SET_PROTOCOL_FEATURES,
            V1 | NEED_REPLY,
            (PF_CRYPTO_SESSION | PF_REPLY_ACK | pf).to_le_bytes().to_vec(),
            vec![],
        )
    };
    let mt =
        |r: &[(u64, u64, u64, u64)], fds: Vec<RawFd>| (SET_MEM_TABLE, V1 | NEED_REPLY, mem_table(r), fds);
    let cases: Vec<(&str, Vec<Step>)> = vec![
        (
            "overlapping regions",
            vec![mt(
                &[(0, MEM_SIZE, UADDR, 0), (0x8000, MEM_SIZE, UADDR + (4 << 20), 0)],
                vec![mfd, mfd],
            )],
        ),
        (
            "offset beyond file",
            vec![mt(&[(0, 4096, UADDR, 2 * MEM_SIZE)], vec![mfd])],
        ),
        (
            "offset not page aligned",
            vec![mt(&[(0, 4096, UADDR, 100)], vec![mfd])],
        ),
        (
            "size not page multiple",
            vec![mt(&[(0, 100, UADDR, 0)], vec![mfd])],
        ),
        (
            "gpa near u64 max",
            vec![mt(&[(u64::MAX - 4095, 4096, UADDR, 0)], vec![mfd])],
        ),
        (
            "uaddr overlap",
            vec![mt(
                &[(0, MEM_SIZE, UADDR, 0), (4 << 20, MEM_SIZE, UADDR, 0)],
                vec![mfd, mfd],
            )],
        ),
        (
            "32 regions",
            vec![mt(
                &(0..32)
                    .map(|i| (i << 16, 1 << 16, UADDR + (i << 16), i << 15))
                    .collect::<Vec<_>>(),
                vec![two.as_raw_fd(); 32],
            )],
        ),
        (
            "SET_MEM_TABLE twice, then ring",
            vec![
                mt(&[(0, MEM_SIZE, UADDR, 0)], vec![mfd]),
                mt(&[(0, MEM_SIZE, UADDR, 0)], vec![mfd]),
                (SET_VRING_NUM, V1 | NEED_REPLY, vring_state(0, 256), vec![]),
                (
                    SET_VRING_ADDR,
                    V1 | NEED_REPLY,
                    vring_addr(0, UADDR + RAW_DESC, UADDR + RAW_USED, UADDR + RAW_AVAIL),
                    vec![],
                ),
            ],
        ),
        (
            "ring crosses end of memory",
            vec![
                mt(&[(0, MEM_SIZE, UADDR, 0)], vec![mfd]),
                (SET_VRING_NUM, V1 | NEED_REPLY, vring_state(0, 256), vec![]),
                (
                    SET_VRING_ADDR,
                    V1 | NEED_REPLY,
                    vring_addr(
                        0,
                        UADDR + MEM_SIZE - 16,
                        UADDR + MEM_SIZE - 8,
                        UADDR + MEM_SIZE - 2,
                    ),
                    vec![],
                ),
            ],
        ),
        (
            "ring misaligned",
            vec![
                mt(&[(0, MEM_SIZE, UADDR, 0)], vec![mfd]),
                (SET_VRING_NUM, V1 | NEED_REPLY, vring_state(0, 256), vec![]),
                (
                    SET_VRING_ADDR,
                    V1 | NEED_REPLY,
                    vring_addr(
                        0,
                        UADDR + RAW_DESC + 1,
                        UADDR + RAW_USED + 1,
                        UADDR + RAW_AVAIL + 1,
                    ),
                    vec![],
                ),
            ],
        ),
        (
            "ring at uaddr end of region",
            vec![
                mt(&[(0, MEM_SIZE, UADDR, 0)], vec![mfd]),
                (SET_VRING_NUM, V1 | NEED_REPLY, vring_state(0, 256), vec![]),
                (
                    SET_VRING_ADDR,
                    V1 | NEED_REPLY,
                    vring_addr(0, UADDR + MEM_SIZE, UADDR + RAW_USED, UADDR + RAW_AVAIL),
                    vec![],
                ),
            ],
        ),
        ("GET_CONFIG unacked", vec![(24, V1, vec![0; 12 + 8], vec![])]),
        (
            "CONFIG acked, GET_CONFIG 8",
            vec![ack(1 << 9), {
                let mut p = 0u32.to_le_bytes().to_vec();
                p.extend_from_slice(&8u32.to_le_bytes());
                p.extend_from_slice(&0u32.to_le_bytes());
                p.extend_from_slice(&[0; 8]);
                (24, V1, p, vec![])
            }],
        ),
        (
            "CONFIG acked, GET_CONFIG off huge",
            vec![ack(1 << 9), {
                let mut p = u32::MAX.to_le_bytes().to_vec();
                p.extend_from_slice(&256u32.to_le_bytes());
                p.extend_from_slice(&0u32.to_le_bytes());
                p.extend_from_slice(&[0; 256]);
                (24, V1, p, vec![])
            }],
        ),
        (
            "CONFIG acked, SET_CONFIG",
            vec![ack(1 << 9), {
                let mut p = 0u32.to_le_bytes().to_vec();
                p.extend_from_slice(&8u32.to_le_bytes());
                p.extend_from_slice(&0u32.to_le_bytes());
                p.extend_from_slice(&[0; 8]);
                (25, V1 | NEED_REPLY, p, vec![])
            }],
        ),
        (
            "INFLIGHT acked, GET_INFLIGHT_FD",
            vec![ack(1 << 12), (31, V1, vec![0; 24], vec![])],
        ),
        (
            "LOG_SHMFD acked, SET_LOG_BASE",
            vec![ack(1 << 1), (6, V1, vec![0; 16], vec![mfd])],
        ),
        ("SET_LOG_FD", vec![(7, V1 | NEED_REPLY, vec![], vec![mfd])]),
        ("GPU_SET_SOCKET", vec![(33, V1 | NEED_REPLY, vec![], vec![mfd])]),
        ("CHECK_DEVICE_STATE", vec![(43, V1, vec![], vec![])]),
        ("RESET_DEVICE", vec![(34, V1 | NEED_REPLY, vec![], vec![])]),
        ("RESET_OWNER", vec![(4, V1 | NEED_REPLY, vec![], vec![])]),
        (
            "SET_OWNER twice",
            vec![(SET_OWNER, V1 | NEED_REPLY, vec![], vec![])],
        ),
        ("GET_QUEUE_NUM unacked", vec![(17, V1, vec![], vec![])]),
        ("MQ acked GET_QUEUE_NUM", vec![ack(1), (17, V1, vec![], vec![])]),
        (
            "GET_MAX_MEM_SLOTS acked",
            vec![ack(1 << 15), (36, V1, vec![], vec![])],
        ),
        (
            "ADD_MEM_REG unacked",
            vec![(
                37,
                V1 | NEED_REPLY,
                {
                    let mut p = vec![0u8; 8];
                    for v in [0, MEM_SIZE, UADDR, 0u64] {
                        p.extend_from_slice(&v.to_le_bytes());
                    }
                    p
                },
                vec![mfd],
            )],
        ),
        (
            "VRING_KICK msg 35",
            vec![(35, V1 | NEED_REPLY, vring_state(0, 0), vec![])],
        ),
        ("SET_STATUS", vec![(39, V1 | NEED_REPLY, vec![0; 8], vec![])]),
        ("GET_STATUS", vec![(40, V1, vec![], vec![])]),
        (
            "CREATE 0 bytes",
            vec![(CREATE_CRYPTO_SESSION, V1, vec![], vec![])],
        ),
        (
            "CREATE 631",
            vec![(CREATE_CRYPTO_SESSION, V1, vec![0; 631], vec![])],
        ),
        (
            "CREATE 633",
            vec![(CREATE_CRYPTO_SESSION, V1, vec![0; 633], vec![])],
        ),
        (
            "CREATE 1071",
            vec![(CREATE_CRYPTO_SESSION, V1, vec![0; 1071], vec![])],
        ),
        (
            "CREATE 4096",
            vec![(CREATE_CRYPTO_SESSION, V1, vec![0; 4096], vec![])],
        ),
        ("CREATE 7", vec![(CREATE_CRYPTO_SESSION, V1, vec![0; 7], vec![])]),
        (
            "CREATE with fd",
            vec![(CREATE_CRYPTO_SESSION, V1, vec![0; 1072], vec![mfd])],
        ),
        (
            "CREATE with REPLY flag",
            vec![(CREATE_CRYPTO_SESSION, V1 | REPLY, vec![0; 1072], vec![])],
        ),
        (
            "CLOSE 0 bytes NEED_REPLY",
            vec![(27, V1 | NEED_REPLY, vec![], vec![])],
        ),
        (
            "CLOSE 16 bytes NEED_REPLY",
            vec![(27, V1 | NEED_REPLY, vec![0; 16], vec![])],
        ),
        (
            "CLOSE with fd NEED_REPLY",
            vec![(27, V1 | NEED_REPLY, 1u64.to_le_bytes().to_vec(), vec![mfd])],
        ),
        (
            "KICK index 255 nofd",
            vec![(
                SET_VRING_KICK,
                V1 | NEED_REPLY,
                0x1ffu64.to_le_bytes().to_vec(),
                vec![],
            )],
        ),
        (
            "KICK nofd with fd",
            vec![(
                SET_VRING_KICK,
                V1 | NEED_REPLY,
                0x100u64.to_le_bytes().to_vec(),
                vec![spare.as_raw_fd()],
            )],
        ),
        (
            "KICK high bits",
            vec![(
                SET_VRING_KICK,
                V1 | NEED_REPLY,
                (1u64 << 40).to_le_bytes().to_vec(),
                vec![],
            )],
        ),
        (
            "KICK payload 16",
            vec![(SET_VRING_KICK, V1 | NEED_REPLY, vec![0; 16], vec![])],
        ),
        (
            "KICK payload 4",
            vec![(SET_VRING_KICK, V1 | NEED_REPLY, vec![0; 4], vec![])],
        ),
        (
            "VRING_NUM payload 4",
            vec![(SET_VRING_NUM, V1 | NEED_REPLY, vec![0; 4], vec![])],
        ),
        (
            "VRING_NUM payload 12",
            vec![(
                SET_VRING_NUM,
                V1 | NEED_REPLY,
                {
                    let mut p = vring_state(0, 0);
                    p.extend_from_slice(&[0; 4]);
                    p
                },
                vec![],
            )],
        ),
        (
            "VRING_BASE payload 12 big",
            vec![(
                SET_VRING_BASE,
                V1 | NEED_REPLY,
                {
                    let mut p = vring_state(0, u32::MAX);
                    p.extend_from_slice(&[0; 4]);
                    p
                },
                vec![],
            )],
        ),
        (
            "VRING_ENABLE index huge",
            vec![(
                SET_VRING_ENABLE,
                V1 | NEED_REPLY,
                vring_state(u32::MAX, 1),
                vec![],
            )],
        ),
        (
            "GET_VRING_BASE index huge",
            vec![(GET_VRING_BASE, V1, vring_state(u32::MAX, 0), vec![])],
        ),
        (
            "SET_FEATURES payload 0",
            vec![(SET_FEATURES, V1 | NEED_REPLY, vec![], vec![])],
        ),
        (
            "SET_PROTOCOL_FEATURES all",
            vec![(
                SET_PROTOCOL_FEATURES,
                V1 | NEED_REPLY,
                u64::MAX.to_le_bytes().to_vec(),
                vec![],
            )],
        ),
    ];
    for (name, steps) in cases {
        let c = Conn::negotiated(&daemon.sock);
        let mut outs = Vec::new();
        for (req, flags, payload, fds) in steps {
            if let Err(e) = c.send(req, flags, &payload, &fds) {
                outs.push(format!("send: {e}"));
                break;
            }
            c.s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
            let o = outcome_of(&c);
            let stop = o == "disconnect";
            outs.push(o);
            if stop {
                break;
            }
        }
        c.s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        if outs.last().is_none_or(|o| o != "disconnect") {
            let _ = c.send(GET_FEATURES, V1, &[], &[]);
            outs.push(format!("then GET_FEATURES: {}", outcome_of(&c)));
        }
        drop(c);
        daemon.assert_alive(name);
        report.push(format!("{name}: {}", outs.join("; ")));
    }
    assert_nist(&daemon.sock, "probes");
    eprintln!("{}", report.join("\n"));
}

/// A TCP socket whose close(2) blocks: connected over loopback to a peer
/// that never reads, its send buffer full, `SO_LINGER` on for an hour
/// (socket(7): close then waits until the queued data is sent or the
/// linger time is over). Returns (the socket, the peer); the peer must stay
/// open, or its RST ends the wait.
fn lingering_tcp_socket() -> (std::net::TcpStream, std::net::TcpStream) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let s = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (peer, _) = l.accept().unwrap();
    s.set_nonblocking(true).unwrap();
    let chunk = [0u8; 65536];
    let start = Instant::now();
    loop {
        match (&s).write(&chunk) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // The peer's receive window may still open a little.
                std::thread::sleep(Duration::from_millis(20));
                if (&s).write(&chunk).is_err() {
                    break;
                }
            }
            Err(e) => panic!("filling the TCP send buffer: {e}"),
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "TCP send buffer never filled"
        );
    }
    s.set_nonblocking(false).unwrap();
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 3600,
    };
    // SAFETY: setsockopt with a linger struct of ours on a socket we own.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "SO_LINGER: {}", io::Error::last_os_error());
    (s, peer)
}

/// Sends `bytes` with `sock` attached so that the daemon holds the last
/// reference to it: the message goes behind 1,000 refused CREATEs whose
/// replies are not read yet (the daemon's request pump stops after the
/// first few hundred, its socket buffer to us full), our copy is closed
/// while the message waits unread, then the replies are read and the pump
/// goes on to it.
fn hand_over_last_reference(c: &Conn, bytes: &[u8], sock: std::net::TcpStream, extra: usize) {
    const N: usize = 1000;
    let big: libc::c_int = 16 << 20;
    // SAFETY: setsockopt with an int of ours on a socket we own (as root;
    // SO_SNDBUF, capped by wmem_max, otherwise).
    unsafe {
        for opt in [libc::SO_SNDBUFFORCE, libc::SO_SNDBUF] {
            libc::setsockopt(
                c.s.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&big as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }
    let refused = Conn::message(CREATE_CRYPTO_SESSION, V1, &[0u8; 1072]);
    let all: Vec<u8> = refused.iter().copied().cycle().take(refused.len() * N).collect();
    (&c.s).write_all(&all).unwrap();
    let others: Vec<EventFd> = (0..extra).map(|_| EventFd::new(EFD_NONBLOCK).unwrap()).collect();
    let mut fds = vec![sock.as_raw_fd()];
    fds.extend(others.iter().map(|e| e.as_raw_fd()));
    c.send_bytes(bytes, &fds).unwrap();
    // The daemon has not read this message yet: the in-flight copy keeps
    // the socket open, and this close returns at once.
    drop(sock);
    for _ in 0..N {
        let p = c.reply(CREATE_CRYPTO_SESSION);
        assert_eq!(
            i64::from_le_bytes(p[1064..1072].try_into().unwrap()),
            -3,
            "refused CREATE"
        );
    }
}

/// Makes the daemon's close of a lingering TCP socket (attached to a
/// GET_FEATURES with 31 eventfds) block, then sends GET_FEATURES messages
/// with up to 32 copies of an eventfd each, until `total` descriptors
/// (the socket included) went with answered messages or the daemon ends
/// the connection. Returns the socket's peer (keep it open, or the close
/// ends) and how many were answered.
fn queue_behind_a_blocked_close(c: &Conn, total: usize) -> (std::net::TcpStream, usize) {
    let (sock, peer) = lingering_tcp_socket();
    hand_over_last_reference(c, &Conn::message(GET_FEATURES, V1, &[]), sock, 31);
    assert!(matches!(c.recv(), Got::Msg(GET_FEATURES, ..)));
    let ev = EventFd::new(EFD_NONBLOCK).unwrap();
    let mut sent = 32;
    while sent < total {
        let n = (total - sent).min(32);
        if c.send(GET_FEATURES, V1, &[], &vec![ev.as_raw_fd(); n]).is_err()
            || !matches!(c.recv(), Got::Msg(GET_FEATURES, ..))
        {
            break;
        }
        sent += n;
    }
    (peer, sent)
}

/// Whether the daemon answers a GET_FEATURES on a new connection within
/// `limit`; Err with what happened instead (exit status or no answer).
fn served_within(daemon: &mut Daemon, limit: Duration) -> Result<Duration, String> {
    let start = Instant::now();
    let c = Conn::open(&daemon.sock);
    c.s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    c.send(GET_FEATURES, V1, &[], &[]).unwrap();
    loop {
        match c.recv() {
            Got::Msg(GET_FEATURES, ..) => return Ok(start.elapsed()),
            Got::Msg(r, ..) => return Err(format!("unexpected reply {r}")),
            Got::Closed => {
                std::thread::sleep(Duration::from_millis(500));
                return Err(match daemon.child.try_wait().unwrap() {
                    Some(st) => format!("daemon exited: {st}"),
                    None => "connection closed".into(),
                });
            }
            Got::TimedOut => {}
        }
        if let Some(st) = daemon.child.try_wait().unwrap() {
            return Err(format!("daemon exited: {st}"));
        }
        if start.elapsed() > limit {
            let pid = daemon.pid();
            let threads: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
                .map(|d| {
                    d.flatten()
                        .map(|t| {
                            let f = |n: &str| std::fs::read_to_string(t.path().join(n)).unwrap_or_default();
                            format!("{} in {}", f("comm").trim(), f("wchan").trim())
                        })
                        .collect()
                })
                .unwrap_or_default();
            return Err(format!(
                "no answer within {limit:?}, daemon still running (wedged); its threads: {}",
                threads.join(", ")
            ));
        }
    }
}

/// Descriptors on messages that take none, or that the daemon refuses,
/// are closed by the daemon; the frontend chooses what they are. A TCP
/// socket with `SO_LINGER` and unsent data makes that close(2) block for
/// as long as the frontend likes (here an hour). The daemon must still
/// tear the connection down and serve the next frontend (or, as a last
/// resort, exit with status 3), not hang for good.
#[test]
fn a_lingering_socket_attached_to_a_message_cannot_wedge_the_daemon() {
    let create = create_request(SessionAbi::C, &session(&hex(NIST_KEY), 1));
    // (what, request bytes): a CREATE (answered by the proxy, takes no fd)
    // and a SET_VRING_KICK (refused: not an eventfd).
    // (what, request bytes, more eventfds attached)
    let cases: [(&str, Vec<u8>, usize); 4] = [
        ("CREATE_CRYPTO_SESSION with a socket attached", create.to_vec(), 0),
        (
            "SET_VRING_KICK with a socket instead of an eventfd",
            Conn::message(SET_VRING_KICK, V1, &0u64.to_le_bytes()),
            0,
        ),
        (
            "GET_FEATURES with a socket and 32 eventfds attached (33 > 32 descriptors)",
            Conn::message(GET_FEATURES, V1, &[]),
            32,
        ),
        (
            "GET_FEATURES with a socket attached",
            Conn::message(GET_FEATURES, V1, &[]),
            0,
        ),
    ];
    let mut failures = Vec::new();
    for (what, bytes, extra) in cases {
        let mut daemon = Daemon::spawn(&[]);
        let c = Conn::negotiated(&daemon.sock);
        let (sock, peer) = lingering_tcp_socket();
        hand_over_last_reference(&c, &bytes, sock, extra);
        c.s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let first = match c.recv() {
            Got::Msg(r, f, p) => format!("reply {r} (flags {f:#x}, {} bytes)", p.len()),
            other => format!("{other:?}"),
        };
        drop(c);
        // Not even the last resort (exit status 3): the daemon never
        // closes such a descriptor where it waits for it.
        match served_within(&mut daemon, Duration::from_secs(5)) {
            Ok(t) => eprintln!("{what}: daemon's answer {first}; next frontend served after {t:?}"),
            Err(e) => failures.push(format!("{what} (daemon's answer: {first}), then disconnect: {e}")),
        }
        drop(peer);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn honest_frontends_are_torn_down_promptly() {
    let mut daemon = Daemon::spawn(&[]);
    let mut worst = Duration::ZERO;
    let mut total = Duration::ZERO;
    let n = 100;
    let base = daemon.idle_snapshot();
    for i in 0..n {
        let mut fe = frontend(&daemon.sock, &cfg(SessionAbi::C, 1, 64, 8, 64));
        let e = fe.create_session(&session(&hex(NIST_KEY), 1)).unwrap();
        assert_eq!(run_one(&mut fe, ENCRYPT, e as u64, &hex(NIST_PT)).0, ST_OK);
        if i % 2 == 0 {
            let _ = fe.get_vring_base(0);
        }
        drop(fe);
        let t = served_within(&mut daemon, Duration::from_secs(10)).unwrap();
        worst = worst.max(t);
        total += t;
    }
    let after = daemon.idle_snapshot();
    eprintln!(
        "teardown latency: mean {:?}, worst {:?}; fds {} -> {}, threads {} -> {}, rss {} -> {}",
        total / n,
        worst,
        base.fds,
        after.fds,
        base.threads,
        after.threads,
        base.rss_kib,
        after.rss_kib
    );
    assert!(
        worst < Duration::from_secs(1),
        "an honest frontend's teardown took {worst:?}"
    );
    assert_eq!((after.fds, after.threads), (base.fds, base.threads));
}

/// `VHOST_USER_PROTOCOL_F_*` bits the daemon does not offer (vhost-user
/// spec, "Protocol features"): CONFIG, INFLIGHT_SHMFD, CONFIGURE_MEM_SLOTS.
const PF_CONFIG: u64 = 1 << 9;
const PF_INFLIGHT_SHMFD: u64 = 1 << 12;
const PF_CONFIGURE_MEM_SLOTS: u64 = 1 << 15;
const GET_MAX_MEM_SLOTS: u32 = 36;
const ADD_MEM_REG: u32 = 37;

/// SET_PROTOCOL_FEATURES with bits GET_PROTOCOL_FEATURES did not offer
/// must be refused (error ack or disconnect), as SET_FEATURES with
/// unoffered virtio bits is (`malformed_messages_never_crash_the_daemon`):
/// a feature is negotiated only when the backend offered it and the
/// frontend acked it, and the messages those features bring
/// (GET_CONFIG/SET_CONFIG, GET_INFLIGHT_FD, ADD_MEM_REG/REM_MEM_REG) are
/// otherwise served by code paths the daemon never meant to expose.
#[test]
fn protocol_features_the_backend_did_not_offer_are_refused() {
    let mut daemon = Daemon::spawn(&[]);
    let mut accepted = Vec::new();
    for (name, bit) in [
        ("CONFIG", PF_CONFIG),
        ("INFLIGHT_SHMFD", PF_INFLIGHT_SHMFD),
        ("CONFIGURE_MEM_SLOTS", PF_CONFIGURE_MEM_SLOTS),
        ("all 64 bits", u64::MAX),
    ] {
        let c = Conn::negotiated(&daemon.sock);
        c.send(GET_PROTOCOL_FEATURES, V1, &[], &[]).unwrap();
        let offered = c.reply_u64(GET_PROTOCOL_FEATURES);
        assert_ne!(bit & !offered, 0, "{name} is offered ({offered:#x})");
        c.send(
            SET_PROTOCOL_FEATURES,
            V1 | NEED_REPLY,
            &(PF_CRYPTO_SESSION | PF_REPLY_ACK | bit).to_le_bytes(),
            &[],
        )
        .unwrap();
        let o = accepted_or_refused(&c, SET_PROTOCOL_FEATURES);
        if o == "accepted" {
            accepted.push(format!("{name} ({bit:#x}; offered {offered:#x})"));
        }
        drop(c);
        daemon.assert_alive(name);
    }
    assert!(
        accepted.is_empty(),
        "SET_PROTOCOL_FEATURES acked with 0 for bits never offered: {}",
        accepted.join(", ")
    );
}

/// The daemon answers GET_MAX_MEM_SLOTS (once a frontend acked
/// CONFIGURE_MEM_SLOTS, which it never offered, see
/// `protocol_features_the_backend_did_not_offer_are_refused`) with 509;
/// ADD_MEM_REG past that many regions must be refused (error ack or
/// disconnect), not mapped: each region keeps the frontend's descriptor
/// open in the daemon, so the frontend could otherwise pile up mappings
/// and descriptors until the process limit.
#[test]
fn add_mem_reg_past_the_slots_the_daemon_reported_is_refused() {
    let mut daemon = Daemon::spawn(&[]);
    let c = Conn::negotiated(&daemon.sock);
    c.send(
        SET_PROTOCOL_FEATURES,
        V1 | NEED_REPLY,
        &(PF_CRYPTO_SESSION | PF_REPLY_ACK | PF_CONFIGURE_MEM_SLOTS).to_le_bytes(),
        &[],
    )
    .unwrap();
    if accepted_or_refused(&c, SET_PROTOCOL_FEATURES) != "accepted" {
        // Refused at negotiation: no ADD_MEM_REG to send.
        return;
    }
    c.send(GET_MAX_MEM_SLOTS, V1, &[], &[]).unwrap();
    let slots = c.reply_u64(GET_MAX_MEM_SLOTS);
    let before = daemon.snapshot();
    let page = memfd(4096);
    let mut added = 0u64;
    for i in 0..slots + 100 {
        // VhostUserSingleMemoryRegion: padding, guest address, size,
        // frontend address, mmap offset; one 4 KiB region per message.
        let mut p = vec![0u8; 8];
        for v in [i * 4096, 4096, UADDR + i * 4096, 0] {
            p.extend_from_slice(&v.to_le_bytes());
        }
        c.send(ADD_MEM_REG, V1 | NEED_REPLY, &p, &[page.as_raw_fd()])
            .unwrap();
        if accepted_or_refused(&c, ADD_MEM_REG) != "accepted" {
            break;
        }
        added += 1;
    }
    let after = daemon.snapshot();
    drop(c);
    daemon.assert_alive("ADD_MEM_REG past the slots");
    assert!(
        added <= slots,
        "{added} regions added, GET_MAX_MEM_SLOTS said {slots}; daemon descriptors {} -> {}",
        before.fds,
        after.fds
    );
}

/// Keeps the inode lock of `mem` (a shmem file) held: a thread writes to
/// it from a page registered with a userfaultfd nobody serves, so the
/// write waits in the page fault with the lock taken (shmem's write path
/// holds it across the copy). Dropping the returned userfaultfd lets the
/// fault and the write finish. None where userfaultfd is not available.
fn hold_inode_lock(mem: &File) -> Option<(File, std::thread::JoinHandle<()>)> {
    // SAFETY: userfaultfd(2) with flags; the result is checked.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC) } as RawFd;
    if fd < 0 {
        return None;
    }
    // SAFETY: a fresh descriptor we own.
    let uffd = unsafe { File::from_raw_fd(fd) };
    // struct uffdio_api { api, features, ioctls }: UFFDIO_API = _IOWR(0xAA, 0x3F, 24 bytes).
    let mut api = [0xAAu64, 0, 0];
    // SAFETY: ioctl with a 24-byte struct of ours.
    if unsafe { libc::ioctl(fd, 0xc018_aa3f, api.as_mut_ptr()) } < 0 {
        return None;
    }
    // SAFETY: an anonymous private page, checked below.
    let page = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(page, libc::MAP_FAILED);
    // struct uffdio_register { start, len, mode, ioctls }: _IOWR(0xAA, 0x00, 32 bytes); MODE_MISSING = 1.
    let mut reg = [page as u64, 4096, 1, 0];
    // SAFETY: ioctl with a 32-byte struct of ours.
    if unsafe { libc::ioctl(fd, 0xc020_aa00, reg.as_mut_ptr()) } < 0 {
        return None;
    }
    let writer = mem.try_clone().unwrap();
    let addr = page as usize;
    let t = std::thread::spawn(move || {
        // SAFETY: pwrite from the registered page (its fault waits until
        // the userfaultfd is closed); the page stays mapped for good.
        unsafe { libc::pwrite(writer.as_raw_fd(), addr as *const libc::c_void, 4096, 0) };
    });
    // Wait until the writer sits in the fault.
    let start = Instant::now();
    loop {
        let tid_wchan = std::fs::read_dir("/proc/self/task")
            .unwrap()
            .flatten()
            .any(|t| std::fs::read_to_string(t.path().join("wchan")).is_ok_and(|w| w.contains("userfault")));
        if tid_wchan {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the writer never reached the fault"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    Some((uffd, t))
}

/// A sealable memfd of [`MEM_SIZE`] whose inode lock [`hold_inode_lock`]
/// holds until [`LockedMemfd::release`]; None (the test skips) where
/// userfaultfd is not available.
struct LockedMemfd {
    mem: File,
    uffd: File,
    writer: std::thread::JoinHandle<()>,
}

impl LockedMemfd {
    fn new() -> Option<Self> {
        let mem = sealable_memfd(MEM_SIZE);
        let (uffd, writer) = hold_inode_lock(&mem)?;
        Some(LockedMemfd { mem, uffd, writer })
    }

    /// Lets the stuck write (and any check of the daemon's waiting on the
    /// lock) go on, and waits for the write.
    fn release(self) {
        drop(self.uffd);
        self.writer.join().unwrap();
    }
}

/// Sends SET_MEM_TABLE (`table`, one descriptor per entry of `fds`) with
/// NEED_REPLY on a new connection and returns what came back within 4 s;
/// the connection is closed afterwards.
fn send_mem_table(sock: &Path, table: &[u8], fds: &[RawFd]) -> Got {
    let c = Conn::negotiated(sock);
    c.send(SET_MEM_TABLE, V1 | NEED_REPLY, table, fds).unwrap();
    c.s.set_read_timeout(Some(Duration::from_secs(4))).unwrap();
    c.recv()
}

/// The frontend holds the inode lock of its guest memory memfd (a write
/// to it stuck in a page fault) while it sends SET_MEM_TABLE: the proxy's
/// F_ADD_SEALS (memfd_add_seals takes the inode lock) then waits on the
/// request pump for as long as the frontend likes. Once the frontend has
/// left, the daemon must still tear the connection down and serve the
/// next frontend (or exit with status 3 as a last resort), not hang.
#[test]
fn a_frontend_holding_its_memfd_locked_cannot_wedge_the_daemon() {
    let mut daemon = Daemon::spawn(&[]);
    let Some(locked) = LockedMemfd::new() else {
        skipped("no userfaultfd here");
        return;
    };
    let table = mem_table(&[(0, MEM_SIZE, UADDR, 0)]);
    let first = match send_mem_table(&daemon.sock, &table, &[locked.mem.as_raw_fd()]) {
        Got::Msg(r, f, p) => format!("reply {r} (flags {f:#x}, {} bytes)", p.len()),
        other => format!("{other:?}"),
    };
    // The checks of the table's files give up after 2 s.
    let r = served_within(&mut daemon, Duration::from_secs(5));
    // Let the write (and the daemon's check) go on.
    locked.release();
    match r {
        Ok(t) => eprintln!("next frontend served after {t:?}"),
        Err(e) => panic!("SET_MEM_TABLE (answer: {first}), then disconnect: {e}"),
    }
    // Refused once its checks took 2 s: the connection ends.
    assert_eq!(first, "Closed", "SET_MEM_TABLE of a file held busy");
}

/// CREATE in each layout with the AES key lengths at and around the
/// valid ones, the session table full, then CLOSE and CREATE again, and
/// the same id closed twice (acked under REPLY_ACK: 0 closed, 1 unknown).
#[test]
fn session_boundaries_in_each_layout_over_the_socket() {
    let mut daemon = Daemon::spawn(&["--max-sessions", "4"]);
    for abi in [SessionAbi::A, SessionAbi::B, SessionAbi::C] {
        let c = Conn::negotiated(&daemon.sock);
        let id_of = |info: &SymSessionInfo| -> i64 {
            c.send_bytes(&create_request(abi, info), &[]).unwrap();
            let p = c.reply(CREATE_CRYPTO_SESSION);
            assert_eq!(p.len(), abi.size(), "{abi:?}: reply size");
            let off = if abi == SessionAbi::C { 1064 } else { 0 };
            i64::from_le_bytes(p[off..off + 8].try_into().unwrap())
        };
        for len in [0usize, 1, 15, 17, 23, 25, 31, 33, 63, 64, 65, 4096] {
            let id = id_of(&session(&vec![7u8; len], 1));
            assert_eq!(id, ID_ERR, "{abi:?}: key of {len} bytes");
        }
        let mut ids = Vec::new();
        for len in [16usize, 24, 32, 16] {
            ids.push(id_of(&session(&vec![7u8; len], 1)));
        }
        // Ids go on from the previous layout's connection (never reused).
        let from = ids[0];
        assert!(from >= 1, "{abi:?}: first id {from}");
        assert_eq!(
            ids,
            [from, from + 1, from + 2, from + 3],
            "{abi:?}: ids of valid sessions"
        );
        assert_eq!(id_of(&session(&[7; 16], 2)), ID_NOSPC, "{abi:?}: table full");
        let close = |id: u64| -> u64 {
            let mut m = close_request(id).to_vec();
            m[4..8].copy_from_slice(&(V1 | NEED_REPLY).to_le_bytes());
            c.send_bytes(&m, &[]).unwrap();
            c.reply_u64(27)
        };
        let second = (from + 1) as u64;
        assert_eq!(close(second), 0, "{abi:?}: CLOSE of a live id");
        assert_eq!(close(second), 1, "{abi:?}: the same CLOSE again");
        assert_eq!(close(u64::MAX), 1, "{abi:?}: CLOSE of an id never given");
        assert_eq!(
            id_of(&session(&[7; 32], 2)),
            from + 4,
            "{abi:?}: CREATE after a CLOSE"
        );
        assert_eq!(id_of(&session(&[7; 16], 2)), ID_NOSPC, "{abi:?}: full again");
        drop(c);
        daemon.assert_alive(&format!("{abi:?} session boundaries"));
    }
    assert_nist(&daemon.sock, "session boundaries");
}

/// `Max open files` (soft) of the daemon, from /proc/PID/limits.
fn daemon_fd_limit(daemon: &Daemon) -> usize {
    daemon
        .proc_file("limits")
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3)?.parse().ok())
        .unwrap()
}

/// Once one descriptor's close blocks on the connection's closer thread,
/// every later descriptor the frontend sends queues behind it, still open
/// in the daemon: nothing bounds how many. A frontend that sends one
/// lingering socket and then a few hundred messages with 32 descriptors
/// each fills the daemon's descriptor table; the daemon can then no longer
/// accept or set up the next frontend (for as long as the linger lasts,
/// here an hour), and is not even ended with status 3. Before the closer
/// thread the pump blocked in that close instead and took nothing more.
#[test]
fn descriptors_queued_behind_a_blocked_close_cannot_exhaust_the_daemon() {
    let mut daemon = Daemon::spawn(&[]);
    let limit = daemon_fd_limit(&daemon);
    let c = Conn::negotiated(&daemon.sock);
    let (sock, peer) = lingering_tcp_socket();
    hand_over_last_reference(&c, &Conn::message(GET_FEATURES, V1, &[]), sock, 0);
    assert!(
        matches!(c.recv(), Got::Msg(GET_FEATURES, ..)),
        "GET_FEATURES with the socket"
    );
    let before = daemon.snapshot().fds;
    // 32 copies of one eventfd per message (the most the daemon takes on
    // one message), on a message that takes none.
    let ev = EventFd::new(EFD_NONBLOCK).unwrap();
    let fds = vec![ev.as_raw_fd(); 32];
    let mut sent = 0;
    while before + sent + 64 < limit {
        if c.send(GET_FEATURES, V1, &[], &fds).is_err() {
            break;
        }
        match c.recv() {
            Got::Msg(GET_FEATURES, ..) => sent += 32,
            _ => break,
        }
    }
    // Then one at a time, up to the limit (the daemon's recvmsg then fails).
    let one = [ev.as_raw_fd()];
    for _ in 0..128 {
        if c.send(GET_FEATURES, V1, &[], &one).is_err() {
            break;
        }
        match c.recv() {
            Got::Msg(GET_FEATURES, ..) => sent += 1,
            _ => break,
        }
    }
    let held = daemon.snapshot().fds;
    eprintln!(
        "daemon descriptors: {before} with the lingering socket, {held} after {sent} more were sent (limit {limit})"
    );
    drop(c);
    // The daemon ends the connection once 256 wait to be closed; its
    // teardown includes closing them, which cannot finish within the hour
    // of linger: the last resort, exit status 3 (10 s without progress),
    // lets a supervisor start it again. Or it is served, if the close
    // ever came.
    let r = served_within(&mut daemon, Duration::from_secs(25));
    drop(peer);
    match r {
        Ok(t) => eprintln!("next frontend served after {t:?}"),
        Err(e) if e.contains("exit status: 3") => eprintln!("{e} (last resort)"),
        Err(e) => panic!(
            "after {sent} descriptors sent behind one blocked close (daemon held {held} of {limit}): {e}\nlog tail: {}",
            daemon.log_tail(1500)
        ),
    }
    assert!(
        held <= before + 256 + 64,
        "descriptors held open behind the blocked close: {before} -> {held} (at most 256 may wait)"
    );
}

fn reserved_huge_pages() -> u64 {
    meminfo("HugePages_Rsvd")
}

/// The proxy reserves a hugetlbfs region's pages with a mapping it unmaps
/// at once. For a region size that is not a multiple of the huge page
/// size, mmap rounds the mapping up, but munmap of the unrounded length
/// fails with EINVAL (mmap(2), "Huge page (Huge TLB) mappings"): the
/// mapping then stayed in the daemon for good, holding the frontend's file
/// and its reserved huge pages after the frontend had closed it and left.
/// Here the library refuses the table itself (a guest address range that
/// overflows), so only the proxy ever mapped it. Needs two free huge pages
/// (skipped otherwise).
#[test]
fn hugetlb_reservation_mapping_of_an_unaligned_size_is_not_left_behind() {
    const HUGE: u64 = 2 << 20;
    if hugetlb_memfd(HUGE).is_none() || free_huge_pages() < 2 {
        skipped("needs an MFD_HUGETLB memfd and two free huge pages");
        return;
    }
    let mut daemon = Daemon::spawn(&[]);
    let (free0, rsvd0) = (free_huge_pages(), reserved_huge_pages());
    let n = 3;
    let mut outcomes = Vec::new();
    // n frontends in a row, each with a memfd of its own, closed as it leaves.
    for _ in 0..n {
        let c = Conn::negotiated(&daemon.sock);
        let mem = hugetlb_memfd(HUGE).unwrap();
        let table = mem_table(&[(u64::MAX - 4095, 4096, UADDR, 0)]);
        c.send(SET_MEM_TABLE, V1 | NEED_REPLY, &table, &[mem.as_raw_fd()])
            .unwrap();
        outcomes.push(accepted_or_refused(&c, SET_MEM_TABLE));
        drop(mem);
        drop(c);
    }
    let after = daemon.idle_snapshot();
    let maps = daemon.proc_file("maps");
    let left: Vec<&str> = maps.lines().filter(|l| l.contains("memfd:")).collect();
    let (free1, rsvd1) = (free_huge_pages(), reserved_huge_pages());
    daemon.assert_alive("hugetlb regions of an unaligned size");
    assert!(
        after.memfd_maps == 0 && left.is_empty() && free1 == free0 && rsvd1 == rsvd0,
        "after {n} frontends each sent a SET_MEM_TABLE ({outcomes:?}) of a 4 KiB region in a hugetlbfs \
         memfd and left, closing it: the daemon still maps it {} times: {left:?}; HugePages_Free \
         {free0} -> {free1}, HugePages_Rsvd {rsvd0} -> {rsvd1}",
        left.len()
    );
}

/// The pump ends a connection once more than MAX_PENDING_CLOSES (256)
/// frontend descriptors wait for closer threads *daemon-wide*, and the
/// teardown lets the next frontend in once no more than 256 wait. A
/// frontend that leaves exactly 256 waiting behind one blocked close
/// (here: a lingering socket and 253 eventfds on GET_FEATURES, plus its
/// own socket's two copies) is torn down and the next frontend is served,
/// but that next, honest frontend starts at the limit: each descriptor it
/// sends is counted until its own closer thread has closed it, and a
/// message right behind one with a descriptor (QEMU sends SET_VRING_KICK,
/// SET_VRING_CALL and the next ring's SET_VRING_NUM without waiting)
/// finds 257 waiting and the connection is ended. A frontend must harm
/// only its own connection.
#[test]
fn descriptors_left_waiting_by_one_frontend_do_not_end_the_next_honest_one() {
    let mut daemon = Daemon::spawn(&[]);
    let c = Conn::negotiated(&daemon.sock);
    let (peer, sent) = queue_behind_a_blocked_close(&c, 254);
    assert_eq!(sent, 254);
    // Leaving adds the two copies of its socket: 256 wait, not more.
    drop(c);
    served_within(&mut daemon, Duration::from_secs(5)).expect("the next frontend is served");

    // Honest frontends, one after another: QEMU's ring set-up order,
    // KICK and CALL then the next message without waiting for anything.
    let mut ended = Vec::new();
    for i in 0..10 {
        let c = Conn::negotiated(&daemon.sock);
        let (kick, call) = (
            EventFd::new(EFD_NONBLOCK).unwrap(),
            EventFd::new(EFD_NONBLOCK).unwrap(),
        );
        c.send(SET_VRING_NUM, V1, &vring_state(0, 64), &[]).unwrap();
        c.send(SET_VRING_KICK, V1, &0u64.to_le_bytes(), &[kick.as_raw_fd()])
            .unwrap();
        c.send(SET_VRING_CALL, V1, &0u64.to_le_bytes(), &[call.as_raw_fd()])
            .unwrap();
        c.send(SET_VRING_BASE, V1, &vring_state(0, 0), &[]).unwrap();
        c.send(GET_FEATURES, V1, &[], &[]).unwrap();
        match c.recv() {
            Got::Msg(GET_FEATURES, ..) => {}
            other => ended.push(format!("frontend {i}: {other:?}")),
        }
    }
    drop(peer);
    assert!(
        ended.is_empty(),
        "honest frontends ended after another left 256 descriptors waiting behind a blocked close:\n{}\nlog tail: {}",
        ended.join("\n"),
        daemon.log_tail(1500)
    );
}

/// A memory table whose checks time out leaves its vuc-memcheck thread
/// behind, holding dups of every descriptor of the table, for as long as
/// the frontend keeps its file busy (the thread waits uninterruptibly on
/// the inode lock). Each frontend that left such a table used to add 32
/// descriptors and a thread to the daemon, with no bound, up to its
/// descriptor limit (at 32 per 2 s, the default 20,000 in about 21
/// minutes); later frontends then met EMFILE. The checks run in helper
/// processes now, at most 4 of them waiting at a time; further tables are
/// refused at once while they do, and the daemon serves again once the
/// frontend lets go.
#[test]
fn memory_checks_left_behind_do_not_pile_up_descriptors() {
    let mut daemon = Daemon::spawn(&[]);
    let Some(locked) = LockedMemfd::new() else {
        skipped("no userfaultfd here");
        return;
    };
    let base = daemon.idle_snapshot();
    let regions: Vec<(u64, u64, u64, u64)> = (0..32u64)
        .map(|i| (i * 4096, 4096, UADDR + i * 4096, i * 4096))
        .collect();
    let table = mem_table(&regions);
    let fds = vec![locked.mem.as_raw_fd(); 32];
    let n = 12;
    for _ in 0..n {
        let _ = send_mem_table(&daemon.sock, &table, &fds);
    }
    let after = daemon.idle_snapshot();
    locked.release();
    eprintln!(
        "after {n} tables of 32 regions in a locked memfd: fds {} -> {}, threads {} -> {}",
        base.fds, after.fds, base.threads, after.threads
    );
    daemon.assert_alive("memory tables of a locked memfd");
    // Once the frontend lets go, the checks return: the next frontend gets
    // its memory table.
    assert_nist(&daemon.sock, "memory tables of a locked memfd");
    // The checks run in helper processes, started from at most 4 threads
    // at a time; a thread holds copies of the table's descriptors until its
    // helper is given up (2 s): bounded, not growing with the frontends.
    assert!(
        after.fds <= base.fds + 4 * 32 + 64,
        "{n} frontends, each gone after its table's checks timed out, left the daemon with {} more \
         descriptors and {} more threads (nothing bounds them)",
        after.fds - base.fds,
        after.threads - base.threads
    );
}

/// recv_message takes every byte of a message, with every descriptor that
/// came with any of them, before it counts them (more than 32 end the
/// connection): a frontend that sends its message one byte per sendmsg,
/// each with 253 descriptors, fills the daemon's whole descriptor table
/// on the request pump. The recvmsg that finds the table full is
/// truncated (MSG_CTRUNC), and the descriptors of that recvmsg are closed
/// where it runs: vmm-sys-util's recv_with_fds closes those it installed,
/// the kernel drops the others (their final fput runs on the same thread
/// on its way back to user space). With a lingering socket among them
/// whose last reference is in flight, the pump blocks in that close for
/// the whole linger: the connection is never torn down, no later frontend
/// is served, and the daemon does not even exit with status 3.
#[test]
fn descriptors_spread_over_one_message_cannot_make_the_pump_close_one() {
    let mut daemon = Daemon::spawn(&[]);
    let limit = daemon_fd_limit(&daemon);
    let c = Conn::negotiated(&daemon.sock);
    let (sock, peer) = lingering_tcp_socket();
    // Stall the request pump (as hand_over_last_reference does): 1,000
    // refused CREATEs whose replies are not read yet.
    let big: libc::c_int = 64 << 20;
    // SAFETY: setsockopt with an int of ours on a socket we own.
    unsafe {
        for opt in [libc::SO_SNDBUFFORCE, libc::SO_SNDBUF] {
            libc::setsockopt(
                c.s.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&big as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }
    const N: usize = 1000;
    let refused = Conn::message(CREATE_CRYPTO_SESSION, V1, &[0u8; 1072]);
    let all: Vec<u8> = refused.iter().copied().cycle().take(refused.len() * N).collect();
    (&c.s).write_all(&all).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let free = limit - daemon.snapshot().fds;
    // One GET_FEATURES with a 4096-byte payload; its first bytes one per
    // sendmsg, each with 253 copies of an eventfd, until ~100 slots are
    // left, then one byte with the socket and 252 eventfds.
    let msg = Conn::message(GET_FEATURES, V1, &[0u8; 4096]);
    let ev = EventFd::new(EFD_NONBLOCK).unwrap();
    let mut at = 0;
    let mut left = free.saturating_sub(100);
    while left > 0 {
        let n = left.min(253);
        let sent =
            c.s.send_with_fds(&[&msg[at..at + 1]], &vec![ev.as_raw_fd(); n])
                .unwrap();
        assert_eq!(sent, 1);
        at += 1;
        left -= n;
    }
    let mut last = vec![sock.as_raw_fd()];
    last.extend(std::iter::repeat_n(ev.as_raw_fd(), 252));
    assert_eq!(c.s.send_with_fds(&[&msg[at..at + 1]], &last).unwrap(), 1);
    at += 1;
    (&c.s).write_all(&msg[at..]).unwrap();
    // The in-flight copy keeps the socket open; this close returns at once.
    drop(sock);
    for _ in 0..N {
        c.reply(CREATE_CRYPTO_SESSION);
    }
    eprintln!("{at} bytes with descriptors; {free} slots were free in the daemon");
    c.s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let first = format!("{:?}", c.recv());
    drop(c);
    let r = served_within(&mut daemon, Duration::from_secs(20));
    drop(peer);
    match r {
        Ok(t) => eprintln!("next frontend served after {t:?}"),
        Err(e) if e.contains("exit status: 3") => eprintln!("{e} (last resort)"),
        Err(e) => panic!(
            "a message whose bytes carried {free}+ descriptors (answer: {first}), then disconnect: {e}\nlog tail: {}",
            daemon.log_tail(1500)
        ),
    }
}

/// A memory table whose checks time out leaves a check waiting
/// uninterruptibly on the frontend's inode lock. The teardown's last
/// resort, exit status 3, is still reachable meanwhile (here: more than
/// 256 descriptors left behind a blocked close). When the check ran on a
/// thread of the daemon's, exit_group could not finish while that thread
/// waited: the process stayed, serving nobody, until the frontend let go
/// (a fourth reviewer's finding). The checks now run in a helper process,
/// so the daemon's exit finishes while the lock is still held.
#[test]
fn exit_status_3_finishes_while_a_memory_check_waits_on_the_frontends_lock() {
    let mut daemon = Daemon::spawn(&[]);
    let Some(locked) = LockedMemfd::new() else {
        skipped("no userfaultfd here");
        return;
    };
    // 1. One memory table whose checks time out (one vuc-memcheck left).
    let table = mem_table(&[(0, MEM_SIZE, UADDR, 0)]);
    assert!(
        matches!(
            send_mem_table(&daemon.sock, &table, &[locked.mem.as_raw_fd()]),
            Got::Closed
        ),
        "table of a locked memfd refused"
    );
    served_within(&mut daemon, Duration::from_secs(5)).expect("served with one check left waiting");

    // 2. Another connection leaves more than 256 descriptors behind a
    // blocked close: the teardown's last resort, exit status 3.
    let c = Conn::negotiated(&daemon.sock);
    let (peer, sent) = queue_behind_a_blocked_close(&c, 640);
    assert!(sent > 256, "only {sent} descriptors taken");
    drop(c);
    // The exit-3 line comes 10 s into the teardown; the exit cannot finish.
    daemon.until_logged("exiting (status 3)", Duration::from_secs(30), "no exit-3 line");
    let start = Instant::now();
    let status = loop {
        if let Some(st) = daemon.child.try_wait().unwrap() {
            break Some(st);
        }
        if start.elapsed() > Duration::from_secs(5) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // Only now does the frontend let go.
    locked.release();
    drop(peer);
    let status = status.expect("the daemon's exit did not finish while the frontend held its lock");
    assert_eq!(status.code(), Some(3), "exit status");
}

// ---- review: a FUSE file whose FLUSH the frontend never answers ----

/// A minimal FUSE server (raw /dev/fuse protocol 7.31) with one regular
/// file `mem` of `MEM_SIZE` bytes; FLUSH requests from children of `spare`
/// (the daemon: its memory-check helpers) are left unanswered while `block`
/// is set.
struct FuseMem {
    dir: std::path::PathBuf,
    dev: File,
    /// Hold every FLUSH from a child of the daemon. (Only its children: a
    /// daemon that another test spawns at the same moment gets a copy of
    /// this test's FUSE descriptors between its fork and its exec, and its
    /// exec's FLUSH must not wait for this test to end.)
    block: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Hold those only from a process that asked for the file's
    /// attributes before (GETATTR, which a process in execve does not
    /// send: the helper's `fstat` after its exec), so that the closes of
    /// the helper's execve are answered and those after its checks (its
    /// region files dropped once it has written its answer, its stdout
    /// still open) are held. (`/proc/PID/stat` cannot tell the two
    /// apart either way: reading it for a process inside execve waits for
    /// the exec, here for good.)
    block_after_getattr: std::sync::Arc<std::sync::atomic::AtomicBool>,
    held: std::sync::Arc<std::sync::Mutex<Vec<u64>>>,
}

/// Field `name` (`"Tgid:"`, `"PPid:"`) of `/proc/TID/status` for thread
/// `tid`, which can be read while the process is inside execve; 0 if
/// unknown.
fn fuse_status_field(tid: u32, name: &str) -> u32 {
    std::fs::read_to_string(format!("/proc/{tid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(name).map(|v| v.trim().parse::<u32>().ok()))
                .flatten()
        })
        .unwrap_or(0)
}

/// The thread group of thread `tid`; 0 if unknown.
fn fuse_tgid(tid: u32) -> u32 {
    fuse_status_field(tid, "Tgid:")
}

fn fuse_attr(ino: u64, mode: u32, size: u64) -> Vec<u8> {
    let mut a = Vec::new();
    for v in [ino, size, size.div_ceil(512), 0, 0, 0] {
        a.extend_from_slice(&v.to_le_bytes());
    }
    for v in [0u32, 0, 0, mode, 1, 0, 0, 0, 4096, 0] {
        a.extend_from_slice(&v.to_le_bytes());
    }
    a
}

impl FuseMem {
    fn mount(spare: u32) -> Option<FuseMem> {
        // SAFETY: plain open(2) of a NUL-terminated path.
        let fd = unsafe { libc::open(c"/dev/fuse".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            return None;
        }
        // SAFETY: a fresh descriptor we own.
        let dev = unsafe { File::from_raw_fd(fd) };
        // (One directory per mount: the tests run side by side.)
        static MOUNTS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "vuc-review-fuse-{}-{}",
            std::process::id(),
            MOUNTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let _ = std::fs::create_dir(&dir);
        let cdir = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
        let opts = std::ffi::CString::new(format!("fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other"))
            .unwrap();
        // SAFETY: mount(2) with NUL-terminated strings.
        let r = unsafe {
            libc::mount(
                c"vucfuse".as_ptr(),
                cdir.as_ptr(),
                c"fuse".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                opts.as_ptr().cast(),
            )
        };
        if r < 0 {
            eprintln!("fuse mount: {}", io::Error::last_os_error());
            return None;
        }
        // fusectl, for the abort in Drop (EBUSY when mounted already).
        // SAFETY: mount(2) with NUL-terminated strings.
        unsafe {
            libc::mount(
                c"fusectl".as_ptr(),
                c"/sys/fs/fuse/connections".as_ptr(),
                c"fusectl".as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        let block = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let block_after_getattr = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let held = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (b, bg, mut d, h) = (
            block.clone(),
            block_after_getattr.clone(),
            dev.try_clone().unwrap(),
            held.clone(),
        );
        let mut getattr_from = std::collections::HashSet::new();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let n = match d.read(&mut buf) {
                    Ok(n) => n,
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                    Err(_) => return,
                };
                if n < 40 {
                    continue;
                }
                let u32at = |o: usize| u32::from_le_bytes(buf[o..o + 4].try_into().unwrap());
                let (op, unique, nodeid, pid) = (
                    u32at(4),
                    u64::from_le_bytes(buf[8..16].try_into().unwrap()),
                    u64::from_le_bytes(buf[16..24].try_into().unwrap()),
                    u32at(32),
                );
                let (err, body): (i32, Vec<u8>) = match op {
                    26 => {
                        // INIT
                        let mut o = Vec::new();
                        for v in [7u32, 31, 0, 0] {
                            o.extend_from_slice(&v.to_le_bytes());
                        }
                        o.extend_from_slice(&1u16.to_le_bytes());
                        o.extend_from_slice(&1u16.to_le_bytes());
                        o.extend_from_slice(&65536u32.to_le_bytes());
                        o.extend_from_slice(&1u32.to_le_bytes());
                        o.resize(64, 0);
                        (0, o)
                    }
                    1 => {
                        // LOOKUP
                        let name = &buf[40..n];
                        if name.starts_with(b"mem\0") {
                            let mut o = Vec::new();
                            for v in [2u64, 0, 0, 0] {
                                o.extend_from_slice(&v.to_le_bytes());
                            }
                            o.extend_from_slice(&[0u8; 8]);
                            o.extend_from_slice(&fuse_attr(2, 0o100_666, MEM_SIZE));
                            (0, o)
                        } else {
                            (-libc::ENOENT, Vec::new())
                        }
                    }
                    3 => {
                        // GETATTR
                        if bg.load(std::sync::atomic::Ordering::SeqCst) {
                            let t = fuse_tgid(pid);
                            if t != 0 {
                                getattr_from.insert(t);
                            }
                        }
                        let mut o = vec![0u8; 16];
                        o.extend_from_slice(&if nodeid == 1 {
                            fuse_attr(1, 0o040_777, 0)
                        } else {
                            fuse_attr(2, 0o100_666, MEM_SIZE)
                        });
                        (0, o)
                    }
                    14 | 27 => (0, vec![0u8; 16]), // OPEN, OPENDIR
                    17 => {
                        // STATFS
                        let mut o = vec![0u8; 80];
                        o[40..44].copy_from_slice(&4096u32.to_le_bytes());
                        (0, o)
                    }
                    25 => {
                        // FLUSH
                        let tgid = fuse_tgid(pid);
                        let hold = b.load(std::sync::atomic::Ordering::SeqCst)
                            || (bg.load(std::sync::atomic::Ordering::SeqCst) && getattr_from.contains(&tgid));
                        // (Not the daemon itself, nor this test: neither is
                        // the daemon's child.)
                        if hold && fuse_status_field(pid, "PPid:") == spare {
                            eprintln!("fuse: FLUSH from pid {pid} (tgid {tgid}) left unanswered");
                            h.lock().unwrap().push(unique);
                            continue;
                        }
                        (0, Vec::new())
                    }
                    18 | 29 | 38 => (0, Vec::new()), // RELEASE, RELEASEDIR, DESTROY
                    2 | 42 | 36 => continue,         // FORGET, BATCH_FORGET, INTERRUPT
                    _ => (-libc::ENOSYS, Vec::new()),
                };
                let mut out = Vec::new();
                out.extend_from_slice(&((16 + body.len()) as u32).to_le_bytes());
                out.extend_from_slice(&err.to_le_bytes());
                out.extend_from_slice(&unique.to_le_bytes());
                out.extend_from_slice(&body);
                let _ = d.write(&out);
            }
        });
        Some(FuseMem {
            dir,
            dev,
            block,
            block_after_getattr,
            held,
        })
    }
}

impl Drop for FuseMem {
    fn drop(&mut self) {
        // Abort the connection (every pending request fails with
        // ENOTCONN; fusectl), answer the FLUSHes held, then unmount.
        use std::os::unix::fs::MetadataExt;
        if let Ok(m) = std::fs::metadata(&self.dir) {
            let minor = libc::minor(m.dev());
            let _ = std::fs::write(format!("/sys/fs/fuse/connections/{minor}/abort"), "1");
        }
        for u in self.held.lock().unwrap().drain(..) {
            let mut out = 16u32.to_le_bytes().to_vec();
            out.extend_from_slice(&0i32.to_le_bytes());
            out.extend_from_slice(&u.to_le_bytes());
            let _ = (&self.dev).write(&out);
        }
        let cdir = std::ffi::CString::new(self.dir.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: umount2(2) of our own mount point.
        unsafe { libc::umount2(cdir.as_ptr(), libc::MNT_DETACH) };
        let _ = &self.dev;
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// For the FUSE tests: a daemon and a FUSE server whose FLUSH modes know
/// it, or `None`, recorded as skipped, without root or FUSE.
fn fuse_daemon() -> Option<(Daemon, FuseMem)> {
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skipped("mounting FUSE needs root here");
        return None;
    }
    let daemon = Daemon::spawn(&[]);
    let Some(fuse) = FuseMem::mount(daemon.pid()) else {
        skipped("no FUSE here");
        return None;
    };
    Some((daemon, fuse))
}

/// For the FUSE tests: opens the FUSE server's file, sets `hold` (one of
/// `fuse`'s FLUSH modes), sends the file in a SET_MEM_TABLE on a new
/// connection to `daemon` and waits up to 4 s for the answer. Returns the
/// file (to be dropped after `fuse`), the answer and how long it took.
fn fuse_mem_table(
    daemon: &Daemon,
    fuse: &FuseMem,
    hold: &std::sync::atomic::AtomicBool,
) -> (File, Got, Duration) {
    let mem = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(fuse.dir.join("mem"))
        .unwrap();
    hold.store(true, std::sync::atomic::Ordering::SeqCst);
    let c = Conn::negotiated(&daemon.sock);
    c.s.set_read_timeout(Some(Duration::from_secs(4))).unwrap();
    c.send(
        SET_MEM_TABLE,
        V1 | NEED_REPLY,
        &mem_table(&[(0, MEM_SIZE, UADDR, 0)]),
        &[mem.as_raw_fd()],
    )
    .unwrap();
    let start = Instant::now();
    let got = c.recv();
    (mem, got, start.elapsed())
}

/// Review of 7b4ff39: the frontend's memory file is a FUSE file (its own
/// FUSE server). Every close of a FUSE file descriptor, even of one copy,
/// sends FLUSH to the server and waits for it, uninterruptibly. The forked
/// helper's execve closes its close-on-exec copies of the region
/// descriptors (the received one, the F_DUPFD_CLOEXEC copies of pre_exec);
/// the standard library's `spawn` waits for the exec to finish, on the
/// request pump, before `check_in_helper`'s 2 s limit even starts. Only
/// FLUSHes from the daemon's children (its helpers) are held: the daemon's
/// own closes are answered. Before 7b4ff39 (checks on a
/// thread) the same test gets its reply within 1 ms and the next frontend
/// is served at once; now: no reply, no next frontend, for as long as the
/// frontend holds the FLUSH (30 min in one run, until the connection was
/// aborted through fusectl).
#[test]
fn a_frontend_that_never_answers_the_helpers_flush_cannot_wedge_the_daemon() {
    let Some((mut daemon, fuse)) = fuse_daemon() else {
        return;
    };
    let (mem, got, took) = fuse_mem_table(&daemon, &fuse, &fuse.block);
    let answered = !matches!(got, Got::TimedOut);
    eprintln!(
        "SET_MEM_TABLE of a FUSE file: {} after {took:?}",
        match got {
            Got::Msg(r, ..) => format!("reply to {r}"),
            Got::Closed => "disconnect".into(),
            Got::TimedOut => "nothing".into(),
        },
    );
    let served = served_within(&mut daemon, Duration::from_secs(5));
    let pid = daemon.pid();
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        let p = t.path();
        let r = |f: &str| std::fs::read_to_string(p.join(f)).unwrap_or_default();
        eprintln!(
            "daemon thread {:?} {} wchan {}",
            t.file_name(),
            r("comm").trim(),
            r("wchan")
        );
    }
    // (The forked child is not inspected: reads of most of its /proc
    // files, such as stat, wait while it is inside execve.)
    let held = fuse.held.lock().unwrap().len();
    eprintln!("next frontend: {served:?}; FLUSHes held: {held}");
    // Let everything go before asserting (the helper, then the daemon).
    fuse.block.store(false, std::sync::atomic::Ordering::SeqCst);
    drop(fuse);
    drop(mem);
    // (Otherwise no FLUSH of the helper's was held: the test would show
    // nothing.)
    assert!(held > 0, "no FLUSH from the helper was held");
    assert!(
        answered,
        "no answer to SET_MEM_TABLE within 4 s (the pump waits for the helper)"
    );
    served.expect("the next frontend after a FUSE memory table whose helper's FLUSH is never answered");
    daemon.assert_alive("a FUSE memory table");
}

/// The other end of the same: the helper's execve gets its FLUSHes
/// answered and the helper writes its answer, but then it closes its
/// region files (dropped when `memory_check_helper_main` returns, before
/// its exit, its stdout still open), and that close waits on a FLUSH the
/// frontend never answers. The daemon takes the answer at its last line
/// (EOF never comes) and waits at most 100 ms for the helper to be reaped
/// (then keeps it with the stuck ones). Waiting for the helper's exit
/// (`child.wait()` in `reap_or_keep`) or for EOF instead runs into the
/// check's 2 s limit: a region whose check passed is refused with a
/// disconnect, as this test then shows.
#[test]
fn a_frontend_that_never_answers_the_flush_after_the_helpers_answer_cannot_wedge_the_daemon() {
    let Some((mut daemon, fuse)) = fuse_daemon() else {
        return;
    };
    let (mem, got, took) = fuse_mem_table(&daemon, &fuse, &fuse.block_after_getattr);
    // Accepted (a FUSE file cannot be sealed: without
    // --require-sealed-memory that is a warning, and the reply is 0).
    let answered =
        matches!(&got, Got::Msg(r, _, p) if *r == SET_MEM_TABLE && p.as_slice() == 0u64.to_le_bytes());
    eprintln!(
        "SET_MEM_TABLE of a FUSE file, the helper's last FLUSH held: answered {answered} after {took:?}"
    );
    let served = served_within(&mut daemon, Duration::from_secs(5));
    // (The FUSE server may take the FLUSH off /dev/fuse a little later.)
    let until = Instant::now() + Duration::from_secs(2);
    let held = loop {
        let held = fuse.held.lock().unwrap().len();
        if held > 0 || Instant::now() >= until {
            break held;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    eprintln!("next frontend: {served:?}; FLUSHes held: {held}");
    fuse.block_after_getattr
        .store(false, std::sync::atomic::Ordering::SeqCst);
    drop(fuse);
    drop(mem);
    // (Otherwise the helper never reached its last close: the test would
    // show nothing.)
    assert!(held > 0, "no FLUSH from the helper after its answer was held");
    assert!(
        answered,
        "no reply to SET_MEM_TABLE (the check waited for the helper's last close, past its limit)"
    );
    // About 100 ms (the reap's wait); a much longer wait would delay every
    // FUSE-backed memory table and race the check's 2 s limit.
    assert!(
        took < Duration::from_secs(1),
        "SET_MEM_TABLE answered only after {took:?}"
    );
    served.expect("the next frontend after a FUSE memory table whose helper's last FLUSH is never answered");
    daemon.assert_alive("a FUSE memory table");
}
