#!/usr/bin/env bash
# The three device calls of issue 12 / 14 in session 6 (2026-11-30), as they ran on the
# `device` tool's nvidia-h200-x2, from the main checkout's root with `.gpucarry-perf/` (the
# builds as `bins{1,2,3}.tgz`, this repository's scripts/bench-compare.sh and bench-ab.sh,
# tests/interop/upstream_peer.py, tests/gpu/gpu_transfer.py, an unzipped wheel in `site/`)
# and `.devcarry/` (../shared/tools/carry-upstream-for-gpu-host.sh) carried:
#
#   bash .gpucarry-perf/issue12-device-calls.sh 1|2|3
#
# 1: upstream vs main vs b1 (lane budget), all cases; serving variants; metrics A/B of main;
#    GPU memory over TCP with IPC off.  2: upstream vs b2 (final), all cases; metrics A/B of
#    b2.  3: b2 vs b3 (dropped), throughput cases, 2 rounds; metrics A/B of b2, 10 rounds.
set -uo pipefail
H=.gpucarry-perf
O="${OUT:-/tmp/perf-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc; uptime
T=/tmp/perf; mkdir -p $T
metrics_ab() {  # metrics_ab OFF_BIN ON_BIN ROUNDS TIMEOUT: the issue-14 A/B, order alternating
    echo "== C: metrics off (A) vs on (B), order alternating"
    CASES="write 4096 1,read 4096 1" DURATION=2 KEEP="$O/metrics.jsonl" timeout "$4" \
        taskset -c 0-15 bash $H/bench-ab.sh "$H/$1" "$H/$2" "$3" | grep '^|'
}
CALL="${1:?usage: issue12-device-calls.sh 1|2|3}"
case "$CALL" in 1) tar xzf $H/bins.tgz -C $H ;; *) tar xzf "$H/bins$CALL.tgz" -C $H ;; esac
case "$CALL" in
    1)
        echo "== A: upstream, main, b1: all cases, 1 round"
        BENCH_REPO=$PWD PEER_PY=$H/upstream_peer.py OUT_DIR=$T/cmp OURS="main=$H/main b1=$H/b1" \
            ROUNDS=1 DURATION=2 timeout 240 bash $H/bench-compare.sh --gpu-host 2>$T/cmp.err | tee $T/cmp.md
        cp $T/cmp/results.jsonl "$O/cmp.jsonl"
        echo "== B: serving variants"
        BENCH_REPO=$PWD SKIP_UPSTREAM_PY=1 OUT_DIR=$T/var CASES="serving-1peer serving-4peers" ROUNDS=1 DURATION=2 \
            OURS="main-l2=$H/main@MC_TCP_LANES_PER_PEER=2 main-l4=$H/main@MC_TCP_LANES_PER_PEER=4 b1-b8=$H/b1@MC_TCP_LANE_BUDGET=8 b1-b32=$H/b1@MC_TCP_LANE_BUDGET=32 b1-l16=$H/b1@MC_TCP_LANES_PER_PEER=16 b1-l4=$H/b1@MC_TCP_LANES_PER_PEER=4 b1-nospin=$H/b1@MC_TCP_SPIN_US=0" \
            timeout 150 bash $H/bench-compare.sh --gpu-host 2>$T/var.err | tee $T/var.md
        cp $T/var/results.jsonl "$O/variants.jsonl"
        metrics_ab nometrics main 6 120
        echo "== D: GPU (H200) memory over TCP, IPC off, vs host memory"
        nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
        MC_DISABLE_IPC=1 PYTHONPATH=$H/site timeout 150 python3 $H/gpu_transfer.py main --duration 1.0 2>&1 | tail -n 20
        echo "== tails"; tail -n 3 $T/cmp.err $T/var.err
        date -u
        ;;
    2)
        echo "== A: upstream, b2: all cases, 1 round"
        BENCH_REPO=$PWD PEER_PY=$H/upstream_peer.py OUT_DIR=$T/cmp OURS="b2=$H/b2" \
            ROUNDS=1 DURATION=2 timeout 150 bash $H/bench-compare.sh --gpu-host 2>$T/cmp.err | tee $T/cmp.md
        cp $T/cmp/results.jsonl "$O/cmp.jsonl"
        metrics_ab nometrics2 b2 6 100
        tail -n 2 $T/cmp.err
        date -u
        ;;
    3)
        echo "== A: b2 vs b3"
        BENCH_REPO=$PWD SKIP_UPSTREAM_PY=1 OUT_DIR=$T/ab OURS="b2=$H/b2 b3=$H/b3" ROUNDS=2 DURATION=2 \
            CASES="write-64KiBx64 read-64KiBx64 serving-1peer serving-4peers lat-write-4KiB" \
            timeout 150 bash $H/bench-compare.sh --gpu-host 2>$T/ab.err | tee $T/ab.md
        cp $T/ab/results.jsonl "$O/b2-b3.jsonl"
        metrics_ab nometrics2 b2 10 130
        date -u
        ;;
esac
