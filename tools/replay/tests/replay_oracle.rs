// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Does `replay()` notice a backend that gets the used ring or the buffers
//! wrong? An in-process fake backend (vhost-user messages answered
//! on one end of a socket pair; the rings served from the frontend's own
//! guest memory) computes every output right with the tool's reference
//! cipher and then commits exactly one kind of fault. An honest fake
//! passes (control); every faulty one must make the run fail (mismatches
//! > 0 or an error) and return within a bounded time.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use algorithms::Direction;
use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vhost_crypto_replay::frontend::{CryptoFrontend, DescMode, FrontendConfig};
use vhost_crypto_replay::guest_mem::GuestMem;
use vhost_crypto_replay::replay::{replay, ReplayOptions, Report};
use vhost_crypto_replay::soak::{soak, Layouts, SoakOptions, SoakReport};
use vhost_crypto_replay::trace::{hex, Trace};
use vhost_user_crypto::wire::session::{create_reply, decode_create, SessionAbi};
use vhost_user_crypto::wire::virtio_crypto::{
    AlgChainPara, OpDataReq, VIRTIO_CRYPTO_MAC_HMAC_SHA1, VIRTIO_CRYPTO_SYM_OP_ALGORITHM_CHAINING,
};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

// OpenSSL's AES-CBC, the expected outputs of the traces built here (its
// HMAC and the `Mac` helpers are not used).
#[path = "../../../tests/common/oracle.rs"]
#[allow(dead_code)]
mod oracle;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fault {
    None,
    /// Used id = head + n (n = 1: the chain's second descriptor).
    IdPlus(u32),
    /// The device also writes zeros over the (device-readable) src.
    ClobberSrc,
    /// The same, from the n-th request on (past the replay tool's first
    /// 4,096, whose src it always checks; it samples the rest).
    ClobberSrcFrom(u64),
    /// The device writes 16 bytes past the end of the dst descriptor.
    OverrunDst,
    /// The same, from the n-th request on, and only where dst lies before
    /// src (the second of the tool's alternating placements), so that the
    /// bytes it writes are src's first.
    OverrunDstBeforeSrcFrom(u64),
    /// A chained request's whole MAC output goes into the hash result
    /// buffer, past hash_result_len.
    DigestOverrun,
    /// The second request's used element names the first request again.
    Dup,
    /// The device also zeroes the (device-readable) 72-byte request header.
    ClobberHeader,
    /// Request n is never completed; from then on, whenever the ring is
    /// idle, the last used element is put on the used ring again (every
    /// millisecond), as a daemon that never clears its list of completions.
    StuckAndRepost(u64),
    /// The status is stored as a 32-bit word into the 1-byte status
    /// descriptor (3 bytes past it).
    WideStatus,
    /// The device stores the chaining value (the last
    /// output block) back into the (device-readable) IV, a classic CBC bug.
    ClobberIv,
    /// The output is written from the first writable
    /// descriptor's address on, as if the writable descriptors were one
    /// contiguous buffer (the honest fake scatters it over them).
    LinearDst,
    /// After completing a request, the device clears the flags of the
    /// chain's last descriptor (in the ring or the indirect table), which
    /// only the driver may write.
    ClobberDescs,
    /// The same, after the first request only.
    ClobberDescsOnce,
    /// The same, after each request from the n-th on.
    ClobberDescsFrom(u64),
    /// After the first request only, the device clears the flags of the
    /// chain's head descriptor in the ring (in indirect mode the one that
    /// points at the table, which stays as it was).
    ClobberHeadOnce,
    /// From the n-th request on, the device leaves the first 16 bytes of
    /// an out-of-place request's dst as they were (and writes the rest
    /// and status OK); in-place requests are served honestly.
    KeepDstHeadFrom(u64),
}

/// Session id -> (cipher key, direction, HMAC-SHA1 key of a chained session).
type Sessions = Arc<Mutex<HashMap<u64, (Vec<u8>, Direction, Option<Vec<u8>>)>>>;

/// Queue index -> the call eventfd SET_VRING_CALL gave the fake.
type Calls = Arc<Mutex<HashMap<u64, EventFd>>>;

