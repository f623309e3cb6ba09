#!/usr/bin/env bash
# Session 9 (2026-12-01), third device call of issue 12, nvidia-h200 (16 CPUs): callers
# sending their own batches on connections of no lane once the lanes have work (`s9a`)
# and callers also reading their statuses themselves (`s9b`) against `cur` (f69036d), 2 rounds.
#
#   bash docs/bench/issue12-device-calls-s9b.sh
set -uo pipefail
H=$PWD/.gpucarry-s9
O="${OUT:-/tmp/s9-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
BENCH_REPO=$PWD SKIP_UPSTREAM_PY=1 OUT_DIR=/tmp/s9/ab OURS="cur=$H/cur s9a=$H/s9a s9b=$H/s9b" \
    CASES="serving-1peer serving-4peers write-64KiBx64" \
    ROUNDS=2 DURATION=2 timeout 400 bash scripts/bench-compare.sh --gpu-host 2>/tmp/ab.err
cp /tmp/s9/ab/results.jsonl "$O/ab.jsonl"
tail -n 3 /tmp/ab.err
date -u
