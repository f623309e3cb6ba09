#!/usr/bin/env bash
# Device call 1 (issue 12 / 14): upstream vs main vs b1 (lane budget), serving variants,
# metrics A/B alternated, GPU memory over TCP with IPC off. Run from the repo root.
set -uo pipefail
H=.gpucarry-perf
O="${OUT:-/tmp/perf-out}"; mkdir -p "$O"
export PYTHONUNBUFFERED=1
exec > >(tee "$O/run.log") 2>&1
date -u; nproc; uptime
T=/tmp/perf; mkdir -p $T
tar xzf $H/bins.tgz -C $H
echo "== A: upstream, main, b1: all cases, 1 round"
BENCH_REPO=$PWD PEER_PY=$H/upstream_peer.py OUT_DIR=$T/cmp OURS="main=$H/main b1=$H/b1" \
    ROUNDS=1 DURATION=2 timeout 240 bash $H/bench-compare.sh --gpu-host 2>$T/cmp.err | tee $T/cmp.md
cp $T/cmp/results.jsonl "$O/cmp.jsonl"
echo "== B: serving variants"
BENCH_REPO=$PWD SKIP_UPSTREAM_PY=1 OUT_DIR=$T/var CASES="serving-1peer serving-4peers" ROUNDS=1 DURATION=2 \
    OURS="main-l2=$H/main@MC_TCP_LANES_PER_PEER=2 main-l4=$H/main@MC_TCP_LANES_PER_PEER=4 b1-b8=$H/b1@MC_TCP_LANE_BUDGET=8 b1-b32=$H/b1@MC_TCP_LANE_BUDGET=32 b1-l16=$H/b1@MC_TCP_LANES_PER_PEER=16 b1-l4=$H/b1@MC_TCP_LANES_PER_PEER=4 b1-nospin=$H/b1@MC_TCP_SPIN_US=0" \
    timeout 150 bash $H/bench-compare.sh --gpu-host 2>$T/var.err | tee $T/var.md
cp $T/var/results.jsonl "$O/variants.jsonl"
echo "== C: metrics off (A) vs on (B), order alternating"
CASES="write 4096 1,read 4096 1" DURATION=2 KEEP="$O/metrics.jsonl" timeout 120 \
    taskset -c 0-15 bash $H/bench-ab.sh $H/nometrics $H/main 6 | grep '^|'
echo "== D: GPU (H200) memory over TCP, IPC off, vs host memory"
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
MC_DISABLE_IPC=1 PYTHONPATH=$H/site timeout 150 python3 $H/gpu_transfer.py main --duration 1.0 2>&1 | tail -n 20
echo "== tails"; tail -n 3 $T/cmp.err $T/var.err
date -u