/// Answers the vhost-user messages the frontend sends. The fds that come
/// with them are closed, but for SET_VRING_CALL's, kept in `calls`.
fn serve_messages(mut s: UnixStream, sessions: Sessions, calls: Calls) {
    let mut next_id = 1u64;
    loop {
        // The fds come with the header (the frontend sends each message
        // with one sendmsg).
        let mut h = [0u8; 12];
        let mut raw: [RawFd; 32] = [-1; 32];
        let mut iov = [libc::iovec {
            iov_base: h.as_mut_ptr().cast(),
            iov_len: h.len(),
        }];
        // SAFETY: the one iovec is `h`, borrowed by nothing else.
        let Ok((got, nfds)) = (unsafe { s.recv_with_fds(&mut iov, &mut raw) }) else {
            return;
        };
        let mut fds: Vec<OwnedFd> = raw[..nfds]
            .iter()
            // SAFETY: recvmsg just installed these fds; nothing else owns them.
            .map(|&fd| unsafe { OwnedFd::from_raw_fd(fd) })
            .collect();
        if got == 0 || s.read_exact(&mut h[got..]).is_err() {
            return;
        }
        let req = u32::from_le_bytes(h[0..4].try_into().unwrap());
        let size = u32::from_le_bytes(h[8..12].try_into().unwrap()) as usize;
        let mut p = vec![0u8; size];
        if s.read_exact(&mut p).is_err() {
            return;
        }
        let u64_reply = |s: &mut UnixStream, v: u64| {
            let mut m = Vec::new();
            m.extend_from_slice(&req.to_le_bytes());
            m.extend_from_slice(&5u32.to_le_bytes());
            m.extend_from_slice(&8u32.to_le_bytes());
            m.extend_from_slice(&v.to_le_bytes());
            s.write_all(&m).unwrap();
        };
        match req {
            // GET_FEATURES: PROTOCOL_FEATURES | VERSION_1 | INDIRECT_DESC.
            1 => u64_reply(&mut s, (1 << 30) | (1 << 32) | (1 << 28)),
            15 => u64_reply(
                &mut s,
                (VhostUserProtocolFeatures::CRYPTO_SESSION | VhostUserProtocolFeatures::MQ).bits(),
            ),
            // GET_QUEUE_NUM.
            17 => u64_reply(&mut s, 8),
            // SET_VRING_CALL: the queue index in bits 0-7; bit 8 set: no fd.
            13 => {
                let v = u64::from_le_bytes(p[..8].try_into().unwrap());
                let mut calls = calls.lock().unwrap();
                match fds.pop() {
                    Some(fd) if v & 0x100 == 0 && fds.is_empty() => {
                        // SAFETY: `fd` was ours; the EventFd owns it now.
                        let call = unsafe { EventFd::from_raw_fd(fd.into_raw_fd()) };
                        calls.insert(v & 0xff, call);
                    }
                    _ => {
                        calls.remove(&(v & 0xff));
                    }
                }
            }
            26 => {
                let info = decode_create(&p, SessionAbi::C).unwrap();
                let dir = if info.direction == 1 {
                    Direction::Encrypt
                } else {
                    Direction::Decrypt
                };
                let id = next_id;
                next_id += 1;
                // A chained session: only HMAC-SHA1 here.
                let mac = (u32::from(info.op_type) == VIRTIO_CRYPTO_SYM_OP_ALGORITHM_CHAINING).then(|| {
                    assert_eq!(info.hash_alg, VIRTIO_CRYPTO_MAC_HMAC_SHA1);
                    info.auth_key[..info.auth_key_len as usize].to_vec()
                });
                sessions
                    .lock()
                    .unwrap()
                    .insert(id, (info.cipher_key().unwrap().to_vec(), dir, mac));
                s.write_all(&create_reply(&p, Some(SessionAbi::C), id as i64))
                    .unwrap();
            }
            // CLOSE_CRYPTO_SESSION (the soak's rekeys).
            27 => {
                let id = u64::from_le_bytes(p[..8].try_into().unwrap());
                sessions.lock().unwrap().remove(&id);
            }
            _ => {}
        }
    }
}

/// Writes `data` at offset `off` of the stream of buffers `segs`.
fn scatter(mem: &GuestMem, segs: &[(u64, usize)], mut off: usize, mut data: &[u8]) {
    for &(a, l) in segs {
        if data.is_empty() {
            return;
        }
        if off >= l {
            off -= l;
            continue;
        }
        let n = (l - off).min(data.len());
        mem.write(a + off as u64, &data[..n]);
        data = &data[n..];
        off = 0;
    }
}

/// Puts used element (`id`, `len`) on the split used ring at `used` (`size`
/// entries), then signals the queue's call eventfd, as a backend without
/// EVENT_IDX does after every completion.
fn put_used(mem: &GuestMem, used: u64, size: u16, next_used: &mut u16, (id, len): (u32, u32), call: &Call) {
    let e = used + 4 + 8 * u64::from(*next_used % size);
    mem.write(e, &id.to_le_bytes());
    mem.write(e + 4, &len.to_le_bytes());
    *next_used = next_used.wrapping_add(1);
    mem.store_u16_release(used + 2, *next_used);
    call.signal();
}

/// Queue `q`'s call eventfd, looked up at each signal: SET_VRING_CALL
/// (answered on another thread, with no reply) may come after the ring's
/// thread starts, or again.
struct Call {
    calls: Calls,
    q: u64,
}

impl Call {
    fn signal(&self) {
        if let Some(call) = self.calls.lock().unwrap().get(&self.q) {
            call.write(1).unwrap();
        }
    }
}

fn rd_u64(m: &GuestMem, a: u64) -> u64 {
    let mut b = [0u8; 8];
    m.read(a, &mut b);
    u64::from_le_bytes(b)
}

