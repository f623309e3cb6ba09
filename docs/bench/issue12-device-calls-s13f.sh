#!/usr/bin/env bash
# Session 13 (2026-12-01), sixth device call of issue 12, nvidia-h200 (16 CPUs): why do GPU
# reads come out lower in tests/gpu/gpu_transfer.py (a target process started per figure,
# 2 warm-up batches) than in issue12-s12-shapes.py (targets kept)? Both harnesses with fin's
# wheel (9f4365c), 4 s per figure instead of 1.5: if the gap is the start of each target
# (new connections, threads, stagers), it shrinks.
#
#   bash docs/bench/issue12-device-calls-s13f.sh
set -uo pipefail
H=$PWD/.gpucarry-s13
O="${OUT:-/tmp/s13-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
export MC_FORCE_TCP=1 MC_DISABLE_IPC=1 MC_LOG_LEVEL=warn PYTHONPATH=$H/site
timeout 100 python3 tests/gpu/gpu_transfer.py main --duration 4 2>&1 \
    | grep -E '^\{|^FAIL' | tee "$O/gpu.log"
timeout 80 python3 docs/bench/issue12-s12-shapes.py --label fin --rounds 1 --duration 4 \
    --rest 0.2 2>&1 | grep -E '^\{|^FAIL' | tee "$O/shapes.log"
date -u
