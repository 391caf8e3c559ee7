// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The daemon's stats socket (`--stats-socket`, docs/OPERATING.md), read
//! as a client does.

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

/// The object the stats socket at `path` sends: one line of JSON, then
/// EOF (5 s at most).
pub fn read_stats(path: &Path) -> Value {
    let mut s = UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut b = Vec::new();
    s.read_to_end(&mut b).expect("the object, then EOF");
    assert_eq!(
        b.last(),
        Some(&b'\n'),
        "one line: {}",
        String::from_utf8_lossy(&b)
    );
    serde_json::from_slice(&b).unwrap()
}
