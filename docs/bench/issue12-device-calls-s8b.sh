#!/usr/bin/env bash
# Session 8 (2026-12-01), second device call of issue 12, nvidia-h200 (16 CPUs): upstream
# 0.3.14 (`.devcarry/`, MC_FORCE_TCP=1) against ours before (`main`, 41aa162) and after
# (`new`, the direct path for lone small requests) in the same call, every case, two rounds
# in rotated order; then GPU memory against host memory with the new wheel, by
# tests/gpu/gpu_transfer.py (1 s per figure, as session 7 measured it) and by
# issue12-s8-gpu-profile.py (3 s per figure), in turn. `.gpucarry-s8/` carries `site` (the
# wheel, unpacked) and `main`, `new` (bench builds, stripped).
#
#   bash docs/bench/issue12-device-calls-s8b.sh
set -uo pipefail
H=$PWD/.gpucarry-s8
O="${OUT:-/tmp/s8-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
T=/tmp/s8; mkdir -p $T
BENCH_REPO=$PWD PEER_PY=tests/interop/upstream_peer.py OUT_DIR=$T/cmp OURS="main=$H/main new=$H/new" \
    ROUNDS=2 DURATION=2 timeout 400 bash scripts/bench-compare.sh --gpu-host 2>$T/cmp.err | tee $T/cmp.md
cp $T/cmp/results.jsonl "$O/cmp.jsonl"
tail -n 3 $T/cmp.err
date -u
export MC_FORCE_TCP=1 MC_DISABLE_IPC=1 MC_LOG_LEVEL=warn PYTHONPATH=$H/site
for round in 1 2; do
    echo "== round $round: gpu_transfer.py"
    timeout 60 python3 tests/gpu/gpu_transfer.py main --duration 1.0 2>&1 | grep -E '^\{|^FAIL'
    echo "== round $round: issue12-s8-gpu-profile.py"
    for op in write read; do
        for mem in cpu cuda; do
            timeout 40 python3 docs/bench/issue12-s8-gpu-profile.py $mem $op 3
        done
    done
done 2>&1 | tee "$O/gpu.log"
date -u
