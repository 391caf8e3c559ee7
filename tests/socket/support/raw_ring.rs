// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A data ring set up by hand over a raw connection, in a memory file
//! the test writes with pwrite: NIST SP 800-38A F.2.1 requests as
//! 5-descriptor chains (VIRTIO 1.2 §2.7.5), their completions read back.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use super::conn::{mem_table, vring_addr, vring_state, Conn, MEM_SIZE, UADDR};
use super::daemon::TIMEOUT;
use super::frontend::session;
use crate::common::*;
use vhost_crypto_replay::driver_ring::{self, Buf, DriverMemory, DriverRing, SplitRing};
use vhost_user_crypto::wire::session::{create_request, SessionAbi};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// Where [`submit_raw_nist`] puts a request: header, IV, src (0x12000),
/// dst, status, 4 KiB apart ([`submit_nist_at`]), then the ring
/// (descriptors, avail ring, used ring) at 512 KiB.
pub const RAW_HDR: u64 = 0x10000;
pub const RAW_IV: u64 = 0x11000;
pub const RAW_DST: u64 = 0x13000;
pub const RAW_STATUS: u64 = 0x14000;
pub const RAW_DESC: u64 = 0x80000;
pub const RAW_AVAIL: u64 = 0x81000;
pub const RAW_USED: u64 = 0x82000;

/// A memory file as the driver ring's [`DriverMemory`]: guest address =
/// file offset, written with pwrite and read with pread (the daemon sees
/// the same pages through its mapping).
#[derive(Clone, Copy)]
pub struct FileMem<'a>(pub &'a File);

impl DriverMemory for FileMem<'_> {
    fn write(&self, gpa: u64, bytes: &[u8]) {
        use std::os::unix::fs::FileExt;
        self.0.write_all_at(bytes, gpa).unwrap();
    }

    fn read(&self, gpa: u64, buf: &mut [u8]) {
        use std::os::unix::fs::FileExt;
        self.0.read_exact_at(buf, gpa).unwrap();
    }
}

/// The ring [`raw_ring_at`] sets up at `at`: 256 entries, descriptors at
/// `at`, avail ring at +4 KiB, used ring at +8 KiB.
pub fn raw_split_ring(at: u64) -> SplitRing {
    SplitRing {
        size: 256,
        desc: at,
        avail: at + 0x1000,
        used: at + 0x2000,
    }
}

/// One NIST F.2.1 encryption written straight into a raw guest memory file
/// with pwrite (the daemon sees the same pages through its mapping): a
/// direct 5-descriptor chain (header, IV, src, dst, status) at head 0 of the
/// ring at 512 KiB (avail ring +4 KiB, used ring +8 KiB), published as the
/// `n`th avail entry; kicks and waits for the call eventfd, then returns
/// (used id, used length, status, dst).
pub fn raw_nist_request(
    mem: &File,
    kick: &EventFd,
    call: &EventFd,
    sid: u64,
    n: u16,
) -> (u32, u32, u8, Vec<u8>) {
    submit_raw_nist(mem, kick, sid, n);
    await_call(call, "for the request");
    raw_nist_result(mem, n)
}

