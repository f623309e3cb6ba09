#!/usr/bin/env bash
# Session 11 (2026-12-01), fifth device call of issue 12, nvidia-h200 (16 CPUs): the final
# build (`site`, commit a117f78) on a real GPU (its bytes-verified checks), against the same
# build with staging copies given their direction (`kinds`: MemcpyHostToDevice /
# DeviceToHost instead of MemcpyDefault, the patch docs/bench/issue12-s11-copy-kinds.patch),
# tests/gpu/gpu_transfer.py --mixed, 2 rounds each, alternating.
#
#   bash docs/bench/issue12-device-calls-s11e.sh
set -uo pipefail
H=$PWD/.gpucarry-s11
O="${OUT:-/tmp/s11-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
export MC_FORCE_TCP=1 MC_DISABLE_IPC=1 MC_LOG_LEVEL=warn
for round in 1 2; do
    for site in site kinds; do
        echo "== gpu round $round $site"
        PYTHONPATH=$H/$site timeout 150 python3 tests/gpu/gpu_transfer.py main --duration 1.0 --mixed 2>&1 | grep -E '^\{"op": "(write|read)", "block|^FAIL|^PASS|Error'
    done
done | tee "$O/gpu.log"
date -u