/// Serves one split ring until `stop`: every request is computed right,
/// then `fault` is applied.
#[allow(clippy::too_many_arguments)]
fn serve_ring(
    mem: Arc<GuestMem>,
    size: u16,
    desc: u64,
    avail: u64,
    used: u64,
    sessions: Sessions,
    fault: Fault,
    stop: Arc<AtomicBool>,
    call: Call,
) {
    let (mut next_avail, mut next_used, mut n) = (0u16, 0u16, 0u64);
    let mut first_head = None;
    let (mut stuck, mut last) = (false, (0u32, 0u32));
    while !stop.load(Ordering::Relaxed) {
        if mem.load_u16_acquire(avail + 2) == next_avail {
            if stuck {
                // Re-post the last completion (already reaped by the tool).
                std::thread::sleep(Duration::from_millis(1));
                put_used(&mem, used, size, &mut next_used, last, &call);
            }
            std::thread::yield_now();
            continue;
        }
        let head = mem.load_u16_acquire(avail + 4 + 2 * u64::from(next_avail % size));
        next_avail = next_avail.wrapping_add(1);
        // Walk the chain (indirect or direct).
        let d = |table: u64, i: u64| {
            let a = table + 16 * i;
            let mut f = [0u8; 4];
            mem.read(a + 12, &mut f);
            (
                rd_u64(&mem, a),
                mem.read_u32(a + 8),
                u16::from_le_bytes([f[0], f[1]]),
                u16::from_le_bytes([f[2], f[3]]),
            )
        };
        let (mut table, mut i) = (desc, u64::from(head));
        let h = d(desc, i);
        if h.2 & 4 != 0 {
            table = h.0;
            i = 0;
        }
        let (mut rd, mut wr) = (Vec::new(), Vec::new());
        let last_desc = loop {
            let at = table + 16 * i;
            let (addr, len, flags, next) = d(table, i);
            if flags & 2 != 0 {
                wr.push((addr, len as usize));
            } else {
                rd.push((addr, len as usize));
            }
            if flags & 1 == 0 {
                break at;
            }
            i = u64::from(next);
        };
        let mut stream = Vec::new();
        for &(a, l) in &rd {
            let mut b = vec![0u8; l];
            mem.read(a, &mut b);
            stream.extend_from_slice(&b);
        }
        let hdr = OpDataReq::from_bytes(stream[..72].try_into().unwrap());
        let len = hdr.src_data_len as usize;
        let iv: [u8; 16] = stream[72..88].try_into().unwrap();
        let mut data = stream[88..88 + len].to_vec();
        let (dst, _) = wr[0];
        let (status, slen) = *wr.last().unwrap();
        let sess = sessions.lock().unwrap().get(&hdr.session_id).cloned();
        let Some((key, dir, mac)) = sess else {
            // A closed or unknown session: INVSESS, used length 1.
            mem.write(status + slen as u64 - 1, &[4]);
            put_used(&mem, used, size, &mut next_used, (u32::from(head), 1), &call);
            n += 1;
            continue;
        };
        // Used length: dst, the hash result (chained), the status byte.
        let mut used_len = len as u32 + 1;
        if let Some(mac_key) = mac {
            // Encrypt then MAC (the only chained kind here), with OpenSSL:
            // the cipher over its range of src, the MAC over its range of
            // the output, the digest truncated into the hash result buffer.
            assert_eq!(dir, Direction::Encrypt);
            let c = AlgChainPara::from_bytes(stream[..72].try_into().unwrap());
            let (co, cl) = (c.cipher_start_src_offset as usize, c.len_to_cipher as usize);
            vhost_crypto_replay::reference::aes_cbc(dir, &key, &iv, &mut data[co..co + cl]).unwrap();
            let (ho, hl) = (c.hash_start_src_offset as usize, c.len_to_hash as usize);
            let pkey = openssl::pkey::PKey::hmac(&mac_key).unwrap();
            let mut signer = openssl::sign::Signer::new(openssl::hash::MessageDigest::sha1(), &pkey).unwrap();
            signer.update(&data[ho..ho + hl]).unwrap();
            let digest = signer.sign_to_vec().unwrap();
            mem.write(wr[1].0, &digest[..c.hash_result_len as usize]);
            used_len += c.hash_result_len;
            if fault == Fault::DigestOverrun {
                // The whole 20-byte SHA-1 output, not hash_result_len bytes.
                mem.write(wr[1].0, &digest);
            }
        } else {
            vhost_crypto_replay::reference::aes_cbc(dir, &key, &iv, &mut data).unwrap();
        }
        if fault == Fault::LinearDst {
            mem.write(dst, &data);
        } else if matches!(fault, Fault::KeepDstHeadFrom(k) if n >= k) && dst != rd.last().unwrap().0 {
            let mut old = [0u8; 16];
            mem.read(dst, &mut old);
            scatter(&mem, &wr, 0, &data);
            mem.write(dst, &old);
        } else {
            scatter(&mem, &wr, 0, &data);
        }
        mem.write(status + slen as u64 - 1, &[0]);
        match fault {
            Fault::ClobberIv => scatter(&mem, &rd, 72, &data[len - 16..]),
            Fault::ClobberSrc => mem.fill(rd.last().unwrap().0, len, 0),
            Fault::ClobberSrcFrom(k) if n >= k => mem.fill(rd.last().unwrap().0, len, 0),
            Fault::OverrunDst => mem.fill(dst + len as u64, 16, 0xEE),
            Fault::OverrunDstBeforeSrcFrom(k) if n >= k && dst < rd.last().unwrap().0 => {
                mem.fill(dst + len as u64, 16, 0xEE)
            }
            Fault::ClobberHeader => scatter(&mem, &rd, 0, &[0; 72]),
            Fault::WideStatus => mem.write(status + slen as u64 - 1, &0u32.to_le_bytes()),
            Fault::ClobberDescs => mem.write(last_desc + 12, &[0, 0]),
            Fault::ClobberDescsOnce if n == 0 => mem.write(last_desc + 12, &[0, 0]),
            Fault::ClobberDescsFrom(k) if n >= k => mem.write(last_desc + 12, &[0, 0]),
            Fault::ClobberHeadOnce if n == 0 => mem.write(desc + 16 * u64::from(head) + 12, &[0, 0]),
            _ => {}
        }
        if let Fault::StuckAndRepost(k) = fault {
            if n == k {
                n += 1;
                stuck = true;
                continue;
            }
        }
        let mut id = u32::from(head);
        match fault {
            Fault::IdPlus(k) => id += k,
            Fault::Dup if n == 1 => id = first_head.unwrap(),
            _ => {}
        }
        first_head.get_or_insert(u32::from(head));
        n += 1;
        last = (id, used_len);
        put_used(&mem, used, size, &mut next_used, last, &call);
    }
}

const TRACE: &str = r#"{"op":"create_session","name":"e","algo":"aes-cbc","key":"000102030405060708090a0b0c0d0e0f","direction":"encrypt"}
{"op":"create_session","name":"d","algo":"aes-cbc","key":"000102030405060708090a0b0c0d0e0f","direction":"decrypt"}
{"op":"generate","session":"e","opcode":"encrypt","size":64,"count":100,"seed":3}
{"op":"generate","session":"d","opcode":"decrypt","size":64,"count":100,"seed":4}
"#;

