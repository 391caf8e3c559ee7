#!/usr/bin/env bash
# Builds and runs DPDK 22.11's examples/vhost_crypto (Debian 12 packages) as
# a reference vhost-user crypto backend for vhost-crypto-replay --dpdk.
#
#   tools/bench/dpdk-vhost-crypto.sh build        install packages, build
#   tools/bench/dpdk-vhost-crypto.sh run SOCKET   build if needed, start on SOCKET
#   tools/bench/dpdk-vhost-crypto.sh stop         stop the one started by run
#   tools/bench/dpdk-vhost-crypto.sh status
#
# The example is copied from /usr/share/dpdk/examples/vhost_crypto (dpdk-doc)
# into target/dpdk-vhost-crypto/src and patched there so that its main lcore
# sleeps instead of busy-waiting in rte_eal_wait_lcore() (docs/PROTOCOL.md
# §9), and so that its destroy_device callback gives the worker a grace
# period before DPDK unmaps the device (see patch 2 below); nothing of DPDK is
# kept in the repository. The app is the vhost-user *server*: it creates
# SOCKET and listens (rte_vhost_driver_register without
# RTE_VHOST_USER_CLIENT), so start it before the frontend; it accepts one
# frontend after another. It runs pinned to CPU 1 (taskset), with its main
# lcore 0 and worker lcore 1 both mapped onto that CPU (EAL --lcores 0@1,1@1;
# without it EAL, seeing only CPU 1, would make lcore 1 the main lcore and the
# app's "(1,0,0)" worker could not be launched). Everything is idempotent.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD

EXAMPLE=/usr/share/dpdk/examples/vhost_crypto
WORK=$ROOT/target/dpdk-vhost-crypto
SRC=$WORK/src
BIN=$SRC/build/vhost-crypto
PIDFILE=$WORK/vhost-crypto.pid
SOCKFILE=$WORK/vhost-crypto.socket
LOG=$WORK/vhost-crypto.log
STAMP=$WORK/build.stamp
CPU=${DPDK_CPU:-1}
PATCH_VERSION=2
PREFIX=vuc-dpdk-vhost-crypto

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

log() { printf '== %s\n' "$*" >&2; }
die() { printf 'dpdk-vhost-crypto: %s\n' "$*" >&2; exit 1; }

install_packages() {
    local need=() p
    for p in libdpdk-dev dpdk-doc librte-crypto-ipsec-mb23 libipsec-mb-dev pkg-config make gcc; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
    done
    if [ "${#need[@]}" -gt 0 ]; then
        log "installing ${need[*]}"
        $SUDO apt-get update -q
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${need[@]}"
    fi
}

