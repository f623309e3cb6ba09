#!/usr/bin/env bash
# Session 13 (2026-12-01), fourth device call of issue 12, nvidia-h200 (16 CPUs), the final
# build of the session (9f4365c: copies ahead across requests, device stripes of 2 MiB;
# wheel .gpucarry-s13/site, bench binary .gpucarry-s13/fin):
#  1. GPU (H200) memory against host memory over TCP, --mixed, 2 rounds;
#  2. every case, upstream 0.3.14 (`MC_FORCE_TCP=1`) against `fin`, 2 rounds.
#
#   bash docs/bench/issue12-device-calls-s13d.sh
set -uo pipefail
H=$PWD/.gpucarry-s13
O="${OUT:-/tmp/s13-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
(
    export MC_FORCE_TCP=1 MC_DISABLE_IPC=1 MC_LOG_LEVEL=warn
    for round in 1 2; do
        echo "== gpu fin round $round"
        PYTHONPATH=$H/site timeout 120 python3 tests/gpu/gpu_transfer.py main --duration 1.5 --mixed 2>&1 \
            | grep -E '^\{|^FAIL|^PASS|Error'
    done
) | tee "$O/gpu.log"
date -u
BENCH_REPO=$PWD PEER_PY=tests/interop/upstream_peer.py OUT_DIR=/tmp/s13/final \
    OURS="fin=$H/fin" ROUNDS=2 DURATION=2 \
    timeout 330 bash scripts/bench-compare.sh --gpu-host 2>/tmp/final.err
cp /tmp/s13/final/results.jsonl "$O/final.jsonl"; tail -n 2 /tmp/final.err
date -u
