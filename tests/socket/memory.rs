// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Guest memory files (docs/RELIABILITY.md, "Guest memory sealing"):
//! regions larger than their file, files shrunk after SET_MEM_TABLE,
//! files that cannot be sealed, hugetlbfs files without huge pages or of
//! an unaligned size, and ADD_MEM_REG past the slots the daemon reported.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::time::Duration;

use crate::common::*;
use crate::support::*;
use vhost_user_crypto::wire::session::{create_request, SessionAbi};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

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
    c.send(
        SET_MEM_TABLE,
        VERSION_1 | NEED_REPLY,
        &table,
        &[small.as_raw_fd()],
    )
    .unwrap();
    let mut outcome = format!("SET_MEM_TABLE: {}", accepted_or_refused(&c, SET_MEM_TABLE));
    if outcome.ends_with("accepted") {
        c.send(SET_VRING_NUM, VERSION_1 | NEED_REPLY, &vring_state(0, 256), &[])
            .unwrap();
        assert_eq!(c.reply_u64(SET_VRING_NUM), 0);
        // Descriptor table at 512 KiB, avail ring at 516 KiB, used ring at 520 KiB.
        let p = vring_addr(0, UADDR + 0x80000, UADDR + 0x82000, UADDR + 0x81000);
        c.send(SET_VRING_ADDR, VERSION_1 | NEED_REPLY, &p, &[]).unwrap();
        let o = accepted_or_refused(&c, SET_VRING_ADDR);
        outcome = format!("{outcome}; SET_VRING_ADDR past the end of the file: {o}");
        if o == "accepted" {
            let kick = EventFd::new(EFD_NONBLOCK).unwrap();
            let call = EventFd::new(EFD_NONBLOCK).unwrap();
            c.send_kick_and_call(kick.as_raw_fd(), call.as_raw_fd()).unwrap();
            kick.write(1).unwrap();
            std::thread::sleep(Duration::from_millis(50));
            c.send(GET_FEATURES, VERSION_1, &[], &[]).unwrap();
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
        c.send(SET_MEM_TABLE, VERSION_1 | NEED_REPLY, &table, &[f.as_raw_fd()])
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
    c.send_bytes(&create_request(SessionAbi::C, &session(&NIST_KEY, 1)), &[])
        .unwrap();
    assert_eq!(&c.reply(CREATE_CRYPTO_SESSION)[1064..1072], &1i64.to_le_bytes());
    let (id, len, status, dst) = raw_nist_request(&mem, &kick, &call, 1, 1);
    assert_eq!((id, len, status, dst), (0, 65, OK, NIST_CT.to_vec()));
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
        assert_eq!((id, len, status, dst), (0, 65, OK, NIST_CT.to_vec()), "{what}");
        drop(c);
        lenient.assert_alive(what);
        let after = lenient.log_tail(1 << 20).matches("cannot be sealed").count();
        assert_eq!(after - before, 1, "warnings for one region of a {what}");
    }
    assert_nist(&lenient.sock, "unsealable guest memory accepted with a warning");
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
        c.send(SET_MEM_TABLE, VERSION_1 | NEED_REPLY, &table, &[mem.as_raw_fd()])
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
                if c.send(req, VERSION_1 | NEED_REPLY, &payload, &fds).is_err() {
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
        c.send(SET_MEM_TABLE, VERSION_1 | NEED_REPLY, &table, &[mem.as_raw_fd()])
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
        VERSION_1 | NEED_REPLY,
        &(PF_CRYPTO_SESSION | PF_REPLY_ACK | PF_CONFIGURE_MEM_SLOTS).to_le_bytes(),
        &[],
    )
    .unwrap();
    if accepted_or_refused(&c, SET_PROTOCOL_FEATURES) != "accepted" {
        // Refused at negotiation: no ADD_MEM_REG to send.
        return;
    }
    c.send(GET_MAX_MEM_SLOTS, VERSION_1, &[], &[]).unwrap();
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
        c.send(ADD_MEM_REG, VERSION_1 | NEED_REPLY, &p, &[page.as_raw_fd()])
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
