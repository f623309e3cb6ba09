#!/usr/bin/env bash
# Our transfer_engine_bench over RDMA through the soft NIC (engine/tests/soft_nic/: a
# SOFTWARE stand-in for libibverbs.so.1, no hardware), against the raw reference of the
# same run: the soft NIC's `selftest bench`, a process_vm_writev loop between two
# processes (the copy the soft NIC itself does) over the same working set as our initiator
# (THREADS x BATCH x BLOCK bytes: on this VM the copy rate falls steeply once that leaves
# the caches, so a cache-hot reference would not measure the engine). Prints, per case,
# ours, raw and ours/raw.
#
#   cargo build --release -p transfer-engine-bench
#   scripts/bench-rdma-soft-nic.sh [BENCH_BIN]
#
# BENCH_BIN defaults to $CARGO_TARGET_DIR/release/transfer_engine_bench (or target/).
# Environment: HCAS (soft HCAs, default soft_0), DURATION (seconds per run, default 5),
# BATCH (requests per batch; default 32, fewer for large blocks so that a batch stays
# within 16 MiB: 4 for 4 MiB), THREADS (default 1), BLOCKS (default "65536 4194304"), OPS
# (default "write read"), ROUNDS (rounds of raw-then-ours per case, the best of each is
# kept, default 3), KEEP=1 keeps the work directory (logs, sysfs tree). MC_* variables
# (MC_SLICE_SIZE, MC_NUM_QP_PER_EP, ...) reach our engine.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${1:-${CARGO_TARGET_DIR:-$ROOT/target}/release/transfer_engine_bench}"
[ -x "$BIN" ] || { echo "no $BIN: cargo build --release -p transfer-engine-bench" >&2; exit 1; }
HCAS="${HCAS:-soft_0}" DURATION="${DURATION:-5}" THREADS="${THREADS:-1}"
BLOCKS="${BLOCKS:-65536 4194304}" OPS="${OPS:-write read}" ROUNDS="${ROUNDS:-3}"
SRC="$ROOT/engine/tests/soft_nic"
WORK="$(mktemp -d)"
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    [ -n "${KEEP:-}" ] && echo "work directory kept: $WORK" >&2 || rm -rf "$WORK"
}
trap cleanup EXIT

# --- the soft NIC and its self-test (flags as engine/tests/soft_nic/mod.rs builds them) ---
CC="${CC:-cc}"
"$CC" -shared -fPIC -O2 -pthread -Wall -Wextra -Werror -fvisibility=hidden \
    -Wl,-soname,libibverbs.so.1 "-Wl,--version-script=$SRC/softnic.map" \
    -o "$WORK/libibverbs.so.1" "$SRC/softnic.c"
"$CC" -O2 -pthread -Wall -Wextra -Werror -o "$WORK/selftest" "$SRC/selftest.c" -libverbs

# --- a synthetic sysfs tree saying what the soft NIC lists (SoftFabric's layout) ---------
SYS="$WORK/sys"
IFS=, read -ra HCA_LIST <<< "$HCAS"
mkdir -p "$SYS/devices/system/node/node0" "$SYS/class/infiniband" "$SYS/bus/pci/devices"
for i in "${!HCA_LIST[@]}"; do
    h="${HCA_LIST[$i]}"
    bdf="$(printf '0000:%02x:00.0' $((i + 16)))"
    pci="pci0000:00/$(printf '0000:00:%02x.0' $((i + 1)))/$bdf"
    port="$SYS/devices/$pci/infiniband/$h/ports/1"
    mkdir -p "$port/gids" "$port/gid_attrs/types" "$port/gid_attrs/ndevs"
    echo 0 > "$SYS/devices/$pci/numa_node"
    echo "4: ACTIVE" > "$port/state"
    echo "5: LinkUp" > "$port/phys_state"
    echo Ethernet > "$port/link_layer"
    echo 0x0 > "$port/lid"
    printf 'fe80:0000:0000:0000:0000:0000:0000:%04x\n' $((i + 1)) > "$port/gids/0"
    printf '0000:0000:0000:0000:0000:ffff:7f00:%02x01\n' $((i + 1)) > "$port/gids/1"
    echo "IB/RoCE v1" > "$port/gid_attrs/types/0"
    echo "RoCE v2" > "$port/gid_attrs/types/1"
    echo lo > "$port/gid_attrs/ndevs/0"
    echo lo > "$port/gid_attrs/ndevs/1"
    ln -s ../.. "$SYS/devices/$pci/infiniband/$h/device"
    ln -s "../../devices/$pci/infiniband/$h" "$SYS/class/infiniband/$h"
    ln -s "../../../devices/$pci" "$SYS/bus/pci/devices/$bdf"
