#!/usr/bin/env bash
# Where our daemon's time goes per request: perf record -g on the daemon
# (CPU 1, default options) while the replay tool (CPU 0) drives AES-128-CBC
# encrypt requests at one size and queue depth, then perf report
# --no-children. Prints the top symbols, the daemon's CPU seconds and
# requests of the whole replay run, and daemon CPU ns per request.
#
# Usage: tools/bench/profile.sh [--size N] [--depth D] [--seconds S] [--out DIR]
# (defaults 256, 256, 3, target/bench; writes DIR/perf-SIZE-dDEPTH.data and .txt)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
SIZE=256 DEPTH=256 SECS=3 OUT=$ROOT/target/bench
while [ $# -gt 0 ]; do
    case "$1" in
        --size) SIZE=$2; shift ;;
        --depth) DEPTH=$2; shift ;;
        --seconds) SECS=$2; shift ;;
        --out) OUT=$2; shift ;;
        *) echo "profile.sh: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
command -v perf >/dev/null || { echo "profile.sh: perf not installed (apt-get install linux-perf)" >&2; exit 1; }
mkdir -p "$OUT"
cargo build --release --workspace
TMP=$(mktemp -d /tmp/vuc-profile.XXXXXX)
DAEMON_PID="" REPLAY_PID=""
cleanup() {
    local rc=$? p
    for p in "$REPLAY_PID" "$DAEMON_PID"; do
        if [ -n "$p" ] && [ -d "/proc/$p" ]; then kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; fi
    done
    rm -rf "$TMP"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

SOCK=$TMP/vuc.sock
# Enough requests to outlast the recording (guess: 4 GB/s, at most 12 M
# requests/s; the fastest 256-byte runs here reach 10 M).
WANT=$(( (SECS + 3) * 4000000000 / SIZE )); [ "$WANT" -le $(( (SECS + 2) * 12000000 )) ] || WANT=$(( (SECS + 2) * 12000000 ))
# A trace of CHUNK requests replayed REPEAT times, at most 1000 (a longer
# run gets a longer trace; each repeat closes and creates its session
# again).
CHUNK=$(( 5000000 / SIZE )); [ "$CHUNK" -le 20000 ] || CHUNK=20000
REPEAT=$(( (WANT + CHUNK - 1) / CHUNK ))
if [ "$REPEAT" -gt 1000 ]; then CHUNK=$(( (WANT + 999) / 1000 )); REPEAT=1000; fi
printf '{"op":"create_session","name":"s1","algo":"aes-cbc","key":"2b7e151628aed2a6abf7158809cf4f3c","direction":"encrypt"}\n{"op":"generate","session":"s1","opcode":"encrypt","size":%d,"count":%d,"seed":1}\n' \
    "$SIZE" "$CHUNK" >"$TMP/t.jsonl"
taskset -c 1 target/release/vhost-user-crypto --socket-path "$SOCK" >"$TMP/daemon.log" 2>&1 &
DAEMON_PID=$!
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.05; done
taskset -c 0 target/release/vhost-crypto-replay --socket "$SOCK" --json --queue-size 1024 \
    --queue-depth "$DEPTH" --repeat "$REPEAT" --timeout 30 "$TMP/t.jsonl" >"$TMP/replay.json" &
REPLAY_PID=$!
# Run-queue wait of all daemon threads (ns, /proc/PID/task/*/schedstat field 2):
# time the daemon was runnable but another task (e.g. a fuzzer) had the CPU.
rq_wait() { cat /proc/"$DAEMON_PID"/task/*/schedstat 2>/dev/null | awk '{s += $2} END {printf "%d", s}'; }
c0=$(awk '{print $14 + $15}' "/proc/$DAEMON_PID/stat")
q0=$(rq_wait)
sleep 0.5
perf record -g -p "$DAEMON_PID" -o "$OUT/perf-$SIZE-d$DEPTH.data" -- sleep "$SECS" 2>"$TMP/perf.err"
wait "$REPLAY_PID"
REPLAY_PID=""
c1=$(awk '{print $14 + $15}' "/proc/$DAEMON_PID/stat")
q1=$(rq_wait)
perf report -i "$OUT/perf-$SIZE-d$DEPTH.data" --no-children --stdio -g none --percent-limit 0.5 2>/dev/null |
    grep -v '^$' >"$OUT/perf-$SIZE-d$DEPTH.txt"
jq -r --argjson c0 "$c0" --argjson c1 "$c1" --argjson rq "$(( (q1 - q0) / 1000000 ))" --argjson hz "$(getconf CLK_TCK)" '
    ((($c1 - $c0) / $hz)) as $cpu |
    "replay: \(.requests) requests, \(.ops_per_sec | floor) ops/s, p50 \(.p50_us) us, mismatches \(.mismatches), replay cpu \(.cpu_s * 100 | floor / 100) s\n" +
    "daemon: \($cpu) s CPU over \(.elapsed_s * 100 | floor / 100) s (\($cpu / .elapsed_s * 100 | floor)% of CPU 1), \($cpu * 1e9 / .requests | floor) ns CPU per request; runnable but waiting for a CPU \($rq) ms (\($rq / 10 / .elapsed_s | floor)% of the run)\n" +
    "replay tool: \(.cpu_s * 1e9 / .requests | floor) ns CPU per request"' \
    "$TMP/replay.json" | tee -a "$OUT/perf-$SIZE-d$DEPTH.txt"
grep -E '^ +[0-9.]+%' "$OUT/perf-$SIZE-d$DEPTH.txt" | head -25
