#!/usr/bin/env bash
# Side-by-side AES-128-CBC benchmark (encrypt, decrypt, and chained with HMAC), in one run:
#
#   ours     taskset -c 1 vhost-user-crypto --socket-path SOCK   (default options)
#            driven by taskset -c 0 vhost-crypto-replay --socket SOCK --json
#            --queue-size 1024 --queue-depth D TRACE
#   dpdk     DPDK 22.11 examples/vhost_crypto + crypto_aesni_mb on CPU 1
#            (tools/bench/dpdk-vhost-crypto.sh run/stop), same replay command
#            plus --dpdk; payloads <= 2048 bytes only (DPDK 22.11's cipher limit)
#   openssl  taskset -c 1 openssl speed -evp aes-128-cbc -bytes N -seconds S
#   algos    the algorithms crate's single-stream path on CPU 1:
#            cargo bench --bench engines -- encrypt-single-stream-x8
#            (8 messages per iteration, each through key.start + process_in_place)
#
# Cells (system names in compare.json; each has an ours- and a dpdk- form):
#   ours, dpdk        AES-128-CBC encrypt (the sizes and depths below)
#   ours-dec          AES-128-CBC decrypt, sizes <= 2048 of the encrypt
#                     cells (--quick: 256 1024 2048), depths 1 32 256
#                     (--quick: 32 256)
#   ours-hmac         AES-128-CBC + HMAC-SHA1 (12-byte digest) encrypt,
#                     CIPHER_THEN_HASH
#   ours-hmac-dec     AES-128-CBC + HMAC-SHA1 (12-byte digest) verify then
#                     decrypt, HASH_THEN_CIPHER; every request carries the
#                     right digest of its ciphertext, so every one completes OK
#   ours-hmac256      AES-128-CBC + HMAC-SHA-256 (16-byte digest) encrypt,
#                     CIPHER_THEN_HASH (DPDK 22.11's vhost crypto library maps
#                     VIRTIO_CRYPTO_MAC_HMAC_SHA_256 to RTE_CRYPTO_AUTH_SHA256_HMAC,
#                     lib/vhost/vhost_crypto.c, and crypto_aesni_mb runs it)
# The chained cells run requests of 256 and 1500 bytes (the cipher from
# byte size % 16, the MAC over all of it), in place as DPDK's guest driver
# sends them, at depths 32 and 256. Every trace is one `generate` line of
# the replay tool, whose expected outputs, digests and decrypt inputs come
# from its reference cipher and RustCrypto's hmac/sha1/sha2; every result
# of both backends is checked against them (a run with mismatches fails).
#
# Sizes 64 256 1024 2048 4096 16384, queue depths 1 32 256 (--quick: sizes
# 256 2048 16384, depths 1 32 256, shorter runs). Backend CPU seconds are
# utime+stime of the backend process from /proc/PID/stat before and after
# each replay run (10 ms resolution; the span includes the replay tool's
# connect and trace expansion, for which DPDK's polling worker burns CPU and
# our daemon sleeps). Replay CPU seconds are the tool's own cpu_s.
#
# vCPU placement: on a VM the host decides where the two vCPUs run, and the
# time a cache line takes between them moves every backend's throughput by
# up to 2x. On the AMD EPYC VM of docs/PERFORMANCE.md the round trip is
# 80-115 ns about 88 % of the time ("near"), 380-480 ns about 8 % ("far")
# and 20-55 ns about 1 % ("close"), changing every few seconds; ours runs
# at about 2/3 and DPDK at about 1/2 of their near speed in the far one.
# On the Intel VM of the runs in docs/bench it is far (>= 200 ns) in
# nearly every run ("Run-to-run spread" there); those runs used
# --placement any. Before and after each replay run the backend is
# stopped (SIGSTOP) for 5-25 milliseconds while
# target/release/vuc-xcpu-rtt measures that round trip between the two
# CPUs; both values go into the run's record (xcpu_rtt_ns).
# With --placement near (the default) a run waits up to 20 s for a near
# round trip (60 to 200 ns) before it starts, and a run with either value
# outside that window is made again, up to 3 times in all (the last one is
# kept whatever it measured); ours and DPDK are treated the same way.
# Once a wait has run its full 20 s without a near probe, the host is
# taken to keep the vCPUs apart: that run and the rest of the comparison
# go as with --placement any (no waits, no reruns), and compare.json
# records the rep and cell where this happened (placement_gave_up; null
# when it did not). The runs before it were waited for and those after
# were not, so for an even comparison rerun with --placement any.
# --placement any runs once, as it comes, and only records.
#
# Usage: tools/bench/compare.sh [--quick] [--reps R] [--out DIR] [--no-dpdk] [--no-build]
#                               [--placement near|any] [--cells LIST]
# --cells LIST (default enc,dec,hmac,hmac-dec,hmac256) runs only these
# groups of cells, e.g. --cells dec,hmac-dec for a quick check; the raw
# openssl and algos columns run with enc only.
# --reps R (default 1) repeats the ours and DPDK blocks R times, alternating
# (ours, DPDK, ours, DPDK, ...), and reports the run with the median ops/s
# per cell; every run is kept in compare.json.
# Writes DIR/compare.json, DIR/compare.txt (the table), DIR/compare.svg and
# DIR/compare.png (DIR defaults to target/bench); the plot is drawn by
# tools/bench/plot (plotters, its own workspace, built into target/bench-plot),
# or, if that does not build, as SVG only by tools/bench/compare_report.py. Stops every process it started on exit.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD

