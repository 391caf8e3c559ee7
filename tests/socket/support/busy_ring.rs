// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A guest that keeps its rings busy on its own, as another vCPU would,
//! while the test sends control messages, moves or stops the rings, or
//! leaves.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::time::Duration;

use super::conn::{mem_table, Conn, MEM_SIZE, UADDR};
use super::daemon::Daemon;
use super::frontend::assert_nist;
use super::raw_ring::{create_nist_session, raw_ring_at, ring0_used_u16, used_idx_at, write_chain, RAW_DESC};
use crate::common::*;
use vhost_crypto_replay::driver_ring::Buf;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// A daemon, a negotiated connection with data ring 0 set up
/// ([`raw_ring`]) and one AES-128 encrypt session, and a guest that keeps
/// the ring busy on its own, as another vCPU would: every avail entry
/// names head 0, a 64 KiB encryption (header 0x10000, src 0x20000, dst
/// 0x40000, status 0x14000), and a thread keeps the avail index 256 ahead
/// of the used index, kicking after each move, until
/// [`BusyRing::stop_guest`]. Started 100 ms before it is returned.
pub struct BusyRing {
    pub daemon: Daemon,
    /// The connection (taken by a test that drops it).
    pub conn: Option<Conn>,
    pub mem: File,
    pub kicks: Vec<EventFd>,
    pub _calls: Vec<EventFd>,
    pub stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    pub guest: Option<std::thread::JoinHandle<()>>,
}

impl BusyRing {
    pub fn start() -> BusyRing {
        Self::start_with(&[], 0x10000)
    }

    /// [`BusyRing::start`] with daemon options `args` and requests of
    /// `len` bytes; above 64 KiB each is encrypted in place at 1 MiB, in
    /// guest memory that large enough.
    pub fn start_with(args: &[&str], len: u32) -> BusyRing {
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
    pub fn start_queues(args: &[&str], len: u32, queues: u32, ahead: u16) -> BusyRing {
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
        c.send(SET_MEM_TABLE, VERSION_1 | NEED_REPLY, &table, &[mem.as_raw_fd()])
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
        let h = hdr(ENCRYPT, sid, len, len);
        mem.write_all_at(&h.to_bytes(), hdr_at).unwrap();
        for &at in &rings {
            write_chain(
                &mem,
                at,
                &[
                    Buf::readable(hdr_at, 72),
                    Buf::readable(0x11000, 16),
                    Buf::readable(src_at, len),
                    Buf::writable(dst_at, len),
                    Buf::writable(status_at, 1),
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

    pub fn conn(&self) -> &Conn {
        self.conn.as_ref().expect("connection still open")
    }

    pub fn used_idx(&self) -> u16 {
        ring0_used_u16(&self.mem, 2)
    }

    pub fn kick(&self, ring: u32) {
        self.kicks[ring as usize].write(1).unwrap();
    }

    pub fn stop_guest(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(g) = self.guest.take() {
            g.join().unwrap();
        }
    }

    /// Stops the guest, closes the connection, and checks that the daemon
    /// is alive and serves a new frontend.
    pub fn finish(mut self, what: &str) {
        self.stop_guest();
        drop(self.conn.take());
        self.daemon.assert_alive(what);
        assert_nist(&self.daemon.sock, what);
    }
}
