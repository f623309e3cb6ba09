#!/usr/bin/env bash
# Session 13 (2026-12-01), third device call of issue 12, nvidia-h200 (16 CPUs): does the
# stripe size explain why host reads beat reads into GPU memory? Build d = 2fe7548 plus
# docs/bench/issue12-s13-stripe-probe.patch (MC_PROBE_DEVICE_STRIPE sets the floor of
# stripes in local device memory, 4 MiB in the code). Host memory is cut in 1 MiB stripes
# (MC_TCP_STRIPE_SIZE's default). Labels: d4 = as shipped; d2, d1 = device stripes of
# 2 and 1 MiB; h4 = MC_TCP_STRIPE_SIZE=4 MiB (host and device stripes of 4 MiB). 2 passes.
#
#   bash docs/bench/issue12-device-calls-s13c.sh
set -uo pipefail
H=$PWD/.gpucarry-s13
O="${OUT:-/tmp/s13-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
export MC_FORCE_TCP=1 MC_DISABLE_IPC=1 MC_LOG_LEVEL=warn PYTHONPATH=$H/d
run() {  # run LABEL [VAR=VALUE...]
    local label=$1; shift
    env "$@" timeout 90 python3 docs/bench/issue12-s12-shapes.py \
        --label "$label" --rounds 1 --duration 1.5 --rest 0.2 2>&1 \
        | grep -E '^\{|^FAIL|^PASS|Error' | tee -a "$O/stripes.log"
}
for pass in 1 2; do
    run d4 X=1
    run d2 MC_PROBE_DEVICE_STRIPE=2097152
    run d1 MC_PROBE_DEVICE_STRIPE=1048576
    run h4 MC_TCP_STRIPE_SIZE=4194304
done
date -u