QUICK=0
OUT=$ROOT/target/bench
DPDK=1
BUILD=1
REPS=1
PLACEMENT=near
CELLS=enc,dec,hmac,hmac-dec,hmac256
need_value() { [ $# -ge 2 ] || { echo "compare.sh: $1 needs a value" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) QUICK=1 ;;
        --out) need_value "$@"; OUT=$2; shift ;;
        --no-dpdk) DPDK=0 ;;
        --no-build) BUILD=0 ;;
        --reps) need_value "$@"; REPS=$2; shift ;;
        --cells) need_value "$@"; CELLS=$2; shift ;;
        --placement)
            need_value "$@"
            case "$2" in near|any) PLACEMENT=$2 ;; *) echo "compare.sh: --placement near|any" >&2; exit 2 ;; esac
            shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "compare.sh: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
case "$OUT" in /*) ;; *) OUT=$ROOT/$OUT ;; esac
for c in ${CELLS//,/ }; do
    case "$c" in enc|dec|hmac|hmac-dec|hmac256) ;; *) echo "compare.sh: --cells: unknown cell group $c" >&2; exit 2 ;; esac
done
want_cells() { [[ ",$CELLS," == *",$1,"* ]]; }

BACKEND_CPU=1
REPLAY_CPU=0
KEY=2b7e151628aed2a6abf7158809cf4f3c
if [ "$QUICK" = 1 ]; then
    SIZES=(256 2048 16384)
    DEPTHS=(1 32 256)   # 32: the 16 KiB target's depth
    DEC_SIZES=(256 1024 2048)
    DEC_DEPTHS=(32 256)
    SCALE=8          # divide request counts by this
    RAW_SECONDS=1
    CRIT_SECONDS=0.5
else
    SIZES=(64 256 1024 2048 4096 16384)
    DEPTHS=(1 32 256)
    DEC_SIZES=(64 256 1024 2048)
    DEC_DEPTHS=(1 32 256)
    SCALE=1
    RAW_SECONDS=2
    CRIT_SECONDS=1.5
fi
DPDK_MAX=2048
CHAIN_SIZES=(256 1500)
CHAIN_DEPTHS=(32 256)
AUTH_KEY=0102030405060708090a0b0c0d0e0f101112131415161718

REPLAY=$ROOT/target/release/vhost-crypto-replay
XCPU=$ROOT/target/release/vuc-xcpu-rtt
NEAR_MIN_NS=60      # near placement: NEAR_MIN_NS <= cache-line round trip < FAR_NS
FAR_NS=200
PLACEMENT_WAIT=20   # seconds a run waits for a near placement (--placement near)
PLACEMENT_TRIES=3   # runs of a cell at most, until one is near from start to end
NEAR_GAVE_UP=""     # the rep and cell at which --placement near gave up
DAEMON=$ROOT/target/release/vhost-user-crypto
DPDK_SH=$ROOT/tools/bench/dpdk-vhost-crypto.sh
CLK_TCK=$(getconf CLK_TCK)

TMP=$(mktemp -d /tmp/vuc-compare.XXXXXX)
DAEMON_PID=""
DPID=""
DPDK_STARTED=0
cleanup() {
    local rc=$? p
    # An interrupt during a probe can leave a backend stopped (SIGSTOP):
    # let it run again, or it would never act on the signals below.
    for p in "$DAEMON_PID" "$DPID"; do
        if [ -n "$p" ]; then kill -CONT "$p" 2>/dev/null || true; fi
    done
    if [ -n "$DAEMON_PID" ] && [ -d "/proc/$DAEMON_PID" ]; then
        kill "$DAEMON_PID" 2>/dev/null || true
        wait "$DAEMON_PID" 2>/dev/null || true
    fi
    if [ "$DPDK_STARTED" = 1 ]; then
        bash "$DPDK_SH" stop >/dev/null 2>&1 || true
    fi
    rm -rf "$TMP"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { printf '== %s\n' "$*" >&2; }

# Requests per run and the trace chunk (requests expanded in memory by the
# replay tool; --repeat makes up the rest). The counts aim at 0.2-0.4 s of
# requests per run of ours on the hosts of docs/PERFORMANCE.md (DPDK's
# runs take up to twice as long); a run of 0.04 s still carries its start
# (ours was about 4 % faster over 0.4 s than over 0.04 s at 256 B depth
# 256; DPDK unchanged). Decrypt cells take the encrypt cells' counts. The
# AlgChain cells (-hmac, -hmac-dec, -hmac256) run 600,000 requests at
# 256 B and 300,000 at 1500 B: 0.1-0.4 s of ours, 0.15-1 s of DPDK's.
requests_for() { # system size depth
    local n
    if [[ $1 == *-hmac* ]]; then
        case "$2" in 256) n=600000 ;; *) n=300000 ;; esac
    elif [ "$3" = 1 ]; then
        case "$2" in 64) n=600000 ;; 256) n=500000 ;; 1024) n=200000 ;; 2048) n=120000 ;; 4096) n=60000 ;; *) n=16000 ;; esac
    else
        case "$2" in 64) n=6000000 ;; 256) n=5000000 ;; 1024) n=2000000 ;; 2048) n=1000000 ;; 4096) n=500000 ;; *) n=120000 ;; esac
    fi
    echo $((n / SCALE))
}
chunk_for() { # size
    case "$1" in 64|256) echo 20000 ;; 1024|1500) echo 8000 ;; 2048) echo 4000 ;; 4096) echo 2000 ;; *) echo 1000 ;; esac
}
trace_for() { # size [encrypt|decrypt] -> path (one generate line, AES-128-CBC)
    local dir=${2:-encrypt} f
    f=$TMP/aes128-cbc-$dir-$1.jsonl
    if [ ! -f "$f" ]; then
        printf '{"op":"create_session","name":"s1","algo":"aes-cbc","key":"%s","direction":"%s"}\n' "$KEY" "$dir" >"$f"
        printf '{"op":"generate","session":"s1","opcode":"%s","size":%d,"count":%d,"seed":%d}\n' \
            "$dir" "$1" "$(chunk_for "$1")" "$1" >>"$f"
    fi
    echo "$f"
}
# AES-128-CBC + HMAC, in place. The AlgChain order is the replay tool's
# default for the direction: CIPHER_THEN_HASH for encrypt (the MAC of the
# ciphertext comes back), HASH_THEN_CIPHER for decrypt (each request
# carries the MAC of its ciphertext, the tool's reference values).
chain_trace_for() { # size direction mac digest_len -> path
    local f=$TMP/aes128-cbc-$3-$4-$2-$1.jsonl
    if [ ! -f "$f" ]; then
        printf '{"op":"create_session","name":"s1","algo":"aes-cbc","key":"%s","direction":"%s","mac":"%s","auth_key":"%s","digest_len":%d}\n' \
            "$KEY" "$2" "$3" "$AUTH_KEY" "$4" >"$f"
        printf '{"op":"generate","session":"s1","opcode":"%s","size":%d,"count":%d,"seed":%d,"in_place":true}\n' \
            "$2" "$1" "$(chunk_for "$1")" "$1" >>"$f"
    fi
    echo "$f"
}
cell_trace() { # system size -> path
    case "$1" in
        *-hmac) chain_trace_for "$2" encrypt hmac-sha1 12 ;;
        *-hmac-dec) chain_trace_for "$2" decrypt hmac-sha1 12 ;;
        *-hmac256) chain_trace_for "$2" encrypt hmac-sha256 16 ;;
        *-dec) trace_for "$2" decrypt ;;
        *) trace_for "$2" encrypt ;;
    esac
}
# utime+stime of a process (0 once it is gone: its replay run then fails
# and is recorded as failed, instead of set -e ending the whole comparison).
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }

# Cache-line round trip between the replay CPU and the backend CPU in ns,
# with the backend stopped meanwhile (DPDK's worker lcore polls CPU 1 all
# the time and would share it with the probe); "null" (and a log line) if
# it cannot be measured within 5 s.
probe() { # backend_pid
    local v
    kill -STOP "$1" 2>/dev/null || true
    v=$(timeout 5 "$XCPU" "$REPLAY_CPU" "$BACKEND_CPU" 2>"$TMP/probe.err") || v=""
    kill -CONT "$1" 2>/dev/null || true
    if [ -z "$v" ]; then
        log "vCPU placement probe failed: $(head -c 200 "$TMP/probe.err")"
        v=null
    fi
    echo "$v"
}
is_near() { [ "$1" != null ] && awk -v v="$1" -v lo="$NEAR_MIN_NS" -v f="$FAR_NS" 'BEGIN{exit !(v + 0 >= lo && v + 0 < f)}'; }
# With --placement near, until it gave up: a measured round trip outside
# the near window.
not_near_yet() { [ "$PLACEMENT" = near ] && [ -z "$NEAR_GAVE_UP" ] && [ "$1" != null ] && ! is_near "$1"; }

# One replay run: system size depth sock backend_pid [extra replay args]
# Appends one JSON object to $TMP/results.jsonl.
replay_run() {
    local sys=$1 size=$2 depth=$3 sock=$4 pid=$5 r=$REP; shift 5
    local want chunk repeat trace t0 t1 rc=0 out=$TMP/run.json err=$TMP/run.err
    want=$(requests_for "$sys" "$size" "$depth")
    chunk=$(chunk_for "$size")
    [ "$want" -ge "$chunk" ] || chunk=$want
    repeat=$(( (want + chunk - 1) / chunk ))
    trace=$(cell_trace "$sys" "$size")
    if [ "$chunk" != "$(chunk_for "$size")" ]; then
        trace=$TMP/$sys-$size-$chunk.jsonl
        sed "s/\"count\":[0-9]*/\"count\":$chunk/" "$(cell_trace "$sys" "$size")" >"$trace"
    fi
    local attempt=0 before after waited
    while :; do
        attempt=$((attempt + 1))
        before=$(probe "$pid")
        waited=0
        while not_near_yet "$before" && [ "$waited" -lt $((PLACEMENT_WAIT * 2)) ]; do
            sleep 0.5
            waited=$((waited + 1))
            before=$(probe "$pid")
        done
        if not_near_yet "$before"; then
            # A whole wait without a near probe: this host keeps the two
            # vCPUs apart, it seems; waiting more would only add time.
            NEAR_GAVE_UP="rep $r: $sys size $size depth $depth"
            log "$NEAR_GAVE_UP: no near vCPU placement in ${PLACEMENT_WAIT} s (round trip $before ns): this and the remaining runs go as they come, as with --placement any"
        fi
        rc=0
        t0=$(cpu_ticks "$pid")
        taskset -c "$REPLAY_CPU" "$REPLAY" --socket "$sock" --json --queue-size 1024 \
            --queue-depth "$depth" --repeat "$repeat" "$@" "$trace" >"$out" 2>"$err" || rc=$?
        t1=$(cpu_ticks "$pid")
        after=$(probe "$pid")
        if [ "$PLACEMENT" = any ] || [ -n "$NEAR_GAVE_UP" ] || [ "$rc" != 0 ] || [ "$before" = null ] || [ "$after" = null ] ||
            [ "$attempt" -ge "$PLACEMENT_TRIES" ] || { is_near "$before" && is_near "$after"; }; then
            break
        fi
        log "$sys size $size depth $depth: vCPU placement not near (round trip $before ns before, $after ns after the run): run again"
    done
    local bcpu
    bcpu=$(awk -v a="$t0" -v b="$t1" -v h="$CLK_TCK" 'BEGIN{printf "%.2f", (b-a)/h}')
    if [ "$rc" = 0 ] && [ -s "$out" ]; then
        jq -c --arg sys "$sys" --argjson size "$size" --argjson depth "$depth" --argjson bcpu "$bcpu" --argjson rep "$r" \
            --argjson before "$before" --argjson after "$after" --argjson attempts "$attempt" \
            '{system:$sys,size:$size,depth:$depth,rep:$rep,ops_per_sec,mib_per_sec,p50_us,p99_us,
              elapsed_s,requests,mismatches,replay_cpu_s:.cpu_s,backend_cpu_s:$bcpu,
              xcpu_rtt_ns:[$before,$after],attempts:$attempts}' \
            "$out" >>"$TMP/results.jsonl"
        log "$(jq -r --arg sys "$sys" '"\($sys) size \(.bytes/.requests) depth '"$depth"': \(.ops_per_sec|floor) ops/s, \(.mib_per_sec*10|floor/10) MiB/s, mismatches \(.mismatches)"' "$out"), round trip $before/$after ns"
    else
        log "$sys size $size depth $depth FAILED (exit $rc): $(head -c 300 "$err" "$out" | tr '\n' ' ')"
        jq -nc --arg sys "$sys" --argjson size "$size" --argjson depth "$depth" --argjson rep "$r" --arg e "exit $rc: $(head -c 300 "$err")" \
            --argjson before "$before" --argjson after "$after" --argjson attempts "$attempt" \
            '{system:$sys,size:$size,depth:$depth,rep:$rep,error:$e,xcpu_rtt_ns:[$before,$after],attempts:$attempts}' >>"$TMP/results.jsonl"
    fi
}

