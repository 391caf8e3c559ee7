#!/usr/bin/env bash
# Boots the e2e guest image (tools/guest/build-image.sh) under QEMU/TCG with a
# virtio-crypto-pci device backed by a vhost-user daemon (or QEMU's builtin
# backend), shows the guest's serial output and exits 0 only if the guest
# printed "GUEST-RESULT: PASS".
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUT=${VUC_GUEST_OUT:-$HERE/out}

usage() {
    cat <<EOF
usage: $0 [options]
Backend (one of):
  --socket PATH       connect to a vhost-user daemon already listening on PATH
  --daemon BIN        start "BIN --socket-path SOCK" (SOCK: --socket or a temporary
                      path), stop it afterwards; its output goes to --daemon-log
  --builtin           QEMU's cryptodev-backend-builtin instead of vhost-user
Options:
  --qemu WHICH        system (default: /usr/bin/qemu-system-x86_64, QEMU 7.2 on Debian 12),
                      qemu10 (tools/guest/out/qemu10, see fetch-qemu10.sh) or a path
  --timeout SECS      kill QEMU after SECS seconds (default 170)
  --speed SECS        seconds per chunk size of the guest speed loop (default 1; 0 = skip)
  --ops N             operations of the guest's random cross-check (default: the guest's 1000)
  --seed N            PRNG seed for the guest (default: guest picks one and prints it)
  --log FILE          also write the guest console (and QEMU's stderr) to FILE
  --daemon-log FILE   daemon output file (default: a temporary file, shown on failure)
  --kernel FILE       kernel to boot (default: from out/image.env)
  --initrd FILE       initramfs (default: out/initramfs.gz)
  --append ARGS       extra kernel command line arguments
Environment: RUST_LOG is passed to the daemon; VUC_GUEST_OUT overrides out/.
EOF
}

log() { printf 'run-guest: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 2; }

SOCK=""
DAEMON=""
BUILTIN=0
QEMU_SEL=system
TIMEOUT=170
SPEED=1
OPS=""
SEED=""
LOG=""
DAEMON_LOG=""
KERNEL=""
INITRD=""
EXTRA_APPEND=""

need_arg() { [[ $# -ge 2 ]] || die "$1 needs a value"; }
while [[ $# -gt 0 ]]; do
    case $1 in
        --socket) need_arg "$@"; SOCK=$2; shift ;;
        --daemon) need_arg "$@"; DAEMON=$2; shift ;;
        --builtin) BUILTIN=1 ;;
        --qemu) need_arg "$@"; QEMU_SEL=$2; shift ;;
        --timeout) need_arg "$@"; TIMEOUT=$2; shift ;;
        --speed) need_arg "$@"; SPEED=$2; shift ;;
        --ops) need_arg "$@"; OPS=$2; shift ;;
        --seed) need_arg "$@"; SEED=$2; shift ;;
        --log) need_arg "$@"; LOG=$2; shift ;;
        --daemon-log) need_arg "$@"; DAEMON_LOG=$2; shift ;;
        --kernel) need_arg "$@"; KERNEL=$2; shift ;;
        --initrd) need_arg "$@"; INITRD=$2; shift ;;
        --append) need_arg "$@"; EXTRA_APPEND=$2; shift ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument $1" ;;
    esac
    shift
done

[[ $TIMEOUT =~ ^[0-9]+$ && $TIMEOUT -gt 0 ]] || die "--timeout must be a positive integer"
if [[ $BUILTIN == 1 && ( -n $SOCK || -n $DAEMON ) ]]; then
    die "--builtin excludes --socket/--daemon"
fi
if [[ $BUILTIN == 0 && -z $SOCK && -z $DAEMON ]]; then
    die "give --socket PATH, --daemon BIN or --builtin"
fi

