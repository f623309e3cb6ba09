#!/usr/bin/env bash
# Runs on the GPU machine (the `device` tool), in a copy of this repository
# with target/wheels carried: installs our wheel next to the machine's
# PyTorch and runs tests/gpu/gpu_transfer.py (GPU to GPU over TCP, bytes
# verified, device vs host throughput).
#
# Here:   scripts/build-wheel.sh
# Device: run(command="tests/gpu/run_on_device.sh", carry=["target/wheels"])
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --target /tmp/site target/wheels/*.whl
export PYTHONPATH=/tmp/site
python3 -c 'import torch, mooncake.engine as m; print("torch", torch.__version__, "cuda", torch.version.cuda, "SUPPORT_CUDA", m.SUPPORT_CUDA)'
python3 tests/gpu/gpu_transfer.py main "$@" 2>&1 | tee "${OUT:-/tmp}/gpu_transfer.log"
