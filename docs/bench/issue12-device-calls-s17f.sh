#!/usr/bin/env bash
# Session 17 (2026-12-02), sixth device call of issue 12, nvidia-h200 (16 CPUs): the landed
# wheel (a92357e: one read into device memory out per lane), carried unzipped as
# .gpucarry-s17/site, through tests/gpu/gpu_transfer.py main, two runs. Not run: the
# session's device time ran out (a start found no machine); left for the next session.
#
#   bash docs/bench/issue12-device-calls-s17f.sh
set -uo pipefail
H=$PWD/.gpucarry-s17
O="${OUT:-/tmp/s17-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
export MC_FORCE_TCP=1 MC_DISABLE_IPC=1 MC_LOG_LEVEL=warn PYTHONPATH=$H/site
for run in 1 2; do
    timeout 120 python3 tests/gpu/gpu_transfer.py main --duration 2 2>&1 \
        | grep -E '^\{|^FAIL|^PASS|Error' | sed "s/^/run $run: /" | tee -a "$O/gpu-transfer.log"
done
date -u