# --- image -------------------------------------------------------------------
if [[ -z $KERNEL || -z $INITRD ]]; then
    [[ -f $OUT/image.env ]] || die "no guest image: run tools/guest/build-image.sh first"
    IMG_KERNEL=$(sed -n 's/^KERNEL=//p' "$OUT/image.env")
    IMG_INITRD=$(sed -n 's/^INITRD=//p' "$OUT/image.env")
    KERNEL=${KERNEL:-$IMG_KERNEL}
    INITRD=${INITRD:-$IMG_INITRD}
fi
[[ -f $KERNEL ]] || die "kernel $KERNEL missing: run tools/guest/build-image.sh"
[[ -f $INITRD ]] || die "initramfs $INITRD missing: run tools/guest/build-image.sh"

# --- QEMU --------------------------------------------------------------------
QEMU_ARGS=()
case $QEMU_SEL in
    system)
        QEMU=/usr/bin/qemu-system-x86_64
        [[ -x $QEMU ]] || die "$QEMU missing: apt-get install qemu-system-x86"
        ;;
    qemu10)
        Q10=$OUT/qemu10
        QEMU=$Q10/usr/bin/qemu-system-x86_64
        [[ -x $QEMU && -f $Q10/qemu10.env ]] || die "$QEMU missing: run tools/guest/fetch-qemu10.sh"
        QEMU_ARGS+=(-L "$Q10/usr/share/seabios" -L "$Q10/usr/share/qemu")
        export QEMU_MODULE_DIR=$Q10/usr/lib/x86_64-linux-gnu/qemu
        LDP=$(sed -n 's/^LD_LIBRARY_PATH=//p' "$Q10/qemu10.env")
        if [[ -n $LDP ]]; then
            export LD_LIBRARY_PATH=$LDP${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        fi
        ;;
    *)
        QEMU=$QEMU_SEL
        [[ -x $QEMU ]] || die "QEMU binary $QEMU not executable"
        ;;
esac
QEMU_VERSION=$("$QEMU" --version | head -n 1) || die "$QEMU --version failed"