# Every cell of --cells for one backend: ours|dpdk sock pid [replay args]
run_cells() {
    local b=$1 sock=$2 pid=$3 size depth g; shift 3
    if want_cells enc; then
        for size in "${SIZES[@]}"; do
            { [ "$b" = ours ] || [ "$size" -le "$DPDK_MAX" ]; } || continue
            for depth in "${DEPTHS[@]}"; do
                replay_run "$b" "$size" "$depth" "$sock" "$pid" "$@"
            done
        done
    fi
    if want_cells dec; then
        for size in "${DEC_SIZES[@]}"; do
            for depth in "${DEC_DEPTHS[@]}"; do
                replay_run "$b-dec" "$size" "$depth" "$sock" "$pid" "$@"
            done
        done
    fi
    for g in hmac hmac-dec hmac256; do
        want_cells "$g" || continue
        for size in "${CHAIN_SIZES[@]}"; do
            for depth in "${CHAIN_DEPTHS[@]}"; do
                replay_run "$b-$g" "$size" "$depth" "$sock" "$pid" "$@"
            done
        done
    done
}

# Commands this script runs besides cargo and the Debian packages that
# have them, and what the engines bench links (openssl-sys, a
# dev-dependency: libssl-dev, pkg-config); missing ones are installed with
# apt-get (through sudo when not root). (taskset and getconf come with
# every Debian system.)
need_pkgs=()
for cp in jq:jq openssl:openssl python3:python3; do
    command -v "${cp%%:*}" >/dev/null 2>&1 || need_pkgs+=("${cp#*:}")
