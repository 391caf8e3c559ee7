#!/usr/bin/env bash
# Instructions per request, counted by valgrind's callgrind (this VM has no
# hardware PMU, so `perf stat -e instructions` cannot count them). The
# daemon's count is exact and does not depend on the machine's load,
# unlike times; the replay tool's runs live against the daemon, so how
# often it polls and reaps varies, and its count by a few instructions per
# request from run to run.
#
# - daemon: the in-process queue path (`benches/queue.rs`, 256 AES-128-CBC
#   requests made available at a time, processed one batch of at most 64
#   per QueueWorker::process call, indirect tables) run under callgrind,
#   counting only inside QueueWorker::process; instructions / requests
#   (the calls of ChainWalker::walk, one per request).
# - replay tool: the frontend side of a live run (daemon natively on CPU
#   1, the tool under callgrind), counting only inside the tool's replay
#   function, twice (--repeat R and 2R over one 20,000-request trace); the
#   difference / the extra requests is the steady-state cost per request
#   (set-up and trace expansion cancel out).
#
# Usage: tools/bench/instructions.sh [--size N] [--depth D] [--top K]
# (defaults 256, 256, 12). Needs valgrind (apt-get install valgrind).
set -euo pipefail
cd "$(dirname "$0")/../.."
SIZE=256 DEPTH=256 TOP=12
while [ $# -gt 0 ]; do
    case "$1" in
        --size) SIZE=$2; shift ;;
        --depth) DEPTH=$2; shift ;;
        --top) TOP=$2; shift ;;
        *) echo "instructions.sh: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
command -v valgrind >/dev/null || { echo "instructions.sh: valgrind not installed (apt-get install valgrind)" >&2; exit 1; }
cargo build --release --workspace
cargo bench --bench queue --no-run 2>/dev/null
BENCH=$(ls -t target/release/deps/queue-* | grep -v '\.d$' | head -1)
TMP=$(mktemp -d /tmp/vuc-instr.XXXXXX)
DAEMON_PID=""
cleanup() {
    local rc=$?
    if [ -n "$DAEMON_PID" ] && [ -d "/proc/$DAEMON_PID" ]; then kill "$DAEMON_PID" 2>/dev/null || true; wait "$DAEMON_PID" 2>/dev/null || true; fi
    rm -rf "$TMP"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Per-function self instructions of a callgrind profile, and the number of
# calls of a function (PATTERN), as "NAME<TAB>IR" lines and "calls N".
summarise() { # FILE [CALLEE_PATTERN]
    python3 - "$@" <<'EOF'
import re, sys, collections
path = sys.argv[1]
callee = sys.argv[2] if len(sys.argv) > 2 else None
names, self_ir, calls = {}, collections.Counter(), 0
fn = cfn = None
want_calls = False
for line in open(path, errors="replace"):
    # fn=NAME / cfn=NAME, or with compressed names fn=(ID) [NAME].
    m = re.match(r"(c?fn)=(?:\((\d+)\))?\s*(.*)", line)
    if m:
        kind, ident, name = m.groups()
        name = name.strip()
        if ident is not None:
            if name:
                names[ident] = name
            name = names.get(ident, ident)
        if kind == "fn":
            fn = name
        else:
            cfn = name
        continue
    m = re.match(r"calls=(\d+)", line)
    if m:
        want_calls = True
        if callee and cfn and re.search(callee, cfn):
            calls += int(m.group(1))
        continue
    m = re.match(r"(?:[+-]?\d+|\*)\s+(\d+)", line)
    if m and fn:
        if want_calls:
            # The line after calls= is the inclusive cost of the call.
            want_calls = False
            continue
        self_ir[fn] += int(m.group(1))
for f, ir in self_ir.items():
    print(f"{f}\t{ir}")
print(f"calls\t{calls}")
EOF
}

table() { # REQUESTS TOP < "NAME<TAB>IR" lines
    python3 -c '
import sys
req, top = float(sys.argv[1]), int(sys.argv[2])
rows = [l.rstrip("\n").split("\t") for l in sys.stdin if "\t" in l]
rows = [(n, float(v)) for n, v in rows if n != "calls"]
total = sum(v for _, v in rows)
print(f"  {total / req:8.0f}  instructions per request in all")
for n, v in sorted(rows, key=lambda r: -r[1])[:top]:
    if v / req >= 0.5:
        print(f"  {v / req:8.0f}  {n[:110]}")
' "$1" "$2"
}

echo "== daemon: QueueWorker::process in-process ($SIZE-byte AES-128-CBC encrypt, one batch of at most 64 requests a call)"
valgrind --tool=callgrind --compress-strings=no --compress-pos=no --callgrind-out-file="$TMP/daemon.cg" \
    --toggle-collect='*QueueWorker::process' "$BENCH" --bench "encrypt/$SIZE\$" --profile-time 2 \
    >"$TMP/daemon.log" 2>&1
summarise "$TMP/daemon.cg" 'ChainWalker::walk$' >"$TMP/daemon.txt"
REQS=$(awk -F'\t' '$1 == "calls" {print $2}' "$TMP/daemon.txt")
[ "$REQS" -gt 0 ] || { echo "instructions.sh: no requests (ChainWalker::walk calls) counted" >&2; exit 1; }
echo "  ($REQS requests)"
table "$REQS" "$TOP" <"$TMP/daemon.txt"

echo "== replay tool: frontend side of a live run ($SIZE bytes, depth $DEPTH; daemon native on CPU 1)"
N=20000
printf '{"op":"create_session","name":"s1","algo":"aes-cbc","key":"2b7e151628aed2a6abf7158809cf4f3c","direction":"encrypt"}\n{"op":"generate","session":"s1","opcode":"encrypt","size":%d,"count":%d,"seed":1}\n' \
    "$SIZE" "$N" >"$TMP/t.jsonl"
SOCK=$TMP/vuc.sock
taskset -c 1 target/release/vhost-user-crypto --socket-path "$SOCK" >"$TMP/d.log" 2>&1 &
DAEMON_PID=$!
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.05; done
for rep in 1 2; do
    taskset -c 0 valgrind --tool=callgrind --compress-strings=no --compress-pos=no \
        --callgrind-out-file="$TMP/tool$rep.cg" --toggle-collect='vhost_crypto_replay::replay::replay' \
        target/release/vhost-crypto-replay --socket "$SOCK" --queue-size 1024 --queue-depth "$DEPTH" \
        --repeat "$rep" --json "$TMP/t.jsonl" >"$TMP/tool$rep.json" 2>"$TMP/tool$rep.log"
    python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); sys.exit(0 if r["mismatches"] == 0 and r["requests"] > 0 else 1)' \
        "$TMP/tool$rep.json" || { echo "instructions.sh: replay run failed" >&2; exit 1; }
    summarise "$TMP/tool$rep.cg" >"$TMP/tool$rep.txt"
done
echo "  (difference of --repeat 2 and --repeat 1: $N requests)"
python3 -c '
import sys
def load(p):
    return {l.split("\t")[0]: float(l.split("\t")[1]) for l in open(p) if "\t" in l and not l.startswith("calls\t")}
a, b = load(sys.argv[1]), load(sys.argv[2])
for n in set(a) | set(b):
    print(f"{n}\t{b.get(n, 0) - a.get(n, 0)}")
' "$TMP/tool1.txt" "$TMP/tool2.txt" | table "$N" "$TOP"
