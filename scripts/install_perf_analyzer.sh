#!/usr/bin/env bash
# Install NVIDIA's real perf_analyzer binary, for smoke tests against this server.
#
#   scripts/install_perf_analyzer.sh [PREFIX]      (default PREFIX: <repo>/.perf_analyzer)
#
# The PyPI package "perf-analyzer" is an empty placeholder. The binary ships inside the
# tritonclient 2.51.0 manylinux wheel (tritonclient-2.51.0.data/data/bin/perf_analyzer; 2.52-2.59
# need glibc 2.38, >= 2.60 no longer bundle it). It links against Debian's libb64-0d and against
# libcudart.so.12, which we take from pip's nvidia-cuda-runtime-cu12 (CUDA is not used at run time).
#
# Result: PREFIX/bin/perf_analyzer, a wrapper that sets LD_LIBRARY_PATH and execs the real binary.
# Idempotent: steps whose results are already in place are skipped.
#
# Environment:
#   PYTHON             interpreter whose pip is used (default: <repo>/.venv/bin/python, else python3)
#   TRITONCLIENT_VERSION   default 2.51.0 (later versions do not work here, see above)
#   CUDART_SPEC        pip requirement for libcudart.so.12 (default nvidia-cuda-runtime-cu12==12.9.79)
set -euo pipefail

die() {
    echo "install_perf_analyzer: error: $*" >&2
    exit 1
}
log() { echo "install_perf_analyzer: $*" >&2; }

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TRITONCLIENT_VERSION="${TRITONCLIENT_VERSION:-2.51.0}"

# --- platform -----------------------------------------------------------------------------------
[[ "$(uname -s)" == Linux ]] || die "perf_analyzer from the tritonclient wheel runs on Linux only (this is $(uname -s))"
[[ "$(uname -m)" == x86_64 ]] || die "only x86_64 is supported: the tritonclient $TRITONCLIENT_VERSION wheel bundles perf_analyzer for manylinux1_x86_64 only (this is $(uname -m))"

PREFIX="${1:-$ROOT/.perf_analyzer}"
mkdir -p "$PREFIX" || die "cannot create $PREFIX"
PREFIX="$(cd "$PREFIX" && pwd)"

CUDART_SPEC="${CUDART_SPEC:-nvidia-cuda-runtime-cu12==12.9.79}"

if [[ -n "${PYTHON:-}" ]]; then
    :
elif [[ -x "$ROOT/.venv/bin/python" ]]; then
    PYTHON="$ROOT/.venv/bin/python"
else
    PYTHON="$(command -v python3 || true)"
fi
[[ -n "$PYTHON" ]] || die "no python3 found (set PYTHON=/path/to/python)"
"$PYTHON" -m pip --version >/dev/null 2>&1 || die "$PYTHON has no pip (set PYTHON to an interpreter with pip)"

REAL_DIR="$PREFIX/libexec"
REAL_BIN="$REAL_DIR/perf_analyzer"
LIB_DIR="$PREFIX/lib"              # libb64 when extracted from the .deb (no root)
CUDART_TARGET="$PREFIX/cudart"     # pip --target for nvidia-cuda-runtime-cu12
CUDART_LIB="$CUDART_TARGET/nvidia/cuda_runtime/lib"
WRAPPER="$PREFIX/bin/perf_analyzer"
STAMP="$REAL_DIR/.tritonclient-version"

# --- 1. the binary, from the tritonclient wheel -----------------------------------------------
if [[ -x "$REAL_BIN" && -f "$STAMP" && "$(cat "$STAMP")" == "$TRITONCLIENT_VERSION" ]]; then
    log "perf_analyzer from tritonclient $TRITONCLIENT_VERSION already in $REAL_DIR"
else
    log "downloading tritonclient==$TRITONCLIENT_VERSION (manylinux1_x86_64 wheel)"
    WHEEL_DIR="$(mktemp -d)"
    trap 'rm -rf "$WHEEL_DIR"' EXIT
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
        --platform manylinux1_x86_64 --dest "$WHEEL_DIR" "tritonclient==$TRITONCLIENT_VERSION" \
        || die "pip could not download tritonclient==$TRITONCLIENT_VERSION for manylinux1_x86_64"
    WHEELS=("$WHEEL_DIR"/tritonclient-"$TRITONCLIENT_VERSION"-*.whl)
    WHEEL="${WHEELS[0]}"
    [[ -f "$WHEEL" ]] || die "pip download produced no tritonclient wheel in $WHEEL_DIR"
    mkdir -p "$REAL_DIR"
    "$PYTHON" - "$WHEEL" "$REAL_BIN" "$TRITONCLIENT_VERSION" <<'EOF' || die "could not extract perf_analyzer from the wheel"
import shutil, sys, zipfile
wheel, dest, version = sys.argv[1:]
member = f"tritonclient-{version}.data/data/bin/perf_analyzer"
with zipfile.ZipFile(wheel) as zf:
    try:
        src = zf.open(member)
    except KeyError:
        sys.exit(f"{member} is not in {wheel}")
    with src, open(dest + ".tmp", "wb") as out:
        shutil.copyfileobj(src, out)
