// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The security suite: least privilege and keys (docs/RELIABILITY.md,
//! "Least privilege" and the "Keys" rows of the threat model).
//!
//! * [`seccomp`]: the queue workers' seccomp allow-list, tried in child
//!   processes of this binary, and the daemon's workers running under it;
//! * [`key_residue`]: no copy of a closed session's key material anywhere
//!   in the daemon's memory (heap or thread stacks);
//! * [`keys_not_logged`]: keys never reach the daemon's log, at any level.
//!
//! Process-wide state: a denied syscall kills the whole process, so the
//! filter is never installed in this process itself: [`seccomp`] runs this
//! binary again as a child (`--exact seccomp::child`, the scenario named
//! by `VUC_SECCOMP_CHILD`), and a child sets its own `RLIMIT_CORE` and
//! `RUST_BACKTRACE`. [`key_residue`] and [`keys_not_logged`] look at
//! daemons they spawn, never at this process. The heap check of
//! `key_zeroize` needs a global allocator of its own: it is the
//! `security_heap` binary.

#[path = "../common/mod.rs"]
mod common;

mod key_residue;
mod keys_not_logged;
mod seccomp;
