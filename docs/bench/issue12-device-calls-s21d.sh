#!/usr/bin/env bash
# Session 21 (2026-12-02), fourth device call of issue 12, nvidia-h200 (16 CPUs): the build of
# the change (sends out of device memory in 512 KiB pieces, the next request looked for
# between the pieces of a last chunk; a lane asks for the next read into device memory once
# half of the last is in) as .gpucarry-s21/bench and its wheel in .gpucarry-s21/site, against
# upstream 0.3.14 (MC_FORCE_TCP=1), every case of the table, 3 rounds, order rotated;
# then tests/gpu/gpu_transfer.py --rounds 4 (device memory over TCP, MC_DISABLE_IPC=1).
# Carry .devcarry/ and .gpucarry-s21/.
#
#   bash docs/bench/issue12-device-calls-s21d.sh
set -uo pipefail
H=$PWD/.gpucarry-s21; xz -dkf "$H/bench.xz"
O="${OUT:-/tmp/s21-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u
BENCH_REPO=$PWD PEER_PY=tests/interop/upstream_peer.py OUT_DIR="$O/cmp" OURS="ours=$H/bench" \
    CASES="write-4MiBx64 read-4MiBx64 write-64KiBx64 read-64KiBx64 lat-write-4KiB lat-read-4KiB serving-1peer serving-4peers" \
    ROUNDS=3 DURATION=2 timeout 330 bash scripts/bench-compare.sh --gpu-host 2>"$O/compare.err"
grep -h '"error"' "$O/cmp/results.jsonl"; tail -n 2 "$O/compare.err"
cp "$O/cmp/results.jsonl" "$O/results.jsonl"
(cd "$O/cmp" && tar czf "$O/cmp-logs.tgz" logs 2>/dev/null && rm -rf logs)
date -u
export PYTHONPATH=$H/site MC_LOG_LEVEL=warn
timeout 230 python3 tests/gpu/gpu_transfer.py main --rounds 4 --duration 3 2>&1 | tee "$O/gpu-transfer.log"
date -u
