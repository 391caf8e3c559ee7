// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Sessions and requests through the replay tool's frontend
//! (`vhost_crypto_replay::frontend`), checked against NIST SP 800-38A and
//! OpenSSL.

use std::os::unix::net::UnixStream;
use std::path::Path;

use super::daemon::TIMEOUT;
use crate::common::frontend_config::one_queue;
use crate::common::*;
use vhost_crypto_replay::frontend::{CryptoFrontend, DescMode, FrontendConfig, Used};
use vhost_user_crypto::wire::session::{SessionAbi, SymSessionInfo};
use vhost_user_crypto::wire::virtio_crypto::OpDataReq;

/// `queues` queues of `queue_size` entries, `depth` requests of up to
/// `max_payload` bytes in flight, session layout `abi`, indirect tables.
pub fn cfg(abi: SessionAbi, queues: u16, queue_size: u16, depth: u16, max_payload: usize) -> FrontendConfig {
    FrontendConfig {
        queues,
        max_payload,
        session_abi: abi,
        ..one_queue(queue_size, depth)
    }
}

/// A `CryptoFrontend` whose socket has read and write timeouts.
pub fn frontend(sock: &Path, cfg: &FrontendConfig) -> CryptoFrontend {
    let s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(TIMEOUT)).unwrap();
    s.set_write_timeout(Some(TIMEOUT)).unwrap();
    CryptoFrontend::from_stream(s, cfg).unwrap()
}

/// AES-CBC with `key` in `direction`, as QEMU and DPDK fill it in.
pub fn session(key: &[u8], direction: u8) -> SymSessionInfo {
    SymSessionInfo {
        op_code: 2, // VIRTIO_CRYPTO_CIPHER_CREATE_SESSION (layouts A and C carry it)
        ..SymSessionInfo::aes_cbc(key, direction)
    }
}

/// One request on queue `q`: writes header, IV, src, a 0xEE-filled dst
/// and a 0xFF status byte into a free slot and makes it available (no kick).
pub fn put_request(fe: &mut CryptoFrontend, q: usize, opcode: u32, sid: u64, iv: &[u8], src: &[u8]) -> u16 {
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
pub fn result(fe: &CryptoFrontend, q: usize, u: Used, len: usize) -> (u8, u32, Vec<u8>) {
    let q = &fe.queues[q];
    let l = q.layout(u.slot);
    let mut dst = vec![0; len];
    q.mem().read(l.dst, &mut dst);
    (q.mem().read_u8(l.status), u.len, dst)
}

/// Runs one request on queue 0 and returns (status, used length, dst).
pub fn run_one(fe: &mut CryptoFrontend, opcode: u32, sid: u64, src: &[u8]) -> (u8, u32, Vec<u8>) {
    let slot = put_request(fe, 0, opcode, sid, &NIST_IV, src);
    fe.queues[0].publish_and_kick().unwrap();
    let mut done = Vec::new();
    fe.queues[0].reap(&mut done, TIMEOUT).unwrap();
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].slot, slot);
    result(fe, 0, done[0], src.len())
}

/// A fresh frontend gets F.2.1 (and F.2.2) right: status OK, used length 65.
#[track_caller]
pub fn assert_nist(sock: &Path, after: &str) {
    let mut fe = frontend(sock, &cfg(SessionAbi::C, 1, 64, 8, 64));
    let e = fe.create_session(&session(&NIST_KEY, 1)).unwrap();
    let d = fe.create_session(&session(&NIST_KEY, 2)).unwrap();
    // Ids go on from the daemon's earlier connections (never reused).
    assert!(
        e >= 1 && d == e + 1,
        "session ids {e}, {d} on a fresh connection after {after}"
    );
    let (st, len, dst) = run_one(&mut fe, ENCRYPT, e as u64, &NIST_PT);
    assert_eq!((st, len), (OK, 65), "F.2.1 status and used length after {after}");
    assert_eq!(dst, NIST_CT.to_vec(), "F.2.1 ciphertext after {after}");
    let (st, len, dst) = run_one(&mut fe, DECRYPT, d as u64, &NIST_CT);
    assert_eq!((st, len, dst), (OK, 65, NIST_PT.to_vec()), "F.2.2 after {after}");
}

/// One queue of 256 entries, 16 requests of up to 4 KiB in flight,
/// session layout `abi`, descriptors laid out as `mode` says.
pub fn config(abi: SessionAbi, mode: DescMode) -> FrontendConfig {
    FrontendConfig {
        max_payload: 4096,
        session_abi: abi,
        desc_mode: mode,
        ..one_queue(256, 16)
    }
}

/// AES-128-CBC in `direction` with the NIST key, `op_code` left at 0.
pub fn nist_session(direction: u8) -> SymSessionInfo {
    SymSessionInfo::aes_cbc(&NIST_KEY, direction)
}

/// On a new connection in session layout `abi` and descriptor layout
/// `mode`: NIST SP 800-38A F.2.1 and F.2.2, then INVSESS for the closed
/// session, and a CLOSE of an unknown id ignored.
pub fn nist_roundtrip(sock: &Path, abi: SessionAbi, mode: DescMode) {
    let mut fe = CryptoFrontend::connect(sock, &config(abi, mode)).unwrap();
    let e = fe.create_session(&nist_session(1)).unwrap();
    let d = fe.create_session(&nist_session(2)).unwrap();
    assert!(e >= 1 && d > e, "{abi:?}: ids {e} {d}");
    let (st, len, dst) = run_one(&mut fe, ENCRYPT, e as u64, &NIST_PT);
    assert_eq!((st, len), (OK, 65), "{abi:?} {mode:?} encrypt");
    assert_eq!(dst, NIST_CT.to_vec(), "{abi:?} {mode:?} encrypt");
    let (st, len, dst) = run_one(&mut fe, DECRYPT, d as u64, &NIST_CT);
    assert_eq!((st, len), (OK, 65), "{abi:?} {mode:?} decrypt");
    assert_eq!(dst, NIST_PT.to_vec(), "{abi:?} {mode:?} decrypt");
    // Closed session: INVSESS, used length 1.
    // CLOSE has no reply (QEMU reads none); close_session follows it with a
    // GET_FEATURES round trip, so the close has taken effect.
    fe.close_session(e as u64).unwrap();
    let (st, len, _) = run_one(&mut fe, ENCRYPT, e as u64, &NIST_PT);
    assert_eq!((st, len), (INVSESS, 1), "{abi:?} closed session");
    // Close of an unknown id: ignored, the connection keeps working.
    fe.close_session(999).unwrap();
    let (st, _, dst) = run_one(&mut fe, DECRYPT, d as u64, &NIST_CT);
    assert_eq!((st, dst), (OK, NIST_PT.to_vec()));
}

/// One verified request: session, direction, key, IV, source.
pub struct Job {
    pub sid: u64,
    pub encrypt: bool,
    pub key: Vec<u8>,
    pub iv: Vec<u8>,
    pub src: Vec<u8>,
}

/// Runs `jobs` on queue `q` with up to `depth` in flight and checks every
/// completion against OpenSSL (status OK, used length len + 1, dst bytes).
/// With `abandon_at = Some(n)`, stops after submitting `n` jobs, kicks,
/// and returns with them in flight (the caller then disconnects).
pub fn run_jobs(
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
                (OK, j.src.len() as u32 + 1),
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

pub fn jobs_4k(rng: &mut Rng, count: usize, sid: u64, key: &[u8]) -> Vec<Job> {
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
