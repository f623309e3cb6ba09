#!/usr/bin/env bash
# Validate the GitHub Actions workflows (workflows/ and .github/workflows/), offline:
#   - check-jsonschema --builtin-schema vendor.github-workflows on every file,
#   - zizmor --offline (pedantic persona) with no findings,
#   - the two directories identical (a diff names the file that drifted),
#   - the release policy of issue 6 and the workflow's own shell steps, run here
#     (tests/workflows/test_workflows.py; needs bash, git and jq).
#
#   scripts/test-workflows.sh [pytest args]
#
# The linters come from tests/workflows/requirements.txt (hash-locked, binary wheels only),
# installed into $WORKFLOWS_VENV (default .venv-workflows) the first time or when the lock
# changes; after that the script needs no network. Non-interactive; exits non-zero on any
# failure.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${WORKFLOWS_VENV:-$REPO/.venv-workflows}"
PYTHON="${PYTHON:-python3}"
REQS="$REPO/tests/workflows/requirements.txt"
log() { printf 'test-workflows: %s\n' "$*" >&2; }

# shellcheck source=scripts/lib/locked-venv.sh
source "$REPO/scripts/lib/locked-venv.sh"
PYTHON="$PYTHON" locked_venv "$VENV" "$REQS" "the linters (check-jsonschema, zizmor, pytest)"

for tool in git jq; do
    command -v "$tool" >/dev/null || { log "$tool is missing (apt-get install $tool)"; exit 1; }
done
export PATH="$VENV/bin:$PATH" PYTHONDONTWRITEBYTECODE=1
cd "$REPO"
log "$(zizmor --version), $(check-jsonschema --version)"
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/workflows "$@" </dev/null
