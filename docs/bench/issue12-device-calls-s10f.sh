#!/usr/bin/env bash
# Session 10 (2026-12-01), sixth device call of issue 12, nvidia-h200 (16 CPUs): the side
# that receives into device memory (socket into a pinned chunk, then the copy to the device)
# is the slow one (call 5), and 4 MiB chunks made it slower than 1 MiB. Here the receive
# chunk of an experiment wheel (`site`: `receive_into` took its chunk from MC_EXP_RECV_CHUNK_KB;
# that change is kept in docs/bench/issue12-s10-receive-chunk-experiment.patch, not in the code) is
# 1024, 512, 256 or 128 KiB; tests/gpu/gpu_transfer.py, device against host memory.
#
#   bash docs/bench/issue12-device-calls-s10f.sh
set -uo pipefail
H=$PWD/.gpucarry-s10
O="${OUT:-/tmp/s10-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
export MC_FORCE_TCP=1 MC_DISABLE_IPC=1 MC_LOG_LEVEL=warn
for kb in 1024 256 512 128 1024 256; do
    echo "== receive chunk $kb KiB"
    MC_EXP_RECV_CHUNK_KB=$kb PYTHONPATH=$H/site timeout 60 python3 tests/gpu/gpu_transfer.py main --duration 1.0 2>&1 | grep -E '^\{|^FAIL|Error'
done | tee "$O/gpu.log"
date -u
