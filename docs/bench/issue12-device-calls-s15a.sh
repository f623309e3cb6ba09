#!/usr/bin/env bash
# Session 15 (2026-12-01), second device call of issue 12, nvidia-h200 (16 CPUs): the issue's
# whole table, upstream 0.3.14 (`MC_FORCE_TCP=1`) against main at 814143f (read runs of
# d1cdb29, spare stagers of 424c801), 2 rounds. Carry .devcarry/ and .gpucarry-s15/ (the
# stripped release transfer_engine_bench of 814143f as .gpucarry-s15/main).
#
#   bash docs/bench/issue12-device-calls-s15a.sh
set -uo pipefail
H=$PWD/.gpucarry-s15
O="${OUT:-/tmp/s15-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
BENCH_REPO=$PWD PEER_PY=tests/interop/upstream_peer.py OUT_DIR=/tmp/s15/final \
    OURS="main=$H/main" ROUNDS=2 DURATION=2 \
    timeout 540 bash scripts/bench-compare.sh --gpu-host 2>/tmp/final.err
cp /tmp/s15/final/results.jsonl "$O/final.jsonl"; tail -n 2 /tmp/final.err
date -u
