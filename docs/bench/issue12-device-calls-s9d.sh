#!/usr/bin/env bash
# Session 9 (2026-12-01), fourth device call of issue 12, nvidia-h200 (16 CPUs): callers
# sending their batches and reading the statuses themselves, with at most 8 (`s9b`), 16
# (`s9c`) or 32 (`s9c-32`) caller connections per peer, against `cur` (f69036d), 2 rounds.
#
#   bash docs/bench/issue12-device-calls-s9d.sh
set -uo pipefail
H=$PWD/.gpucarry-s9
O="${OUT:-/tmp/s9-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
BENCH_REPO=$PWD SKIP_UPSTREAM_PY=1 OUT_DIR=/tmp/s9/ab \
    OURS="cur=$H/cur s9b=$H/s9b s9c=$H/s9c s9c-32=$H/s9c@MC_EXP_CALLER_CAP=32" \
    CASES="serving-1peer serving-4peers" \
    ROUNDS=2 DURATION=2 timeout 400 bash scripts/bench-compare.sh --gpu-host 2>/tmp/ab.err
cp /tmp/s9/ab/results.jsonl "$O/ab.jsonl"
tail -n 3 /tmp/ab.err
date -u
