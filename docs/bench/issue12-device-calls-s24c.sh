#!/usr/bin/env bash
# Session 24 (2026-12-03), third device call of issue 12, nvidia-h200: the GPU row and the
# link's ceiling on one machine start. docs/bench/issue12-s24-pcie-probe.py (copies between
# GPU memory and pinned host memory, no engine), then tests/gpu/gpu_transfer.py main
# --rounds 3 with session 23's wheel (861c5b1, .gpucarry-s24/new).
#
#   bash docs/bench/issue12-device-calls-s24c.sh
set -uo pipefail
H=$PWD/.gpucarry-s24
O="${OUT:-/tmp/s24-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nvidia-smi --query-gpu=name,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader
timeout 100 python3 docs/bench/issue12-s24-pcie-probe.py --duration 2 2>&1 | tee "$O/pcie-probe-before.jsonl"
MC_LOG_LEVEL=warn PYTHONPATH=$H/new timeout 240 python3 tests/gpu/gpu_transfer.py main --rounds 3 --duration 3 2>&1 | tee "$O/gpu-transfer.log"
date -u
