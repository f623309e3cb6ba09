#!/usr/bin/env bash
# Session 18 (2026-12-02), second device call of issue 12, nvidia-h200 (16 CPUs): session 17's
# profile had the target's threads spinning in the runtime (8.4% of all samples) while they
# waited for their copies out of the GPU. Do GPU reads move faster when those waits sleep on
# an event (cudaEventBlockingSync) or yield the CPU between queries? The wheel of
# docs/bench/issue12-s18b-probe.patch (MC_PROBE_WAIT at each wait), carried unzipped as
# .gpucarry-s18/site; docs/bench/issue12-s18-knob.py, 6 rounds.
#
#   bash docs/bench/issue12-device-calls-s18b.sh
set -uo pipefail
H=$PWD/.gpucarry-s18
O="${OUT:-/tmp/s18-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
export MC_FORCE_TCP=1 MC_DISABLE_IPC=1 MC_LOG_LEVEL=warn PYTHONPATH=$H/site
timeout 400 python3 docs/bench/issue12-s18-knob.py --var MC_PROBE_WAIT --values 0,1,2,3 \
    --write-values 0,1,2 --duration 2 --rounds 6 2>&1 \
    | grep -E '^\{|^FAIL|^PASS|Error' | tee "$O/wait.jsonl"
date -u
