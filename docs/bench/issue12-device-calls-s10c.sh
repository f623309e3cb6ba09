#!/usr/bin/env bash
# Session 10 (2026-12-01), third device call of issue 12, nvidia-h200 (16 CPUs), the build
# with the final defaults (lanes one per CPU up to 16, 1 MiB stripes for host memory and
# 4 MiB at least for device memory):
#  1. every case, upstream 0.3.14 (`MC_FORCE_TCP=1`) against `new` (16 lanes here) and
#     `l12` (the same build with MC_TCP_LANES_PER_PEER=12), 2 rounds, order rotated;
#  2. GPU (H200) memory against host memory over TCP with the new wheel
#     (`.gpucarry-s10/site`): defaults, and 8 lanes, 2 rounds each.
#
#   bash docs/bench/issue12-device-calls-s10c.sh
set -uo pipefail
H=$PWD/.gpucarry-s10
O="${OUT:-/tmp/s10-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
BENCH_REPO=$PWD PEER_PY=tests/interop/upstream_peer.py OUT_DIR=/tmp/s10/final \
    OURS="new=$H/new l12=$H/new@MC_TCP_LANES_PER_PEER=12" ROUNDS=2 DURATION=2 \
    timeout 300 bash scripts/bench-compare.sh --gpu-host 2>/tmp/final.err
cp /tmp/s10/final/results.jsonl "$O/final.jsonl"; tail -n 2 /tmp/final.err
export MC_FORCE_TCP=1 MC_DISABLE_IPC=1 MC_LOG_LEVEL=warn
for round in 1 2; do
    for lanes in 16 8; do
        echo "== gpu round $round lanes $lanes"
        MC_TCP_LANES_PER_PEER=$lanes PYTHONPATH=$H/site timeout 100 python3 tests/gpu/gpu_transfer.py main --duration 1.0 2>&1 | grep -E '^\{|^FAIL|Error'
    done
done | tee "$O/gpu.log"
date -u
