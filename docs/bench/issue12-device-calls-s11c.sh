#!/usr/bin/env bash
# Session 11 (2026-12-01), third device call of issue 12, nvidia-h200 (16 CPUs): both sides
# let device-memory copies land while the next request or reply comes in (`land`: commit
# 289ff47, the data server for writes and the receiver thread for reads) against session
# 10's final build (`base`), tests/gpu/gpu_transfer.py --mixed, 2 rounds each, alternating.
#
#   bash docs/bench/issue12-device-calls-s11c.sh
set -uo pipefail
H=$PWD/.gpucarry-s11
O="${OUT:-/tmp/s11-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
export MC_FORCE_TCP=1 MC_DISABLE_IPC=1 MC_LOG_LEVEL=warn
for round in 1 2; do
    for site in base land; do
        echo "== gpu round $round $site"
        PYTHONPATH=$H/$site timeout 200 python3 tests/gpu/gpu_transfer.py main --duration 1.5 --mixed 2>&1 | grep -E '^\{|^FAIL|^PASS|Error'
    done
done | tee "$O/gpu.log"
date -u
