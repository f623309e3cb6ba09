#!/usr/bin/env bash
# The standalone binaries as a user gets them from a release: each cargo-dist installer run
# against the release directory served on loopback (as it would download from the GitHub
# release), into a fresh CARGO_HOME; then the installed `mooncake-doctor --json`, a
# `transfer_engine_bench` target and initiator moving bytes over loopback, and
# `mooncake_master` answering `/health`. An installer given an archive that is not the
# release's must refuse it.
#
#   scripts/test-binaries.sh RELEASE_DIR   # e.g. the dry run's, $XTASK_REPRO_KEEP_DIST
set -euo pipefail
log() { printf 'test-binaries: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

DIST="${1:?usage: scripts/test-binaries.sh RELEASE_DIR}"
shopt -s nullglob
installers=("$DIST"/*-installer.sh)
archives=("$DIST"/*-x86_64-unknown-linux-gnu.tar.xz)
shopt -u nullglob
[ "${#installers[@]}" -eq 3 ] || die "expected 3 installers in $DIST, found ${#installers[@]}"
[ "${#archives[@]}" -eq 3 ] || die "expected 3 archives in $DIST, found ${#archives[@]}"

TMP="$(mktemp -d)"
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$TMP"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
serve() { # DIR -> the URL of an HTTP server of DIR on loopback
    local port
    port="$(free_port)"
    python3 -m http.server --bind 127.0.0.1 --directory "$1" "$port" >"$TMP/http-$port.log" 2>&1 &
    PIDS+=("$!")
    for _ in $(seq 50); do
        curl -fsS -o /dev/null "http://127.0.0.1:$port/" 2>/dev/null && { echo "http://127.0.0.1:$port"; return; }
        sleep 0.1
    done
    die "the HTTP server of $1 did not start"
}
install_from() { # URL INSTALLER CARGO_HOME [--quiet]
    HOME="$TMP/home" CARGO_HOME="$3" INSTALLER_DOWNLOAD_URL="$1" INSTALLER_NO_MODIFY_PATH=1 \
        sh "$2" "${@:4}"
}

URL="$(serve "$DIST")"
BIN="$TMP/cargo-home/bin"
mkdir -p "$TMP/home"
for i in "${installers[@]}"; do
    log "$(basename "$i") from $URL"
    install_from "$URL" "$i" "$TMP/cargo-home" --quiet || die "$(basename "$i") failed"
done
for b in mooncake-doctor transfer_engine_bench mooncake_master; do
    [ -x "$BIN/$b" ] || die "the installers put no $b in $BIN"
done

log "mooncake-doctor --json"
rc=0
"$BIN/mooncake-doctor" --json >"$TMP/doctor.json" 2>"$TMP/doctor.err" || rc=$?
python3 - "$TMP/doctor.json" "$rc" <<'PY' || die "mooncake-doctor --json (exit $rc): $(cat "$TMP/doctor.err")"
import json, sys
lines = [l for l in open(sys.argv[1]) if l.strip()]
report = json.loads(lines[-1])
assert report["checks"], report
assert report["exit_code"] == int(sys.argv[2]), (report["exit_code"], sys.argv[2])
print("test-binaries: doctor:", ", ".join(f"{c['id']}={c['status']}" for c in report["checks"]), file=sys.stderr)
PY

log "transfer_engine_bench over loopback"
"$BIN/transfer_engine_bench" --mode=target --local_server_name=127.0.0.1 --buffer_size=67108864 \
    >"$TMP/target.log" 2>&1 </dev/null &
PIDS+=("$!")
SEG=""
for _ in $(seq 100); do
    SEG="$(grep -o 'segment_id=[^ ]*' "$TMP/target.log" | head -n1 | cut -d= -f2 || true)"
    [ -n "$SEG" ] && break
    sleep 0.1
done
[ -n "$SEG" ] || die "the bench target printed no segment_id: $(cat "$TMP/target.log")"
"$BIN/transfer_engine_bench" --mode=initiator --local_server_name=127.0.0.1 --segment_id="$SEG" \
    --operation=write --buffer_size=67108864 --block_size=65536 --batch_size=16 --threads=1 \
    --duration=1 --json >"$TMP/initiator.log" 2>&1 || die "the bench initiator failed: $(cat "$TMP/initiator.log")"
python3 - "$TMP/initiator.log" <<'PY' || die "the bench printed no figures: $(cat "$TMP/initiator.log")"
import json, sys
line = [l for l in open(sys.argv[1]) if l.startswith("{")][-1]
r = json.loads(line)
moved = r.get("bytes") or r.get("total_bytes") or 0
assert moved > 0, r
print(f"test-binaries: bench moved {moved} bytes", file=sys.stderr)
PY

log "mooncake_master /health"
RPC="$(free_port)"; METRICS="$(free_port)"
"$BIN/mooncake_master" --rpc_address=127.0.0.1 --rpc_port="$RPC" --metrics_port="$METRICS" \
    >"$TMP/master.log" 2>&1 </dev/null &
PIDS+=("$!")
ok=""
for _ in $(seq 100); do
    if curl -fsS "http://127.0.0.1:$METRICS/health" >"$TMP/health.json" 2>/dev/null; then ok=1; break; fi
    sleep 0.1
done
[ -n "$ok" ] || die "mooncake_master did not answer /health: $(cat "$TMP/master.log")"
grep -q '"service_ready": *true' "$TMP/health.json" || die "mooncake_master /health: $(cat "$TMP/health.json")"

log "an installer given an archive that is not the release's"
mkdir -p "$TMP/tampered"
cp "${archives[@]}" "$TMP/tampered/"
victim="$TMP/tampered/$(basename "${archives[0]}")"
printf 'x' >>"$victim"
BAD_URL="$(serve "$TMP/tampered")"
app="$(basename "${archives[0]}" -x86_64-unknown-linux-gnu.tar.xz)"
if install_from "$BAD_URL" "$DIST/$app-installer.sh" "$TMP/cargo-home-2" >"$TMP/tampered.log" 2>&1; then
    die "$app-installer.sh installed a tampered archive"
fi
grep -qi "checksum mismatch" "$TMP/tampered.log" || die "$app-installer.sh failed without naming the checksum: $(cat "$TMP/tampered.log")"
[ ! -e "$TMP/cargo-home-2/bin" ] || [ -z "$(ls -A "$TMP/cargo-home-2/bin")" ] || die "a tampered install left files in $TMP/cargo-home-2/bin"
log "3 installers, 3 binaries run, a tampered archive refused"
