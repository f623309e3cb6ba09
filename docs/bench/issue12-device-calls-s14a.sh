#!/usr/bin/env bash
# Session 14 (2026-12-01), prepared for the next device call of issue 12 (nvidia-h200, 16
# CPUs); not run in session 14: no device machine was lent. One wheel: main (b08b9ba or
# later) with docs/bench/issue12-s14-device-reads-out.patch applied, unpacked and stripped
# into .gpucarry-s14/reads-out (carry it). The patch lets a lane keep 4 reads into device
# memory out instead of 2, so that the peer's data server finds the next read in time to
# copy its first chunk out of the device while it sends one (on the fake runtime: 38-49% of
# reads copied ahead with 2 out, 90-97% with 4); MC_PROBE_DEVICE_READS_OUT=2 gives main's
# behaviour from the same build.
#
#   bash docs/bench/issue12-device-calls-s14a.sh
set -uo pipefail
H=$PWD/.gpucarry-s14
O="${OUT:-/tmp/s14-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
export MC_FORCE_TCP=1 MC_DISABLE_IPC=1 MC_LOG_LEVEL=warn PYTHONPATH=$H/reads-out
# 1. Batch by batch from a freshly started target, then the same target kept (main's way).
MC_PROBE_DEVICE_READS_OUT=2 timeout 90 python3 docs/bench/issue12-s14-warmup.py --rounds 1 \
    --duration 2 2>&1 | grep -E '^\{|^FAIL|rror' | tee "$O/warmup.log"
# 2. Kept targets, figures alternating, 2 then 4 reads out, twice.
for out in 2 4 2 4; do
    MC_PROBE_DEVICE_READS_OUT=$out timeout 60 python3 docs/bench/issue12-s12-shapes.py \
        --label "out$out" --rounds 1 --duration 1.5 --rest 0.2 2>&1 \
        | grep -E '^\{|^FAIL' | tee -a "$O/shapes.log"
done
# 3. A target per figure (the issue's harness), both settings. Then the issue's whole table
#    against upstream (64 KiB reads now answered in runs: main's d1cdb29), if time is left:
#    bash docs/bench/issue12-device-calls-s13d.sh with this wheel in place of fin's.
for out in 2 4; do
    echo "reads out $out"
    MC_PROBE_DEVICE_READS_OUT=$out timeout 80 python3 tests/gpu/gpu_transfer.py main \
        --duration 2 2>&1 | grep -E '^\{|^FAIL|^(op|write|read) ' | tee -a "$O/gpu.log"
done
date -u
