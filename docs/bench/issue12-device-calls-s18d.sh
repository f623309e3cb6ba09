#!/usr/bin/env bash
# Session 18 (2026-12-02), fourth device call of issue 12, nvidia-h200 (16 CPUs): the issue's
# whole table for main at d8e19e2 (sends out of device memory yield while they wait for their
# copies; host paths as in session 17) against upstream 0.3.14 (MC_FORCE_TCP=1), every case,
# 3 rounds, order rotated. The release transfer_engine_bench, stripped, as
# .gpucarry-s18/bench.xz. Carry .devcarry/ and .gpucarry-s18/.
#
#   bash docs/bench/issue12-device-calls-s18d.sh
set -uo pipefail
H=$PWD/.gpucarry-s18; xz -dkf "$H/bench.xz"
O="${OUT:-/tmp/s18-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u
BENCH_REPO=$PWD PEER_PY=tests/interop/upstream_peer.py OUT_DIR="$O/cmp" OURS="ours=$H/bench" \
    ROUNDS=3 DURATION=2 timeout 500 bash scripts/bench-compare.sh --gpu-host 2>"$O/compare.err"
grep -h '"error"' "$O/cmp/results.jsonl"; tail -n 2 "$O/compare.err"
cp "$O/cmp/results.jsonl" "$O/results.jsonl"
(cd "$O/cmp" && tar czf "$O/cmp-logs.tgz" logs 2>/dev/null && rm -rf logs)
date -u