EOF
    chmod 755 "$REAL_BIN.tmp"
    mv -f "$REAL_BIN.tmp" "$REAL_BIN"
    echo "$TRITONCLIENT_VERSION" >"$STAMP"
    rm -rf "$WHEEL_DIR"
    trap - EXIT
fi

# --- 2. libb64.so.0d, from Debian/Ubuntu's libb64-0d ------------------------------------------
have_system_b64() {
    local cache
    cache="$(ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null || true)"
    [[ "$cache" == *libb64.so.0d* ]]
}
if have_system_b64; then
    log "libb64.so.0d already installed system-wide"
elif [[ -e "$LIB_DIR/libb64.so.0d" ]]; then
    log "libb64.so.0d already in $LIB_DIR"
else
    command -v apt-get >/dev/null 2>&1 \
        || die "libb64.so.0d is missing and there is no apt-get to install Debian's libb64-0d; install libb64 (soname libb64.so.0d) yourself and rerun"
    SUDO=()
    if [[ "$(id -u)" != 0 ]]; then
        if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO=(sudo -n); fi
    fi
    if [[ "$(id -u)" == 0 || ${#SUDO[@]} -gt 0 ]]; then
        log "apt-get install libb64-0d"
        export DEBIAN_FRONTEND=noninteractive
        if ! ${SUDO[@]+"${SUDO[@]}"} apt-get install -y --no-install-recommends libb64-0d >&2; then
            log "apt-get install failed; running apt-get update first"
            ${SUDO[@]+"${SUDO[@]}"} apt-get update >&2 || die "apt-get update failed"
            ${SUDO[@]+"${SUDO[@]}"} apt-get install -y --no-install-recommends libb64-0d >&2 \
                || die "apt-get install libb64-0d failed"
        fi
        have_system_b64 || die "libb64-0d installed but libb64.so.0d is not in the linker cache"
    else
        # No root: unpack the .deb into PREFIX/lib instead.
        command -v dpkg-deb >/dev/null 2>&1 || die "not root, no sudo and no dpkg-deb: cannot install libb64-0d"
        log "not root: apt-get download libb64-0d and unpack it into $LIB_DIR"
        DEB_DIR="$(mktemp -d)"
        (cd "$DEB_DIR" && apt-get download libb64-0d >&2) \
            || die "apt-get download libb64-0d failed (not root, so apt-get update/install is not possible)"
        dpkg-deb -x "$DEB_DIR"/libb64-0d_*.deb "$DEB_DIR/x" || die "could not unpack the libb64-0d package"
        mkdir -p "$LIB_DIR"
        find "$DEB_DIR/x" -name 'libb64.so.0d*' -exec cp -P {} "$LIB_DIR/" \;
        rm -rf "$DEB_DIR"
        [[ -e "$LIB_DIR/libb64.so.0d" ]] || die "libb64-0d package did not contain libb64.so.0d"
    fi
fi

# --- 3. libcudart.so.12, from pip's nvidia-cuda-runtime-cu12 ----------------------------------
if [[ -e "$CUDART_LIB/libcudart.so.12" ]]; then
    log "libcudart.so.12 already in $CUDART_LIB"
else
    log "pip install --target $CUDART_TARGET $CUDART_SPEC"
    rm -rf "$CUDART_TARGET"
    "$PYTHON" -m pip install --quiet --no-deps --only-binary=:all: --target "$CUDART_TARGET" "$CUDART_SPEC" >&2 \
        || die "pip could not install $CUDART_SPEC into $CUDART_TARGET"
    [[ -e "$CUDART_LIB/libcudart.so.12" ]] || die "$CUDART_SPEC did not provide $CUDART_LIB/libcudart.so.12"
fi

# --- 4. wrapper ----------------------------------------------------------------------------------
mkdir -p "$PREFIX/bin"
cat >"$WRAPPER.tmp" <<EOF
#!/usr/bin/env bash
# Generated by scripts/install_perf_analyzer.sh: perf_analyzer from tritonclient $TRITONCLIENT_VERSION.
export LD_LIBRARY_PATH="$CUDART_LIB:$LIB_DIR\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
exec "$REAL_BIN" "\$@"
EOF
chmod 755 "$WRAPPER.tmp"
mv -f "$WRAPPER.tmp" "$WRAPPER"

# --- 5. check ------------------------------------------------------------------------------------
MISSING="$(LD_LIBRARY_PATH="$CUDART_LIB:$LIB_DIR" ldd "$REAL_BIN" 2>&1 | grep 'not found' || true)"
[[ -z "$MISSING" ]] || die "perf_analyzer still lacks shared libraries:
$MISSING"
HELP="$("$WRAPPER" --help 2>&1 || true)"
[[ "$HELP" == *--concurrency-range* ]] || die "'$WRAPPER --help' did not print perf_analyzer's usage:
$(head -n 20 <<<"$HELP")"

log "installed; use: $WRAPPER"
echo "$WRAPPER"
