#!/usr/bin/env bash
# Fetches QEMU 10.0.x from bookworm-backports into tools/guest/out/qemu10/
# WITHOUT installing it (the system QEMU 7.2 stays): adds a deb822 source for
# bookworm-backports (pinned at priority 100, so nothing is upgraded from it
# unless asked for by name), `apt-get download`s qemu-system-x86,
# qemu-system-common, qemu-system-data and seabios of the backports version
# and `dpkg -x`es them. A shared library the host lacks is installed from
# bookworm when bookworm has a good enough version, else fetched from
# backports into qemu10/deps (LD_LIBRARY_PATH in qemu10/qemu10.env).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUT=${VUC_GUEST_OUT:-$HERE/out}
Q10=$OUT/qemu10
DEBS=$OUT/debs/qemu10
SUITE=bookworm-backports
WANT_PREFIX=10.0.
PKGS=(qemu-system-x86 qemu-system-common qemu-system-data seabios)
SRC_FILE=/etc/apt/sources.list.d/vuc-bookworm-backports.sources
PIN_FILE=/etc/apt/preferences.d/vuc-bookworm-backports

log() { printf 'fetch-qemu10: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

case ${1:-} in
    "") ;;
    -h|--help) echo "usage: $0   (fetches QEMU ${WANT_PREFIX}x into $Q10)"; exit 0 ;;
    *) die "unknown argument $1" ;;
esac

SECONDS=0
SANDBOX=()
[[ $(id -u) == 0 ]] && SANDBOX=(-o APT::Sandbox::User=root)

