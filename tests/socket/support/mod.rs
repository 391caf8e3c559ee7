// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! What the socket suite's tests share: the daemon under test, raw
//! connections, rings set up by hand, the replay tool's frontend, busy
//! guests, frontends that block the daemon on purpose, and a FUSE server.

mod blocked;
mod busy_ring;
mod conn;
mod daemon;
mod frontend;
mod fuse;
mod probes;
mod raw_ring;

pub use blocked::*;
pub use busy_ring::*;
pub use conn::*;
pub use daemon::*;
pub use frontend::*;
pub use fuse::*;
pub use probes::*;
pub use raw_ring::*;
