#!/usr/bin/env bash
# Session 9 (2026-12-01), sixth device call of issue 12, nvidia-h200 (16 CPUs): `s9d` (as
# `s9c`, 16 caller connections per peer, plus region pins sharded by holder and the data
# server looking at its connection's last region first) against `s9c` and `cur`
# (f69036d), 2 rounds rotated.
#
#   bash docs/bench/issue12-device-calls-s9f.sh
set -uo pipefail
H=$PWD/.gpucarry-s9
O="${OUT:-/tmp/s9-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
BENCH_REPO=$PWD SKIP_UPSTREAM_PY=1 OUT_DIR=/tmp/s9/ab OURS="cur=$H/cur s9c=$H/s9c s9d=$H/s9d" \
    CASES="serving-1peer serving-4peers write-64KiBx64 read-64KiBx64 lat-write-4KiB" \
    ROUNDS=2 DURATION=2 timeout 400 bash scripts/bench-compare.sh --gpu-host 2>/tmp/ab.err
cp /tmp/s9/ab/results.jsonl "$O/ab.jsonl"
tail -n 3 /tmp/ab.err
date -u
