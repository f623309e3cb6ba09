#!/usr/bin/env bash
# Session 10 (2026-12-01), second device call of issue 12, nvidia-h200 (16 CPUs):
#  1. every case, upstream 0.3.14 (`MC_FORCE_TCP=1`) against `new` (the new defaults: lanes
#     three quarters of the CPUs, 1 MiB stripes) and `base` (the old defaults, set by
#     variables: the build differs from c9f58ce in its defaults alone), 16 CPUs, 2 rounds;
#  2. the same builds on 8 CPUs (`CPUS=0-7`: 6 lanes and 12 caller connections against 4
#     and 8), and `new` with 8 lanes, ours only, 2 rounds;
#  3. GPU (H200) memory against host memory over TCP with the new wheel
#     (`.gpucarry-s10/site`), 1 MiB stripes (default) and 4 MiB, 2 rounds each.
#
#   bash docs/bench/issue12-device-calls-s10b.sh
set -uo pipefail
H=$PWD/.gpucarry-s10
O="${OUT:-/tmp/s10-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
BENCH_REPO=$PWD PEER_PY=tests/interop/upstream_peer.py OUT_DIR=/tmp/s10/all \
    OURS="new=$H/new base=$H/new@MC_TCP_LANES_PER_PEER=8,MC_TCP_STRIPE_SIZE=4194304,MC_TCP_CALLER_CONNS=16" ROUNDS=2 DURATION=2 \
    timeout 300 bash scripts/bench-compare.sh --gpu-host 2>/tmp/all.err
cp /tmp/s10/all/results.jsonl "$O/all16.jsonl"; tail -n 2 /tmp/all.err
BENCH_REPO=$PWD SKIP_UPSTREAM_PY=1 CPUS=0-7 OUT_DIR=/tmp/s10/cpu8 \
    CASES="write-4MiBx64 read-4MiBx64 write-64KiBx64 read-64KiBx64 serving-1peer serving-4peers" \
    OURS="new=$H/new base=$H/new@MC_TCP_LANES_PER_PEER=4,MC_TCP_STRIPE_SIZE=4194304,MC_TCP_CALLER_CONNS=8 new8=$H/new@MC_TCP_LANES_PER_PEER=8" ROUNDS=2 DURATION=2 \
    timeout 150 bash scripts/bench-compare.sh --gpu-host 2>/tmp/cpu8.err
cp /tmp/s10/cpu8/results.jsonl "$O/cpu8.jsonl"; tail -n 2 /tmp/cpu8.err
export MC_FORCE_TCP=1 MC_DISABLE_IPC=1 MC_LOG_LEVEL=warn
for round in 1 2; do
    for stripe in 1048576 4194304; do
        echo "== gpu round $round stripe $stripe"
        MC_TCP_STRIPE_SIZE=$stripe PYTHONPATH=$H/site timeout 100 python3 tests/gpu/gpu_transfer.py main --duration 1.0 2>&1 | grep -E '^\{|^FAIL|Error'
    done
done | tee "$O/gpu.log"
date -u
