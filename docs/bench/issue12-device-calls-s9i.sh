#!/usr/bin/env bash
# Session 9 (2026-12-01), ninth device call of issue 12, nvidia-h200 (16 CPUs): more rounds
# of the cases near their goals in call 8 (serving, 4 MiB reads), upstream 0.3.14
# (`MC_FORCE_TCP=1`) against `s9f` (b952b85), 3 rounds, order rotated.
#
#   bash docs/bench/issue12-device-calls-s9i.sh
set -uo pipefail
H=$PWD/.gpucarry-s9
O="${OUT:-/tmp/s9-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
BENCH_REPO=$PWD PEER_PY=tests/interop/upstream_peer.py OUT_DIR=/tmp/s9/more \
    OURS="s9f=$H/s9f" ROUNDS=3 DURATION=2 \
    CASES="serving-1peer serving-4peers write-4MiBx64 read-4MiBx64" \
    timeout 300 bash scripts/bench-compare.sh --gpu-host 2>/tmp/more.err
cp /tmp/s9/more/results.jsonl "$O/more.jsonl"
tail -n 3 /tmp/more.err
date -u
