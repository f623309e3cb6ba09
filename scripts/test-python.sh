#!/usr/bin/env bash
# The Python wheel's test suite: build the wheel once, install it into the test venv,
# run pytest (tests/python). Servers and peers listen on 127.0.0.1 only.
#
#   scripts/test-python.sh [pytest args...]
#
# Environment:
#   WHEEL            use this wheel instead of building one
#   PY_VENV          the test venv (default: $REPO/.venv-test)
#   UPSTREAM_PYTHON  python of the upstream wheel's venv, for the interop tests
#                    (default: $REPO/.venv-upstream/bin/python, made by scripts/setup-upstream.sh;
#                    without it the interop tests fail, saying so: nothing is skipped)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${PY_VENV:-$REPO/.venv-test}"
export PY_VENV="$VENV"
log() { printf 'test-python: %s\n' "$*" >&2; }

[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
# The Python glue is behind the `python` feature, which the workspace-wide lints skip.
log "clippy (bindings, python feature)"
(cd "$REPO" && cargo clippy -p mooncake-bindings --features python --all-targets --locked --no-deps -- -D warnings)

# The test venv (locked, hash-checked), also when $WHEEL comes from elsewhere.
# shellcheck source=scripts/lib/locked-venv.sh
source "$REPO/scripts/lib/locked-venv.sh"
locked_venv "$VENV" "$REPO/tests/python/requirements.txt" "the test tools (pytest, numpy, maturin)"

t0=$(date +%s)
WHEEL="${WHEEL:-$("$REPO/scripts/build-wheel.sh" | tail -n1)}"
t1=$(date +%s)
WHEEL="$(realpath "$WHEEL")"
log "wheel $WHEEL (built in $((t1 - t0)) s)"
PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/python" -m pip install --quiet --no-input \
    --no-deps --no-index --force-reinstall "$WHEEL" >&2
export WHEEL
if [ -z "${UPSTREAM_PYTHON:-}" ] && [ -x "$REPO/.venv-upstream/bin/python" ]; then
    export UPSTREAM_PYTHON="$REPO/.venv-upstream/bin/python"
fi
# From the tests' folder, so that the installed wheel (not bindings/python) is imported.
cd "$REPO/tests/python"
"$VENV/bin/python" -m pytest -p no:cacheprovider "$@"
