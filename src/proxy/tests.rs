// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The layer's framing over real socket pairs: a fake frontend on one
//! side, a fake library on the other. Messages are laid out by hand from
//! the vhost-user spec (header: request, flags, size; u64 payloads).

use std::fs::File;
use std::io::{self, Read};
use std::net::Shutdown;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use super::framing::recv_some;
use super::pump::{check_descriptor_count, takes_descriptors};
use super::*;
use crate::memory_check::check_memory_regions;
use crate::memory_check::test_files::{memfd, table};
use crate::sessions::session_set;
use crate::wire::vhost_user::{FrontendReq, Header, NEED_REPLY};

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
    let Header {
        request: req,
        flags,
        size,
    } = Header::from_bytes(&hdr);
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
    // CRYPTO_SESSION (bit 7) | REPLY_ACK (bit 3).
    let pf: u64 = (1 << 7) | (1 << 3);
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
            &[&[msg(3, 1 | NEED_REPLY, &[]), msg(26, 1, &create)].concat()[..]],
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
        .send_with_fds(&[&msg(27, 1 | NEED_REPLY, &9u64.to_le_bytes())[..]], &[])
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
    assert_eq!(close(1, 1 | NEED_REPLY), ack(0), "closed");
    assert_eq!(close(1, 1 | NEED_REPLY), ack(1), "already closed");
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

#[test]
fn only_checked_descriptors_reach_the_library() {
    let one = table(4096, 0);
    // SET_MEM_TABLE: one descriptor per region, by its count field.
    assert!(check_descriptor_count(FrontendReq::SET_MEM_TABLE, &one, 1).is_ok());
    for n in [0, 2, 33] {
        let e = check_descriptor_count(FrontendReq::SET_MEM_TABLE, &one, n).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{n} fds");
    }
    // A count of 2 with one region in the payload: the second
    // descriptor would go unchecked.
    let mut two = one.clone();
    two[0] = 2;
    let files = [memfd(0, 4096), memfd(0, 4096)];
    assert!(check_descriptor_count(FrontendReq::SET_MEM_TABLE, &two, 2).is_ok());
    let e = check_memory_regions(FrontendReq::SET_MEM_TABLE, &two, &files, false).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    assert!(check_descriptor_count(FrontendReq::ADD_MEM_REG, &[], 1).is_ok());
    assert!(check_descriptor_count(FrontendReq::ADD_MEM_REG, &[], 2).is_err());
    for r in [
        FrontendReq::SET_VRING_KICK,
        FrontendReq::SET_VRING_CALL,
        FrontendReq::SET_VRING_ERR,
    ] {
        assert!(check_descriptor_count(r, &[], 0).is_ok());
        assert!(check_descriptor_count(r, &[], 1).is_ok());
        assert!(check_descriptor_count(r, &[], 2).is_err(), "{r:?}");
        assert!(takes_descriptors(r));
    }
    // Messages of features the daemon does not offer: their
    // descriptors are not forwarded (SET_LOG_BASE, SET_LOG_FD,
    // SET_BACKEND_REQ_FD, SET_INFLIGHT_FD, SET_DEVICE_STATE_FD).
    for r in [6u32, 7, 21, 32, 42, 1, 26] {
        let req = FrontendReq::try_from(r).unwrap();
        assert!(!takes_descriptors(req), "{r}");
    }
    // A memory region's descriptor must be a regular file.
    let (a, _b) = UnixStream::pair().unwrap();
    let sock = [File::from(OwnedFd::from(a))];
    let e = check_memory_regions(FrontendReq::SET_MEM_TABLE, &table(0, 0), &sock, false).unwrap_err();
    assert!(e.to_string().contains("not a regular file"), "{e}");
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
