#!/usr/bin/env bash
# The third device call of issue 12 in session 7 (2026-12-01), nvidia-h200 (16 CPUs): GPU
# (H200) memory over TCP (IPC off) against host memory, with the wheel before the change
# (`.gpucarry-s7/site-old`, 28d8f0e) and after it (`.gpucarry-s7/site`), order alternating:
#
#   bash docs/bench/issue12-device-calls-s7c.sh
set -uo pipefail
H=.gpucarry-s7
O="${OUT:-/tmp/s7-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc; uptime
for round in 1 2; do
    order="site-old site"; [ "$round" = 2 ] && order="site site-old"
    for w in $order; do
        echo "== round $round: $w"
        MC_DISABLE_IPC=1 MC_LOG_LEVEL=warn PYTHONPATH=$H/$w timeout 60 \
            python3 tests/gpu/gpu_transfer.py main --duration 1.0 2>&1 | grep -E '^\{|GB/s|^(write|read) '
    done
done
date -u
