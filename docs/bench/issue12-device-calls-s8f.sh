#!/usr/bin/env bash
# Session 8 (2026-12-01), sixth device call of issue 12, nvidia-h200 (16 CPUs): the batch
# waiter's looks only for batches of up to 4 requests (`looks`) against looks for every
# batch (`cur`, f4b6def), three rounds in rotated order, the cases the waiter touches.
#
#   bash docs/bench/issue12-device-calls-s8f.sh
set -uo pipefail
H=$PWD/.gpucarry-s8
O="${OUT:-/tmp/s8-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
BENCH_REPO=$PWD SKIP_UPSTREAM_PY=1 OUT_DIR=/tmp/s8/ab OURS="cur=$H/cur looks=$H/looks" \
    CASES="serving-1peer serving-4peers lat-write-4KiB lat-read-4KiB write-64KiBx64" \
    ROUNDS=3 DURATION=2 timeout 400 bash scripts/bench-compare.sh --gpu-host 2>/tmp/ab.err
cp /tmp/s8/ab/results.jsonl "$O/ab.jsonl"
tail -n 3 /tmp/ab.err
date -u
