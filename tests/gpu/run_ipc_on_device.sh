#!/usr/bin/env bash
# Runs on the 2-GPU machine (the `device` tool, kind nvidia-h200-x2) from a carried folder
# holding our wheel and tests/gpu/gpu_ipc.py (and, optionally, upstream's CUDA 13 wheel
# prepared by ../shared/tools/carry-upstream-for-gpu-host.sh under up/ and libs/):
#
# Here:   scripts/build-wheel.sh; unzip the wheel into <main checkout>/.gpucarry/site (strip
#         its .so), copy tests/gpu/gpu_ipc.py, gpu_transfer.py (its helpers), ipc_interop.py and this script
#         into .gpucarry/ (git-ignored; the device tool sends the main checkout)
# Device: run(command="bash .gpucarry/run_ipc_on_device.sh", carry=[".gpucarry"], kind="nvidia-h200-x2")
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUTDIR="${OUT:-/tmp}"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
nvidia-smi topo -m | head -4
export PYTHONPATH="$HERE/site"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
timeout 500 python3 "$HERE/gpu_ipc.py" main --duration 1.0 "$@" 2>&1 | tee "$OUTDIR/gpu_ipc.log"
echo "gpu_ipc exit ${PIPESTATUS[0]}"
grep -h "segment .*go over\|IPC on\|not shared over IPC\|cannot be mapped\|batch call failed" "$OUTDIR/gpu_ipc.log" | sed 's/^[0-9T:.-]*Z *//; s/@mooncake-ipc-[0-9a-f-]*//; s/segment [0-9.:]*:/segment:/' | sort | uniq -c | head -20
grep -h -A12 "^raw bulk" "$OUTDIR/gpu_ipc.log"
if [ -d "$HERE/up" ] && [ -f "$HERE/ipc_interop.py" ]; then
    timeout 150 python3 "$HERE/ipc_interop.py" main "$HERE" 2>&1 | tee "$OUTDIR/interop.log"
    echo "interop exit ${PIPESTATUS[0]}"
fi
