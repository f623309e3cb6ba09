#!/usr/bin/env bash
# Session 25 (2026-12-03), the one device call of issue 12, nvidia-h200 (16 CPUs): the final
# code's figures on one machine start. Carry .devcarry/ (upstream 0.3.14) and .gpucarry-s25/
# (N.xz: the release transfer_engine_bench at 3b96716; wheel/: its wheel, unzipped, the .so
# stripped). 1) the issue's table against upstream (MC_FORCE_TCP=1), every case, 3 rounds,
# order rotated, engines named 127.0.0.1; 2) the link to the GPU with no engine
# (docs/bench/issue12-s24-pcie-probe.py); 3) the GPU row (tests/gpu/gpu_transfer.py main,
# 3 rounds), so that the row and the link's ceiling come from the same start.
#
#   bash docs/bench/issue12-device-calls-s25a.sh
set -uo pipefail
H=$PWD/.gpucarry-s25; xz -dkf "$H/N.xz"
O="${OUT:-/tmp/s25-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nvidia-smi --query-gpu=name,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader
BENCH_REPO=$PWD PEER_PY=tests/interop/upstream_peer.py OUT_DIR="$O/ip" OURS="ours=$H/N" \
    CASES="write-4MiBx64 read-4MiBx64 write-64KiBx64 read-64KiBx64 lat-write-4KiB lat-read-4KiB serving-1peer serving-4peers" \
    ROUNDS=3 DURATION=2 timeout 290 bash scripts/bench-compare.sh --gpu-host 2>"$O/ip.err"
grep -h '"error"' "$O/ip/results.jsonl"; tail -n 2 "$O/ip.err"
cp "$O/ip/results.jsonl" "$O/table.jsonl"; rm -rf "$O/ip"
date -u
timeout 90 python3 docs/bench/issue12-s24-pcie-probe.py --duration 2 2>&1 | tee "$O/pcie-probe.jsonl"
MC_LOG_LEVEL=warn PYTHONPATH=$H/wheel timeout 180 python3 tests/gpu/gpu_transfer.py main --rounds 3 --duration 3 2>&1 | tee "$O/gpu-transfer.log"
date -u
