// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The heap half of the security suite: keys leave nothing behind on the
//! heap after CLOSE, a disconnect or a CREATE (docs/RELIABILITY.md, "Keys"
//! rows of the threat model).
//!
//! A binary of its own: [`key_zeroize`] installs a `#[global_allocator]`
//! that records the blocks its test thread allocates and reads blocks as
//! they are freed and while they are in use. In another suite's binary it
//! would be every test's allocator (the seccomp scenarios' among them),
//! and blocks could be freed by other tests while it reads them. Its two
//! tests run one at a time (`ONE_AT_A_TIME`): they share the block table.

mod key_zeroize;
