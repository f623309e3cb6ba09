#!/usr/bin/env bash
# Session 15 (2026-12-01), third device call of issue 12, nvidia-h200 (16 CPUs): do the
# lane count or the spin move 64 KiB reads or serving with 4 peers? main (814143f, as
# s15a) at its defaults, with MC_TCP_LANES_PER_PEER=8 (16 is the most), and with MC_TCP_SPIN_US=0,
# against upstream 0.3.14 in the same rounds. Carry .devcarry/ and .gpucarry-s15/.
#
#   bash docs/bench/issue12-device-calls-s15b.sh
set -uo pipefail
H=$PWD/.gpucarry-s15
O="${OUT:-/tmp/s15-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
BENCH_REPO=$PWD PEER_PY=tests/interop/upstream_peer.py OUT_DIR=/tmp/s15/sweep \
    OURS="main=$H/main lanes8=$H/main@MC_TCP_LANES_PER_PEER=8 spin0=$H/main@MC_TCP_SPIN_US=0" \
    CASES="read-64KiBx64 write-64KiBx64 serving-4peers" ROUNDS=2 DURATION=2 \
    timeout 540 bash scripts/bench-compare.sh --gpu-host 2>/tmp/sweep.err
cp /tmp/s15/sweep/results.jsonl "$O/sweep.jsonl"; tail -n 2 /tmp/sweep.err
date -u
