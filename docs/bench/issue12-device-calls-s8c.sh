#!/usr/bin/env bash
# Session 8 (2026-12-01), third device call of issue 12, nvidia-h200 (16 CPUs): GPU (H200)
# memory over TCP against host memory by tests/gpu/gpu_transfer.py (as session 7 measured
# it: one initiator engine, a new target per figure), with the wheel before the lane
# budget change (`.gpucarry-s8/site-before`, cdd78fe: every open link shares the budget)
# and after it (`.gpucarry-s8/site`: only links with work share it), order alternating.
#
#   bash docs/bench/issue12-device-calls-s8c.sh
set -uo pipefail
H=$PWD/.gpucarry-s8
O="${OUT:-/tmp/s8-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
export MC_FORCE_TCP=1 MC_DISABLE_IPC=1 MC_LOG_LEVEL=warn
for round in 1 2 3; do
    order="site-before site"; [ "$round" = 2 ] && order="site site-before"
    for w in $order; do
        echo "== round $round: $w"
        PYTHONPATH=$H/$w timeout 60 python3 tests/gpu/gpu_transfer.py main --duration 1.0 2>&1 | grep -E '^\{|^FAIL'
    done
done
date -u
