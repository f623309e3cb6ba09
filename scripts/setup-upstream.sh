#!/usr/bin/env bash
# Install the published upstream Transfer Engine wheel into its own venv, for interop tests
# and benchmarks against our Rust engine.
#
#   scripts/setup-upstream.sh            # prints the venv's python path on the last line
#
# Environment:
#   UPSTREAM_VENV   venv location (default: $REPO/.venv-upstream)
#   UPSTREAM_REQS   the pin file (default: tests/interop/requirements-upstream.txt, the newest
#                   release; tests/interop/requirements-upstream-oldest.txt is the oldest we
#                   support, which scripts/test.sh installs into .venv-upstream-oldest)
#   PYTHON          interpreter that creates the venv (default: python3); CPython 3.10-3.13
#   SKIP_APT=1      do not touch Debian packages (they must already be there)
#
# Idempotent and non-interactive (CI runs it with no stdin). Everything it prints goes to
# stderr except the final line: the absolute path of the venv's python, so callers can do
#   UPSTREAM_PY=$(scripts/setup-upstream.sh)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${UPSTREAM_VENV:-$REPO/.venv-upstream}"
PYTHON="${PYTHON:-python3}"
REQS="${UPSTREAM_REQS:-$REPO/tests/interop/requirements-upstream.txt}"
DIST="mooncake-transfer-engine-non-cuda"
# Must match the pin in $REQS.
VERSION="$(sed -n "s/^${DIST}==\([^ ]*\).*/\1/p" "$REQS")"

log() { printf 'setup-upstream: %s\n' "$*" >&2; }
# shellcheck source=scripts/lib/locked-venv.sh
source "$REPO/scripts/lib/locked-venv.sh"
die() { log "ERROR: $*"; exit 1; }

[ -n "$VERSION" ] || die "no '${DIST}==' pin found in $REQS"

# --- Debian packages -------------------------------------------------------------------
# libibverbs1, libnuma1: engine.so links them directly (even for TCP).
# libcurl4: engine.so links it too (HTTP metadata); usually present already.
# iperf3: the single-stream socket baseline for benchmarks.
APT_PKGS=(libibverbs1 libnuma1 libcurl4 iperf3)

missing_pkgs() {
    local p
    for p in "${APT_PKGS[@]}"; do
        if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
            printf '%s\n' "$p"
        fi
    done
}

if [ "${SKIP_APT:-0}" != 1 ]; then
    mapfile -t MISSING < <(missing_pkgs)
    if [ "${#MISSING[@]}" -gt 0 ]; then
        SUDO=()
        if [ "$(id -u)" -ne 0 ]; then
            command -v sudo >/dev/null || die "need root (or sudo) to install: ${MISSING[*]}"
            SUDO=(sudo -n)
        fi
        export DEBIAN_FRONTEND=noninteractive
        APT_INSTALL=("${SUDO[@]}" apt-get install -y --no-install-recommends -o Dpkg::Use-Pty=0)
        log "installing Debian packages: ${MISSING[*]}"
        if ! "${APT_INSTALL[@]}" "${MISSING[@]}" </dev/null >&2; then
            log "apt-get install failed; running apt-get update and retrying"
            "${SUDO[@]}" apt-get update </dev/null >&2
            "${APT_INSTALL[@]}" "${MISSING[@]}" </dev/null >&2
        fi
    else
        log "Debian packages present: ${APT_PKGS[*]}"
    fi
fi

# --- venv --------------------------------------------------------------------------------
VPY="$VENV/bin/python"

import_check() {
    # Import the engine from a neutral directory so nothing in the repo shadows `mooncake`.
    (cd / && MC_FORCE_TCP=1 "$VPY" -c '
import sys
from importlib.metadata import version
from mooncake.engine import TransferEngine
v = version(sys.argv[1])
if v != sys.argv[2]:
    sys.exit(f"installed {v}, pinned {sys.argv[2]}")
' "$DIST" "$VERSION") >&2
}

if [ -x "$VPY" ] && import_check 2>/dev/null; then
    log "venv $VENV already has $DIST==$VERSION"
else
    if [ ! -x "$VPY" ]; then
        command -v "$PYTHON" >/dev/null || die "no interpreter '$PYTHON'"
        "$PYTHON" -c 'import sys; sys.exit(0 if (3, 10) <= sys.version_info[:2] <= (3, 13) else 1)' \
            || die "$PYTHON is $("$PYTHON" -V 2>&1); the upstream wheel exists for CPython 3.10-3.13 only"
        log "creating venv $VENV with $("$PYTHON" -V 2>&1)"
        "$PYTHON" -m venv "$VENV" >&2
    fi
    # A venv whose import check failed is installed again, whatever its stamp says.
    rm -f "$VENV/.requirements.sha256"
    PYTHON="$PYTHON" locked_venv "$VENV" "$REQS" "$DIST==$VERSION (no deps)" --no-deps
    import_check || die "installed, but 'from mooncake.engine import TransferEngine' fails"
fi

# --- transfer_engine_bench shipped in the wheel -------------------------------------------
PKG_DIR="$(cd / && "$VPY" -c 'import mooncake, os; print(os.path.dirname(mooncake.__file__))')"
BENCH="$PKG_DIR/transfer_engine_bench"
if [ -f "$BENCH" ]; then
    [ -x "$BENCH" ] || chmod +x "$BENCH"
    # gflags: --help exits 1, --version exits 0. 0.3.12's build crashes on --version: in a
    # subshell, so that the shell's "Segmentation fault" line goes with its stderr.
    if ("$BENCH" --version >/dev/null 2>&1; exit $?) 2>/dev/null; then
        log "upstream transfer_engine_bench: $BENCH (runs)"
    else
        log "upstream transfer_engine_bench: $BENCH (present, but --version failed)"
    fi
else
    log "upstream transfer_engine_bench: not shipped in this wheel"
fi

printf '%s\n' "$VPY"