done
for p in libssl-dev pkg-config; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need_pkgs+=("$p")
done
if [ "${#need_pkgs[@]}" -gt 0 ]; then
    command -v apt-get >/dev/null 2>&1 || { echo "compare.sh: install ${need_pkgs[*]} first" >&2; exit 1; }
    SUDO=""
    if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
    log "installing ${need_pkgs[*]}"
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${need_pkgs[@]}"
fi

START=$(date +%s)
mkdir -p "$OUT"
: >"$TMP/results.jsonl"

if [ "$BUILD" = 1 ]; then
    log "cargo build --release --workspace"
    cargo build --release --workspace
    log "cargo bench --bench engines --no-run"
    cargo bench --bench engines --no-run >/dev/null 2>&1 || log "engines bench does not build: algos column will be n/a"
    log "cargo build --release (tools/bench/plot, plotters; own workspace, target/bench-plot)"
    cargo build --release --manifest-path "$ROOT/tools/bench/plot/Cargo.toml" --target-dir "$ROOT/target/bench-plot" ||
        log "the plotters plot does not build: compare.svg comes from compare_report.py only, no PNG"
    if [ "$DPDK" = 1 ]; then
        bash "$DPDK_SH" build || { log "DPDK build failed: dpdk column will be n/a"; DPDK=0; }
    fi
