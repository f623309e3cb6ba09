#!/usr/bin/env bash
# Session 12 (2026-12-01), third device call of issue 12, nvidia-h200 (16 CPUs), the final
# build of the session (2 MiB staging chunks; wheel .gpucarry-s12/site, bench binary
# .gpucarry-s12/fin):
#  1. the copy engines both ways at once against each way alone (issue12-s12-dma-both-ways.py);
#  2. GPU (H200) memory against host memory over TCP, --mixed, 2 rounds;
#  3. every case, upstream 0.3.14 (`MC_FORCE_TCP=1`) against `fin`, 2 rounds.
#
#   bash docs/bench/issue12-device-calls-s12c.sh
set -uo pipefail
H=$PWD/.gpucarry-s12
O="${OUT:-/tmp/s12-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
timeout 60 python3 docs/bench/issue12-s12-dma-both-ways.py | tee "$O/dma.jsonl"
(
    export MC_FORCE_TCP=1 MC_DISABLE_IPC=1 MC_LOG_LEVEL=warn
    for round in 1 2; do
        echo "== gpu fin round $round"
        PYTHONPATH=$H/site timeout 120 python3 tests/gpu/gpu_transfer.py main --duration 1.5 --mixed 2>&1 \
            | grep -E '^\{|^FAIL|^PASS|Error'
    done
) | tee "$O/gpu.log"
date -u
BENCH_REPO=$PWD PEER_PY=tests/interop/upstream_peer.py OUT_DIR=/tmp/s12/final \
    OURS="fin=$H/fin" ROUNDS=2 DURATION=2 \
    timeout 330 bash scripts/bench-compare.sh --gpu-host 2>/tmp/final.err
cp /tmp/s12/final/results.jsonl "$O/final.jsonl"; tail -n 2 /tmp/final.err
date -u
