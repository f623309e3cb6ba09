#!/usr/bin/env bash
# Upstream's transfer_engine_bench over the soft NIC: a target and an initiator,
# protocol rdma, P2P handshake. Run inside the namespace of run-in-ns.sh:
#
#   unshare -rm engine/tests/soft_nic/upstream/run-in-ns.sh \
#       engine/tests/soft_nic/upstream/bench.sh BENCH_BINARY [BLOCK [BATCH [THREADS [SECONDS [OP]]]]]
#
# with the fabric's variables set (SOFTNIC_HCAS, SOFTNIC_DIR, MC_SYSFS_ROOT) and the
# soft NIC's directory first on LD_LIBRARY_PATH. BENCH_BINARY is
# <venv>/lib/python3.*/site-packages/mooncake/transfer_engine_bench. Prints the
# initiator's "Test completed" line; the target's log goes to $SOFTNIC_DIR/target.log.
set -euo pipefail
BENCH=${1:?usage: bench.sh BENCH_BINARY [BLOCK [BATCH [THREADS [SECONDS [OP]]]]]}
BLOCK=${2:-65536} BATCH=${3:-32} THREADS=${4:-1} SECONDS_=${5:-5} OP=${6:-write}
DEVICES=${SOFTNIC_HCAS:-soft_0}
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:$(dirname "$BENCH")"
LOG="${SOFTNIC_DIR:?}/target.log"
"$BENCH" --mode=target --metadata_server=P2PHANDSHAKE --protocol=rdma \
    --device_name="$DEVICES" --local_server_name=127.0.0.1:13001 \
    --buffer_size=$((256 << 20)) >"$LOG" 2>&1 &
TARGET=$!
trap 'kill "$TARGET" 2>/dev/null || true' EXIT
PORT=""
for _ in $(seq 100); do
    PORT=$(grep -o 'listening on [0-9.]*:[0-9]*' "$LOG" | head -n1 | sed 's/.*://') || true
    [ -n "$PORT" ] && break
    sleep 0.1
done
[ -n "$PORT" ] || { echo "bench.sh: the target did not start; see $LOG" >&2; exit 1; }
"$BENCH" --mode=initiator --metadata_server=P2PHANDSHAKE --protocol=rdma \
    --device_name="$DEVICES" --local_server_name=127.0.0.1:13002 \
    --segment_id="127.0.0.1:$PORT" --operation="$OP" --block_size="$BLOCK" \
    --batch_size="$BATCH" --threads="$THREADS" --duration="$SECONDS_" \
    --buffer_size=$((256 << 20)) 2>&1 | grep 'Test completed'
