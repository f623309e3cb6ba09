#!/usr/bin/env bash
# The device call of issue 12 in session 7 (2026-12-01), as it ran on the `device` tool's
# nvidia-h200 (16 CPUs), from the main checkout's root with `.gpucarry-s7/bins.tgz` (the
# two bench builds, stripped: `main` before the change, `new` after) and `.devcarry/`
# (../shared/tools/carry-upstream-for-gpu-host.sh) carried:
#
#   bash docs/bench/issue12-device-calls-s7.sh
#
# A: upstream, main, new: every case, one round. B: new and main again, two rounds, order
# rotated, for the spread between rounds.
set -uo pipefail
H=.gpucarry-s7
O="${OUT:-/tmp/s7-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc; uptime
tar xzf "$H/bins.tgz" -C "$H"
T=/tmp/s7; mkdir -p $T
echo "== A: upstream, main, new: all cases, 1 round"
BENCH_REPO=$PWD PEER_PY=tests/interop/upstream_peer.py OUT_DIR=$T/cmp OURS="main=$H/main new=$H/new" \
    ROUNDS=1 DURATION=2 timeout 220 bash scripts/bench-compare.sh --gpu-host 2>$T/cmp.err | tee $T/cmp.md
cp $T/cmp/results.jsonl "$O/cmp.jsonl"
echo "== B: new and main, 2 more rounds"
BENCH_REPO=$PWD SKIP_UPSTREAM_PY=1 OUT_DIR=$T/ab OURS="new=$H/new main=$H/main" \
    ROUNDS=2 DURATION=2 timeout 150 bash scripts/bench-compare.sh --gpu-host 2>$T/ab.err | tee $T/ab.md
cp $T/ab/results.jsonl "$O/ab.jsonl"
tail -n 3 $T/cmp.err $T/ab.err
date -u
