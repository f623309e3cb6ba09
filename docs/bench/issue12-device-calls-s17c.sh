#!/usr/bin/env bash
# Session 17 (2026-12-02), third device call of issue 12, nvidia-h200 (16 CPUs): call 2's
# profile had the target spend 18% more CPU per byte sending reads into our GPU (2 MiB
# stripes, requested two at a time per lane) than host reads (1 MiB stripes), with a CPU more
# idle. Do stripes explain the gap? The wheel of docs/bench/issue12-s17c-probe.patch (on
# cb1b458; stripes from the environment at each batch), carried unzipped as
# .gpucarry-s17/site; docs/bench/issue12-s17-stripes.py, one process, cases rotated.
#
#   bash docs/bench/issue12-device-calls-s17c.sh
set -uo pipefail
H=$PWD/.gpucarry-s17
O="${OUT:-/tmp/s17-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
export MC_FORCE_TCP=1 MC_DISABLE_IPC=1 MC_LOG_LEVEL=warn PYTHONPATH=$H/site
timeout 400 python3 docs/bench/issue12-s17-stripes.py --duration 2 --rounds 6 2>&1 \
    | grep -E '^\{|^FAIL|^PASS|Error' | tee "$O/stripes.jsonl"
date -u
