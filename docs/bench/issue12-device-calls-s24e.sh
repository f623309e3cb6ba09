#!/usr/bin/env bash
# Session 24 (2026-12-03), fifth device call of issue 12, nvidia-h200 (16 CPUs): the serving
# shapes against upstream and against the host's copy ceiling on one machine start. Carry
# .devcarry/ (upstream 0.3.14) and .gpucarry-s24e/ (N.xz: the release transfer_engine_bench at
# 64f535d; copy-ceiling: docs/bench/issue12-s24-copy-ceiling.c built here). 4 rounds, order
# rotated, engines named 127.0.0.1; then the copy ceiling (each payload byte copied twice, no
# sockets, 1-20 threads).
#
#   bash docs/bench/issue12-device-calls-s24e.sh
set -uo pipefail
H=$PWD/.gpucarry-s24e; xz -dkf "$H/N.xz"
O="${OUT:-/tmp/s24-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u
BENCH_REPO=$PWD PEER_PY=tests/interop/upstream_peer.py OUT_DIR="$O/ip" OURS="ours=$H/N" \
    CASES="serving-1peer serving-4peers" \
    ROUNDS=4 DURATION=2 timeout 300 bash scripts/bench-compare.sh --gpu-host 2>"$O/ip.err"
grep -h '"error"' "$O/ip/results.jsonl"; tail -n 2 "$O/ip.err"
cp "$O/ip/results.jsonl" "$O/serving.jsonl"; rm -rf "$O/ip"
timeout 120 "$H/copy-ceiling" 3 | tee "$O/copy-ceiling.jsonl"
date -u
