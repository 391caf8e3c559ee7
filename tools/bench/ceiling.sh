#!/usr/bin/env bash
# What the benchmark's two CPUs can pass at 256 B depth 256 with no cipher
# and no checks, next to ours as committed and DPDK 22.11, in the same
# minutes (docs/PERFORMANCE.md, "Where the time goes").
#
#   bash tools/bench/ceiling.sh [--rounds N]      (default 12; ~8 s a round)
#
# Builds the working tree (`cargo build --release --workspace`) and, in a
# git worktree under target/ceiling-src, the committed HEAD with
# docs/bench/ceiling.patch applied (measurement only: VUC_NULL_AES makes
# that daemon complete requests without encrypting, VUC_NOCHECK makes that
# replay tool check nothing); with uncommitted changes the two builds
# differ by more than the patch, so run it on a clean tree. Each round
# runs, one after another, with the replay tool on CPU 0 and the backend on
# CPU 1 as tools/bench/compare.sh does, 5,000,000 requests of a
# 20,000-request 256-byte trace:
#   committed  our daemon and replay tool as built from the tree;
#   nocheck    the same daemon, the patched tool with VUC_NOCHECK (what the
#              tool's checks cost);
#   ceiling    the patched daemon with VUC_NULL_AES, the patched tool with
#              VUC_NOCHECK (neither cipher nor checks);
#   dpdk       tools/bench/dpdk-vhost-crypto.sh, the tool with --dpdk.
# Every run must complete all its requests without an error (and, where
# the tool checks, without a mismatch), or the script stops. Prints each
# run, then per system the median and range of its requests/s and the
# median of its per-round ratio to DPDK. Unlike compare.sh it does not
# probe the vCPUs' placement around each run, so slow placements stay in.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
ROUNDS=12
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) ROUNDS=$2; shift 2 ;;
        *) echo "usage: $0 [--rounds N]" >&2; exit 2 ;;
    esac
done
command -v python3 >/dev/null || { echo "ceiling: needs python3" >&2; exit 1; }
case "$ROUNDS" in '' | *[!0-9]* | 0) echo "ceiling: --rounds wants a number >= 1" >&2; exit 2 ;; esac
# The switches are set per run below, never inherited.
unset VUC_NULL_AES VUC_NOCHECK VUC_NOWRITE CARGO_TARGET_DIR

WT=$ROOT/target/ceiling-src
echo "== building $(git rev-parse --short HEAD) and its ceiling build" >&2
cargo build --release --workspace -q
git worktree remove --force "$WT" 2>/dev/null || rm -rf "$WT"
git worktree prune
git worktree add -q --detach "$WT" HEAD
git -C "$WT" apply "$ROOT/docs/bench/ceiling.patch"
(cd "$WT" && CARGO_TARGET_DIR=$ROOT/target/ceiling-target \
    cargo build --release -q -p vhost-user-crypto -p vhost-crypto-replay)
bash tools/bench/dpdk-vhost-crypto.sh build >/dev/null

BIN=$ROOT/target/release
CBIN=$ROOT/target/ceiling-target/release
TRACE=$ROOT/target/ceiling-256.jsonl
printf '%s\n' \
    '{"op":"create_session","name":"s1","algo":"aes-cbc","key":"2b7e151628aed2a6abf7158809cf4f3c","direction":"encrypt"}' \
    '{"op":"generate","session":"s1","opcode":"encrypt","size":256,"count":20000,"seed":256}' >"$TRACE"
REPLAY_ARGS=(--json --queue-size 1024 --queue-depth 256 --repeat 250 "$TRACE")
# "LABEL Mrequests/s mismatches" from the tool's JSON report; exits 1 when
# the run stopped early or failed, or when a checking run found a mismatch.
ops() {
    python3 -c '
import json, sys
label = sys.argv[1]
try:
    d = json.load(sys.stdin)
except ValueError:
    sys.exit(f"ceiling: {label}: no report from the replay tool")
n, bad, err = d.get("requests"), d["mismatches"], d.get("error")
if err or n != 5_000_000 or (label in ("committed", "dpdk") and bad):
    sys.exit(f"ceiling: {label}: {n} requests, {bad} mismatches, error {err}")
print("%s %.2f %d" % (label, d["ops_per_sec"] / 1e6, d["mismatches"]))
' "$1"
}

ours() { # label daemon-env daemon replay-env replay
    local sock=$ROOT/target/ceiling.sock pid
    rm -f "$sock"
    env "$2" taskset -c 1 "$3" --socket-path "$sock" >"$ROOT/target/ceiling-daemon.log" 2>&1 &
    pid=$!
    for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
    local line rc=0
    line=$(env "$4" taskset -c 0 "$5" --socket "$sock" "${REPLAY_ARGS[@]}" 2>/dev/null | ops "$1") || rc=$?
    kill "$pid"; wait "$pid" 2>/dev/null || true
    [ "$rc" = 0 ] || exit 1
    echo "$line"
}
dpdk() {
    local sock=$ROOT/target/ceiling-dpdk.sock line rc=0
    bash tools/bench/dpdk-vhost-crypto.sh run "$sock" >"$ROOT/target/ceiling-dpdk-run.log" 2>&1 ||
        { echo "ceiling: DPDK did not start; see $ROOT/target/ceiling-dpdk-run.log" >&2; exit 1; }
    line=$(taskset -c 0 "$BIN/vhost-crypto-replay" --socket "$sock" --dpdk "${REPLAY_ARGS[@]}" 2>/dev/null | ops dpdk) || rc=$?
    bash tools/bench/dpdk-vhost-crypto.sh stop >/dev/null 2>&1 || true
    [ "$rc" = 0 ] || exit 1
    echo "$line"
}

cleanup() {
    bash tools/bench/dpdk-vhost-crypto.sh stop >/dev/null 2>&1 || true
    git worktree remove --force "$WT" 2>/dev/null || true
}
trap cleanup EXIT
OUT=$ROOT/target/ceiling-runs.txt
: >"$OUT"
for _ in $(seq "$ROUNDS"); do
    # X=1: a placeholder for "no extra environment".
    ours committed X=1 "$BIN/vhost-user-crypto" X=1 "$BIN/vhost-crypto-replay" | tee -a "$OUT"
    ours nocheck X=1 "$BIN/vhost-user-crypto" VUC_NOCHECK=1 "$CBIN/vhost-crypto-replay" | tee -a "$OUT"
    ours ceiling VUC_NULL_AES=1 "$CBIN/vhost-user-crypto" VUC_NOCHECK=1 "$CBIN/vhost-crypto-replay" | tee -a "$OUT"
    dpdk | tee -a "$OUT"
done
python3 - "$OUT" <<'PY'
import statistics as st, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
by = {}
for name, mops, _ in rows:
    by.setdefault(name, []).append(float(mops))
for name, v in by.items():
    print(f"{name:9} median {st.median(v):6.2f} M requests/s  (range {min(v):.2f}-{max(v):.2f}, {len(v)} runs)")
d = by["dpdk"]
for name in ("committed", "nocheck", "ceiling"):
    ratios = sorted(a / b for a, b in zip(by[name], d))
    print(f"{name}/dpdk: per-round median {st.median(ratios):.3f} "
          f"(rounds at or above 2.0: {sum(r >= 2.0 for r in ratios)} of {len(ratios)})")
PY
