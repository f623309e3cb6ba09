#!/usr/bin/env bash
# Session 23 (2026-12-03), sixth device call of issue 12, nvidia-h200: the GPU row with this
# session's wheel (4280c33: runs of writes; the device paths are session 21's), unzipped and
# stripped into .gpucarry-s23/site: tests/gpu/gpu_transfer.py main --rounds 4 (device memory
# over TCP against host memory, same run, the first phase of each round alternating).
#
#   bash docs/bench/issue12-device-calls-s23f.sh
set -uo pipefail
H=$PWD/.gpucarry-s23
O="${OUT:-/tmp/s23-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONPATH=$H/site MC_LOG_LEVEL=warn
timeout 240 python3 tests/gpu/gpu_transfer.py main --rounds 4 --duration 3 2>&1 | tee "$O/gpu-transfer.log"
date -u
