#!/usr/bin/env bash
# Session 8 (2026-12-01), seventh device call of issue 12, nvidia-h200 (16 CPUs): lanes that
# look for a peer-closed connection before use (`after`, 11d39bd: a poll and a FIONREAD when
# nothing is owed on the connection) against `before` (4665402), 2 rounds rotated, the cases
# with batches of many requests.
#
#   bash docs/bench/issue12-device-calls-s8g.sh
set -uo pipefail
H=$PWD/.gpucarry-s8
O="${OUT:-/tmp/s8-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
BENCH_REPO=$PWD SKIP_UPSTREAM_PY=1 OUT_DIR=/tmp/s8/ab OURS="before=$H/before after=$H/after" \
    CASES="serving-1peer serving-4peers write-64KiBx64 read-64KiBx64 write-4MiBx64 lat-write-4KiB" \
    ROUNDS=2 DURATION=2 timeout 400 bash scripts/bench-compare.sh --gpu-host 2>/tmp/ab.err
cp /tmp/s8/ab/results.jsonl "$O/ab.jsonl"
tail -n 3 /tmp/ab.err
date -u
