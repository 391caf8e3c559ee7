#!/usr/bin/env bash
# Builds the guest image for the QEMU end-to-end test into tools/guest/out/:
#   out/vmlinux        uncompressed PVH kernel (when it could be extracted)
#   out/vmlinuz        the Debian bzImage (always; fallback kernel)
#   out/initramfs.gz   busybox + virtio-crypto/AF_ALG/AES-NI modules + guest-test + /init
#   out/image.env      KVER=..., KERNEL=... for run-guest.sh
#
# Nothing is installed on the host except missing build tools (apt-get install,
# for a fresh Debian 12 CI machine). The kernel and busybox come from
# `apt-get download` + `dpkg -x`. Work already done is skipped on a re-run.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
OUT=${VUC_GUEST_OUT:-$HERE/out}
DEBS=$OUT/debs

# Modules to load, in this order (their dependencies from modules.dep are
# added in front of each one automatically).
MODULES=(
    virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci
    crypto_engine virtio_crypto
    af_alg algif_skcipher
    cryptd crypto_simd aesni-intel
)

log() { printf 'build-image: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

usage() {
    cat <<EOF
usage: $0 [--force]
  Builds $OUT/{vmlinux,vmlinuz,initramfs.gz,image.env}.
  --force   re-download and re-extract everything
Environment: VUC_GUEST_OUT overrides the output folder.
EOF
}

ARGS=("$@")
FORCE=0
while [[ $# -gt 0 ]]; do
    case $1 in
        --force) FORCE=1 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
    shift
done

SECONDS=0
mkdir -p "$OUT" "$DEBS"
if [[ $FORCE == 1 ]]; then
    rm -rf "${DEBS:?}"/* "$OUT/kroot" "$OUT/busybox-root" "$OUT/vmlinux" "$OUT/vmlinuz"
fi

# --- host tools --------------------------------------------------------------
apt_updated=0
apt_update_once() {
    if [[ $apt_updated == 0 ]]; then
        log "apt-get update"
        apt-get update -qq >&2
        apt_updated=1
    fi
}

need_tool() { # need_tool COMMAND PACKAGE
    command -v "$1" >/dev/null 2>&1 && return 0
    [[ $(id -u) == 0 ]] || die "'$1' is missing; install the Debian package '$2'"
    log "installing $2 (for $1)"
    apt_update_once
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$2" >&2
}

need_tool apt-get apt
need_tool dpkg-deb dpkg
need_tool depmod kmod
need_tool gzip gzip
need_tool xz xz-utils
command -v cargo >/dev/null 2>&1 || die "cargo is missing (install Rust with rustup; Debian 12's cargo is too old)"
if [[ ! -e /usr/lib/x86_64-linux-gnu/libc.a ]]; then # glibc's static libraries, for crt-static
    [[ $(id -u) == 0 ]] || die "install the Debian package libc6-dev (static glibc)"
    apt_update_once
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libc6-dev >&2
fi

# --- packages ----------------------------------------------------------------
# A failed download usually means stale package lists (the mirror dropped
# that version): update them and start over, once.
retry_after_update() {
    if [[ -n ${VUC_APT_RETRIED:-} || $(id -u) != 0 ]]; then
        die "$1"
    fi
    log "$1; running apt-get update and starting again"
    apt-get update -qq >&2
    VUC_APT_RETRIED=1 exec bash "$0" "${ARGS[@]}"
}

candidate() { # candidate PACKAGE -> candidate version from the default suites
    apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ {print $2; exit}'
}

# fetch_deb PACKAGE: sets FETCHED to the path of the .deb of the candidate
# version (downloads it only if not present yet). Not for $(...): a retry
# re-executes the script.
fetch_deb() {
    local pkg=$1 ver dir deb
    ver=$(candidate "$pkg")
    if [[ -z $ver || $ver == "(none)" ]]; then
        apt_update_once
        ver=$(candidate "$pkg")
    fi
    [[ -n $ver && $ver != "(none)" ]] || die "no candidate version for $pkg"
    dir=$DEBS/$pkg
    mkdir -p "$dir"
    for deb in "$dir"/*.deb; do
        [[ -e $deb ]] || continue
        if [[ $(dpkg-deb -f "$deb" Version) == "$ver" ]]; then
            FETCHED=$deb
            return 0
        fi
        rm -f "$deb"
    done
    log "downloading $pkg=$ver"
    local sandbox=()
    # apt's download sandbox user (_apt) may not be able to write here.
    [[ $(id -u) == 0 ]] && sandbox=(-o APT::Sandbox::User=root)
    if ! (cd "$dir" && apt-get "${sandbox[@]}" download -qq "$pkg=$ver" >&2); then
        retry_after_update "apt-get download $pkg=$ver failed"
    fi
    for deb in "$dir"/*.deb; do
        [[ -e $deb ]] && { FETCHED=$deb; return 0; }
    done
    die "apt-get download $pkg=$ver produced no .deb"
}

# extract DEB DIR: dpkg -x into DIR unless DIR already holds this .deb.
extract() {
    local deb=$1 dir=$2 stamp
    stamp="$dir/.extracted-from"
    if [[ -e $stamp && $(cat "$stamp") == "$(basename "$deb")" ]]; then
        return 0
    fi
    log "extracting $(basename "$deb")"
    rm -rf "$dir"
    mkdir -p "$dir"
    dpkg -x "$deb" "$dir"
    basename "$deb" >"$stamp"
}

# Kernel: the image package that linux-image-amd64 depends on.
KPKG=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ {print $2; exit}')
if [[ -z $KPKG ]]; then
    apt_update_once
    KPKG=$(apt-cache depends linux-image-amd64 | awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ {print $2; exit}')
fi
[[ -n $KPKG ]] || die "cannot resolve the kernel package of linux-image-amd64"
KVER=${KPKG#linux-image-}
fetch_deb "$KPKG"
KDEB=$FETCHED
KROOT=$OUT/kroot
extract "$KDEB" "$KROOT"
MODDIR=$KROOT/lib/modules/$KVER
[[ -d $MODDIR ]] || die "$MODDIR missing after extracting $KDEB"
if [[ ! -s $MODDIR/modules.dep || $MODDIR/modules.dep -ot $KROOT/.extracted-from ]]; then
    log "depmod $KVER"
    depmod -b "$KROOT" "$KVER"
fi

fetch_deb busybox-static
BBDEB=$FETCHED
BBROOT=$OUT/busybox-root
extract "$BBDEB" "$BBROOT"
BUSYBOX=$BBROOT/bin/busybox
[[ -x $BUSYBOX ]] || die "$BUSYBOX missing"

# --- kernel: bzImage and, if possible, the uncompressed PVH vmlinux ------------
VMLINUZ=$KROOT/boot/vmlinuz-$KVER
[[ -f $VMLINUZ ]] || die "$VMLINUZ missing"
cp -p "$VMLINUZ" "$OUT/vmlinuz"

# Reads a little-endian unsigned integer of LEN bytes at OFFSET of FILE.
le_uint() {
    local file=$1 off=$2 len=$3
    od -An -t "u$len" -j "$off" -N "$len" --endian=little "$file" | tr -d ' '
}

extract_vmlinux() { # extract_vmlinux BZIMAGE DEST -> 0 if DEST is a PVH ELF
    local bz=$1 dest=$2 setup_sects pm_start payload_off payload_len magic tmp
    [[ $(od -An -c -j 0x202 -N 4 "$bz" | tr -d ' ') == HdrS ]] || { log "vmlinux: not a bzImage"; return 1; }
    setup_sects=$(le_uint "$bz" $((0x1f1)) 1)
    [[ $setup_sects == 0 ]] && setup_sects=4
    pm_start=$(((setup_sects + 1) * 512))
    payload_off=$(le_uint "$bz" $((0x248)) 4)
    payload_len=$(le_uint "$bz" $((0x24c)) 4)
    [[ $payload_len -gt 0 ]] || { log "vmlinux: no payload in header"; return 1; }
    magic=$(od -An -t x1 -j $((pm_start + payload_off)) -N 6 "$bz" | tr -d ' ')
    tmp=$dest.tmp
    local decompress
    case $magic in
        fd377a585a00) decompress=(xz -dc --single-stream) ;;
        1f8b*) decompress=(gzip -dc) ;;
        28b52ffd*) need_tool zstd zstd; decompress=(zstd -dc) ;;
        *) log "vmlinux: unknown payload compression (magic $magic)"; return 1 ;;
    esac
    # Copy the payload to a file first: a pipe from tail/head could die of
    # SIGPIPE under pipefail when the decompressor stops at the stream's end.
    head -c $((pm_start + payload_off + payload_len)) "$bz" | tail -c "$payload_len" >"$tmp.payload"
    if ! "${decompress[@]}" <"$tmp.payload" >"$tmp"; then
        log "vmlinux: decompression failed"
        rm -f "$tmp" "$tmp.payload"
        return 1
    fi
    rm -f "$tmp.payload"
    if [[ $(od -An -t x1 -N 4 "$tmp" | tr -d ' ') != 7f454c46 ]]; then
        log "vmlinux: payload is not an ELF file"
        rm -f "$tmp"
        return 1
    fi
    # The PVH entry is an ELF note: name "Xen", type 18 (XEN_ELFNOTE_PHYS32_ENTRY).
    if ! LC_ALL=C grep -qaP '\x04\x00\x00\x00[\x04\x08]\x00\x00\x00\x12\x00\x00\x00Xen\x00' "$tmp"; then
        log "vmlinux: no PVH entry note (XEN_ELFNOTE_PHYS32_ENTRY); using the bzImage"
        rm -f "$tmp"
        return 1
    fi
    mv "$tmp" "$dest"
}

KERNEL=$OUT/vmlinuz
if [[ -s $OUT/vmlinux && $OUT/vmlinux -nt $OUT/vmlinuz ]]; then
    KERNEL=$OUT/vmlinux
else
    rm -f "$OUT/vmlinux"
    log "extracting the PVH vmlinux from the bzImage"
    if extract_vmlinux "$OUT/vmlinuz" "$OUT/vmlinux"; then
        KERNEL=$OUT/vmlinux
    else
        log "falling back to the bzImage"
    fi
fi

# --- guest program -----------------------------------------------------------
log "building guest-test (static)"
GT_TARGET=x86_64-unknown-linux-gnu
(
    cd "$ROOT"
    RUSTFLAGS="-C target-feature=+crt-static" \
        CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=symbols \
        cargo build --release -q -p guest-test --target "$GT_TARGET" >&2
) || die "cargo build of guest-test failed"
GUEST_TEST=${CARGO_TARGET_DIR:-$ROOT/target}/$GT_TARGET/release/guest-test
[[ -x $GUEST_TEST ]] || die "$GUEST_TEST missing"
if ! file_out=$(LC_ALL=C readelf -d "$GUEST_TEST" 2>/dev/null); then
    file_out=""
fi
if grep -q NEEDED <<<"$file_out"; then
    die "$GUEST_TEST is not static"
fi

# --- initramfs ---------------------------------------------------------------
# Resolve the load order: each wanted module preceded by its dependencies.
declare -A DEP_OF=() PATH_OF=()
while IFS= read -r line; do
    mod=${line%%:*}
    name=${mod##*/}
    name=${name%%.ko*}
    name=${name//-/_}
    PATH_OF[$name]=$mod
    DEP_OF[$name]=${line#*:}
done <"$MODDIR/modules.dep"

declare -A ADDED=()
ORDER=()
add_module() {
    local name=${1//-/_} dep deps=() i
    [[ -n ${ADDED[$name]:-} ]] && return 0
    if [[ -z ${PATH_OF[$name]:-} ]]; then
        if grep -qE "/${name//_/[-_]}\.ko$" "$MODDIR/modules.builtin" 2>/dev/null; then
            log "module $name is built into the kernel"
            ADDED[$name]=builtin
            return 0
        fi
        die "module $name not found in $MODDIR/modules.dep"
    fi
    ADDED[$name]=pending
    read -r -a deps <<<"${DEP_OF[$name]}"
    # modules.dep lists the closure, last to be loaded first.
    for ((i = ${#deps[@]} - 1; i >= 0; i--)); do
        dep=${deps[i]##*/}
        add_module "${dep%%.ko*}"
    done
    ADDED[$name]=yes
    ORDER+=("${PATH_OF[$name]}")
}
for m in "${MODULES[@]}"; do add_module "$m"; done

STAGE=$OUT/initramfs.stage
rm -rf "$STAGE"
mkdir -p "$STAGE"/{bin,sbin,dev,proc,sys,tmp,etc,"lib/modules/$KVER"}
cp "$BUSYBOX" "$STAGE/bin/busybox"
for applet in $("$BUSYBOX" --list); do
    [[ $applet == busybox ]] && continue
    ln -sf busybox "$STAGE/bin/$applet"
done
cp "$GUEST_TEST" "$STAGE/bin/guest-test"

: >"$STAGE/etc/vuc-modules"
for mod in "${ORDER[@]}"; do
    dest=$STAGE/lib/modules/$KVER/${mod%.xz}
    dest=${dest%.zst}
    mkdir -p "$(dirname "$dest")"
    case $mod in
        *.ko) cp "$MODDIR/$mod" "$dest" ;;
        *.ko.xz) xz -dc "$MODDIR/$mod" >"$dest" ;;
        *.ko.zst) zstd -qdc "$MODDIR/$mod" >"$dest" ;;
        *) die "unexpected module file $mod" ;;
    esac
    printf '%s\n' "${dest#"$STAGE/lib/modules/$KVER/"}" >>"$STAGE/etc/vuc-modules"
done
log "modules: $(tr '\n' ' ' <"$STAGE/etc/vuc-modules")"

if [[ $(id -u) == 0 ]]; then
    mknod -m 600 "$STAGE/dev/console" c 5 1
    mknod -m 666 "$STAGE/dev/null" c 1 3
fi

cat >"$STAGE/init" <<'EOF'
#!/bin/sh
# vhost-user-crypto e2e guest: load modules, run guest-test, power off.
export PATH=/bin:/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec 0</dev/console 1>/dev/console 2>&1
mkdir -p /dev/pts /tmp

echo "init: up after $(cut -d' ' -f1 /proc/uptime) s, kernel $(uname -r)"
KDIR=/lib/modules/$(uname -r)
modfail=""
while read -r m; do
    [ -n "$m" ] || continue
    if ! insmod "$KDIR/$m"; then
        echo "init: insmod $m FAILED"
        modfail="$modfail $(basename "$m" .ko)"
    fi
done </etc/vuc-modules
echo "init: modules loaded at $(cut -d' ' -f1 /proc/uptime) s${modfail:+ (failed:$modfail)}"

# Options from the kernel command line: vuc.speed=SECS vuc.ops=N vuc.seed=N vuc.hang=SECS
set --
for w in $(cat /proc/cmdline); do
    case $w in
        vuc.speed=*) set -- "$@" --speed-secs "${w#vuc.speed=}" ;;
        vuc.ops=*) set -- "$@" --ops "${w#vuc.ops=}" ;;
        vuc.seed=*) set -- "$@" --seed "${w#vuc.seed=}" ;;
        vuc.hang=*) set -- "$@" --hang-secs "${w#vuc.hang=}" ;;
    esac