build() {
    install_packages
    [ -f "$EXAMPLE/main.c" ] || die "$EXAMPLE/main.c missing (dpdk-doc)"
    local want
    want="$(cat "$EXAMPLE/main.c" "$EXAMPLE/Makefile" | sha256sum | cut -d' ' -f1) patch $PATCH_VERSION $(pkg-config --modversion libdpdk)"
    if [ -x "$BIN" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
        return 0
    fi
    log "building DPDK $(pkg-config --modversion libdpdk) examples/vhost_crypto in $SRC"
    rm -rf "$SRC" "$STAMP"
    mkdir -p "$WORK"
    cp -r "$EXAMPLE" "$SRC"
    # The main lcore ends in `RTE_LCORE_FOREACH(lcore) rte_eal_wait_lcore(lcore);`,
    # which spins for as long as the worker runs (forever). Sleep while any
    # worker is still running first; the original wait then returns at once.
    local anchor='^\tRTE_LCORE_FOREACH\(lcore\)$'
    [ "$(grep -cP "$anchor" "$SRC/main.c")" = 1 ] || die "patch anchor not found once in main.c"
    sed -E -i "s/$anchor/\\t\\/* vhost-user-crypto bench: do not busy-wait on the main lcore *\\/\\n\\tRTE_LCORE_FOREACH_WORKER(lcore)\\n\\t\\twhile (rte_eal_get_lcore_state(lcore) == RUNNING)\\n\\t\\t\\tusleep(100000);\\n&/" "$SRC/main.c"
    grep -q 'usleep(100000);' "$SRC/main.c" || die "patch 1 did not apply"
    # Patch 2. The worker loop checks info->initialized[i] and then calls
    # rte_vhost_crypto_fetch_requests() with no lock; destroy_device (run by
    # the vhost-events thread on disconnect or GET_VRING_BASE) only waits for
    # nb_inflight_ops == 0, clears initialized[] and returns, after which
    # librte_vhost unmaps the guest memory and frees the device. With both
    # threads on one CPU the worker is regularly preempted inside that window
    # and then segfaults in rte_vhost_crypto_fetch_requests reading
    # vq->avail->idx (seen here: a crash within 2-30 frontend disconnects).
    # Give it a 100 ms grace period after clearing initialized[]: the worker
    # finishes its iteration and sees 0 before anything is torn down.
    anchor='^\tinfo->initialized\[j\] = 0;$'
    [ "$(grep -cP "$anchor" "$SRC/main.c")" = 1 ] || die "patch 2 anchor not found once in main.c"
    sed -E -i "s/$anchor/&\n\t\/* vhost-user-crypto bench: let the worker leave the device first *\/\n\trte_wmb();\n\tusleep(100000);/" "$SRC/main.c"
    [ "$(grep -c 'usleep(100000);' "$SRC/main.c")" = 2 ] || die "patch 2 did not apply"
    make -C "$SRC" -s
    [ -x "$BIN" ] || die "build produced no $BIN"
    echo "$want" > "$STAMP"
}

# The instance recorded by run, if it is still alive.
running_pid() {
    local pid
    [ -f "$PIDFILE" ] || return 1
    pid=$(cat "$PIDFILE")
    [ -n "$pid" ] && is_ours "$pid" || return 1
    echo "$pid"
}

# Whether PID runs this script's private build (nothing else runs that file).
is_ours() {
    [ -d "/proc/$1" ] && [ "$(readlink -f "/proc/$1/exe" 2>/dev/null)" = "$(readlink -f "$BIN-shared")" ]
}

stop() {
    local pid pids=() d
    if pid=$(running_pid); then pids+=("$pid"); fi
    # Also any instance whose pid file went missing.
    if [ -e "$BIN-shared" ]; then
        for d in /proc/[0-9]*; do
            pid=${d#/proc/}
            if is_ours "$pid" && [[ " ${pids[*]} " != *" $pid "* ]]; then pids+=("$pid"); fi
        done
    fi
    for pid in "${pids[@]}"; do
        log "stopping vhost-crypto (pid $pid)"
        kill "$pid" 2>/dev/null || true
        # A process stopped with SIGSTOP (compare.sh's placement probe,
        # interrupted) acts on the TERM only once it runs again.
        kill -CONT "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        for _ in $(seq 100); do
            [ -d "/proc/$pid" ] || break
            sleep 0.1
        done
        if [ -d "/proc/$pid" ]; then
            kill -9 "$pid" 2>/dev/null || true
            sleep 0.2
        fi
    done
    if [ -f "$SOCKFILE" ]; then
        rm -f "$(cat "$SOCKFILE")"
    fi
    rm -f "$PIDFILE" "$SOCKFILE"
    rm -rf "/var/run/dpdk/$PREFIX"
}

run() {
    local sock=${1:-} pid
    [ -n "$sock" ] || die "usage: $0 run SOCKET"
    case "$sock" in /*) ;; *) sock=$PWD/$sock ;; esac
    build
    if pid=$(running_pid) && [ "$(cat "$SOCKFILE" 2>/dev/null)" = "$sock" ] && [ -S "$sock" ]; then
        log "already running (pid $pid) on $sock"
        return 0
    fi
    stop
    # The app is the server: rte_vhost_driver_register fails if the path exists.
    rm -f "$sock"
    mkdir -p "$(dirname "$sock")"
    log "starting vhost-crypto on $sock (CPU $CPU, log $LOG)"
    nohup taskset -c "$CPU" "$BIN" \
        --no-huge -m 512 --no-pci --vdev crypto_aesni_mb0 \
        --lcores "0@$CPU,1@$CPU" --file-prefix "$PREFIX" \
        -- --config "(1,0,0)" --socket-file "1,$sock" \
        </dev/null >"$LOG" 2>&1 &
    pid=$!
    echo "$pid" > "$PIDFILE"
    echo "$sock" > "$SOCKFILE"
    # Until nohup and taskset have exec'd, /proc/$pid/exe is not the app
    # yet: only check that the process lives, then that it is the app.
    for _ in $(seq 300); do
        if [ ! -d "/proc/$pid" ] || [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" = Z ]; then
            cat "$LOG" >&2
            rm -f "$PIDFILE" "$SOCKFILE"
            die "vhost-crypto exited during start-up"
        fi
        if [ -S "$sock" ] && is_ours "$pid"; then
            return 0
        fi
        sleep 0.1
    done
    cat "$LOG" >&2
    kill "$pid" 2>/dev/null || true
    stop
    die "vhost-crypto did not create $sock within 30 s"
}

case "${1:-}" in
    build) build ;;
    run) shift; run "$@" ;;
    stop) stop ;;
    status)
        if pid=$(running_pid); then echo "running (pid $pid) on $(cat "$SOCKFILE")"; else echo "not running"; fi ;;
    *) die "usage: $0 build | run SOCKET | stop | status" ;;
esac