fi
if [ "$PLACEMENT" = near ] && [ ! -x "$XCPU" ]; then
    echo "compare.sh: $XCPU is missing (cargo build --release --workspace builds it); or use --placement any" >&2
    exit 1
fi
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
log "load average before: $LOAD_BEFORE"

for REP in $(seq "$REPS"); do
    # --- our daemon -------------------------------------------------------------
    SOCK=$TMP/vuc.sock
    rm -f "$SOCK"
    log "rep $REP/$REPS: starting our daemon on CPU $BACKEND_CPU"
    taskset -c "$BACKEND_CPU" "$DAEMON" --socket-path "$SOCK" >"$TMP/daemon.log" 2>&1 &
    DAEMON_PID=$!
    for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.05; done
    [ -S "$SOCK" ] || { cat "$TMP/daemon.log" >&2; echo "compare.sh: daemon did not start" >&2; exit 1; }
    run_cells ours "$SOCK" "$DAEMON_PID"
    # The engines the daemon chose for this CPU (its start-up log lines).
    ENGINES=$(sed -n 's/.*\(multi-buffer AES-CBC engine\|HMAC engine\): \(.*\)/\1: \2/p' "$TMP/daemon.log" | paste -sd',' - | sed 's/,/, /g')
    kill "$DAEMON_PID"; wait "$DAEMON_PID" 2>/dev/null || true
    DAEMON_PID=""

    # --- DPDK 22.11 vhost_crypto ------------------------------------------------
    if [ "$DPDK" = 1 ]; then
        DSOCK=$TMP/dpdk.sock
        DPDK_STARTED=1
        if bash "$DPDK_SH" run "$DSOCK"; then
            DPID=$(cat "$ROOT/target/dpdk-vhost-crypto/vhost-crypto.pid")
            run_cells dpdk "$DSOCK" "$DPID" --dpdk
        else
            log "DPDK vhost_crypto did not start: dpdk column will be n/a"
        fi
        bash "$DPDK_SH" stop || true
        DPDK_STARTED=0
        DPID=""
    fi
