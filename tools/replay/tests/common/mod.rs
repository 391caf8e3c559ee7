// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Shared by the replay package's binary-level tests.

use std::process::Command;

/// Runs the binary `bin` with `args`: its exit code (None if a signal
/// ended it), stdout and stderr.
pub fn run_binary(bin: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(bin)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {bin}: {e}"));
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
