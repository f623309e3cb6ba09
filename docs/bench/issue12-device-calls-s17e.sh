#!/usr/bin/env bash
# Session 17 (2026-12-02), fifth device call of issue 12, nvidia-h200 (16 CPUs): call 4 had
# reads into device memory move less with 4 requests out per lane than with 2 (0.87-0.99 in
# 6 rounds of 6), as call 3 had host reads in 2 MiB stripes move less than in 1 MiB: less in
# flight per lane, faster? Host reads in 512 KiB stripes; reads into device memory with one
# request out per lane (2 MiB and 1 MiB stripes). Call 4's wheel (.gpucarry-s17/site);
# docs/bench/issue12-s17-stripes.py --cases in-flight.
#
#   bash docs/bench/issue12-device-calls-s17e.sh
set -uo pipefail
H=$PWD/.gpucarry-s17
O="${OUT:-/tmp/s17-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
export MC_FORCE_TCP=1 MC_DISABLE_IPC=1 MC_LOG_LEVEL=warn PYTHONPATH=$H/site
timeout 300 python3 docs/bench/issue12-s17-stripes.py --cases in-flight --duration 2 \
    --rounds 6 2>&1 | grep -E '^\{|^FAIL|^PASS|Error' | tee "$O/in-flight.jsonl"
date -u
