#!/usr/bin/env bash
# Session 10 (2026-12-01), fifth device call of issue 12, nvidia-h200 (16 CPUs): why GPU
# memory over TCP stays at 22-25 GB/s whatever the lanes while the host link copies 55 GB/s
# each way (call 4). tests/gpu/gpu_transfer.py --mixed with the wheel of the final defaults
# (`site`), and the same wheel built with staging chunks of 4 MiB instead of 1 MiB
# (`site4`), 2 rounds each: device to device, and device memory on one side only (so one
# process alone uses the GPU).
#
#   bash docs/bench/issue12-device-calls-s10e.sh
set -uo pipefail
H=$PWD/.gpucarry-s10
O="${OUT:-/tmp/s10-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
export MC_FORCE_TCP=1 MC_DISABLE_IPC=1 MC_LOG_LEVEL=warn
for round in 1 2; do
    for site in site site4; do
        echo "== gpu round $round $site"
        PYTHONPATH=$H/$site timeout 150 python3 tests/gpu/gpu_transfer.py main --duration 1.0 --mixed 2>&1 | grep -E '^\{|^FAIL|Error'
    done
done | tee "$O/gpu.log"
date -u
