#!/usr/bin/env bash
# Session 23 (2026-12-03), fifth device call of issue 12, nvidia-h200 (16 CPUs). Carry
# .devcarry/ (upstream 0.3.14) and .gpucarry-s23/ (S.xz: main's release transfer_engine_bench
# at b63429e, with a probe that is off unless MC_PROBE_SPLIT_SEND is set; R.xz: the same
# with runs of writes, headers first). The table: main, runs and upstream
# (MC_FORCE_TCP=1) in the same rounds, the serving shapes only, 10 rounds, order rotated, engines named
# 127.0.0.1 (what the figures use).
#
#   bash docs/bench/issue12-device-calls-s23e.sh
set -uo pipefail
H=$PWD/.gpucarry-s23; xz -dkf "$H/S.xz" "$H/R.xz"
O="${OUT:-/tmp/s23-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u
BENCH_REPO=$PWD PEER_PY=tests/interop/upstream_peer.py OUT_DIR="$O/ip" OURS="main=$H/S runs=$H/R" \
    CASES="serving-1peer serving-4peers" \
    ROUNDS=10 DURATION=2 timeout 500 bash scripts/bench-compare.sh --gpu-host 2>"$O/ip.err"
grep -h '"error"' "$O/ip/results.jsonl"; tail -n 2 "$O/ip.err"
cp "$O/ip/results.jsonl" "$O/table.jsonl"
(cd "$O/ip" && tar czf "$O/ip-logs.tgz" logs 2>/dev/null); rm -rf "$O/ip"
date -u
