#!/usr/bin/env bash
# Session 21 (2026-12-02), second device call of issue 12, nvidia-h200 (16 CPUs). Call 1 found
# that nearly every send of a 2 MiB stripe out of GPU memory waits for its copy out of the
# device (some 120 us mean). The probe now also says, for each send's first chunk, whether it
# was copied ahead during the send before, how long it waited and how long after its issue the
# copy was done. Candidate: a send looks for the next request (to copy its first chunk
# ahead) halfway (13) or three quarters (23) through its last chunk instead of before it (3).
# The wheel of docs/bench/issue12-s21-probe.patch, carried unzipped as .gpucarry-s21/site.
#
#   bash docs/bench/issue12-device-calls-s21b.sh
set -uo pipefail
H=$PWD/.gpucarry-s21
O="${OUT:-/tmp/s21-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
export MC_FORCE_TCP=1 MC_DISABLE_IPC=1 MC_LOG_LEVEL=warn PYTHONPATH=$H/site
timeout 400 python3 docs/bench/issue12-s18-knob.py --var MC_PROBE_WAIT --values 3,13,23 \
    --write-values 3,13,23 --duration 2 --rounds 6 2>&1 \
    | grep -E '^\{|^FAIL|^PASS|Error|^PROBE'
date -u