/// Replays [`TRACE`] against a fake backend with `fault`; `None` if the
/// replay did not return within 60 s.
fn run(mode: DescMode, fault: Fault) -> Option<Report> {
    run_repeated(mode, fault, 1)
}

/// [`run`] with the trace replayed `repeat` times.
fn run_repeated(mode: DescMode, fault: Fault, repeat: u32) -> Option<Report> {
    run_with(TRACE, 64, mode, &[fault], repeat)
}

/// Replays `trace` (requests up to `max_payload` bytes) `repeat` times on
/// `faults.len()` queues, queue q served with `faults[q]`; `None` if the
/// replay did not return within 60 s.
fn run_with(
    trace: &str,
    max_payload: usize,
    mode: DescMode,
    faults: &[Fault],
    repeat: u32,
) -> Option<Report> {
    let t = Trace::parse(trace.as_bytes()).unwrap();
    let cfg = FrontendConfig {
        queues: faults.len() as u16,
        queue_size: 64,
        queue_depth: 8,
        max_payload,
        max_iv: 16,
        memory_bytes: 0,
        session_abi: SessionAbi::C,
        desc_mode: mode,
        dpdk: false,
    };
    let (mut fe, stop) = connect_fake(&cfg, faults);
    let opts = ReplayOptions {
        repeat,
        queue_depth: 8,
        timeout: Duration::from_secs(2),
        progress: false,
        record: false,
    };
    within_limit(stop, move || replay(&mut fe, &t, &opts).unwrap())
}

/// A frontend connected to the fake backend, with `cfg` and queue q
/// served with `faults[q]`, and the flag that stops the fake's ring
/// threads.
fn connect_fake(cfg: &FrontendConfig, faults: &[Fault]) -> (CryptoFrontend, Arc<AtomicBool>) {
    let (a, b) = UnixStream::pair().unwrap();
    let sessions: Sessions = Arc::default();
    let calls: Calls = Arc::default();
    let (s2, c2) = (sessions.clone(), calls.clone());
    std::thread::spawn(move || serve_messages(b, s2, c2));
    let fe = CryptoFrontend::from_stream(a, cfg).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    for (q, &fault) in faults.iter().enumerate() {
        let r = fe.queues[q].ring_addrs();
        let (mem, st, sessions) = (fe.queues[q].mem_handle(), stop.clone(), sessions.clone());
        let call = Call {
            calls: calls.clone(),
            q: q as u64,
        };
        std::thread::spawn(move || {
            serve_ring(mem, r.size, r.desc, r.avail, r.used, sessions, fault, st, call)
        });
    }
    (fe, stop)
}

/// Runs `run` (a replay or soak against the fake) on a thread of its own;
/// its result, or `None` if it did not return within 60 s; then stops the
/// fake's ring threads (`stop`). (The fake signals the call eventfd after
/// every used element, so the tool never sleeps out its 100 ms poll: the
/// longest runs here, 6,000 requests, take well under a second; the faulty
/// ones that never complete a request end at the tool's 2 s timeout; the
/// limit here is only reached by a run that hangs.)
fn within_limit<T: Send + 'static>(
    stop: Arc<AtomicBool>,
    run: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(run());
    });
    let rep = rx.recv_timeout(Duration::from_secs(60)).ok();
    stop.store(true, Ordering::Relaxed);
    rep
}

fn assert_caught(mode: DescMode, fault: Fault) {
    let r = run(mode, fault).unwrap_or_else(|| {
        panic!("{mode:?} {fault:?}: replay() did not return within 60 s (its --timeout is 2 s)")
    });
    assert!(
        r.mismatches > 0 || r.error.is_some(),
        "{mode:?} {fault:?}: the run passed: {} requests, 0 mismatches",
        r.requests
    );
}

#[test]
fn control_an_honest_fake_backend_passes() {
    for mode in [DescMode::Indirect, DescMode::Chain] {
        let r = run(mode, Fault::None).expect("returned");
        assert_eq!(
            (r.requests, r.mismatches),
            (200, 0),
            "{mode:?}: {:?}",
            r.first_mismatches
        );
    }
}

#[test]
fn used_id_naming_a_non_head_descriptor_is_caught() {
    // Chain mode: requests use descriptors 6s..6s+4; id 6s+1 (or 6s+4,
    // the chain's last descriptor) names no request. (try_reap used to map
    // it to slot id / 6, and replay never compared `Used::id` with the
    // head: the run passed.)
    assert_caught(DescMode::Chain, Fault::IdPlus(1));
    assert_caught(DescMode::Chain, Fault::IdPlus(4));
}

#[test]
fn used_id_above_u16_is_caught() {
    // Indirect mode: try_reap used to truncate the id to u16 (`id as u16`).
    assert_caught(DescMode::Indirect, Fault::IdPlus(65536));
}

#[test]
fn device_write_to_readable_src_is_caught() {
    assert_caught(DescMode::Indirect, Fault::ClobberSrc);
}

#[test]
fn device_write_past_dst_descriptor_is_caught() {
    assert_caught(DescMode::Indirect, Fault::OverrunDst);
}

#[test]
fn used_id_naming_an_idle_slot_ends_the_run() {
    // A used id naming another (idle) slot, or the same request twice,
    // leaves the real request's buffer set busy. in_flight() used to be
    // the avail index minus the used index, which such an element moves:
    // it dropped to 0, and requests() / drain() then spun without ever
    // waiting, so the run neither timed out nor returned.
    assert_caught(DescMode::Indirect, Fault::IdPlus(1));
}

