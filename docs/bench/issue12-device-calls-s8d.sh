#!/usr/bin/env bash
# Session 8 (2026-12-01), fourth device call of issue 12, nvidia-h200 (16 CPUs): the final
# build (`final`, 15bdd9b: the direct path and the lane budget of links with work) against
# upstream 0.3.14 (`.devcarry/`, MC_FORCE_TCP=1), every case, two rounds in rotated order.
#
#   bash docs/bench/issue12-device-calls-s8d.sh
set -uo pipefail
H=$PWD/.gpucarry-s8
O="${OUT:-/tmp/s8-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
T=/tmp/s8; mkdir -p $T
BENCH_REPO=$PWD PEER_PY=tests/interop/upstream_peer.py OUT_DIR=$T/cmp OURS="final=$H/final" \
    ROUNDS=2 DURATION=2 timeout 400 bash scripts/bench-compare.sh --gpu-host 2>$T/cmp.err | tee $T/cmp.md
cp $T/cmp/results.jsonl "$O/cmp.jsonl"
tail -n 3 $T/cmp.err
date -u
