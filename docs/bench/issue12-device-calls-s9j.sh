#!/usr/bin/env bash
# Session 9 (2026-12-01), tenth device call of issue 12, nvidia-h200 (16 CPUs): GPU (H200)
# memory over TCP against host memory, tests/gpu/gpu_transfer.py, with the wheel of the
# final build (`.gpucarry-s9/site`, f37d973 and later), 2 rounds.
#
#   bash docs/bench/issue12-device-calls-s9j.sh
set -uo pipefail
H=$PWD/.gpucarry-s9
O="${OUT:-/tmp/s9-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
export MC_FORCE_TCP=1 MC_DISABLE_IPC=1 MC_LOG_LEVEL=warn
for round in 1 2; do
    echo "== round $round"
    PYTHONPATH=$H/site timeout 100 python3 tests/gpu/gpu_transfer.py main --duration 1.0 2>&1 | grep -E '^\{|^FAIL|Error'
done
date -u
