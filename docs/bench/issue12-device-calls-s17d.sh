#!/usr/bin/env bash
# Session 17 (2026-12-02), fourth device call of issue 12, nvidia-h200 (16 CPUs): is the
# rest of GPU-to-GPU reads' gap (0.84 of host reads in call 3, the target's threads waiting
# for their copies out of the GPU) the next read's header coming too late for the target to
# copy it ahead? Reads into device memory with 2 (main) or 4 requests out per lane
# (docs/bench/issue12-s14-device-reads-out.patch, read at each batch in this build) and 4 out
# with 1 MiB stripes (docs/bench/issue12-s17c-probe.patch). The wheel of both on cb1b458,
# carried unzipped as .gpucarry-s17/site; docs/bench/issue12-s17-stripes.py --cases reads-out.
#
#   bash docs/bench/issue12-device-calls-s17d.sh
set -uo pipefail
H=$PWD/.gpucarry-s17
O="${OUT:-/tmp/s17-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
export MC_FORCE_TCP=1 MC_DISABLE_IPC=1 MC_LOG_LEVEL=warn PYTHONPATH=$H/site
timeout 300 python3 docs/bench/issue12-s17-stripes.py --cases reads-out --duration 2 \
    --rounds 6 2>&1 | grep -E '^\{|^FAIL|^PASS|Error' | tee "$O/reads-out.jsonl"
date -u
