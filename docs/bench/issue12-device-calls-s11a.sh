#!/usr/bin/env bash
# Session 11 (2026-12-01), first device call of issue 12, nvidia-h200 (16 CPUs): where the
# receiving side's time goes when it stages into device memory (22 GB/s against 30+ for host
# memory, session 10). The wheel is built with the timers of
# docs/bench/issue12-s11-staging-probe.patch (`probe`): each process prints, once a second,
# the seconds its threads spent reading the socket into pinned chunks, issuing copies,
# waiting for a chunk's earlier copy, and waiting at the end of each request (the drain),
# and its CPU seconds. PROBE_NODRAIN=1 leaves the last copies of a request running into
# the next request (the status then goes out before the bytes land: an upper bound only).
# Before that: raw pinned<->device copy rates by chunk size and stream count.
#
#   bash docs/bench/issue12-device-calls-s11a.sh
set -uo pipefail
H=$PWD/.gpucarry-s11
O="${OUT:-/tmp/s11-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
python3 docs/bench/issue12-s11-dma-rates.py 2>&1 | tee "$O/dma.txt"
export MC_FORCE_TCP=1 MC_DISABLE_IPC=1 MC_LOG_LEVEL=warn
for round in 1 2; do
    for v in drain nodrain; do
        echo "== gpu round $round $v"
        if [ $v = nodrain ]; then export PROBE_NODRAIN=1; else unset PROBE_NODRAIN; fi
        PYTHONPATH=$H/probe timeout 200 python3 tests/gpu/gpu_transfer.py main --duration 2.0 --mixed 2>&1 | grep -E '^\{|^FAIL|Error|PROBE'
    done
done | tee "$O/gpu.log"
date -u
