#!/usr/bin/env bash
# Build the Python wheel (bindings/, maturin) once into target/wheels/.
#
#   scripts/build-wheel.sh          # prints the wheel's absolute path on the last line
#
# maturin comes from the hash-locked tool venv (tests/python/requirements.txt), made here
# if missing. The wheel is abi3 (CPython >= 3.9). Platform tag: plain `linux` for now
# (--compatibility linux); the release issue pins manylinux_2_35.
#
# Environment:
#   PY_VENV   the tool/test venv (default: $REPO/.venv-test)
#   PYTHON    interpreter that creates it (default: python3)
#   PROFILE   cargo profile passed to maturin (default: wheel, the profile `cargo xtask release`
#             builds the published wheel with: fat LTO, one codegen unit, opt-level "s"; so the
#             wheel the tests install is the one users get). Cold build of the extension on a
#             2-core host: wheel 2m16s (156 s CPU), release 3m24s (205 s CPU): no CI time lost.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${PY_VENV:-$REPO/.venv-test}"
PYTHON="${PYTHON:-python3}"
REQS="$REPO/tests/python/requirements.txt"
OUT="$REPO/target/wheels"
log() { printf 'build-wheel: %s\n' "$*" >&2; }

[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"

# --- tool venv (locked, hash-checked) ---------------------------------------------------
# shellcheck source=scripts/lib/locked-venv.sh
source "$REPO/scripts/lib/locked-venv.sh"
PYTHON="$PYTHON" locked_venv "$VENV" "$REQS" "the test tools (pytest, numpy, maturin)"

# --- wheel ---------------------------------------------------------------------------
mkdir -p "$OUT"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
PROFILE="${PROFILE:-wheel}"
log "maturin build (profile $PROFILE)"
(cd "$REPO/bindings" && "$VENV/bin/maturin" build --locked --profile "$PROFILE" \
    --compatibility linux --out "$TMP" >&2)
shopt -s nullglob
built=("$TMP"/*.whl)
[ "${#built[@]}" -eq 1 ] || { log "expected one wheel, got: ${built[*]:-none}"; exit 1; }
name="$(basename "${built[0]}")"
mv -f "${built[0]}" "$OUT/$name"
log "built $OUT/$name ($(du -h "$OUT/$name" | cut -f1))"
printf '%s\n' "$OUT/$name"
