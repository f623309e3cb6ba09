#!/usr/bin/env bash
# Session 21 (2026-12-02), first device call of issue 12, nvidia-h200 (16 CPUs): session 20's
# profile of GPU-to-GPU reads over TCP put some 9% of samples in the target's waits for its
# copies out of the GPU (libcuda, the runtime's read lock, yielding), with a stream query
# between every two yields. Do fewer queries (at most one per 10 / 30 us, yielding between)
# or short sleeps (20 / 50 us, timer slack 1 us) move more? The wheel of
# docs/bench/issue12-s21-probe.patch (MC_PROBE_WAIT at each wait; it also prints the waits'
# queries and times), carried unzipped as .gpucarry-s21/site; docs/bench/issue12-s18-knob.py.
#
#   bash docs/bench/issue12-device-calls-s21a.sh
set -uo pipefail
H=$PWD/.gpucarry-s21
O="${OUT:-/tmp/s21-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
export MC_FORCE_TCP=1 MC_DISABLE_IPC=1 MC_LOG_LEVEL=warn PYTHONPATH=$H/site
timeout 420 python3 docs/bench/issue12-s18-knob.py --var MC_PROBE_WAIT --values 3,5,6,8,9 \
    --write-values 3,5,8 --duration 2 --rounds 6 2>&1 \
    | grep -E '^\{|^FAIL|^PASS|Error|^PROBE'
date -u