#[test]
fn request_completed_twice_ends_the_run() {
    assert_caught(DescMode::Indirect, Fault::Dup);
}

#[test]
fn device_write_to_readable_src_past_the_first_requests_is_caught() {
    // 30 x 200 requests; src is zeroed from the 5,000th on, where the tool
    // compares one src in 64.
    let r = run_repeated(DescMode::Indirect, Fault::ClobberSrcFrom(5000), 30).expect("returned");
    assert_eq!(r.requests, 6000);
    assert!(r.mismatches > 0, "the run passed: 6000 requests, 0 mismatches");
    // An honest run of the same length passes.
    let r = run_repeated(DescMode::Indirect, Fault::None, 30).expect("returned");
    assert_eq!((r.requests, r.mismatches), (6000, 0), "{:?}", r.first_mismatches);
}

// ---- Faults a second review found the tool did not catch ----

#[test]
fn device_write_to_readable_header_is_caught() {
    // The header is as device-readable as the IV and src. (A backend that
    // zeroed it after reading used to pass: replay wrote it again with
    // write_if_changed before the next request of the set.)
    assert_caught(DescMode::Indirect, Fault::ClobberHeader);
    assert_caught(DescMode::Chain, Fault::ClobberHeader);
}

const TRACE48: &str = r#"{"op":"create_session","name":"e","algo":"aes-cbc","key":"000102030405060708090a0b0c0d0e0f","direction":"encrypt"}
{"op":"generate","session":"e","opcode":"encrypt","size":48,"count":200,"seed":3}
"#;

#[test]
fn device_write_past_dst_of_a_48_byte_request_is_caught() {
    // Same fault as device_write_past_dst_descriptor_is_caught (16 bytes
    // past the dst descriptor), with 48-byte requests (max payload 48, as
    // main.rs sizes it from the trace): dst's area is rounded up to 64
    // bytes, so the overrun lands in the padding, not in the IV; the tool
    // puts a guard there.
    control_then_caught(TRACE48, 48, Fault::OverrunDst);
}

/// Replays `trace` (200 requests, slots for `max_payload` bytes) against
/// the honest fake, which must pass, and against one with `fault`, which
/// must not; returns the faulty run's report.
fn control_then_caught(trace: &str, max_payload: usize, fault: Fault) -> Report {
    control_then_caught_repeated(trace, max_payload, fault, 1, 200)
}

/// [`control_then_caught`] with the trace replayed `repeat` times, the
/// honest run completing `requests` requests.
fn control_then_caught_repeated(
    trace: &str,
    max_payload: usize,
    fault: Fault,
    repeat: u32,
    requests: u64,
) -> Report {
    let r = run_with(trace, max_payload, DescMode::Indirect, &[Fault::None], repeat).expect("returned");
    assert_eq!(
        (r.requests, r.mismatches),
        (requests, 0),
        "control: {:?}",
        r.first_mismatches
    );
    let r = run_with(trace, max_payload, DescMode::Indirect, &[fault], repeat).expect("returned");
    assert!(
        r.mismatches > 0 || r.error.is_some(),
        "{fault:?}: the run passed: {} requests, 0 mismatches",
        r.requests
    );
    r
}

#[test]
fn endless_bogus_used_elements_do_not_defeat_the_timeout() {
    // Request 5 is never completed; the backend keeps re-posting the last
    // (already reaped) used element. Each one is a mismatch, and none is a
    // completion: the run must end at its --timeout (2 s) with an error.
    // (reap() used to return Ok whenever anything arrived, so drain() never
    // timed out and replay() did not return.)
    for mode in [DescMode::Indirect, DescMode::Chain] {
        let r = run(mode, Fault::StuckAndRepost(5)).unwrap_or_else(|| {
            panic!("{mode:?}: replay() did not return within 60 s (its --timeout is 2 s)")
        });
        assert!(r.error.is_some(), "{mode:?}: no timeout: {r:?}");
    }
}

#[test]
fn src_written_on_the_second_queue_is_caught() {
    // Two queues, round robin: request seq goes to queue seq % 2. After
    // the first 4,096 the tool compares one src in 64; when that was
    // seq % 64 == 0 it always fell on queue 0, and a backend whose queue-1
    // worker zeroes src from its 2,500th request on (run request 5,000+)
    // was never caught. The sample is a hash of seq now. The same fault on
    // queue 0 is the control.
    let f = [Fault::ClobberSrcFrom(2500), Fault::None];
    let r = run_with(TRACE, 64, DescMode::Indirect, &f, 30).expect("returned");
    assert!(
        r.mismatches > 0,
        "queue 0: the run passed: {} requests, 0 mismatches",
        r.requests
    );
    let f = [Fault::None, Fault::ClobberSrcFrom(2500)];
    let r = run_with(TRACE, 64, DescMode::Indirect, &f, 30).expect("returned");
    assert_eq!(r.requests, 6000);
    assert!(
        r.mismatches > 0,
        "queue 1: the run passed: 6000 requests, 0 mismatches"
    );
}

#[test]
fn device_write_past_the_status_byte_is_caught() {
    assert_caught(DescMode::Indirect, Fault::WideStatus);
    assert_caught(DescMode::Chain, Fault::WideStatus);
}

const TRACE_CHAINED: &str = r#"{"op":"create_session","name":"e","algo":"aes-cbc","key":"000102030405060708090a0b0c0d0e0f","direction":"encrypt","mac":"hmac-sha1","auth_key":"0102030405060708090a0b0c0d0e0f1011121314","digest_len":12}
{"op":"generate","session":"e","opcode":"encrypt","size":64,"count":100,"seed":5,"in_place":true}
{"op":"generate","session":"e","opcode":"encrypt","size":48,"count":100,"seed":6,"in_place":true}
"#;