done
echo "init: running guest-test $*"
/bin/guest-test "$@"
rc=$?
case $rc in
    0|1|3) ;; # 3: the watchdog already printed the verdict
    *) echo "GUEST-RESULT: FAIL guest-test-exit-status-$rc" ;;
esac
if [ "$rc" != 0 ]; then
    echo "init: last kernel messages:"
    dmesg | tail -n 60 | sed 's/^/dmesg: /'
fi
echo "init: powering off (guest-test exit status $rc)"
sync
poweroff -f
sleep 5
EOF
chmod 755 "$STAGE/init"

log "packing initramfs"
(
    cd "$STAGE"
    find . -mindepth 1 | LC_ALL=C sort | "$BUSYBOX" cpio -o -H newc 2>/dev/null
) | gzip -6 >"$OUT/initramfs.gz.tmp"
mv "$OUT/initramfs.gz.tmp" "$OUT/initramfs.gz"
rm -rf "$STAGE"

cat >"$OUT/image.env" <<EOF
KVER=$KVER
KPKG=$KPKG
KERNEL=$KERNEL
INITRD=$OUT/initramfs.gz
EOF
log "done in ${SECONDS}s: kernel $KERNEL ($KVER), initramfs $OUT/initramfs.gz ($(du -h "$OUT/initramfs.gz" | cut -f1))"
