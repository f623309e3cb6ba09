#!/usr/bin/env bash
# Session 21 (2026-12-02), third device call of issue 12, nvidia-h200 (16 CPUs). Call 2 found
# that a target never copies the next read's first chunk out of its GPU ahead (copied ahead:
# 0 of some 180,000 sends), because a lane has one read into device memory out at a time
# (DEVICE_READS_OUT): each 2 MiB read waits ~125 us for its copy. Candidates (MC_PROBE_WAIT,
# docs/bench/issue12-s21-probe.patch, both processes act, so --both): the target looks for the
# next request after each quarter of a read's last chunk (tens digit 3), and the initiator's
# receiver lets its lane ask for the next read once 1 (133) or 2 (233) quarters of the
# current one are in. 3 is main; 33 the target's change alone.
#
#   bash docs/bench/issue12-device-calls-s21c.sh
set -uo pipefail
H=$PWD/.gpucarry-s21
O="${OUT:-/tmp/s21-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
export MC_FORCE_TCP=1 MC_DISABLE_IPC=1 MC_LOG_LEVEL=warn PYTHONPATH=$H/site
timeout 420 python3 docs/bench/issue12-s18-knob.py --var MC_PROBE_WAIT --values 3,33,133,233 \
    --write-values 3,33 --both --duration 2 --rounds 6 2>&1 \
    | grep -E '^\{|^FAIL|^PASS|Error|^PROBE-FIRST'
date -u
