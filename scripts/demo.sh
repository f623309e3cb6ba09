#!/usr/bin/env bash
# The main job until the release pipeline lands: two engines in two processes
# on loopback, one target and one initiator, moving 4 MiB blocks (batch 64)
# both ways for a few seconds and printing the throughput.
#   DURATION=5 BLOCK=4194304 BATCH=64 scripts/demo.sh
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BENCH="${BENCH:-$REPO/target/release/transfer_engine_bench}"
export MC_LOG_LEVEL="${MC_LOG_LEVEL:-WARNING}"
DURATION="${DURATION:-5}" BLOCK="${BLOCK:-4194304}" BATCH="${BATCH:-64}"
[ -x "$BENCH" ] || { echo "demo: $BENCH not built; run: cargo build --release -p transfer-engine-bench" >&2; exit 1; }

out="$(mktemp)"; trap 'kill "$tpid" 2>/dev/null || true; wait 2>/dev/null || true; rm -f "$out"' EXIT
"$BENCH" --mode=target --local_server_name=127.0.0.1 --buffer_size=$((BLOCK * BATCH)) >"$out" &
tpid=$!
for _ in $(seq 100); do grep -q '^segment_id=' "$out" && break; kill -0 "$tpid" || exit 1; sleep 0.1; done
seg="$(sed -n 's/^segment_id=//p' "$out")"
[ -n "$seg" ] || { echo "demo: target did not start" >&2; exit 1; }
echo "target ready at $seg"
for op in write read; do
    printf '%-5s ' "$op"
    "$BENCH" --local_server_name=127.0.0.1 --segment_id="$seg" --operation="$op" \
        --block_size="$BLOCK" --batch_size="$BATCH" --threads=1 --duration="$DURATION" \
        --buffer_size=$((BLOCK * BATCH))
done
