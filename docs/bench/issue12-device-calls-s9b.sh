#!/usr/bin/env bash
# Session 9 (2026-12-01), second device call of issue 12, nvidia-h200 (16 CPUs): callers
# sending their own batches on connections of no lane once the lanes have work (`s9a`)
# against `cur` (f69036d), 2 rounds rotated, no upstream.
#
#   bash docs/bench/issue12-device-calls-s9b.sh
set -uo pipefail
H=$PWD/.gpucarry-s9
O="${OUT:-/tmp/s9-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
BENCH_REPO=$PWD SKIP_UPSTREAM_PY=1 OUT_DIR=/tmp/s9/ab OURS="cur=$H/cur s9a=$H/s9a" \
    CASES="serving-1peer serving-4peers write-64KiBx64 write-4MiBx64 lat-write-4KiB" \
    ROUNDS=2 DURATION=2 timeout 400 bash scripts/bench-compare.sh --gpu-host 2>/tmp/ab.err
cp /tmp/s9/ab/results.jsonl "$O/ab.jsonl"
tail -n 3 /tmp/ab.err
date -u
