#!/usr/bin/env bash
# Session 9 (2026-12-01), eighth device call of issue 12, nvidia-h200 (16 CPUs): the final
# comparison, every case, upstream 0.3.14 (`MC_FORCE_TCP=1`) against `s9f` (b952b85:
# callers send their batches and read their statuses themselves, sharded pins, defaults)
# and `cur` (f69036d, session 8's end), 2 rounds, order rotated.
#
#   bash docs/bench/issue12-device-calls-s9h.sh
set -uo pipefail
H=$PWD/.gpucarry-s9
O="${OUT:-/tmp/s9-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
BENCH_REPO=$PWD PEER_PY=tests/interop/upstream_peer.py OUT_DIR=/tmp/s9/final \
    OURS="s9f=$H/s9f cur=$H/cur" ROUNDS=2 DURATION=2 \
    timeout 420 bash scripts/bench-compare.sh --gpu-host 2>/tmp/final.err
cp /tmp/s9/final/results.jsonl "$O/final.jsonl"
tail -n 3 /tmp/final.err
date -u
