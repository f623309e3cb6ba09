#!/usr/bin/env bash
# The source build users on a platform without our wheel meet: the sdist installed with
# `pip install` into a clean venv, with no `protoc` reachable (a `protoc` first on PATH that
# fails the build if anything calls it, and PROTOC unset), then imported and a loopback
# transfer run with verified bytes.
#
#   scripts/test-sdist.sh [SDIST]   # default: `maturin sdist` of bindings/ now
#
# Cheap on purpose: the extension is built with the dev profile into the repository's
# target/, so dependencies compiled by the test steps are reused (the release profile is the
# wheel's business, tested by xtask/tests/reproducible.rs).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
log() { printf 'test-sdist: %s\n' "$*" >&2; }
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
# shellcheck source=scripts/lib/locked-venv.sh
source "$REPO/scripts/lib/locked-venv.sh"
TOOLS="${PY_VENV:-$REPO/.venv-test}"
locked_venv "$TOOLS" "$REPO/tests/python/requirements.txt" "the test tools (pytest, numpy, maturin)"

SDIST="${1:-}"
if [ -z "$SDIST" ]; then
    (cd "$REPO/bindings" && "$TOOLS/bin/maturin" sdist --out "$TMP/sdist" >&2)
    SDIST="$(echo "$TMP"/sdist/*.tar.gz)"
fi
[ -f "$SDIST" ] || { log "no sdist at $SDIST"; exit 1; }

mkdir -p "$TMP/bin"
printf '#!/bin/sh\necho "test-sdist: protoc was called: $*" >&2\nexit 1\n' >"$TMP/bin/protoc"
chmod +x "$TMP/bin/protoc"

# A clean venv: the build backend (maturin, hash-locked) and nothing of ours.
VENV="$TMP/venv"
locked_venv "$VENV" "$REPO/tests/python/requirements.txt" "maturin (the sdist's build backend)"
log "pip install $(basename "$SDIST") (no protoc reachable)"
env -u PROTOC PATH="$TMP/bin:$VENV/bin:$PATH" CARGO_TARGET_DIR="$REPO/target" \
    MATURIN_PEP517_ARGS="--profile dev" PIP_DISABLE_PIP_VERSION_CHECK=1 \
    "$VENV/bin/python" -m pip install --quiet --no-input --no-index --no-deps \
    --no-build-isolation "$SDIST" >&2

cd "$TMP"
"$VENV/bin/python" - <<'PY'
import ctypes
from mooncake.engine import TransferEngine

a, b = TransferEngine(), TransferEngine()
for e in (a, b):
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, TransferEngine.last_error()
n = 1 << 20
src = (ctypes.c_ubyte * n)(*([7, 1, 3, 9] * (n // 4)))
dst = (ctypes.c_ubyte * n)()
sa, da = ctypes.addressof(src), ctypes.addressof(dst)
assert a.register_memory(sa, n) == 0 and b.register_memory(da, n) == 0
assert a.transfer_sync_write(f"127.0.0.1:{b.get_rpc_port()}", sa, da, n) == 0, TransferEngine.last_error()
assert bytes(dst) == bytes(src), "the bytes that arrived differ"
print("test-sdist: the sdist's engine moved 1 MiB over loopback TCP, bytes verified")
PY