done

fabric() {  # fabric NAME: a fresh registry directory for one pair of processes
    mkdir -p "$WORK/fabric-$1"
    echo "$WORK/fabric-$1"
}
export MC_IBVERBS_PATH="$WORK/libibverbs.so.1" MC_SYSFS_ROOT="$SYS" SOFTNIC_HCAS="$HCAS"
export MC_FORCE_HCA=1 MC_LOG_LEVEL="${MC_LOG_LEVEL:-warning}"
unset MC_FORCE_TCP MC_TE_FILTERS MOONCAKE_RDMA_DEVICES

BUFFER=$((256 << 20))
batch_for() {  # batch_for BLOCK -> requests per batch
    if [ -n "${BATCH:-}" ]; then echo "$BATCH"; return; fi
    local b=$(( (16 << 20) / $1 ))
    [ "$b" -gt 32 ] && b=32
    [ "$b" -lt 1 ] && b=1
    echo "$b"
}

raw() {  # raw SIZE -> GB/s of the raw process_vm_writev loop (best of selftest's 3 rounds)
    local iters=$(( (4 << 30) / $1 )) span=$((THREADS * $(batch_for "$1") * $1))
    [ "$iters" -gt 20000 ] && iters=20000
    [ "$span" -gt "$BUFFER" ] && span=$BUFFER
    local line
    line="$(SOFTNIC_DIR="$(fabric "raw-$1-$RANDOM")" LD_LIBRARY_PATH="$WORK" \
        "$WORK/selftest" bench "$1" "$iters" "$span")"
    echo "  selftest: $line" >&2
    sed -n 's/.*raw process_vm_writev \([0-9.]*\) GB\/s.*/\1/p' <<< "$line"
}

ours() {  # ours OP BLOCK -> GB/s of our initiator against our target, protocol rdma
    local dir log seg out
    dir="$(fabric "ours-$1-$2-$RANDOM")"
    log="$dir/target.log"
    SOFTNIC_DIR="$dir" "$BIN" --mode=target --protocol=rdma --device_name="$HCAS" \
        --local_server_name=127.0.0.1 --buffer_size=$BUFFER >"$log" 2>&1 </dev/null &
    local tpid=$!
    PIDS+=("$tpid")
    seg=""
    for _ in $(seq 300); do
        seg="$(sed -n 's/^segment_id=//p' "$log" 2>/dev/null)"
        [ -n "$seg" ] && break
        kill -0 "$tpid" 2>/dev/null || break
        sleep 0.1
    done
    [ -n "$seg" ] || { echo "target did not start:" >&2; cat "$log" >&2; exit 1; }
    grep -qx 'transport=rdma' "$log" || { echo "target is not on RDMA:" >&2; cat "$log" >&2; exit 1; }
    out="$(SOFTNIC_DIR="$dir" "$BIN" --mode=initiator --protocol=rdma --device_name="$HCAS" \
        --local_server_name=127.0.0.1 --segment_id="$seg" --operation="$1" --block_size="$2" \
        --batch_size="$(batch_for "$2")" --threads="$THREADS" --duration="$DURATION" \
        --buffer_size=$BUFFER --json)" || { echo "$out" >&2; exit 1; }
    kill "$tpid" 2>/dev/null || true
    wait "$tpid" 2>/dev/null || true
    grep -qx 'transport=rdma' <<< "$out" || { echo "initiator is not on RDMA: $out" >&2; exit 1; }
    echo "  ours: $(grep '^Test completed' <<< "$out")" >&2
    sed -n 's/.*"gb_per_s":\([0-9.e+-]*\).*/\1/p' <<< "$out" | tail -n1
}

echo "date $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), HCAS=$HCAS threads=$THREADS duration=${DURATION}s rounds=$ROUNDS"
printf '%-6s %9s %6s %12s %12s %8s\n' op block batch "ours GB/s" "raw GB/s" ours/raw
for block in $BLOCKS; do
    for op in $OPS; do
        best_ours=0 best_raw=0
        for _ in $(seq "$ROUNDS"); do
            r="$(raw "$block")"
            o="$(ours "$op" "$block")"
            best_raw="$(awk -v a="$best_raw" -v b="$r" 'BEGIN { print (b > a) ? b : a }')"
            best_ours="$(awk -v a="$best_ours" -v b="$o" 'BEGIN { print (b > a) ? b : a }')"
        done
        printf '%-6s %9s %6s %12.2f %12.2f %7.0f%%\n' "$op" "$block" "$(batch_for "$block")" \
            "$best_ours" "$best_raw" \
            "$(awk -v a="$best_ours" -v b="$best_raw" 'BEGIN { print 100 * a / b }')"
    done
done
