#!/usr/bin/env bash
# Session 19 (2026-12-02), fifth device call of issue 12, nvidia-h200 (16 CPUs): the final
# build of the session (callers read their read batches' replies, 1f7d8bc; the release bench
# as .gpucarry-s19/bench-r.xz) against upstream 0.3.14 (MC_FORCE_TCP=1), the cases still
# short of their goals in call 3 (serving with 4 peers, 64 KiB reads) and the serving shapes
# as reads, 4 rounds, order rotated. Carry .devcarry/ and .gpucarry-s19/.
#
#   bash docs/bench/issue12-device-calls-s19e.sh
set -uo pipefail
H=$PWD/.gpucarry-s19; xz -dkf "$H/bench-r.xz"
O="${OUT:-/tmp/s19-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u
BENCH_REPO=$PWD PEER_PY=tests/interop/upstream_peer.py OUT_DIR="$O/cmp" OURS="ours=$H/bench-r" \
    CASES="serving-4peers serving-1peer read-64KiBx64 serving-read-1peer serving-read-4peers" \
    ROUNDS=4 DURATION=2 timeout 400 bash scripts/bench-compare.sh --gpu-host 2>"$O/compare.err"
grep -h '"error"' "$O/cmp/results.jsonl"; tail -n 2 "$O/compare.err"
cp "$O/cmp/results.jsonl" "$O/results.jsonl"
(cd "$O/cmp" && tar czf "$O/cmp-logs.tgz" logs 2>/dev/null && rm -rf logs)
date -u