# --- the backports source ----------------------------------------------------
has_backports_source() {
    grep -rqsE '^[^#]*bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
        /etc/apt/sources.list.d/*.sources
}

# Prints the bpo version of PACKAGE known to apt (empty if none).
bpo_version() {
    apt-cache madison "$1" 2>/dev/null |
        awk -F'|' -v s="$SUITE/" 'index($3, s) {gsub(/ /, "", $2); print $2; exit}'
}

# Prints "URI SIGNED-BY" (SIGNED-BY may be empty) of the first one-line
# 'deb [options] URI bookworm COMPONENT...' entry in the files given.
oneline_main() {
    grep -hsE '^[[:space:]]*deb[[:space:]]+(\[[^]]*\][[:space:]]+)?[^[:space:]]+[[:space:]]+bookworm([[:space:]]|$)' "$@" |
        head -n 1 |
        awk '{
            signed = ""; i = 2
            if ($2 ~ /^\[/) {
                for (; i <= NF; i++) {
                    if ($i ~ /^\[?signed-by=/) { s = $i; sub(/^\[?signed-by=/, "", s); sub(/\]$/, "", s); signed = s }
                    if ($i ~ /\]$/) { i++; break }
                }
            }
            print $i, signed
        }'
}

if ! has_backports_source; then
    [[ $(id -u) == 0 ]] || die "no $SUITE apt source; run as root once to add it"
    # Same URIs and Signed-By as the main Debian stanza of the deb822 sources.
    MAIN=""
    for f in /etc/apt/sources.list.d/*.sources; do
        [[ -e $f ]] || continue
        MAIN=$(awk 'BEGIN {RS=""} /(^|\n)Suites:[^\n]*[ \t]bookworm([ \t]|\n|$)/ {print; exit}' "$f")
        [[ -n $MAIN ]] && break
    done
    if [[ -n $MAIN ]]; then
        URIS=$(sed -n 's/^URIs:[ \t]*//p' <<<"$MAIN" | head -n 1)
        SIGNED=$(sed -n 's/^Signed-By:[ \t]*//p' <<<"$MAIN" | head -n 1)
    else
        # The one-line format (what Debian's installer writes):
        # deb [option=value ...] URI bookworm COMPONENT...
        read -r URIS SIGNED < <(oneline_main /etc/apt/sources.list /etc/apt/sources.list.d/*.list) || true
    fi
    [[ -n ${URIS:-} ]] || die "no apt source for bookworm found (a deb822 stanza with 'Suites: bookworm' in /etc/apt/sources.list.d/*.sources, or a 'deb URI bookworm ...' line)"
    log "adding $SRC_FILE (URIs: $URIS)"
    {
        echo "Types: deb"
        echo "URIs: $URIS"
        echo "Suites: $SUITE"
        echo "Components: main"
        [[ -n $SIGNED ]] && echo "Signed-By: $SIGNED"
    } >"$SRC_FILE"
fi
if [[ ! -e $PIN_FILE && $(id -u) == 0 ]]; then
    # Backports' Release file already says NotAutomatic/ButAutomaticUpgrades
    # (priority 100); this makes it explicit so no upgrade ever pulls from it.
    printf 'Package: *\nPin: release n=%s\nPin-Priority: 100\n' "$SUITE" >"$PIN_FILE"
fi

if [[ -z $(bpo_version qemu-system-x86) ]]; then
    log "apt-get update (for $SUITE)"
    apt-get update -qq >&2
fi
QVER=$(bpo_version qemu-system-x86)
[[ -n $QVER ]] || die "qemu-system-x86 not found in $SUITE"
UPSTREAM=${QVER#*:}
[[ $UPSTREAM == "$WANT_PREFIX"* ]] || log "warning: $SUITE has qemu $QVER, not ${WANT_PREFIX}x"
SYS_CAND=$(apt-cache policy qemu-system-x86 | awk '/Candidate:/ {print $2}')
if [[ $SYS_CAND == "$QVER" ]]; then
    die "apt would now install qemu $QVER from $SUITE by default; check the pin in $PIN_FILE"
fi

# A failed download usually means stale package lists (the mirror dropped
# that version): update them and start over, once.
retry_after_update() {
    if [[ -n ${VUC_APT_RETRIED:-} || $(id -u) != 0 ]]; then
        die "$1"
    fi
    log "$1; running apt-get update and starting again"
    apt-get update -qq >&2
    VUC_APT_RETRIED=1 exec bash "$0"
}

# satisfies VERSION "OP REQ": does VERSION meet a Depends relation like
# ">= 2.34" (an empty relation is always met)?
satisfies() {
    local version=$1 op req dop
    [[ -n $2 ]] || return 0
    read -r op req <<<"$2"
    case $op in
        '>=') dop=ge ;; '<=') dop=le ;; '>>') dop=gt ;; '<<') dop=lt ;; '=') dop=eq ;; *) dop=ge ;;
    esac
    dpkg --compare-versions "$version" "$dop" "$req"
}

# Runs a command with the variables of qemu10.env exported.
with_env() {
    (
        set -a
        # shellcheck disable=SC1091 # written below by this script
        . "$Q10/qemu10.env"
        set +a
        exec "$@"
    )
}

# --- download and unpack ------------------------------------------------------
declare -A VER=()
for p in "${PKGS[@]}"; do
    v=$(bpo_version "$p")
    if [[ -z $v ]]; then
        v=$(apt-cache policy "$p" | awk '/Candidate:/ {print $2}')
        log "$p is not in $SUITE; using $v"
    fi
    [[ -n $v && $v != "(none)" ]] || die "no version of $p"
    VER[$p]=$v
done

STAMP_WANT=$(for p in "${PKGS[@]}"; do echo "$p=${VER[$p]}"; done)
if [[ -f $Q10/.stamp && $(cat "$Q10/.stamp") == "$STAMP_WANT" && -f $Q10/qemu10.env ]] &&
    with_env "$Q10/usr/bin/qemu-system-x86_64" --version >/dev/null 2>&1; then
    log "already done: $(head -n 1 < <("$Q10/usr/bin/qemu-system-x86_64" --version 2>/dev/null || true))"
else
    mkdir -p "$DEBS"
    rm -rf "$Q10"
    mkdir -p "$Q10"
    for p in "${PKGS[@]}"; do
        v=${VER[$p]}
        found=""
        for deb in "$DEBS/${p}_"*.deb; do
            [[ -e $deb ]] || continue
            if [[ $(dpkg-deb -f "$deb" Package) == "$p" && $(dpkg-deb -f "$deb" Version) == "$v" ]]; then
                found=$deb
            else
                rm -f "$deb"
            fi
        done
        if [[ -z $found ]]; then
            log "downloading $p=$v"
            if ! (cd "$DEBS" && apt-get "${SANDBOX[@]}" download -qq "$p=$v" >&2); then
                retry_after_update "apt-get download $p=$v failed"
            fi
            for deb in "$DEBS/${p}_"*.deb; do
                [[ $(dpkg-deb -f "$deb" Version) == "$v" ]] && found=$deb
            done
        fi
        [[ -n $found ]] || die "download of $p=$v failed"
        log "unpacking $(basename "$found")"
        dpkg -x "$found" "$Q10"
    done

    # Shared libraries: a dependency of qemu-system-x86 that the host does
    # not satisfy is installed from bookworm when bookworm's version is good
    # enough (a plain library; the QEMU packages themselves are never
    # installed), else unpacked from bookworm-backports into deps/ and put on
    # LD_LIBRARY_PATH.
    DEPS_DIR=$Q10/deps
    LDP=""
    INSTALL=()
    DEPENDS=$(apt-cache show "qemu-system-x86=$QVER" | sed -n 's/^Depends: //p' | head -n 1)
    IFS=',' read -r -a ITEMS <<<"$DEPENDS"
    for item in "${ITEMS[@]}"; do
        item=${item%%|*}                       # first alternative
        item=${item#"${item%%[![:space:]]*}"} # trim leading blanks
        item=${item%"${item##*[![:space:]]}"} # and trailing ones
        name=$(awk '{print $1}' <<<"$item")
        name=${name%%:*}
        [[ -n $name ]] || continue
        case $name in qemu-system-*|seabios|ipxe-qemu|ipxe-qemu-*) continue ;; esac
        rel=$(sed -n 's/.*(\([<>=]*\) *\([^)]*\)).*/\1 \2/p' <<<"$item")
        inst=$(dpkg-query -W -f '${db:Status-Status} ${Version}' "$name" 2>/dev/null || true)
        if [[ $inst == installed\ * ]] && satisfies "${inst#installed }" "$rel"; then
            continue
        fi
        # The newest version outside backports.
        main_ver=$(apt-cache madison "$name" 2>/dev/null |
            awk -F'|' -v s="$SUITE/" '!index($3, s) {gsub(/ /, "", $2); print $2; exit}')
        if [[ -n $main_ver ]] && satisfies "$main_ver" "$rel"; then
            log "host lacks $item (has: ${inst:-nothing}); will install $name=$main_ver from bookworm"
            INSTALL+=("$name=$main_ver")
            continue
        fi
        v=$(bpo_version "$name")
        [[ -n $v ]] || { log "warning: cannot resolve dependency $item"; continue; }
        log "host lacks $item (has: ${inst:-nothing}); unpacking $name=$v from $SUITE into deps/"
        if ! (cd "$DEBS" && apt-get "${SANDBOX[@]}" download -qq "$name=$v" >&2); then
            retry_after_update "apt-get download $name=$v failed"
        fi
        for deb in "$DEBS/${name}_"*.deb; do
            [[ $(dpkg-deb -f "$deb" Version) == "$v" ]] && dpkg -x "$deb" "$DEPS_DIR"
        done
    done
    if [[ ${#INSTALL[@]} -gt 0 ]]; then
        [[ $(id -u) == 0 ]] || die "install these libraries first: apt-get install ${INSTALL[*]}"
        log "apt-get install ${INSTALL[*]}"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${INSTALL[@]}" >&2
    fi
    if [[ -d $DEPS_DIR ]]; then
        for d in "$DEPS_DIR/usr/lib/x86_64-linux-gnu" "$DEPS_DIR/lib/x86_64-linux-gnu"; do
            [[ -d $d ]] && LDP=${LDP:+$LDP:}$d
        done
    fi
    {
        echo "QEMU_VERSION=$QVER"
        echo "QEMU=$Q10/usr/bin/qemu-system-x86_64"
        echo "QEMU_MODULE_DIR=$Q10/usr/lib/x86_64-linux-gnu/qemu"
        echo "LD_LIBRARY_PATH=$LDP"
    } >"$Q10/qemu10.env"

    # Does it run? Report any library still missing.
    if ! with_env "$Q10/usr/bin/qemu-system-x86_64" --version >&2; then
        with_env ldd "$Q10/usr/bin/qemu-system-x86_64" | grep 'not found' >&2 || true
        die "the unpacked QEMU does not run"
    fi
    echo "$STAMP_WANT" >"$Q10/.stamp"
fi

LDP=$(sed -n 's/^LD_LIBRARY_PATH=//p' "$Q10/qemu10.env")
log "done in ${SECONDS}s. Run it with:"
cat >&2 <<EOF
  ${LDP:+LD_LIBRARY_PATH=$LDP }QEMU_MODULE_DIR=$Q10/usr/lib/x86_64-linux-gnu/qemu \\
    $Q10/usr/bin/qemu-system-x86_64 -L $Q10/usr/share/seabios -L $Q10/usr/share/qemu ...
  or: tools/guest/run-guest.sh --qemu qemu10 ...
EOF
