#!/usr/bin/env bash
# Session 18 (2026-12-02), seventh device call of issue 12, nvidia-h200 (16 CPUs): call 5
# had the lanes and receivers, which carry the 11-12% of serving batches that find their
# link with few requests in flight, take 1.1 CPUs and 1.7 CPUs' worth of waiting. With
# docs/bench/issue12-s18f-probe.patch such a batch still goes on its caller's thread when
# the engine has a slice out for every lane of its budget (`all`), against the same binary
# with MC_PROBE_ALL_BUSY=0 (`cur`, main's rule). Ours only, 3 rounds, order rotated.
#
#   bash docs/bench/issue12-device-calls-s18f.sh
set -uo pipefail
H=$PWD/.gpucarry-s18; xz -dkf "$H/bench2.xz"
O="${OUT:-/tmp/s18-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u
B=$H/bench2
SKIP_UPSTREAM_PY=1 BENCH_REPO=$PWD OUT_DIR="$O/cmp" OURS="cur=$B@MC_PROBE_ALL_BUSY=0 all=$B" \
    CASES="serving-4peers serving-1peer write-64KiBx64 write-4MiBx64" \
    ROUNDS=3 DURATION=2 timeout 150 bash scripts/bench-compare.sh --gpu-host 2>"$O/compare.err"
cp "$O/cmp/results.jsonl" "$O/results.jsonl"; rm -rf "$O/cmp/logs"
date -u
