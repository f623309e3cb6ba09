#!/usr/bin/env bash
# Prepared in session 15 (2026-12-01) for the next device call of issue 12 (nvidia-h200,
# 16 CPUs); not run yet. Is the failure of `grp` (groups of writes read on the lane too,
# docs/bench/issue12-s15-write-groups-on-lane.patch on 4f27435) in the 4-peer serving shape
# real, and what was it? 3 rounds of the cases it touches, upstream 0.3.14, `landed`
# (4f27435: groups of reads only) and `grp`, with every log kept under $OUT (bench-compare
# now puts a failed run's last stderr line in its result line). Carry .devcarry/ and
# .gpucarry-s15/ (landed, grp: stripped release bench binaries).
#
#   bash docs/bench/issue12-device-calls-s16a.sh
set -uo pipefail
H=$PWD/.gpucarry-s15
O="${OUT:-/tmp/s16-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
BENCH_REPO=$PWD PEER_PY=tests/interop/upstream_peer.py OUT_DIR="$O/cmp" \
    OURS="landed=$H/landed grp=$H/grp" \
    CASES="serving-4peers serving-1peer read-64KiBx64 write-64KiBx64" \
    ROUNDS=3 DURATION=2 timeout 500 bash scripts/bench-compare.sh --gpu-host 2>"$O/compare.err"
grep -h '"error"' "$O/cmp/results.jsonl"; tail -n 2 "$O/compare.err"
date -u
