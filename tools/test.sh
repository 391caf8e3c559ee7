#!/usr/bin/env bash
# The project's test command (the second command of the README's "Quick start", and what .ci/run runs).
# Installs what the tests need on a Debian 12 machine, builds the guest
# image and QEMU 10 for the end-to-end test, then runs fmt, clippy, the
# whole workspace's tests (including the QEMU end-to-end test with QEMU 7.2
# and 10.0) and the shipped known-answer traces through the replay tool.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n== %s\n' "$*"; }

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

# gcc and libc6-dev: the C parts of ring and openssl-sys, linking, and the
# guest image's static binaries; systemd and man-db: the packaging test's
# `systemd-analyze verify` of the units (which looks up their man page);
# curl: rustup, when Rust is missing.
pkgs=(qemu-system-x86 busybox-static kmod xz-utils libssl-dev pkg-config gcc libc6-dev systemd man-db)
# shellcheck disable=SC1091
if ! command -v cargo >/dev/null 2>&1 && [ -e "$HOME/.cargo/env" ]; then . "$HOME/.cargo/env"; fi
if ! command -v cargo >/dev/null 2>&1; then pkgs+=(curl ca-certificates); fi
need_pkgs=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need_pkgs+=("$p")
done
if [ "${#need_pkgs[@]}" -gt 0 ]; then
    log "installing ${need_pkgs[*]}"
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${need_pkgs[@]}"
fi
if ! command -v cargo >/dev/null 2>&1; then
    # Debian 12's own Rust (1.63) is older than the workspace's rust-version.
    log "installing Rust (stable) with rustup into $HOME/.cargo"
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs |
        sh -s -- -y --profile minimal --component clippy,rustfmt
    # shellcheck disable=SC1091
    . "$HOME/.cargo/env"
fi
want_rust=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
[ -n "$want_rust" ] || { echo "no rust-version in Cargo.toml" >&2; exit 1; }
have_rust=$(rustc --version | awk '{print $2}')
if [ "$(printf '%s\n%s\n' "$want_rust" "$have_rust" | sort -V | head -n 1)" != "$want_rust" ]; then
    echo "Rust $have_rust is older than the workspace's rust-version $want_rust: install a newer one with rustup ('rustup update stable', or https://rustup.rs)" >&2
    exit 1
fi
# Every crate in Cargo.lock must build with that rust-version too (a
# `cargo update` can bring one that needs a newer Rust).
ver3() { awk -F. '{ printf "%d.%d.%d\n", $1, $2, $3 }'; }
# (Only the crates built for this host: the lock also holds Windows and
# wasm ones.)
host=$(rustc -vV | sed -n 's/^host: //p')
lock_rust=$(cargo metadata --format-version 1 --filter-platform "$host" |
    { grep -o '"rust_version":"[0-9.]*"' || true; } | cut -d'"' -f4 | ver3 | sort -V | tail -n 1)
if [ -n "$lock_rust" ] && [ "$(printf '%s\n%s\n' "$lock_rust" "$(ver3 <<<"$want_rust")" | sort -V | tail -n 1)" != "$(ver3 <<<"$want_rust")" ]; then
    echo "Cargo.lock holds a crate that needs Rust $lock_rust, newer than the workspace's rust-version $want_rust: pin an older version (cargo update -p CRATE --precise VERSION)" >&2
    exit 1
fi
for c in clippy rustfmt; do
    if ! cargo "${c/rustfmt/fmt}" --version >/dev/null 2>&1; then
        rustup component add "$c"
    fi
done

log "formatting, lints and docs"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# The fuzz harness is a crate of its own (tools/fuzz/README.md): running
# its targets needs nightly and cargo-fuzz, checking them does not.
cargo fmt --manifest-path tools/fuzz/Cargo.toml -- --check
cargo clippy --manifest-path tools/fuzz/Cargo.toml --all-targets -- -D warnings
# The wire facts build without the daemon's backend (the replay tool's
# view of the crate), and the replay tool links none of the backend.
cargo clippy -p vhost-user-crypto --no-default-features --lib -- -D warnings
if cargo tree -p vhost-crypto-replay -e normal | grep -q vhost-user-backend; then
    echo "vhost-crypto-replay depends on vhost-user-backend: it must use the daemon crate's wire module only" >&2
    exit 1
fi
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --document-private-items
# The measurement patch tools/bench/ceiling.sh applies still applies.
if git rev-parse --git-dir >/dev/null 2>&1; then
    git apply --check docs/bench/ceiling.patch
fi

log "guest image and QEMU 10.0 (for the end-to-end test)"
bash tools/guest/build-image.sh
bash tools/guest/fetch-qemu10.sh

