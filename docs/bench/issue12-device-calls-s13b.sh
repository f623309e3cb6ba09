#!/usr/bin/env bash
# Session 13 (2026-12-01), second device call of issue 12, nvidia-h200 (16 CPUs): GPU memory
# against host memory over TCP, same-call A/B/C, alternating, 4 passes:
#   a = d282573 (main before this session),
#   b = 963375c (one copy out of the device at a time; lanes copy the next device write's
#       first chunk while sending the last one's),
#   c = 2fe7548 (b, plus: a device read stops being owed once its bytes are off the socket;
#       the data server copies the next device read's first chunk ahead).
#
#   bash docs/bench/issue12-device-calls-s13b.sh
set -uo pipefail
H=$PWD/.gpucarry-s13
O="${OUT:-/tmp/s13-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
export MC_FORCE_TCP=1 MC_DISABLE_IPC=1 MC_LOG_LEVEL=warn
for pass in 1 2 3 4; do
    for build in a b c; do
        PYTHONPATH=$H/$build timeout 90 python3 docs/bench/issue12-s12-shapes.py \
            --label "$build" --rounds 1 --duration 1.5 --rest 0.2 2>&1 \
            | grep -E '^\{|^FAIL|^PASS|Error' | tee -a "$O/abc.log"
    done
done
date -u
