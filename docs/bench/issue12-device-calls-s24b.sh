#!/usr/bin/env bash
# Session 24 (2026-12-03), second device call of issue 12, nvidia-h200: session 23's wheel
# (861c5b1, `new`) against session 22's (89ae84b, `old`) on the GPU row, one round each,
# six times in the order old-new-new-old-old-new, on this one machine start (call 1 had the
# new wheel's device reads 15-20% under the old one's in 2 runs each; neither wheel's
# device paths differ in code).
#
#   bash docs/bench/issue12-device-calls-s24b.sh
set -uo pipefail
H=$PWD/.gpucarry-s24
O="${OUT:-/tmp/s24-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u
export MC_LOG_LEVEL=warn
for w in old new new old old new; do
    echo "== wheel $w $(date -u +%T)"
    PYTHONPATH=$H/$w timeout 100 python3 tests/gpu/gpu_transfer.py main --rounds 1 --duration 3 2>&1 | tee -a "$O/gpu-transfer-$w.log" | grep -E '"round"|FAIL'
done
date -u
