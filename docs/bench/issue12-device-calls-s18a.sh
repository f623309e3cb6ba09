#!/usr/bin/env bash
# Session 18 (2026-12-02), first device call of issue 12, nvidia-h200 (16 CPUs): does a send
# out of device memory move faster with its first chunk's head sent while the rest is copied
# out (FIRST_PIECE)? The wheel of docs/bench/issue12-s18-probe.patch (the head's size from
# MC_PROBE_FIRST_PIECE at each send), carried unzipped as .gpucarry-s18/site;
# docs/bench/issue12-s18-knob.py (then named issue12-s18-head.py), 6 rounds; then tests/gpu/gpu_transfer.py main twice with
# the default head (256 KiB).
#
#   bash docs/bench/issue12-device-calls-s18a.sh
set -uo pipefail
H=$PWD/.gpucarry-s18
O="${OUT:-/tmp/s18-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
export MC_FORCE_TCP=1 MC_DISABLE_IPC=1 MC_LOG_LEVEL=warn PYTHONPATH=$H/site
timeout 330 python3 docs/bench/issue12-s18-knob.py --var MC_PROBE_FIRST_PIECE --values 0,131072,262144,524288 --write-values 0,262144 --duration 2 --rounds 6 2>&1 \
    | grep -E '^\{|^FAIL|^PASS|Error' | tee "$O/head.jsonl"
date -u
for run in 1 2; do
    timeout 100 python3 tests/gpu/gpu_transfer.py main --duration 2 2>&1 \
        | grep -E '^\{|^FAIL|^PASS|Error' | sed "s/^/run $run: /" | tee -a "$O/gpu-transfer.log"
done
date -u
