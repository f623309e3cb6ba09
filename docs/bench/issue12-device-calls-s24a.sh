#!/usr/bin/env bash
# Session 24 (2026-12-03), first device call of issue 12, nvidia-h200: is the GPU row
# (device memory over TCP against host memory) held back by the host's link to the GPU?
#   1. docs/bench/issue12-s24-pcie-probe.py: copies between GPU memory and pinned host
#      memory with no engine (one process; and two processes at once, one out of the GPU,
#      one into it, the shape of a GPU-to-GPU transfer over TCP);
#   2. tests/gpu/gpu_transfer.py main, 2 rounds, with session 23's wheel (861c5b1, `new`)
#      and session 22's (89ae84b, `old`) in turn, new-old-old-new, on this one machine start;
#   3. the mixed rows (device memory on one side only) with the new wheel.
# The wheels are unzipped and stripped into .gpucarry-s24/{new,old}.
#
#   bash docs/bench/issue12-device-calls-s24a.sh
set -uo pipefail
H=$PWD/.gpucarry-s24
O="${OUT:-/tmp/s24-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nvidia-smi --query-gpu=name,pcie.link.gen.current,pcie.link.width.current,pcie.link.gen.max --format=csv
lscpu | grep -E "Model name|^CPU\(s\)|NUMA node\(s\)"
timeout 150 python3 docs/bench/issue12-s24-pcie-probe.py --duration 2 2>&1 | tee "$O/pcie-probe.jsonl"
export MC_LOG_LEVEL=warn
for w in new old old new; do
    echo "== wheel $w $(date -u +%T)"
    PYTHONPATH=$H/$w timeout 150 python3 tests/gpu/gpu_transfer.py main --rounds 2 --duration 3 2>&1 | tee -a "$O/gpu-transfer-$w.log"
done
echo "== mixed, wheel new $(date -u +%T)"
PYTHONPATH=$H/new timeout 150 python3 tests/gpu/gpu_transfer.py main --rounds 1 --duration 3 --mixed 2>&1 | tee "$O/gpu-transfer-mixed.log"
date -u