#[test]
fn device_write_past_hash_result_len_is_caught() {
    // Encrypt-then-MAC requests in place (as DPDK's guest driver sends
    // them), digests truncated to 12 bytes; the fake computes the MAC with
    // OpenSSL, the tool's expectations come from RustCrypto.
    let r = control_then_caught(TRACE_CHAINED, 64, Fault::DigestOverrun);
    assert!(
        r.first_mismatches
            .iter()
            .all(|m| m.field.starts_with("hash result area past")),
        "{:?}",
        r.first_mismatches
    );
}

// ---- The soak checker and raw requests ----

/// A soak of `count` requests (at most `max_size` bytes, `layouts`) on two
/// queues of the fake backend, both served with `fault`; `None` if it did
/// not return within 60 s.
fn soak_with(fault: Fault, count: u64, max_size: usize, layouts: Layouts) -> Option<SoakReport> {
    let o = SoakOptions {
        seed: 7,
        count,
        queue_depth: 8,
        sessions: 4,
        rekey_every: 100,
        stale_every: 20,
        max_size,
        layouts,
        timeout: Duration::from_secs(2),
        progress: false,
    };
    let (mut fe, stop) = connect_fake(&o.frontend_config(2, SessionAbi::C), &[fault, fault]);
    within_limit(stop, move || soak(&mut fe, &o, None).unwrap())
}

fn assert_soak_caught(fault: Fault, max_size: usize) {
    let r = soak_with(fault, 600, max_size, Layouts::Mixed)
        .unwrap_or_else(|| panic!("{fault:?}: soak() did not return within 60 s"));
    assert!(
        !r.passed(),
        "{fault:?}: the soak passed: {} requests ({} naming a closed session), layouts {:?}, 0 mismatches",
        r.requests,
        r.stale_requests,
        r.layouts
    );
}

#[test]
fn soak_control_an_honest_fake_backend_passes() {
    for max_size in [16, 2048] {
        let r = soak_with(Fault::None, 600, max_size, Layouts::Mixed).expect("returned");
        assert!(r.passed(), "{r:?}");
        assert!(r.stale_requests > 0 && r.rekeys > 0, "{r:?}");
    }
}

#[test]
fn soak_device_write_to_readable_iv_is_caught() {
    // (The soak used to read back only status, dst and src.)
    assert_soak_caught(Fault::ClobberIv, 2048);
}

#[test]
fn soak_device_write_to_readable_header_is_caught() {
    assert_soak_caught(Fault::ClobberHeader, 2048);
}

#[test]
fn soak_device_write_past_the_status_byte_is_caught() {
    assert_soak_caught(Fault::WideStatus, 2048);
}

#[test]
fn soak_dst_written_as_if_its_descriptors_were_contiguous_is_caught() {
    // The "cut" layouts used to put dst's pieces back to back in guest
    // memory, so a device that ignored every writable descriptor's address
    // but the first wrote the right bytes; they are 16 bytes apart now.
    assert_soak_caught(Fault::LinearDst, 2048);
}

#[test]
fn soak_write_past_dst_of_a_max_size_request_is_caught() {
    // --max-size 16: every request is max_size long, and the soak used to
    // check 16.min(max_size - len) = 0 bytes after dst.
    assert_soak_caught(Fault::OverrunDst, 16);
}

/// Eight requests: on [`run_with`]'s 64-entry ring at depth 8 no slot, no
/// buffer set and no descriptor is used twice, so a descriptor the device
/// changes after completing a request is never read again by a later one.
const TRACE8: &str = r#"{"op":"create_session","name":"e","algo":"aes-cbc","key":"000102030405060708090a0b0c0d0e0f","direction":"encrypt"}
{"op":"generate","session":"e","opcode":"encrypt","size":64,"count":8,"seed":5}
"#;

/// Replays `trace` (`requests` requests) in both descriptor modes against
/// the honest fake (0 mismatches) and against `fault`: every request
/// completes right, and the changed descriptors are one mismatch.
fn assert_descs_caught(trace: &str, requests: u64, fault: Fault) {
    assert_descs_caught_in(&[DescMode::Indirect, DescMode::Chain], trace, requests, fault);
}

fn assert_descs_caught_in(modes: &[DescMode], trace: &str, requests: u64, fault: Fault) {
    for &mode in modes {
        let honest = run_with(trace, 64, mode, &[Fault::None], 1).expect("returned");
        assert_eq!(
            (honest.requests, honest.mismatches),
            (requests, 0),
            "{mode:?}: {honest:?}"
        );
        let r = run_with(trace, 64, mode, &[fault], 1).expect("returned");
        assert_eq!(r.requests, requests, "{mode:?}: {r:?}");
        assert_eq!(r.mismatches, 1, "{mode:?}: {r:?}");
        assert_eq!(r.first_mismatches[0].field, "descriptors", "{mode:?}: {r:?}");
        assert!(r.first_mismatches[0].got.contains("changed"), "{mode:?}: {r:?}");
    }
}

#[test]
fn device_write_to_the_descriptors_is_caught() {
    // (The main replay path did not read the descriptors back: with no
    // later request reading the changed ones, such a device passed.)
    assert_descs_caught(TRACE8, 8, Fault::ClobberDescs);
}

/// Eight 64-byte requests, then three of 32 bytes: the later ones reuse
/// the first buffer sets (indirect) or slots (chain) with another shape,
/// so the tool writes their descriptors again.
const TRACE8_3: &str = r#"{"op":"create_session","name":"e","algo":"aes-cbc","key":"000102030405060708090a0b0c0d0e0f","direction":"encrypt"}
{"op":"generate","session":"e","opcode":"encrypt","size":64,"count":8,"seed":5}
{"op":"generate","session":"e","opcode":"encrypt","size":32,"count":3,"seed":6}
"#;

