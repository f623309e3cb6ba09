#!/usr/bin/env bash
# devpi-server on loopback: the PyPI of the release publish tests (same duplicate-file rules).
#
#   scripts/release-devpi.sh start DIR   start a fresh server in DIR; print one JSON line:
#                                        {"url", "upload_url", "simple_url", "user", "password", "pid"}
#   scripts/release-devpi.sh stop DIR    stop it
#
# devpi-server and devpi-client come from a hash-locked venv (xtask/requirements-devpi.txt),
# made here if missing. The server listens on 127.0.0.1 only, in offline mode (no mirroring);
# the index is non-volatile, so a file name once uploaded can never change, as on PyPI.
#
# Environment: DEVPI_VENV (default $REPO/target/xtask/devpi-venv), PYTHON (default python3).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${DEVPI_VENV:-$REPO/target/xtask/devpi-venv}"
PYTHON="${PYTHON:-python3}"
LOCK="$REPO/xtask/requirements-devpi.txt"
log() { printf 'release-devpi: %s\n' "$*" >&2; }

# shellcheck source=scripts/lib/locked-venv.sh
source "$REPO/scripts/lib/locked-venv.sh"
install() { PYTHON="$PYTHON" locked_venv "$VENV" "$LOCK" "devpi-server and devpi-client"; }

start() {
    local dir="$1" port url user=release password
    install
    rm -rf "$dir" && mkdir -p "$dir"
    password="pw-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
    port="$("$VENV/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    url="http://127.0.0.1:$port"
    "$VENV/bin/devpi-init" --serverdir "$dir/server" --root-passwd "root-$password" >"$dir/init.log" 2>&1
    "$VENV/bin/devpi-server" --serverdir "$dir/server" --host 127.0.0.1 --port "$port" --offline-mode \
        >"$dir/server.log" 2>&1 </dev/null &
    echo $! >"$dir/pid"
    for _ in $(seq 1 120); do
        if "$VENV/bin/python" -c "import urllib.request; urllib.request.urlopen('$url/+api', timeout=1)" 2>/dev/null; then
            break
        fi
        kill -0 "$(cat "$dir/pid")" 2>/dev/null || { log "devpi-server died:"; cat "$dir/server.log" >&2; exit 1; }
        sleep 0.5
    done
    export DEVPI_CLIENTDIR="$dir/client"
    {
        "$VENV/bin/devpi" use "$url"
        "$VENV/bin/devpi" user -c "$user" "password=$password"
        "$VENV/bin/devpi" login "$user" --password "$password"
        "$VENV/bin/devpi" index -c "$user/pypi" bases= volatile=False
    } >"$dir/client.log" 2>&1 || { log "cannot set up the index:"; cat "$dir/client.log" >&2; exit 1; }
    printf '{"url": "%s", "upload_url": "%s/%s/pypi/", "simple_url": "%s/%s/pypi/+simple/", "user": "%s", "password": "%s", "pid": %s}\n' \
        "$url" "$url" "$user" "$url" "$user" "$user" "$password" "$(cat "$dir/pid")"
}

stop() {
    local dir="$1" pid
    pid="$(cat "$dir/pid" 2>/dev/null)" || return 0
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.25; done
    kill -9 "$pid" 2>/dev/null || true
}

case "${1:-}" in
    start) start "${2:?usage: $0 start DIR}" ;;
    stop) stop "${2:?usage: $0 stop DIR}" ;;
    *) echo "usage: $0 start|stop DIR" >&2; exit 2 ;;
esac
