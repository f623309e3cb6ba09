#!/usr/bin/env bash
# Session 22 (2026-12-02), fourth device call of issue 12, nvidia-h200: the GPU row with this
# session's wheel (89ae84b: names kept; the device paths are session 21's), unzipped and
# stripped into .gpucarry-s22/site: tests/gpu/gpu_transfer.py main --rounds 6 (device memory
# over TCP against host memory, same run, the first phase of each round alternating).
#
#   bash docs/bench/issue12-device-calls-s22d.sh
set -uo pipefail
H=$PWD/.gpucarry-s22
O="${OUT:-/tmp/s22-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONPATH=$H/site MC_LOG_LEVEL=warn
timeout 420 python3 tests/gpu/gpu_transfer.py main --rounds 6 --duration 3 2>&1 | tee "$O/gpu-transfer.log"
date -u
