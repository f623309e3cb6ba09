#!/usr/bin/env bash
# Session 20 (2026-12-02), third device call of issue 12, nvidia-h200 (16 CPUs): the
# build of e8950c8 (.gpucarry-s20/bench-f, its wheel in .gpucarry-s20/site-f) against
# upstream 0.3.14 (MC_FORCE_TCP=1), every case of the table, 3 rounds, order rotated;
# then tests/gpu/gpu_transfer.py --rounds 4 (device memory over TCP, MC_DISABLE_IPC=1).
# Carry .devcarry/ and .gpucarry-s20/.
#
#   bash docs/bench/issue12-device-calls-s20c.sh
set -uo pipefail
H=$PWD/.gpucarry-s20; xz -dkf "$H/bench-f.xz"
O="${OUT:-/tmp/s20-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u
BENCH_REPO=$PWD PEER_PY=tests/interop/upstream_peer.py OUT_DIR="$O/cmp" OURS="ours=$H/bench-f" \
    CASES="write-4MiBx64 read-4MiBx64 write-64KiBx64 read-64KiBx64 lat-write-4KiB lat-read-4KiB serving-1peer serving-4peers" \
    ROUNDS=3 DURATION=2 timeout 330 bash scripts/bench-compare.sh --gpu-host 2>"$O/compare.err"
grep -h '"error"' "$O/cmp/results.jsonl"; tail -n 2 "$O/compare.err"
cp "$O/cmp/results.jsonl" "$O/results.jsonl"
(cd "$O/cmp" && tar czf "$O/cmp-logs.tgz" logs 2>/dev/null && rm -rf logs)
date -u
export PYTHONPATH=$H/site-f MC_LOG_LEVEL=warn
timeout 230 python3 tests/gpu/gpu_transfer.py main --rounds 4 --duration 3 2>&1 | tee "$O/gpu-transfer.log"
date -u
