#!/usr/bin/env bash
# Runs a command next to a throw-away etcd: starts Debian's etcd (package etcd-server,
# installed by scripts/install-deps.sh) on 127.0.0.1 on free ports with a temporary data
# directory, waits until it is healthy, runs "$@" with MC_METADATA_SERVER set to
# etcd://127.0.0.1:<port>, then stops etcd and removes its data, whatever the command did.
#
#   scripts/etcd-local.sh transfer_engine_bench --mode=target ...
#   scripts/etcd-local.sh bash -c 'echo $MC_METADATA_SERVER; sleep 60'
#
# (The engine's own etcd tests, engine/tests/etcd_metadata.rs, start and stop etcd the
# same way from Rust, since they also kill and restart it mid-test.)
set -euo pipefail
log() { printf 'etcd-local: %s\n' "$*" >&2; }
[ $# -gt 0 ] || { echo "usage: $0 COMMAND [ARGS...]" >&2; exit 2; }
command -v etcd >/dev/null || { log "etcd not found: run scripts/install-deps.sh (Debian package etcd-server)"; exit 1; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
CLIENT_PORT="$(free_port)"; PEER_PORT="$(free_port)"
DATA="$(mktemp -d -t etcd-local.XXXXXX)"
etcd --name etcd-local --data-dir "$DATA" \
    --listen-client-urls "http://127.0.0.1:$CLIENT_PORT" --advertise-client-urls "http://127.0.0.1:$CLIENT_PORT" \
    --listen-peer-urls "http://127.0.0.1:$PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$PEER_PORT" \
    --initial-cluster "etcd-local=http://127.0.0.1:$PEER_PORT" >"$DATA.log" 2>&1 &
ETCD_PID=$!
cleanup() { kill "$ETCD_PID" 2>/dev/null || true; wait "$ETCD_PID" 2>/dev/null || true; rm -rf "$DATA" "$DATA.log"; }
trap cleanup EXIT

deadline=$((SECONDS + 30))
until curl -fsS "http://127.0.0.1:$CLIENT_PORT/health" 2>/dev/null | grep -q true; do
    if ! kill -0 "$ETCD_PID" 2>/dev/null || [ "$SECONDS" -ge "$deadline" ]; then
        log "etcd did not become healthy:"; tail -n 20 "$DATA.log" >&2; exit 1
    fi
    sleep 0.1
done
log "etcd on 127.0.0.1:$CLIENT_PORT (data $DATA)"
export MC_METADATA_SERVER="etcd://127.0.0.1:$CLIENT_PORT"
"$@"
