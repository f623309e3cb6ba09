#!/usr/bin/env bash
# Session 13 (2026-12-01), fifth device call of issue 12, nvidia-h200 (16 CPUs): call 4's
# host-memory and serving figures were 10-20% under session 12's, upstream's too; is it
# this machine or the change? Same-call A/B of bench binaries a = d282573 (main before
# this session) and fin = 9f4365c, host-memory cases and serving, 2 rounds (order rotated);
# then, on the same machine, GPU against host memory by both harnesses with fin's wheel
# (tests/gpu/gpu_transfer.py makes a target per case, issue12-s12-shapes.py keeps them).
#
#   bash docs/bench/issue12-device-calls-s13e.sh
set -uo pipefail
H=$PWD/.gpucarry-s13
O="${OUT:-/tmp/s13-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
BENCH_REPO=$PWD OUT_DIR=/tmp/s13/ab SKIP_UPSTREAM_PY=1 OURS="a=$H/a fin=$H/fin" ROUNDS=2 \
    DURATION=1.5 CASES="write-4MiBx64 read-4MiBx64 write-64KiBx64 read-64KiBx64 serving-1peer serving-4peers" \
    timeout 300 bash scripts/bench-compare.sh --gpu-host 2>/tmp/ab.err
cp /tmp/s13/ab/results.jsonl "$O/ab.jsonl"; tail -n 2 /tmp/ab.err
date -u
export MC_FORCE_TCP=1 MC_DISABLE_IPC=1 MC_LOG_LEVEL=warn PYTHONPATH=$H/site
timeout 100 python3 tests/gpu/gpu_transfer.py main --duration 1.5 --mixed 2>&1 \
    | grep -E '^\{|^FAIL' | tee "$O/gpu.log"
timeout 60 python3 docs/bench/issue12-s12-shapes.py --label fin --rounds 1 --duration 1.5 \
    --rest 0.2 2>&1 | grep -E '^\{|^FAIL' | tee "$O/shapes.log"
date -u
