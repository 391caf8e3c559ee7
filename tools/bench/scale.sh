#!/usr/bin/env bash
# Multi-queue scaling of our daemon: N data queues, each served by its own
# queue worker thread of the daemon, driven by N frontend threads (one per
# queue: vhost-crypto-replay --queues N --queue-threads), for each N of a
# list. AES-128-CBC encrypt requests of --size bytes (default 256), with
# --depth requests (default 32) in flight on each queue; every result is
# checked by the replay tool against its reference cipher (a run with
# mismatches is reported as failed).
#
#   daemon    taskset -c DCPUS vhost-user-crypto --socket-path SOCK --queues N
#   frontend  taskset -c FCPUS vhost-crypto-replay --socket SOCK --json --queues N
#             --queue-threads --queue-size 1024 --queue-depth D --repeat K TRACE
#
# CPUs come from nproc: the frontend gets the lower half (0 .. nproc/2-1),
# the daemon the upper half (nproc/2 .. nproc-1); with one CPU both share
# it. The default N list is 1 and the powers of two up to min(8, nproc - 1)
# (2 CPUs: 1; 16 CPUs: 1 2 4 8). On a host with fewer CPUs per side than N
# the threads share CPUs, so the numbers say little about scaling.
#
# DPDK 22.11 is not run: its examples/vhost_crypto worker polls data queue
# 0 of each vhost device only (NB_VIRTIO_QUEUES is 1 in
# examples/vhost_crypto/main.c), so N queues of one device cannot be
# compared. Its nearest shape, N devices of one queue each (one
# --socket-file and --config entry per worker lcore), is at most 4
# (MAX_NB_SOCKETS in the same file) and needs N frontend connections.
#
# Usage: tools/bench/scale.sh [--n "1 2 4"] [--size BYTES] [--depth D]
#                             [--requests R] [--out DIR] [--no-build]
# --requests R (default 1,000,000) is the requests per queue per run.
# Writes DIR/scale.json and DIR/scale.txt (DIR defaults to target/bench):
# N, ops/s (all queues), ratio to the first N of the list, per-queue ops/s.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD

NPROC=$(nproc)
MAXN=$((NPROC - 1 < 8 ? NPROC - 1 : 8))
[ "$MAXN" -ge 1 ] || MAXN=1
NS="1"
for ((n = 2; n <= MAXN; n *= 2)); do NS="$NS $n"; done
SIZE=256
DEPTH=32
PER_QUEUE=1000000
OUT=$ROOT/target/bench
BUILD=1
need_value() { [ $# -ge 2 ] || { echo "scale.sh: $1 needs a value" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
    case "$1" in
        --n) need_value "$@"; NS=$2; shift ;;
        --size) need_value "$@"; SIZE=$2; shift ;;
        --depth) need_value "$@"; DEPTH=$2; shift ;;
        --requests) need_value "$@"; PER_QUEUE=$2; shift ;;
        --out) need_value "$@"; OUT=$2; shift ;;
        --no-build) BUILD=0 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "scale.sh: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