/// Waits up to [`TIMEOUT`] for a used-buffer notification on `call`
/// (`after` says what it should follow, for the failure message).
#[track_caller]
pub fn await_call(call: &EventFd, after: &str) {
    let start = Instant::now();
    while call.read().is_err() {
        assert!(start.elapsed() < TIMEOUT, "no used-buffer notification {after}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The guest's part of [`raw_nist_request`]: writes the request, publishes
/// it as the `n`th avail entry and kicks.
pub fn submit_raw_nist(mem: &File, kick: &EventFd, sid: u64, n: u16) {
    submit_nist_at(mem, kick, RAW_DESC, RAW_HDR, sid, n);
}

/// [`submit_raw_nist`] for a ring at `ring_at` (avail ring +4 KiB) whose
/// buffers lie at `buf_at` (header; IV, src, dst and status 4 KiB apart
/// after it): [`RAW_DESC`] and [`RAW_HDR`] are the usual ones.
pub fn submit_nist_at(mem: &File, kick: &EventFd, ring_at: u64, buf_at: u64, sid: u64, n: u16) {
    let bufs = put_nist_buffers(mem, sid, buf_at, 0x1000);
    let mut driver = DriverRing::new(raw_split_ring(ring_at), n - 1);
    driver.write_chain(&FileMem(mem), 0, &bufs);
    // avail.ring[n - 1] = head 0, then avail.idx = n.
    driver.push(&FileMem(mem), 0);
    driver.publish(&FileMem(mem));
    kick.write(1).unwrap();
}

/// Writes the buffers of a NIST F.2.1 encryption in session `sid` into
/// `mem`: header at `at`, then IV, src, dst and status each `step` bytes
/// further (dst and status filled with canaries), and returns the buffers
/// (header, IV, src, dst, status) for [`write_chain`].
pub fn put_nist_buffers(mem: &File, sid: u64, at: u64, step: u64) -> [Buf; 5] {
    use std::os::unix::fs::FileExt;
    let [hdr_at, iv_at, src_at, dst_at, status_at] = [0, 1, 2, 3, 4].map(|k| at + k * step);
    mem.write_all_at(&hdr(ENCRYPT, sid, 64, 64).to_bytes(), hdr_at)
        .unwrap();
    mem.write_all_at(&NIST_IV, iv_at).unwrap();
    mem.write_all_at(&NIST_PT, src_at).unwrap();
    mem.write_all_at(&[0xEE; 64], dst_at).unwrap();
    mem.write_all_at(&[0xFF], status_at).unwrap();
    [
        Buf::readable(hdr_at, 72),
        Buf::readable(iv_at, 16),
        Buf::readable(src_at, 64),
        Buf::writable(dst_at, 64),
        Buf::writable(status_at, 1),
    ]
}

/// Writes `bufs` as a direct chain from descriptor 0 of the table at guest
/// address `desc` (VIRTIO 1.2 §2.7.5), linked 0 → 1 → … by NEXT on all
/// but the last ([`driver_ring::chain`]).
pub fn write_chain(mem: &File, desc: u64, bufs: &[Buf]) {
    for (k, d) in driver_ring::chain(bufs, 0).enumerate() {
        driver_ring::write_desc(&FileMem(mem), desc, k as u16, &d);
    }
}

/// Creates the NIST F.2.1 encrypt session (AES-128, layout C) on a raw
/// connection; its id (≥ 1; ids go on from the daemon's earlier
/// connections).
#[track_caller]
pub fn create_nist_session(c: &Conn) -> u64 {
    let sid = create_nist_session_id(c);
    assert!(sid >= 1, "session id {sid}");
    sid as u64
}

/// Sends the CREATE of [`create_nist_session`] and returns the id replied.
#[track_caller]
pub fn create_nist_session_id(c: &Conn) -> i64 {
    c.send_bytes(&create_request(SessionAbi::C, &session(&NIST_KEY, 1)), &[])
        .unwrap();
    let p = c.reply(CREATE_CRYPTO_SESSION);
    i64::from_le_bytes(p[1064..1072].try_into().unwrap())
}

/// Request `n` of [`submit_raw_nist`] completed as NIST F.2.1 says: head 0,
/// used length 65, status OK, the F.2.1 ciphertext.
#[track_caller]
pub fn assert_raw_nist_ok(n: u16, (id, len, status, dst): (u32, u32, u8, Vec<u8>)) {
    assert_eq!(
        (id, len, status),
        (0, 65, OK),
        "request {n}: used id, used length, status"
    );
    assert_eq!(dst, NIST_CT.to_vec(), "request {n}: F.2.1 ciphertext");
}

/// The `n`th completion of [`submit_raw_nist`]'s requests: (used id, used
/// length, status, dst). Checks that `used.idx` is `n`.
pub fn raw_nist_result(mem: &File, n: u16) -> (u32, u32, u8, Vec<u8>) {
    let m = FileMem(mem);
    let driver = DriverRing::new(raw_split_ring(RAW_DESC), 0);
    assert_eq!(driver.used_idx(&m), n, "used.idx");
    let e = driver.used_elem(&m, n - 1);
    let (mut dst, mut status) = (vec![0u8; 64], [0u8]);
    m.read(RAW_DST, &mut dst);
    m.read(RAW_STATUS, &mut status);
    (e.id, e.len, status[0], dst)
}

/// Sets up data ring 0 at 512 KiB on a negotiated connection after a
/// SET_MEM_TABLE with `mem` (one 1 MiB region at guest address 0); every
/// message is acked with 0.
pub fn raw_ring(c: &Conn, mem: &File, kick: &EventFd, call: &EventFd) {
    raw_ring_index(c, mem, 0, kick, call);
}

/// [`raw_ring`] for data ring `index`.
pub fn raw_ring_index(c: &Conn, mem: &File, index: u32, kick: &EventFd, call: &EventFd) {
    set_mem_table(c, mem, &[(0, MEM_SIZE, UADDR, 0)]);
    raw_ring_at(c, index, RAW_DESC, kick, call);
}

/// SET_MEM_TABLE of `regions` (guest address, size, frontend address,
/// offset), all in `mem`; acked with 0.
#[track_caller]
pub fn set_mem_table(c: &Conn, mem: &File, regions: &[(u64, u64, u64, u64)]) {
    c.send(
        SET_MEM_TABLE,
        VERSION_1 | NEED_REPLY,
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
pub fn ring_with_one_request_served(c: &Conn) -> (File, EventFd, EventFd, u64) {
    ring_with_one_request_served_at(c, 0)
}

/// [`ring_with_one_request_served`] on data ring `index`.
pub fn ring_with_one_request_served_at(c: &Conn, index: u32) -> (File, EventFd, EventFd, u64) {
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
pub fn raw_ring_at(c: &Conn, index: u32, at: u64, kick: &EventFd, call: &EventFd) {
    let addr = vring_addr(index, UADDR + at, UADDR + at + 0x2000, UADDR + at + 0x1000);
    start_ring(c, index, Some(addr), kick, call);
}

/// Sends SET_VRING_NUM (256 entries), SET_VRING_BASE (0), the
/// SET_VRING_ADDR payload `addr` if there is one, SET_VRING_KICK `kick`
/// and SET_VRING_CALL `call` for data ring `index`; every message is acked
/// with 0.
pub fn start_ring(c: &Conn, index: u32, addr: Option<Vec<u8>>, kick: &EventFd, call: &EventFd) {
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
        c.send(req, VERSION_1 | NEED_REPLY, &payload, &fds).unwrap();
        assert_eq!(c.reply_u64(req), 0, "request {req}");
    }
}

/// A u16 of data ring 0's used ring (set up by [`raw_ring`] at 0x82000):
/// `used.flags` at 0, `used.idx` at 2.
pub fn ring0_used_u16(mem: &File, at: u64) -> u16 {
    use std::os::unix::fs::FileExt;
    let mut b = [0u8; 2];
    mem.read_exact_at(&mut b, RAW_USED + at).unwrap();
    u16::from_le_bytes(b)
}

/// `used.idx` of the ring at `ring_at` (used ring +8 KiB).
pub fn used_idx_at(mem: &File, ring_at: u64) -> u16 {
    DriverRing::new(raw_split_ring(ring_at), 0).used_idx(&FileMem(mem))
}

/// Submits request `n` ([`submit_nist_at`]) and waits for `used.idx` to
/// reach `n`; false after 2 s.
pub fn served_at(mem: &File, kick: &EventFd, ring_at: u64, buf_at: u64, sid: u64, n: u16) -> bool {
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
