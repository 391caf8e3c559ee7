// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The socket suite: the daemon binary against frontends over its
//! vhost-user socket, honest and hostile (docs/RELIABILITY.md, the
//! "Frontend" rows of the threat model, and H16).
//!
//! * [`handshake`]: QEMU's handshake, cut at every point; pipelined
//!   requests; protocol features; every session and descriptor layout;
//! * [`messages`]: malformed messages and every message variant;
//! * [`message_fds`]: file descriptors attached to messages;
//! * [`memory`]: guest memory files, sealing, hugetlbfs, ADD_MEM_REG;
//! * [`memory_checks`]: memory checks a frontend makes wait (inode lock,
//!   FUSE);
//! * [`eventfds`]: kick, call and err eventfds;
//! * [`rings`]: ring fields (H16), addresses, restarts, memory coming
//!   back, H10 logged under seccomp;
//! * [`busy_rings`]: control messages while a guest keeps a ring busy;
//! * [`kick_polling`]: a ring started without a kick eventfd, polled;
//! * [`notify_on_empty`]: `VIRTIO_F_NOTIFY_ON_EMPTY` against suppressed
//!   notifications;
//! * [`sessions`]: session messages, floods and churn, ids across
//!   connections;
//! * [`lifecycle`]: disconnects, teardown, a waiting frontend, resources
//!   left behind, start-up;
//! * [`conventions`]: QEMU's backend program conventions
//!   (`--print-capabilities`, the discovery file, `--fd`, the exit on
//!   SIGTERM and SIGINT);
//! * [`packaging`]: the files of `tools/packaging/`: the man page
//!   generated from the command line, the systemd units
//!   (`systemd-analyze verify`).
//! * [`stats`]: the stats socket's counters, clients and file.
//!
//! Each test spawns daemons of its own (`support::Daemon`: `RUST_LOG=warn`,
//! the log printed when the test fails, killed by a watchdog after 240 s),
//! puts a timeout on every blocking read, and checks after each fault that
//! the daemon is alive and that a fresh frontend gets NIST SP 800-38A F.2.1
//! right. Expected values come from the vhost-user and virtio-crypto
//! specifications, the NIST vectors and OpenSSL, never from the code under
//! test.
//!
//! The tests run side by side in this one process; what they share:
//!
//! * CPU: `BusyRing` with more queues than CPUs runs its daemon at nice 10,
//!   so that the tests beside it keep their share; waits for races between
//!   workers allow for busy CPUs (`until_a_worker_blocks_in`).
//! * Descriptors across `fork`: a daemon spawned by one test gets copies of
//!   the other tests' descriptors between its fork and its exec, so the
//!   FUSE server holds only the FLUSH requests of its own daemon's
//!   children, and each FUSE mount has a directory of its own.
//! * Nothing else: no test changes the environment, signal handlers or
//!   limits of this process. Skipped tests are recorded by name
//!   (`module::test`, `common::skip`).

#[path = "../common/mod.rs"]
mod common;
mod support;

mod busy_rings;
mod conventions;
mod eventfds;
mod handshake;
mod kick_polling;
mod lifecycle;
mod memory;
mod memory_checks;
mod message_fds;
mod messages;
mod notify_on_empty;
mod packaging;
mod rings;
mod sessions;
mod stats;