case "$OUT" in /*) ;; *) OUT=$ROOT/$OUT ;; esac
for n in $NS; do
    [[ $n =~ ^[1-9][0-9]*$ ]] && [ "$n" -le 64 ] || { echo "scale.sh: --n: $n is not 1 to 64" >&2; exit 2; }
done

if [ "$NPROC" -ge 2 ]; then
    HALF=$((NPROC / 2))
    FCPUS=0-$((HALF - 1))
    DCPUS=$HALF-$((NPROC - 1))
else
    FCPUS=0
    DCPUS=0
fi
KEY=2b7e151628aed2a6abf7158809cf4f3c
CHUNK=20000 # requests per queue in the trace; --repeat makes up the rest
DAEMON=$ROOT/target/release/vhost-user-crypto
REPLAY=$ROOT/target/release/vhost-crypto-replay

TMP=$(mktemp -d /tmp/vuc-scale.XXXXXX)
DAEMON_PID=""
cleanup() {
    local rc=$?
    if [ -n "$DAEMON_PID" ] && [ -d "/proc/$DAEMON_PID" ]; then
        kill "$DAEMON_PID" 2>/dev/null || true
        wait "$DAEMON_PID" 2>/dev/null || true
    fi
    rm -rf "$TMP"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
log() { printf '== %s\n' "$*" >&2; }
command -v jq >/dev/null 2>&1 || { echo "scale.sh: needs jq (apt-get install jq)" >&2; exit 1; }

if [ "$BUILD" = 1 ]; then
    log "cargo build --release --workspace"
    cargo build --release --workspace
fi
mkdir -p "$OUT"
: >"$TMP/results.jsonl"
log "$NPROC CPUs: frontend on $FCPUS, daemon on $DCPUS; N in: $NS; $SIZE B, depth $DEPTH, $PER_QUEUE requests per queue"
START=$(date +%s)
for n in $NS; do
    chunk=$((PER_QUEUE < CHUNK ? PER_QUEUE : CHUNK))
    repeat=$(((PER_QUEUE + chunk - 1) / chunk))
    trace=$TMP/trace-$n.jsonl
    printf '{"op":"create_session","name":"s1","algo":"aes-cbc","key":"%s","direction":"encrypt"}\n' "$KEY" >"$trace"
    printf '{"op":"generate","session":"s1","opcode":"encrypt","size":%d,"count":%d,"seed":%d}\n' \
        "$SIZE" $((chunk * n)) "$SIZE" >>"$trace"
    sock=$TMP/vuc-$n.sock
    taskset -c "$DCPUS" "$DAEMON" --socket-path "$sock" --queues "$n" >"$TMP/daemon.log" 2>&1 &
    DAEMON_PID=$!
    for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
    [ -S "$sock" ] || { cat "$TMP/daemon.log" >&2; echo "scale.sh: daemon did not start" >&2; exit 1; }
    rc=0
    taskset -c "$FCPUS" "$REPLAY" --socket "$sock" --json --queues "$n" --queue-threads --queue-size 1024 \
        --queue-depth "$DEPTH" --repeat "$repeat" "$trace" >"$TMP/run.json" 2>"$TMP/run.err" || rc=$?
    kill "$DAEMON_PID"; wait "$DAEMON_PID" 2>/dev/null || true
    DAEMON_PID=""
    if [ "$rc" = 0 ] && [ -s "$TMP/run.json" ]; then
        jq -c --argjson n "$n" '{system:"ours",n:$n,ops_per_sec,mib_per_sec,p50_us,p99_us,elapsed_s,requests,mismatches,replay_cpu_s:.cpu_s}' \
            "$TMP/run.json" >>"$TMP/results.jsonl"
        log "N=$n: $(jq -r '"\(.ops_per_sec|floor) ops/s, \(.requests) requests, mismatches \(.mismatches)"' "$TMP/run.json")"
    else
        jq -nc --argjson n "$n" --arg e "exit $rc: $(head -c 300 "$TMP/run.err")" '{system:"ours",n:$n,error:$e}' >>"$TMP/results.jsonl"
        log "N=$n FAILED (exit $rc): $(head -c 300 "$TMP/run.err" "$TMP/run.json" | tr '\n' ' ')"
    fi
done
END=$(date +%s)

# The table and scale.json: ratio to the first N that has a result.
jq -s --arg host "$(uname -n) $NPROC CPUs $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')" \
    --arg fcpus "$FCPUS" --arg dcpus "$DCPUS" --argjson size "$SIZE" --argjson depth "$DEPTH" \
    --argjson per_queue "$PER_QUEUE" --argjson secs "$((END - START))" --arg date "$(date -u +%FT%TZ)" \
    --arg commit "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" '
    (map(select(.error == null)) | first | .ops_per_sec) as $base
    | {meta: {host: $host, frontend_cpus: $fcpus, daemon_cpus: $dcpus, size: $size, depth: $depth,
              requests_per_queue: $per_queue, wall_s: $secs, date: $date, commit: $commit,
              daemon: "taskset -c DCPUS vhost-user-crypto --socket-path SOCK --queues N",
              frontend: "taskset -c FCPUS vhost-crypto-replay --socket SOCK --json --queues N --queue-threads --queue-size 1024 --queue-depth D --repeat K TRACE"},
       results: map(. + (if .error == null then {ratio_to_first: (if $base then .ops_per_sec / $base else null end),
                                                   per_queue_ops_per_sec: (.ops_per_sec / .n)} else {} end))}' \
    "$TMP/results.jsonl" >"$OUT/scale.json"
jq -r '
    "AES-128-CBC encrypt, \(.meta.size) B, depth \(.meta.depth) per queue; frontend CPUs \(.meta.frontend_cpus), daemon CPUs \(.meta.daemon_cpus); \(.meta.host)",
    "   N |   ops/s (all) | ratio to first N | ops/s per queue | mismatches",
    "-----+---------------+------------------+-----------------+-----------",
    (.results[] | if .error then "\(.n | tostring | " " * (4 - length) + .) | FAILED: \(.error)"
     else "\(.n | tostring | " " * (4 - length) + .) | \(.ops_per_sec | floor | tostring | " " * (13 - length) + .) | \(.ratio_to_first * 100 | floor / 100 | tostring | " " * (16 - length) + .) | \(.per_queue_ops_per_sec | floor | tostring | " " * (15 - length) + .) | \(.mismatches)" end)
    ' "$OUT/scale.json" | tee "$OUT/scale.txt"
log "done in $((END - START)) s: $OUT/scale.txt, $OUT/scale.json"
