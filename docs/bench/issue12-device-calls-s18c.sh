#!/usr/bin/env bash
# Session 18 (2026-12-02), third device call of issue 12, nvidia-h200 (16 CPUs): call 2 had
# GPU-to-GPU reads move 1.03x (median of 6 rounds) when the target's sends yielded the CPU
# between stream queries instead of spinning in the runtime. The candidate (yielding in
# sends, the default) with docs/bench/issue12-s18c-probe.patch (MC_PROBE_WAIT: 0 spins
# everywhere, 3 yields in sends, 4 yields in every wait), carried unzipped as
# .gpucarry-s18/site; docs/bench/issue12-s18-knob.py, 6 rounds; then
# tests/gpu/gpu_transfer.py main twice with the default.
#
#   bash docs/bench/issue12-device-calls-s18c.sh
set -uo pipefail
H=$PWD/.gpucarry-s18
O="${OUT:-/tmp/s18-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
export MC_FORCE_TCP=1 MC_DISABLE_IPC=1 MC_LOG_LEVEL=warn PYTHONPATH=$H/site
timeout 330 python3 docs/bench/issue12-s18-knob.py --var MC_PROBE_WAIT --values 0,3,4 \
    --write-values 0,3,4 --duration 2 --rounds 6 2>&1 \
    | grep -E '^\{|^FAIL|^PASS|Error' | tee "$O/wait.jsonl"
date -u
for run in 1 2; do
    timeout 100 python3 tests/gpu/gpu_transfer.py main --duration 2 2>&1 \
        | grep -E '^\{|^FAIL|^PASS|Error' | sed "s/^/run $run: /" | tee -a "$O/gpu-transfer.log"
done
date -u
