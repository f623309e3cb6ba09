#!/usr/bin/env bash
# Session 11 (2026-12-01), fourth device call of issue 12, nvidia-h200 (16 CPUs), the final
# build of the session (`fin`, commit 4f9dea5: device copies that land while the next
# request comes in, and a stager kept across writes only while none is wanted):
#  1. every case, upstream 0.3.14 (`MC_FORCE_TCP=1`) against `fin`, 2 rounds;
#  2. GPU (H200) memory against host memory over TCP, --mixed, 1 round, and the same with
#     8 lanes (MC_TCP_LANES_PER_PEER=8).
#
#   bash docs/bench/issue12-device-calls-s11d.sh
set -uo pipefail
H=$PWD/.gpucarry-s11
O="${OUT:-/tmp/s11-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
BENCH_REPO=$PWD PEER_PY=tests/interop/upstream_peer.py OUT_DIR=/tmp/s11/final \
    OURS="fin=$H/fin" ROUNDS=2 DURATION=2 \
    timeout 330 bash scripts/bench-compare.sh --gpu-host 2>/tmp/final.err
cp /tmp/s11/final/results.jsonl "$O/final.jsonl"; tail -n 2 /tmp/final.err
export MC_FORCE_TCP=1 MC_DISABLE_IPC=1 MC_LOG_LEVEL=warn
for lanes in 16 8; do
    echo "== gpu fin lanes $lanes"
    MC_TCP_LANES_PER_PEER=$lanes PYTHONPATH=$H/site timeout 120 python3 tests/gpu/gpu_transfer.py main --duration 1.5 --mixed 2>&1 \
        | grep -E '^\{|^FAIL|Error'
done | tee "$O/gpu.log"
date -u
