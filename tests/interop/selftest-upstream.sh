#!/usr/bin/env bash
# Upstream <-> upstream check of the interop harness (tests/interop/upstream_peer.py):
# a pattern-filled upstream target, an upstream initiator that reads it, writes, reads back
# and verifies (single, batch, unaligned, rejected requests), then the target's own view of
# its buffer (dump) must equal what the initiator says it left there.
#
#   tests/interop/selftest-upstream.sh     # needs scripts/setup-upstream.sh to have run
#
# Environment: UPSTREAM_PY (default: what scripts/setup-upstream.sh prints), SIZE (bytes,
# default 16777216). Prints "N passed, N failed" at the end; exit 1 on any failure.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PEER="$REPO/tests/interop/upstream_peer.py"
SIZE="${SIZE:-16777216}"
UPSTREAM_PY="${UPSTREAM_PY:-$("$REPO/scripts/setup-upstream.sh" | tail -n1)}"
export MC_FORCE_TCP=1

WORK="$(mktemp -d)"
TARGET_PID=""
cleanup() {
    if [ -n "$TARGET_PID" ]; then
        kill -TERM "$TARGET_PID" 2>/dev/null || true
        wait "$TARGET_PID" 2>/dev/null || true
    fi
    exec 7>&- 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

PASSED=0
FAILED=0
check() {  # check NAME CONDITION_RESULT(0/1) DETAIL
    if [ "$2" = 0 ]; then PASSED=$((PASSED + 1)); echo "ok   $1"
    else FAILED=$((FAILED + 1)); echo "FAIL $1: $3"; fi
}
json_get() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }

# Target: commands on a fifo (fd 7), answers on a file.
mkfifo "$WORK/in"
"$UPSTREAM_PY" "$PEER" target --size "$SIZE" --pattern-seed 42 <"$WORK/in" >"$WORK/out" 2>"$WORK/target.err" &
TARGET_PID=$!
exec 7>"$WORK/in"

# Wait (60 s at most, for a loaded machine) for the hello line, complete with its newline.
for _ in $(seq 600); do [ "$(wc -l <"$WORK/out")" -ge 1 ] && break; sleep 0.1; done
HELLO="$(head -n1 "$WORK/out")"
[ -n "$HELLO" ] || { cat "$WORK/target.err" >&2; echo "target did not start"; exit 1; }
SID="$(json_get "$HELLO" session_id)"
BUF="$(json_get "$HELLO" buffer)"
echo "target $SID buffer $BUF size $SIZE"

ask() {  # ask COMMAND: send one command, print the one-line answer
    local n
    n="$(wc -l <"$WORK/out")"
    echo "$1" >&7
    for _ in $(seq 1200); do  # 60 s at most
        [ "$(wc -l <"$WORK/out")" -gt "$n" ] && { sed -n "$((n + 1))p" "$WORK/out"; return 0; }
        sleep 0.05
    done
    echo "timeout"
}

check "target serves commands" "$([ "$(ask ping)" = pong ]; echo $?)" "no pong"
check "target holds pattern(42)" "$([ "$(ask "check 0 $SIZE 42")" = ok ]; echo $?)" "pattern mismatch"

RC=0
RESULT="$("$UPSTREAM_PY" "$PEER" initiator --peer "$SID" --peer-buffer "$BUF" --size "$SIZE" \
    --seed 7 --expect-peer-seed 42 --check-reject 2>"$WORK/initiator.err" | tail -n1)" || RC=$?
echo "initiator: $RESULT"
check "initiator exit 0" "$([ "$RC" = 0 ]; echo $?)" "exit $RC (see stderr below)"
[ "$RC" = 0 ] || tail -n 20 "$WORK/initiator.err" >&2

if [ "$RC" = 0 ]; then
    FINAL="$(json_get "$RESULT" final_peer_sha256)"
    DUMP="$(ask "dump 0 $SIZE")"
    check "target dump == initiator's final_peer_sha256" "$([ "$DUMP" = "$FINAL" ]; echo $?)" "$DUMP != $FINAL"
    check "target holds pattern(7) after the run" "$([ "$(ask "check 0 $SIZE 7")" = ok ]; echo $?)" "mismatch"
fi

exec 7>&-   # stdin closes: the target exits 0
TRC=0; wait "$TARGET_PID" || TRC=$?; TARGET_PID=""
check "target exits 0 when stdin closes" "$([ "$TRC" = 0 ]; echo $?)" "exit $TRC"

echo "$PASSED passed, $FAILED failed"
[ "$FAILED" = 0 ]
