#!/usr/bin/env bash
# Session 15 (2026-12-01), sixth device call of issue 12, nvidia-h200 (16 CPUs): a lane reads
# the replies of the group it sent itself when nothing else is queued and nothing is owed
# on its connection (`grp`, main + `Conn::send_group_and_settle`), against main (814143f)
# and upstream 0.3.14 in the same rounds: the batch cases and serving, 2 rounds.
# Carry .devcarry/ and .gpucarry-s15/ (main, grp: stripped release bench binaries).
#
#   bash docs/bench/issue12-device-calls-s15d.sh
set -uo pipefail
H=$PWD/.gpucarry-s15
O="${OUT:-/tmp/s15-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
BENCH_REPO=$PWD PEER_PY=tests/interop/upstream_peer.py OUT_DIR=/tmp/s15/grp \
    OURS="main=$H/main grp=$H/grp" \
    CASES="read-64KiBx64 write-64KiBx64 serving-1peer serving-4peers read-4MiBx64 write-4MiBx64" \
    ROUNDS=2 DURATION=2 timeout 280 bash scripts/bench-compare.sh --gpu-host 2>/tmp/grp.err
cp /tmp/s15/grp/results.jsonl "$O/grp.jsonl"; tail -n 2 /tmp/grp.err
date -u