# --- temporary files and cleanup ---------------------------------------------
TMPD=$(mktemp -d "${TMPDIR:-/tmp}/vuc-guest.XXXXXX")
DAEMON_PID=""
# shellcheck disable=SC2317 # called through the EXIT trap
cleanup() {
    if [[ -n $DAEMON_PID ]] && kill -0 "$DAEMON_PID" 2>/dev/null; then
        kill -TERM "$DAEMON_PID" 2>/dev/null || true
        for _ in 1 2 3 4 5 6 7 8 9 10; do
            kill -0 "$DAEMON_PID" 2>/dev/null || break
            sleep 0.5
        done
        if kill -0 "$DAEMON_PID" 2>/dev/null; then
            log "daemon did not stop on SIGTERM; killing it"
            kill -KILL "$DAEMON_PID" 2>/dev/null || true
        fi
        wait "$DAEMON_PID" 2>/dev/null || true
    fi
    rm -rf "$TMPD"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

[[ -n $LOG ]] || LOG=$TMPD/guest.log
: >"$LOG"

# --- backend -----------------------------------------------------------------
if [[ -n $DAEMON ]]; then
    [[ -x $DAEMON ]] || die "daemon binary $DAEMON not executable"
    [[ -n $SOCK ]] || SOCK=$TMPD/vhost-user-crypto.sock
    [[ -n $DAEMON_LOG ]] || DAEMON_LOG=$TMPD/daemon.log
    rm -f "$SOCK"
    log "starting daemon: $DAEMON --socket-path $SOCK (log: $DAEMON_LOG)"
    "$DAEMON" --socket-path "$SOCK" >"$DAEMON_LOG" 2>&1 </dev/null &
    DAEMON_PID=$!
    for _ in $(seq 1 100); do
        [[ -S $SOCK ]] && break
        kill -0 "$DAEMON_PID" 2>/dev/null || break
        sleep 0.1
    done
    if [[ ! -S $SOCK ]]; then
        log "daemon did not create $SOCK; its output:"
        tail -n 50 "$DAEMON_LOG" >&2 || true
        exit 1
    fi
fi

if [[ $BUILTIN == 1 ]]; then
    BACKEND=(-object "cryptodev-backend-builtin,id=cryptodev0")
    BACKEND_DESC=builtin
else
    [[ -S $SOCK ]] || die "no vhost-user socket at $SOCK"
    BACKEND=(-chardev "socket,id=char0,path=$SOCK"
             -object "cryptodev-vhost-user,id=cryptodev0,chardev=char0")
    BACKEND_DESC="vhost-user $SOCK"
fi

APPEND="console=ttyS0 quiet panic=-1 vuc.speed=$SPEED"
[[ -n $OPS ]] && APPEND+=" vuc.ops=$OPS"
[[ -n $SEED ]] && APPEND+=" vuc.seed=$SEED"
[[ -n $EXTRA_APPEND ]] && APPEND+=" $EXTRA_APPEND"

CMD=(timeout -k 5 "$TIMEOUT" "$QEMU" "${QEMU_ARGS[@]}"
    -nodefaults -no-user-config -nographic -serial stdio -monitor none -no-reboot
    -accel tcg -cpu max -smp 1 -m 512
    -object "memory-backend-memfd,id=mem,size=512M,share=on"
    -machine "pc,memory-backend=mem"
    "${BACKEND[@]}"
    -device "virtio-crypto-pci,id=crypto0,cryptodev=cryptodev0,vectors=0"
    -kernel "$KERNEL" -initrd "$INITRD" -append "$APPEND")

log "$QEMU_VERSION; backend: $BACKEND_DESC; kernel: $(basename "$KERNEL"); timeout ${TIMEOUT}s"
log "command: ${CMD[*]}"
printf 'run-guest: %s; backend: %s\n' "$QEMU_VERSION" "$BACKEND_DESC" >>"$LOG"
START=$SECONDS
set +e
"${CMD[@]}" </dev/null 2>&1 | tee -a "$LOG"
QEMU_STATUS=${PIPESTATUS[0]}
set -e
ELAPSED=$((SECONDS - START))

DAEMON_DIED=0
if [[ -n $DAEMON_PID ]] && ! kill -0 "$DAEMON_PID" 2>/dev/null; then
    DAEMON_DIED=1
fi

RESULT=fail
if grep -q 'GUEST-RESULT: PASS' "$LOG" && ! grep -q 'GUEST-RESULT: FAIL' "$LOG"; then
    RESULT=pass
fi
REASON=""
case $QEMU_STATUS in
    0) ;;
    124|137) REASON="QEMU timed out after ${TIMEOUT}s" ;;
    *) REASON="QEMU exited with status $QEMU_STATUS" ;;
esac
if ! grep -q 'GUEST-RESULT:' "$LOG"; then
    REASON="${REASON:+$REASON; }the guest printed no GUEST-RESULT line"
fi
[[ $DAEMON_DIED == 1 ]] && REASON="${REASON:+$REASON; }the daemon exited during the run"

if [[ $RESULT == pass && $QEMU_STATUS == 0 && $DAEMON_DIED == 0 ]]; then
    log "PASS in ${ELAPSED}s ($QEMU_VERSION, $BACKEND_DESC)"
    exit 0
fi
if [[ -n $DAEMON_LOG && -f $DAEMON_LOG ]]; then
    log "daemon output (last 80 lines of $DAEMON_LOG):"
    tail -n 80 "$DAEMON_LOG" | sed 's/^/daemon: /' >&2 || true
fi
log "FAIL in ${ELAPSED}s ($QEMU_VERSION, $BACKEND_DESC): $(grep -a 'GUEST-RESULT:' "$LOG" | tr -d '\r' | tail -n 1)${REASON:+ [$REASON]}"
exit 1
