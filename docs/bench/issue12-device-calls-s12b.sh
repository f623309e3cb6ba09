#!/usr/bin/env bash
# Session 12 (2026-12-01), second device call of issue 12, nvidia-h200 (16 CPUs): staging
# shapes for GPU memory over TCP, with each link rested before the next figure (in call 1
# the link used before halved the lanes), each against host memory in the same process;
# three passes over the variants. Wheel: .gpucarry-s12/site (this commit).
#
#   bash docs/bench/issue12-device-calls-s12b.sh
set -uo pipefail
H=$PWD/.gpucarry-s12
O="${OUT:-/tmp/s12-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
export MC_FORCE_TCP=1 MC_DISABLE_IPC=1 MC_LOG_LEVEL=warn PYTHONUNBUFFERED=1
variants="base:1024:2:0 c2048x2:2048:2:0 c4096x2:4096:2:0 c2048x3:2048:3:0"
for pass in 1 2 3; do
    for v in $variants; do
        IFS=: read -r label kb n ramp <<<"$v"
        MC_TCP_STAGING_CHUNK_KB=$kb MC_TCP_STAGING_CHUNKS=$n MC_TCP_STAGING_RAMP=$ramp \
            PYTHONPATH=$H/site timeout 120 python3 docs/bench/issue12-s12-shapes.py \
            --label "$label" --rounds 1 --duration 1.0 2>&1 | grep -E '^\{|^FAIL|^PASS|Error'
    done
done | tee "$O/shapes.jsonl"
date -u