done

# --- raw single-stream ciphers on CPU 1 -------------------------------------
RAW_SIZES=()
if want_cells enc; then RAW_SIZES=("${SIZES[@]}"); fi
for size in "${RAW_SIZES[@]}"; do
    line=$(taskset -c "$BACKEND_CPU" openssl speed -evp aes-128-cbc -bytes "$size" -seconds "$RAW_SECONDS" 2>&1 |
        grep -m1 '^Doing' || true)
    # "Doing AES-128-CBC for 2s on 256 size blocks: 10795113 AES-128-CBC's in 1.99s"
    if [[ $line =~ :\ ([0-9]+)\ .*\ in\ ([0-9.]+)s ]]; then
        jq -nc --argjson size "$size" --argjson n "${BASH_REMATCH[1]}" --argjson s "${BASH_REMATCH[2]}" \
            '{system:"openssl",size:$size,depth:null,ops_per_sec:($n/$s),mib_per_sec:($n*$size/$s/1048576),
              requests:$n,cpu_s:$s}' >>"$TMP/results.jsonl"
        log "openssl size $size: $line"
    else
        log "openssl speed size $size: could not parse: $line"
    fi
done

filter=$(IFS='|'; echo "${SIZES[*]}")
CRIT=$ROOT/target/criterion/aes128-cbc/encrypt-single-stream-x8
if ! want_cells enc; then
    log "--cells without enc: no openssl and algos columns"
