#!/usr/bin/env bash
# Device call 2 (issue 12 / 14): upstream vs b2 (final branch) all cases; metrics A/B
# (no-metrics build of b2 vs b2), order alternating. Run from the repo root.
set -uo pipefail
H=.gpucarry-perf
O="${OUT:-/tmp/perf-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc; uptime
T=/tmp/perf; mkdir -p $T
tar xzf $H/bins2.tgz -C $H
echo "== A: upstream, b2: all cases, 1 round"
BENCH_REPO=$PWD PEER_PY=$H/upstream_peer.py OUT_DIR=$T/cmp OURS="b2=$H/b2" \
    ROUNDS=1 DURATION=2 timeout 150 bash $H/bench-compare.sh --gpu-host 2>$T/cmp.err | tee $T/cmp.md
cp $T/cmp/results.jsonl "$O/cmp.jsonl"
echo "== C: metrics off (A) vs on (B), order alternating"
CASES="write 4096 1,read 4096 1" DURATION=2 KEEP="$O/metrics.jsonl" timeout 100 \
    taskset -c 0-15 bash $H/bench-ab.sh $H/nometrics2 $H/b2 6 | grep '^|'
tail -n 2 $T/cmp.err
date -u