#[test]
fn device_write_to_descriptors_the_tool_then_rewrites_is_caught() {
    // (The tool's rewrite for the new shape repaired the changed
    // descriptor before the check after the run could see it.)
    assert_descs_caught(TRACE8_3, 11, Fault::ClobberDescsOnce);
}

/// 64 requests of 64 bytes, then three of 32 bytes, in one run of
/// requests: in indirect mode the 65th takes the ring's first slot again
/// (64 entries) with another shape, so the tool rewrites that slot's head
/// descriptor. (Chain mode has 10 slots of 6 descriptors, reused with the
/// same shape long before: there a changed head is read by the device
/// again, not rewritten.)
const TRACE64_3: &str = r#"{"op":"create_session","name":"e","algo":"aes-cbc","key":"000102030405060708090a0b0c0d0e0f","direction":"encrypt"}
{"op":"generate","session":"e","opcode":"encrypt","size":64,"count":64,"seed":5}
{"op":"generate","session":"e","opcode":"encrypt","size":32,"count":3,"seed":6}
"#;

#[test]
fn device_write_to_a_head_descriptor_the_tool_then_rewrites_is_caught() {
    // (In indirect mode the ring's head descriptor is checked apart from
    // the table it points at, which this device leaves alone.)
    assert_descs_caught_in(&[DescMode::Indirect], TRACE64_3, 67, Fault::ClobberHeadOnce);
}

#[test]
fn soak_device_write_to_the_descriptors_is_caught() {
    // (The soak did not read the ring's descriptors or the indirect
    // tables back.)
    let r = soak_with(Fault::ClobberDescs, 600, 2048, Layouts::Mixed).expect("returned");
    assert!(!r.passed(), "{r:?}");
    assert!(
        r.first_mismatches
            .iter()
            .any(|m| m.contains("descriptors (ring or indirect table) changed")),
        "{:?}",
        r.first_mismatches
    );
    // Every request the fake ran was caught (it completes those naming a
    // closed session before the fault).
    assert_eq!(r.mismatches, r.completed - r.stale_requests, "{r:?}");
}

const RAW_TRACE: &str = r#"{"op":"create_session","name":"E","algo":"aes-cbc","key":"2b7e151628aed2a6abf7158809cf4f3c","direction":"encrypt"}
{"op":"raw","header":{"opcode":0,"iv_len":16,"src_len":64,"dst_len":64,"op_type":1,"algo":0,"session":"E"},"descriptors":[{"at":0,"len":72,"data":"header"},{"at":128,"len":16,"data":"000102030405060708090a0b0c0d0e0f"},{"at":256,"len":64,"data":"6bc1bee22e409f96e93d7e117393172aae2d8a571e03ac9c9eb76fac45af8e5130c81c46a35ce411e5fbc1191a0a52eff69f2445df4f9b17ad2b417be66c3710"},{"at":512,"len":64,"write":true},{"at":1024,"len":1,"write":true}],"expect":{"used_len":65,"status":"ok","dst":"7649abac8119b246cee98e9b12e9197d5086cb9b507219ee95db113a917678b273bed6b8e3c1743b7116e69e222295163ff1caa1681fac09120eca307586e1a7","untouched":true}}
"#;

fn assert_raw_caught(fault: Fault) {
    let r = run_with(RAW_TRACE, 1024, DescMode::Indirect, &[fault], 1).expect("returned");
    assert!(
        r.mismatches > 0 || r.error.is_some(),
        "{fault:?}: the raw request (hostile-guest.jsonl's baseline, with \"untouched\") passed: {:?}",
        r
    );
}

#[test]
fn raw_control_an_honest_fake_backend_passes() {
    let r = run_with(RAW_TRACE, 1024, DescMode::Indirect, &[Fault::None], 1).expect("returned");
    assert_eq!((r.requests, r.mismatches), (1, 0), "{:?}", r.first_mismatches);
}

#[test]
fn raw_device_write_to_readable_buffers_is_caught() {
    assert_raw_caught(Fault::ClobberSrc);
    assert_raw_caught(Fault::ClobberHeader);
    assert_raw_caught(Fault::ClobberIv);
}

#[test]
fn raw_device_write_past_the_dst_descriptor_is_caught() {
    // dst is scratch bytes 512..576; the write lands at 576..592, scratch
    // bytes in no descriptor, which the tool used not to read back.
    assert_raw_caught(Fault::OverrunDst);
}

#[test]
fn raw_device_write_past_the_status_byte_is_caught() {
    assert_raw_caught(Fault::WideStatus);
}

/// Runs `trace` (`requests` requests of up to 64 bytes, 8 buffer sets)
/// `repeat` times against the honest fake, which must pass, and against
/// one that leaves the first 16 bytes of dst alone from request `from`
/// on, which must not.
fn dst_kept_is_caught(trace: &str, requests: u64, from: u64, repeat: u32) {
    let fault = Fault::KeepDstHeadFrom(from);
    control_then_caught_repeated(trace, 64, fault, repeat, requests * u64::from(repeat));
}

#[test]
fn dst_left_holding_the_same_requests_output_is_caught() {
    // 8 requests on 8 buffer sets: each pass puts request i in set i
    // again, whose dst still holds request i's output from the pass
    // before. A device that does not write its first block is caught only
    // by the canary the tool puts there first.
    let trace = r#"{"op":"create_session","name":"e","algo":"aes-cbc","key":"000102030405060708090a0b0c0d0e0f","direction":"encrypt"}
{"op":"generate","session":"e","opcode":"encrypt","size":64,"count":8,"seed":9}
"#;
    dst_kept_is_caught(trace, 8, 8, 3);
}

