#!/usr/bin/env bash
# Session 14 (2026-12-01), first device call of issue 12, nvidia-h200 (16 CPUs): batch by
# batch, from the first one on, against a freshly started target and then the same target
# kept (issue12-s14-warmup.py), with main's wheel (85c905d). Not run in session 14: no
# device machine was lent.
#
#   bash docs/bench/issue12-device-calls-s14a.sh
set -uo pipefail
H=$PWD/.gpucarry-s14
O="${OUT:-/tmp/s14-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
export MC_FORCE_TCP=1 MC_DISABLE_IPC=1 MC_LOG_LEVEL=warn PYTHONPATH=$H/site
timeout 150 python3 docs/bench/issue12-s14-warmup.py --rounds 2 --duration 2 2>&1 \
    | grep -E '^\{|^FAIL|Error|error' | tee "$O/warmup.log"
date -u
