// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Skipped tests, recorded: a test whose prerequisites this machine lacks
//! returns early and libtest counts it as passed; `skipped` lets the test
//! command say which ones did.

/// Marks the running test as skipped (the caller returns right after, so
/// the harness counts it as passed): prints `skipped: WHY` to stderr and, when
/// `VUC_SKIPPED_TESTS` names a file (`tools/test.sh` sets it), appends the
/// line `CRATE TEST: WHY` to it (the test binary, e.g. `socket`, and the
/// test's path in it, e.g. `memory::hugetlb_…`), so that the test command
/// can list the tests that passed without checking anything.
pub fn skipped(why: &str) {
    use std::io::Write;
    // libtest names each test's thread after the test.
    let test = std::thread::current().name().unwrap_or("?").to_owned();
    // Straight to stderr, past libtest's capture of `eprintln!`: a skip
    // shows in the test command's output.
    let _ = writeln!(std::io::stderr().lock(), "skipped: {test}: {why}");
    if let Some(path) = std::env::var_os("VUC_SKIPPED_TESTS") {
        let line = format!(
            "{} {test}: {}\n",
            env!("CARGO_CRATE_NAME"),
            why.replace('\n', " ")
        );
        // One append of the whole line: tests run in parallel.
        let f = std::fs::OpenOptions::new().create(true).append(true).open(path);
        if let Ok(mut f) = f {
            let _ = f.write_all(line.as_bytes());
        }
    }
}