#[test]
fn dst_left_holding_an_output_the_tool_stopped_tracking_is_caught() {
    // Each pass: 8 out-of-place requests on the 8 buffer sets, then 8 in
    // place on the same sets. An in-place request leaves its set's dst
    // alone, and the tool no longer knows what that dst holds (it checks
    // src there): in the next pass, the out-of-place request i finds its
    // own output from the pass before in dst, and only the canary, put
    // where nothing is known, catches a device that does not write it.
    // (The in-place requests are 48 bytes, so that the guard the tool puts
    // after their src stays in src's 64-byte area, not in dst.)
    let trace = r#"{"op":"create_session","name":"e","algo":"aes-cbc","key":"000102030405060708090a0b0c0d0e0f","direction":"encrypt"}
{"op":"generate","session":"e","opcode":"encrypt","size":64,"count":8,"seed":9}
{"op":"generate","session":"e","opcode":"encrypt","size":48,"count":8,"seed":10,"in_place":true}
"#;
    dst_kept_is_caught(trace, 16, 16, 3);
}

#[test]
fn dst_left_holding_another_requests_equal_block_is_caught() {
    // 16 requests with one key, IV and first plaintext block, so one
    // first output block: requests 8..16 reuse the buffer sets of 0..8,
    // whose dst already holds their first block. The device leaves it
    // alone from request 8 on; only the canary catches that. (Expected
    // outputs from OpenSSL.)
    let srcs: Vec<Vec<u8>> = (0..16u8)
        .map(|i| {
            (0..64u8)
                .map(|j| if j < 16 { 0x42 } else { j ^ i.wrapping_mul(29) })
                .collect()
        })
        .collect();
    dst_kept_is_caught(&encrypt_trace(&[7; 16], &[9; 16], &srcs), 16, 8, 1);
}

/// A trace of one AES-128-CBC encrypt session with `key` and a request
/// with `iv` for each of `srcs` (whole blocks), each expecting OpenSSL's
/// output.
fn encrypt_trace(key: &[u8; 16], iv: &[u8; 16], srcs: &[Vec<u8>]) -> String {
    let mut trace = format!(
        "{{\"op\":\"create_session\",\"name\":\"e\",\"algo\":\"aes-cbc\",\"key\":\"{}\",\"direction\":\"encrypt\"}}\n",
        hex(key)
    );
    for src in srcs {
        trace += &format!(
            "{{\"op\":\"request\",\"session\":\"e\",\"opcode\":\"encrypt\",\"iv\":\"{}\",\"src\":\"{}\",\"expect\":{{\"status\":\"ok\",\"dst\":\"{}\"}}}}\n",
            hex(iv),
            hex(src),
            hex(&oracle::oracle(true, key, iv, src))
        );
    }
    trace
}

/// 16 AES-128-CBC encryptions of 1 KiB (long enough to alternate between
/// their buffer set's data buffers) with one key and IV, expected outputs
/// from OpenSSL: request i + 8 has the 8 buffer sets of request i, in
/// the other placement, so its dst is request i's src buffer. With
/// `src_echoes`, the first block of request i's src is request i + 8's
/// first output block.
fn alternating_trace(src_echoes: bool) -> String {
    let (key, iv) = ([7u8; 16], [9u8; 16]);
    let mut srcs: Vec<Vec<u8>> = (0..16u32)
        .map(|i| (0..1024u32).map(|j| (j * 7 + i * 131 + j / 251) as u8).collect())
        .collect();
    if src_echoes {
        for i in 0..8 {
            let first = oracle::oracle(true, &key, &iv, &srcs[i + 8])[..16].to_vec();
            srcs[i][..16].copy_from_slice(&first);
        }
    }
    encrypt_trace(&key, &iv, &srcs)
}

#[test]
fn dst_left_holding_an_earlier_src_of_the_same_block_is_caught() {
    // Requests 8..16 write their output where requests 0..8 had their src,
    // whose first block is already each one's first output block. The
    // device leaves that block alone from request 8 on; only the canary
    // catches it, put there because the tool knows what src it wrote.
    control_then_caught_repeated(&alternating_trace(true), 1024, Fault::KeepDstHeadFrom(8), 1, 16);
}

#[test]
fn device_write_past_a_dst_that_precedes_src_is_caught() {
    // 300 passes of 16 requests; from the 4,200th on (where the tool
    // compares one src in 64), the device writes 16 bytes past each dst
    // that lies just before its src, onto src's first block.
    let r = control_then_caught_repeated(
        &alternating_trace(false),
        1024,
        Fault::OverrunDstBeforeSrcFrom(4200),
        300,
        4800,
    );
    assert!(
        r.first_mismatches
            .iter()
            .any(|m| m.field.starts_with("src[0..16]")),
        "{:?}",
        r.first_mismatches
    );
}

#[test]
fn device_write_to_a_swapped_requests_indirect_table_is_caught() {
    // Requests 8..16 of the alternating trace use their buffer sets'
    // second indirect table; from request 8 on the device clears a flag
    // in the table it was given.
    let trace = alternating_trace(false);
    let honest = run_with(&trace, 1024, DescMode::Indirect, &[Fault::None], 1).expect("returned");
    assert_eq!((honest.requests, honest.mismatches), (16, 0), "{honest:?}");
    let r = run_with(&trace, 1024, DescMode::Indirect, &[Fault::ClobberDescsFrom(8)], 1).expect("returned");
    assert_eq!((r.requests, r.mismatches), (16, 1), "{r:?}");
    assert_eq!(r.first_mismatches[0].field, "descriptors", "{r:?}");
    assert!(
        r.first_mismatches[0].got.contains("indirect table 1, entry"),
        "{r:?}"
    );
}
