#!/usr/bin/env bash
# Session 15 (2026-12-01), seventh device call of issue 12, nvidia-h200 (16 CPUs): the
# issue's whole table for the session's final build (`grp`: main + the lane reading its
# group's replies, `Conn::send_group_and_settle`), main (814143f) and upstream 0.3.14
# (`MC_FORCE_TCP=1`) in the same rounds, order rotated, 2 rounds. Carry .devcarry/ and
# .gpucarry-s15/ (main, grp: stripped release bench binaries).
#
#   bash docs/bench/issue12-device-calls-s15e.sh
set -uo pipefail
H=$PWD/.gpucarry-s15
O="${OUT:-/tmp/s15-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
BENCH_REPO=$PWD PEER_PY=tests/interop/upstream_peer.py OUT_DIR=/tmp/s15/final \
    OURS="grp=$H/grp main=$H/main" ROUNDS=2 DURATION=2 \
    timeout 270 bash scripts/bench-compare.sh --gpu-host 2>/tmp/final.err
cp /tmp/s15/final/results.jsonl "$O/final.jsonl"; tail -n 2 /tmp/final.err
date -u
