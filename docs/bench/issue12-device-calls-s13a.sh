#!/usr/bin/env bash
# Session 13 (2026-12-01), first device call of issue 12, nvidia-h200 (16 CPUs):
#  1. socket reads into pinned against ordinary memory, without the engine
#     (issue12-s13-recv-into.py, 8 pairs);
#  2. GPU memory against host memory over TCP, same-call A/B, alternating, 3 passes:
#     a = d282573 (main before), b = 963375c (one copy out of the device at a time, and
#     lanes copy the next device write's first chunk while sending the last one's).
#
#   bash docs/bench/issue12-device-calls-s13a.sh
set -uo pipefail
H=$PWD/.gpucarry-s13
O="${OUT:-/tmp/s13-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
timeout 150 python3 docs/bench/issue12-s13-recv-into.py 8 1.5 | tee "$O/recv-into.jsonl"
date -u
export MC_FORCE_TCP=1 MC_DISABLE_IPC=1 MC_LOG_LEVEL=warn
for pass in 1 2 3; do
    for build in a b; do
        PYTHONPATH=$H/$build timeout 90 python3 docs/bench/issue12-s12-shapes.py \
            --label "$build" --rounds 1 --duration 1.5 --rest 0.2 2>&1 \
            | grep -E '^\{|^FAIL|^PASS|Error' | tee -a "$O/ab.log"
    done
done
date -u
