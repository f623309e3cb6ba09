#!/usr/bin/env bash
# Session 12 (2026-12-01), sixth device call of issue 12, nvidia-h200 (16 CPUs): staging
# receives whose large reads land on whole cache lines (`align`: after the bytes a reply
# brings through the read-ahead buffer, one short read up to the next line) against the
# final build without it (`site`), issue12-s12-shapes.py, 1.2 s per figure, alternating,
# 2 more passes, align first (call 5 ran site first).
#
#   bash docs/bench/issue12-device-calls-s12f.sh
set -uo pipefail
H=$PWD/.gpucarry-s12
O="${OUT:-/tmp/s12-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
export MC_FORCE_TCP=1 MC_DISABLE_IPC=1 MC_LOG_LEVEL=warn PYTHONUNBUFFERED=1
for pass in 1 2; do
    for build in align site; do
        PYTHONPATH=$H/$build timeout 100 python3 docs/bench/issue12-s12-shapes.py \
            --label $build --rounds 1 --duration 1.2 2>&1 | grep -E '^\{|^FAIL|^PASS|Error'
    done
done | tee "$O/align.jsonl"
date -u
