#!/usr/bin/env bash
# Session 21 (2026-12-02), sixth device call of issue 12, nvidia-h200 (16 CPUs): the GPU row
# once more, on another machine start, with more rounds: tests/gpu/gpu_transfer.py with the
# wheel of 050a76f (.gpucarry-s21/site), device memory over TCP (MC_DISABLE_IPC=1), 8 rounds.
#
#   bash docs/bench/issue12-device-calls-s21f.sh
set -uo pipefail
H=$PWD/.gpucarry-s21
O="${OUT:-/tmp/s21-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u
export PYTHONPATH=$H/site MC_LOG_LEVEL=warn
timeout 200 python3 tests/gpu/gpu_transfer.py main --rounds 8 --duration 2 2>&1
date -u
