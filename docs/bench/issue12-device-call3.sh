#!/usr/bin/env bash
# Device call 3 (issue 12 / 14): b2 vs b3 (data server reads a pipelined header without
# polling first), throughput cases, 2 rounds rotated; metrics A/B (no-metrics b2 vs b2),
# 10 rounds alternating. Run from the repo root.
set -uo pipefail
H=.gpucarry-perf
O="${OUT:-/tmp/perf-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc; uptime
T=/tmp/perf; mkdir -p $T
tar xzf $H/bins3.tgz -C $H
echo "== A: b2 vs b3"
BENCH_REPO=$PWD SKIP_UPSTREAM_PY=1 OUT_DIR=$T/ab OURS="b2=$H/b2 b3=$H/b3" ROUNDS=2 DURATION=2 \
    CASES="write-64KiBx64 read-64KiBx64 serving-1peer serving-4peers lat-write-4KiB" \
    timeout 150 bash $H/bench-compare.sh --gpu-host 2>$T/ab.err | tee $T/ab.md
cp $T/ab/results.jsonl "$O/b2-b3.jsonl"
echo "== C: metrics off (A) vs on (B), order alternating"
CASES="write 4096 1,read 4096 1" DURATION=2 KEEP="$O/metrics.jsonl" timeout 130 \
    taskset -c 0-15 bash $H/bench-ab.sh $H/nometrics2 $H/b2 10 | grep '^|'
date -u
