#!/usr/bin/env bash
# The second device call of issue 12 in session 7 (2026-12-01), nvidia-h200 (16 CPUs), with
# `.gpucarry-s7/bins.tgz` (`new` = the change; `g6` = the same with 512 KiB instead of
# 256 KiB of writes per sendmsg) and `.gpucarry-s7/site/` (the wheel of the change,
# unzipped, `.so` stripped) carried:
#
#   bash docs/bench/issue12-device-calls-s7b.sh
#
# A: serving and 64 KiB cases for new, g6 and two settings, two rounds rotated.
# B: GPU (H200) memory over TCP against host memory, IPC off, with the wheel of the change.
set -uo pipefail
H=.gpucarry-s7
O="${OUT:-/tmp/s7-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc; uptime
tar xzf "$H/bins.tgz" -C "$H"
T=/tmp/s7; mkdir -p $T
echo "== A: group size and settings"
BENCH_REPO=$PWD SKIP_UPSTREAM_PY=1 OUT_DIR=$T/var ROUNDS=2 DURATION=2 \
    CASES="serving-1peer serving-4peers write-64KiBx64 read-64KiBx64" \
    OURS="new=$H/new g6=$H/g6 new-b32=$H/new@MC_TCP_LANE_BUDGET=32 g6-d32=$H/g6@MC_TCP_PIPELINE_DEPTH=32" \
    timeout 200 bash scripts/bench-compare.sh --gpu-host 2>$T/var.err | tee $T/var.md
cp $T/var/results.jsonl "$O/variants.jsonl"
echo "== B: GPU (H200) memory over TCP, IPC off, vs host memory"
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
MC_DISABLE_IPC=1 PYTHONPATH=$H/site timeout 120 python3 tests/gpu/gpu_transfer.py main --duration 1.0 2>&1 | tail -n 20
tail -n 2 $T/var.err
date -u
