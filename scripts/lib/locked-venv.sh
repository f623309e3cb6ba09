# Sourced by the scripts that need Python tools: one way to make a venv from a hash-locked
# requirements file (pip-compile --generate-hashes), instead of a copy in each script.
#
#   source "$REPO/scripts/lib/locked-venv.sh"
#   locked_venv VENV LOCK WHAT [pip install args...]
#
# Creates VENV with $PYTHON (default python3) if it has no interpreter, then installs LOCK
# (--require-hashes, binary wheels only, plus the extra args) when VENV was never installed
# from this LOCK: the lock's sha256 is kept in VENV/.requirements.sha256, so an unchanged lock
# costs nothing and needs no network. WHAT names the tools in the log line.

locked_venv() {
    local venv="$1" lock="$2" what="$3" stamp want
    shift 3
    stamp="$venv/.requirements.sha256"
    want="$(sha256sum "$lock" | cut -d' ' -f1)"
    if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
        return 0
    fi
    if [ ! -x "$venv/bin/python" ]; then
        printf 'locked-venv: creating %s with %s\n' "$venv" "${PYTHON:-python3}" >&2
        "${PYTHON:-python3}" -m venv "$venv" >&2
    fi
    printf 'locked-venv: installing %s (%s, hash-checked) into %s\n' "$what" "${lock##*/}" "$venv" >&2
    PIP_DISABLE_PIP_VERSION_CHECK=1 "$venv/bin/python" -m pip install --quiet --no-input \
        --require-hashes --only-binary=:all: "$@" -r "$lock" >&2
    echo "$want" >"$stamp"
}