log "tests"
export VUC_REQUIRE_QEMU=1
cargo build --release --workspace
mkdir -p target
# Tests whose prerequisites this machine lacks return early and count as
# passed; each one records itself here (tests/common/skip.rs), and the
# summary at the end lists them.
export VUC_SKIPPED_TESTS=$PWD/target/skipped-tests.txt
: >"$VUC_SKIPPED_TESTS"
# Passed tests in a cargo test log (a skipped test counts as passed there).
passed_in() { awk '/^test result:/ { for (i = 1; i <= NF; i++) if ($i ~ /^passed;?$/) s += $(i-1) } END { print s + 0 }' "$1"; }
lines_in() { cat "$@" 2>/dev/null | grep -c . || true; }
cargo test --release --workspace 2>&1 | tee target/test-output.log
# (Counted now: the later runs append to the same log.)
results=$(passed_in target/test-output.log)
log "key zeroization and the worker filter once more in an unoptimised build (stack copies and std's debug checks differ there)"
unopt_skips=$PWD/target/skipped-tests-unoptimised.txt
: >"$unopt_skips"
# (The filters pick those modules of the security suite; key_zeroize is
# the security_heap suite's one module.)
VUC_SKIPPED_TESTS=$unopt_skips cargo test -p vhost-user-crypto --test security --test security_heap -- \
    key_zeroize:: key_residue:: seccomp:: 2>&1 |
    tee target/test-output-unoptimised.log | tee -a target/test-output.log
unopt_results=$(passed_in target/test-output-unoptimised.log)

# Debian's default huge page pool is empty, so above the test that needs
# free huge pages skipped (its counterpart, which needs none, ran). As
# root, lend the pool four pages for one more run of it, then put the
# pool back as it was.
hp_test=memory::hugetlb_reservation_mapping_of_an_unaligned_size_is_not_left_behind
hp_pool=/proc/sys/vm/nr_hugepages
hp_skips=$PWD/target/skipped-tests-hugepages.txt
rm -f "$hp_skips"
if grep -q " $hp_test:" "$VUC_SKIPPED_TESTS" && [ "$(id -u)" = 0 ] && [ -w "$hp_pool" ]; then
    log "$hp_test once more, with four huge pages lent to the pool"
    hp_old=$(cat "$hp_pool")
    trap 'echo "$hp_old" >"$hp_pool" 2>/dev/null || true' EXIT
    echo $((hp_old + 4)) >"$hp_pool" 2>/dev/null || true
    : >"$hp_skips"
    VUC_SKIPPED_TESTS=$hp_skips cargo test --release -p vhost-user-crypto --test socket -- --exact "$hp_test" 2>&1 |
        tee -a target/test-output.log | tee target/test-output-hugepages.log
    echo "$hp_old" >"$hp_pool" 2>/dev/null || true
    trap - EXIT
    # (A filter that matched nothing would make the test vanish from the count.)
    grep -q '^test result: ok\. 1 passed' target/test-output-hugepages.log ||
        { echo "the second run of $hp_test did not run it" >&2; exit 1; }
fi

log "replay of the shipped known-answer traces against the daemon"
for t in nist-sp800-38a wycheproof-aes-cbc status-policy chaining; do
    for abi in a b c; do
        out=$(target/release/vhost-crypto-replay --spawn-daemon --session-abi "$abi" --json "tools/traces/$t.jsonl")
        echo "$t (layout $abi): $out"
        grep -q '"mismatches":0' <<<"$out"
    done
done
for abi in a b c; do
    out=$(target/release/vhost-crypto-replay --spawn-daemon --session-abi "$abi" --descriptors chain --json tools/traces/hostile-guest.jsonl)
    echo "hostile-guest (layout $abi): $out"
    grep -q '"mismatches":0' <<<"$out"
done
target/release/vhost-crypto-replay --spawn-daemon tools/traces/default.jsonl
# Each test once, as the workspace run left it: every recorded skip was
# counted as passed by its run.
passed=$((results - $(lines_in "$VUC_SKIPPED_TESTS")))
skipped=$(cat "$VUC_SKIPPED_TESTS" 2>/dev/null || true)
if [ -e "$hp_skips" ]; then
    # It had a second run: only that run's outcome stands (ran, or skipped
    # again when the pool could not grow).
    skipped=$(grep -v " $hp_test:" <<<"$skipped" || true; cat "$hp_skips")
    [ "$(lines_in "$hp_skips")" -gt 0 ] || passed=$((passed + 1))
fi
n_skipped=$(grep -c . <<<"$skipped" || true)
unopt_skipped=$(lines_in "$unopt_skips")
log "all tests passed"
if [ "$n_skipped" -gt 0 ]; then
    echo "skipped here, for want of what they need (they checked nothing):"
    sed 's/^/  /' <<<"$skipped"
fi
if [ "$unopt_skipped" -gt 0 ]; then
    echo "skipped in the unoptimised run:"
    sed 's/^/  /' "$unopt_skips"
fi
echo "tests: $passed passed, $n_skipped skipped, 0 failed; run once more unoptimised: $((unopt_results - unopt_skipped)) passed, $unopt_skipped skipped"