elif taskset -c "$BACKEND_CPU" cargo bench --bench engines -- \
        "encrypt-single-stream-x8/($filter)\$" --warm-up-time 0.3 \
        --measurement-time "$CRIT_SECONDS" --noplot >"$TMP/criterion.log" 2>&1; then
    for size in "${SIZES[@]}"; do
        est=$CRIT/$size/new/estimates.json
        if [ -f "$est" ]; then
            # mean time per iteration (8 messages) in ns
            jq -c --argjson size "$size" \
                '{system:"algos",size:$size,depth:null,ops_per_sec:(8e9/.mean.point_estimate),
                  mib_per_sec:(8e9/.mean.point_estimate*$size/1048576),ns_per_8_requests:.mean.point_estimate}' \
                "$est" >>"$TMP/results.jsonl"
        fi
    done
    log "algorithms single-stream: $(grep -c 'time:' "$TMP/criterion.log") criterion results"
else
    log "cargo bench --bench engines failed: algos column n/a ($(tail -3 "$TMP/criterion.log" | tr '\n' ' '))"
fi

LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
END=$(date +%s)

python3 "$ROOT/tools/bench/compare_report.py" \
    --results "$TMP/results.jsonl" --out "$OUT" \
    --meta "$(jq -nc --arg q "$QUICK" --arg lb "$LOAD_BEFORE" --arg la "$LOAD_AFTER" \
        --arg commit "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
        --arg dirty "$(git status --porcelain -- src algorithms tools/replay 2>/dev/null | wc -l)" \
        --arg host "$(uname -n) $(nproc) CPUs $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')" \
        --arg cpu "$(awk -F': *' '/^cpu family/{f=$2} /^model\t/{m=$2} /^stepping/{s=$2} END{printf "family %s model %s stepping %s", f, m, s}' /proc/cpuinfo)" \
        --arg ipsecmb "$(dpkg-query -W -f '${Version}' libipsec-mb1 2>/dev/null || echo unknown)" \
        --arg engines "${ENGINES:-unknown}" \
        --arg flags "$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -xE 'aes|vaes|vpclmulqdq|avx2|avx512f|avx512bw|avx512vl|sha_ni' | paste -sd' ' -)" \
        --argjson secs "$((END - START))" --arg date "$(date -u +%FT%TZ)" \
        --arg placement "$PLACEMENT" --arg gaveup "$NEAR_GAVE_UP" --argjson near "$NEAR_MIN_NS" --argjson far "$FAR_NS" --argjson wait "$PLACEMENT_WAIT" --argjson tries "$PLACEMENT_TRIES" \
        --arg cells "$CELLS" \
        --argjson reps "$REPS" '{quick:($q=="1"),reps:$reps,cells:$cells,placement:$placement,placement_gave_up:(if $gaveup == "" then null else $gaveup end),near_min_rtt_ns:$near,far_rtt_ns:$far,placement_wait_s:$wait,placement_tries:$tries,load_before:$lb,load_after:$la,commit:$commit,dirty_files:($dirty|tonumber),
          host:$host,cpu:$cpu,ipsec_mb:$ipsecmb,engines:$engines,cpu_flags:$flags,wall_s:$secs,date:$date,
          ours:"taskset -c 1 vhost-user-crypto --socket-path SOCK; taskset -c 0 vhost-crypto-replay --socket SOCK --json --queue-size 1024 --queue-depth D --repeat K TRACE",
          dpdk:"tools/bench/dpdk-vhost-crypto.sh run SOCK (CPU 1); taskset -c 0 vhost-crypto-replay --socket SOCK --dpdk --json --queue-size 1024 --queue-depth D --repeat K TRACE",
          openssl:"taskset -c 1 openssl speed -evp aes-128-cbc -bytes N -seconds S",
          algos:"taskset -c 1 cargo bench --bench engines -- encrypt-single-stream-x8"}')"
# The plotters plot (SVG and PNG) replaces compare_report.py's SVG when it works.
PLOT=$ROOT/target/bench-plot/release/vuc-bench-plot
if [ -x "$PLOT" ] && "$PLOT" "$OUT/compare.json" "$OUT/compare.svg" && "$PLOT" "$OUT/compare.json" "$OUT/compare.png"; then
    log "plot (plotters): $OUT/compare.svg, $OUT/compare.png"
else
    log "plot: $OUT/compare.svg from compare_report.py (the plotters binary is missing or failed)"
fi
log "done in $((END - START)) s: $OUT/compare.txt, $OUT/compare.json, $OUT/compare.svg"
